"""Kill `ggufbridge convert` at random points, many times, and check the output folder after each kill.

One synthetic MiniCPM-V 4.7 checkpoint (ggufbridge.testkit, small vocabulary) is converted over and over into
the same folder (`--force`) by a `python -m ggufbridge convert` subprocess, which receives SIGINT, SIGTERM or
SIGKILL (in turn) at a random moment. Most kills land while files are being written: the delay is drawn after the
first temporary file appears, over the length of a measured uninterrupted write (plus 30%, so that the commit and
the process's exit are hit too); every fifth kill is drawn from the process's start instead (imports, planning).

After each kill:
  * no final-named file is partial: every final-named GGUF is listed in manifest.json and `ggufbridge verify`
    passes for the folder (sizes and sha256), and there is no final-named GGUF without a manifest;
then the next conversion runs to the end, and:
  * no temporary file (`.NAME.<pid>.part`) survives it, and `ggufbridge verify` passes.

    .venv/bin/python -m benchmarks.fault_injection --kills 50 --json fault_injection.json

`--hostile` adds the cases of the hostile-user probe (issue 27), each a real `python -m ggufbridge` process as a
user would run it: hostile structure in every file a user hands in (deep JSON/TOML, numbers out of range, ids that
collide, float shapes, GGUF dimensions that overflow), numeric options (NaN, Inf, absurd thread counts and sizes),
a finite BF16 weight above the F16 range, two conversions into one folder at once, a stale lock, signals in a
command's first milliseconds, `EXTRA.GGUF`, the IPv4-mapped wildcard host, an image bomb through `run --image`
(and, with `--server`, through a real llama-server). A case holds when the process ends as promised: one `Error:`
line and exit 2 (or the stated success), no traceback, within its time limit and under 1.5 GiB of peak RSS. The
report gives cases, held, failed. The engine is ggufbridge.testkit.faults and .hostile; CI runs a bounded form
(tests/test_fault_injection.py):

    .venv/bin/python -m benchmarks.fault_injection --kills 3 --hostile --json fault_injection.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from ggufbridge.testkit.faults import run_kills


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=50, help="conversions to kill while running (≥ 50 for the issue)")
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--spec", default="ksafe", help="fixture spec (ksafe: ~58 MB float32 with the small vocabulary)")
    ap.add_argument("--work", type=Path, default=None,
                    help="working folder (default: a temporary one); checkpoints already in WORK/ckpt (--spec) and "
                         "WORK/ckpt-bf16 (--hostile: tiny, bfloat16) are used as they are")
    ap.add_argument("--json", type=Path, default=Path("fault_injection.json"))
    ap.add_argument("--hostile", action="store_true", help="also run the hostile-input cases (issue 27)")
    ap.add_argument("--server", action="store_true", help="with --hostile: also the image bomb through llama-server")
    ap.add_argument("--startup-signals", action="store_true",
                    help="with --hostile: also signals at fixed delays from the process start (not for CI: on a "
                         "loaded machine the interpreter's own start-up can outlast them)")
    args = ap.parse_args()

    work = args.work or Path(tempfile.mkdtemp(prefix="ggufbridge-fault-"))
    ckpt = work / "ckpt"
    if not (ckpt / "config.json").is_file():
        from ggufbridge.testkit.checkpoint import make_minicpmv47  # torch and transformers: only to build one

        make_minicpmv47(ckpt, args.spec, vocab="small")
    report = run_kills(ckpt, work, args.kills, args.seed, args.spec)
    summary = report["summary"]
    if args.hostile:
        from ggufbridge.testkit.hostile import run_cases

        hostile = run_cases(work, ckpt, server=args.server, startup_signals=args.startup_signals)
        report["hostile"] = hostile
        summary["hostile"] = {k: hostile[k] for k in ("cases", "held", "failed")}
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.json}")
    sys.exit(1 if summary["runs_with_problems"] or summary.get("hostile", {}).get("failed") else 0)


if __name__ == "__main__":
    main()

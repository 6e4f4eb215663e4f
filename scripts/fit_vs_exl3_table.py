#!/usr/bin/env python
"""docs/compare-exl3-vs-gguf.{json,md,png} with the KL-guided mixes added, from a CPU re-run of the GGUF side.

    .venv/bin/python scripts/fit_vs_exl3_table.py --dir gpu_exl3 --fit-dir FIT_WORK --published docs/compare-exl3-vs-gguf.json

Every GGUF of the published table (gpu_exl3/*.gguf from exl3_prep.sh) and every fit-*.gguf of --fit-dir
(scripts/bench_fit.py) is compared here with the reference dump `DIR/hf.safetensors` on `DIR/rows.jsonl`. The EXL3
rows come from the published JSON (the H200 run). They were measured against an earlier dump of the same
transformers model on the same rows; a re-dump is not byte-identical (its BF16-floor metadata and last float bits
differ), so instead of `compare --merge` (which refuses another reference_id) this script checks that the rows are
the same (eval_sha256) and that every stock GGUF's KL here agrees with the published figure within --tolerance,
and only then adds the EXL3 rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("gpu_exl3"))
    ap.add_argument("--fit-dir", type=Path, required=True)
    ap.add_argument("--published", type=Path, default=Path("docs/compare-exl3-vs-gguf.json"))
    ap.add_argument("--tolerance", type=float, default=0.01, help="relative KL agreement required per GGUF")
    ap.add_argument("--out", type=Path, default=Path("docs/compare-exl3-vs-gguf"))
    args = ap.parse_args(argv)

    from ggufbridge.compare import report
    from ggufbridge.compare.run import Result, compare

    pub = json.loads(args.published.read_text())
    stock = [args.dir / f"ksafe-{t}.gguf" for t in ("Q3_K_M", "hq3", "Q4_K_M", "hq4", "Q5_K_M", "Q6_K", "Q8_0")]
    stock += sorted((args.dir / "f16").glob("*-F16.gguf"))
    fits = sorted(args.fit_dir.glob("fit-*.gguf"), key=lambda p: p.stat().st_size)
    cmp = compare(f"logits:{args.dir / 'hf.safetensors'}", [f"gguf:{p}" for p in stock + fits],
                  eval_path=args.dir / "rows.jsonl", ctx=256)
    if cmp.eval_sha256 != pub["eval_sha256"]:
        raise SystemExit(f"eval rows differ from the published run's ({cmp.eval_sha256[:12]} vs "
                         f"{pub['eval_sha256'][:12]})")
    published = {r["label"]: r["kl_mean"] for r in pub["results"]}
    for r in cmp.results[: len(stock)]:
        want = published.get(r.label)
        got = r.summary["kl_mean"]
        ok = want is not None and abs(got / want - 1) <= args.tolerance
        print(f"{r.label:<34} KL {got:.5f}  published {want if want is None else f'{want:.5f}'}  "
              f"{'agrees' if ok else 'DIFFERS'}", file=sys.stderr)
        if not ok:
            raise SystemExit(f"{r.label}: KL {got:.5f} here, {want} published: not the same reference")
    for r in pub["results"]:
        if r["label"].startswith("exl3"):
            summary = {k: v for k, v in r.items() if k not in ("label", "candidate", "bits_per_weight",
                                                                 "file_bytes", "family")}
            cmp.results.append(Result(r["label"], r["candidate"], summary, {}, r.get("bits_per_weight"),
                                      r.get("file_bytes"), r.get("family")))
    cmp.notes.append(f"EXL3 rows from {args.published} (H200 run, against an earlier dump of the same reference on "
                     f"the same rows; every stock GGUF here agrees with it within {100 * args.tolerance:g}%)")
    report.write_json(cmp, args.out.with_suffix(".json"))
    report.write_markdown(cmp, args.out.with_suffix(".md"))
    report.write_plot(cmp, args.out.with_suffix(".png"))
    for r in cmp.results[len(stock):]:
        print(f"{r.label:<34} {r.file_bytes:>10,} B  KL {r.summary['kl_mean']:.4f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

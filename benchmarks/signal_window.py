"""How long after it starts the `ggufbridge` program still dies of a signal the Python way (docs/internals.md,
"Signals from the first instruction").

    benchmarks/signal_window.py [--runs 20] [--delays 1,5,10,15,20,25,30,40,50,60] [--base-rev REV]

Each run starts the program as its console script does (`from ggufbridge.__main__ import main`, here with
`ggufbridge --help`, which imports the whole CLI: ~0.2 s, longer than any delay) and measures two things:

- **handler time**: polling /proc/PID/status from the moment of the fork until the process catches SIGTERM
  (its SigCgt mask): the window in which a signal gets Python's or the kernel's default;
- **outcomes**: SIGINT or SIGTERM sent D ms after the fork, classified as `one line` (the program's own
  "Error: interrupted by SIG..." and exit 128 + signal), `traceback` (a KeyboardInterrupt during the
  interpreter's start-up), `silent` (killed by the signal: no output, exit -N) or `finished` (exit 0).

With --base-rev the same runs go to that revision (exported to a temporary folder), interleaved, so that both see
the same machine load; the anchor `python -c pass` is timed in the same run.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# what pip's console script runs (console_scripts entry point ggufbridge.__main__:main)
SCRIPT = "import re, sys\nfrom ggufbridge.__main__ import main\nsys.argv[0] = 'ggufbridge'\nsys.exit(main())\n"


def _default_sigint() -> None:
    # a shell's background job starts with SIGINT ignored, and a child inherits that until Python replaces it;
    # an interactive user's program starts with the default
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _caught(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    except (FileNotFoundError, ProcessLookupError):
        pass
    return False


def handler_time(env: dict) -> float | None:
    """Seconds from the fork until SIGTERM is caught (None: the process ended first)."""
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", SCRIPT, "--help"], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, preexec_fn=_default_sigint)
    try:
        while p.poll() is None:
            if _caught(p.pid):
                return time.perf_counter() - t0
        return None
    finally:
        p.kill()
        p.wait()


def outcome(env: dict, sig: int, delay_s: float) -> str:
    p = subprocess.Popen([sys.executable, "-c", SCRIPT, "--help"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    time.sleep(delay_s)
    try:
        p.send_signal(sig)
    except ProcessLookupError:
        pass
    _, err = p.communicate(timeout=60)
    lines = [line for line in err.splitlines() if line.strip()]
    if p.returncode == 0:
        return "finished"
    if p.returncode == 128 + sig and lines == [f"Error: interrupted by {signal.Signals(sig).name}"]:
        return "one line"
    if "Traceback" in err:
        return "traceback"
    if p.returncode == -sig and not lines:
        return "silent"
    return f"other (exit {p.returncode}: {lines[-1] if lines else ''})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="runs per delay and signal, and handler-time samples")
    ap.add_argument("--delays", default="1,10,20,40,60,100,150,200,300,400",
                    help="milliseconds after the fork")
    ap.add_argument("--base-rev", help="also run this git revision, interleaved")
    args = ap.parse_args()
    delays = [int(x) for x in args.delays.split(",")]
    trees = {"this tree": ROOT}
    tmp = None
    if args.base_rev:
        tmp = tempfile.TemporaryDirectory(prefix="signal-window-")
        subprocess.run(f"git -C {ROOT} archive {args.base_rev} ggufbridge | tar -x -C {tmp.name}", shell=True,
                       check=True)
        trees[args.base_rev] = Path(tmp.name)
    envs = {k: dict(os.environ, PYTHONPATH=str(v)) for k, v in trees.items()}
    anchor = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        anchor.append(time.perf_counter() - t0)
    print(f"anchor: python -c pass, median {statistics.median(anchor) * 1e3:.0f} ms of 5")
    for name, env in envs.items():
        times = [t for t in (handler_time(env) for _ in range(args.runs)) if t is not None]
        times.sort()
        print(f"{name}: SIGTERM caught after median {statistics.median(times) * 1e3:.0f} ms, "
              f"p90 {times[int(0.9 * (len(times) - 1))] * 1e3:.0f} ms, max {times[-1] * 1e3:.0f} ms "
              f"({len(times)} runs)")
    print(f"\n| delay | signal | {' | '.join(envs)} |\n|---|---|" + "---|" * len(envs))
    for d in delays:
        for sig in (signal.SIGINT, signal.SIGTERM):
            counts = {name: {} for name in envs}
            for _ in range(args.runs):
                for name, env in envs.items():  # interleaved: the same load for both
                    o = outcome(env, sig, d / 1000)
                    counts[name][o] = counts[name].get(o, 0) + 1
            cells = [", ".join(f"{n} {k}" for k, n in sorted(c.items(), key=lambda kv: -kv[1])) for c in
                     counts.values()]
            print(f"| {d} ms | {signal.Signals(sig).name} | {' | '.join(cells)} |", flush=True)
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Time the test suite as CI runs it (scripts/test.sh's pytest line) and show where the time goes: per pytest-xdist
worker, which file ran when, its wall and CPU time (the worker's own plus the processes it started and reaped), and
the order in which tests/conftest.py's LONGEST_FIRST should hand the files out (longest first).

    .venv/bin/python -m benchmarks.suite_timeline                    # the whole suite, -m "not gpu"
    .venv/bin/python -m benchmarks.suite_timeline --plot suite.png   # ... and a timeline of the workers
    .venv/bin/python -m benchmarks.suite_timeline -- tests/test_quant.py   # pytest arguments after --

It is also the pytest plugin that records the timeline (`-p suite_timeline`, writing one file per worker into
$SUITE_TIMELINE_DIR). The suite's wall time is pytest's own figure; run it on a quiet machine, or read the CPU
total beside it.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_out = None


# --- the plugin (runs inside each worker) ----------------------------------------------------------------------------

def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _record(nodeid: str, phase: str, start: float, cpu: float) -> None:
    global _out
    if _out is None:
        d = Path(os.environ["SUITE_TIMELINE_DIR"])
        _out = open(d / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.tsv", "a", buffering=1)
    _out.write(f"{nodeid}\t{phase}\t{start:.3f}\t{time.time():.3f}\t{_cpu() - cpu:.3f}\n")


def _timed(item, phase):
    start, cpu = time.time(), _cpu()
    yield
    _record(item.nodeid, phase, start, cpu)


if os.environ.get("SUITE_TIMELINE_DIR"):
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(item):
        yield from _timed(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(item):
        yield from _timed(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(item):
        yield from _timed(item, "teardown")

    _started: list[float] = []

    def pytest_sessionstart(session):
        _started.append(time.time())

    def pytest_collection_finish(session):
        _record("-", "collected", _started[0], 0.0)  # from the session's start; cpu: start-up and collection


# --- the report ------------------------------------------------------------------------------------------------------

def read(folder: Path) -> list[tuple[str, str, str, float, float, float]]:
    rows = []
    for f in sorted(folder.glob("*.tsv")):
        for line in f.read_text().splitlines():
            nodeid, phase, a, b, cpu = line.split("\t")
            rows.append((f.stem, nodeid, phase, float(a), float(b), float(cpu)))
    return rows


def report(rows, plot: Path | None) -> None:
    t0 = min(r[3] for r in rows)
    files: dict[str, dict] = collections.defaultdict(lambda: {"wall": 0.0, "cpu": 0.0, "start": 1e18, "end": 0.0})
    for worker, nodeid, phase, a, b, cpu in rows:
        if nodeid == "-":
            print(f"{worker}: started at {a - t0:4.1f} s, collected in {b - a:4.1f} s ({cpu:4.1f} s CPU)")
            continue
        f = files[nodeid.split("::")[0]]
        f.update(worker=worker, wall=f["wall"] + b - a, cpu=f["cpu"] + cpu, start=min(f["start"], a),
                 end=max(f["end"], b))
    wall, cpu = sum(f["wall"] for f in files.values()), sum(f["cpu"] for f in files.values())
    print(f"\ntests: {wall:.1f} s of worker time, {cpu:.1f} s CPU (worker + reaped children)\n")
    print("worker   start     end    wall     cpu  file")
    for name, f in sorted(files.items(), key=lambda kv: kv[1]["start"]):
        start, end = f["start"] - t0, f["end"] - t0
        print(f"{f['worker']:6s} {start:6.1f}  {end:6.1f}  {f['wall']:6.1f}  {f['cpu']:6.1f}  {name}")
    for w in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == w and r[1] != "-"]
        if not mine:
            continue  # a worker that got no file (more workers than files)
        end = max(r[4] for r in mine) - t0
        print(f"{w}: busy {sum(r[4] - r[3] for r in mine):.1f} s, last test ended at {end:.1f} s")
    by_wall = sorted(files.items(), key=lambda kv: -kv[1]["wall"])
    longest = [Path(n).name for n, f in by_wall if f["wall"] >= 2.0]
    print("\nLONGEST_FIRST (tests/conftest.py), the files of 2 s or more:\n" + repr(tuple(longest)))
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        workers = sorted({f["worker"] for f in files.values()})
        fig, ax = plt.subplots(figsize=(12, 1 + 0.6 * len(workers)))
        for name, f in files.items():
            y = workers.index(f["worker"])
            ax.barh(y, f["end"] - f["start"], left=f["start"] - t0, height=0.8, edgecolor="white")
            if f["end"] - f["start"] > 6:
                ax.text(f["start"] - t0 + 0.5, y, Path(name).stem.removeprefix("test_"), va="center", fontsize=7)
        for worker, nodeid, _, a, b, _ in rows:
            if nodeid == "-" and worker in workers:  # start-up and collection
                ax.barh(workers.index(worker), b - a, left=a - t0, height=0.8, color="lightgrey")
        ax.set_xlim(left=0)
        ax.set_yticks(range(len(workers)), workers)
        ax.set_xlabel("seconds since the first worker started")
        ax.set_title(f"test suite: {len(files)} files on {len(workers)} workers, {cpu:.0f} s CPU")
        fig.tight_layout()
        fig.savefig(plot, dpi=120)
        print(f"timeline plot: {plot}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plot", type=Path, help="write a PNG timeline of the workers")
    ap.add_argument("--keep", type=Path, help="keep the per-worker records in this folder")
    ap.add_argument("pytest_args", nargs="*", help='after --: pytest arguments (default: -m "not gpu", all tests)')
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="suite-timeline-"))
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.tsv"):
        old.unlink()
    env = dict(os.environ, SUITE_TIMELINE_DIR=str(folder),
               PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")])))
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "suite_timeline", "-m", "not gpu", "-n", "auto",
            "--dist", "loadfile", *args.pytest_args]
    print("$ " + " ".join(argv[1:]), flush=True)
    code = subprocess.run(argv, cwd=REPO, env=env).returncode
    rows = read(folder)
    if rows:
        report(rows, args.plot)
    return code


if __name__ == "__main__":
    sys.exit(main())

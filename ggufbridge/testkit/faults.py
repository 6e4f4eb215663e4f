"""Kill `ggufbridge convert` at random points, many times, and check the output folder after each kill: the engine of
`python -m benchmarks.fault_injection` (the full runs, docs/benchmarks.md) and of tests/test_fault_injection.py (the
bounded form CI runs). The rules it checks are in benchmarks/fault_injection.py's docstring.

Every command runs as a process, as a user runs it (`python -m ggufbridge convert|verify`), so this module imports
nothing above the format."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGKILL]


def convert_argv(ckpt: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "ggufbridge", "convert", str(ckpt), "-o", str(out), "--no-progress", "--force"]


def parts(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.endswith(".part")) if out.is_dir() else []


def verify(out: Path) -> tuple[int, str]:
    """`ggufbridge verify OUT` as a user runs it (a process: this module stays below the commands)."""
    res = subprocess.run([sys.executable, "-m", "ggufbridge", "verify", str(out)], capture_output=True, text=True)
    return res.returncode, res.stdout + res.stderr


def check_folder(out: Path) -> list[str]:
    """Problems with what is under final names (temporary files are not looked at here)."""
    if not out.is_dir():
        return []
    finals = sorted(p.name for p in out.iterdir() if not p.name.startswith(".") and p.suffix == ".gguf")
    if not (out / "manifest.json").is_file():
        return [f"final-named GGUF without a manifest: {name}" for name in finals]
    try:
        listed = {f["path"] for f in json.loads((out / "manifest.json").read_text())["files"]}
    except (ValueError, KeyError, TypeError) as e:
        return [f"manifest.json unreadable: {e}"]
    problems = [f"final-named GGUF not in the manifest: {name}" for name in finals if name not in listed]
    code, text = verify(out)
    if code != 0:
        problems.append("verify failed: " + " | ".join(line.strip() for line in text.splitlines()
                                                          if "BAD" in line or line.startswith("Error")))
    return problems


def timed_run(ckpt: Path, out: Path) -> tuple[float, float]:
    """(seconds until the first temporary file, seconds until exit) of one uninterrupted conversion."""
    t0 = time.monotonic()
    p = subprocess.Popen(convert_argv(ckpt, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = None
    while p.poll() is None:
        if first is None and parts(out):
            first = time.monotonic() - t0
        time.sleep(0.001)
    total = time.monotonic() - t0
    if p.returncode != 0:
        raise RuntimeError(f"baseline conversion failed with exit code {p.returncode}")
    return first if first is not None else total, total



def run_kills(ckpt: Path, work: Path, kills: int, seed: int, spec: str = "ksafe") -> dict:
    """Kill `kills` conversions of CKPT into WORK/out at random points (seeded), check the folder after each and
    convert to the end once more; the report: {"summary": ..., "runs": [...]} (a run with problems lists them)."""
    rng = random.Random(seed)
    out = work / "out"
    ckpt_bytes = sum(p.stat().st_size for p in ckpt.iterdir())
    baseline = [timed_run(ckpt, out) for _ in range(3)]
    start_s = sorted(b[0] for b in baseline)[1]
    write_s = sorted(b[1] - b[0] for b in baseline)[1]
    total_s = sorted(b[1] for b in baseline)[1]
    print(f"checkpoint {spec}: {ckpt_bytes / 2**20:.1f} MiB; uninterrupted conversion {total_s:.2f} s "
          f"(first temporary file at {start_s:.2f} s, writing {write_s:.2f} s)")

    runs, t_begin, n_killed, i = [], time.monotonic(), 0, 0
    # a draw that lands after the process has exited is not a kill: go on until --kills processes were killed
    while n_killed < kills and i < 3 * kills:
        sig = SIGNALS[n_killed % len(SIGNALS)]
        from_start = i % 5 == 4
        delay = rng.uniform(0, total_s * 1.1) if from_start else rng.uniform(0, write_s * 1.3)
        p = subprocess.Popen(convert_argv(ckpt, out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        if not from_start:
            while not parts(out) and p.poll() is None:
                time.sleep(0.0005)
            t0 = time.monotonic()
        while time.monotonic() - t0 < delay and p.poll() is None:
            time.sleep(0.0005)
        finished_first = p.poll() is not None
        phase = "exited" if finished_first else "writing" if parts(out) else "before writing"
        if not finished_first:
            p.send_signal(sig)
            n_killed += 1
        _, err = p.communicate(timeout=120)
        left = parts(out)
        problems = check_folder(out)
        # the next conversion runs to its end: it must clean up what the killed one left and produce a valid folder
        nxt = subprocess.run(convert_argv(ckpt, out), capture_output=True, text=True)
        after = parts(out)
        code, text = verify(out)
        ok_next = nxt.returncode == 0 and not after and code == 0
        if nxt.returncode != 0:
            problems.append(f"next conversion failed ({nxt.returncode}): {nxt.stderr.strip().splitlines()[-1:]}")
        if after:
            problems.append(f"temporary files survived the next conversion: {after}")
        if code != 0:
            problems.append(f"next output does not verify: {text.strip().splitlines()[-2:]}")
        runs.append({
            "i": i, "signal": signal.Signals(sig).name, "anchor": "start" if from_start else "first temporary file",
            "delay_s": round(delay, 4), "phase": phase, "exit_code": p.returncode,
            "temp_files_after_kill": left, "stderr_tail": err.strip().splitlines()[-1:] if err else [],
            "next_ok": ok_next, "problems": problems,
            "next_removed_stale": nxt.stderr.count("no longer running"),
            "next_completed_commit": "completed the commit" in nxt.stderr,
        })
        mark = "ok " if not problems else "BAD"
        print(f"{mark} {i:3d} {signal.Signals(sig).name:7s} {phase:14s} +{delay:.3f}s exit {p.returncode:4d} "
              f"temp files left {len(left)}" + ("" if not problems else f"  {problems}"))
        i += 1

    killed = [r for r in runs if r["phase"] != "exited"]
    summary = {
        "kills_requested": kills,
        "conversions_started": len(runs),
        "killed_while_running": len(killed),
        "by_signal": {s.name: sum(1 for r in killed if r["signal"] == s.name) for s in SIGNALS},
        "by_phase": {ph: sum(1 for r in runs if r["phase"] == ph) for ph in ("before writing", "writing", "exited")},
        "temp_files_left_by_kill": {s.name: sum(1 for r in killed if r["signal"] == s.name and
                                                r["temp_files_after_kill"]) for s in SIGNALS},
        "stale_temp_files_removed_by_next_run": sum(r["next_removed_stale"] for r in runs),
        "commits_completed_by_next_run": sum(1 for r in runs if r["next_completed_commit"]),
        "runs_with_problems": sum(1 for r in runs if r["problems"]),
        "next_conversions_ok": sum(1 for r in runs if r["next_ok"]),
        "checkpoint": {"spec": spec, "bytes": ckpt_bytes},
        "uninterrupted_s": round(total_s, 3), "writing_s": round(write_s, 3),
        "wall_s": round(time.monotonic() - t_begin, 1), "seed": seed,
    }
    return {"summary": summary, "runs": runs}

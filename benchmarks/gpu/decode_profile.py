#!/usr/bin/env python3
"""One decode step of N sequences on the GPU, timed and profiled kernel by kernel (issue 28; run by
concurrency_h200.sh on the device, stdlib only).

* timing: llama-batched-bench (-npp PROMPT -ntg STEPS -npl 1,2,4,8, CUDA graphs on, as llama-server runs):
  milliseconds per decode step at each N, from the tool's own T_TG. The tool decodes without sampling and without
  a server, so this is the GPU's step alone: set against llama-server's per-stream decode at the same N (bench
  --concurrency), the difference is the server's host work per step (`--timing-only`: this part only);
* kernels: `ncu` over llama-batched-bench with 1-token prompts and STEPS decode steps, once with 2 and once with 4
  steps: the difference of the two runs, halved, is exactly one decode step of N sequences (warm-up, load and
  the first step cancel). Per kernel name: launches and GPU time per step; the sum against the timed step says
  how much of the step is not kernel time (launch gaps, host work). ncu serialises kernels and the runs use
  GGML_CUDA_DISABLE_GRAPHS=1 so each kernel is seen, which is why the timing comes from the first run.

    python3 -m benchmarks.gpu.decode_profile BIN_DIR MODEL.gguf --npl 1,8 --json OUT.json
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict


def _env(bench: str, **more) -> dict:
    """The tool finds the runtime's shared libraries beside it (as ggufbridge's own launches do)."""
    lib = os.path.dirname(bench)
    return dict(os.environ, LD_LIBRARY_PATH=lib + os.pathsep + os.environ.get("LD_LIBRARY_PATH", ""), **more)


def batched_bench(bench: str, model: str, npl: list[int], npp: int, ntg: int, extra: list[str]) -> list[dict]:
    ctx = max(npl) * (npp + ntg) + 256
    argv = [bench, "-m", model, "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(npp), "-ntg", str(ntg),
            "-npl", ",".join(map(str, npl)), "-ngl", "99", "-fa", "on", "--output-format", "jsonl", *extra]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=_env(bench))
    # LOG() lines: stdout in this tree; read both streams in case a build routes them to stderr
    rows = [json.loads(line) for line in (p.stdout + "\n" + p.stderr).splitlines() if line.startswith('{"n_kv_max"')]
    if not rows:
        raise SystemExit(f"llama-batched-bench gave no rows (rc {p.returncode}):\n{p.stderr[-2000:]}")
    for r in rows:
        r["ms_per_step"] = 1000.0 * r["t_tg"] / r["tg"] if r.get("tg") else None
    return rows


def parse_ncu_csv(stdout: str) -> dict[str, list[float]]:
    """Kernel name -> durations (ns) from `ncu --csv --page raw --metrics gpu__time_duration.sum --print-units base`
    output (the table starts at its "ID" header; the program's own output and ncu's ==PROF== notes come before)."""
    text = stdout[stdout.find('"ID"'):] if '"ID"' in stdout else ""
    out: dict[str, list[float]] = defaultdict(list)
    for r in csv.DictReader(io.StringIO(text)):
        try:
            ns = float(r["gpu__time_duration.sum"].replace(",", ""))  # ncu groups thousands: "12,345"
        except (KeyError, ValueError):
            continue  # the units row
        out[r["Kernel Name"]].append(ns)
    return out


def ncu_kernels(ncu: str, bench: str, model: str, pl: int, ntg: int, extra: list[str]) -> dict[str, list[float]]:
    """Kernel name -> durations (ns) of every kernel of one llama-batched-bench run with 1-token prompts."""
    argv = [ncu, "--csv", "--page", "raw", "--metrics", "gpu__time_duration.sum", "--print-units", "base",
            "--target-processes", "all", bench, "-m", model, "-c", str(pl * (1 + ntg) + 256), "-b", "2048",
            "-ub", "512", "-npp", "1", "-ntg", str(ntg), "-npl", str(pl), "-ngl", "99", "-fa", "on", *extra]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=1800,
                       env=_env(bench, GGML_CUDA_DISABLE_GRAPHS="1"))
    out = parse_ncu_csv(p.stdout)
    if not out:
        raise SystemExit(f"ncu gave no kernels (rc {p.returncode}):\n{p.stderr[-2000:]}\n{p.stdout[-2000:]}")
    return out


def one_step(ncu: str, bench: str, model: str, pl: int, extra: list[str]) -> dict:
    short, long = (ncu_kernels(ncu, bench, model, pl, n, extra) for n in (2, 4))
    kernels = []
    for name in set(short) | set(long):
        launches = (len(long.get(name, [])) - len(short.get(name, []))) / 2
        ns = (sum(long.get(name, [])) - sum(short.get(name, []))) / 2
        if launches > 0 or ns > 0:
            kernels.append({"kernel": name, "launches": launches, "us": ns / 1000.0})
    kernels.sort(key=lambda k: -k["us"])
    total = sum(k["us"] for k in kernels)
    return {"sequences": pl, "kernel_us_per_step": total, "launches_per_step": sum(k["launches"] for k in kernels),
            "kernels": [dict(k, share=k["us"] / total if total else None) for k in kernels]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("model")
    ap.add_argument("--npl", default="1,8", help="sequences per decode step to profile")
    ap.add_argument("--timing-npl", default="1,2,4,8")
    ap.add_argument("--npp", type=int, default=1024, help="prompt tokens per sequence in the timing run")
    ap.add_argument("--ntg", type=int, default=128, help="decode steps in the timing run")
    ap.add_argument("--extra", default="-ctk q8_0 -ctv q8_0", help="more llama-batched-bench arguments")
    ap.add_argument("--timing-only", action="store_true", help="llama-batched-bench only, no ncu")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    bench = os.path.join(a.bin_dir, "llama-batched-bench")
    extra = a.extra.split()
    report: dict = {"model": a.model, "extra": extra}
    report["timing"] = batched_bench(bench, a.model, [int(x) for x in a.timing_npl.split(",")], a.npp, a.ntg, extra)
    print(json.dumps(report["timing"], indent=1), flush=True)
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    if a.timing_only:
        pass
    elif not os.path.exists(ncu):
        report["profile_error"] = "ncu not found"
    else:
        report["profile"] = []
        for pl in (int(x) for x in a.npl.split(",")):
            step = one_step(ncu, bench, a.model, pl, extra)
            timed = next((r["ms_per_step"] for r in report["timing"] if r.get("pl") == pl), None)
            step["timed_ms_per_step"] = timed
            report["profile"].append(step)
            top = ", ".join(f"{k['kernel'][:40]} {k['us']:.0f}us" for k in step["kernels"][:5])
            print(f"npl {pl}: {step['launches_per_step']:.0f} launches, {step['kernel_us_per_step'] / 1000:.2f} ms "
                  f"of kernels per step (timed {timed} ms); top: {top}", flush=True)
            with open(a.json, "w") as f:  # a run cut short keeps what it measured
                json.dump(report, f, indent=1)
    with open(a.json, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

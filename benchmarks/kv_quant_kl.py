#!/usr/bin/env python3
"""What a quantized K/V cache costs in fidelity at depth (issue 24): KL divergence of the next-token distribution
with a q8_0 and a q4_0 K/V cache against an f16 one, on a synthetic checkpoint with the real model's attention
grouping (GQA 8), through llama-perplexity's own KL mode on CPU.

A random-weight fixture says how much the cache types disturb the attention layers relative to each other, not
what the real model loses; its absolute KL is small because random weights give flat distributions.

    python -m benchmarks.kv_quant_kl OUT_DIR [--ctx 32768] [--json benchmarks/results/kv-quant-kl/cpu-a11b956fe832.json]

llama-perplexity scores the second half of each --ctx window (tokens ctx/2 .. ctx), so "at 32k" means the
16k-32k positions of one 32,768-token window.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from ggufbridge.convert import convert
from ggufbridge.runtime.locate import locate
from ggufbridge.testkit.checkpoint import SPECS, make_minicpmv47

# the real model's attention grouping (16 Q heads on 2 K/V heads: GQA 8) at a CPU-affordable size: 8 Q heads on
# one K/V head of 128 (a multiple of the q4_0/q8_0 block of 32); long enough positions for the window
SPEC = replace(SPECS["ksafe"], heads=8, kv_heads=1, head_dim=128, mrope_section=(6, 5, 5), max_positions=65536)
KL_RE = {"mean": r"Mean\s+KLD:\s+([-\d.e+]+)", "p99": r"99\.0%\s+KLD:\s+([-\d.e+]+)",
         "max": r"Maximum KLD:\s+([-\d.e+]+)", "same_top": r"Same top p:\s+([\d.]+)"}


def text_of(n_chars: int) -> str:
    """Plain prose-like text (the repository's own docs, repeated) long enough for the window."""
    root = Path(__file__).resolve().parents[1]
    src = "\n".join(p.read_text(errors="replace") for p in sorted((root / "docs").glob("*.md")))
    return (src * (n_chars // max(len(src), 1) + 1))[:n_chars]


def run(argv: list[str], env: dict, log: Path) -> str:
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, env=env)
    log.write_text(res.stdout + res.stderr)
    if res.returncode:
        sys.exit(f"{argv[0]} failed ({res.returncode}), see {log}")
    print(f"  {Path(argv[0]).name} {' '.join(argv[1:])[:80]}... {time.perf_counter() - t0:.0f} s", flush=True)
    return res.stdout + res.stderr


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    rt = locate()
    ckpt = a.out / "ckpt"
    if not (ckpt / "config.json").exists():
        make_minicpmv47(ckpt, SPEC, vocab="small")
    gguf_dir = a.out / "gguf"
    if not gguf_dir.exists():
        convert(ckpt, gguf_dir, outtype="f16", mmproj=False, progress=False)
    model = next(p for p in gguf_dir.glob("*.gguf"))
    text = a.out / "text.txt"
    text.write_text(text_of(a.ctx * 8))  # small vocabulary: ~1-4 characters per token
    tool = str(rt.tool("llama-perplexity"))
    common = [tool, "-m", str(model), "-f", str(text), "-c", str(a.ctx), "-b", "2048", "--chunks", "1",
              "-fa", "on", "-t", str(a.threads)]
    base = a.out / "f16.kld"
    if not (a.out / "f16.log").exists() or "Final estimate" not in (a.out / "f16.log").read_text():
        run(common + ["-ctk", "f16", "-ctv", "f16", "--kl-divergence-base", str(base)], rt.env(), a.out / "f16.log")
    rows = {}
    for kv in ("q8_0", "q4_0"):
        log = a.out / f"{kv}.log"
        if log.exists() and re.search(KL_RE["mean"], log.read_text()):  # measured by an earlier run into OUT
            out = log.read_text()
        else:
            out = run(common + ["-ctk", kv, "-ctv", kv, "--kl-divergence-base", str(base), "--kl-divergence"],
                      rt.env(), log)
        rows[kv] = {k: float(m[1]) for k, r in KL_RE.items() if (m := re.search(r, out))}
        print(f"{kv}: {rows[kv]}", flush=True)
    rec = {"what": "KL(f16 K/V || quantized K/V) of the next-token distribution, llama-perplexity --kl-divergence, "
                   f"positions {a.ctx // 2}..{a.ctx} of one {a.ctx}-token window, CPU",
           "model": {"spec": "ksafe with heads=8, kv_heads=1, head_dim=128, mrope_section=(6, 5, 5), "
                             "max_positions=65536", "vocab": "small", "outtype": "f16", "weights": "random (seed 0)"},
           "runtime": {"bin": str(rt.bin_dir), "commit": rt.commit},
           "command": " ".join(common[1:]).replace(str(a.out), "OUT"), "kl": rows,
           "q4_0_over_q8_0_mean": rows["q4_0"]["mean"] / rows["q8_0"]["mean"] if rows["q8_0"].get("mean") else None}
    if a.json:
        a.json.write_text(json.dumps(rec, indent=1) + "\n")
    print(json.dumps(rec["kl"]), f"q4_0/q8_0 mean KL: {rec['q4_0_over_q8_0_mean']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Benchmark: wall time and peak RSS of `ggufbridge convert` against llama.cpp's own converter (same sdist), BF16 out.

llama.cpp's converter does not know MiniCPMV4_7ForConditionalGeneration, so it gets a text-only
`Qwen3_5MoeForCausalLM` copy of the same weights (run with --no-mtp); ggufbridge converts the MiniCPM-V 4.7 folder
(text tower only: --no-mmproj). Both run in the same invocation, alternating, each as its own process; peak RSS is
the child's ru_maxrss. The two outputs are also compared tensor by tensor (an independent check of the mapping).

    .venv/bin/python -m benchmarks.bench_convert [--work DIR] [--repeats 2] [--markdown docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ggufbridge.testkit.checkpoint import SPECS, make_minicpmv47

REPO = Path(__file__).resolve().parents[1]

# ~0.74 GB of BF16 weights with the real vocabulary (embeddings + head are 0.25 GB of it)
BENCH_SPEC = replace(SPECS["tiny"], hidden=512, layers="LLLFLLLF", heads=8, kv_heads=2, head_dim=64,
                     mrope_section=(3, 3, 2), linear_k_heads=4, linear_v_heads=8, linear_k_dim=64, linear_v_dim=64,
                     experts=40, top_k=4, expert_ff=256, shared_ff=256)


def sdist_llama_cpp() -> Path:
    from ggufbridge.files import cache_dir
    from ggufbridge.runtime.locate import RUNTIME_VERSION

    root = cache_dir() / "src" / f"llama_cpp_python-{RUNTIME_VERSION}" / "vendor" / "llama.cpp"
    if not (root / "convert_hf_to_gguf.py").is_file():
        sys.exit(f"bench_convert: {root} missing — run scripts/build_runtime.sh first")
    return root


def text_only_copy(src: Path, dst: Path) -> None:
    """The same text-tower weights as a Qwen3_5MoeForCausalLM checkpoint (keys model.language_model.* → model.*)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    dst.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((src / "config.json").read_text())
    text = dict(cfg["text_config"])
    text.pop("mtp_num_hidden_layers", None)
    text.update(architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe_text")
    (dst / "config.json").write_text(json.dumps(text, indent=2))
    weight_map = {}
    for shard in sorted(src.glob("model-*.safetensors")):
        out = {}
        with safe_open(shard, "pt") as f:
            for k in f.keys():
                if k.startswith("model.language_model."):
                    out["model." + k[len("model.language_model."):]] = f.get_tensor(k)
                elif k == "lm_head.weight":
                    out[k] = f.get_tensor(k)
        if out:
            save_file(out, dst / shard.name, metadata={"format": "pt"})
            weight_map.update({k: shard.name for k in out})
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (src / name).exists():
            shutil.copy(src / name, dst / name)


# A child's ru_maxrss counts the pages it inherited at fork, before exec: this process holds torch and a model, so
# children are started from a bare Python launcher whose own footprint (~10 MB) is all they inherit.
LAUNCHER = """
import os, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
err = p.stderr.read()
_, status, usage = os.wait4(p.pid, 0)
wall = time.perf_counter() - t0
sys.stderr.write(err.decode(errors="replace")[-3000:])
print(wall, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status))
"""


def measure(cmd: list[str], env: dict | None = None) -> tuple[float, int]:
    res = subprocess.run([sys.executable, "-c", LAUNCHER, *cmd], env=env, capture_output=True, text=True)
    wall, rss, code = res.stdout.split()
    if int(code) != 0:
        sys.exit(f"bench_convert: {' '.join(cmd[:3])}… failed:\n{res.stderr}")
    return float(wall), int(rss)


def compare_outputs(a: Path, b: Path) -> tuple[int, int, list[str]]:
    from ggufbridge.ggufio.reader import read_header

    ha, hb = read_header(a), read_header(b)
    ta, tb = {t.name: t for t in ha.tensors}, {t.name: t for t in hb.tensors}
    same, diff = 0, []
    for name in sorted(set(ta) | set(tb)):
        if name not in ta or name not in tb:
            diff.append(f"{name}: only in {'ggufbridge' if name in ta else 'llama.cpp'}")
            continue
        x, y = ta[name], tb[name]
        xs, ys = list(x.shape), list(y.shape)
        if x.type == y.type and xs == ys and np.array_equal(ha.tensor_data(x), hb.tensor_data(y)):
            same += 1
        elif x.type == y.type and xs == ys and x.type == "F32":
            xa, ya = ha.tensor_array(x), hb.tensor_array(y)
            d = np.abs(xa.astype(np.float64) - ya.astype(np.float64)).max()
            ulp = np.spacing(np.abs(ya)).max()
            diff.append(f"{name} max |Δ| {d:.1e} ({d / ulp:.0f} ulp)")
        else:
            diff.append(f"{name}: {x.type}{xs} vs {y.type}{ys}")
    return same, len(set(ta) | set(tb)), diff


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/ggufbridge-bench-convert"))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--markdown", type=Path, default=None, help="append the results section to this file")
    args = ap.parse_args()

    work = args.work
    ckpt, copy = work / "minicpmv47-bench", work / "qwen35moe-text-copy"
    if not (ckpt / "config.json").exists():
        print("generating the synthetic BF16 checkpoint …", file=sys.stderr)
        make_minicpmv47(ckpt, BENCH_SPEC, dtype="bfloat16", max_shard_size="200MB")
    if not (copy / "model.safetensors.index.json").exists():
        text_only_copy(ckpt, copy)
    src_bytes = sum(p.stat().st_size for p in copy.glob("*.safetensors"))

    llama = sdist_llama_cpp()
    env = dict(os.environ, PYTHONPATH=str(llama / "gguf-py"), NO_LOCAL_GGUF="")
    anchor_out, ours_out = work / "anchor.gguf", work / "ours"
    anchor_cmd = [sys.executable, str(llama / "convert_hf_to_gguf.py"), str(copy), "--outfile", str(anchor_out),
                  "--outtype", "bf16", "--no-mtp"]
    ours_cmd = [str(REPO / ".venv" / "bin" / "ggufbridge"), "convert", str(ckpt), "-o", str(ours_out),
                "--outtype", "bf16", "--no-mmproj", "--no-progress"]
    runs = {"llama.cpp convert_hf_to_gguf.py": [], "ggufbridge convert": []}
    for _ in range(args.repeats):
        for name, cmd, e in (("llama.cpp convert_hf_to_gguf.py", anchor_cmd, env),
                             ("ggufbridge convert", ours_cmd, None)):
            shutil.rmtree(ours_out, ignore_errors=True)
            anchor_out.unlink(missing_ok=True)
            runs[name].append(measure(cmd, e))
            if name == "ggufbridge convert":
                ours_file = next(ours_out.glob("*.gguf"))
                kept = work / "ours.gguf"
                shutil.copy(ours_file, kept)
    measure(anchor_cmd, env)  # leave the anchor's file for the comparison
    same, total, diff = compare_outputs(work / "ours.gguf", anchor_out)

    best = {k: (min(w for w, _ in v), max(r for _, r in v)) for k, v in runs.items()}
    (aw, ar), (ow, orss) = best["llama.cpp convert_hf_to_gguf.py"], best["ggufbridge convert"]
    lines = [
        f"### convert: ggufbridge vs llama.cpp's converter ({time.strftime('%Y-%m-%d')})",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; Python {platform.python_version()}. "
        f"Source: {src_bytes / 1e9:.2f} GB BF16 safetensors (synthetic, real vocabulary 248,144), BF16 out. "
        f"Best of {args.repeats} alternating runs, warm page cache; peak RSS = the process's ru_maxrss.",
        "",
        "| converter | wall s | peak RSS GB | vs anchor (time) | vs anchor (RSS) |",
        "|---|---:|---:|---:|---:|",
        f"| llama.cpp convert_hf_to_gguf.py (anchor) | {aw:.2f} | {ar / 1e9:.2f} | 1.00 | 1.00 |",
        f"| ggufbridge convert | {ow:.2f} | {orss / 1e9:.2f} | {aw / ow:.2f}× faster | {orss / ar:.0%} |",
        "",
        f"Output check: {same} of {total} tensors byte-identical (type, shape, bytes) between the two files."
        + ("" if not diff else " Differences: " + "; ".join(diff[:8])),
        "",
        "Command: `.venv/bin/python -m benchmarks.bench_convert --markdown docs/benchmarks.md`",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

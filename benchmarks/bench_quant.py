#!/usr/bin/env python
"""Size and KL(BF16 ‖ quantised) of llama.cpp types and ggufbridge recipes on a synthetic K-quant-safe model.

    .venv/bin/python -m benchmarks.bench_quant --work /tmp/bench-quant [--seeds 0 1] \
        [--out benchmarks/results/quant/cpu.json]

Per seed: a random-weight "ksafe" MiniCPM-V 4.7 (every row length a multiple of 256, 512-token vocabulary,
bfloat16) is converted to a BF16 GGUF (the reference), an importance matrix is computed over a calibration text,
and each candidate is quantised from the BF16 file and compared with it by ggufbridge.compare on a different text.
Random weights are not a trained model: see docs/quant.md for what these numbers can and cannot say.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

# (label, quant type or None, recipe or None, use the imatrix)
CANDIDATES = [
    ("Q8_0", "Q8_0", None, False),
    ("Q6_K", "Q6_K", None, False),
    ("Q5_K_M", "Q5_K_M", None, False),
    ("Q4_K_M", "Q4_K_M", None, False),
    ("Q4_K_M + imatrix", "Q4_K_M", None, True),
    ("IQ4_XS + imatrix", "IQ4_XS", None, True),
    ("hq4", None, "hq4", False),
    ("hq4 + imatrix", None, "hq4", True),
    ("hq4, token_embd Q4_K (ablation)", None, "ABLATION", False),
    ("Q3_K_M", "Q3_K_M", None, False),
    ("hq3", None, "hq3", False),
    ("hq3 + imatrix", None, "hq3", True),
]
ABLATION = 'base = "hq4"\n[types]\ntoken_embd = "Q4_K"\n'

CAL_WORDS = ("the a of and to in is was for on that with as by at from model weights layer expert token "
             "attention memory state river mountain city history science music 1 2 3 4 5 ( ) , . ; :").split()
EVAL_WORDS = ("when where why how which who people time year day world life hand part child eye woman place "
              "work week case point number group problem fact 6 7 8 9 0 ! ? - \" '").split()


def text(words, n, seed) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(words) for _ in range(n))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="scratch folder (models, files)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--eval-words", type=int, default=600, help="words of eval text (~5 tokens each)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)

    from ggufbridge.compare.run import compare
    from ggufbridge.convert import convert
    from ggufbridge.testkit.checkpoint import make_minicpmv47
    from ggufbridge.quant import quantize_file
    from ggufbridge.quant.imatrix import compute_imatrix

    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "ablation.toml").write_text(ABLATION)
    cal = args.work / "calibration.txt"
    cal.write_text(text(CAL_WORDS, 3000, 1))
    ev = args.work / "eval.txt"
    ev.write_text(text(EVAL_WORDS, args.eval_words, 2))
    results = []
    for seed in args.seeds:
        t0 = time.time()
        ckpt = make_minicpmv47(args.work / f"ckpt-{seed}", "ksafe", dtype="bfloat16", vocab="small", seed=seed)
        ref = convert(ckpt, args.work / f"bf16-{seed}", outtype="bf16", mmproj=False, progress=False).path("target")
        imat = compute_imatrix(ref, cal, args.work / f"imatrix-{seed}.gguf", ctx=args.ctx, threads=args.threads).path
        files = {}
        for i, (label, quant, recipe, use_im) in enumerate(CANDIDATES):
            rec = str(args.work / "ablation.toml") if recipe == "ABLATION" else recipe
            out = args.work / f"s{seed}-{i:02d}-{quant or recipe}{'-imatrix' if use_im else ''}.gguf"
            quantize_file(ref, out, quant=quant, mix=rec, imatrix=imat if use_im else None, threads=args.threads)
            files[label] = out
        cmp = compare(f"gguf:{ref}", [f"gguf:{p}" for p in files.values()], text_path=ev, ctx=args.ctx)
        for (label, path), r in zip(files.items(), cmp.results):
            s = r.summary
            results.append({"seed": seed, "label": label, "bytes": path.stat().st_size,
                            "bpw": r.bits_per_weight, "kl_mean": s["kl_mean"], "kl_p99": s["kl_p99"],
                            "top1": s["top1"], "n_tokens": s["n_tokens"]})
        results.append({"seed": seed, "label": "BF16 (reference)", "bytes": ref.stat().st_size, "bpw": None,
                        "kl_mean": 0.0, "kl_p99": 0.0, "top1": 1.0, "n_tokens": cmp.n_tokens})
        print(f"seed {seed}: {time.time() - t0:.0f} s, {cmp.n_tokens} tokens", file=sys.stderr)

    print(table(results, args.seeds))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def table(results, seeds) -> str:
    labels = [c[0] for c in CANDIDATES] + ["BF16 (reference)"]
    base = {r["seed"]: r for r in results if r["label"] == "Q4_K_M"}
    lines = ["| file | bytes | bpw | mean KL | KL p99 | top-1 | KL vs Q4_K_M | size vs Q4_K_M |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label in labels:
        rows = [r for r in results if r["label"] == label]
        if not rows:
            continue
        n = len(rows)
        kl = sum(r["kl_mean"] for r in rows) / n
        p99 = sum(r["kl_p99"] for r in rows) / n
        top1 = sum(r["top1"] for r in rows) / n
        size = sum(r["bytes"] for r in rows) / n
        bkl = sum(base[r["seed"]]["kl_mean"] for r in rows) / n
        bsize = sum(base[r["seed"]]["bytes"] for r in rows) / n
        bpw = rows[0]["bpw"]
        lines.append(f"| {label} | {size:,.0f} | {bpw:.2f} | {kl:.4f} | {p99:.3f} | {top1:.3f} | "
                     f"{100 * (kl / bkl - 1):+.0f}% | {100 * (size / bsize - 1):+.2f}% |" if bpw is not None else
                     f"| {label} | {size:,.0f} | 16 | 0 | 0 | 1.000 | | {100 * (size / bsize - 1):+.0f}% |")
    per_seed = []
    for s in seeds:
        q = base[s]["kl_mean"]
        h = next(r for r in results if r["seed"] == s and r["label"] == "hq4")
        per_seed.append(f"seed {s}: hq4 KL {h['kl_mean']:.4f} vs Q4_K_M {q:.4f} "
                        f"({100 * (h['kl_mean'] / q - 1):+.0f}%), bytes {h['bytes']:,} vs {base[s]['bytes']:,}")
    return "\n".join(lines + [""] + per_seed)


if __name__ == "__main__":
    sys.exit(main())

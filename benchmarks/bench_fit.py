#!/usr/bin/env python
"""KL-guided mixes (`quantize --fit-bytes`) at given byte budgets, measured against a reference on an eval set.

    # the EXL3 comparison (docs/compare.md): at each EXL3 pack's size, on the frozen rows, against the hf dump
    .venv/bin/python -m benchmarks.bench_fit --src F16.gguf --calibration CAL.txt --work W \
        --reference logits:hf.safetensors --eval rows.jsonl --exl3 benchmarks/results/compare-exl3/h200.json \
        --out R.json
    # against llama.cpp's Q4_K_M at its exact size (the budget is the Q4_K_M file's size)
    .venv/bin/python -m benchmarks.bench_fit --src F16.gguf ... --vs Q4_K_M

The sensitivity pass runs once (cached under --work) and its time and peak memory are reported. Each budget's
file is written with the same code path as the CLI (ggufbridge.quant.optimise.fit_quantize) and compared with
ggufbridge.compare; the file size is checked against the budget.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

# Synthetic shapes for the acceptance checks of docs/quant.md (every matrix row a multiple of 256).
# embedding-heavy: the real 248,144-token vocabulary over hidden 256 (embedding + head ≈ 90% of the bytes);
# expert-heavy: 16 routed experts of ff 512 per layer (routed experts ≈ 85% of the bytes, as in the 35B-A3B).
# bench-369m: benchmarks/bench_convert.py's model (369 M parameters, 0.74 GB at F16, the real vocabulary), the
# checkpoint of issue 44's timings; F16 as it was measured there.
SHAPES = {
    "embedding-heavy": ({}, "qwen35"),
    "expert-heavy": ({"experts": 16, "expert_ff": 512}, "small"),
    "bench-369m": (None, "qwen35"),
}


def make(name: str, work: Path) -> Path:
    import dataclasses

    from ggufbridge.convert import convert
    from ggufbridge.testkit.checkpoint import get_spec, make_minicpmv47

    over, vocab = SHAPES[name]
    if over is None:
        from benchmarks.bench_convert import BENCH_SPEC

        spec, outtype = BENCH_SPEC, "f16"
    else:
        spec, outtype = dataclasses.replace(get_spec("ksafe"), **over), "bf16"
    out = work / f"{name}-{outtype}"
    if not (out / "manifest.json").is_file():
        ckpt = make_minicpmv47(work / f"{name}-ckpt", spec, vocab=vocab, dtype="bfloat16")
        convert(ckpt, out, outtype=outtype, mmproj=False, progress=False, force=True)
    return next(out.glob("*.gguf"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=None, help="unquantised GGUF (BF16/F16)")
    ap.add_argument("--make", choices=sorted(SHAPES), default=None,
                    help="build this synthetic checkpoint under --work and use its BF16 GGUF as --src")
    ap.add_argument("--calibration", type=Path, required=True, help="calibration text or .jsonl (not the eval set)")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--sens-reference", default=None, help="reference of the sensitivity pass [the source GGUF]")
    ap.add_argument("--reference", required=True,
                    help="reference of the evaluation (logits:/hf:/gguf:, or 'source': the unquantised GGUF)")
    ap.add_argument("--eval", type=Path, default=None, help="eval rows (.jsonl)")
    ap.add_argument("--text", type=Path, default=None, help="eval text (instead of --eval)")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--cal-rows", type=int, default=16)
    ap.add_argument("--budgets", type=int, nargs="*", default=[])
    ap.add_argument("--exl3", type=Path, default=None, help="a compare JSON: one budget per EXL3 pack's size")
    ap.add_argument("--vs", nargs="*", default=[], help="llama.cpp types: one budget per type's file size")
    ap.add_argument("--types", nargs="*", default=None, help="candidate types [ggufbridge.quant.sensitivity's]")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if (args.src is None) == (args.make is None):
        ap.error("give exactly one of --src and --make")

    from ggufbridge.compare.run import compare
    from ggufbridge.quant import quantize_file
    from ggufbridge.quant.optimise import plan_fit
    from ggufbridge.quant.sensitivity import measure

    args.work.mkdir(parents=True, exist_ok=True)
    if args.make:
        args.src = make(args.make, args.work)
    if args.reference == "source":
        args.reference = f"gguf:{args.src}"
    t0 = time.perf_counter()
    sens = measure(args.src, args.calibration, work=args.work / "sens", reference=args.sens_reference,
                   ctx=args.ctx, max_rows=args.cal_rows, threads=args.threads, progress=True,
                   types=tuple(args.types) if args.types else None)
    print(f"sensitivity: {time.perf_counter() - t0:.0f} s here ({sens.timings})", file=sys.stderr)
    targets: list[tuple[str, int, float | None]] = [(f"budget {b:,}", b, None) for b in args.budgets]
    baselines = []
    if args.exl3:
        d = json.loads(args.exl3.read_text())
        for r in d["results"]:
            if r["label"].startswith("exl3"):
                targets.append((r["label"], int(r["file_bytes"]), r["kl_mean"]))
    for t in args.vs:
        out = args.work / f"{t}.gguf"
        quantize_file(args.src, out, quant=t, threads=args.threads)
        baselines.append((t, out))
        targets.append((t, out.stat().st_size, None))
    files = []
    for label, budget, _ in targets:
        plan = plan_fit(sens, budget)
        out = args.work / f"fit-{budget}.gguf"
        quantize_file(args.src, out, mix=plan.mix, threads=args.threads)
        size = out.stat().st_size
        assert size == plan.file_bytes <= budget, (size, plan.file_bytes, budget)
        files.append((label, budget, out, plan))
    cands = [f"gguf:{p}" for _, _, p, _ in files] + [f"gguf:{p}" for _, p in baselines]
    cmp = compare(args.reference, cands, eval_path=args.eval, text_path=args.text, ctx=args.ctx, floor=False)
    res = {r.spec: r for r in cmp.results}
    rows = []
    for (label, budget, path, plan), (_, _, other) in zip(files, targets):
        r = res[f"gguf:{path}"].summary
        row = {"target": label, "budget": budget, "file_bytes": path.stat().st_size, "mix": plan.mix.name,
               "predicted_kl": plan.predicted_kl, "kl_mean": r["kl_mean"], "top1": r["top1"],
               "kl_p99": r["kl_p99"], "unit_types": plan.unit_types}
        if other is not None:
            row["exl3_kl_mean"] = other
            row["ratio"] = r["kl_mean"] / other
        for t, p in baselines:
            if t == label:
                b = res[f"gguf:{p}"].summary
                row.update({"baseline": t, "baseline_kl_mean": b["kl_mean"], "baseline_bytes": p.stat().st_size,
                            "vs_baseline": r["kl_mean"] / b["kl_mean"] - 1})
        rows.append(row)
        extra = (f"  EXL3 {other:.4f}  ratio {row['ratio']:.3f}" if other is not None else "") + (
            f"  {row['baseline']} {row['baseline_kl_mean']:.4f} ({100 * row['vs_baseline']:+.0f}%)"
            if "baseline" in row else "")
        print(f"{label:<12} budget {budget:>11,}  file {row['file_bytes']:>11,}  predicted {plan.predicted_kl:.4f}  "
              f"KL {r['kl_mean']:.4f}  top-1 {r['top1']:.3f}{extra}")
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
               resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
    out = {"source": str(args.src), "reference": args.reference, "eval": str(args.eval or args.text),
           "eval_sha256": cmp.eval_sha256, "reference_id": cmp.reference_id, "n_tokens": cmp.n_tokens,
           "sensitivity": {"timings": sens.timings, "n_tokens": sens.n_tokens, "units": len(sens.units),
                           "types": sens.types, "probe_type": sens.probe_type},
           "peak_rss_mib": peak, "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

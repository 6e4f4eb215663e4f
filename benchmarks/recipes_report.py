#!/usr/bin/env python3
"""Tables and plots for docs/benchmarks.md from the H200 recipe results (benchmarks/gpu/recipes_h200.sh), in
benchmarks/results/: recipes/h200-b4abbb7c94b9.json (recipes as users run them), recipes/h200-b4abbb7c94b9-draft.json
(oracle-pair drafting economics), compute/h200-b4abbb7c94b9.json (compute buffers). Also the bandwidth-bound decode
estimate for a DGX Spark (273 GB/s), from the bytes each file's tensors make a decode step read (routed experts:
top-8 of 256).

    .venv/bin/python -m benchmarks.recipes_report [--recipes J] [--draft J] [--plot PNG]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB, MIB = 1024**3, 1024**2
SPARK_BW = 273e9     # DGX Spark LPDDR5x, bytes/s (vendor figure)
H200_BW = 4.8e12     # H200 HBM3e, bytes/s (vendor figure)


def fullshape_tensors(quant: str, layers: int = 40):
    """(name, bytes) of every tensor of make_fullsize_gguf.py's file for `quant` (from its plan, no data)."""
    from dataclasses import replace

    from ggufbridge.arch import qwen35moe as qm
    from ggufbridge.ggufio.plan import ConversionPlan

    from ggufbridge.testkit import fullsize as mf
    s = replace(mf.Shape(), layers="LLLF" * (layers // 4))
    p = s.text_params()
    shapes = ConversionPlan(qm.ARCH)
    qm.plan_text(shapes, p, mf._FakeRefs(p), "", "lm_head.weight")
    out = []
    for t in shapes.tensors:
        qt = mf.target_type(t.name, t.shape, quant, p.n_layer)
        k = 1
        for d in t.shape:
            k *= d
        out.append((t.name, k * 4 if qt == "F32" else k // mf.QK[qt] * mf.BLOCK_BYTES[qt]))
    return s, out


def bytes_per_decode_step(quant: str) -> int:
    """Weight bytes one decoded token reads at the real shapes: every tensor except the embedding table (one row),
    routed experts at top_k / n_expert. Excludes KV and state reads (small at short context)."""
    s, tensors = fullshape_tensors(quant)
    return int(sum(b * (s.top_k / s.experts if "_exps." in name else 1) for name, b in tensors
                   if not name.startswith("token_embd")))


def fullshape_target(quant: str, layers: int = 40):
    """The planner's TargetShape of make_fullsize_gguf.py's file for `quant`."""
    from ggufbridge.runtime import memory as pl

    s, tensors = fullshape_tensors(quant, layers)
    n = len(s.layers)
    cfg = {"num_hidden_layers": n, "layer_types": ["linear_attention" if c == "L" else "full_attention"
                                                   for c in s.layers],
           "linear_key_head_dim": s.lin_dim, "linear_value_head_dim": s.lin_dim, "head_dim": s.head_dim,
           "hidden_size": s.hidden, "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
           "linear_conv_kernel_dim": s.conv, "linear_num_key_heads": s.lin_k_heads,
           "linear_num_value_heads": s.lin_v_heads, "vocab_size": s.vocab, "max_position_embeddings": s.ctx}
    return pl.TargetShape.from_config(cfg).with_tensor_bytes(tensors)


def planned_now(rec: dict) -> float:
    """GPU bytes the current planner gives the measured configuration (its recipe, -c, --n-cpu-moe)."""
    from ggufbridge.runtime import memory as pl
    from ggufbridge.runtime.recipes import load_recipe

    quant = QUANT_OF[rec["tag"].split("-")[1]]
    target, recipe = fullshape_target(quant), load_recipe(rec["recipe"])
    plan = pl.evaluate(target, recipe, ctx=rec["ctx"], ngl=rec["plan"]["n_gpu_layers"],
                       n_cpu_moe=rec["plan"]["n_cpu_moe"])
    total = next(p for p in plan.pools if p.kind == "gpu").total
    if recipe.memory["unified"]:  # the host's share of the one pool lives in host RAM on the H200
        ub, cells = recipe.server["ubatch"], plan.figures["kv_cells"]
        total -= target.input_bytes + ub * (2 * cells + 8 * target.n_embd)
    return total


QUANT_OF = {"hq3m": "hq3m", "q4km": "q4_k_m", "hq4": "hq4", "q6k": "q6_k", "q8_0": "q8_0", "bf16": "bf16"}


def recipes_table(recs: list[dict]) -> str:
    rows = ["| recipe | file (types) | file bytes | context | planned GPU when run | planned GPU, "
            "measured compute model (now) | measured peak (nvidia-smi) | server's own (self + unaccounted) | prompt "
            "tokens | prefill tok/s | decode tok/s |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    merged: dict[str, dict] = {}
    for r in recs:  # the long-context run of the same configuration adds rows
        key = r["tag"].removesuffix("-long")
        merged.setdefault(key, dict(r, rows=[]))["rows"] += r["rows"]
    for tag, r in merged.items():
        plan_gpu = next(p for p in r["plan"]["pools"] if p["name"].startswith("gpu"))["total"]
        if "unified" in r["plan"]["pools"][0]["name"]:  # the token embeddings stay in host RAM on the H200
            plan_gpu -= r["log"]["buffers_mib"]["model"]["CPU_Mapped"] * MIB
        peak = r["gpu_peak_mib"] - r["gpu_baseline_mib"][0]
        brk = r["log"]["breakdown_mib"].get("CUDA0", {})
        own = brk.get("self", 0) + brk.get("unaccounted", 0)
        recipe, quant = tag.split("-")[:2]
        ncm = r["plan"]["n_cpu_moe"]
        label = f"`{recipe}`" + (f" (--n-cpu-moe {ncm})" if ncm else "")
        now = planned_now(r)
        for i, row in enumerate(sorted(r["rows"], key=lambda x: x["prompt_tokens"])):
            head = (f"| {label} | {quant} | {r['file_bytes']:,} | {r['ctx']:,} | {plan_gpu / GIB:.2f} GiB "
                    f"({(plan_gpu / (peak * MIB) - 1) * 100:+.1f}%) | {now / GIB:.2f} GiB "
                    f"({(now / (peak * MIB) - 1) * 100:+.1f}%) | {peak / 1024:.2f} GiB | {own / 1024:.2f} GiB |"
                    if i == 0 else "| | | | | | | | |")
            rows.append(f"{head} {row['prompt_tokens']:,} | {row['prefill_tok_s']:,.0f} | {row['decode_tok_s']:.1f} |")
    return "\n".join(rows)


def spark_table(recs: list[dict]) -> str:
    rows = ["| file | file bytes | weight bytes per decoded token | H200 decode tok/s, 1k / 32k (measured) | "
            "Spark bound: 273 GB/s ÷ bytes per token (estimate) | H200 × 273/4800 (estimate) | KL mean, `ksafe` "
            "fixture (docs/compare.md) |", "|---|---:|---:|---:|---:|---:|---:|"]
    kl = {"hq4": "0.086", "q6k": "0.063", "q8_0": "0.025", "bf16": "≈ 0 (F16: 0.00057)"}
    for q in ("hq4", "q6k", "q8_0", "bf16"):
        r = next((x for x in recs if x["tag"] == f"spark-{q}"), None)
        if r is None:
            continue
        step = bytes_per_decode_step(QUANT_OF[q])
        d = {row["prompt_tokens"]: row["decode_tok_s"] for row in r["rows"]}
        rows.append(f"| {q} | {r['file_bytes']:,} | {step / 1e9:.2f} GB | {d[1024]:.1f} / {d[32768]:.1f} | "
                    f"{SPARK_BW / step:.0f} tok/s | {d[1024] * SPARK_BW / H200_BW:.1f} tok/s | {kl[q]} |")
    return "\n".join(rows)


def draft_summary(draft: list[dict]) -> tuple[float, list[dict]]:
    target = next(r for r in draft if r["n_max"] == 0)["rows"][0]["decode_tok_s"]
    out = []
    for r in draft:
        if not r["n_max"]:
            continue
        zero = next(x for x in r["rows"] if x["period"] == 1)
        round_ms = 1000 / zero["decode_tok_s"]  # acceptance 0: one token per round
        out.append({"n_max": r["n_max"], "round_ms": round_ms, "break_even": round_ms / (1000 / target) - 1,
                    "points": [(x["accepted_per_round"], x["decode_tok_s"] / target) for x in r["rows"]
                               if x["accepted_per_round"] is not None]})
    return target, out


def draft_table(draft: list[dict]) -> str:
    target, rows = draft_summary(draft)
    lines = [f"Target-only decode in the same run: **{target:.1f} tok/s** ({1000 / target:.2f} ms per token).", "",
             "| n_max | ms per round (nothing accepted) | break-even: accepted tokens per round | measured (accepted "
             "per round → speed-up over target-only) |", "|---:|---:|---:|---|"]
    for r in rows:
        pts = ", ".join(f"{a:.2f} → {s:.2f}×" for a, s in sorted(r["points"]))
        lines.append(f"| {r['n_max']} | {r['round_ms']:.1f} | {r['break_even']:.2f} | {pts} |")
    return "\n".join(lines)


def expected_speedup(rows: list[dict], target_ms: float, p: float) -> dict[int, float]:
    """Speed-up at per-token acceptance probability p (each drafted token accepted with p until the first
    rejection), from the measured round cost: (1 + E[accepted]) / (round ms / target ms)."""
    out = {}
    for r in rows:
        n = r["n_max"]
        acc = sum(p**k for k in range(1, n + 1))
        out[n] = (1 + acc) / (r["round_ms"] / target_ms)
    return out


def plot_draft(draft: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target, rows = draft_summary(draft)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in rows:
        pts = sorted(r["points"])
        a1.plot([x for x, _ in pts], [y for _, y in pts], "o-", label=f"n_max {r['n_max']}")
    ps = [0.5 + 0.01 * i for i in range(50)]
    for r in rows:
        a2.plot(ps, [expected_speedup([r], 1000 / target, p)[r["n_max"]] for p in ps], label=f"n_max {r['n_max']}")
    for ax, (x, y, title) in zip((a1, a2), (
            ("accepted draft tokens per round (oracle pair, acceptance set by the draft)",
             "drafted / target-only decode tok/s", "measured speed-up (H200, full shape)"),
            ("per-token acceptance probability p", "expected speed-up (measured round cost)",
             "break-even curve by n_max"))):
        ax.axhline(1.0, color="k", lw=1, ls="--")
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    res = ROOT / "benchmarks" / "results" / "recipes"
    ap.add_argument("--recipes", type=Path, default=res / "h200-b4abbb7c94b9.json", help="recipes_h200.sh's recipes")
    ap.add_argument("--draft", type=Path, default=res / "h200-b4abbb7c94b9-draft.json", help="its `draft` step")
    ap.add_argument("--plot", type=Path, default=ROOT / "docs" / "draft-breakeven-h200.png")
    a = ap.parse_args()
    recs = json.loads(a.recipes.read_text())
    draft = json.loads(a.draft.read_text())
    print(recipes_table(recs), "\n")
    print(spark_table(recs), "\n")
    print(draft_table(draft), "\n")
    target, rows = draft_summary(draft)
    for p in (0.7, 0.8, 0.9):
        e = expected_speedup(rows, 1000 / target, p)
        print(f"p={p}: " + ", ".join(f"n_max {n}: {v:.2f}x" for n, v in e.items()))
    plot_draft(draft, a.plot)
    print(f"\nplot: {a.plot}")


if __name__ == "__main__":
    main()

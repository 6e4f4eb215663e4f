#!/usr/bin/env python3
"""Table and plot for docs/benchmarks.md (issue 24) from docs/fattn-gqa-h200.json (H200, measured): decode and
prefill at context depth without (b0: the stock kernels) and with (b1) the GQA patch's tensor-core kernel, and the
flash-attention time per layer of both, for one token and for a 5-token draft-verification batch.

    python benchmarks/fattn_report.py [docs/fattn-gqa-h200.json] [-o docs/fattn-gqa-h200.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def depth_rows(final: dict) -> dict[str, list[dict]]:
    return {r["tag"]: r["rows"] for r in final["depth"]}


def markdown(final: dict) -> str:
    rows = depth_rows(final)
    lines = ["| K/V | build | " + " | ".join(f"{r['prompt_tokens']:,}" for r in rows["b0-q8_0"]) +
             " | 262k / 1k |", "|---|---|" + "---:|" * (len(rows["b0-q8_0"]) + 1)]
    for kv in ("q8_0", "q4_0"):
        for b, name in (("b0", "stock kernels"), ("b1", "GQA patch")):
            rr = rows[f"{b}-{kv}"]
            lines.append(f"| {kv} | {name} | " + " | ".join(f"{r['decode_tok_s']:.1f}" for r in rr) +
                         f" | {rr[-1]['decode_tok_s'] / rr[0]['decode_tok_s']:.0%} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="?", type=Path, default=Path("docs/fattn-gqa-h200.json"))
    ap.add_argument("-o", "--out", type=Path, default=Path("docs/fattn-gqa-h200.png"))
    a = ap.parse_args(argv)
    final = json.loads(a.json.read_text())["final"]
    rows = depth_rows(final)
    perf = final["perf_b0_vs_b1"]

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(15, 4.2))
    for kv, color in (("q8_0", "C0"), ("q4_0", "C1")):
        for disp, tokens, style in (("b0", 1, "x:"), ("b1", 1, "o-"), ("b0", 5, "+:"), ("b1", 5, "s--")):
            pts = sorted((p["kv"], p["us_per_run"]) for p in perf
                         if p["type_kv"] == kv and p["dispatch"] == disp and p["tokens"] == tokens)
            name = "stock" if disp == "b0" else "GQA patch"
            a1.plot(*zip(*pts), style, color=color, label=f"{kv}, {name}, {tokens} token{'s' * (tokens > 1)}")
    a1.set(xscale="log", yscale="log", xlabel="K/V rows", ylabel="us per call",
           title="flash attention per layer, GQA 8, head 256")
    for kv, color in (("q8_0", "C0"), ("q4_0", "C1")):
        for b, style in (("b0", "x:"), ("b1", "o-")):
            rr = rows[f"{b}-{kv}"]
            xs = [r["prompt_tokens"] for r in rr]
            lab = f"{kv}, {'stock kernels' if b == 'b0' else 'GQA patch'}"
            a2.plot(xs, [r["decode_tok_s"] for r in rr], style, color=color, label=lab)
            a3.plot(xs, [r["prefill_tok_s"] for r in rr], style, color=color, label=lab)
    a2.set(xscale="log", xlabel="context depth (prompt tokens)", ylabel="tok/s", title="decode (hq3m, H200)")
    a3.set(xscale="log", xlabel="context depth (prompt tokens)", ylabel="tok/s", title="prefill (unchanged path)")
    for ax in (a1, a2, a3):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(a.out, dpi=100)
    print(markdown(final))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

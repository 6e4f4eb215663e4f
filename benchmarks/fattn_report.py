#!/usr/bin/env python3
"""Tables and plot for docs/benchmarks.md (issue 24) from benchmarks/results/fattn/h200.json (H200, measured): decode at
context depth without (b0) and with (b1) the patches for it, drafted decode at depth, one decode step taken apart
(host time in llama_decode against the whole step) and the flash-attention time per layer of both builds.

    python -m benchmarks.fattn_report [benchmarks/results/fattn/h200.json] [-o docs/fattn-gqa-h200.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

NAMES = {"b0": "without", "b1": "patched"}


def depth_rows(final: dict) -> dict[str, list[dict]]:
    return {r["tag"]: r["rows"] for r in final["depth"] if r.get("rows")}


def _k(n: int) -> str:
    return f"{n / 1024:.0f}k" if n >= 1024 else str(n)


def depth_table(final: dict) -> str:
    rows = depth_rows(final)
    first = next(iter(rows.values()))
    lines = ["| K/V | build | " + " | ".join(f"{r['prompt_tokens']:,}" for r in first) +
             f" | {_k(first[-1]['prompt_tokens'])} / {_k(first[0]['prompt_tokens'])} |",
             "|---|---|" + "---:|" * (len(first) + 1)]
    for kv in ("q8_0", "q4_0", "f16"):
        for b in ("b0", "b1"):
            rr = rows.get(f"{b}-{kv}")
            if rr:
                lines.append(f"| {kv} | {NAMES[b]} | " + " | ".join(f"{r['decode_tok_s']:.1f}" for r in rr) +
                             f" | {rr[-1]['decode_tok_s'] / rr[0]['decode_tok_s']:.0%} |")
    return "\n".join(lines)


def drafted_table(final: dict) -> str:
    rows = depth_rows(final)
    lines = ["| build | " + " | ".join(f"{r['prompt_tokens']:,}" for r in next(iter(rows.values()))) + " |",
             "|---|" + "---:|" * len(next(iter(rows.values())))]
    for rec in final.get("drafted", []):
        b = rec["tag"].split("-")[1]
        target = rows.get(f"{b}-{rec['kv']}", [])
        cells = []
        for i, r in enumerate(rec["rows"]):
            acc = r.get("accepted_per_round")
            rel = f", {r['decode_tok_s'] / target[i]['decode_tok_s']:.2f}× target-only" if i < len(target) else ""
            cells.append(f"{r['decode_tok_s']:.1f}{rel}" + (f" ({acc:.1f}/round)" if acc else ""))
        lines.append(f"| drafted, {NAMES[b]}, {rec['kv']} K/V, n_max {rec['n_max']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def where_table(final: dict) -> str:
    pts = final.get("where", [])
    depths = sorted({p["depth"] for p in pts})
    lines = ["| build | " + " | ".join(f"{d:,}" for d in depths) + " |", "|---|" + "---:|" * len(depths)]
    for b in ("b0", "b1"):
        by = {p["depth"]: p for p in pts if p["tag"] == b}
        if by:
            cells = [f"{by[d]['host_ms']:.2f} / {by[d]['step_ms']:.2f}" if d in by else "" for d in depths]
            lines.append(f"| {NAMES[b]}: host in llama_decode / whole step, ms | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def perf_table(final: dict) -> str:
    perf = final.get("perf", [])
    kvs = sorted({p["kv"] for p in perf})
    lines = ["| K/V | tokens | build | " + " | ".join(f"{_k(k)} rows" for k in kvs) + " |",
             "|---|---:|---|" + "---:|" * len(kvs)]
    for t in ("q8_0", "q4_0"):
        for nb in sorted({p["tokens"] for p in perf}):
            for b in ("b0", "b1"):
                by = {p["kv"]: p.get(b) for p in perf if p["type_kv"] == t and p["tokens"] == nb}
                if any(v is not None for v in by.values()):
                    lines.append(f"| {t} | {nb} | {NAMES[b]} | " +
                                 " | ".join(f"{by[k]:.1f} µs" if by.get(k) is not None else "" for k in kvs) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="?", type=Path, default=Path("benchmarks/results/fattn/h200.json"))
    ap.add_argument("-o", "--out", type=Path, default=Path("docs/fattn-gqa-h200.png"))
    a = ap.parse_args(argv)
    final = json.loads(a.json.read_text())["final"]
    rows = depth_rows(final)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(15, 4.2))
    for kv, color in (("q8_0", "C0"), ("q4_0", "C1"), ("f16", "C2")):
        for b, style in (("b0", "x:"), ("b1", "o-")):
            rr = rows.get(f"{b}-{kv}")
            if rr:
                a1.plot([r["prompt_tokens"] for r in rr], [r["decode_tok_s"] for r in rr], style, color=color,
                        label=f"{kv}, {NAMES[b]}")
    for rec in final.get("drafted", []):
        b = rec["tag"].split("-")[1]
        a1.plot([r["prompt_tokens"] for r in rec["rows"]], [r["decode_tok_s"] for r in rec["rows"]],
                "s--" if b == "b1" else "+:", color="C3", label=f"drafted {rec['kv']}, {NAMES[b]}")
    a1.set(xscale="log", xlabel="context depth (prompt tokens)", ylabel="tok/s",
           title="decode at depth (hq3m, H200)")
    for b, style in (("b0", "x:"), ("b1", "o-")):
        pts = sorted((p["depth"], p["host_ms"], p["step_ms"]) for p in final.get("where", []) if p["tag"] == b)
        if pts:
            d, host, step = zip(*pts)
            a2.plot(d, step, style, color="C0", label=f"whole step, {NAMES[b]}")
            a2.plot(d, host, style, color="C1", label=f"host in llama_decode, {NAMES[b]}")
    a2.set(xscale="log", xlabel="context depth (tokens)", ylabel="ms per token",
           title="one decode step taken apart (q8_0 K/V)")
    for t, color in (("q8_0", "C0"), ("q4_0", "C1")):
        for nb, mark in ((1, "o"), (5, "s")):
            for b, style in (("b0", ":"), ("b1", "-")):
                pts = sorted((p["kv"], p[b]) for p in final.get("perf", [])
                             if p["type_kv"] == t and p["tokens"] == nb and p.get(b) is not None)
                if pts:
                    a3.plot(*zip(*pts), mark + style, color=color, label=f"{t}, {nb} tok, {NAMES[b]}")
    a3.set(xscale="log", yscale="log", xlabel="K/V rows", ylabel="µs per call",
           title="flash attention per layer, GQA 8, head 256")
    for ax in (a1, a2, a3):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(a.out, dpi=100)
    for title, table in (("decode at depth", depth_table), ("drafted", drafted_table),
                         ("one step taken apart", where_table), ("flash attention per layer", perf_table)):
        print(f"{title}:\n{table(final)}\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

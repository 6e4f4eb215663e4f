#!/usr/bin/env python3
"""Plot for docs/benchmarks.md (issue 24): flash-attention time per call at GQA 8 / head 256 against K/V depth on
the H200 (docs/fattn-gqa-h200.json, measured), and what it means for decode tok/s (estimates, labelled).

    python scripts/fattn_report.py [docs/fattn-gqa-h200.json] [-o docs/fattn-gqa-h200.png]

The decode estimate: the issue's measured q8_0 decode (unpatched, h200 flags as the rtx4090 recipe, hq3m) at 1k,
plus 10 attention layers × (the patched kernel's time at the depth − the old kernel's at 1k, ~9 us, taken equal to
the f16 MMA kernel's as the two decoded at the same speed at 1k); depths below 32k keep the old kernel.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# measured before the patch (issue 24, H200, hq3m, q8_0 K/V): prompt tokens -> decode tok/s
OLD_Q8_DECODE = {1024: 177.6, 32768: 148.1, 131072: 95.6, 262072: 66.2}
ATTN_LAYERS = 10
MIN_KV = 32768  # GGML_CUDA_FATTN_VEC_GQA_MIN_KV in patch 0007


def kernel_times(path: Path) -> dict[tuple[str, int, int], float]:
    d = json.loads(path.read_text())
    return {(r["type_kv"], r["kv"], r["tokens"]): r["us_per_run"] for r in d["perf"]}


def estimate_q8_decode(t: dict) -> dict[int, float]:
    """tok/s with patch 0007 (estimate): see the module docstring."""
    base_ms = 1000.0 / OLD_Q8_DECODE[1024]
    old_1k_us = t[("f16", 1024, 1)]
    out = {}
    for n, old in OLD_Q8_DECODE.items():
        kv = min((k for _, k, _ in t if k >= n), default=262144)  # the perf row at or above this depth
        if n < MIN_KV:
            out[n] = old
        else:
            out[n] = 1000.0 / (base_ms + ATTN_LAYERS * (t[("q8_0", kv, 1)] - old_1k_us) / 1000.0)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="?", type=Path, default=Path("docs/fattn-gqa-h200.json"))
    ap.add_argument("-o", "--out", type=Path, default=Path("docs/fattn-gqa-h200.png"))
    a = ap.parse_args(argv)
    t = kernel_times(a.json)
    est = estimate_q8_decode(t)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    kvs = sorted({k for _, k, _ in t})
    for ty, style in (("q8_0", "o-"), ("q4_0", "s-"), ("f16", "^--")):
        for nb, alpha in ((1, 1.0), (5, 0.45)):
            a1.plot(kvs, [t[(ty, k, nb)] for k in kvs], style, alpha=alpha,
                    label=f"{ty}, {nb} token{'s' if nb > 1 else ''}" + (" (GQA variant)" if ty != "f16" else " (MMA)"))
    old_us = {n: t[("f16", 1024, 1)] + (1000.0 / v - 1000.0 / OLD_Q8_DECODE[1024]) * 1000.0 / ATTN_LAYERS
              for n, v in OLD_Q8_DECODE.items()}
    a1.plot(list(old_us), list(old_us.values()), "x:", color="grey",
            label="q8_0, 1 token, old kernel (from decode times)")
    a1.set(xscale="log", yscale="log", xlabel="K/V rows (context depth)", ylabel="us per FLASH_ATTN_EXT call",
           title="one attention layer, H200 (test-backend-ops perf)")
    a1.legend(fontsize=7)
    a1.grid(True, alpha=0.3)
    xs = list(OLD_Q8_DECODE)
    a2.plot(xs, list(OLD_Q8_DECODE.values()), "o-", label="q8_0 K/V before (measured, issue 24)")
    a2.plot(xs, [est[n] for n in xs], "o--", label="q8_0 K/V with patch 0007 (estimate)")
    a2.axhline(0.8 * OLD_Q8_DECODE[1024], color="grey", ls=":", label="target: 80% of 1k")
    a2.set(xscale="log", xlabel="context depth (prompt tokens)", ylabel="decode tok/s",
           title="full model (hq3m), decode at depth")
    a2.legend(fontsize=7)
    a2.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.out, dpi=100)
    print("estimated q8_0 decode tok/s with the patch:", {n: round(v, 1) for n, v in est.items()})
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

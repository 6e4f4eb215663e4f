"""Reports of a `Comparison`: JSON, a Markdown table in the EXL3 model cards' shape, and PNG plots."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ggufbridge.compare.metrics import FIGURES
from ggufbridge.errors import OutputError
from ggufbridge.units import human_size

# column header -> summary key, in the cards' order
COLUMNS = {
    "KL mean": "kl_mean",
    "KL median": "kl_median",
    "KL p95": "kl_p95",
    "KL p99": "kl_p99",
    "KL max": "kl_max",
    "KL rev mean": "kl_rev_mean",
    "Top-1": "top1",
    "Top-5 overlap": "top5_overlap",
    "PPL ratio": "ppl_ratio",
}
PERCENT = {"top1", "top5_overlap"}
# how each backend counts its bits per weight; said under the table when backends are mixed
BPW_ACCOUNTING = {
    "gguf": "GGUF: 8 × tensor bytes / elements over the whole file (embeddings, norms and head included)",
    "exl3": "EXL3: exllamav3's own figure, over its quantised linear layers only (embeddings, stored at 16 bits, "
            "and the head excluded)",
}


def _backend(spec: str) -> str:
    return spec.partition(":")[0] if ":" in spec else "gguf"


def to_json(cmp) -> dict:
    """Overall figures of the first candidate at top level (plus per_kind, worst_row, without_worst), every
    candidate under "results", and the floor beside them."""
    results = []
    for r in cmp.results:
        results.append({"label": r.label, "candidate": r.spec, "bits_per_weight": r.bits_per_weight,
                        "file_bytes": r.file_bytes, "family": r.family, **r.summary})
    first = results[0]
    return {
        **{k: first[k] for k in (*FIGURES, "n_rows", "n_tokens")},
        "per_kind": first["per_kind"],
        "worst_row": first["worst_row"],
        "without_worst": first["without_worst"],
        "candidate": first["candidate"],
        "reference": cmp.reference,
        "eval": cmp.eval_source,
        "eval_sha256": cmp.eval_sha256,
        "reference_id": cmp.reference_id,
        "ctx": cmp.ctx,
        "floor": cmp.floor,
        "floor_note": cmp.floor_note,
        "results": results,
    }


PLOT_FORMATS = ("png", "svg", "pdf")


def check_outputs(inputs, json_path=None, md_path=None, plot_path=None, out=None, rows_out=None) -> None:
    """Before a run that may take hours: no output replaces an input (eval set, model files, merged results) or
    another output, and the plot has a format matplotlib writes."""
    from ggufbridge.compare.sources import KINDS
    from ggufbridge.ggufio.writer import refuse_input_as_output

    paths = []
    for spec in inputs:
        if spec is None:
            continue
        kind, sep, rest = str(spec).partition(":")
        paths.append(rest if sep and kind in KINDS else spec)  # hub specs name no local file: they match nothing
    outputs = [p for p in (json_path, md_path, plot_path, out, rows_out) if p is not None]
    for i, dst in enumerate(outputs):
        refuse_input_as_output(dst, *paths, *outputs[i + 1:])
    if plot_path is not None and Path(plot_path).suffix.lower().lstrip(".") not in PLOT_FORMATS:
        raise OutputError(f"--plot: expected a {', '.join('.' + f for f in PLOT_FORMATS[:-1])} or "
                          f".{PLOT_FORMATS[-1]} file, found {Path(plot_path).name}")


def write_json(cmp, path) -> None:
    Path(path).write_text(json.dumps(_finite(to_json(cmp)), indent=2, allow_nan=False) + "\n")


def _finite(o):
    """JSON has no inf/NaN: such figures (e.g. KL when a candidate gives a token probability 0) become null."""
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_finite(v) for v in o]
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return o


def _fmt(key: str, v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if key in PERCENT:
        return f"{100 * v:.2f}%"
    if key == "ppl_ratio":
        return f"{v:.4f}"
    return f"{v:.4g}" if v >= 1e-3 or v == 0 else f"{v:.3e}"


def _row(name: str, bpw, s: dict, size: int | None | bool = False) -> str:
    """One table line; `size` (bytes, or None for unknown) adds the size column of the main table."""
    bits = f"{bpw:.2f}" if bpw is not None else "–"
    extra = [] if size is False else [human_size(size) if size else "–"]
    return "| " + " | ".join([name, bits, *extra, *(_fmt(k, s.get(k)) for k in COLUMNS.values())]) + " |"


def _header(first: str, size: bool = False) -> list[str]:
    cols = [first, "bpw", *(["size"] if size else []), *COLUMNS]
    return ["| " + " | ".join(cols) + " |", "|" + "|".join(["---"] + ["---:"] * (len(cols) - 1)) + "|"]


def to_markdown(cmp) -> str:
    lines = [
        f"Reference: `{cmp.reference}` · eval: `{cmp.eval_source}` · {cmp.n_rows} rows × ≤{cmp.ctx} tokens = "
        f"{cmp.n_tokens} tokens",
        "",
        *_header("Model", size=True),
    ]
    for r in cmp.results:
        lines.append(_row(r.label, r.bits_per_weight, r.summary, r.file_bytes))
    if cmp.floor is not None:
        lines.append(_row("BF16 vs FP32 (numerics floor)", 16.0, cmp.floor, None))
    lines += ["", f"Numerics floor: {cmp.floor_note}."]
    backends = sorted({_backend(r.spec) for r in cmp.results})
    if len(backends) > 1:
        lines += ["", "bpw is each backend's own accounting, so compare across backends by size: " + "; ".join(
            BPW_ACCOUNTING.get(b, f"{b.upper()}: its source's figure") for b in backends) + "."]
    lines += [f"Note: {n}." for n in cmp.notes]
    for r in cmp.results:
        s = r.summary
        if len(s.get("per_kind") or {}) > 1:
            lines += ["", f"Per kind, {r.label}:", "", *_header("Kind")]
            lines += [_row(f"{k} ({v['n_rows']} rows)", None, v) for k, v in s["per_kind"].items()]
        w = s.get("worst_row")
        if w is None:
            continue
        lines += ["", f"Worst row of {r.label}: row {w['row']} ({w['kind']}), KL mean {_fmt('kl_mean', w['kl_mean'])}, "
                      f"max {_fmt('kl_max', w['kl_max'])}, top-1 {_fmt('top1', w['top1'])}, {w['n_tokens']} tokens."]
        if s["without_worst"] is not None:
            lines += ["", *_header("Without the worst row"), _row(r.label, r.bits_per_weight, s["without_worst"])]
    return "\n".join(lines) + "\n"


def write_markdown(cmp, path) -> None:
    Path(path).write_text(to_markdown(cmp), encoding="utf-8")


def write_plot(cmp, path) -> None:
    """KL distribution per kind (one panel per candidate); with several candidates, KL mean against size: file
    bytes when every candidate has them (bits per weight are counted differently by different backends), else bpw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import numpy as np

    several = len(cmp.results) > 1
    with_kl = [r for r in cmp.results if r.kl_by_kind]  # merged results carry no per-position KL
    ncols = max(1, min(3, len(with_kl)))
    nrows = -(-len(with_kl) // ncols)
    # with several candidates the KL-against-size panel comes first, across the whole width
    top = 1 if several else 0
    fig = plt.figure(figsize=(5.5 * max(ncols, 2 if several else 1), 4 * nrows + 5 * top))
    grid = fig.add_gridspec(nrows + top, ncols, height_ratios=[1.25] * top + [1] * nrows)
    panels = [fig.add_subplot(grid[top + i // ncols, i % ncols]) for i in range(len(with_kl))]
    for ax, r in zip(panels, with_kl):
        for kind, kl in r.kl_by_kind.items():
            kl = np.maximum(kl, 1e-12)  # log axis
            bins = np.logspace(np.log10(kl.min()), np.log10(kl.max()) + 1e-9, 40)
            ax.hist(kl, bins=bins, histtype="step", label=f"{kind} ({kl.size})")
        if cmp.floor is not None:
            ax.axvline(cmp.floor["kl_mean"], color="grey", ls="--", label="BF16 floor (mean)")
        ax.set_xscale("log")
        ax.set_xlabel("KL(reference → candidate) per token (< 1e-12 shown at 1e-12)")
        ax.set_ylabel("tokens")
        ax.set_title(r.label, fontsize=9)
        ax.legend(fontsize=7)
    if several:
        ax = fig.add_subplot(grid[0, :])
        families: dict[str, list] = {}  # one line per backend: GGUF files, EXL3 packs, ...
        by_size = all(r.file_bytes for r in cmp.results)
        for r in cmp.results:
            x = r.file_bytes / 2**20 if by_size else r.bits_per_weight
            if x and r.summary.get("kl_mean") is not None:
                name = f"{r.label} ({r.bits_per_weight:.2f} bpw)" if by_size and r.bits_per_weight else r.label
                families.setdefault(r.family or _backend(r.spec).upper(), []).append((x, r.summary["kl_mean"], name))
        for fam, pts in sorted(families.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=fam)
            for x, y, name in pts:
                ax.annotate(name, (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
        if cmp.floor is not None:
            ax.axhline(cmp.floor["kl_mean"], color="grey", ls="--", label="BF16 vs FP32 floor")
        ax.legend(fontsize=8)
        ax.set_yscale("log")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("file size, MiB" if by_size else "bits per weight")
        ax.set_ylabel("KL mean")
        ax.set_title("KL against size", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

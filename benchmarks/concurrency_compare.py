"""Two or more `ggufbridge bench --concurrency` runs side by side: the before/after table and plot of
docs/benchmarks.md (issue 28), from the runs' concurrency.json files.

    .venv/bin/python -m benchmarks.concurrency_compare series=OFF/concurrency.json candidates=ON/concurrency.json \
        -o docs/concurrency-h200-candidates.png

Prints a markdown table: per run and number of streams, the aggregate decode tok/s (the sum of the per-stream
rates, the issue's measure) and the aggregate while all streams decode (free of the other streams' prefill), each
with its ratio to the same run's one stream, and TTFT p50; the plot has both aggregates against streams, one
colour per run. Target-only rows (mode "target") only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ggufbridge.runtime.concurrency import ratio_text as ratio


class BadRun(Exception):
    pass


def load(spec: str) -> tuple[str, list[dict]]:
    label, sep, path = spec.partition("=")
    if not sep or not label or not path:
        raise BadRun(f"expected LABEL=PATH, got {spec!r}")
    try:
        rows = [r for r in json.loads(Path(path).read_text())["rows"] if r.get("mode") == "target"]
        for r in rows:
            r["streams"], r["aggregate_decode_tok_s"], r["ttft_p50_s"]  # noqa: B018 (the fields the table reads)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise BadRun(f"{path}: not a bench --concurrency result ({type(e).__name__}: {e})") from None
    return label, rows


def table(runs: list[tuple[str, list[dict]]]) -> str:
    lines = ["| run | streams | aggregate decode tok/s | vs one stream | aggregate while all decode tok/s | "
             "vs one stream | TTFT p50 s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for label, rows in runs:
        one = next((r for r in rows if r["streams"] == 1), {})
        for r in rows:
            steady = r.get("steady_decode_tok_s")
            lines.append(f"| {label} | {r['streams']} | {r['aggregate_decode_tok_s']:.1f} | "
                         f"{ratio(r['aggregate_decode_tok_s'], one.get('aggregate_decode_tok_s'))} | "
                         f"{f'{steady:.1f}' if steady else 'n/a'} | {ratio(steady, one.get('steady_decode_tok_s'))} | "
                         f"{r['ttft_p50_s']:.3f} |")
    return "\n".join(lines) + "\n"


def plot(runs: list[tuple[str, list[dict]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for i, (label, rows) in enumerate(runs):
        xs = [r["streams"] for r in rows]
        colour = f"C{i}"
        ax.plot(xs, [r["aggregate_decode_tok_s"] for r in rows], "o-", color=colour, label=f"{label}: sum of rates")
        ax.plot(xs, [r.get("steady_decode_tok_s") or float("nan") for r in rows], "s:", color=colour,
                label=f"{label}: while all decode")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("aggregate decode tok/s")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="LABEL=path/to/concurrency.json, in the order to show them")
    ap.add_argument("-o", "--plot", type=Path, help="write the plot here (PNG)")
    args = ap.parse_args(argv)
    try:
        runs = [load(s) for s in args.runs]
    except BadRun as e:
        print(f"concurrency_compare: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(table(runs))
    if args.plot:
        plot(runs, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

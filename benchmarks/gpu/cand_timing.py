"""The decode step's timings of the `cand-timing` step (concurrency_h200.sh) side by side: ms per step at each number
of sequences for each configuration, and the aggregate tok/s of N sequences against one sequence of the same
configuration. Usage: python3 -m benchmarks.gpu.cand_timing DIR (DIR holds decode-timing-<config>.json)."""

import json
import sys
from pathlib import Path

CONFIGS = ("off", "on", "moe-only", "shaped-only", "cols-only", "series")


def main(folder: str) -> int:
    print("# ms per decode step (llama-batched-bench, 1k-token prompts, 64 steps); Nx: aggregate tok/s against 1")
    for tag in CONFIGS:
        try:
            rows = json.loads((Path(folder) / f"decode-timing-{tag}.json").read_text())["timing"]
        except (OSError, ValueError, KeyError):
            print(f"{tag:11s} (no result)")
            continue
        one = next((r for r in rows if r.get("pl") == 1), None)
        cells = []
        for r in rows:
            ratio = f" {r['speed_tg'] / one['speed_tg']:.2f}x" if one else ""
            cells.append(f"{r['pl']}: {r['ms_per_step']:6.2f} ms{ratio}")
        print(f"{tag:11s} " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python3 -m benchmarks.gpu.cand_timing DIR (holding decode-timing-<config>.json)", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))

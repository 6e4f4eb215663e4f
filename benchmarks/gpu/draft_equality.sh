#!/usr/bin/env bash
# Device job `benchmarks/device.sh draft-equality`: an oracle pair and a random pair of tiny target + DSpark draft
# (draft_equality_prep.py), then greedy output with and without the draft on each (draft_equality.py), on the
# patched runtime device.sh built.
set -uo pipefail
python3 -m benchmarks.gpu.draft_equality_prep "$WORK/draft-equality" || exit 1
timeout 120 python3 -m benchmarks.gpu.draft_equality "$RUNTIME_BIN" "$WORK/draft-equality" 2>&1 | tee "$OUT/check.txt"

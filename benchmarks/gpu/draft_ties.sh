#!/usr/bin/env bash
# Device job `benchmarks/device.sh draft-ties`: the full-size random target + DSpark draft
# (benchmarks/make_fullsize_gguf.py), then draft_ties.py on them, on the patched runtime device.sh built.
set -uo pipefail
T0=$SECONDS
FS=$WORK/fullsize-pair
[ -f "$FS/manifest.json" ] || python3 -m benchmarks.make_fullsize_gguf "$FS" --tokenizer "$DEVICE_DIR/tok" > "$OUT/gen.log" 2>&1 \
  || { tail -20 "$OUT/gen.log"; exit 1; }
echo "generated in $((SECONDS - T0)) s"
timeout 240 python3 -m benchmarks.gpu.draft_ties "$RUNTIME_BIN" "$FS"

#!/usr/bin/env bash
# Device job `benchmarks/device.sh vision [test|bench]...` (issue 13), on the patched runtime device.sh built with
# CUDA exactly as users build it: the served-vision `gpu` tests, then image prefill at the real shapes.
#   (default: test bench)
set -uo pipefail
for s in ${@:-test bench}; do case $s in
test)
  python3 -m ggufbridge doctor 2>&1 | head -6
  python3 -m pytest -p no:cacheprovider -q -m gpu tests/test_served_vision.py 2>&1 | tee "$OUT/pytest-vision.log" | tail -15 ;;
bench)
  M=$WORK/fullsize; mkdir -p "$M"
  [ -f "$M/manifest.json" ] || python3 -m benchmarks.make_fullsize_gguf "$M" --tokenizer "$DEVICE_DIR/tok" --no-draft || exit 1
  ls "$M"/mmproj-* >/dev/null 2>&1 || python3 -m benchmarks.make_fullsize_mmproj "$M" --downsample 4x || exit 1
  python3 -m benchmarks.bench_image_prefill "$M" --recipe h200 --size 900x700 --json "$OUT/bench-image-prefill-h200.json" ;;
*) echo "vision: unknown step $s (test, bench)" >&2; exit 2 ;;
esac; done

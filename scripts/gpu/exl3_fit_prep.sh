#!/usr/bin/env bash
# Local side of the one-run EXL3-against-optimised-GGUF comparison (docs/quant.md, "Beating EXL3 at equal bytes"):
# exl3_prep.sh (checkpoint, reference dump, rows, wheels) + pytest_gpu_prep.sh (llama-cpp-python, the pinned CPU
# libraries) + what the fit needs there: llama-quantize (stripped), the F16 GGUF the mixes are cut from and the
# calibration text, all under gpu_exl3/device and .dev/gpu3. Then, on the device, with carry .whl, .dev/gpu3 and
# gpu_exl3/device: bash scripts/gpu/exl3_fit.sh
set -euo pipefail
D=${1:-gpu_exl3}
bash scripts/gpu/exl3_prep.sh "$D"
bash scripts/gpu/pytest_gpu_prep.sh
B=${GGUFBRIDGE_CACHE:-$HOME/.cache/ggufbridge}/llama.cpp-0.3.36-cpu/build/bin
strip --strip-unneeded -o .dev/gpu3/bin/llama-quantize "$B/llama-quantize"
cp "$D"/f16/*-F16.gguf "$D/device/f16.gguf"
# calibration: text that is not in the eval rows (those are ggufbridge/compare/*.py and four docs)
cat ggufbridge/quant/quantize.py ggufbridge/runtime/plan.py README.md | head -c 60000 > "$D/device/calibration.txt"
du -ch "$D/device" .dev/gpu3 .whl | tail -1

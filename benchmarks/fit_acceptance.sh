#!/usr/bin/env bash
# Issue 44's acceptance run (docs/quant.md, "Acceptance: the 369M checkpoint at Q4_K_M's size"): `quantize
# --fit-bytes` at the size of llama.cpp's Q4_K_M of the 369M checkpoint, under a 4.5-minute budget, then the KL of
# both files against the F16 file on text the calibration did not see.
#
#   benchmarks/fit_acceptance.sh W        (W: a work folder; the checkpoint, its F16 GGUF and Q4_K_M are kept there)
#
# Calibration: ggufbridge/quant/quantize.py + ggufbridge/runtime/memory.py + README.md, written once into W (a later
# run keeps the first run's text); eval: the first 6,000 characters of docs/vision.md as of commit 4f42e3c.
set -euo pipefail
cd "$(dirname "$0")/.."
W=$(realpath -m "${1:?usage: benchmarks/fit_acceptance.sh WORK}")
mkdir -p "$W"
PY=${PYTHON:-.venv/bin/python}
SRC=$($PY -c "from pathlib import Path; from benchmarks.bench_fit import make; print(make('bench-369m', Path('$W')))")
[ -f "$W/cal.txt" ] || cat ggufbridge/quant/quantize.py ggufbridge/runtime/memory.py README.md > "$W/cal.txt"
[ -f "$W/eval.txt" ] || git show 4f42e3c:docs/vision.md | head -c 6000 > "$W/eval.txt"
[ -f "$W/q4.gguf" ] || $PY -m ggufbridge quantize "$SRC" -o "$W/q4.gguf" --quant Q4_K_M --threads 2
SIZE=$(stat -c %s "$W/q4.gguf")
rm -rf "$W/w" "$W/fit.gguf"
uptime
/usr/bin/time -f "FIT WALL %e s CPU %U+%S" $PY -m ggufbridge quantize "$SRC" -o "$W/fit.gguf" --fit-bytes "$SIZE" \
  --ctx 0 --calibration "$W/cal.txt" --work "$W/w" --fit-budget-time 4.5m --threads 2 2>&1 | tee "$W/fit.log"
uptime
[ -f "$W/ref.safetensors" ] || $PY -m ggufbridge dump-logits -m gguf:"$SRC" --text "$W/eval.txt" --ctx 256 \
  -o "$W/ref.safetensors"
for f in q4 fit; do
  $PY -m ggufbridge compare -r "logits:$W/ref.safetensors" "$W/$f.gguf" --ctx 256 --text "$W/eval.txt" \
    --json "$W/kl-$f.json" | tail -3
done

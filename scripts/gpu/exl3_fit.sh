#!/usr/bin/env bash
# Device command (carry .whl, .dev/gpu3, gpu_exl3/device; see exl3_fit_prep.sh): in one run, EXL3 packs at each
# width (exl3_vs_gguf.sh), then for each pack's byte size the KL-guided GGUF mix (`quantize --fit-bytes` logic,
# scripts/bench_fit.py, llama.cpp on the host CPU) and one table of all of them against the same hf dump on the
# same rows, with the plot.
#   bash scripts/gpu/exl3_fit.sh [DIR] [BITS...]          (defaults: gpu_exl3/device, 3.0 4.0 5.0 6.0)
set -uo pipefail
D=${1:-gpu_exl3/device}; shift || true
BITS=("${@:-3.0 4.0 5.0 6.0}"); BITS=(${BITS[*]})
OUT=${OUT:-/tmp/exl3-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl .dev/gpu3/whl/*.whl || exit 1
B=/tmp/llama-bin; mkdir -p $B && cp .dev/gpu3/bin/* $B/ && for f in $B/*.so.0; do ln -sf $f ${f%.0}; done
mkdir -p /tmp/py && cp -r .dev/gpu3/llama_cpp /tmp/py/ && ln -sfn $B /tmp/py/llama_cpp/lib
export LLAMA_CPP_BIN=$B PYTHONPATH=/tmp/site:/tmp/py:$PWD PYTHONUNBUFFERED=1
bash scripts/gpu/exl3_vs_gguf.sh "$D" "${BITS[@]}" || exit 1
budgets=()
for b in "${BITS[@]}"; do budgets+=("$(cat /tmp/exl3-$b/*.safetensors | wc -c)"); done
echo "EXL3 pack sizes: ${budgets[*]}"
t=$SECONDS
python3 scripts/bench_fit.py --src "$D/f16.gguf" --calibration "$D/calibration.txt" --work /tmp/fit \
  --reference "logits:$D/hf.safetensors" --eval "$D/rows.jsonl" --budgets "${budgets[@]}" --threads 16 \
  --out "$OUT/fit.json" || exit 1
echo "fit (sensitivity + ${#budgets[@]} mixes + compare): $((SECONDS - t)) s"
python3 -m ggufbridge compare /tmp/fit/fit-*.gguf --reference "logits:$D/hf.safetensors" --eval "$D/rows.jsonl" \
  --ctx 256 --no-progress --merge "$OUT/exl3.json" --json "$OUT/all.json" --markdown "$OUT/all.md" \
  --plot "$OUT/all.png" || exit 1

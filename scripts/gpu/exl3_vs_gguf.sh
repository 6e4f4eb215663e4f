#!/usr/bin/env bash
# Device command for docs/compare.md's H200 run (carry .whl and DIR = gpu_exl3/device from exl3_prep.sh): install
# the carried wheels, build exllamav3's CUDA extension (or reuse DIR/ext/exllamav3_ext.so.gz from an earlier run),
# quantise DIR/ckpt to EXL3 at each bit width, compare the packs with the hf reference dump and dump their logits.
#   bash scripts/gpu/exl3_vs_gguf.sh [DIR] [BITS...]      (defaults: gpu_exl3/device, 4.0 6.0)
set -uo pipefail
. "$(dirname "$0")/common.sh"
D=${1:-gpu_exl3/device}; shift || true
BITS=("${@:-4.0 6.0}"); BITS=(${BITS[*]})
OUT=${OUT:-/tmp/exl3-out}; mkdir -p "$OUT"
install_wheels .whl/*.whl || exit 1
gpu_env
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH TORCH_EXTENSIONS_DIR=/tmp/torch_ext TORCH_CUDA_ARCH_LIST=9.0 \
  MAX_JOBS=16
use_carried_exllamav3_ext "$D/ext/exllamav3_ext.so.gz"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
t=$SECONDS
python3 -c "import exllamav3, exllamav3.ext; print('exllamav3', exllamav3.__version__ if hasattr(exllamav3, '__version__') else '?')" \
  2>&1 | tail -20 || exit 1
echo "exllamav3 import (extension build if not carried): $((SECONDS - t)) s"
so=$(find /tmp/torch_ext -name 'exllamav3_ext*.so' 2>/dev/null | head -1)
# bring a fresh build back, stripped and compressed (~15 MB, under the 16 MiB per-file limit of $OUT)
[ -n "$so" ] && strip --strip-unneeded -o /tmp/ext.so "$so" && gzip -9c /tmp/ext.so > "$OUT/exllamav3_ext.so.gz"
packs=()
for b in "${BITS[@]}"; do
  t=$SECONDS
  python3 -m ggufbridge.compare.exl3 quantize "$D/ckpt" "/tmp/exl3-$b" "$b" > "/tmp/quant-$b.log" 2>&1 \
    || { tail -40 "/tmp/quant-$b.log"; cp "/tmp/quant-$b.log" "$OUT/"; exit 1; }
  echo "quantise $b bpw: $((SECONDS - t)) s"; grep -iE "bpw|bits per weight" "/tmp/quant-$b.log" | tail -3
  packs+=("exl3:/tmp/exl3-$b")
done
python3 -m ggufbridge compare "${packs[@]}" --reference "logits:$D/hf.safetensors" --eval "$D/rows.jsonl" --ctx 256 \
  --no-progress --json "$OUT/exl3.json" --markdown "$OUT/exl3.md" || exit 1
for b in "${BITS[@]}"; do
  python3 -m ggufbridge dump-logits --model "exl3:/tmp/exl3-$b" --eval "$D/rows.jsonl" --ctx 256 --top-k 64 \
    --samples 32 --no-progress -o "$OUT/exl3-$b.safetensors" || exit 1
done

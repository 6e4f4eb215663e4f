#!/usr/bin/env bash
# Device job `benchmarks/device.sh exl3 [BITS...]` for docs/compare.md's H200 run (pack with `device.sh pack
# --exl3`: D = $DEVICE_DIR/exl3, from exl3_prep.sh): build exllamav3's CUDA extension (or reuse D/ext/
# exllamav3_ext.so.gz from an earlier run), quantise D/ckpt to EXL3 at each bit width, compare the packs with the hf
# reference dump and dump their logits.   (default BITS: 4.0 6.0)
set -uo pipefail
. "$(dirname "$0")/common.sh"
D=$DEVICE_DIR/exl3
[ -d "$D/ckpt" ] || { echo "exl3: no $D: pack with benchmarks/device.sh pack --exl3" >&2; exit 2; }
BITS=("${@:-4.0 6.0}"); BITS=(${BITS[*]})
export PATH=$DEVICE_DIR/site/bin:$PATH TORCH_EXTENSIONS_DIR=$WORK/torch_ext TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=$JOBS
use_carried_exllamav3_ext "$D/ext/exllamav3_ext.so.gz"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
t=$SECONDS
python3 -c "import exllamav3, exllamav3.ext; print('exllamav3', exllamav3.__version__ if hasattr(exllamav3, '__version__') else '?')" \
  2>&1 | tail -20 || exit 1
echo "exllamav3 import (extension build if not carried): $((SECONDS - t)) s"
so=$(find "$WORK/torch_ext" -name 'exllamav3_ext*.so' 2>/dev/null | head -1)
# bring a fresh build back, stripped and compressed (~15 MB, under the 16 MiB per-file limit of $OUT)
[ -n "$so" ] && strip --strip-unneeded -o "$WORK/ext.so" "$so" && gzip -9c "$WORK/ext.so" > "$OUT/exllamav3_ext.so.gz"
packs=()
for b in "${BITS[@]}"; do
  t=$SECONDS
  python3 -m ggufbridge.compare.exl3 quantize "$D/ckpt" "$WORK/exl3-$b" "$b" > "$WORK/quant-$b.log" 2>&1 \
    || { tail -40 "$WORK/quant-$b.log"; cp "$WORK/quant-$b.log" "$OUT/"; exit 1; }
  echo "quantise $b bpw: $((SECONDS - t)) s"; grep -iE "bpw|bits per weight" "$WORK/quant-$b.log" | tail -3
  packs+=("exl3:$WORK/exl3-$b")
done
python3 -m ggufbridge compare "${packs[@]}" --reference "logits:$D/hf.safetensors" --eval "$D/rows.jsonl" --ctx 256 \
  --no-progress --json "$OUT/exl3.json" --markdown "$OUT/exl3.md" || exit 1
for b in "${BITS[@]}"; do
  python3 -m ggufbridge dump-logits --model "exl3:$WORK/exl3-$b" --eval "$D/rows.jsonl" --ctx 256 --top-k 64 \
    --samples 32 --no-progress -o "$OUT/exl3-$b.safetensors" || exit 1
done

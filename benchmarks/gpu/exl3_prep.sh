#!/usr/bin/env bash
# Local side of docs/compare.md's EXL3-against-GGUF run (CPU, ~1 minute once the runtime is built): the synthetic
# checkpoint, its GGUFs, the eval rows, the transformers reference dump (+ BF16 floor), and DIR/device/ (what
# travels: the text tower alone, the dump, the rows). `benchmarks/device.sh pack --exl3` runs it and packs
# DIR/device/ with the wheels the device lacks; then `benchmarks/device.sh exl3 BITS...` on the device, and the
# merge command in docs/compare.md here.
#   bash benchmarks/gpu/exl3_prep.sh [DIR]            (default build/exl3, ignored by git)
set -euo pipefail
D=${1:-build/exl3}; P=.venv/bin/python; G=.venv/bin/ggufbridge
mkdir -p "$D"
# every matrix row a multiple of 256 (EXL3 tiles and K-quants), small vocabulary, bf16 (29 MB)
[ -d "$D/ckpt" ] || $P -c "from ggufbridge.testkit.checkpoint import make_minicpmv47 as m; m('$D/ckpt', 'ksafe', vocab='small', dtype='bfloat16')"
$G convert "$D/ckpt" -o "$D/f16" --outtype f16 --no-mmproj --no-progress
$G convert "$D/ckpt" -o "$D/q8" --outtype q8_0 --no-mmproj --no-progress
cp "$D"/q8/*.gguf "$D/ksafe-Q8_0.gguf"
for t in Q3_K_M Q4_K_M Q5_K_M Q6_K; do $G quantize "$D"/f16/*-F16.gguf -o "$D/ksafe-$t.gguf" --quant $t > /dev/null; done
for r in hq3 hq4; do $G quantize "$D"/f16/*-F16.gguf -o "$D/ksafe-$r.gguf" --mix $r > /dev/null; done
# the published run's 48 rows of 256 token ids (small vocabulary): 24 of ggufbridge/compare/*.py (kind "code"),
# 24 of docs/compare.md, quant.md, vision.md and README.md (kind "prose") as they were on 2026-11-29, frozen as ids
ROWS=${ROWS:-benchmarks/results/compare-exl3/rows.jsonl}
# the reference dump travels to the device: K=64 + 32 samples keeps it at ~10 MB
$G dump-logits --model "hf:$D/ckpt" --eval "$ROWS" --ctx 256 --top-k 64 --samples 32 \
  -o "$D/hf.safetensors" --rows-out "$D/rows.jsonl" --no-progress
# what travels: the text tower only (exllamav3 reads nothing else; 17 of the 29 MB), so that the dump, the wheels
# and a carried extension (DIR/device/ext/exllamav3_ext.so.gz from an earlier run) fit the 64 MiB together
mkdir -p "$D/device/ckpt" && cp "$D/hf.safetensors" "$D/rows.jsonl" "$D/device/"
$P - "$D" <<'PY'
import shutil, sys
from pathlib import Path
from safetensors import safe_open
from safetensors.torch import save_file
src, dst = Path(sys.argv[1]) / "ckpt", Path(sys.argv[1]) / "device/ckpt"
for f in src.iterdir():
    if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
        shutil.copy(f, dst / f.name)
text = {}
for f in sorted(src.glob("*.safetensors")):
    with safe_open(f, "pt") as s:
        text.update({k: s.get_tensor(k) for k in s.keys()
                     if k.startswith("model.language_model.") or k == "lm_head.weight"})
save_file(text, dst / "model.safetensors", metadata={"format": "pt"})
PY
du -sh "$D/device"

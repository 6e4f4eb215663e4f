#!/usr/bin/env bash
# The tests llama.cpp ships for what the patch series touches, built from the patched tree that build_runtime.sh
# made (run it first) and run here: libmtmd's C API and internals (chunk serialization, a canvas chunk's round trip
# among it: patch 0007 extends test-mtmd-c-api), the batch allocator,
# every architecture's tiny-model test (the KV cache and M-RoPE models: qwen2vl, qwen3vl, qwen35 among 133), the
# recurrent-state rollback test over every recurrent and hybrid architecture's dummy model (the rollback patch's
# "moved cell" case among them), and the samplers' tests (test-sampling; the backend samplers on the demo's
# synthetic model, test-backend-sampler).
#   scripts/patch_upstream_tests.sh          the core part's tree (what a CPU build applies; ~15 min on 2 cores:
#                                            it compiles the library again with the tests)
#   scripts/patch_upstream_tests.sh --perf   the tree with the performance part too (build_runtime.sh --perf
#                                            first): adds the KV cells' per-cell sequence summary (test-kv-cells,
#                                            the mask patch's own) and qwen35moe's in-place state read in the
#                                            rollback test
# With --cuda (a machine with nvcc and a GPU; --cuda-arch N, default 90): the CUDA build's tree (core and
# performance part), through test-backend-ops: every FLASH_ATTN_EXT case with a quantized K/V cache on CUDA0
# against the CPU backend, with the dispatch as shipped and with the GQA variant allowed for batches up to 16 tokens.
#   scripts/patch_upstream_tests.sh --cuda [--cuda-arch 90]
set -euo pipefail
CUDA=0; ARCH=90; SEL=(--variant cpu)
while [ $# -gt 0 ]; do
  case $1 in
    --cuda) CUDA=1; SEL=(--variant cuda) ;;
    --cuda-arch) ARCH=$2; shift ;;
    --perf) SEL=(--variant cpu --perf) ;;
    *) echo "usage: $0 [--perf | --cuda [--cuda-arch N]]" >&2; exit 2 ;;
  esac
  shift
done
C="${GGUFBRIDGE_CACHE:-$HOME/.cache/ggufbridge}"
# the tree of the series as it is now (its hash from patches.py, as build_runtime.sh asks it), not any older one
PHASH=$(python3 "$(dirname "$0")/../ggufbridge/runtime/patches.py" hash "${SEL[@]}")
. "$(dirname "$0")/../ggufbridge/runtime/llama_cpp.pin"  # the pin's one home
TREE="$C/src/llama.cpp-$LLAMA_CPP_PYTHON_VERSION-p$PHASH"
[ -d "$TREE" ] || { echo "no patched tree $TREE: run scripts/build_runtime.sh ${SEL[*]/--variant cpu/} first" >&2; exit 2; }
echo "patched tree: $TREE"
B="$C/tests-build-p$PHASH"
if [ $CUDA = 1 ]; then
  B="$B-cuda$ARCH"
  cmake -S "$TREE" -B "$B" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >"$B.configure.log" 2>&1
  cmake --build "$B" -j "${JOBS:-$(nproc)}" --target test-backend-ops >"$B.build.log" 2>&1
  # the quantized-K/V cases, with the GQA patch's kernel (16: every batch it serves) and without it (0: the stock
  # kernels on the same cases)
  for max_batch in 16 0; do
    log="$B/test-backend-ops-fa-maxbatch$max_batch.log"
    if GGML_CUDA_FA_MMA_Q_MAX_BATCH=$max_batch "$B/bin/test-backend-ops" -o FLASH_ATTN_EXT -b CUDA0 \
        -p "type_K=(q8_0|q4_0)" >"$log" 2>&1; then
      echo "ok    test-backend-ops FLASH_ATTN_EXT, quantized K/V, GGML_CUDA_FA_MMA_Q_MAX_BATCH=$max_batch ($(grep -o '[0-9]*/[0-9]* tests passed' "$log" | head -1))"
    else
      echo "FAIL  test-backend-ops FLASH_ATTN_EXT (log: $log)"; exit 1
    fi
  done
  exit 0
fi
TESTS=(test-mtmd-c-api test-mtmd-impl test-batch-alloc test-llama-archs test-recurrent-state-rollback test-sampling)
[ -f "$TREE/tests/test-kv-cells.cpp" ] && TESTS+=(test-kv-cells)  # the mask patch's own (performance part)
cmake -S "$TREE" -B "$B" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_MTMD=ON >"$B.configure.log" 2>&1
# test-backend-sampler is built with them and run case by case below
cmake --build "$B" -j "${JOBS:-$(nproc)}" --target "${TESTS[@]}" test-backend-sampler >"$B.build.log" 2>&1
# test-llama-archs writes the dummy models that the rollback test reads (as llama.cpp's ctest fixture does)
mkdir -p "$B/test-models"  # the tool writes into it and does not make it
"$B/bin/test-llama-archs" -o "$B/test-models" >"$B/generate-models.log" 2>&1 \
  || { echo "FAIL  test-llama-archs -o (log: $B/generate-models.log)"; exit 1; }
# test-backend-sampler (the greedy-chain patch's backend greedy among its cases) needs a model with a real-sized
# vocabulary (it decodes token ids in the thousands) and skips without one: the demo's synthetic MiniCPM-V 4.7
[ -d "$B/demo" ] || "$(dirname "$0")/../.venv/bin/python" -m ggufbridge demo --work-dir "$B/demo" >"$B/demo.log" 2>&1 \
  || { echo "FAIL  ggufbridge demo (log: $B/demo.log)"; exit 1; }
DEMO_GGUF=$(find "$B/demo/parity/f32" -name "*.gguf" | sort | head -1)  # the random model (model/ is the oracle pair)
[ -n "$DEMO_GGUF" ] || { echo "FAIL  no demo GGUF under $B/demo"; exit 1; }
for t in "${TESTS[@]}"; do
  args=(); [ "$t" = test-recurrent-state-rollback ] && args=(--models "$B/test-models")
  if "$B/bin/$t" "${args[@]}" >"$B/$t.log" 2>&1; then echo "ok    $t"; else echo "FAIL  $t (log: $B/$t.log)"; exit 1; fi
done
# test-backend-sampler case by case (the cases as its source lists them), all but logit_bias: that one biases the
# token "World" by +10 after "Hello" and expects dist to draw it, which a trained model's logits allow and the
# demo's random ones do not (there the most likely token is 14.4 above "World"; the bias and dist samplers are not
# touched by the series)
n=0
for c in $(grep -o '{ "[a-z_]*", *test_backend_' "$TREE/tests/test-backend-sampler.cpp" | cut -d'"' -f2); do
  [ "$c" = logit_bias ] && continue
  log="$B/test-backend-sampler-$c.log"
  if "$B/bin/test-backend-sampler" --model "$DEMO_GGUF" --device cpu --test "$c" >"$log" 2>&1 \
      && ! grep -q "skipping test" "$log"; then n=$((n + 1))
  else echo "FAIL  test-backend-sampler --test $c (log: $log)"; exit 1; fi
done
echo "ok    test-backend-sampler ($n cases on the demo model, logit_bias left out)"

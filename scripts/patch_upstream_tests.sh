#!/usr/bin/env bash
# The tests llama.cpp ships for what the patch series touches, built from the patched tree that build_runtime.sh
# made (run it first) and run here: libmtmd's C API and internals (chunk serialization), the batch allocator, and
# every architecture's tiny-model test (the KV cache and M-RoPE models: qwen2vl, qwen3vl, qwen35 among 133).
#   scripts/patch_upstream_tests.sh        (~15 min on 2 cores: it compiles the library again with the tests)
set -euo pipefail
C="${GGUFBRIDGE_CACHE:-$HOME/.cache/ggufbridge}"
# the tree of the series in patches/llama.cpp now (its hash as build_runtime.sh computes it), not any older one
PHASH=$(cd "$(dirname "$0")/.." && .venv/bin/python -c "from ggufbridge.runtime.patches import series_hash; print(series_hash())")
. "$(dirname "$0")/../ggufbridge/runtime/llama_cpp.pin"  # the pin's one home
TREE="$C/src/llama.cpp-$LLAMA_CPP_PYTHON_VERSION-p$PHASH"
[ -d "$TREE" ] || { echo "no patched tree $TREE: run scripts/build_runtime.sh first" >&2; exit 2; }
echo "patched tree: $TREE"
B="$C/tests-build-p$PHASH"
TESTS=(test-mtmd-c-api test-mtmd-impl test-batch-alloc test-llama-archs)
cmake -S "$TREE" -B "$B" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_MTMD=ON >"$B.configure.log" 2>&1
cmake --build "$B" -j "${JOBS:-$(nproc)}" --target "${TESTS[@]}" >"$B.build.log" 2>&1
for t in "${TESTS[@]}"; do
  if "$B/bin/$t" >"$B/$t.log" 2>&1; then echo "ok    $t"; else echo "FAIL  $t (log: $B/$t.log)"; exit 1; fi
done

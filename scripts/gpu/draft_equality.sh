#!/usr/bin/env bash
# Device command (carry .dev/gpu/llama-src.tgz and .dev/gpu2): build llama-server for sm_90, then compare
# greedy output with and without the DSpark draft on the pairs that draft_equality_prep.py wrote to .dev/gpu2.
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
S=/root/src; mkdir -p $S && tar -xzf .dev/gpu/llama-src.tgz -C $S
L=$S/llama_cpp_python-0.3.36/vendor/llama.cpp
T0=$(date +%s)
cmake -S $L -B /root/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > $OUT/configure.log 2>&1 || { tail -20 $OUT/configure.log; exit 1; }
cmake --build /root/b -j 16 --target llama-server > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - T0 )) s"
timeout 120 python3 scripts/gpu/draft_equality.py /root/b/bin 2>&1 | tee $OUT/check.txt

#!/usr/bin/env bash
# Device command (carry .dev/gpu/llama-src.tgz, .dev/gpu/tok and .whl): build llama-server for sm_90 while the
# full-size random target + DSpark draft are generated, then run draft_ties.py on them.
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/gguf-*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
S=/root/src; mkdir -p $S && tar -xzf .dev/gpu/llama-src.tgz -C $S
L=$S/llama_cpp_python-0.3.36/vendor/llama.cpp
T0=$(date +%s)
[ -f .dev/gpu/tok/tokenizer.json ] || gunzip -k .dev/gpu/tok/tokenizer.json.gz
( python3 scripts/make_fullsize_gguf.py /root/fs --tokenizer .dev/gpu/tok > $OUT/gen.log 2>&1; echo "gen rc=$? $(( $(date +%s) - T0 )) s" >> $OUT/gen.log ) &
GEN=$!
cmake -S $L -B /root/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 > $OUT/configure.log 2>&1 || { tail -20 $OUT/configure.log; exit 1; }
cmake --build /root/b -j 16 --target llama-server > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
echo "build $(( $(date +%s) - T0 )) s"
wait $GEN; tail -3 $OUT/gen.log
cd scripts/gpu && timeout 240 python3 draft_ties.py /root/b/bin /root/fs

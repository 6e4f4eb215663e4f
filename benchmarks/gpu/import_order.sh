#!/usr/bin/env bash
# Whether the import order of numpy and the CUDA-built bindings decides a GPU model load's fate (docs/quant.md,
# "Known problem"): a plain CLI process that had imported numpy first died with SIGSEGV at its first GPU load on
# the H200 image, scripts that imported llama_cpp first did not. This builds the pinned tree unpatched (the
# question is not about the series) with the least the bindings need (libllama and ggml-cuda, flash-attention
# kernels off: ~2-3 min on 16 cores), writes a 2-layer random-weight model, and loads it on the GPU twice in each
# order. Run by benchmarks/device.sh import-order (after setup_device --no-runtime; SDIST: the pinned sources).
#
#   benchmarks/device.sh import-order
set -uo pipefail
. "$(dirname "$0")/common.sh"
sdist=${1:?the llama-cpp-python sources} out=${2:?the results folder}
build=$WORK/import-order-build
python3 -c "from pathlib import Path; from benchmarks.bench_fit_scaling import build; print(build(Path('$WORK/fit'), 2, 8, 'small'))" \
  > "$out/import-order-model.log" 2>&1 &
gen=$!
cmake -S "$sdist/vendor/llama.cpp" -B "$build" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$(gpu_arch)" \
  -DGGML_CUDA_FA=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > "$out/import-order-configure.log" 2>&1 \
  || { tail -20 "$out/import-order-configure.log"; exit 1; }
t0=$SECONDS
cmake --build "$build" -j "$JOBS" --target llama > "$out/import-order-build.log" 2>&1 \
  || { tail -20 "$out/import-order-build.log"; exit 1; }
echo "build: $((SECONDS - t0)) s"
wait $gen || { tail -5 "$out/import-order-model.log"; exit 1; }
model=$(tail -1 "$out/import-order-model.log")
py=$WORK/import-order-py
rm -rf "$py" && mkdir -p "$py" && cp -r "$sdist/llama_cpp" "$py/" && ln -sfn "$build/bin" "$py/llama_cpp/lib"
export PYTHONPATH=$py${PYTHONPATH:+:$PYTHONPATH} LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for order in "import numpy; import llama_cpp" "import llama_cpp; import numpy" \
             "import numpy, gguf, yaml, click, tqdm; import llama_cpp"; do
  for run in 1 2; do
    timeout 120 python3 -c "$order
from llama_cpp import Llama
Llama('$model', n_gpu_layers=-1, n_ctx=256, verbose=False)
print('loaded')" > "$out/import-order.log" 2>&1
    echo "[$order] run $run: exit $? ($(tail -1 "$out/import-order.log"))"
  done
done | tee "$out/import-order.txt"

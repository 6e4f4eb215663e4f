#!/usr/bin/env bash
# The flash-attention kernel of the GQA patch (ggml-cuda/fattn-mma-q.cuh) alone, on the device: correctness against
# an f32 reference on the dequantized cache and kernel times at 1k-256k K/V rows beside a device copy of the same
# bytes (the read floor). TREE is a llama.cpp tree with the series applied.
#   bash benchmarks/gpu/fattn_kernel/run.sh TREE [OUT [skip]]   (needs nvcc and one GPU of compute capability >= 8.0;
#   skip: only the section of series patch 0022, the tile skip)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); TREE=$1; O=${2:-/tmp}
B=$(mktemp -d)
cp "$TREE/ggml/src/ggml-cuda/fattn-mma-q.cuh" "$HERE/shim/common.cuh" "$B/"
. "$HERE/../common.sh"
nvcc -O3 -std=c++17 -arch=sm_$(gpu_arch) -I"$B" -I"$TREE/ggml/include" "$HERE/harness.cu" -o "$B/harness"
"$B/harness" "${@:3}" | tee "$O/fattn-kernel.txt"

#!/usr/bin/env bash
# The multi-token MoE mat-vecs of the series' patch 0017 (ggufbridge/runtime/native/llama.cpp-perf/0017-*: the shaped generic kernel and
# the Q3_K/Q4_K/Q8_0 row-per-warp kernels) alone, on the device (issue 28): each checked against a plain reference
# and timed at the model's expert shapes, 2/4/8 tokens.
# Also the dense multi-column Q6_K/Q4_K mat-vec of candidate 0026. Needs nvcc and one NVIDIA GPU, no runtime build: TREE is
# the pinned llama.cpp tree, pristine (the two patches are applied to a copy of its ggml/ here) or already
# carrying them.
#   bash benchmarks/gpu/moe_kernel/run.sh TREE [OUT]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); TREE=$1; O=${2:-/tmp}
. "$HERE/../common.sh"
B=$(mktemp -d)
# the kernels' patches (series 0017: MoE shaped and row-per-warp; not-applied 0027: dense multi-column)
G=$(patched_ggml "$B" "$TREE" mmvq-cols.cuh "$HERE"/../../../ggufbridge/runtime/native/llama.cpp-perf/0017-*.patch \
    "$HERE"/../../../patches/not-applied/0027-*.patch)
# the stock kernel beside the shapes: mul_mat_vec_q_moe and the constexpr helpers it uses, cut from the tree's own
# mmvq.cu (everything before its first host function, get_mmvq_mmid_max_batch_for_device, the kernel; not its
# mmvq.cuh include, which has no include guard); without them the table has the shapes only
STOCK=()
awk '/^int get_mmvq_mmid_max_batch\(/ { p1 = 1 }
     !p1 { if ($0 !~ /^#include "mmvq.cuh"/) print; next }
     /^\/\/ Device constexpr: returns the max batch size/ { p2 = 1 }
     p2 { print; if ($0 ~ /^}/) p2 = 0; next }
     /^\/\/ Dedicated MoE multi-token kernel\./ { p3 = 1 }
     p3 && /^template<ggml_type type>$/ { p3 = 0 }
     p3 { print }' "$G/src/ggml-cuda/mmvq.cu" > "$B/stock-moe.cuh"
grep -q "static __global__ void mul_mat_vec_q_moe(" "$B/stock-moe.cuh" && STOCK=(-DMOE_STOCK -I"$B")
nvcc -O3 -std=c++17 -arch=sm_$(gpu_arch) -Xptxas -v "${STOCK[@]}" -I"$G/src/ggml-cuda" -I"$G/include" -I"$G/src" \
  "$HERE/harness.cu" -o "$B/harness" > "$O/moe-kernel-build.log" 2>&1 || { tail -20 "$O/moe-kernel-build.log"; exit 1; }
# registers and spills of each shape (ptxas), then the table
awk '/Compiling entry function/ { n = $0; sub(/.*function ./, "", n); sub(/. for .*/, "", n) }
     /bytes spill/ { sp = $0; sub(/.*info *: */, "", sp) }
     /Used [0-9]+ registers/ { if (n ~ /moe_shaped|mul_mat_vec_q_moeIL|moe_rowwarp|mul_mat_vec_q_colsIL/) { r = $0; sub(/.*Used /, "", r); sub(/, used.*/, "", r); print n, r, sp }
                               n = ""; sp = "" }' "$O/moe-kernel-build.log" \
  | sed -E -e 's/_Z[0-9]+mul_mat_vec_q_moe_shapedIL9ggml_type([0-9]+)ELi([0-9]+)ELi([0-9]+)ELi([0-9]+)ELi([0-9]+)ELb([01])ELb([01])EEv13mmvq_moe_args/ggml_type \1 rpb=\2 ksplit=\3 minb=\4 unroll=\5 pref=\6 fused=\7:/' \
      -e 's/_Z17mul_mat_vec_q_moeIL9ggml_type([0-9]+)ELi2ELb([01])E[^ ]*/ggml_type \1 stock fused=\2:/' \
      -e 's/_Z[0-9]+mul_mat_vec_q3k_moe_rowwarpILi([0-9]+)ELi([0-9]+)ELi([0-9]+)ELb([01])ELi([0-9]+)ELb([01])EEv13mmvq_moe_args/ggml_type 11 q3k-rowwarp rpw=\1 warps=\2 passes=\3 fused=\4 rpi=\5 staged=\6:/' \
      -e 's/_Z[0-9]+mul_mat_vec_q4k_moe_rowwarpILi([0-9]+)ELi([0-9]+)ELi([0-9]+)ELi([0-9]+)ELb([01])ELi([0-9]+)EEv13mmvq_moe_args/ggml_type 12 q4k-rowwarp rpw=\1 warps=\2 bpp=\3 passes=\4 fused=\5 rpi=\6:/' \
      -e 's/_Z[0-9]+mul_mat_vec_q8_0_moe_rowwarpILi([0-9]+)ELi([0-9]+)ELi([0-9]+)ELb([01])ELi([0-9]+)EEv13mmvq_moe_args/ggml_type 8 q8_0-rowwarp rpw=\1 warps=\2 lpr=\3 fused=\4 rpi=\5:/' \
      -e 's/_Z[0-9]+mul_mat_vec_q_colsIL9ggml_type([0-9]+)ELi([0-9]+)ELi([0-9]+)ELi([0-9]+)EE[^ ]*/ggml_type \1 cols ncols=\2 warps=\3 rpw=\4:/' \
  | sort | sed 's/^/# ptxas: /' > "$O/moe-kernel-regs.txt"
timeout 300 "$B/harness" | tee "$O/moe-kernel.txt"

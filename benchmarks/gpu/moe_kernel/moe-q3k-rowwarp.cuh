#pragma once
// A Q3_K multi-token MoE mat-vec that decodes each weight once with a fraction of the pinned kernel's work per
// weight (issue 28): on the H200 the best of 14 shapes of the generic kernel reads Q3_K gate/up at ~1.1 TB/s for 8
// tokens (docs/moe-kernel-h200.txt), bound by vec_dot_q3_K_q8_1's work, not by bandwidth: per 16 weights a thread
// loads the 2-bit quants and the high-bit mask as 16-bit halves (a block_q3_K is 110 bytes, so only 2-byte aligned),
// 8 scale bytes, and 4 ints and 4 scales of the token's activations, for 4 dp4a.
//
// Here one warp computes whole rows of one (token, expert slot) pair, one row after another (RPW of them), with the
// token's activations held in registers for all of its rows:
//   - a row of K = 2048 is 8 super-blocks; lane = 4*b + q covers super-block b (and b + 8, b + 16, ... for longer
//     rows) and, of its 256 weights, the quarter q = 2*n + h: half n (weights 128n..128n+127), l in [16h, 16h+16)
//     of each of the half's four 32-weight groups j -- 64 weights, which is exactly 4 q8_1 ints of 4 activation
//     blocks (8*b + 4*n + j, ints 4h..4h+3) and 4 of the 16 sub-block scales (8n + 2j + h);
//   - the weights' bytes come as aligned 32-bit loads funnel-shifted into place (a block starts 0 or 2 bytes past a
//     4-byte boundary): 5 ints of quants, 5 of the high-bit mask, 4 of scales and the half d, 15 loads for 64
//     weights against ~76 for the pinned kernel;
//   - a weight is (q & 3) | hbit << 2 minus 4: the minus 4 is taken once per group from the activations' byte sum
//     (a dp4a with 0x01010101, computed once per warp), so each 4 weights cost a shift, two ands, an or and a dp4a.
// Output layout, fusion (gate, biases, GLU) and arguments as mul_mat_vec_q_moe / mmvq-moe-shaped.cuh. Rows of K a
// multiple of 8 super-blocks (2048) only: the caller falls back otherwise.
#include "mmvq-moe-shaped.cuh"

// 4 bytes of a 2-byte-aligned address from aligned 32-bit words (lo at the aligned address, hi the next word)
static __device__ __forceinline__ int q3k_funnel(const int lo, const int hi, const int shift_bytes) {
    return __funnelshift_r(lo, hi, 8*shift_bytes);
}

// 4 consecutive ints starting at byte p (2-byte aligned) through 5 aligned loads
static __device__ __forceinline__ void q3k_load4(const uint8_t * p, int v[4]) {
    const int sh = int(reinterpret_cast<uintptr_t>(p) & 3);
    const int * a = reinterpret_cast<const int *>(p - sh);
    int w[5];
#pragma unroll
    for (int i = 0; i < 5; ++i) {
        w[i] = a[i];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[i] = q3k_funnel(w[i], w[i + 1], sh);
    }
}

// the lane's part of one row: sum over its 4 groups of d8[j] * scale_j * sum(q * u)
template <int P>
static __device__ __forceinline__ float q3k_rowwarp_dot(
        const block_q3_K * row, const int (&u)[P][4][4], const int (&su)[P][4], const float (&d8)[P][4],
        const int b0, const int n, const int h) {
    float acc = 0.0f;
#pragma unroll
    for (int p = 0; p < P; ++p) {
        const block_q3_K * blk = row + b0 + 8*p;
        const uint8_t * base = reinterpret_cast<const uint8_t *>(blk);
        int qs[4], hm[4];
        q3k_load4(base + offsetof(block_q3_K, qs) + 32*n + 16*h, qs);
        q3k_load4(base + offsetof(block_q3_K, hmask) + 16*h, hm);
        // scales: 12 bytes at 96 (3 ints; 4 aligned loads when the block is 2 bytes off)
        int sc[3];
        {
            const uint8_t * ps = base + offsetof(block_q3_K, scales);
            const int sh = int(reinterpret_cast<uintptr_t>(ps) & 3);
            const int * a = reinterpret_cast<const int *>(ps - sh);
            const int w0 = a[0], w1 = a[1], w2 = a[2];
            const int w3 = sh ? a[3] : 0;  // a[3] ends at byte 110 when sh == 2: inside the block
            sc[0] = q3k_funnel(w0, w1, sh);
            sc[1] = q3k_funnel(w1, w2, sh);
            sc[2] = q3k_funnel(w2, w3, sh);
        }
        const float d = __half2float(blk->d);
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int sumi = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int vl = (qs[i] >> (2*j)) & 0x03030303;
                const int vh = ((hm[i] >> (4*n + j)) & 0x01010101) << 2;
                sumi = ggml_cuda_dp4a(vl | vh, u[p][j][i], sumi);
            }
            sumi -= 4*su[p][j];
            // sub-block scale 8n + 2j + h: low nibble of byte 2j + h (shifted by 4n), high 2 bits of byte
            // 8 + (2j + h) % 4 (shifted by 2 * (2n + j/2))
            const int kl = 2*j + h;
            const int lo = (sc[kl >> 2] >> (8*(kl & 3) + 4*n)) & 0xF;
            const int kh = 8 + (kl & 3);
            const int hi = (sc[kh >> 2] >> (8*(kh & 3) + 2*(2*n + (j >> 1)))) & 3;
            sum += d8[p][j] * float(sumi * ((lo | (hi << 4)) - 32));
        }
        acc += d*sum;
    }
    return acc;
}

// grid (ceil(nrows / (RPW*NW)), n_expert_used, tokens), block (32, NW); P = K / 2048
template <int RPW, int NW, int P, bool has_fusion>
__launch_bounds__(NW*WARP_SIZE, 1)
static __global__ void mul_mat_vec_q3k_moe_rowwarp(const mmvq_moe_args a) {
    const int lane = threadIdx.x;
    const int b0 = lane >> 2, n = (lane >> 1) & 1, h = lane & 1;
    const uint32_t token = blockIdx.z, channel_dst = blockIdx.y;
    const uint32_t row0 = (blockIdx.x*NW + threadIdx.y)*RPW;

    ggml_cuda_pdl_sync();
    const uint32_t channel_x = a.ids[channel_dst + token*a.ids_stride];
    const uint32_t channel_y = fastmodulo(channel_dst, a.nchannels_y);
    const block_q8_1 * y = a.y + channel_y*a.stride_channel_y + token*a.stride_col_y;

    // the lane's activations, once for all of its rows: 4 groups x 4 ints, their byte sums, their scales
    int   u[P][4][4];
    int   su[P][4];
    float d8[P][4];
#pragma unroll
    for (int p = 0; p < P; ++p) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const block_q8_1 * yb = y + 8*(b0 + 8*p) + 4*n + j;
            su[p][j] = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                u[p][j][i] = get_int_b4(yb->qs, 4*h + i);
                su[p][j] = ggml_cuda_dp4a(0x01010101, u[p][j][i], su[p][j]);
            }
            d8[p][j] = __low2float(yb->ds);
        }
    }

    const block_q3_K * x    = (const block_q3_K *) a.x;
    const block_q3_K * gate = has_fusion ? (const block_q3_K *) a.fusion.gate : nullptr;
    for (int r = 0; r < RPW; ++r) {
        const uint32_t row = row0 + r;
        if (row >= a.nrows_x) {
            break;  // the same for the whole warp
        }
        const size_t xrow = size_t(channel_x)*a.stride_channel_x + size_t(row)*a.stride_row_x;
        float v = q3k_rowwarp_dot<P>(x + xrow, u, su, d8, b0, n, h);
        float g = 0.0f;
        if constexpr (has_fusion) {
            if (gate) {
                g = q3k_rowwarp_dot<P>(gate + xrow, u, su, d8, b0, n, h);
            }
        }
        v = warp_reduce_sum<WARP_SIZE>(v);
        if constexpr (has_fusion) {
            g = warp_reduce_sum<WARP_SIZE>(g);
        }
        if (lane == 0) {
            if constexpr (has_fusion) {
                const uint32_t bias_idx = channel_x*a.stride_channel_dst + row;
                if (a.fusion.x_bias) {
                    v += ((const float *) a.fusion.x_bias)[bias_idx];
                }
                if (gate) {
                    if (a.fusion.gate_bias) {
                        g += ((const float *) a.fusion.gate_bias)[bias_idx];
                    }
                    switch (a.fusion.glu_op) {
                        case GGML_GLU_OP_SWIGLU:       v *= ggml_cuda_op_silu_single(g); break;
                        case GGML_GLU_OP_GEGLU:        v *= ggml_cuda_op_gelu_single(g); break;
                        case GGML_GLU_OP_SWIGLU_OAI:   v = ggml_cuda_op_swiglu_oai_single(g, v); break;
                        case GGML_GLU_OP_SWIGLU_CLAMP: v = ggml_cuda_op_swiglu_clamp_single(g, v, a.fusion.glu_limit); break;
                        default:                       v *= g; break;
                    }
                }
            }
            a.dst[channel_dst*a.stride_channel_dst + token*a.stride_col_dst + row] = v;
        }
    }
    ggml_cuda_pdl_lc();
}

template <int RPW, int NW>
static dim3 q3k_rowwarp_grid(const uint32_t nrows_x, const uint32_t nchannels_dst, const uint32_t ncols_dst) {
    return dim3((nrows_x + RPW*NW - 1)/(RPW*NW), nchannels_dst, ncols_dst);
}

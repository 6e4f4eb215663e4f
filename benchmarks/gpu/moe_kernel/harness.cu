// The multi-token MoE mat-vecs of the series patch
// ggufbridge/runtime/native/llama.cpp-perf/0017-ggml-cuda-hopper-moe-shaped-mat-vec.patch alone on one GPU: the shaped generic
// kernel (ggml-cuda/mmvq-moe-shaped.cuh, every shape in VARIANTS) and the Q3_K/Q4_K/Q8_0 row-per-warp kernels
// (ggml-cuda/mmvq-moe-rowwarp.cuh, several shapes each) against a plain reference that sums upstream's vec_dot over
// every quant index of every block. That checks the shaped kernel's indexing (rows, tokens, experts, K split) and
// the row-per-warp kernels' own arithmetic as well; upstream's vec_dot itself is checked by
// test-backend-ops. Then kernel times over the expert shapes of Qwen3.5-35B-A3B / MiniCPM-V 4.7 (256 experts,
// 8 used; gate/up fused 2 x 512 x 2048, down 2048 x 512) at 2, 4 and 8 tokens with uniform random routing (what
// random weights route like). Built and run by run.sh next to this file. Output: one line per (type, shape,
// tokens, variant): microseconds, the routed experts' distinct bytes over that time, the max relative error.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstddef>
#include <cmath>
#include <vector>
#include <random>
#include <algorithm>
#include <string>
#include <utility>
#include "mmvq.cuh"
#include "mmvq-moe-shaped.cuh"
#include "mmvq-moe-rowwarp.cuh"
#include "mmvq-cols.cuh"
#ifdef MOE_STOCK
#include "stock-moe.cuh"
#endif

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

static constexpr int N_EXPERTS = 256;
static constexpr int N_USED    = 8;

template <ggml_type type> struct htype;
template <> struct htype<GGML_TYPE_Q3_K> { using B = block_q3_K; static constexpr const char * name = "q3_K"; };
template <> struct htype<GGML_TYPE_Q4_K> { using B = block_q4_K; static constexpr const char * name = "q4_K"; };
template <> struct htype<GGML_TYPE_Q5_K> { using B = block_q5_K; static constexpr const char * name = "q5_K"; };
template <> struct htype<GGML_TYPE_Q6_K> { using B = block_q6_K; static constexpr const char * name = "q6_K"; };
template <> struct htype<GGML_TYPE_Q8_0> { using B = block_q8_0; static constexpr const char * name = "q8_0"; };

// random quants, small finite super-block scales (random bytes there could be inf/nan halves)
template <ggml_type type> static void fill_blocks(std::vector<uint8_t> & v, size_t nblocks, std::mt19937 & rng) {
    using B = typename htype<type>::B;
    v.resize(nblocks*sizeof(B));
    for (size_t i = 0; i + 4 <= v.size(); i += 4) { const uint32_t r = rng(); memcpy(&v[i], &r, 4); }
    for (size_t i = v.size() & ~size_t(3); i < v.size(); ++i) v[i] = uint8_t(rng());
    std::uniform_real_distribution<float> u(0.002f, 0.02f);
    for (size_t i = 0; i < nblocks; ++i) {
        uint8_t * b = v.data() + i*sizeof(B);
        const half h0 = __float2half(u(rng)), h1 = __float2half(u(rng));
        if (type == GGML_TYPE_Q3_K) memcpy(b + offsetof(block_q3_K, d), &h0, 2);
        if (type == GGML_TYPE_Q6_K) memcpy(b + offsetof(block_q6_K, d), &h0, 2);
        if (type == GGML_TYPE_Q8_0) memcpy(b, &h0, 2);
        if (type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K) { memcpy(b, &h0, 2); memcpy(b + 2, &h1, 2); }
    }
}

// q8_1 as quantize_q8_1 writes it for MMVQ: per 32 values d = amax/127, the value sum beside it
static void quantize_q8_1(const float * x, block_q8_1 * y, int k) {
    for (int ib = 0; ib < k/QK8_1; ++ib) {
        float amax = 0.0f, sum = 0.0f;
        for (int j = 0; j < QK8_1; ++j) { amax = fmaxf(amax, fabsf(x[ib*QK8_1 + j])); sum += x[ib*QK8_1 + j]; }
        const float d = amax/127.0f;
        for (int j = 0; j < QK8_1; ++j) y[ib].qs[j] = int8_t(d == 0.0f ? 0 : roundf(x[ib*QK8_1 + j]/d));
        y[ib].ds = make_half2(__float2half(d), __float2half(sum));
    }
}

// one thread per (row, expert slot, token): the whole dot product, every block, every quant index, in order
template <ggml_type type, bool fused>
__global__ void reference(const mmvq_moe_args a, float * out) {
    constexpr int qk = ggml_cuda_type_traits<type>::qk, qi = ggml_cuda_type_traits<type>::qi;
    constexpr int vdr = mmvq_moe_vec_dot<type>::vdr;
    const uint32_t row = blockIdx.x*blockDim.x + threadIdx.x, slot = blockIdx.y, token = blockIdx.z;
    if (row >= a.nrows_x) return;
    const uint32_t ex = a.ids[slot + token*a.ids_stride];
    const uint32_t cy = slot % a.nchannels_y.z;  // .z: the divisor itself (init_fastdiv_values)
    const block_q8_1 * y = a.y + cy*a.stride_channel_y + token*a.stride_col_y;
    const int xrow = ex*a.stride_channel_x + row*a.stride_row_x;
    float s = 0.0f, g = 0.0f;
    for (int kbx = 0; kbx < int(a.ncols_x/qk); ++kbx) {
        for (int iqs = 0; iqs < qi; iqs += vdr) {
            s += mmvq_moe_vec_dot<type>::dot(a.x, &y[kbx*(qk/QK8_1)], xrow + kbx, iqs);
            if (fused) g += mmvq_moe_vec_dot<type>::dot(a.fusion.gate, &y[kbx*(qk/QK8_1)], xrow + kbx, iqs);
        }
    }
    if (fused) s *= g/(1.0f + expf(-g));  // SWIGLU
    out[slot*a.stride_channel_dst + token*a.stride_col_dst + row] = s;
}

// one kernel: its output against the reference (max absolute error, inf for a non-finite output), then reps
// launches timed as one CUDA graph (no gaps from the host: run.sh may share the machine with a build); microseconds
// a launch
template <typename L>
static std::pair<double, float> time_and_check(L && launcher, cudaStream_t s, float * dout, const std::vector<float> & ref,
                                               const int reps) {
    const size_t nout = ref.size();
    std::vector<float> got(nout);
    CK(cudaMemset(dout, 0xff, nout*4));
    launcher(s);
    CK(cudaGetLastError()); CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(got.data(), dout, nout*4, cudaMemcpyDeviceToHost));
    float err = 0.0f;
    for (size_t i = 0; i < nout; ++i) err = fmaxf(err, std::isfinite(got[i]) ? fabsf(got[i] - ref[i]) : INFINITY);
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int w = 0; w < reps; ++w) launcher(s);
    CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, s)); CK(cudaStreamSynchronize(s));
    CK(cudaEventRecord(e0, s)); CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s)); CK(cudaEventSynchronize(e1));
    CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
    float ms = 0.0f; CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
    return {1000.0*ms/reps, err};
}

struct variant { int rpb, ksplit, minb, unroll; bool pref; };
// V0 is the pinned tree's kernel's shape (rows 2, one warp per pair, launch bounds (8 warps, 1), no unroll); the
// candidate patch compiles V8, V7 and V5 as its GGML_CUDA_MOE_SHAPED=1, 2 and 3
#define VARIANTS(X) \
    X(2, 1, 1, 1, false) X(1, 1, 1, 1, false) X(4, 1, 1, 1, false) X(8, 1, 1, 1, false) \
    X(2, 1, 2, 1, false) X(2, 1, 4, 1, false) X(4, 1, 2, 1, false) X(2, 1, 1, 4, false) \
    X(4, 1, 2, 4, false) X(2, 2, 1, 1, false) X(2, 1, 1, 1, true)  X(4, 2, 2, 2, true)  \
    X(1, 1, 2, 4, false) X(4, 1, 1, 4, false)

struct problem {
    std::string shape;
    int nrows, k, ntok;
    bool fused;
};

template <ggml_type type, bool fused, int RPB, int KSPLIT, int MINB, int UNROLL, bool PREF>
static void launch(const mmvq_moe_args & a, cudaStream_t s) {
    const auto dims = mmvq_moe_shaped_dims<RPB, KSPLIT>(a.nrows_x, N_USED, a.ncols_dst);
    mul_mat_vec_q_moe_shaped<type, RPB, KSPLIT, MINB, UNROLL, PREF, fused><<<dims.first, dims.second, 0, s>>>(a);
}

template <ggml_type type, bool fused>
static void run(const problem & p, std::mt19937 & rng, FILE * out) {
    using B = typename htype<type>::B;
    constexpr int qk = ggml_cuda_type_traits<type>::qk;
    const int bpr = p.k/qk;  // x blocks per row
    const size_t nb = size_t(N_EXPERTS)*p.nrows*bpr;
    // the experts: made once per (type, shape) (one shape per instantiation here), kept for every token count
    static void * dx = nullptr, * dg = nullptr;
    if (dx == nullptr) {
        std::vector<uint8_t> hx, hg;
        fill_blocks<type>(hx, nb, rng);
        CK(cudaMalloc(&dx, hx.size())); CK(cudaMemcpy(dx, hx.data(), hx.size(), cudaMemcpyHostToDevice));
        if (fused) {
            fill_blocks<type>(hg, nb, rng);
            CK(cudaMalloc(&dg, hg.size())); CK(cudaMemcpy(dg, hg.data(), hg.size(), cudaMemcpyHostToDevice));
        }
    }

    // y: gate/up share one input row per token (nchannels_y 1); down has one per (expert slot, token)
    const int ych = fused ? 1 : N_USED;
    std::vector<float> hyf(size_t(p.ntok)*ych*p.k);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto & v : hyf) v = nd(rng);
    std::vector<block_q8_1> hy(hyf.size()/QK8_1);
    for (size_t r = 0; r < size_t(p.ntok)*ych; ++r) quantize_q8_1(&hyf[r*p.k], &hy[r*(p.k/QK8_1)], p.k);

    // uniform routing: 8 distinct experts per token
    std::vector<int32_t> hids(size_t(p.ntok)*N_USED);
    std::vector<int> perm(N_EXPERTS);
    size_t distinct = 0;
    std::vector<bool> seen(N_EXPERTS, false);
    for (int t = 0; t < p.ntok; ++t) {
        for (int e = 0; e < N_EXPERTS; ++e) perm[e] = e;
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int j = 0; j < N_USED; ++j) {
            hids[t*N_USED + j] = perm[j];
            if (!seen[perm[j]]) { seen[perm[j]] = true; ++distinct; }
        }
    }

    block_q8_1 * dy; int32_t * dids; float * dref, * dout;
    const size_t nout = size_t(p.ntok)*N_USED*p.nrows;
    CK(cudaMalloc(&dy, hy.size()*sizeof(block_q8_1)));
    CK(cudaMemcpy(dy, hy.data(), hy.size()*sizeof(block_q8_1), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&dids, hids.size()*4)); CK(cudaMemcpy(dids, hids.data(), hids.size()*4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&dref, nout*4)); CK(cudaMalloc(&dout, nout*4));

    mmvq_moe_args a{};
    a.x = dx; a.y = dy; a.ids = dids; a.dst = dout;
    a.fusion.gate = dg; a.fusion.glu_op = GGML_GLU_OP_SWIGLU;
    a.ncols_x = p.k; a.nrows_x = p.nrows;
    a.stride_row_x = bpr;
    a.stride_channel_x = p.nrows*bpr;
    a.stride_channel_y = fused ? 0 : p.k/QK8_1;
    a.stride_col_y = ych*(p.k/QK8_1);
    a.stride_channel_dst = p.nrows;
    a.stride_col_dst = N_USED*p.nrows;
    a.ncols_dst = p.ntok; a.ids_stride = N_USED;
    a.nchannels_y = init_fastdiv_values(ych);

    mmvq_moe_args ar = a; ar.dst = dref;
    reference<type, fused><<<dim3((p.nrows + 127)/128, N_USED, p.ntok), 128>>>(ar, dref);
    CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
    std::vector<float> ref(nout);
    CK(cudaMemcpy(ref.data(), dref, nout*4, cudaMemcpyDeviceToHost));
    float rmax = 0.0f;
    for (float v : ref) rmax = fmaxf(rmax, fabsf(v));

    const double bytes = double(distinct)*p.nrows*bpr*sizeof(B)*(fused ? 2 : 1);
    cudaStream_t s; CK(cudaStreamCreate(&s));
    auto measure = [&](const std::string & name, auto && launcher) {
        const auto [us, err] = time_and_check(launcher, s, dout, ref, 400);
        fprintf(out, "%-5s %-8s %5d %5d %2d  %-46s %8.2f us %7.0f GB/s  relerr %.1e  %s\n", htype<type>::name,
                p.shape.c_str(), p.nrows, p.k, p.ntok, name.c_str(), us, bytes/us/1e3, err/rmax,
                err/rmax < 1e-4f ? "ok" : "FAIL");
        fflush(out);
    };
#ifdef MOE_STOCK
    // the pinned tree's own kernel (stock-moe.cuh, cut from its mmvq.cu by run.sh), launched as mmvq.cu does
    measure("stock mul_mat_vec_q_moe", [&](cudaStream_t st) {
        const dim3 grid((a.nrows_x + 1)/2, N_USED), block(WARP_SIZE, a.ncols_dst);
        mul_mat_vec_q_moe<type, 2, fused><<<grid, block, 0, st>>>(a.x, a.y, a.ids, a.fusion, a.dst, a.ncols_x,
            a.nchannels_y, a.nrows_x, a.stride_row_x, a.stride_col_y, a.stride_col_dst, a.stride_channel_x,
            a.stride_channel_y, a.stride_channel_dst, a.ncols_dst, a.ids_stride);
    });
#endif
    int vi = 0;
#define RUN_VARIANT(R, K, M, U, P) {                                                                               \
        char name[64];                                                                                            \
        snprintf(name, sizeof(name), "V%-2d rpb=%d ksplit=%d minb=%d unroll=%d pref=%d", vi, R, K, M, U, int(P)); \
        measure(name, [&](cudaStream_t st) { launch<type, fused, R, K, M, U, P>(a, st); });                       \
        ++vi; }
    VARIANTS(RUN_VARIANT)
#undef RUN_VARIANT
    // the row-per-warp kernels (mmvq-moe-rowwarp.cuh): a kernel, its grid and its warps a block; the macros below only
    // name the instance and pick kernel and grid
    auto rowwarp = [&](const char * name, auto kernel, const dim3 grid, const int warps) {
        measure(name, [&](cudaStream_t st) { kernel<<<grid, dim3(WARP_SIZE, warps), 0, st>>>(a); });
    };
    char name[64];
    // Q3_K for K = 2048: RPW rows a warp, W warps a block, I rows in flight, S staged through shared memory
    if constexpr (type == GGML_TYPE_Q3_K) {
        if (p.k == 2048) {
#define RUN_ROWWARP(R, W, I, S)                                                                                   \
            snprintf(name, sizeof(name), "q3k-rowwarp rpw=%d warps=%d rpi=%d%s", R, W, I, S ? " staged" : "");   \
            rowwarp(name, mul_mat_vec_q3k_moe_rowwarp<R, W, 1, fused, I, S>,                                      \
                    q3k_rowwarp_grid<R, W>(a.nrows_x, N_USED, a.ncols_dst), W);
            RUN_ROWWARP(1, 4, 1, false) RUN_ROWWARP(2, 4, 1, false) RUN_ROWWARP(4, 4, 1, false)
            RUN_ROWWARP(8, 4, 1, false) RUN_ROWWARP(4, 8, 1, false) RUN_ROWWARP(16, 2, 1, false)
            RUN_ROWWARP(2, 4, 2, false) RUN_ROWWARP(4, 4, 2, false) RUN_ROWWARP(8, 4, 2, false)
            RUN_ROWWARP(4, 4, 4, false) RUN_ROWWARP(8, 4, 4, false)
            // rows copied into shared memory first (16-byte loads), then read from there
            RUN_ROWWARP(1, 4, 1, true) RUN_ROWWARP(4, 4, 1, true) RUN_ROWWARP(4, 4, 2, true)
            RUN_ROWWARP(8, 4, 2, true) RUN_ROWWARP(8, 4, 4, true)
#undef RUN_ROWWARP
        }
    }
    // Q4_K: K = 2048 (gate/up) 8 super-blocks a pass, K = 512 (down) 2, 4 rows at once
    if constexpr (type == GGML_TYPE_Q4_K) {
#define RUN_ROWWARP4(R, W, BPP, I)                                                                                \
        snprintf(name, sizeof(name), "q4k-rowwarp rpw=%d warps=%d bpp=%d rpi=%d", R, W, BPP, I);                  \
        rowwarp(name, mul_mat_vec_q4k_moe_rowwarp<R, W, BPP, 1, fused, I>,                                        \
                q4k_rowwarp_grid<R, W, BPP>(a.nrows_x, N_USED, a.ncols_dst), W);
        if (p.k == 2048) {
            RUN_ROWWARP4(1, 4, 8, 1) RUN_ROWWARP4(2, 4, 8, 1) RUN_ROWWARP4(4, 4, 8, 1) RUN_ROWWARP4(8, 4, 8, 1)
            RUN_ROWWARP4(4, 4, 8, 2) RUN_ROWWARP4(4, 4, 8, 4)
        } else if (p.k == 512) {
            RUN_ROWWARP4(1, 4, 2, 1) RUN_ROWWARP4(2, 4, 2, 1) RUN_ROWWARP4(4, 4, 2, 1) RUN_ROWWARP4(8, 2, 2, 1)
            RUN_ROWWARP4(2, 4, 2, 2) RUN_ROWWARP4(4, 4, 2, 2)
        }
#undef RUN_ROWWARP4
    }
    // Q8_0 (rows staged in shared memory): K = 2048 one row at a time, K = 512 four
    if constexpr (type == GGML_TYPE_Q8_0) {
#define RUN_ROWWARP8(R, W, LPR, I)                                                                                \
        snprintf(name, sizeof(name), "q8_0-rowwarp rpw=%d warps=%d lpr=%d rpi=%d", R, W, LPR, I);                 \
        rowwarp(name, mul_mat_vec_q8_0_moe_rowwarp<R, W, LPR, fused, I>,                                          \
                q8_0_rowwarp_grid<R, W, LPR>(a.nrows_x, N_USED, a.ncols_dst), W);
        if (p.k == 2048) {
            RUN_ROWWARP8(1, 4, 32, 1) RUN_ROWWARP8(4, 4, 32, 1) RUN_ROWWARP8(4, 4, 32, 2) RUN_ROWWARP8(8, 4, 32, 2)
        } else if (p.k == 512) {
            RUN_ROWWARP8(1, 4, 8, 1) RUN_ROWWARP8(2, 4, 8, 1) RUN_ROWWARP8(2, 4, 8, 2) RUN_ROWWARP8(4, 4, 8, 2)
        }
#undef RUN_ROWWARP8
    }
    CK(cudaFree(dy)); CK(cudaFree(dids)); CK(cudaFree(dref)); CK(cudaFree(dout));
    CK(cudaStreamDestroy(s));
}

// the dense multi-column mat-vec (mmvq-cols.cuh, candidate 0026) against upstream's vec_dot summed per (row,
// column): one thread per (row, column), every block, every quant index
template <ggml_type type>
__global__ void reference_dense(const void * x, const block_q8_1 * y, float * out, int k, int nrows, int ncols) {
    constexpr int qk = ggml_cuda_type_traits<type>::qk, qi = ggml_cuda_type_traits<type>::qi;
    constexpr int vdr = mmvq_moe_vec_dot<type>::vdr;
    const int row = blockIdx.x*blockDim.x + threadIdx.x, col = blockIdx.y;
    if (row >= nrows || col >= ncols) return;
    const int bpr = k/qk;
    float s = 0.0f;
    for (int kbx = 0; kbx < bpr; ++kbx) {
        for (int iqs = 0; iqs < qi; iqs += vdr) {
            s += mmvq_moe_vec_dot<type>::dot(x, &y[col*(k/QK8_1) + kbx*(qk/QK8_1)], row*bpr + kbx, iqs);
        }
    }
    out[col*nrows + row] = s;
}

template <ggml_type type>
static void run_dense(const int nrows, const int k, const int ncols, std::mt19937 & rng, FILE * out) {
    const int bpr = k/QK_K;
    const size_t nb = size_t(nrows)*bpr;
    std::vector<uint8_t> hx;
    fill_blocks<type>(hx, nb, rng);
    std::vector<float> hyf(size_t(ncols)*k);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (auto & v : hyf) v = nd(rng);
    std::vector<block_q8_1> hy(hyf.size()/QK8_1);
    for (int c = 0; c < ncols; ++c) quantize_q8_1(&hyf[size_t(c)*k], &hy[size_t(c)*(k/QK8_1)], k);
    void * dx; block_q8_1 * dy; float * dref, * dout;
    const size_t nout = size_t(ncols)*nrows;
    CK(cudaMalloc(&dx, hx.size())); CK(cudaMemcpy(dx, hx.data(), hx.size(), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&dy, hy.size()*sizeof(block_q8_1)));
    CK(cudaMemcpy(dy, hy.data(), hy.size()*sizeof(block_q8_1), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&dref, nout*4)); CK(cudaMalloc(&dout, nout*4));
    reference_dense<type><<<dim3((nrows + 127)/128, ncols), 128>>>(dx, dy, dref, k, nrows, ncols);
    CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
    std::vector<float> ref(nout);
    CK(cudaMemcpy(ref.data(), dref, nout*4, cudaMemcpyDeviceToHost));
    float rmax = 0.0f;
    for (float v : ref) rmax = fmaxf(rmax, fabsf(v));
    cudaStream_t s; CK(cudaStreamCreate(&s));
    const size_t smem = mmvq_cols_smem(8, k);
    auto measure = [&](const char * name, auto && launcher) {
        const auto [us, err] = time_and_check(launcher, s, dout, ref, nrows > 100000 ? 40 : 400);
        fprintf(out, "%-5s dense  %6d %5d %2d  %-46s %8.2f us %7.0f GB/s  relerr %.1e  %s\n", htype<type>::name, nrows, k,
                ncols, name, us,
                double(hx.size())/us/1e3, err/rmax, err/rmax < 1e-4f ? "ok" : "FAIL");
        fflush(out);
    };
#define RUN_COLS(NC, NW, RPW) {                                                                                   \
        char name[64];                                                                                            \
        snprintf(name, sizeof(name), "cols warps=%d rpw=%d", NW, RPW);                                            \
        measure(name, [&](cudaStream_t st) {                                                                      \
            mul_mat_vec_q_cols<type, NC, NW, RPW><<<(nrows + NW*RPW - 1)/(NW*RPW), dim3(WARP_SIZE, NW), smem, st>>>( \
                dx, dy, dout, k, nrows, bpr, k/QK8_1, nrows);                                                     \
        }); }
#define RUN_COLS_ALL(NC) { RUN_COLS(NC, 8, 1) RUN_COLS(NC, 8, 4) RUN_COLS(NC, 4, 4) RUN_COLS(NC, 8, 8) }
    switch (ncols) {
        case 2: RUN_COLS_ALL(2) break;
        case 4: RUN_COLS_ALL(4) break;
        default: RUN_COLS_ALL(8) break;
    }
#undef RUN_COLS_ALL
#undef RUN_COLS
    CK(cudaFree(dx)); CK(cudaFree(dy)); CK(cudaFree(dref)); CK(cudaFree(dout));
    CK(cudaStreamDestroy(s));
}

int main() {
    std::mt19937 rng(28);
    cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0));
    printf("# %s, %d SMs, cc %d.%d; 256 experts, 8 used, uniform routing; V0 = the pinned kernel's shape, \"stock\" = "
           "its kernel itself\n",
           prop.name, prop.multiProcessorCount, prop.major, prop.minor);
    printf("# type  shape     rows     k  n  variant                                           time     distinct-bytes/time  check\n");
    for (int ntok : {2, 4, 8}) {
        const problem gu{"gate_up", 512, 2048, ntok, true}, dn{"down", 2048, 512, ntok, false};
        run<GGML_TYPE_Q3_K, true >(gu, rng, stdout);  // hq3m (the 4090's file)
        run<GGML_TYPE_Q4_K, true >(gu, rng, stdout);  // q4_k_m, and hq3m's down below
        run<GGML_TYPE_Q8_0, true >(gu, rng, stdout);  // q8_0
        run<GGML_TYPE_Q4_K, false>(dn, rng, stdout);
        run<GGML_TYPE_Q6_K, false>(dn, rng, stdout);  // q4_k_m's down where llama-quantize gives it more bits
        run<GGML_TYPE_Q8_0, false>(dn, rng, stdout);
    }
    // dense Q6_K and Q4_K at 2-8 columns: the model's 8192 x 2048 and 2048 x 4096 projections and its 248,320-row
    // Q6_K head (the pinned kernel's times at these shapes: benchmarks/results/kernels/h200-mmvq-mmq.txt, test-backend-ops perf)
    for (int ncols : {2, 4, 8}) {
        run_dense<GGML_TYPE_Q6_K>(8192, 2048, ncols, rng, stdout);
        run_dense<GGML_TYPE_Q6_K>(2048, 4096, ncols, rng, stdout);
        run_dense<GGML_TYPE_Q6_K>(248320, 2048, ncols, rng, stdout);
        run_dense<GGML_TYPE_Q4_K>(8192, 2048, ncols, rng, stdout);
        run_dense<GGML_TYPE_Q4_K>(2048, 4096, ncols, rng, stdout);
    }
    return 0;
}

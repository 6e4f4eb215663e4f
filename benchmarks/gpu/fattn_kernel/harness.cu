// Standalone check and timing of flash_attn_ext_mma_q (ggml-cuda/fattn-mma-q.cuh of the GQA patch, issue 24): random
// quantized K/V, GQA 8, 2 K/V heads, the grid launch_fattn would use (parallel blocks over the K/V length, then the
// combine step), against an f32 reference on the dequantized cache; kernel times beside a device copy of the same
// K/V bytes (the read floor). Built and run by run.sh next to this file.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>
#include <random>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include "fattn-mma-q.cuh" // with shim/common.cuh beside it

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)

static uint3 fastdiv(uint32_t d) { return make_uint3(0, 0, d); }

// the combine step of launch_fattn (flash_attn_combine_results), one block per output row
template <int D>
__global__ void combine(const float * parts, const float2 * meta, float * dst, int pb) {
    const int row = blockIdx.x;
    parts += size_t(row)*pb*D; meta += size_t(row)*pb; dst += size_t(row)*D;
    float mx = meta[0].x;
    for (int l = 1; l < pb; ++l) mx = fmaxf(mx, meta[l].x);
    float num = 0, den = 0;
    for (int l = 0; l < pb; ++l) { const float f = expf(meta[l].x - mx); num += f*parts[l*D + threadIdx.x]; den += f*meta[l].y; }
    dst[threadIdx.x] = num/den;
}

// reference: one block per (token, head), f32 on the dequantized values
template <ggml_type type>
__device__ float deq(const char * row, int i) {
    const char * b = row + (i/32)*fattn_mma_q_type<type>::block_bytes;
    const float d = __half2float(*(const half *) b);
    if (type == GGML_TYPE_Q8_0) return d*float(((const int8_t *) (b + 2))[i % 32]);
    const uint8_t q = ((const uint8_t *) (b + 2))[i % 16];
    return d*(float(i % 32 < 16 ? (q & 0xF) : (q >> 4)) - 8.0f);
}

template <int D, ggml_type type>
__global__ void reference(const float * Q, const char * K, const char * V, const half * mask, float * out, float * S,
                          int n_kv, int n_head, int gqa, int rb, int nb11, float scale, const float * sinks) {
    const int t = blockIdx.y, h = blockIdx.x, kvh = h/gqa;
    const float * q = Q + (size_t(t)*n_head + h)*D;
    float * s = S + (size_t(t)*n_head + h)*n_kv;
    __shared__ float red[256];
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < n_kv; j += blockDim.x) {
        const char * kr = K + size_t(j)*nb11 + size_t(kvh)*rb;
        float acc = 0;
        for (int i = 0; i < D; ++i) acc += q[i]*deq<type>(kr, i);
        acc = acc*scale + __half2float(mask[size_t(t)*n_kv + j]);
        s[j] = acc; mx = fmaxf(mx, acc);
    }
    red[threadIdx.x] = mx; __syncthreads();
    for (int o = 128; o > 0; o >>= 1) { if (threadIdx.x < o) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + o]); __syncthreads(); }
    mx = red[0]; if (sinks) mx = fmaxf(mx, sinks[h]); __syncthreads();
    float sum = 0;
    for (int j = threadIdx.x; j < n_kv; j += blockDim.x) { s[j] = expf(s[j] - mx); sum += s[j]; }
    red[threadIdx.x] = sum; __syncthreads();
    for (int o = 128; o > 0; o >>= 1) { if (threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o]; __syncthreads(); }
    sum = red[0]; if (sinks) sum += expf(sinks[h] - mx);
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float acc = 0;
        for (int j = 0; j < n_kv; ++j) if (s[j] != 0.0f) acc += s[j]*deq<type>(V + size_t(j)*nb11 + size_t(kvh)*rb, i);
        out[(size_t(t)*n_head + h)*D + i] = acc/sum;
    }
}

static void quantize(ggml_type type, const float * x, char * y, int n) {
    for (int b = 0; b < n/32; ++b) {
        const float * xb = x + b*32;
        float amax = 0, maxv = 0;
        for (int i = 0; i < 32; ++i) if (fabsf(xb[i]) > amax) { amax = fabsf(xb[i]); maxv = xb[i]; }
        if (type == GGML_TYPE_Q8_0) {
            const float d = amax/127.0f, id = d ? 1.0f/d : 0.0f;
            char * yb = y + b*34; half hd = __float2half(d); memcpy(yb, &hd, 2);
            for (int i = 0; i < 32; ++i) yb[2 + i] = (int8_t) roundf(xb[i]*id);
        } else {
            const float d = maxv/-8.0f, id = d ? 1.0f/d : 0.0f;
            char * yb = y + b*18; half hd = __float2half(d); memcpy(yb, &hd, 2);
            for (int i = 0; i < 16; ++i) {
                const int a = std::min(15, int(xb[i]*id + 8.5f)), c = std::min(15, int(xb[i + 16]*id + 8.5f));
                yb[2 + i] = (char) (a | (c << 4));
            }
        }
    }
}

// The patch's two kernels as the harness launches them: flash_attn_ext_mma_q (1-16 tokens: ncols1 tokens a block, nw
// warps, nb K/V rows a tile) and flash_attn_ext_mma_q1 (one token: nw warps, nsub 16-row pieces per warp and tile,
// nst stages, at least minb blocks a multiprocessor)
template <int D, ggml_type type, int ncols1_, int nw, int nb> struct Multi {
    using L = fattn_mma_q_layout<D, ncols1_, nw, nb, type, type>;
    static constexpr int ncols1 = ncols1_, nwarps = nw, nbatch = nb, smem = L::nbytes_shared, rb = L::rb_K;
    static auto kernel() { return flash_attn_ext_mma_q<D, ncols1_, nw, nb, type, type>; }
    static void name(char * s) { snprintf(s, 64, "multi c%d w%d b%d", ncols1_, nw, nb); }
};
// (skip: the tile skip of series patch 0022, one token a block for any number of tokens)
template <int D, ggml_type type, int nw, int nsub, int nst, int minb, bool skip = false> struct One {
    using L = fattn_mma_q1_layout<D, nw, nsub, nst, type, type, skip>;
    static constexpr int ncols1 = 1, nwarps = nw, nbatch = L::nbatch, smem = L::nbytes_shared, rb = L::rb_K;
    static auto kernel() { return flash_attn_ext_mma_q1<D, nw, nsub, nst, minb, type, type, skip>; }
    static void name(char * s) { snprintf(s, 64, "one w%d s%d st%d m%d%s", nw, nsub, nst, minb, skip ? " skip" : ""); }
};

// The mask of a case (run_case): CAUSAL the original one (token t sees rows [0, n_kv - 200 + t] less every 97th);
// SERVER a unified pool of n_tokens slots, one token each: slot s's prompt is cells [s*prompt, (s+1)*prompt), then
// 128 generated tokens a slot interleaved (cell n_tokens*prompt + n_tokens*i + s is slot s's), the rest unused;
// HOLES per token and 128-row tile: half the tiles hidden, a tenth with one visible row (anywhere, the last row
// too), the others with random holes; PREFIX: rows [0, prompt) visible to every token (one stream of a sequence).
enum { MASK_CAUSAL, MASK_SERVER, MASK_HOLES, MASK_PREFIX };
struct Case {
    int n_kv = 1024, n_tokens = 1, n_seq = 1; // K/V rows and tokens of each of n_seq streams (Q->ne[3])
    int mask = MASK_CAUSAL, prompt = 0;
    bool check = false, sinks = false;
    int force_pb = 0;                  // parallel blocks (0: launch_fattn's choice)
    std::vector<float> * out = nullptr; // a copy of the output
    const char * label = nullptr;      // the skip section's line format
};
static double g_last_us = 0.0; // the time of the last run

template <int D, ggml_type type, class C>
static int run_case(const Case & cs);

template <int D, ggml_type type, class C>
static int run(int n_kv, int n_tokens, bool check, bool use_sinks) {
    Case cs; cs.n_kv = n_kv; cs.n_tokens = n_tokens; cs.check = check; cs.sinks = use_sinks;
    return run_case<D, type, C>(cs);
}

template <int D, ggml_type type, class C>
static int run_case(const Case & cs) {
    const int n_kv = cs.n_kv, n_tokens = cs.n_tokens, n_seq = cs.n_seq;
    const bool check = cs.check, use_sinks = cs.sinks;
    constexpr int ncols1 = C::ncols1, nw = C::nwarps, nb = C::nbatch;
    const int n_head_kv = 2, gqa = 8, n_head = n_head_kv*gqa;
    const int rb = C::rb, nb11 = n_head_kv*rb;
    const size_t kv_bytes = size_t(n_kv)*nb11; // one stream
    std::mt19937 rng(1234 + n_kv + n_tokens);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> hq(size_t(n_seq)*n_tokens*n_head*D), tmp(D);
    for (auto & v : hq) v = nd(rng);
    std::vector<char> hk(kv_bytes), hv(kv_bytes);
    // K/V generated in pieces to keep this quick at 256k rows: 4096 distinct rows, tiled
    const int uniq = std::min(n_kv, 4096);
    for (int j = 0; j < uniq; ++j) for (int h = 0; h < n_head_kv; ++h) {
        for (auto & v : tmp) v = nd(rng); quantize(type, tmp.data(), hk.data() + size_t(j)*nb11 + h*rb, D);
        for (auto & v : tmp) v = nd(rng); quantize(type, tmp.data(), hv.data() + size_t(j)*nb11 + h*rb, D);
    }
    for (int j = uniq; j < n_kv; ++j) { memcpy(hk.data() + size_t(j)*nb11, hk.data() + size_t(j % uniq)*nb11, nb11);
                                        memcpy(hv.data() + size_t(j)*nb11, hv.data() + size_t((j*7 + 3) % uniq)*nb11, nb11); }
    // mask: token t sees rows [0, n_kv - 200 + t]; a few early rows also masked (holes); or a pattern of Case
    const int n_tok_pad = (n_tokens + 15)/16*16;
    std::vector<half> hm(size_t(n_seq)*n_tok_pad*n_kv);
    const half ninf = __float2half(-INFINITY), zero = __float2half(0.0f);
    if (cs.mask == MASK_CAUSAL) {
        for (int t = 0; t < n_tok_pad; ++t) for (int j = 0; j < n_kv; ++j)
            hm[size_t(t)*n_kv + j] = (j > n_kv - 200 + t || j % 97 == 5) ? ninf : zero;
    } else if (cs.mask == MASK_SERVER) {
        const int ns = n_tokens, gen_end = ns*cs.prompt + ns*128;
        if (gen_end > n_kv) { fprintf(stderr, "server layout: %d cells > %d\n", gen_end, n_kv); exit(1); }
        for (int t = 0; t < n_tok_pad; ++t) for (int j = 0; j < n_kv; ++j) {
            const int owner = j < ns*cs.prompt ? j/cs.prompt : (j < gen_end ? (j - ns*cs.prompt) % ns : -1);
            hm[size_t(t)*n_kv + j] = owner == t ? zero : ninf;
        }
    } else if (cs.mask == MASK_HOLES) {
        std::uniform_real_distribution<float> ud(0.0f, 1.0f);
        for (int t = 0; t < n_tok_pad; ++t) {
            for (int j0 = 0; j0 < n_kv; j0 += 128) {
                const float r = ud(rng);
                const int one = j0 + int(ud(rng)*128) % 128, last = (j0/128) % 3 == 0 ? j0 + 127 : one;
                for (int j = j0; j < j0 + 128 && j < n_kv; ++j) {
                    const bool vis = r < 0.5f ? false : r < 0.6f ? (j == one || j == last) : ud(rng) > 0.3f;
                    hm[size_t(t)*n_kv + j] = vis ? zero : ninf;
                }
            }
            hm[size_t(t)*n_kv + (t*131) % n_kv] = zero; // at least one visible row
        }
    } else {
        for (int t = 0; t < n_tok_pad; ++t) for (int j = 0; j < n_kv; ++j)
            hm[size_t(t)*n_kv + j] = j < cs.prompt ? zero : ninf;
    }
    for (int s = 1; s < n_seq; ++s) std::copy(hm.begin(), hm.begin() + size_t(n_tok_pad)*n_kv, hm.begin() + size_t(s)*n_tok_pad*n_kv);
    std::vector<float> hs(n_head);
    for (auto & v : hs) v = nd(rng);

    float *dq, *dout, *dref, *dS, *dtmp, *dsinks; float2 *dmeta; char *dk, *dv, *dcopy; half *dm;
    const size_t n_out = size_t(n_seq)*n_tokens*n_head*D;
    CK(cudaMalloc(&dq, hq.size()*4)); CK(cudaMalloc(&dk, n_seq*kv_bytes)); CK(cudaMalloc(&dv, n_seq*kv_bytes));
    CK(cudaMalloc(&dm, hm.size()*2)); CK(cudaMalloc(&dout, n_out*4)); CK(cudaMalloc(&dsinks, n_head*4));
    CK(cudaMemcpy(dq, hq.data(), hq.size()*4, cudaMemcpyHostToDevice));
    for (int s = 0; s < n_seq; ++s) { // the same rows in every stream, at their own addresses
        CK(cudaMemcpy(dk + s*kv_bytes, hk.data(), kv_bytes, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dv + s*kv_bytes, hv.data(), kv_bytes, cudaMemcpyHostToDevice));
    }
    CK(cudaMemcpy(dm, hm.data(), hm.size()*2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dsinks, hs.data(), n_head*4, cudaMemcpyHostToDevice));

    auto kernel = C::kernel();
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::smem));
    int dev, nsm, occ; CK(cudaGetDevice(&dev)); CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, 32*nw, C::smem));
    // launch_fattn's choice of parallel blocks
    const int ntiles_x = (n_tokens + ncols1 - 1)/ncols1, ntiles_dst = ntiles_x*(gqa/8)*n_head_kv*n_seq;
    const int ntiles_KV = n_kv/nb, per_wave = nsm*occ;
    int pb = std::min(occ, ntiles_KV), best_eff = 0, best_waves = 0;
    for (int p = pb; p <= ntiles_KV; ++p) {
        const int tot = ntiles_dst*p, w = (tot + per_wave - 1)/per_wave, eff = 100*tot/(w*per_wave);
        if (best_eff >= 95 && w > best_waves) break;
        if (eff > best_eff) { best_eff = eff; best_waves = w; pb = p; }
    }
    if (cs.force_pb) pb = cs.force_pb;
    CK(cudaMalloc(&dtmp, size_t(pb)*n_out*4)); CK(cudaMalloc(&dmeta, size_t(pb)*n_out/D*8));
    const dim3 grid(ntiles_x, pb, (n_head/8)*n_seq), block(32, nw);
    auto launch = [&]() {
        kernel<<<grid, block, C::smem>>>((const char *) dq, dk, dv, (const char *) dm, use_sinks ? (const char *) dsinks : nullptr,
            nullptr, pb > 1 ? dtmp : dout, dmeta, 1.0f/sqrtf(float(D)), 0.0f, 1.0f, 1.0f, 0, 0.0f,
            D, fastdiv(n_tokens), n_head, n_seq, n_head*D*4, D*4, n_tokens*n_head*D*4,
            D, n_kv, n_head_kv, n_seq, nb11, rb, int64_t(kv_bytes),
            nb11, rb, int64_t(kv_bytes), n_tok_pad, 1, n_seq, n_kv*2, n_tok_pad*n_kv*2, int64_t(n_tok_pad)*n_kv*2);
        if (pb > 1) combine<D><<<n_seq*n_tokens*n_head, D>>>(dtmp, dmeta, dout, pb);
    };
    launch(); CK(cudaGetLastError()); CK(cudaDeviceSynchronize());

    double max_err = 0, max_ref = 0;
    if (check) {
        CK(cudaMalloc(&dref, n_out*4)); CK(cudaMalloc(&dS, size_t(n_tokens)*n_head*n_kv*4));
        for (int s = 0; s < n_seq; ++s) {
            const size_t so = size_t(s)*n_tokens*n_head*D;
            reference<D, type><<<dim3(n_head, n_tokens), 256>>>(dq + so, dk + s*kv_bytes, dv + s*kv_bytes,
                dm + size_t(s)*n_tok_pad*n_kv, dref + so, dS, n_kv, n_head, gqa, rb, nb11, 1.0f/sqrtf(float(D)),
                use_sinks ? dsinks : nullptr);
            CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
        }
        std::vector<float> o(n_out), r(o.size());
        CK(cudaMemcpy(o.data(), dout, o.size()*4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(r.data(), dref, r.size()*4, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < o.size(); ++i) { max_err = std::max(max_err, (double) fabsf(o[i] - r[i])); max_ref = std::max(max_ref, (double) fabsf(r[i]));
            if (!std::isfinite(o[i])) { max_err = INFINITY; } }
        CK(cudaFree(dref)); CK(cudaFree(dS));
    }
    // timing: the kernel + combine, and a device copy of the K/V bytes (read floor)
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    if (cs.out) { cs.out->resize(n_out); CK(cudaMemcpy(cs.out->data(), dout, n_out*4, cudaMemcpyDeviceToHost)); }
    const int reps = n_kv >= 131072 ? 50 : 200;
    for (int i = 0; i < 5; ++i) launch();
    CK(cudaEventRecord(e0)); for (int i = 0; i < reps; ++i) launch(); CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1));
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); const double us = 1000.0*ms/reps;
    g_last_us = us;
    const bool ok = !check || max_err <= 5e-3*max_ref;
    char kname[64]; C::name(kname);
    if (cs.label) {
        printf("  %-34s %-22s %-4s D=%d tokens=%2d seqs=%d kv=%6d blocks=%3dx%-3d | %7.1f us | %s\n",
            cs.label, kname, type == GGML_TYPE_Q8_0 ? "q8_0" : "q4_0", D, n_tokens, n_seq, n_kv, pb, int(grid.x*grid.z), us,
            check ? (ok ? "match" : "MISMATCH") : "not checked");
        if (check) printf("      max |out - ref| %.3g, max |ref| %.3g\n", max_err, max_ref);
        fflush(stdout);
        CK(cudaFree(dq)); CK(cudaFree(dk)); CK(cudaFree(dv)); CK(cudaFree(dm)); CK(cudaFree(dout)); CK(cudaFree(dtmp));
        CK(cudaFree(dmeta)); CK(cudaFree(dsinks)); CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
        return ok ? 0 : 1;
    }
    CK(cudaMalloc(&dcopy, 2*kv_bytes));
    for (int i = 0; i < 3; ++i) { CK(cudaMemcpyAsync(dcopy, dk, kv_bytes, cudaMemcpyDeviceToDevice)); CK(cudaMemcpyAsync(dcopy + kv_bytes, dv, kv_bytes, cudaMemcpyDeviceToDevice)); }
    CK(cudaEventRecord(e0));
    for (int i = 0; i < 20; ++i) { CK(cudaMemcpyAsync(dcopy, dk, kv_bytes, cudaMemcpyDeviceToDevice)); CK(cudaMemcpyAsync(dcopy + kv_bytes, dv, kv_bytes, cudaMemcpyDeviceToDevice)); }
    CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1)); CK(cudaEventElapsedTime(&ms, e0, e1));
    const double us_copy = 1000.0*ms/20; // reads and writes 2*kv_bytes
    printf("%-18s %-5s D=%d tokens=%2d kv=%6d sinks=%d blocks=%3dx%d | %7.1f us | K+V %6.1f MB, copy %6.1f us (%4.2f TB/s read+write), read floor %6.1f us, %4.2fx floor | %s\n",
        kname, type == GGML_TYPE_Q8_0 ? "q8_0" : "q4_0", D, n_tokens, n_kv, use_sinks, pb, int(grid.x*grid.z), us,
        2*kv_bytes/1e6, us_copy, 4*kv_bytes/us_copy/1e6, us_copy/2, us/(us_copy/2),
        check ? (ok ? "match" : "MISMATCH") : "not checked");
    if (check) {
        printf("      max |out - ref| %.3g, max |ref| %.3g\n", max_err, max_ref);
    }
    fflush(stdout);
    CK(cudaFree(dq)); CK(cudaFree(dk)); CK(cudaFree(dv)); CK(cudaFree(dm)); CK(cudaFree(dout)); CK(cudaFree(dtmp));
    CK(cudaFree(dmeta)); CK(cudaFree(dcopy)); CK(cudaFree(dsinks));
    return ok ? 0 : 1;
}

// the configuration fattn.cu launches: 8 warps, 64 K/V rows per tile; 2, 4 or 8 tokens per block
#ifndef Q1_CFG
#define Q1_CFG 8, 1, 2, 1 // the one-token kernel's configuration fattn.cu launches (nw, nsub, nst, minb)
#endif
template <int D, ggml_type type>
static int tokens(int n_kv, int n_tokens, bool check, bool sinks) {
    if (n_tokens == 1) return run<D, type, One<D, type, Q1_CFG>>(n_kv, n_tokens, check, sinks);
    if (n_tokens <= 2) return run<D, type, Multi<D, type, 2, 8, 64>>(n_kv, n_tokens, check, sinks);
    if (n_tokens <= 4) return run<D, type, Multi<D, type, 4, 8, 64>>(n_kv, n_tokens, check, sinks);
    return run<D, type, Multi<D, type, 8, 8, 64>>(n_kv, n_tokens, check, sinks);
}

// one token: configurations of the one-token kernel against the 1-16-token kernel, checked at 1k/4k rows, timed at depth
template <ggml_type type, class C>
static int variant() {
    int bad = run<256, type, C>(1024, 1, true, true) + run<256, type, C>(4096, 1, true, false);
    for (int kv : {32768, 131072, 262144}) bad += run<256, type, C>(kv, 1, false, false);
    return bad;
}
template <ggml_type type>
static int variants() {
    int bad = variant<type, Multi<256, type, 2, 8, 64>>();
    bad += variant<type, One<256, type, 8, 1, 3, 1>>();
    bad += variant<type, One<256, type, 4, 1, 3, 2>>();
    bad += variant<type, One<256, type, 8, 1, 2, 1>>();
    bad += variant<type, One<256, type, 4, 1, 2, 3>>();
    bad += variant<type, One<256, type, 8, 1, 3, 2>>();
    return bad;
}

// Series patch 0022 (the tile skip of the one-token kernel, one block a token for 2-16 tokens of one stream):
// (a) correctness of the skip against the f32 reference, and bit for bit against the kernel without it;
// (b) times: a decode step of a server's unified K/V pool (8 slots, one token each) on the multi-token kernel, the
// one-token kernel with and without the skip, and beside it the same step on 8 separate streams (the one-token
// kernel, no skip, each sequence over its own cells); 5 tokens of one sequence (a draft-verification batch) on the
// multi-token kernel and on the one-token kernel with the skip; one token of one sequence with and without the
// skip (the cost of the mask scan where nothing is skipped).
// Run alone: harness skip (run.sh TREE OUT skip).
template <int D, ggml_type type> using OneSkip   = One<D, type, 8, 1, 2, 1, true>;
template <int D, ggml_type type> using OneNoSkip = One<D, type, 8, 1, 2, 1, false>;
template <int D, ggml_type type> using Multi8    = Multi<D, type, 8, 8, 64>;

static Case mk(int n_kv, int n_tokens, int mask, int prompt, bool check, const char * label) {
    Case c; c.n_kv = n_kv; c.n_tokens = n_tokens; c.mask = mask; c.prompt = prompt; c.check = check; c.label = label;
    return c;
}

static int same_bits(const std::vector<float> & a, const std::vector<float> & b, const char * what) {
    const bool same = a.size() == b.size() && memcmp(a.data(), b.data(), a.size()*sizeof(float)) == 0;
    printf("  %-34s skip == no skip bit for bit: %s\n", what, same ? "yes" : "NO");
    return same ? 0 : 1;
}

static int skip_section() {
    constexpr ggml_type q8 = GGML_TYPE_Q8_0, q4 = GGML_TYPE_Q4_0;
    int bad = 0;
    printf("tile skip (series patch 0022), correctness (a):\n");
    {
        std::vector<float> o_skip, o_noskip;
        Case c = mk(9216, 8, MASK_SERVER, 1024, true, "a server 8 slots x 1k, sinks");
        c.sinks = true; c.out = &o_skip;
        bad += run_case<256, q8, OneSkip<256, q8>>(c);
        c.out = &o_noskip;
        bad += run_case<256, q8, OneNoSkip<256, q8>>(c);
        bad += same_bits(o_skip, o_noskip, "a server 8 slots x 1k");
        c.out = nullptr;
        bad += run_case<256, q8, Multi8<256, q8>>(c);
        bad += run_case<256, q4, OneSkip<256, q4>>(mk(9216, 8, MASK_SERVER, 1024, true, "a server 8 slots x 1k"));
    }
    {
        std::vector<float> o_skip, o_noskip;
        Case c = mk(9216, 8, MASK_HOLES, 0, true, "a random holes, hidden tiles");
        c.out = &o_skip;
        bad += run_case<256, q8, OneSkip<256, q8>>(c);
        c.out = &o_noskip;
        bad += run_case<256, q8, OneNoSkip<256, q8>>(c);
        bad += same_bits(o_skip, o_noskip, "a random holes, hidden tiles");
        bad += run_case<256, q4, OneSkip<256, q4>>(mk(9216, 8, MASK_HOLES, 0, true, "a random holes, hidden tiles"));
        bad += run_case<128, q8, OneSkip<128, q8>>(mk(4096, 3, MASK_HOLES, 0, true, "a random holes, hidden tiles"));
        bad += run_case<128, q4, OneSkip<128, q4>>(mk(4096, 1, MASK_HOLES, 0, true, "a random holes, hidden tiles"));
    }
    bad += run_case<256, q8, OneSkip<256, q8>>(mk(1024, 5, MASK_CAUSAL, 0, true, "a one sequence, 5 tokens"));
    bad += run_case<256, q8, OneSkip<256, q8>>(mk(4096, 5, MASK_CAUSAL, 0, true, "a one sequence, 5 tokens"));
    bad += run_case<256, q4, OneSkip<256, q4>>(mk(4096, 5, MASK_CAUSAL, 0, true, "a one sequence, 5 tokens"));
    {
        Case c = mk(133120, 2, MASK_HOLES, 0, true, "a 1040 tiles a block (2 chunks)");
        c.force_pb = 1;
        bad += run_case<256, q8, OneSkip<256, q8>>(c);
    }

    printf("tile skip (series patch 0022), times (b), q8_0, head size 256, 2 K/V heads x 8 Q heads:\n");
    for (int prompt : {1024, 4096}) {
        const int used = 8*prompt + 8*128, n_kv = (used + 255)/256*256;
        const int per_seq = prompt + 128, n_kv_seq = (per_seq + 255)/256*256;
        bad += run_case<256, q8, Multi8<256, q8>>(mk(n_kv, 8, MASK_SERVER, prompt, false, "b server step: mma_q c8"));
        const double t_multi = g_last_us;
        bad += run_case<256, q8, OneSkip<256, q8>>(mk(n_kv, 8, MASK_SERVER, prompt, false, "b server step: q1/token skip"));
        const double t_skip = g_last_us;
        bad += run_case<256, q8, OneNoSkip<256, q8>>(mk(n_kv, 8, MASK_SERVER, prompt, false, "b server step: q1/token no skip"));
        const double t_noskip = g_last_us;
        Case c = mk(n_kv_seq, 1, MASK_PREFIX, per_seq, false, "b server step: 8 streams q1");
        c.n_seq = 8;
        bad += run_case<256, q8, OneNoSkip<256, q8>>(c);
        const double t_streams = g_last_us;
        printf("  SUMMARY server step kv=%d (8 x %d prompt + 8 x 128 generated): mma_q %.1f us, q1/token skip %.1f us, "
               "q1/token no skip %.1f us, 8 separate streams %.1f us\n", n_kv, prompt, t_multi, t_skip, t_noskip, t_streams);
    }
    for (int kv : {1024, 8192, 32768, 131072}) {
        bad += run_case<256, q8, Multi8<256, q8>>(mk(kv, 5, MASK_CAUSAL, 0, false, "b one seq 5 tokens: mma_q c8"));
        const double t_multi = g_last_us;
        bad += run_case<256, q8, OneSkip<256, q8>>(mk(kv, 5, MASK_CAUSAL, 0, false, "b one seq 5 tokens: q1/token skip"));
        printf("  SUMMARY one sequence 5 tokens kv=%d: mma_q %.1f us, q1/token skip %.1f us (%.2fx)\n",
               kv, t_multi, g_last_us, g_last_us/t_multi);
    }
    for (int kv : {1024, 8192, 32768, 131072}) {
        bad += run_case<256, q8, OneNoSkip<256, q8>>(mk(kv, 1, MASK_CAUSAL, 0, false, "b one seq 1 token: q1 no skip"));
        const double t_noskip = g_last_us;
        bad += run_case<256, q8, OneSkip<256, q8>>(mk(kv, 1, MASK_CAUSAL, 0, false, "b one seq 1 token: q1 skip"));
        printf("  SUMMARY one sequence 1 token kv=%d: q1 no skip %.1f us, q1 skip %.1f us (%.2fx)\n",
               kv, t_noskip, g_last_us, g_last_us/t_noskip);
    }
    printf("tile skip: %s\n", bad ? "FAILED" : "all checked cases match");
    return bad;
}

int main(int argc, char ** argv) {
    int bad = 0;
    if (argc > 1 && strcmp(argv[1], "skip") == 0) {
        return skip_section() ? 1 : 0;
    }
    if (argc > 2 && strcmp(argv[1], "prof") == 0) {
        // one configuration at 262,144 rows, for a profiler (ncu -k regex:mma_q1 -c 1): 0-3 = q8_0 st2, q8_0 st3,
        // q4_0 st2, q4_0 st3 (8 warps)
        switch (atoi(argv[2])) {
            case 0: return run<256, GGML_TYPE_Q8_0, One<256, GGML_TYPE_Q8_0, 8, 1, 2, 1>>(262144, 1, false, false);
            case 1: return run<256, GGML_TYPE_Q8_0, One<256, GGML_TYPE_Q8_0, 8, 1, 3, 1>>(262144, 1, false, false);
            case 2: return run<256, GGML_TYPE_Q4_0, One<256, GGML_TYPE_Q4_0, 8, 1, 2, 1>>(262144, 1, false, false);
            default: return run<256, GGML_TYPE_Q4_0, One<256, GGML_TYPE_Q4_0, 8, 1, 3, 1>>(262144, 1, false, false);
        }
    }
    if (argc > 1 && strcmp(argv[1], "variants") == 0) {
        bad = variants<GGML_TYPE_Q8_0>() + variants<GGML_TYPE_Q4_0>();
        printf("%s\n", bad ? "FAILED" : "all checked cases match");
        return bad ? 1 : 0;
    }
    printf("correctness (random data, masked holes, causal tail):\n");
    bad += tokens<256, GGML_TYPE_Q8_0>(1024, 1, true, true);
    bad += tokens<256, GGML_TYPE_Q8_0>(1024, 2, true, false);
    bad += tokens<256, GGML_TYPE_Q4_0>(2048, 3, true, true);
    bad += tokens<256, GGML_TYPE_Q8_0>(1024, 7, true, true);
    bad += tokens<256, GGML_TYPE_Q4_0>(1024, 13, true, false);
    bad += tokens<128, GGML_TYPE_Q8_0>(1024, 1, true, true);
    bad += tokens<128, GGML_TYPE_Q4_0>(1024, 13, true, false);
    bad += tokens<256, GGML_TYPE_Q8_0>(256, 1, true, false);
    printf("speed (head size 256, GQA 8, 2 K/V heads):\n");
    for (int kv : {1024, 32768, 131072, 262144}) {
        for (int nt : {1, 4, 5, 16}) {
            bad += tokens<256, GGML_TYPE_Q8_0>(kv, nt, kv <= 32768, false);
            bad += tokens<256, GGML_TYPE_Q4_0>(kv, nt, kv <= 32768, false);
        }
    }
    bad += skip_section();
    printf("%s\n", bad ? "FAILED" : "all checked cases match");
    return bad ? 1 : 0;
}

// What one sequence's top-k over the vocabulary costs on the GPU when llama-server samples in the graph (issue 28).
// With CCCL < 3.2 (CUDA 13.0 ships 3.0) ggml-cuda's GGML_OP_TOP_K on a row longer than 1024 falls back to a full
// argsort: the row's indices written, the keys copied, cub::DeviceRadixSort::SortPairsDescending, then the first k
// indices copied out (ggml/src/ggml-cuda/top-k.cu, argsort.cu). This times that sequence of calls for one row of
// Qwen3.5's 248,320 logits, once per sequence as the graph runs them (1 and 8 rows one after another), beside
// what a top-1 needs (cub::DeviceReduce::ArgMax), each CUDA-graph captured and replayed as llama.cpp runs a step.
// Beside them candidate 0021's two-stage top-k (ggml-cuda/top-k-tiles.cuh: a block sorts each 2048-logit tile and
// keeps k, one block merges the tiles' candidates; k <= 64).
// Checked: the sort's first index and ArgMax's both equal the host's argmax of the same row; the two-stage top-k
// gives the host's top-k set for every row at k = 1, 16, 20, 40, 64, and a row of -inf but for 3 values keeps those 3.
//   bash benchmarks/gpu/topk_sort/run.sh TREE [OUT]   (TREE: the pinned llama.cpp tree)
#include "top-k-tiles.cuh"  // candidate 0021's kernels, from a copy of ggml-cuda with the patch applied (run.sh)

#include <cub/cub.cuh>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); std::exit(1); } } while (0)

static __global__ void iota(int * v, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = i;
}

struct Sort {  // the fallback's buffers for one row
    int n; float * keys; float * keys_out; int * idx; int * idx_out; void * tmp; size_t tmp_bytes = 0;
    explicit Sort(int n_) : n(n_) {
        CK(cudaMalloc(&keys, n * sizeof(float))); CK(cudaMalloc(&keys_out, n * sizeof(float)));
        CK(cudaMalloc(&idx, n * sizeof(int))); CK(cudaMalloc(&idx_out, n * sizeof(int)));
        CK(cub::DeviceRadixSort::SortPairsDescending(nullptr, tmp_bytes, keys, keys_out, idx, idx_out, n));
        CK(cudaMalloc(&tmp, tmp_bytes));
    }
    void run(const float * row, int * dst, int k, cudaStream_t s) {
        iota<<<(n + 255) / 256, 256, 0, s>>>(idx, n);
        CK(cudaMemcpyAsync(keys, row, n * sizeof(float), cudaMemcpyDeviceToDevice, s));
        size_t b = tmp_bytes;
        CK(cub::DeviceRadixSort::SortPairsDescending(tmp, b, keys, keys_out, idx, idx_out, n, 0, 32, s));
        CK(cudaMemcpyAsync(dst, idx_out, k * sizeof(int), cudaMemcpyDeviceToDevice, s));
    }
};

struct Arg {  // top-1 as a reduction
    int n; cub::KeyValuePair<int, float> * out; void * tmp; size_t tmp_bytes = 0;
    explicit Arg(int n_) : n(n_) {
        CK(cudaMalloc(&out, sizeof(*out)));
        CK(cub::DeviceReduce::ArgMax(nullptr, tmp_bytes, (const float *) nullptr, out, n));
        CK(cudaMalloc(&tmp, tmp_bytes));
    }
    void run(const float * row, cudaStream_t s) {
        size_t b = tmp_bytes;
        CK(cub::DeviceReduce::ArgMax(tmp, b, row, out, n, s));
    }
};

struct Tiles {  // the candidate's two passes (top-k-tiles.cuh) with their buffers for `rows` rows
    int n, k; float * cv; int * ci;
    Tiles(int n_, int k_, int rows) : n(n_), k(k_) {
        if (!top_k_tiles_fit(n, k)) { std::fprintf(stderr, "k = %d does not fit the two passes\n", k); std::exit(1); }
        CK(cudaMalloc(&cv, (size_t) rows * top_k_tiles_count(n) * k * sizeof(float)));
        CK(cudaMalloc(&ci, (size_t) rows * top_k_tiles_count(n) * k * sizeof(int)));
    }
    void run(const float * x, int * dst, int rows, cudaStream_t s) { top_k_tiles_launch(x, cv, ci, dst, n, rows, k, s); }
};

template <typename F> static float graph_us(cudaStream_t s, F body, int reps = 200) {
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    body();
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 10; i++) CK(cudaGraphLaunch(ge, s));
    cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a, s));
    for (int i = 0; i < reps; i++) CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(b, s)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b));
    CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
    return 1e3f * ms / reps;
}

int main(int argc, char ** argv) {
    const int n = argc > 1 ? std::atoi(argv[1]) : 248320, rows = 8, k = 40;
    std::vector<float> h((size_t) n * rows);
    std::mt19937 rng(1); std::normal_distribution<float> nd(0.f, 3.f);
    for (auto & x : h) x = nd(rng);
    float * d; int * dst;
    CK(cudaMalloc(&d, h.size() * sizeof(float))); CK(cudaMalloc(&dst, rows * k * sizeof(int)));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    cudaStream_t s; CK(cudaStreamCreate(&s));
    std::vector<Sort *> sorts; std::vector<Arg *> args;
    for (int r = 0; r < rows; r++) { sorts.push_back(new Sort(n)); args.push_back(new Arg(n)); }
    // check: each row's first sorted index and its ArgMax against the host
    bool ok = true;
    for (int r = 0; r < rows; r++) {
        sorts[r]->run(d + (size_t) r * n, dst + r * k, k, s); args[r]->run(d + (size_t) r * n, s);
        int got; cub::KeyValuePair<int, float> kv;
        CK(cudaMemcpyAsync(&got, dst + r * k, sizeof(int), cudaMemcpyDeviceToHost, s));
        CK(cudaMemcpyAsync(&kv, args[r]->out, sizeof(kv), cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        const float * row = h.data() + (size_t) r * n;
        const int want = (int) (std::max_element(row, row + n) - row);
        ok = ok && got == want && kv.key == want;
    }
    // the two-stage top-k: the same set of k indices as the sort for every row (k = 1, 16, 20, 40, 64), and ties broken
    // by the padding rule: a row of -inf but for 3 finite values keeps those 3 first
    std::vector<int> ks = {1, 16, 20, 40, 64};  // each form of the merge (122, 1952, 2440, 4880, 7808 candidates)
    for (int kk : ks) {
        Tiles tl(n, kk, rows);
        int * dk; CK(cudaMalloc(&dk, rows * kk * sizeof(int)));
        tl.run(d, dk, rows, s);
        std::vector<int> got((size_t) rows * kk);
        CK(cudaMemcpyAsync(got.data(), dk, got.size() * sizeof(int), cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        for (int r = 0; r < rows; r++) {
            const float * row = h.data() + (size_t) r * n;
            std::vector<int> want(n);
            for (int i = 0; i < n; i++) want[i] = i;
            std::partial_sort(want.begin(), want.begin() + kk, want.end(),
                              [&](int a, int b) { return row[a] > row[b]; });
            std::vector<int> a(got.begin() + (size_t) r * kk, got.begin() + (size_t) (r + 1) * kk);
            std::vector<int> w(want.begin(), want.begin() + kk);
            std::sort(a.begin(), a.end()); std::sort(w.begin(), w.end());
            ok = ok && a == w;
        }
        CK(cudaFree(dk));
    }
    {
        std::vector<float> m(n, -INFINITY); m[7] = 1.f; m[n / 2] = -5.f; m[n - 1] = 0.f;
        float * dm; int * dk; CK(cudaMalloc(&dm, n * sizeof(float))); CK(cudaMalloc(&dk, 3 * sizeof(int)));
        CK(cudaMemcpy(dm, m.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        Tiles tl(n, 3, 1); tl.run(dm, dk, 1, s);
        int g3[3]; CK(cudaMemcpy(g3, dk, sizeof(g3), cudaMemcpyDeviceToHost));
        std::sort(g3, g3 + 3);
        ok = ok && g3[0] == 7 && g3[1] == n / 2 && g3[2] == n - 1;
    }
    int dev; cudaDeviceProp p; CK(cudaGetDevice(&dev)); CK(cudaGetDeviceProperties(&p, dev));
    std::printf("# %s, CCCL %d.%d.%d; one row = %d logits; us per step, CUDA-graph replay (%s)\n", p.name,
                CCCL_MAJOR_VERSION, CCCL_MINOR_VERSION, CCCL_PATCH_VERSION, n, ok ? "check ok" : "check FAILED");
    for (int nr : {1, 8}) {
        const float us_sort = graph_us(s, [&] {
            for (int r = 0; r < nr; r++) sorts[r]->run(d + (size_t) r * n, dst + r * k, k, s);
        });
        const float us_arg = graph_us(s, [&] { for (int r = 0; r < nr; r++) args[r]->run(d + (size_t) r * n, s); });
        std::printf("rows %d  argsort fallback (iota + copy + radix sort + copy k) %8.1f us   argmax %6.1f us\n",
                    nr, us_sort, us_arg);
        for (int kk : ks) {  // one launch pair per row, as the graph runs one sampler chain per sequence
            Tiles tl(n, kk, 1);
            const float us = graph_us(s, [&] { for (int r = 0; r < nr; r++) tl.run(d + (size_t) r * n, dst, 1, s); });
            std::printf("rows %d  two-stage top-k, k = %2d %8.1f us\n", nr, kk, us);
        }
    }
    return ok ? 0 : 1;
}

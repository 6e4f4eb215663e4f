// How long the host-side K/Q mask fill of one decode step can take at depth (issue 24: 1.76 ms per token grow
// outside the flash-attention kernel between 1k and 262k cells on the H200). A loop of the same shape as the pinned
// tree's set_input_kq_mask_impl (src/llama-kv-cache.cpp) for one token of one sequence, causal, M-RoPE, no SWA or
// ALiBi: per cell an empty check (pos == -1), a 256-bit sequence-set test, the position compare, the near-the-batch
// bookkeeping and one f16 write, plus patch 0001's per-step order vector. Not the library's own code (it is internal
// to libllama), so it bounds the cost rather than measuring it.
//   g++ -O3 -o /tmp/kq_mask_host benchmarks/kq_mask_host.cpp && /tmp/kq_mask_host 262144
#include <bitset>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char ** argv) {
    const int n = argc > 1 ? std::atoi(argv[1]) : 262144;
    if (n <= 0) { std::fprintf(stderr, "usage: kq_mask_host N_CELLS\n"); return 2; }
    std::vector<int32_t> pos(n);
    std::vector<std::bitset<256>> seq(n);  // LLAMA_MAX_SEQ bits per cell, as llama_kv_cells keeps them
    for (int i = 0; i < n; ++i) { pos[i] = i; seq[i].set(0); }
    std::vector<uint16_t> mask(n);
    const int32_t p1 = n;            // the decoded token's position: every cached cell is in its past
    const int32_t seq_pos_min = n;
    std::vector<uint32_t> near;  near.reserve(64);
    double best_us = 1e30;
    for (int rep = 0; rep < 50; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        near.clear();
        std::vector<int32_t> order(n, -1);  // patch 0001: the ubatch index of each cell's token, -1 for older cells
        for (int j = 0; j < n; ++j) {
            bool keep = pos[j] != -1 && seq[j].test(0);
            if (keep) {
                const int32_t p0 = pos[j];
                if (p0 + 32 >= seq_pos_min) near.push_back(j);
                keep = p0 < p1 || (p0 == p1 && order[j] <= 0);
            }
            mask[j] = keep ? 0x0000 : 0xfc00;  // f16 0 / -inf
        }
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        best_us = us < best_us ? us : best_us;
        asm volatile("" : : "r"(mask.data()) : "memory");
    }
    std::printf("cells %d: %.0f us per step at best (%.2f ns per cell)\n", n, best_us, best_us * 1e3 / n);
    return 0;
}

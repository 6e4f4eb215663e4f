// Where one decode step's time goes as the context deepens (issue 24) and as sequences are added (issue 28), through
// libllama's C API, no server: built and run by benchmarks/gpu/decode_step.sh on the device.
//
// One context with llama-server's shape for a recipe (n_seq_max slots over a unified pool of slots x ctx cells,
// -b 2048 -ub 512, flash attention, the K/V type given). N sequences are prefilled to each depth in turn (random token
// ids) and then decoded together, one token each per step, greedy on the host. Per (N, depth), medians over the
// steps of:
//   host_ms   the time inside llama_decode, which returns once the graph is launched (batch split, KV slot search,
//             the KQ-mask fill, graph reuse or rebuild, the launch itself);
//   step_ms   llama_decode + llama_synchronize: the whole step as the GPU ends it;
//   argmax_ms the greedy pick over each sequence's logits on the host.
// With --sampler-top-k K each sequence gets, in the graph (llama_set_sampler), the chain llama-server builds for a
// greedy request with that top_k and the default parameters (common_sampler_init: penalties, DRY, top-n-sigma,
// top-k, typical, top-p, min-p, XTC, temperature 0, dist; common/sampling.cpp, common/common.h), and the token comes
// from llama_get_sampled_token_ith: step_ms then holds the sampling the server's `backend_sampling` adds to the GPU
// step, and argmax_ms is the read of the sampled token. Set against a run without it, this splits the served step's
// extra time into the GPU's part and the server thread's (issue 28). --sampler-greedy-chain instead attaches the chain
// series patch 0023 builds for a greedy request (temperature 0, then greedy; its greedy maps the argmax through the
// temperature's one candidate: on a runtime without it the sampled ids are wrong and only the times mean anything).
// With --logits-out FILE (one --seqs value, one depth, no sampler) the timed steps feed fixed random tokens instead of
// the greedy ones and the logits of every sequence at each of them go to FILE (int32 n_seq, n_vocab, n_steps, then
// n_steps x n_seq x n_vocab float32): two runs of one build, a kernel on and off through its variable, then compare
// logit for logit on the same inputs (benchmarks/gpu/logits_compare.py).
// With --cuda-range the timed steps sit between cuProfilerStart/Stop, so `ncu --profile-from-start off` sees those
// kernels only (the prefill is not profiled). One JSON object per (N, depth) on stdout.
//
//   decode_step -m MODEL [--kv q8_0] [--depths 1024,262144] [--seqs 1,8] [--ctx 262144] [--slots 4] [--steps 24]
//               [--sampler-top-k K | --sampler-greedy-chain] [--logits-out FILE] [--cuda-range] [--tag T]
#include "llama.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

static std::vector<int> ints(const char * s) {
    std::vector<int> out;
    for (const char * p = s; *p;) {
        char * end = nullptr;
        out.push_back((int) std::strtol(p, &end, 10));
        p = (*end == ',') ? end + 1 : end;
        if (end == p && *p) break;
    }
    return out;
}

static double median_ms(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : 1e3 * v[v.size() / 2];
}

static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char ** argv) {
    std::string model_path, kv = "q8_0", tag, logits_path;
    std::vector<int> depths = {1024, 32768, 131072, 262144}, seqs = {1};
    int ctx_per_slot = 262144, slots = 4, steps = 24, sampler_top_k = -1;
    bool greedy_chain = false;
    bool cuda_range = false;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto next = [&]() -> const char * {
            if (i + 1 >= argc) { std::fprintf(stderr, "decode_step: %s needs a value\n", a.c_str()); std::exit(2); }
            return argv[++i];
        };
        if (a == "-m") model_path = next();
        else if (a == "--kv") kv = next();
        else if (a == "--depths") depths = ints(next());
        else if (a == "--seqs") seqs = ints(next());
        else if (a == "--ctx") ctx_per_slot = std::atoi(next());
        else if (a == "--slots") slots = std::atoi(next());
        else if (a == "--steps") steps = std::atoi(next());
        else if (a == "--sampler-top-k") sampler_top_k = std::atoi(next());
        else if (a == "--sampler-greedy-chain") greedy_chain = true;
        else if (a == "--logits-out") logits_path = next();
        else if (a == "--cuda-range") cuda_range = true;
        else if (a == "--tag") tag = next();
        else { std::fprintf(stderr, "decode_step: unknown argument %s\n", a.c_str()); return 2; }
    }
    const ggml_type type_kv = kv == "f16" ? GGML_TYPE_F16 : kv == "q4_0" ? GGML_TYPE_Q4_0 : kv == "q8_0" ? GGML_TYPE_Q8_0
                                                                                                      : GGML_TYPE_COUNT;
    if (model_path.empty() || type_kv == GGML_TYPE_COUNT || depths.empty() || seqs.empty() || steps < 1) {
        std::fprintf(stderr, "usage: decode_step -m MODEL [--kv f16|q8_0|q4_0] [--depths D,...] [--seqs N,...]\n");
        return 2;
    }
    if (!logits_path.empty() && (seqs.size() != 1 || depths.size() != 1 || sampler_top_k >= 0 || greedy_chain)) {
        std::fprintf(stderr, "decode_step: --logits-out takes one --seqs value, one depth and no --sampler-top-k\n");
        return 2;
    }
    // the CUDA driver's profiler range (ncu honours it; the driver library is always shared, while ggml-cuda may
    // link the CUDA runtime statically)
    using prof_fn = int (*)();
    prof_fn prof_start = nullptr, prof_stop = nullptr;
    if (cuda_range) {
        void * cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        prof_start = cuda ? (prof_fn) dlsym(cuda, "cuProfilerStart") : nullptr;
        prof_stop  = cuda ? (prof_fn) dlsym(cuda, "cuProfilerStop") : nullptr;
        if (!prof_start || !prof_stop) { std::fprintf(stderr, "decode_step: no cuProfilerStart here\n"); return 2; }
    }
    llama_log_set([](ggml_log_level level, const char * text, void *) {
        if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
    }, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 999;
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mp);
    if (!model) { std::fprintf(stderr, "decode_step: cannot load %s\n", model_path.c_str()); return 2; }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    const int lo = std::min(1000, n_vocab / 2), hi = std::min(n_vocab, 150000) - 1;

    for (int n_seq : seqs) {
        llama_context_params cp = llama_context_default_params();
        const int n_slots = std::max(slots, n_seq);
        cp.n_ctx = (uint32_t) ((int64_t) ctx_per_slot * n_slots);
        cp.n_batch = 2048;
        cp.n_ubatch = 512;
        cp.n_seq_max = n_slots;
        cp.kv_unified = true;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
        cp.type_k = cp.type_v = type_kv;
        cp.n_threads = cp.n_threads_batch = 8;
        llama_context * ctx = llama_init_from_model(model, cp);
        if (!ctx) { std::fprintf(stderr, "decode_step: cannot create the context\n"); return 2; }
        // the server's chain for a greedy request (the defaults of common_params_sampling, temperature 0, seed 0)
        std::vector<llama_sampler *> chains;
        if (greedy_chain) {
            for (int q = 0; q < n_seq; q++) {
                llama_sampler * c = llama_sampler_chain_init(llama_sampler_chain_default_params());
                llama_sampler_chain_add(c, llama_sampler_init_temp_ext(0.0f, 0.0f, 1.0f));
                llama_sampler_chain_add(c, llama_sampler_init_greedy());
                if (!llama_set_sampler(ctx, q, c)) {
                    std::fprintf(stderr, "decode_step: the sampler chain could not go into the graph\n");
                    return 2;
                }
                chains.push_back(c);
            }
        } else if (sampler_top_k >= 0) {
            const llama_vocab * vocab = llama_model_get_vocab(model);
            const char * breakers[] = {"\n", ":", "\"", "*"};
            for (int q = 0; q < n_seq; q++) {
                llama_sampler * c = llama_sampler_chain_init(llama_sampler_chain_default_params());
                llama_sampler_chain_add(c, llama_sampler_init_penalties(n_vocab, 64, 1.0f, 0.0f, 0.0f));
                llama_sampler_chain_add(c, llama_sampler_init_dry(vocab, 0.0f, 1.75f, 2, 64, breakers, 4));
                llama_sampler_chain_add(c, llama_sampler_init_top_n_sigma(-1.0f));
                llama_sampler_chain_add(c, llama_sampler_init_top_k(sampler_top_k));
                llama_sampler_chain_add(c, llama_sampler_init_typical(1.0f, 0));
                llama_sampler_chain_add(c, llama_sampler_init_top_p(0.95f, 0));
                llama_sampler_chain_add(c, llama_sampler_init_min_p(0.05f, 0));
                llama_sampler_chain_add(c, llama_sampler_init_xtc(0.0f, 0.10f, 0, 0));
                llama_sampler_chain_add(c, llama_sampler_init_temp_ext(0.0f, 0.0f, 1.0f));
                llama_sampler_chain_add(c, llama_sampler_init_dist(0));
                if (!llama_set_sampler(ctx, q, c)) {
                    std::fprintf(stderr, "decode_step: the sampler chain could not go into the graph\n");
                    return 2;
                }
                chains.push_back(c);
            }
        }
        llama_batch batch = llama_batch_init(2048, 0, 1);
        std::mt19937 rng(0);
        std::uniform_int_distribution<int> tok_dist(lo, hi);
        std::vector<int> n_past(n_seq, 0);
        std::vector<llama_token> toks(n_seq, lo);
        auto decode = [&]() {
            const int rc = llama_decode(ctx, batch);
            if (rc != 0) { std::fprintf(stderr, "decode_step: llama_decode returned %d\n", rc); std::exit(1); }
        };
        auto add = [&](llama_token t, int seq, int pos, bool out) {
            const int i = batch.n_tokens++;
            batch.token[i] = t; batch.pos[i] = pos; batch.n_seq_id[i] = 1; batch.seq_id[i][0] = seq;
            batch.logits[i] = out;
        };
        for (int d : depths) {
            const double t_pf = now();
            for (int q = 0; q < n_seq; q++) {
                while (n_past[q] < d) {
                    batch.n_tokens = 0;
                    const int n = std::min(2048, d - n_past[q]);
                    for (int i = 0; i < n; i++) add(tok_dist(rng), q, n_past[q] + i, i == n - 1);
                    decode();
                    n_past[q] += n;
                }
            }
            llama_synchronize(ctx);
            const double prefill_s = now() - t_pf;
            std::vector<double> host, step, pick;
            // --logits-out: a header, then each timed step's logits (the vector starts with the header's 3 words)
            std::vector<float> logits;
            if (!logits_path.empty()) logits.resize(3);
            auto one = [&](bool keep) {
                batch.n_tokens = 0;
                for (int q = 0; q < n_seq; q++) add(toks[q], q, n_past[q], true);
                const double t0 = now();
                decode();
                const double t1 = now();
                llama_synchronize(ctx);
                const double t2 = now();
                for (int q = 0; q < n_seq; q++) {
                    if (!chains.empty()) {
                        toks[q] = llama_get_sampled_token_ith(ctx, q);
                    } else {
                        const float * lg = llama_get_logits_ith(ctx, q);
                        if (keep && !logits.empty()) {
                            logits.insert(logits.end(), lg, lg + n_vocab);
                            toks[q] = tok_dist(rng);  // the same inputs in every run, whatever the logits
                        } else {
                            toks[q] = (llama_token) (std::max_element(lg, lg + n_vocab) - lg);
                        }
                    }
                    n_past[q]++;
                }
                const double t3 = now();
                if (keep) { host.push_back(t1 - t0); step.push_back(t2 - t0); pick.push_back(t3 - t2); }
            };
            for (int i = 0; i < 4; i++) one(false);  // warm-up: the graph for this n_kv is built and captured
            if (prof_start) prof_start();
            for (int i = 0; i < steps; i++) one(true);
            if (prof_stop) prof_stop();
            if (!logits.empty()) {
                const int32_t head[3] = {n_seq, n_vocab, steps};
                std::memcpy(logits.data(), head, sizeof(head));
                const std::string tmp = logits_path + ".tmp";
                FILE * f = std::fopen(tmp.c_str(), "wb");
                const bool ok = f && std::fwrite(logits.data(), sizeof(float), logits.size(), f) == logits.size();
                if (f) std::fclose(f);
                if (!ok || std::rename(tmp.c_str(), logits_path.c_str()) != 0) {
                    std::fprintf(stderr, "decode_step: cannot write %s\n", logits_path.c_str());
                    return 1;
                }
            }
            const double s = median_ms(step), p = median_ms(pick);
            std::printf("{\"tag\": \"%s\", \"kv\": \"%s\", \"seqs\": %d, \"depth\": %d, \"sampler_top_k\": %d, "
                        "\"greedy_chain\": %s, \"prefill_s\": %.2f, \"host_ms\": %.4f, \"step_ms\": %.4f, "
                        "\"argmax_ms\": %.4f, \"tok_s\": %.2f}\n", tag.c_str(), kv.c_str(), n_seq, d, sampler_top_k,
                        greedy_chain ? "true" : "false", prefill_s,
                        median_ms(host), s, p, 1e3 * n_seq / (s + p));
            std::fflush(stdout);
        }
        llama_batch_free(batch);
        for (int q = 0; q < (int) chains.size(); q++) llama_set_sampler(ctx, q, nullptr);
        llama_free(ctx);
        for (llama_sampler * c : chains) llama_sampler_free(c);
    }
    llama_model_free(model);
    return 0;
}

"""llama-server's per-token sampling on the host, at this model's vocabulary (docs/benchmarks.md, "Where the
batch-2…16 decode step goes").

    .venv/bin/python -m benchmarks.bench_host_sampling [--reps 300] [--json OUT.json]

Without `--backend-sampling`, llama-server samples every generating slot on its main thread after each decode
(tools/server/server-context.cpp, post_decode: one `common_sampler_sample` per slot), and the GPU waits meanwhile:
the decode synchronises first and the next batch is built after. Each sample fills a candidate array of the whole
vocabulary (common/sampling.cpp, `set_logits`) and runs the sampler chain over it. This measures that cost, the
same C code through libllama's sampler API (`llama_sampler_sample`, which fills the array the same way), on a tiny
random model with the real 248,144-token Qwen3.5 vocabulary: the chain a greedy request gets (temperature 0,
top_k 1, the server's other defaults) and the default chain (top_k 40). One thread, like the server's loop; the
figure scales with the number of streams, one sample per stream per step (per drafted round, 1 + accepted).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

_SILENT = None


def _model(work: Path) -> Path:
    from ggufbridge.convert import convert
    from ggufbridge.testkit.checkpoint import make_minicpmv47

    ckpt = make_minicpmv47(work / "ckpt", "tiny")  # the real Qwen3.5 vocabulary
    return convert(ckpt, work / "out", outtype="f32", mmproj=False, progress=False).path("target")


def _chain(L, n_vocab: int, top_k: int):
    """The server's default sampler order with its default values: penalties (off at 1.0), top_n_sigma (off),
    top_k, typical (off), top_p 0.95, min_p 0.05, temperature 0 (greedy), dist."""
    c = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    for s in (L.llama_sampler_init_penalties(n_vocab, 64, 1.0, 0.0, 0.0), L.llama_sampler_init_top_n_sigma(-1.0),
              L.llama_sampler_init_top_k(top_k), L.llama_sampler_init_typical(1.0, 1),
              L.llama_sampler_init_top_p(0.95, 1), L.llama_sampler_init_min_p(0.05, 1),
              L.llama_sampler_init_temp_ext(0.0, 0.0, 1.0), L.llama_sampler_init_dist(0)):
        L.llama_sampler_chain_add(c, s)
    return c


def measure(model: Path, reps: int) -> dict:
    import llama_cpp as L

    L.llama_backend_init()
    global _SILENT  # the callback must outlive the library's use of it
    _SILENT = L.llama_log_callback(lambda level, text, user_data: None)
    L.llama_log_set(_SILENT, None)
    m = L.llama_model_load_from_file(str(model).encode(), L.llama_model_default_params())
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_threads, cp.n_threads_batch = 256, 1, 1
    ctx = L.llama_init_from_model(m, cp)
    try:
        assert L.llama_decode(ctx, L.llama_batch_get_one((L.llama_token * 3)(1, 2, 3), 3)) == 0
        n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(m))
        out = {"n_vocab": n_vocab, "reps": reps}
        for name, top_k in (("greedy request (top_k 1)", 1), ("default chain (top_k 40)", 40)):
            chain = _chain(L, n_vocab, top_k)
            for _ in range(10):
                L.llama_sampler_sample(chain, ctx, -1)
            runs = []
            for _ in range(5):  # the median of five blocks: this machine is shared
                t0 = time.perf_counter()
                for _ in range(reps // 5):
                    L.llama_sampler_sample(chain, ctx, -1)
                runs.append(1000.0 * (time.perf_counter() - t0) / (reps // 5))
            L.llama_sampler_free(chain)
            out[name] = {"ms_per_sample": statistics.median(runs), "blocks_ms": runs}
        return out
    finally:
        L.llama_free(ctx)
        L.llama_model_free(m)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        res = measure(_model(Path(tmp)), a.reps)
    for name in ("greedy request (top_k 1)", "default chain (top_k 40)"):
        ms = res[name]["ms_per_sample"]
        print(f"{name}: {ms:.3f} ms per sample over {res['n_vocab']:,} tokens; "
              f"{', '.join(f'{n} streams {n * ms:.1f} ms' for n in (4, 8, 16))} of host time per decode step")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

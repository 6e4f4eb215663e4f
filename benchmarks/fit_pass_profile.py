"""Where one probe pass of `quantize --fit-bytes` spends its time per token: llama.cpp's decode with the copy of
the logits out of it, and the KL against a top-K reference on the host, on one thread and on the pool the probes
use (ggufbridge.compare.metrics.chunk_stats_threaded). Two passes over the calibration rows on one loaded model:
the first carries the warm-up (the cost model counts it once per pass), the second is the steady rate.

    python -m benchmarks.fit_pass_profile SRC.gguf [--ctx 256] [--threads N] [--gpu-layers -1]

Figures in docs/quant.md ("With one GPU, measured"); on the device after `benchmarks/device.sh fit-scaling` has
built the runtime and the sources (benchmarks/gpu/fit_scaling.sh's layout: $WORK/fit/L4-E256-real/src-BF16.gguf).
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    from ggufbridge.compare.metrics import chunk_stats, chunk_stats_threaded, default_threads, topk_form
    from ggufbridge.compare.run import default_chunk
    from ggufbridge.compare.sources import GGUFSource
    from ggufbridge.quant.optimise import default_calibration
    from ggufbridge.quant.sensitivity import calibration_rows

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--gpu-layers", type=int, default=-1)
    a = ap.parse_args(argv)
    rows = calibration_rows(a.src, default_calibration(), a.ctx, 16)
    t0 = time.perf_counter()
    s = GGUFSource(a.src, n_ctx=a.ctx, chunk=a.ctx, n_gpu_layers=a.gpu_layers, n_threads=a.threads)
    print(f"{len(rows)} rows, {sum(len(r.ids) for r in rows)} tokens; load {time.perf_counter() - t0:.2f} s",
          flush=True)
    chunk = default_chunk(s.vocab_size, a.ctx)
    with ThreadPoolExecutor(a.threads) as pool:
        for rep in ("first (warm-up)", "second"):
            ev = kl_pool = kl_one = 0.0
            n = n_one = 0
            rng = np.random.default_rng(0)
            for i, row in enumerate(rows):
                it, pos = s.chunks(i, row, chunk), 0
                while True:
                    t = time.perf_counter()
                    c = next(it, None)
                    if c is None:
                        break
                    ev += time.perf_counter() - t
                    labels = row.labels[pos:pos + c.n]
                    ref = topk_form(c.logits, 64, labels, 32, rng)
                    t = time.perf_counter()
                    chunk_stats_threaded(ref, c, labels, pool)
                    kl_pool += time.perf_counter() - t
                    if rep == "second" and i < 2:  # one thread on the first rows only (it is slow)
                        t = time.perf_counter()
                        chunk_stats(ref, c, labels)
                        kl_one += time.perf_counter() - t
                        n_one += c.n
                    pos += c.n
                    n += c.n
            one = f", KL on one thread {1e3 * kl_one / n_one:.3f} ms/token" if n_one else ""
            print(f"{rep} pass: {n} tokens, decode + logits copy {1e3 * ev / n:.3f} ms/token, KL on {a.threads} "
                  f"threads {1e3 * kl_pool / n:.3f} ms/token{one}", flush=True)
    s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

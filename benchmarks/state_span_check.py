"""Series patch 0021 (`llama-context-state-save-span-copy`) checked and timed: how a sequence's state is saved once it
has decoded beside others in one unified KV pool, as llama-server's slots do.

N sequences get a prompt each, then decode together one token per step, so each sequence's cells interleave with the
others' (one cell range per generated token). Then every sequence's state is read with `llama_state_seq_get_data`
(what llama-server's prompt cache does to each idle slot when a task starts, `--cache-idle-slots`), once in a process
with the span copy on and once with `LLAMA_STATE_SPAN_GET=0` (one device copy per range, the pinned behaviour; the
variable is read once per process, hence two). The bytes must be equal; the times are printed beside each other.
On the CPU backend a "device copy" is a memcpy, so only the equality says something there; on a GPU the times do.

    LLAMA_CPP_LIB_PATH=BIN_DIR .venv/bin/python -m benchmarks.state_span_check MODEL.gguf [--seqs 4] [--prompt 32]
        [--steps 64] [--gpu]

BIN_DIR: a runtime of the series (scripts/build_runtime.sh); exit 1 if the bytes differ, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import subprocess
import sys
import time


def child(a) -> dict:
    import llama_cpp as L

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 999 if a.gpu else 0
    model = L.llama_model_load_from_file(a.model.encode(), mp)
    if not model:
        raise SystemExit(f"state_span_check: cannot load {a.model}")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    cp = L.llama_context_default_params()
    cp.n_ctx = a.seqs * (a.prompt + a.steps + 64)
    cp.n_batch = max(64, a.prompt)  # a prompt in one batch, split into ubatches of at most 512 (the recipes')
    cp.n_ubatch = min(cp.n_batch, 512)
    cp.n_seq_max, cp.kv_unified = a.seqs, True
    cp.n_threads = cp.n_threads_batch = 2
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise SystemExit("state_span_check: cannot create the context")
    batch = L.llama_batch_init(max(a.seqs, a.prompt), 0, 1)

    def decode(items):
        batch.n_tokens = len(items)
        for i, (seq, pos, tok) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, True
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit("state_span_check: llama_decode failed")

    for s in range(a.seqs):  # prompts one after another: each a run of cells
        decode([(s, p, (1000 + 7 * s + 13 * p) % n_vocab) for p in range(a.prompt)])
    for t in range(a.steps):  # then together: one cell each per step, interleaved
        decode([(s, a.prompt + t, (2000 + 11 * s + 17 * t) % n_vocab) for s in range(a.seqs)])
    L.llama_synchronize(ctx)
    digests, seconds, nbytes = [], [], 0
    for s in range(a.seqs):
        t0 = time.perf_counter()
        n = L.llama_state_seq_get_size(ctx, s)
        buf = (ctypes.c_uint8 * n)()
        got = L.llama_state_seq_get_data(ctx, buf, n, s)
        seconds.append(time.perf_counter() - t0)
        if got != n:
            raise SystemExit(f"state_span_check: sequence {s}: {got} of {n} bytes")
        digests.append(hashlib.sha256(bytes(buf)).hexdigest())
        nbytes += n
    return {"digests": digests, "save_ms": [1e3 * x for x in seconds], "bytes": nbytes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--seqs", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--gpu", action="store_true", help="offload every layer (a CUDA runtime)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.seqs < 2 or a.prompt < 1 or a.steps < 4:
        print("state_span_check: --seqs >= 2, --prompt >= 1 and --steps >= 4 (a sequence needs 4+ ranges)",
              file=sys.stderr)
        return 2
    if a.child:
        print(json.dumps(child(a)))
        return 0
    runs = {}
    for label, value in (("span copy", "1"), ("one copy per range", "0")):
        env = dict(os.environ, LLAMA_STATE_SPAN_GET=value)
        p = subprocess.run([sys.executable, __file__, "--child", *sys.argv[1:]], env=env, capture_output=True,
                           text=True)
        if p.returncode != 0:
            print(p.stderr[-2000:], file=sys.stderr)
            return p.returncode
        runs[label] = json.loads(p.stdout.strip().splitlines()[-1])
    a_run, b_run = runs["span copy"], runs["one copy per range"]
    same = a_run["digests"] == b_run["digests"]
    print(f"{a.seqs} sequences, {a.prompt}-token prompts, {a.steps} steps together; {a_run['bytes']} bytes saved")
    for label, r in runs.items():
        ms = sorted(r["save_ms"])
        print(f"  {label:20s} save per sequence: median {ms[len(ms) // 2]:.2f} ms, max {ms[-1]:.2f} ms")
    print("  bytes equal: " + ("yes" if same else "NO"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

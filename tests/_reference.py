"""Independent references for tests: each model run through its own library's public entry point, never through
ggufbridge.compare.

* transformers: `AutoModelForImageTextToText.from_pretrained(...)` and its full forward pass / `generate()`
  (compare's HFSource runs the decoder, then the LM head chunk by chunk, with eager attention);
* llama.cpp: llama-cpp-python's `Llama(logits_all=True)`, `eval()` and `scores`, and its `generate()` (compare's
  GGUFSource drives llama_decode itself, one chunk of positions at a time, and copies out only that chunk).

Tests use these where compare's own code is what is under test (its logits must equal these), and for greedy
decoding, which compare does not do. A bug in compare cannot hide behind them.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import numpy as np
from _cores import THREADS


def hf_model(model_dir, dtype: str = "float32"):
    import torch
    from transformers import AutoModelForImageTextToText

    with _quiet():
        return AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=getattr(torch, dtype)).eval()


def hf_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids])).logits[0]
    return out.float().numpy()


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()


def gguf_model(path: Path, n_ctx: int = 512):
    from llama_cpp import Llama

    return Llama(str(path), n_ctx=n_ctx, logits_all=True, verbose=False, n_threads=THREADS)


def gguf_logits(llm, ids: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def gguf_greedy(llm, ids: list[int], n: int) -> list[int]:
    llm.reset()
    out = []
    for tok in llm.generate(ids, top_k=1, temp=0.0, reset=True):
        out.append(tok)
        if len(out) == n:
            break
    return out


@contextlib.contextmanager
def _quiet():
    from transformers.utils import logging as hf_logging

    old = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    prev = logging.root.manager.disable
    try:
        yield
    finally:
        hf_logging.set_verbosity(old)
        logging.disable(prev)

"""Teacher-forced logits of the same token ids from transformers (the reference) and from llama.cpp (the GGUF),
and the two figures the foundation promises: KL(reference ‖ GGUF) and top-1 agreement per position."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ggufbridge.compare.metrics import log_softmax


@dataclass
class Parity:
    kl: np.ndarray  # per position
    top1: np.ndarray  # bool per position
    max_abs: float

    @property
    def kl_mean(self) -> float:
        return float(self.kl.mean())

    @property
    def top1_rate(self) -> float:
        return float(self.top1.mean())


def parity(ref: np.ndarray, test: np.ndarray) -> Parity:
    lp, lq = log_softmax(ref), log_softmax(test)
    kl = (np.exp(lp) * (lp - lq)).sum(-1)
    return Parity(kl, ref.argmax(-1) == test.argmax(-1), float(np.abs(ref - test).max()))


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


def hf_router_margins(model, ids: list[int]) -> np.ndarray:
    """Per position, the smallest gap over layers between the k-th and (k+1)-th routed expert's probability.

    A gap near zero is a routing tie: float rounding differences between two correct implementations pick
    different experts there, so such positions say nothing about the conversion."""
    import torch

    lm = model.model.language_model
    k = lm.config.num_experts_per_tok
    inputs, hooks = {}, []
    for i, layer in enumerate(lm.layers):
        hooks.append(layer.mlp.gate.register_forward_hook(lambda m, a, o, i=i: inputs.__setitem__(i, a[0].detach())))
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    gaps = []
    for i, layer in enumerate(lm.layers):
        x = inputs[i].reshape(len(ids), -1).float()
        with torch.no_grad():
            p = torch.softmax(x @ layer.mlp.gate.weight.float().T, -1).sort(-1, descending=True).values
        gaps.append((p[:, k - 1] - p[:, k]).numpy())
    return np.min(gaps, axis=0)


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()


def gguf_model(path: Path, n_ctx: int = 512):
    from llama_cpp import Llama

    return Llama(str(path), n_ctx=n_ctx, logits_all=True, verbose=False, n_threads=min(4, os.cpu_count() or 1))


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
    import logging

    from transformers.utils import logging as hf_logging

    old = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    prev = logging.root.manager.disable
    try:
        yield
    finally:
        hf_logging.set_verbosity(old)
        logging.disable(prev)

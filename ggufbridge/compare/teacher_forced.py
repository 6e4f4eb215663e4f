"""One token sequence, teacher-forced through two of compare's sources: the logits at every position, the figures
per position (KL, top-1, largest |Δlogit|), and where the reference's MoE router is tied.

This is what `ggufbridge demo` prints and what the conversion parity tests assert on. It adds no second way of
computing logits or KL: the logits come from `compare.sources` (transformers through HFSource, llama.cpp through
GGUFSource's chunked decode) and the KL and top-1 from `compare.metrics.chunk_stats`, the code `compare` reports
with. Only the router margins are new here: they need the transformers model itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggufbridge.compare.evalset import Row
from ggufbridge.compare.metrics import Dense, chunk_stats
from ggufbridge.compare.sources import Source


def logits(source: Source, ids: list[int]) -> np.ndarray:
    """[len(ids), vocab] float logits of `source` over `ids`, as compare reads them (chunk by chunk)."""
    chunk = min(len(ids), getattr(source, "chunk", len(ids)))
    parts = [c.logits for c in source.chunks(0, Row(tuple(int(i) for i in ids)), chunk)]
    return np.concatenate(parts).astype(np.float32, copy=False)


@dataclass
class Parity:
    kl: np.ndarray  # KL(reference ‖ candidate) per position
    top1: np.ndarray  # bool per position: the same argmax
    max_abs: float  # largest |logit difference| anywhere

    @property
    def kl_mean(self) -> float:
        return float(self.kl.mean())

    @property
    def top1_rate(self) -> float:
        return float(self.top1.mean())


def parity(ref: np.ndarray, cand: np.ndarray) -> Parity:
    """Per-position KL and top-1 agreement of two [n, vocab] logit arrays of the same positions."""
    stats = chunk_stats(Dense(ref), Dense(cand), np.full(ref.shape[0], -1))
    return Parity(stats["kl"], stats["top1"].astype(bool), float(np.abs(ref - cand).max()))


def router_margins(model, ids: list[int]) -> np.ndarray:
    """Per position, the smallest gap over layers between the k-th and (k+1)-th routed expert's probability in a
    transformers MiniCPM-V 4.7 `model` (HFSource.model).

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

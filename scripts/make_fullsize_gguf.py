#!/usr/bin/env python3
"""A full-size-shaped, random-weight MiniCPM-V 4.7 35B-A3B text target + DSpark draft, written straight as GGUF.

For speed measurements at the real shapes (issue 8) where a BF16 intermediate (~70 GB) does not fit the disk
or the time: quantised blocks are assembled from random bytes with sane fp16 scales, so no full-precision copy
ever exists. The tensor types follow llama-quantize's Q4_K_M choices for this model (src/llama-quant.cpp:
output Q6_K; attn_v / attn_qkv / ffn_down* Q6_K on the `use_more_bits` layers, Q4_K elsewhere; routers,
conv1d and 1-D weights F32), or one type for every matrix (`--quant q8_0|q4_0`). The draft follows the
upstream DSpark layout (ggufbridge.arch.dspark) in F16, the converter's default draft type.

Weights are noise: outputs are meaningless and drafts are rejected. Block contents repeat (a pool of random
blocks is reused), which changes nothing for speed: every tensor still has its own memory.

    python scripts/make_fullsize_gguf.py OUT_DIR --tokenizer DIR [--quant q4_k_m] [--no-draft]

OUT_DIR gets target.gguf, draft.gguf and a manifest.json, so `ggufbridge bench OUT_DIR` runs on it.
TOKENIZER DIR holds tokenizer.json (+ tokenizer_config.json), e.g. from ggufbridge.synthetic.vocab.write_tokenizer.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np


from ggufbridge.arch import dspark as ds
from ggufbridge.arch import qwen35moe as qm
from ggufbridge.arch.plan import ConversionPlan, PlannedTensor
from ggufbridge.ggufio.manifest import MANIFEST, ManifestEntry, write_manifest
from ggufbridge.ggufio.tokenizer import add_vocab, read_vocab
from ggufbridge.ggufio.writer import RAW, write_gguf

# Block layouts (ggml-common.h): bytes per block of 256 (K-quants) or 32 values, and where the fp16 scales sit.
QK = {"Q4_K": 256, "Q6_K": 256, "Q8_0": 32, "Q4_0": 32}
BLOCK_BYTES = {"Q4_K": 144, "Q6_K": 210, "Q8_0": 34, "Q4_0": 18}
WEIGHT_STD = 0.025  # ~1/sqrt(2048): keeps activations at a natural scale through 40 layers
# llama_ftype of the file types written here (general.file_type)
FILE_TYPE = {"q4_k_m": 15, "q8_0": 7, "q4_0": 2}


@dataclass(frozen=True)
class Shape:
    """MiniCPM-V 4.7 35B-A3B text tower (issue 2) and its DSpark drafter (issue 5)."""

    layers: str = "LLLF" * 10  # 30 gated delta-net + 10 full attention
    hidden: int = 2048
    heads: int = 16
    kv_heads: int = 2
    head_dim: int = 256
    experts: int = 256
    top_k: int = 8
    expert_ff: int = 512
    shared_ff: int = 512
    lin_k_heads: int = 16
    lin_v_heads: int = 32
    lin_dim: int = 128  # the CUDA gated-delta-net kernel supports 16/32/64/128 only
    conv: int = 4
    vocab: int = 248144
    ctx: int = 262144
    # draft (heads and ff are not fixed by the issue: Qwen3 DFlash-style values)
    d_layers: int = 5
    d_heads: int = 16
    d_kv_heads: int = 2
    d_head_dim: int = 256
    d_ff: int = 6144
    d_block: int = 15
    d_taps: tuple[int, ...] = (3, 11, 19, 27, 35)  # HF ids; the GGUF stores +1
    d_rank: int = 256
    d_mask: int = 248076


SMOKE = Shape(layers="LLLF", hidden=256, heads=2, kv_heads=1, head_dim=256, experts=16, top_k=4, expert_ff=256,
              shared_ff=256, lin_k_heads=2, lin_v_heads=4, lin_dim=64, d_layers=1, d_heads=2, d_kv_heads=1,
              d_ff=512, d_taps=(0, 2), d_rank=32)


class BlockPool:
    """Random blocks of one type with fixed, sane scales; tensors take consecutive runs of them (wrapping)."""

    def __init__(self, qtype: str, n_blocks: int, rng: np.random.Generator):
        nb = BLOCK_BYTES[qtype]
        b = rng.integers(0, 256, size=(n_blocks, nb), dtype=np.uint8)
        if qtype == "Q4_K":
            # d, dmin (fp16) | 12 bytes of 6-bit scales/mins, packed so every sub-block has scale = min = 16
            # (get_scale_min_k4) | 128 bytes of nibbles. w = 16·d·q − 16·dmin with q uniform in 0..15.
            d = WEIGHT_STD / (16 * 4.61)
            b[:, 0:2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
            b[:, 2:4] = np.frombuffer(np.float16(7.5 * d).tobytes(), np.uint8)
            b[:, 4:12] = 16 | (1 << 6)
            b[:, 12:16] = 0
        elif qtype == "Q6_K":
            # ql[128] qh[64] | int8 scales[16] = 16 | d (fp16). w = d·16·(q − 32), q uniform in 0..63.
            b[:, 192:208] = 16
            b[:, 208:210] = np.frombuffer(np.float16(WEIGHT_STD / (16 * 18.5)).tobytes(), np.uint8)
        elif qtype == "Q8_0":
            b[:, 0:2] = np.frombuffer(np.float16(WEIGHT_STD / 74).tobytes(), np.uint8)
        elif qtype == "Q4_0":
            # w = d·(q − 8): nibbles drawn from 1..15 so the weights are centred
            lo, hi = (rng.integers(1, 16, size=(n_blocks, 16), dtype=np.uint8) for _ in range(2))
            b[:, 2:18] = lo | (hi << 4)
            b[:, 0:2] = np.frombuffer(np.float16(WEIGHT_STD / 4.32).tobytes(), np.uint8)
        self.flat = b.reshape(-1)
        self.nb = nb
        self.cursor = 0

    def take(self, n_values: int, qk: int) -> np.ndarray:
        need = n_values // qk * self.nb
        out = np.empty(need, np.uint8)
        done = 0
        while done < need:
            start = self.cursor % self.flat.size
            k = min(need - done, self.flat.size - start)
            out[done:done + k] = self.flat[start:start + k]
            done += k
            self.cursor = start + k + 7 * self.nb  # a different run next time
        return out


def use_more_bits(i: int, n: int) -> bool:
    """llama-quantize's choice of the layers that get more bits in Q4_K_M / Q5_K_M."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def target_type(name: str, shape: tuple, quant: str, n_layer: int) -> str:
    if len(shape) == 1 or shape[0] == 1 or "ffn_gate_inp" in name or "ssm_conv1d" in name or "_norm" in name:
        return "F32"  # what llama-quantize never quantises (and the runtime needs element-wise in F32)
    if quant != "q4_k_m":
        return quant.upper()
    if name == "output.weight":
        return "Q6_K"
    # attn_qkv counts as attn_v there; each layer has exactly one of them, so the counter is the layer index
    if any(k in name for k in ("attn_v.", "attn_qkv.", "ffn_down")):
        il = int(name.split(".")[1])
        return "Q6_K" if use_more_bits(il, n_layer) else "Q4_K"
    return "Q4_K"


def f32_values(name: str, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    n = int(np.prod(shape))
    if name.endswith("ssm_a"):
        return -np.exp(rng.uniform(-2.0, 1.0, n)).astype(np.float32).reshape(shape)  # -exp(A_log)
    if "norm" in name:
        return np.ones(shape, np.float32)
    if name.endswith("ssm_dt.bias"):
        return rng.uniform(-1.0, 1.0, n).astype(np.float32).reshape(shape)
    if "ssm_conv1d" in name:
        return (rng.standard_normal(n) * 0.5).astype(np.float32).reshape(shape)
    return (rng.standard_normal(n) * WEIGHT_STD).astype(np.float32).reshape(shape)


def target_plan(s: Shape, quant: str, vocab, seed: int) -> ConversionPlan:
    p = qm.TextParams(
        vocab_size=s.vocab, hidden=s.hidden, n_layer=len(s.layers), n_head=s.heads, n_head_kv=s.kv_heads,
        head_dim=s.head_dim, n_rot=s.head_dim // 4, sections=(11, 11, 10, 0) if s.head_dim >= 64 else (1, 1, 0, 0),
        rope_theta=10_000_000.0, rms_eps=1e-6, ctx_len=s.ctx, recurrent=tuple(c == "L" for c in s.layers),
        n_expert=s.experts, n_expert_used=s.top_k, ff_exp=s.expert_ff, ff_shexp=s.shared_ff, conv_kernel=s.conv,
        dk=s.lin_dim, gk=s.lin_k_heads, hv=s.lin_v_heads, tied=False, mtp_layers=0)
    plan = ConversionPlan(qm.ARCH)
    plan.str("general.name", "MiniCPM-V 4.7 35B-A3B shape, random weights")
    plan.u32("general.file_type", FILE_TYPE[quant])
    # the converter's own planner, fed a shape-only checkpoint: its KVs, tensor names and GGUF shapes are kept
    shapes = ConversionPlan(qm.ARCH)
    qm.plan_text(shapes, p, _FakeRefs(p), "", "lm_head.weight")
    plan.kvs += shapes.kvs
    add_vocab(plan, vocab)

    rng = np.random.default_rng(seed)
    pools: dict[str, BlockPool] = {}
    for t in shapes.tensors:
        qt = target_type(t.name, t.shape, quant, p.n_layer)
        plan.tensors.append(_tensor(t.name, t.shape, qt, pools, rng))
    return plan


class _FakeRefs(dict):
    """Stand-in checkpoint: every tensor the converter asks for exists, per expert, with the shape it expects."""

    class Ref:
        def __init__(self, name, shape):
            self.name, self.shape, self.dtype, self.nbytes = name, tuple(shape), "F32", 0

        def read(self):
            raise RuntimeError("shape-only reference")

    def __init__(self, p: qm.TextParams):
        super().__init__()
        self.p = p
        self.glob = {r.source: r.shape for r in qm.GLOBAL}
        self.layer = {r.source: r.shape for r in qm.EVERY_LAYER + qm.FULL_ATTENTION + qm.LINEAR_ATTENTION}

    def _shape(self, name):
        p = self.p
        if name == "lm_head.weight":
            return (p.vocab_size, p.hidden)
        if name in self.glob:
            return self.glob[name](p)
        m = re.fullmatch(r"layers\.\d+\.(.+)", name)
        if not m:
            return None
        rest = m.group(1)
        if rest in self.layer:
            return self.layer[rest](p)
        e = re.fullmatch(r"mlp\.experts\.\d+\.(gate|up|down)_proj\.weight", rest)
        if e:
            return (p.hidden, p.ff_exp) if e.group(1) == "down" else (p.ff_exp, p.hidden)
        return None

    def __contains__(self, name):
        return self._shape(name) is not None

    def get(self, name, default=None):
        shape = self._shape(name)
        return default if shape is None else self.Ref(name, shape)

    def __getitem__(self, name):
        ref = self.get(name)
        if ref is None:
            raise KeyError(name)
        return ref


def _tensor(name: str, shape: tuple, qt: str, pools: dict, rng) -> PlannedTensor:
    if qt == "F32":
        vals = f32_values(name, shape, rng)
        return PlannedTensor(name, shape, [], lambda v=vals: (v, "F32"), force_f32=True, ggml_type="F32")
    if qt not in pools:
        pools[qt] = BlockPool(qt, (64 << 20) // BLOCK_BYTES[qt], rng)
    n = int(np.prod(shape))
    if shape[-1] % QK[qt]:
        raise SystemExit(f"{name}: row length {shape[-1]} is not a multiple of {qt}'s block {QK[qt]}")
    return PlannedTensor(name, shape, [], lambda: (pools[qt].take(n, QK[qt]), RAW), ggml_type=qt)


def draft_plan(s: Shape, target: ConversionPlan, seed: int) -> ConversionPlan:
    """DSpark draft in F16 (the converter's default draft type) through the converter's own tables."""
    p = ds.DraftParams(
        vocab_size=s.vocab, draft_vocab_size=s.vocab, hidden=s.hidden, n_layer=s.d_layers, n_head=s.d_heads,
        n_head_kv=s.d_kv_heads, head_dim=s.d_head_dim, n_rot=None, ff=s.d_ff, rms_eps=1e-6,
        rope_theta=10_000_000.0, ctx_len=s.ctx, block_size=s.d_block, target_layer_ids=s.d_taps,
        mask_token_id=s.d_mask, sample_from_anchor=True, causal=None, markov_rank=s.d_rank)
    rng = np.random.default_rng(seed + 1)
    plan = ConversionPlan(ds.ARCH)
    plan.str("general.name", "DSpark draft shape, random weights")
    specs = [(r.gguf, r.shape(p)) for r in ds.GLOBAL + ds.CONFIDENCE]
    specs += [(f"blk.{i}.{r.gguf}", r.shape(p)) for i in range(s.d_layers) for r in ds.EVERY_LAYER]
    for name, shape in specs:
        def build(shape=shape, name=name):
            if name.endswith("norm.weight"):
                return np.ones(shape, np.float32), "F32"
            if name == "conf_proj.bias":
                return np.full(shape, 0.5, np.float32), "F32"
            scale = 1.0 if name == "markov_w1.weight" else 1 / np.sqrt(shape[-1])
            return (rng.standard_normal(shape, dtype=np.float32) * scale), "F32"
        plan.tensors.append(PlannedTensor(name, tuple(shape), [], build, force_f32=len(shape) == 1))
    # the converter's own DSpark metadata (incl. the tokenizer copy from the target plan and the mask id)
    ds._add_metadata(plan, p, True, _MropeTarget(), target, None)
    return plan


class _MropeTarget:
    """What _add_metadata asks of the target folder: whether its RoPE is M-RoPE (MiniCPM-V 4.7's is)."""

    config = {"text_config": {"rope_parameters": {"mrope_section": [11, 11, 10]}}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--tokenizer", type=Path, required=True, help="folder with tokenizer.json")
    ap.add_argument("--quant", choices=sorted(FILE_TYPE), default="q4_k_m")
    ap.add_argument("--no-draft", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny hidden size / layer count, for a CPU check")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    s = SMOKE if a.smoke else Shape()
    a.out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    vocab = read_vocab(a.tokenizer, s.vocab)
    files = []
    tplan = target_plan(s, a.quant, vocab, a.seed)
    jobs = [("target", tplan, "target.gguf", a.quant.upper())]
    if not a.no_draft:
        jobs.append(("draft", draft_plan(s, tplan, a.seed), "draft.gguf", "F16"))
    for role, plan, fname, typ in jobs:
        w = write_gguf(plan, a.out_dir / fname, "f16")
        w.commit()
        files.append(ManifestEntry.of(role, a.out_dir / fname, w.nbytes, w.sha256, typ))
        print(f"{role}: {fname} {w.nbytes / 2**30:.2f} GiB {dict(sorted(w.types.items()))} "
              f"({time.time() - t0:.0f} s)", flush=True)
    # no checkpoint was converted: "source" (checkpoint file -> sha256) stays empty, the recipe goes beside it
    write_manifest(a.out_dir / MANIFEST, files, {}, extra={"synthetic": {
        "script": "make_fullsize_gguf.py", "shape": s.__dict__ | {"d_taps": list(s.d_taps)}, "quant": a.quant,
        "seed": a.seed}, "ggufbridge": "scripts"})
    return 0


if __name__ == "__main__":
    sys.exit(main())

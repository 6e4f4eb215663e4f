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

    python -m benchmarks.make_fullsize_gguf OUT_DIR --tokenizer DIR [--quant q4_k_m] [--no-draft]

OUT_DIR gets target.gguf, draft.gguf and a manifest.json, so `ggufbridge bench OUT_DIR` runs on it.
TOKENIZER DIR holds tokenizer.json (+ tokenizer_config.json), e.g. from ggufbridge.testkit.vocab.write_tokenizer.
"""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np


from ggufbridge.arch import dspark as ds
from ggufbridge.arch import qwen35moe as qm
from ggufbridge.ggufio.plan import ConversionPlan, PlannedTensor
from ggufbridge.ggufio.manifest import MANIFEST, ManifestEntry, write_manifest
from ggufbridge.ggufio.tokenizer import add_vocab, read_vocab
from ggufbridge.ggufio.writer import RAW, write_gguf

# Block layouts (ggml-common.h): bytes per block of 256 (K-quants) or 32 values, and where the fp16 scales sit.
QK = {"Q3_K": 256, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "Q8_0": 32, "Q4_0": 32, "BF16": 1}
BLOCK_BYTES = {"Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "Q8_0": 34, "Q4_0": 18, "BF16": 2}
WEIGHT_STD = 0.025  # ~1/sqrt(2048): keeps activations at a natural scale through 40 layers
# llama_ftype of the file types written here (general.file_type)
FILE_TYPE = {"q4_k_m": 15, "q8_0": 7, "q4_0": 2, "q6_k": 18, "bf16": 32}
# a quantisation recipe (ggufbridge/recipes/quant/*.toml) names its file type by llama-quantize's name
RECIPE_FILE_TYPE = {"Q3_K_M": 12, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "Q8_0": 7}


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

    def text_params(self):
        """The text tower's conversion parameters (qwen35moe.TextParams) of this shape."""
        from ggufbridge.arch import qwen35moe as qm

        return qm.TextParams(
            vocab_size=self.vocab, hidden=self.hidden, n_layer=len(self.layers), n_head=self.heads,
            n_head_kv=self.kv_heads, head_dim=self.head_dim, n_rot=self.head_dim // 4,
            sections=(11, 11, 10, 0) if self.head_dim >= 64 else (1, 1, 0, 0), rope_theta=10_000_000.0,
            rms_eps=1e-6, ctx_len=self.ctx, recurrent=tuple(c == "L" for c in self.layers), n_expert=self.experts,
            n_expert_used=self.top_k, ff_exp=self.expert_ff, ff_shexp=self.shared_ff, conv_kernel=self.conv,
            dk=self.lin_dim, gk=self.lin_k_heads, hv=self.lin_v_heads, tied=False, mtp_layers=0)


SMOKE = Shape(layers="LLLF", hidden=256, heads=2, kv_heads=1, head_dim=256, experts=16, top_k=4, expert_ff=256,
              shared_ff=256, lin_k_heads=2, lin_v_heads=4, lin_dim=64, d_layers=1, d_heads=2, d_kv_heads=1,
              d_ff=512, d_taps=(0, 2), d_rank=32)


class BlockPool:
    """Random blocks of one type with fixed, sane scales; tensors take consecutive runs of them (wrapping)."""

    def __init__(self, qtype: str, n_blocks: int, rng: np.random.Generator):
        nb = BLOCK_BYTES[qtype]
        b = rng.integers(0, 256, size=(n_blocks, nb), dtype=np.uint8)
        if qtype in ("Q4_K", "Q5_K"):
            # d, dmin (fp16) | 12 bytes of 6-bit scales/mins, packed so every sub-block has scale = min = 16
            # (get_scale_min_k4) | the quants: Q4_K 128 bytes of nibbles (q uniform in 0..15), Q5_K qh | qs
            # (q uniform in 0..31). w = 16·d·q − 16·dmin, centred: dmin = d·qmax/2; q's std is 4.61 or 9.23
            q_std, half = {"Q4_K": (4.61, 7.5), "Q5_K": (9.23, 15.5)}[qtype]
            d = WEIGHT_STD / (16 * q_std)
            b[:, 0:2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
            b[:, 2:4] = np.frombuffer(np.float16(half * d).tobytes(), np.uint8)
            b[:, 4:12] = 16 | (1 << 6)
            b[:, 12:16] = 0
        elif qtype == "Q3_K":
            # hmask[32] qs[64] | 12 bytes of packed 6-bit scales (random: −32..31) | d (fp16).
            # w = d·s·(q − 4), q uniform in 0..7 (std 2.29), s roughly uniform (std ~18.5)
            b[:, 108:110] = np.frombuffer(np.float16(WEIGHT_STD / (18.5 * 2.29)).tobytes(), np.uint8)
        elif qtype == "BF16":
            w = (rng.standard_normal(n_blocks) * WEIGHT_STD).astype(np.float32)
            b = (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n_blocks, 2)
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


def file_type(quant: str) -> int:
    if quant in FILE_TYPE:
        return FILE_TYPE[quant]
    from ggufbridge.quant.mix import load_mix

    return RECIPE_FILE_TYPE[load_mix(quant).file_type]


def use_more_bits(i: int, n: int) -> bool:
    """llama-quantize's choice of the layers that get more bits in Q4_K_M / Q5_K_M."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def target_type(name: str, shape: tuple, quant: str, n_layer: int) -> str:
    if len(shape) == 1 or shape[0] == 1 or "ffn_gate_inp" in name or "ssm_conv1d" in name or "_norm" in name:
        return "F32"  # what llama-quantize never quantises (and the runtime needs element-wise in F32)
    if quant not in FILE_TYPE:  # a quantisation recipe: the type of the tensor's class
        from ggufbridge.quant.classes import classify
        from ggufbridge.quant.mix import load_mix

        cls = classify(name)
        return "F32" if cls.kept else load_mix(quant).type_of(cls.name)
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


@dataclass(frozen=True)
class Oracle:
    """A decisive target and a draft whose proposals are right at a controlled rate (the oracle pair of
    ggufbridge.testkit.dspark, at full shape). The target's greedy next token after t is succ(t), a cycle over
    `length` consecutive ids per cycle (every layer's output projection is zero, so the residual stream stays the
    one-hot token embedding; the head reads the predecessor's slot). The draft's Markov head proposes succ(t),
    except after every `period`-th token of cycle c (period 0: never), where it proposes succ(succ(t)): a round
    then accepts the tokens up to that point and no more, so the period sets the accepted tokens per round."""

    first: int = 20000            # ids first .. first + len(periods)·length − 1, plain-text tokens of the vocabulary
    length: int = 40
    periods: tuple[int, ...] = (1, 2, 4, 8, 20, 0)
    head_scale: float = 4.0
    markov_scale: float = 8.0

    def cycles(self) -> list[list[int]]:
        return [list(range(self.first + c * self.length, self.first + (c + 1) * self.length))
                for c in range(len(self.periods))]

    def succ(self, t: int) -> int:
        c, i = divmod(t - self.first, self.length)
        return self.first + c * self.length + (i + 1) % self.length

    def proposal(self, t: int) -> int:
        c, i = divmod(t - self.first, self.length)
        m = self.periods[c]
        return self.succ(self.succ(t)) if m and i % m == m - 1 else self.succ(t)


ZERO_OUT = ("attn_output.", "ssm_out.", "ffn_down_exps.", "ffn_down_shexp.")  # the layers' writes to the residual


def _q8_rows(rows: int, cols: int, hot: dict[int, tuple[int, float]]) -> np.ndarray:
    """Q8_0 bytes of a rows × cols matrix that is zero except one value per listed row (row → (col, value))."""
    nb = cols // 32
    b = np.zeros((rows, nb, 34), np.uint8)
    for r, (c, v) in hot.items():
        b[r, c // 32, 0:2] = np.frombuffer(np.float16(v / 127).tobytes(), np.uint8)
        b[r, c // 32, 2 + c % 32] = 127
    return b.reshape(-1)


def oracle_tensor(name: str, shape: tuple, s: Shape, o: Oracle, pt: PlannedTensor) -> PlannedTensor:
    """The oracle's version of one target tensor (same type and size, so the same speed), or `pt` unchanged."""
    if any(k in name for k in ZERO_OUT):
        nbytes = int(np.prod(shape)) // QK[pt.ggml_type] * BLOCK_BYTES[pt.ggml_type]
        return PlannedTensor(name, shape, [], lambda: (np.zeros(nbytes, np.uint8), RAW), ggml_type=pt.ggml_type)
    cyc = [t for c in o.cycles() for t in c]
    slot = {t: i for i, t in enumerate(cyc)}
    spare = s.hidden - 1  # every other token's embedding sits on a slot no head row reads
    if name == "token_embd.weight":
        hot = {t: (slot.get(t, spare), 1.0) for t in range(s.vocab)}
    elif name == "output.weight":
        hot = {o.succ(t): (slot[t], o.head_scale) for t in cyc}
    else:
        return pt
    return PlannedTensor(name, shape, [], lambda: (_q8_rows(s.vocab, s.hidden, hot), RAW), ggml_type="Q8_0")


def target_plan(s: Shape, quant: str, vocab, seed: int, oracle: Oracle | None = None) -> ConversionPlan:
    p = s.text_params()
    plan = ConversionPlan(qm.ARCH)
    plan.str("general.name", "MiniCPM-V 4.7 35B-A3B shape, random weights")
    plan.u32("general.file_type", file_type(quant))
    # the converter's own planner, fed a shape-only checkpoint: its KVs, tensor names and GGUF shapes are kept
    shapes = ConversionPlan(qm.ARCH)
    qm.plan_text(shapes, p, _FakeRefs(p), "", "lm_head.weight")
    plan.kvs += shapes.kvs
    add_vocab(plan, vocab)

    rng = np.random.default_rng(seed)
    pools: dict[str, BlockPool] = {}
    for t in shapes.tensors:
        qt = target_type(t.name, t.shape, quant, p.n_layer)
        pt = _tensor(t.name, t.shape, qt, pools, rng)
        plan.tensors.append(oracle_tensor(t.name, t.shape, s, oracle, pt) if oracle else pt)
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


def draft_plan(s: Shape, target: ConversionPlan, seed: int, oracle: Oracle | None = None) -> ConversionPlan:
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
            if oracle is not None and name in ("markov_w1.weight", "markov_w2.weight", "output_norm.weight"):
                return _oracle_draft(name, shape, oracle)
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


def _oracle_draft(name: str, shape: tuple, o: Oracle):
    """Markov head: w1[t] is the unit vector of t's slot (scaled), w2 maps that slot to the proposal's logit; a
    small final norm keeps the shared head's logits far below the Markov bias (markov_scale²)."""
    cyc = [t for c in o.cycles() for t in c]
    if name == "output_norm.weight":
        return np.full(shape, 0.01, np.float32), "F32"
    if len(cyc) > shape[1]:
        raise SystemExit(f"oracle: {len(cyc)} cycle tokens need a Markov rank >= {len(cyc)}, found {shape[1]}")
    w = np.zeros(shape, np.float32)
    for i, t in enumerate(cyc):
        w[t if name == "markov_w1.weight" else o.proposal(t), i] = o.markov_scale
    return w, "F32"


class _MropeTarget:
    """What _add_metadata asks of the target folder: whether its RoPE is M-RoPE (MiniCPM-V 4.7's is)."""

    config = {"text_config": {"rope_parameters": {"mrope_section": [11, 11, 10]}}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--tokenizer", type=Path, required=True, help="folder with tokenizer.json")
    ap.add_argument("--quant", default="q4_k_m",
                    help=f"{', '.join(sorted(FILE_TYPE))}, or a quantisation recipe (hq4, hq3, hq3m or a .toml)")
    ap.add_argument("--layers", type=int, default=None,
                    help="a proxy with this many layers (a multiple of 4: the real LLLF pattern), e.g. for a BF16 "
                         "file that would not fit the disk at 40")
    ap.add_argument("--oracle", action="store_true",
                    help="decisive target + draft accepted at controlled rates (class Oracle): drafting economics")
    ap.add_argument("--no-draft", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny hidden size / layer count, for a CPU check")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    s = SMOKE if a.smoke else Shape()
    if a.layers:
        if a.layers % 4:
            raise SystemExit(f"--layers: expected a multiple of 4, found {a.layers}")
        s = replace(s, layers="LLLF" * (a.layers // 4))
    # the smoke draft's Markov rank (32) holds 4 cycles of 8
    oracle = (Oracle(length=8, periods=(1, 2, 4, 0)) if a.smoke else Oracle()) if a.oracle else None
    a.out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    vocab = read_vocab(a.tokenizer, s.vocab)
    files = []
    tplan = target_plan(s, a.quant, vocab, a.seed, oracle)
    jobs = [("target", tplan, "target.gguf", a.quant.upper())]
    if not a.no_draft:
        jobs.append(("draft", draft_plan(s, tplan, a.seed, oracle), "draft.gguf", "F16"))
    for role, plan, fname, typ in jobs:
        w = write_gguf(plan, a.out_dir / fname, "f16")
        w.commit()
        files.append(ManifestEntry.of(role, a.out_dir / fname, w.nbytes, w.sha256, typ))
        print(f"{role}: {fname} {w.nbytes / 2**30:.2f} GiB {dict(sorted(w.types.items()))} "
              f"({time.time() - t0:.0f} s)", flush=True)
    # no checkpoint was converted: "source" (checkpoint file -> sha256) stays empty, the recipe goes beside it
    write_manifest(a.out_dir / MANIFEST, files, {}, extra={"synthetic": {
        "script": "ggufbridge.testkit.fullsize", "shape": s.__dict__ | {"d_taps": list(s.d_taps)}, "quant": a.quant,
        "seed": a.seed, "oracle": oracle.__dict__ if oracle else None}, "ggufbridge": "scripts"})
    return 0


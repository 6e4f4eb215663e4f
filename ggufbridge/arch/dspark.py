"""DSpark drafter (`Qwen3DSparkModel`: DFlash backbone + Markov head + confidence head) → `dflash` GGUF.

Facts and their sources: docs/formats.md, "Draft". The draft has no vocabulary of its own: it carries a full copy of
the target's tokenizer keys and borrows the target's token embeddings and LM head at run time unless it ships its
own. Every pairing rule is checked here, in `plan_draft`, before any output file is opened.

Norms: the drafter's RMSNorms are Qwen3's (`weight * x̂`, weights initialised to ones; HF qwen3/modeling_qwen3.py
Qwen3RMSNorm), and the runtime's dflash graph multiplies by the stored weight (`build_norm(..., LLM_NORM_RMS)` at
src/models/dflash.cpp:620, 633, 706, 725-726, 760, 797 → ggml_rms_norm then ggml_mul, src/llama-graph.cpp:1605,
1619), so they are copied as they are: no +1, unlike the Qwen3.5 target's offset norms.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ggufbridge.arch.config import Cfg, check
from ggufbridge.arch.plan import Row, check_leftover, planned
from ggufbridge.ggufio.plan import ConversionPlan, Note, PlannedTensor
from ggufbridge.checkpoint.layout import expect_family
from ggufbridge.checkpoint.model_dir import ModelDir
from ggufbridge.checkpoint.safetensors import TensorRef
from ggufbridge.errors import CheckpointError, ConfigError, PairingError, UnsupportedArchitecture
from ggufbridge.units import INT32_MAX
from ggufbridge.ggufio.names import (DFLASH_ARCH, DFLASH_BLOCK_SIZE, DFLASH_HAS_CONFIDENCE_HEAD,
                                    DFLASH_SAMPLE_FROM_ANCHOR, DFLASH_TARGET_LAYERS, Keys, key)


ARCH = DFLASH_ARCH
ARCHITECTURES = ("Qwen3DSparkModel",)
DEFAULT_BLOCK_SIZE = 16  # the DFlash default, used by the reference converter when the config has none
# Keys that may sit at the top level or inside `dflash_config` (the two upstream schemas).
COUPLING_KEYS = {"block_size": int, "target_layer_ids": list, "mask_token_id": int}
IGNORED_TENSORS = ("t2d",)  # the target→draft map: the runtime only uses d2t


@dataclass(frozen=True)
class DraftParams:
    vocab_size: int
    draft_vocab_size: int
    hidden: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int | None  # only for partial-rotary drafts
    ff: int
    rms_eps: float
    rope_theta: float
    ctx_len: int | None
    block_size: int
    target_layer_ids: tuple[int, ...]  # HF decoder-layer ids (0-based); the GGUF stores them + 1
    mask_token_id: int
    sample_from_anchor: bool
    causal: bool | None  # None: the config does not say (the runtime then uses non-causal block attention)
    markov_rank: int = 0  # markov_w1's columns: from the checkpoint's tensors, not the config (set by plan_draft)

    @classmethod
    def read(cls, cfg: Cfg, notes: list[Note]) -> "DraftParams":
        archs = cfg.get("architectures", list, None)
        if not archs or archs[0] not in ARCHITECTURES:
            raise UnsupportedArchitecture(
                f"{cfg.where}: draft architecture must be one of {list(ARCHITECTURES)}, found {archs!r}")
        if cfg.has("aux_hidden_state_layer_ids") or cfg.has("transformer_layer_config"):
            raise ConfigError(f"{cfg.where}: EAGLE3-style DSpark exports (aux_hidden_state_layer_ids) are not "
                              f"supported; expected target_layer_ids at the top level or in dflash_config")
        cfg.expect("markov_head_type", "vanilla", "vanilla")
        cfg.expect("hidden_act", "silu", "silu")
        check(not cfg.get("attention_bias", bool, False), f"{cfg.where}: attention_bias must be false, found true")
        nested = cfg.sub("dflash_config") if cfg.has("dflash_config") else None
        # sliding-window drafts need per-layer window metadata this converter does not write: refuse, not ignore
        swa = cfg.get("use_sliding_window", bool, False) or (nested is not None and nested.get("use_swa", bool, False))
        check(not swa, f"{cfg.where}: sliding-window attention must be off (use_sliding_window / use_swa false), "
                       f"found it on")
        coupling = _coupling(cfg, nested, notes)

        head_dim = cfg.positive("head_dim", cfg.positive("hidden_size") // cfg.positive("num_attention_heads"))
        rope = Cfg(cfg.data.get("rope_parameters") or cfg.data.get("rope_scaling") or {},
                   f"{cfg.where}:rope_parameters")
        rope_type = rope.get("rope_type", str, rope.get("type", str, "default"))
        check(rope_type == "default", f"{cfg.where}: rope_type must be 'default', found {rope_type!r}")
        prf = rope.get("partial_rotary_factor", float, cfg.get("partial_rotary_factor", float, None))
        n_rot = None
        if prf is not None and prf != 1.0:
            n_rot = int(head_dim * prf)
            check(0 < n_rot <= head_dim and n_rot % 2 == 0,
                  f"{cfg.where}: head_dim × partial_rotary_factor must be even and in (0, {head_dim}], found {n_rot}")
        n_head = cfg.positive("num_attention_heads")
        n_head_kv = cfg.positive("num_key_value_heads")
        check(n_head % n_head_kv == 0,
              f"{cfg.where}: num_attention_heads ({n_head}) must be a multiple of num_key_value_heads ({n_head_kv})")
        vocab = cfg.positive("vocab_size")
        draft_vocab = cfg.positive("draft_vocab_size", vocab)
        check(draft_vocab <= vocab, f"{cfg.where}: draft_vocab_size must be ≤ vocab_size {vocab}, found {draft_vocab}")
        anchor = cfg.get("sample_from_anchor", bool, nested.get("sample_from_anchor", bool, True) if nested else True)
        causal = cfg.get("is_causal", bool, None)
        if causal is None and nested is not None:
            causal = nested.get("causal", bool, None)
        return cls(
            vocab_size=vocab,
            draft_vocab_size=draft_vocab,
            hidden=cfg.positive("hidden_size"),
            n_layer=cfg.positive("num_hidden_layers"),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_rot=n_rot,
            ff=cfg.positive("intermediate_size"),
            rms_eps=cfg.positive_float("rms_norm_eps", 1e-6),
            rope_theta=rope.positive_float("rope_theta", cfg.positive_float("rope_theta", 10000.0)),
            ctx_len=cfg.positive("max_position_embeddings") if cfg.has("max_position_embeddings") else None,
            sample_from_anchor=anchor,
            causal=causal,
            **coupling,
        )


def _coupling(cfg: Cfg, nested: Cfg | None, notes: list[Note]) -> dict:
    """block_size / target_layer_ids / mask_token_id from either schema; both present must agree."""
    out = {}
    for name, typ in COUPLING_KEYS.items():
        top = cfg.get(name, typ, None)
        sub = nested.get(name, typ, None) if nested else None
        if top is not None and sub is not None and top != sub:
            raise ConfigError(f"{cfg.where}: {name} is {top!r} at the top level but {sub!r} in dflash_config")
        val = sub if sub is not None else top
        if val is None:
            if name != "block_size":
                raise ConfigError(f"{cfg.where}: missing required key {name!r} (top level or dflash_config)")
            val = DEFAULT_BLOCK_SIZE
            notes.append(Note(f"draft config has no block_size: using the DFlash default {DEFAULT_BLOCK_SIZE}"))
        out[name] = val
    ids = out["target_layer_ids"]
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ConfigError(f"{cfg.where}: target_layer_ids must be a non-empty list of integers, found {ids!r}")
    out["target_layer_ids"] = tuple(ids)
    check(0 < out["block_size"] <= INT32_MAX,
          f"{cfg.where}: block_size must be a positive integer of at most {INT32_MAX} (a GGUF uint32 key), "
          f"found {out['block_size']}")
    return out


# --- name tables: Row(GGUF name, bare upstream name (checkpoint.layout drops `model.`), expected upstream shape) --

GLOBAL: list[Row] = [
    Row("fc.weight", "fc.weight", lambda p: (p.hidden, len(p.target_layer_ids) * p.hidden)),
    Row("enc.output_norm.weight", "hidden_norm.weight", lambda p: (p.hidden,)),
    Row("output_norm.weight", "norm.weight", lambda p: (p.hidden,)),
    Row("markov_w1.weight", "markov_head.markov_w1.weight", lambda p: (p.vocab_size, p.markov_rank)),
    Row("markov_w2.weight", "markov_head.markov_w2.weight", lambda p: (p.draft_vocab_size, p.markov_rank)),
]
CONFIDENCE: list[Row] = [
    # input order is [final normed hidden ; markov_w1[prev]]
    Row("conf_proj.weight", "confidence_head.proj.weight", lambda p: (1, p.hidden + p.markov_rank)),
    Row("conf_proj.bias", "confidence_head.proj.bias", lambda p: (1,)),
]
EVERY_LAYER: list[Row] = [
    Row("attn_norm.weight", "input_layernorm.weight", lambda p: (p.hidden,)),
    Row("attn_q.weight", "self_attn.q_proj.weight", lambda p: (p.n_head * p.head_dim, p.hidden)),
    Row("attn_k.weight", "self_attn.k_proj.weight", lambda p: (p.n_head_kv * p.head_dim, p.hidden)),
    Row("attn_v.weight", "self_attn.v_proj.weight", lambda p: (p.n_head_kv * p.head_dim, p.hidden)),
    Row("attn_output.weight", "self_attn.o_proj.weight", lambda p: (p.hidden, p.n_head * p.head_dim)),
    Row("attn_q_norm.weight", "self_attn.q_norm.weight", lambda p: (p.head_dim,)),
    Row("attn_k_norm.weight", "self_attn.k_norm.weight", lambda p: (p.head_dim,)),
    Row("ffn_norm.weight", "post_attention_layernorm.weight", lambda p: (p.hidden,)),
    Row("ffn_gate.weight", "mlp.gate_proj.weight", lambda p: (p.ff, p.hidden)),
    Row("ffn_up.weight", "mlp.up_proj.weight", lambda p: (p.ff, p.hidden)),
    Row("ffn_down.weight", "mlp.down_proj.weight", lambda p: (p.hidden, p.ff)),
]
EMBEDDINGS = ("token_embd.weight", "embed_tokens.weight")
HEAD = ("output.weight", "lm_head.weight")
D2T = "d2t"
NORM_SUFFIXES = ("norm.weight",)  # every RMSNorm weight of the drafter ends so upstream


def _d2t_tensor(ref: TensorRef, p: DraftParams) -> PlannedTensor:
    """Upstream d2t holds offsets (target id − draft id); the runtime wants absolute target ids as I64."""
    if ref.shape != (p.draft_vocab_size,):
        raise CheckpointError(f"draft tensor {ref.name}: expected shape [{p.draft_vocab_size}] (draft_vocab_size), "
                              f"found {list(ref.shape)}")
    if ref.dtype not in ("I64", "I32"):
        raise CheckpointError(f"draft tensor {ref.name}: expected an integer dtype (I64/I32), found {ref.dtype}")
    ids = ref.read().astype(np.int64) + np.arange(p.draft_vocab_size, dtype=np.int64)
    bad = ids[(ids < 0) | (ids >= p.vocab_size)]
    if bad.size:
        raise PairingError(f"d2t maps to target id {int(bad[0])}, outside the target vocabulary [0, {p.vocab_size})")
    uniq, counts = np.unique(ids, return_counts=True)
    if uniq.size != ids.size:
        dup = int(uniq[counts > 1][0])
        rows = np.flatnonzero(ids == dup)[:2].tolist()
        raise PairingError(f"d2t must map draft tokens one-to-one to target ids, found draft tokens {rows[0]} and "
                           f"{rows[1]} both mapped to target id {dup}")
    return PlannedTensor("d2t", (p.draft_vocab_size,), [ref], lambda: (ids, "I64"), ggml_type="I64")


def check_pairing(p: DraftParams, target_params, markov_rows: tuple[int, int]) -> None:
    """Every draft/target coupling rule (docs/formats.md, "Draft"), each naming the expected and the found value."""
    t = target_params
    if p.vocab_size != t.vocab_size:
        raise PairingError(f"draft vocab_size must equal the target's {t.vocab_size}, found {p.vocab_size}")
    if p.hidden != t.hidden:
        raise PairingError(f"draft hidden_size must equal the target's hidden size {t.hidden}, found {p.hidden}")
    top = t.n_layer - 2  # the runtime taps layer inputs id+1, which must exist: id+1 ≤ n_layer-1
    for i in p.target_layer_ids:
        if not 0 <= i <= top:
            raise PairingError(f"draft target_layer_ids must lie in [0, {top}] for a {t.n_layer}-layer target, "
                               f"found {i} in {list(p.target_layer_ids)}")
    if not 0 <= p.mask_token_id < t.vocab_size:
        raise PairingError(f"draft mask_token_id must be inside the target vocabulary [0, {t.vocab_size}), "
                           f"found {p.mask_token_id}")
    w1, w2 = markov_rows
    if w1 != t.vocab_size:
        raise PairingError(f"markov_head.markov_w1 must have one row per target token ({t.vocab_size}), found {w1}")
    if w2 != p.draft_vocab_size:
        raise PairingError(f"markov_head.markov_w2 must have one row per draft token ({p.draft_vocab_size}), "
                           f"found {w2}")


def _target_uses_mrope(target: ModelDir) -> bool:
    text = target.config.get("text_config") or target.config
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    return isinstance(rope, dict) and "mrope_section" in rope


def plan_draft(dmd: ModelDir, *, target: ModelDir, target_plan: ConversionPlan, target_params) -> ConversionPlan:
    """The `dflash` GGUF plan of a DSpark drafter for `target` (already planned). Raises before anything is written."""
    plan = ConversionPlan(ARCH)
    p = DraftParams.read(Cfg(dmd.config, f"{dmd.path.name}/config.json"), plan.notes)
    expect_family(dmd.layout, "DSpark", dmd.path)
    tensors = dmd.tensors  # bare upstream names, with or without `model.` in the shards (checkpoint.layout)
    for name in ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight"):
        if name not in tensors:
            raise CheckpointError(f"draft tensor {name} is missing (a DSpark drafter needs its Markov head)")
    w1, w2 = tensors["markov_head.markov_w1.weight"], tensors["markov_head.markov_w2.weight"]
    check_pairing(p, target_params, (w1.shape[0], w2.shape[0]))
    rank = w1.shape[1]
    if len(w2.shape) != 2 or w2.shape[1] != rank:
        raise CheckpointError(f"markov_head.markov_w2: expected {rank} columns (markov_w1's rank), "
                              f"found {list(w2.shape)}")
    p = replace(p, markov_rank=rank)

    used: set[str] = set()

    def take(gname: str, name: str, want: tuple) -> PlannedTensor:
        ref = tensors.get(name)
        if ref is None:
            raise CheckpointError(f"draft tensor {name} is missing from the checkpoint")
        used.add(name)
        return planned(gname, ref, want, what="draft tensor")

    for row in GLOBAL:
        plan.tensors.append(take(row.gguf, row.source, row.shape(p)))
    has_conf = CONFIDENCE[0].source in tensors
    if has_conf:
        for row in CONFIDENCE:
            if row.source in tensors:  # the bias is optional
                plan.tensors.append(take(row.gguf, row.source, row.shape(p)))
    for il in range(p.n_layer):
        for row in EVERY_LAYER:
            plan.tensors.append(take(f"blk.{il}.{row.gguf}", f"layers.{il}.{row.source}", row.shape(p)))
    _plan_vocab_tensors(plan, p, tensors, used, target_plan)
    check_leftover(tensors, used, "draft", ignore=lambda n: n in IGNORED_TENSORS)

    _add_metadata(plan, p, has_conf, target, target_plan, target_params)
    for warning in sanity_warnings(tensors, used, rank):
        plan.note(f"draft sanity warning: {warning}", "warning")
    return plan


def _plan_vocab_tensors(plan: ConversionPlan, p: DraftParams, tensors: dict, used: set, target_plan) -> None:
    """Embeddings / head / d2t: only what the draft carries, or what a reduced vocabulary makes necessary."""
    emb, head = tensors.get(EMBEDDINGS[1]), tensors.get(HEAD[1])
    if p.draft_vocab_size < p.vocab_size:
        if D2T not in tensors:
            raise CheckpointError(f"draft_vocab_size {p.draft_vocab_size} < vocab_size {p.vocab_size} but the "
                                  f"checkpoint has no d2t table")
        if head is None:
            raise CheckpointError(f"draft_vocab_size {p.draft_vocab_size} < vocab_size {p.vocab_size} needs the "
                                  f"draft's own lm_head.weight [{p.draft_vocab_size}, {p.hidden}], which is missing")
        plan.tensors.append(_d2t_tensor(tensors[D2T], p))
        used.add(D2T)
    elif D2T in tensors:
        raise CheckpointError(f"draft has a d2t table but draft_vocab_size equals vocab_size ({p.vocab_size})")
    if emb is not None:
        plan.tensors.append(planned(EMBEDDINGS[0], emb, (p.vocab_size, p.hidden), what="draft tensor"))
        used.add(EMBEDDINGS[1])
    if head is not None:
        plan.tensors.append(planned(HEAD[0], head, (p.draft_vocab_size, p.hidden), what="draft tensor"))
        used.add(HEAD[1])
    elif emb is not None:
        # With token_embd but no output the runtime would reuse the embeddings as the head (tied), which the
        # target is not: carry the target's head instead, so the draft's logits are the target's.
        target_head = next((t for t in target_plan.tensors if t.name == HEAD[0]), None)
        if target_head is None:
            raise PairingError("the draft ships embed_tokens but no lm_head, and the target has no separate "
                               "output.weight to share")
        plan.tensors.append(target_head)
        plan.note("draft ships embed_tokens without lm_head: the target's output head was copied into it")


def _add_metadata(plan: ConversionPlan, p: DraftParams, has_conf: bool, target: ModelDir, target_plan, tp) -> None:
    a = ARCH
    plan.u32(key(Keys.LLM.BLOCK_COUNT, a), p.n_layer)
    plan.u32(key(Keys.LLM.CONTEXT_LENGTH, a), p.ctx_len or tp.ctx_len)
    plan.u32(key(Keys.LLM.EMBEDDING_LENGTH, a), p.hidden)
    plan.u32(key(Keys.LLM.FEED_FORWARD_LENGTH, a), p.ff)
    plan.u32(key(Keys.Attention.HEAD_COUNT, a), p.n_head)
    plan.u32(key(Keys.Attention.HEAD_COUNT_KV, a), p.n_head_kv)
    plan.u32(key(Keys.Attention.KEY_LENGTH, a), p.head_dim)
    plan.u32(key(Keys.Attention.VALUE_LENGTH, a), p.head_dim)
    plan.f32(key(Keys.Attention.LAYERNORM_RMS_EPS, a), p.rms_eps)
    plan.f32(key(Keys.Rope.FREQ_BASE, a), p.rope_theta)
    n_rot = p.n_rot or p.head_dim
    if p.n_rot:
        plan.u32(key(Keys.Rope.DIMENSION_COUNT, a), p.n_rot)
    if _target_uses_mrope(target):
        # degenerate sections: every rotary pair uses the sequence position, i.e. plain NeoX RoPE
        plan.arr(key(Keys.Rope.DIMENSION_SECTIONS, a), [n_rot // 2, 0, 0, 0])
    # the runtime taps the *input* of layer k, i.e. the output of HF decoder layer k-1
    plan.arr(key(DFLASH_TARGET_LAYERS, a), [i + 1 for i in p.target_layer_ids])
    plan.u32(key(DFLASH_BLOCK_SIZE, a), p.block_size)
    plan.bool(key(DFLASH_SAMPLE_FROM_ANCHOR, a), p.sample_from_anchor)
    plan.bool(key(DFLASH_HAS_CONFIDENCE_HEAD, a), has_conf)
    if p.causal is not None:
        plan.bool(key(Keys.Attention.CAUSAL, a), p.causal)
    tok = [kv for kv in target_plan.kvs if kv.key.startswith("tokenizer.") and kv.key != Keys.Tokenizer.MASK_ID]
    if not any(kv.key == Keys.Tokenizer.MODEL for kv in tok):
        raise PairingError("the target plan carries no tokenizer keys to copy into the draft")
    plan.kvs.extend(tok)
    plan.u32(Keys.Tokenizer.MASK_ID, p.mask_token_id)


# --- sanity report ------------------------------------------------------------------------------------------------
# Bit patterns per float storage type: (exponent mask = NaN/Inf when all set, pattern of 1.0, sign mask)
_BITS = {"BF16": (0x7F80, 0x3F80, 0x7FFF), "F16": (0x7C00, 0x3C00, 0x7FFF)}


def _stats(ref: TensorRef) -> tuple[bool, bool, bool]:
    """(has NaN/Inf, all exactly 1.0, all zero) of one tensor, without widening 16-bit storage."""
    a = ref.read()
    if ref.dtype in _BITS:
        exp, one, mag = _BITS[ref.dtype]
        return bool(((a & exp) == exp).any()), bool((a == one).all()), bool(((a & mag) == 0).all())
    if ref.dtype in ("F32", "F64"):
        return bool((~np.isfinite(a)).any()), bool((a == 1.0).all()), bool((a == 0).all())
    return False, False, False  # integer tables (d2t)


def sanity_warnings(tensors: dict[str, TensorRef], names: set[str], rank: int) -> list[str]:
    """Signs of an untrained or broken drafter: norms left at 1.0, NaN/Inf, all-zero Markov tables."""
    nonfinite, ones, zero_markov = [], [], []
    norms = sorted(n for n in names if n.endswith(NORM_SUFFIXES))
    for name in sorted(names):
        bad, all_one, all_zero = _stats(tensors[name])
        if bad:
            nonfinite.append(name)
        if all_one and name in norms:
            ones.append(name)
        if all_zero and name.startswith("markov_head."):
            zero_markov.append(name)
    out = []
    if ones:
        out.append(f"{len(ones)} of {len(norms)} norm weights are exactly 1.0 everywhere (untrained norms? a drafter "
                   f"shipped so never gets a draft accepted), e.g. {ones[0]}")
    if nonfinite:
        out.append(f"{len(nonfinite)} tensor(s) contain NaN or Inf, e.g. {nonfinite[0]}")
    if zero_markov:
        out.append(f"Markov table(s) {', '.join(zero_markov)} are all zero (rank {rank}): the Markov head does nothing")
    return out

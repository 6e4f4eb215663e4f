"""Qwen3.5 hybrid MoE text tower (gated delta-net + gated full attention, routed + shared experts) → `qwen35moe`.

Facts and their sources: docs/formats.md, "Target". The name tables below are the whole mapping; the transforms are
named so that each one is defined once, used by name, and can be switched off in the ablation tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ggufbridge.arch.config import Cfg, check
from ggufbridge.arch.plan import Row, planned
from ggufbridge.ggufio.plan import ConversionPlan, PlannedTensor
from ggufbridge.checkpoint.safetensors import DTYPES, TensorRef, to_f32
from ggufbridge.errors import CheckpointError, ConfigError
from ggufbridge.ggufio.names import MODEL_ARCH, MODEL_ARCH_NAMES, RECURRENT_LAYERS, Keys, key, tensor
from ggufbridge.ggufio.names import MODEL_TENSOR as T

ARCH = MODEL_ARCH_NAMES[MODEL_ARCH.QWEN35MOE]  # "qwen35moe"
TEXT_MODEL_TYPES = ("qwen3_5_moe_text",)
DEFAULT_MROPE_SECTION = [11, 11, 10]


@dataclass(frozen=True)
class TextParams:
    vocab_size: int
    hidden: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    sections: tuple[int, int, int, int]
    rope_theta: float
    rms_eps: float
    ctx_len: int
    recurrent: tuple[bool, ...]
    n_expert: int
    n_expert_used: int
    ff_exp: int
    ff_shexp: int
    conv_kernel: int
    dk: int  # linear_key_head_dim (= value head dim; the runtime has one state size)
    gk: int  # linear_num_key_heads
    hv: int  # linear_num_value_heads
    tied: bool
    mtp_layers: int

    @property
    def dinner(self) -> int:
        return self.hv * self.dk

    @property
    def conv_dim(self) -> int:
        return 2 * self.dk * self.gk + self.dinner

    @classmethod
    def read(cls, text: Cfg, tied_default: bool = False) -> "TextParams":
        mt = text.get("model_type", str, None)
        check(mt in TEXT_MODEL_TYPES, f"{text.where}: model_type must be one of {list(TEXT_MODEL_TYPES)}, found {mt!r}")
        n_layer = text.positive("num_hidden_layers")
        check(n_layer <= 512, f"{text.where}: num_hidden_layers must be ≤ 512, found {n_layer}")
        head_dim = text.positive("head_dim")
        rope = Cfg(text.data.get("rope_parameters") or text.data.get("rope_scaling") or {},
                   f"{text.where}:rope_parameters")
        prf = rope.get("partial_rotary_factor", float, text.get("partial_rotary_factor", float, 0.25))
        n_rot = int(head_dim * prf)
        check(0 < n_rot <= head_dim and n_rot % 2 == 0,
              f"{text.where}: head_dim × partial_rotary_factor must be an even number in (0, {head_dim}], "
              f"found {n_rot}")
        msec = rope.get("mrope_section", list, DEFAULT_MROPE_SECTION)
        check(len(msec) == 3 and all(isinstance(s, int) and s >= 0 for s in msec),
              f"{text.where}: mrope_section must be 3 non-negative integers, found {msec}")
        check(sum(msec) <= head_dim and any(msec),
              f"{text.where}: mrope_section {msec} must have a non-zero entry and sum to at most head_dim {head_dim}")
        check(sum(msec) >= n_rot // 2,
              f"{text.where}: mrope_section {msec} covers {sum(msec)} rotary pairs, but the model rotates {n_rot // 2}")
        theta = rope.positive_float("rope_theta", text.positive_float("rope_theta", 10000.0))

        layer_types = text.get("layer_types", list, None)
        if layer_types is None:
            interval = text.positive("full_attention_interval", 4)
            layer_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n_layer)]
        check(len(layer_types) == n_layer,
              f"{text.where}: layer_types has {len(layer_types)} entries, expected num_hidden_layers = {n_layer}")
        bad = [t for t in layer_types if t not in ("linear_attention", "full_attention")]
        if bad:
            raise ConfigError(f"{text.where}: layer_types entries must be 'linear_attention' or 'full_attention', "
                              f"found {bad[0]!r}")

        n_expert = text.positive("num_experts")
        used = text.positive("num_experts_per_tok")
        check(n_expert <= 1024, f"{text.where}: num_experts must be ≤ 1024, found {n_expert}")
        check(used <= n_expert, f"{text.where}: num_experts_per_tok must be ≤ num_experts ({n_expert}), found {used}")
        dk = text.positive("linear_key_head_dim")
        dv = text.positive("linear_value_head_dim")
        check(dk == dv, f"{text.where}: linear_value_head_dim must equal linear_key_head_dim ({dk}) for this "
                        f"runtime, found {dv}")
        gk = text.positive("linear_num_key_heads")
        hv = text.positive("linear_num_value_heads")
        check(hv % gk == 0,
              f"{text.where}: linear_num_value_heads ({hv}) must be a multiple of linear_num_key_heads ({gk})")
        n_head = text.positive("num_attention_heads")
        n_head_kv = text.positive("num_key_value_heads")
        check(n_head % n_head_kv == 0, f"{text.where}: num_attention_heads ({n_head}) must be a multiple of "
                                       f"num_key_value_heads ({n_head_kv})")
        kernel = text.positive("linear_conv_kernel_dim")
        check(kernel >= 2, f"{text.where}: linear_conv_kernel_dim must be ≥ 2, found {kernel}")
        return cls(
            vocab_size=text.positive("vocab_size"),
            hidden=text.positive("hidden_size"),
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_rot=n_rot,
            sections=(msec[0], msec[1], msec[2], 0),
            rope_theta=theta,
            rms_eps=text.positive_float("rms_norm_eps", 1e-6),
            ctx_len=text.positive("max_position_embeddings", 262144),
            recurrent=tuple(t == "linear_attention" for t in layer_types),
            n_expert=n_expert,
            n_expert_used=used,
            ff_exp=text.positive("moe_intermediate_size"),
            ff_shexp=text.positive("shared_expert_intermediate_size"),
            conv_kernel=kernel,
            dk=dk,
            gk=gk,
            hv=hv,
            tied=bool(text.get("tie_word_embeddings", bool, tied_default)),
            mtp_layers=text.get("mtp_num_hidden_layers", int, 0),
        )


# --- transforms -------------------------------------------------------------------------------------------------
# Each takes the source array (storage dtype, BF16 as uint16) and returns (array, dtype tag). Permutations work on the
# raw storage so BF16 → BF16 stays bit-exact; arithmetic widens to float32 first.


def reorder_vheads(a: np.ndarray, axis: int, p: TextParams, head_dim: int) -> np.ndarray:
    """HF groups value heads by key head (old index g·R + r); the runtime tiles them (new index r·Gk + g)."""
    r = p.hv // p.gk
    a = np.moveaxis(a, axis, 0)
    rest = a.shape[1:]
    a = a.reshape(p.gk, r, head_dim, *rest).swapaxes(0, 1).reshape(p.hv * head_dim, *rest)
    return np.ascontiguousarray(np.moveaxis(a, 0, axis))


def rmsnorm_offset(a, dtype, p):
    # Qwen3.5 RMSNorm computes x̂·(1 + w); the runtime multiplies by the stored weight.
    return to_f32(a, dtype) + np.float32(1.0), "F32"


def as_f32(a, dtype, p):
    return to_f32(a, dtype), "F32"


def neg_exp_a_log(a, dtype, p):
    return reorder_vheads(-np.exp(to_f32(a, dtype)), 0, p, 1), "F32"


def vheads_scalar(a, dtype, p):  # dt_bias [Hv], in_proj_a/b [Hv, E]
    return reorder_vheads(a, 0, p, 1), dtype


def vheads_rows(a, dtype, p):  # in_proj_z [dinner, E]
    return reorder_vheads(a, 0, p, p.dk), dtype


def vheads_cols(a, dtype, p):  # out_proj [E, dinner]
    return reorder_vheads(a, 1, p, p.dk), dtype


def vheads_after_qk(a, dtype, p):  # in_proj_qkv [2·dk·Gk + dinner, E]: q and k rows stay
    qk = 2 * p.dk * p.gk
    return np.concatenate([a[:qk], reorder_vheads(a[qk:], 0, p, p.dk)], axis=0), dtype


def conv_squeeze(a, dtype, p):  # conv1d [C, 1, K] → [C, K], V channels reordered, F32 (ssm_conv reads floats)
    a = to_f32(a, dtype).reshape(a.shape[0], a.shape[-1])
    qk = 2 * p.dk * p.gk
    return np.concatenate([a[:qk], reorder_vheads(a[qk:], 0, p, p.dk)], axis=0), "F32"


TRANSFORMS: dict[str, Callable] = {
    "rmsnorm_offset": rmsnorm_offset,
    "f32": as_f32,
    "neg_exp_a_log": neg_exp_a_log,
    "vheads_scalar": vheads_scalar,
    "vheads_rows": vheads_rows,
    "vheads_cols": vheads_cols,
    "vheads_after_qk": vheads_after_qk,
    "conv_squeeze": conv_squeeze,
}
# Transforms whose output the runtime uses element-wise: always stored F32.
F32_TRANSFORMS = {"rmsnorm_offset", "f32", "neg_exp_a_log", "conv_squeeze"}

# --- name tables: Row(GGUF name, HF name, expected HF shape from the params, transform) --------------------------

GLOBAL = [
    Row(tensor(T.TOKEN_EMBD), "embed_tokens.weight", lambda p: (p.vocab_size, p.hidden)),
    Row(tensor(T.OUTPUT_NORM), "norm.weight", lambda p: (p.hidden,), "rmsnorm_offset"),
]
EVERY_LAYER = [
    Row(tensor(T.ATTN_NORM), "input_layernorm.weight", lambda p: (p.hidden,), "rmsnorm_offset"),
    Row(tensor(T.ATTN_POST_NORM), "post_attention_layernorm.weight", lambda p: (p.hidden,), "rmsnorm_offset"),
    Row(tensor(T.FFN_GATE_INP), "mlp.gate.weight", lambda p: (p.n_expert, p.hidden), "f32"),  # router: kept exact
    Row(tensor(T.FFN_GATE_INP_SHEXP), "mlp.shared_expert_gate.weight", lambda p: (1, p.hidden), "f32"),
    Row(tensor(T.FFN_GATE_SHEXP), "mlp.shared_expert.gate_proj.weight", lambda p: (p.ff_shexp, p.hidden)),
    Row(tensor(T.FFN_UP_SHEXP), "mlp.shared_expert.up_proj.weight", lambda p: (p.ff_shexp, p.hidden)),
    Row(tensor(T.FFN_DOWN_SHEXP), "mlp.shared_expert.down_proj.weight", lambda p: (p.hidden, p.ff_shexp)),
]
FULL_ATTENTION = [
    # q_proj rows are per head [q(D) ; gate(D)]; the runtime reads both halves from that layout as-is.
    Row(tensor(T.ATTN_Q), "self_attn.q_proj.weight", lambda p: (2 * p.n_head * p.head_dim, p.hidden)),
    Row(tensor(T.ATTN_K), "self_attn.k_proj.weight", lambda p: (p.n_head_kv * p.head_dim, p.hidden)),
    Row(tensor(T.ATTN_V), "self_attn.v_proj.weight", lambda p: (p.n_head_kv * p.head_dim, p.hidden)),
    Row(tensor(T.ATTN_OUT), "self_attn.o_proj.weight", lambda p: (p.hidden, p.n_head * p.head_dim)),
    Row(tensor(T.ATTN_Q_NORM), "self_attn.q_norm.weight", lambda p: (p.head_dim,), "rmsnorm_offset"),
    Row(tensor(T.ATTN_K_NORM), "self_attn.k_norm.weight", lambda p: (p.head_dim,), "rmsnorm_offset"),
]
LINEAR_ATTENTION = [
    Row(tensor(T.ATTN_QKV), "linear_attn.in_proj_qkv.weight", lambda p: (p.conv_dim, p.hidden), "vheads_after_qk"),
    Row(tensor(T.ATTN_GATE), "linear_attn.in_proj_z.weight", lambda p: (p.dinner, p.hidden), "vheads_rows"),
    Row(tensor(T.SSM_CONV1D), "linear_attn.conv1d.weight", lambda p: (p.conv_dim, 1, p.conv_kernel), "conv_squeeze"),
    Row(tensor(T.SSM_DT, "bias"), "linear_attn.dt_bias", lambda p: (p.hv,), "vheads_scalar"),
    Row(tensor(T.SSM_A, None), "linear_attn.A_log", lambda p: (p.hv,), "neg_exp_a_log"),
    Row(tensor(T.SSM_BETA), "linear_attn.in_proj_b.weight", lambda p: (p.hv, p.hidden), "vheads_scalar"),
    Row(tensor(T.SSM_ALPHA), "linear_attn.in_proj_a.weight", lambda p: (p.hv, p.hidden), "vheads_scalar"),
    # The gated norm multiplies by its weight as stored (no +1 here).
    Row(tensor(T.SSM_NORM), "linear_attn.norm.weight", lambda p: (p.dk,), "f32"),
    Row(tensor(T.SSM_OUT), "linear_attn.out_proj.weight", lambda p: (p.hidden, p.dinner), "vheads_cols"),
]
# Routed experts: GGUF name → (per-expert HF name, fused HF name, rows taken from the fused tensor)
EXPERTS = [
    (tensor(T.FFN_GATE_EXP), "mlp.experts.{e}.gate_proj.weight", "mlp.experts.gate_up_proj", "first"),
    (tensor(T.FFN_UP_EXP), "mlp.experts.{e}.up_proj.weight", "mlp.experts.gate_up_proj", "second"),
    (tensor(T.FFN_DOWN_EXP), "mlp.experts.{e}.down_proj.weight", "mlp.experts.down_proj", "all"),
]


def _transformed(name: str, ref: TensorRef, transform: str | None, p: TextParams, want: tuple) -> PlannedTensor:
    # TRANSFORMS is looked up at build time, so that the ablation tests can swap one out
    fn = None if transform is None else (lambda a, dtype: TRANSFORMS[transform](a, dtype, p))
    stored = (want[0], want[2]) if transform == "conv_squeeze" else tuple(want)
    return planned(name, ref, want, transform=fn, stored_shape=stored,
                   force_f32=transform in F32_TRANSFORMS or len(stored) == 1)


def _experts(gname: str, per_expert: str, fused: str, part: str, prefix: str, tensors: dict, p: TextParams,
             il: int, used: set) -> PlannedTensor:
    down = gname.startswith("ffn_down")
    per_shape = (p.hidden, p.ff_exp) if down else (p.ff_exp, p.hidden)
    names = [f"{prefix}{per_expert.format(e=e)}" for e in range(p.n_expert)]
    have = [n for n in names if n in tensors]
    fused_name = next((f"{prefix}{fused}{s}" for s in ("", ".weight") if f"{prefix}{fused}{s}" in tensors), None)
    if have and fused_name:
        raise CheckpointError(f"layer {il}: experts stored both per expert and fused ({fused_name})")
    if fused_name:
        ref = tensors[fused_name]
        want = (p.n_expert, p.hidden, p.ff_exp) if down else (p.n_expert, 2 * p.ff_exp, p.hidden)
        if ref.shape != want:
            raise CheckpointError(f"tensor {fused_name}: expected shape {list(want)} from the config, "
                                  f"found {list(ref.shape)}")
        used.add(fused_name)

        def build():
            a = ref.read()
            if part == "first":
                a = a[:, : p.ff_exp]
            elif part == "second":
                a = a[:, p.ff_exp:]
            return np.ascontiguousarray(a), ref.dtype

        return PlannedTensor(f"blk.{il}.{gname}", (p.n_expert, *per_shape), [ref], build)
    if len(have) != p.n_expert:
        missing = [n for n in names if n not in tensors]
        raise CheckpointError(f"layer {il}: {len(missing)} of {p.n_expert} experts missing, e.g. {missing[0]}")
    refs = [tensors[n] for n in names]
    for r in refs:
        if r.shape != per_shape:
            raise CheckpointError(f"tensor {r.name}: expected shape {list(per_shape)} from the config, "
                                  f"found {list(r.shape)}")
    dtypes = {r.dtype for r in refs}
    if len(dtypes) != 1:
        raise CheckpointError(f"layer {il}: experts of {gname} mix dtypes {sorted(dtypes)}")
    used.update(names)

    def build():
        # One projection of one layer's experts in memory at a time, each expert read straight into its slot.
        out = np.empty((p.n_expert, *per_shape), dtype=DTYPES[refs[0].dtype][0])
        for e, r in enumerate(refs):
            r.read(out[e])
        return out, refs[0].dtype

    return PlannedTensor(f"blk.{il}.{gname}", (p.n_expert, *per_shape), refs, build)


def plan_text(plan: ConversionPlan, p: TextParams, tensors: dict[str, TensorRef], prefix: str,
              head_name: str) -> set[str]:
    """Add the qwen35moe metadata and tensors to `plan`. Returns the source tensor names consumed."""
    a = ARCH
    plan.u32(key(Keys.LLM.BLOCK_COUNT, a), p.n_layer)
    plan.u32(key(Keys.LLM.CONTEXT_LENGTH, a), p.ctx_len)
    plan.u32(key(Keys.LLM.EMBEDDING_LENGTH, a), p.hidden)
    plan.u32(key(Keys.LLM.FEED_FORWARD_LENGTH, a), p.ff_exp)
    plan.u32(key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, a), p.ff_exp)
    plan.u32(key(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, a), p.ff_shexp)
    plan.u32(key(Keys.LLM.EXPERT_COUNT, a), p.n_expert)
    plan.u32(key(Keys.LLM.EXPERT_USED_COUNT, a), p.n_expert_used)
    plan.u32(key(Keys.Attention.HEAD_COUNT, a), p.n_head)
    plan.u32(key(Keys.Attention.HEAD_COUNT_KV, a), p.n_head_kv)
    plan.u32(key(Keys.Attention.KEY_LENGTH, a), p.head_dim)
    plan.u32(key(Keys.Attention.VALUE_LENGTH, a), p.head_dim)
    plan.f32(key(Keys.Attention.LAYERNORM_RMS_EPS, a), p.rms_eps)
    plan.u32(key(Keys.Rope.DIMENSION_COUNT, a), p.n_rot)
    plan.arr(key(Keys.Rope.DIMENSION_SECTIONS, a), list(p.sections))
    plan.f32(key(Keys.Rope.FREQ_BASE, a), p.rope_theta)
    plan.u32(key(Keys.SSM.CONV_KERNEL, a), p.conv_kernel)
    plan.u32(key(Keys.SSM.STATE_SIZE, a), p.dk)
    plan.u32(key(Keys.SSM.GROUP_COUNT, a), p.gk)
    plan.u32(key(Keys.SSM.TIME_STEP_RANK, a), p.hv)
    plan.u32(key(Keys.SSM.INNER_SIZE, a), p.dinner)
    plan.arr(key(RECURRENT_LAYERS, a), list(p.recurrent))

    used: set[str] = set()

    def take(hf: str) -> TensorRef:
        ref = tensors.get(hf)
        if ref is None:
            raise CheckpointError(f"tensor {hf} is missing from the checkpoint")
        used.add(hf)
        return ref

    for row in GLOBAL:
        plan.tensors.append(_transformed(row.gguf, take(prefix + row.source), row.transform, p, row.shape(p)))
    if head_name in tensors:
        plan.tensors.append(_transformed(tensor(T.OUTPUT), take(head_name), None, p, (p.vocab_size, p.hidden)))
    elif not p.tied:
        raise CheckpointError(f"tensor {head_name} is missing and the config does not tie the embeddings")

    for il in range(p.n_layer):
        lp = f"{prefix}layers.{il}."
        table = EVERY_LAYER + (LINEAR_ATTENTION if p.recurrent[il] else FULL_ATTENTION)
        for row in table:
            plan.tensors.append(_transformed(f"blk.{il}.{row.gguf}", take(lp + row.source), row.transform, p,
                                             row.shape(p)))
        for gname, per_expert, fused, part in EXPERTS:
            plan.tensors.append(_experts(gname, per_expert, fused, part, lp, tensors, p, il, used))
    if p.mtp_layers:
        plan.note(
            f"config declares {p.mtp_layers} MTP layer(s) but the checkpoint ships none: converted without MTP"
            if not any(".mtp." in n or n.startswith("mtp.") for n in tensors)
            else "MTP layers present but not converted (MiniCPM-V 4.7 GGUF has no MTP): converted without MTP"
        )
    return used


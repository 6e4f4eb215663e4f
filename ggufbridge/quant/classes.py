"""Tensor classes of a `qwen35moe` GGUF: the unit a quantisation recipe assigns types to, and the rows of the report.

A class is `kept` when llama.cpp's quantiser never changes it (src/llama-quant.cpp:287-387: tensors with fewer than
two dimensions, names not ending in `weight`, `*_norm.weight`, the router `ffn_gate_inp.weight`, `ssm_conv1d`):
those keep the type the converter wrote (F32 for everything the runtime uses element-wise).
The first matching pattern wins, so the more specific names come first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BLOCK = re.compile(r"^blk\.(\d+)\.")  # a repeating block's tensor; group 1: its index

@dataclass(frozen=True)
class TensorClass:
    name: str
    pattern: str
    kept: bool
    label: str


CLASSES: tuple[TensorClass, ...] = (
    TensorClass("token_embd", r"^token_embd\.weight$", False, "token embeddings"),
    TensorClass("output", r"^output\.weight$", False, "output head"),
    TensorClass("norms", r"(_norm\.weight|^output_norm\.weight)$", True, "norms"),
    TensorClass("router", r"\.ffn_gate_inp\.weight$", True, "router"),
    TensorClass("shared_expert_gate", r"\.ffn_gate_inp_shexp\.weight$", True, "shared-expert gate"),
    TensorClass("experts_gate_up", r"\.ffn_(gate|up|gate_up)_exps\.weight$", False, "routed experts gate/up"),
    TensorClass("experts_down", r"\.ffn_down_exps\.weight$", False, "routed experts down"),
    TensorClass("shared_experts", r"\.ffn_(gate|up|down)_shexp\.weight$", False, "shared expert"),
    TensorClass("attention", r"\.attn_(q|k|v|output)\.weight$", False, "attention q/k/v/output"),
    TensorClass("gdn_in", r"\.(attn_qkv|attn_gate|ssm_alpha|ssm_beta)\.weight$", False,
                "gated delta-net in (qkv, z, alpha, beta)"),
    TensorClass("ssm_out", r"\.ssm_out\.weight$", False, "gated delta-net out-projection"),
    TensorClass("ssm_params", r"\.(ssm_conv1d\.weight|ssm_a|ssm_dt\.bias)$", True, "SSM conv, A, dt bias"),
)
_COMPILED = [(c, re.compile(c.pattern)) for c in CLASSES]
BY_NAME = {c.name: c for c in CLASSES}
OTHER = TensorClass("other", "", True, "other")


def classify(tensor_name: str) -> TensorClass:
    """The class of a GGUF tensor name; `OTHER` for names outside the qwen35moe text model."""
    return next((c for c, rx in _COMPILED if rx.search(tensor_name)), OTHER)

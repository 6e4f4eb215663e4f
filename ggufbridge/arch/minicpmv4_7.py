"""OpenBMB MiniCPM-V 4.7 (`MiniCPMV4_7ForConditionalGeneration`): Qwen3.5-MoE text tower + SigLIP vision tower.

The text tower becomes a `qwen35moe` GGUF; the vision tower (model.vision_tower.*, model.merger.*) is the mmproj's.
Names here are transformers-native: the other published layouts are renamed when the folder is opened
(ggufbridge.checkpoint.layout).
"""

from __future__ import annotations

from dataclasses import dataclass

from ggufbridge.arch import qwen35moe
from ggufbridge.arch.config import Cfg
from ggufbridge.arch.plan import ConversionPlan
from ggufbridge.checkpoint.layout import expect_family
from ggufbridge.checkpoint.model_dir import ModelDir
from ggufbridge.errors import CheckpointError
from ggufbridge.ggufio.tokenizer import add_vocab, read_vocab

TEXT_PREFIX = "model.language_model."
HEAD = "lm_head.weight"
VISION_PREFIXES = ("model.vision_tower.", "model.merger.")
MTP_PREFIXES = ("mtp.", "model.mtp.", "model.language_model.mtp.")
BASENAME = "MiniCPM-V-4_7"


def plan_target(md: ModelDir) -> tuple[ConversionPlan, qwen35moe.TextParams]:
    expect_family(md.layout, "MiniCPM-V 4.7", md.path)  # names are canonical (transformers) from here on
    root = Cfg(md.config)
    text = root.sub("text_config")
    params = qwen35moe.TextParams.read(text, tied_default=bool(md.config.get("tie_word_embeddings", False)))
    plan = ConversionPlan(qwen35moe.ARCH)
    vocab = read_vocab(md.path, params.vocab_size)
    used = qwen35moe.plan_text(plan, params, md.tensors, TEXT_PREFIX, HEAD)
    add_vocab(plan, vocab)
    leftover = [
        n for n in md.tensors
        if n not in used and not n.startswith(VISION_PREFIXES) and not n.startswith(MTP_PREFIXES)
    ]
    if leftover:
        raise CheckpointError(
            f"{len(leftover)} text tensor(s) not understood by the converter, e.g. {sorted(leftover)[0]}"
        )
    return plan, params


def plan_mmproj(md: ModelDir, params: qwen35moe.TextParams, downsample: str | None = None):
    """The vision tower's mmproj plan (None without a vision tower): see ggufbridge.arch.minicpmv4_7_vision."""
    from ggufbridge.arch import minicpmv4_7_vision

    return minicpmv4_7_vision.plan_mmproj(md, params.hidden, downsample=downsample)

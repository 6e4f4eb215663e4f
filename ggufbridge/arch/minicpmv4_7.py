"""OpenBMB MiniCPM-V 4.7 (`MiniCPMV4_7ForConditionalGeneration`): Qwen3.5-MoE text tower + SigLIP vision tower.

The text tower becomes a `qwen35moe` GGUF (this module, a text converter); the vision tower (model.vision_tower.*,
model.merger.*) is the mmproj's (ggufbridge.arch.minicpmv4_7_vision, registered as this architecture's mmproj
converter). Names here are transformers-native: the other published layouts are renamed when the folder is opened
(ggufbridge.checkpoint.layout).
"""

from __future__ import annotations

from ggufbridge.arch import qwen35moe
from ggufbridge.arch.config import Cfg
from ggufbridge.arch.plan import check_leftover
from ggufbridge.ggufio.plan import ConversionPlan
from ggufbridge.checkpoint.layout import expect_family
from ggufbridge.checkpoint.model_dir import ModelDir
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
    # tensors first: their shapes check vocab_size before read_vocab builds a token list that long
    used = qwen35moe.plan_text(plan, params, md.tensors, TEXT_PREFIX, HEAD)
    vocab = read_vocab(md.path, params.vocab_size)
    add_vocab(plan, vocab)
    # the vision tower is the mmproj converter's; MTP layers are not converted (plan_text notes it)
    check_leftover(md.tensors, used, "text", ignore=lambda n: n.startswith(VISION_PREFIXES + MTP_PREFIXES))
    return plan, params

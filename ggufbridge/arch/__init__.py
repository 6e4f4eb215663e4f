"""The converter interface and its registries: one module per model family, imported only when asked for.

A conversion has up to three converters, each found by the `architectures[0]` of its checkpoint's config.json:
- a text converter (`TEXT`, the target GGUF): `BASENAME` (file-name stem) and
  `plan_target(md) -> (ConversionPlan, params)`; `params` carries at least `hidden`, `vocab_size`, `n_layer` and
  `ctx_len`, which the mmproj and draft converters are planned against;
- an mmproj converter (`MMPROJ`, keyed by the *target's* architecture; absent: a text-only model):
  `plan_mmproj(md, text_hidden, downsample=None) -> ConversionPlan | None` (None: this checkpoint has no vision tower);
- a draft converter (`DRAFT`, keyed by the *draft's* architecture):
  `plan_draft(dmd, *, target, target_plan, target_params) -> ConversionPlan`, checking every pairing rule.
Every converter builds its plan from ggufbridge.arch.plan's `Row` tables, `planned` and `check_leftover`.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from ggufbridge.errors import UnsupportedArchitecture

TEXT = {"MiniCPMV4_7ForConditionalGeneration": "minicpmv4_7"}
MMPROJ = {"MiniCPMV4_7ForConditionalGeneration": "minicpmv4_7_vision"}
DRAFT = {"Qwen3DSparkModel": "dspark"}


class TextConverter(Protocol):
    BASENAME: str

    def plan_target(self, md): ...


class MmprojConverter(Protocol):
    def plan_mmproj(self, md, text_hidden: int, downsample: str | None = None): ...


class DraftConverter(Protocol):
    def plan_draft(self, dmd, *, target, target_plan, target_params): ...


def text_converter(config: dict) -> TextConverter:
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise UnsupportedArchitecture(f"config.json: 'architectures' must name the model class (expected one of "
                                      f"{sorted(TEXT)}), found {archs!r}")
    if archs[0] not in TEXT:
        raise UnsupportedArchitecture(f"config.json: architecture {archs[0]!r} is not supported (expected one of "
                                      f"{sorted(TEXT)})")
    return importlib.import_module(f"ggufbridge.arch.{TEXT[archs[0]]}")


def mmproj_converter(config: dict) -> MmprojConverter | None:
    """The vision tower's converter for this target architecture, or None when it has none (text-only)."""
    archs = config.get("architectures") or [None]
    module = MMPROJ.get(archs[0])
    return importlib.import_module(f"ggufbridge.arch.{module}") if module else None


def draft_converter(config: dict, where: str) -> DraftConverter:
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or archs[0] not in DRAFT:
        raise UnsupportedArchitecture(f"{where}: draft architecture must be one of {list(DRAFT)}, found {archs!r}")
    return importlib.import_module(f"ggufbridge.arch.{DRAFT[archs[0]]}")

"""Converters by Hugging Face architecture string. One module per model family; imported only when asked for."""

from __future__ import annotations

import importlib
from types import ModuleType

from ggufbridge.errors import UnsupportedArchitecture

# HF `architectures[0]` → module in ggufbridge.arch providing `plan_files(model_dir, options) -> list[OutputFile]`
ARCHITECTURES = {
    "MiniCPMV4_7ForConditionalGeneration": "minicpmv4_7",
}


def converter_for(config: dict) -> ModuleType:
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise UnsupportedArchitecture(
            f"config.json: 'architectures' must name the model class (expected one of {sorted(ARCHITECTURES)}), found {archs!r}"
        )
    module = ARCHITECTURES.get(archs[0])
    if module is None:
        raise UnsupportedArchitecture(
            f"config.json: architecture {archs[0]!r} is not supported (expected one of {sorted(ARCHITECTURES)})"
        )
    return importlib.import_module(f"ggufbridge.arch.{module}")

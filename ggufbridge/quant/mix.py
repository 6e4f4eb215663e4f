"""Quantisation recipes: TOML files mapping each tensor class (ggufbridge.quant.classes) to a tensor type.

Packaged recipes live in ggufbridge/recipes/quant/NAME.toml; a user may pass a path to their own file, optionally
starting from a packaged one with `base = "hq4"` and overriding some `[types]` entries. A `[tensors]` table sets
single tensors by their GGUF name (what `quantize --fit-bytes` writes: a type per layer and expert projection);
`[fit]` is the optimiser's record of how the mix was chosen (budget, predicted KL), kept for the reader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources

from ggufbridge.errors import QuantError
from ggufbridge.quant import types as qt
from ggufbridge.quant.classes import BY_NAME, CLASSES, classify
from ggufbridge import textfile

KEPT_TYPE = "F32"  # what the converter writes for every class llama.cpp never quantises
TOP_KEYS = {"description", "file_type", "types", "base", "tensors", "fit"}


@dataclass(frozen=True)
class Mix:
    name: str
    description: str
    file_type: str  # llama-quantize type argument (→ general.file_type); all tensor types are explicit
    types: dict[str, str]  # class name → tensor type, for every class
    source: str  # "packaged" or the user's file
    tensors: dict[str, str] = field(default_factory=dict)  # GGUF tensor name → type, over its class's type
    fit: dict = field(default_factory=dict)

    def type_of(self, cls: str) -> str:
        return self.types[cls]

    def type_for(self, tensor: str, cls: str) -> str:
        return self.tensors.get(tensor, self.types[cls])


def _dir():
    return resources.files("ggufbridge").joinpath("recipes", "quant")


def packaged_names() -> list[str]:
    return textfile.packaged_names(_dir())


def load_mix(name_or_path: str) -> Mix:
    """A packaged mix by name, or a user TOML file by path (optionally `base = "NAME"` + overrides)."""
    raw, source, name = textfile.load_toml(name_or_path, _dir(), "quantisation recipe", QuantError)
    return validate(raw, name, source)


def validate(raw: dict, name: str, source: str = "packaged") -> Mix:
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise QuantError(f"recipe {name}: unknown key(s) {', '.join(unknown)}; "
                         f"expected some of {', '.join(sorted(TOP_KEYS))}")
    table = raw.get("types")
    if not isinstance(table, dict):
        raise QuantError(f"recipe {name}: [types] must be a table of class = type, found {table!r}")
    bad = sorted(set(table) - set(BY_NAME))
    if bad:
        raise QuantError(f"recipe {name}: unknown tensor class(es) {', '.join(bad)}; expected some of "
                         f"{', '.join(BY_NAME)}")
    types = {}
    for c in CLASSES:
        where = f"recipe {name}: types.{c.name}"
        if c.kept:
            t = qt.tensor_type(str(table.get(c.name, KEPT_TYPE)), where)
            if t != KEPT_TYPE:
                raise QuantError(f"{where}: llama.cpp never quantises this class ({c.label}); expected "
                                 f"{KEPT_TYPE}, found {t}")
        else:
            if c.name not in table:
                raise QuantError(f"{where}: missing (every quantised class needs a type)")
            t = qt.tensor_type(str(table[c.name]), where)
        types[c.name] = t
    ft = qt.file_type(str(raw.get("file_type", "")) or "?") if raw.get("file_type") else None
    if ft is None:
        raise QuantError(f"recipe {name}: file_type (a llama-quantize type such as Q4_K_M) is required")
    if qt.FILE_TYPES[ft][0] in ("F32", "F16", "BF16"):
        # the quantiser applies per-tensor types only on top of a quantised default
        raise QuantError(f"recipe {name}: file_type must be a quantised type, found {ft}")
    desc = raw.get("description", "")
    if not isinstance(desc, str):
        raise QuantError(f"recipe {name}: description must be a string, found {desc!r}")
    tensors = raw.get("tensors", {})
    if not isinstance(tensors, dict):
        raise QuantError(f"recipe {name}: [tensors] must be a table of \"tensor name\" = type, found {tensors!r}")
    per_tensor = {}
    for tname, t in tensors.items():
        where = f"recipe {name}: tensors.{tname}"
        c = classify(tname)
        if c.name == "other" or c.kept:
            raise QuantError(f"{where}: expected the name of a quantisable tensor (e.g. blk.0.ffn_down_exps.weight), "
                             f"found one of class {c.name}")
        per_tensor[tname] = qt.tensor_type(str(t), where)
    fit = raw.get("fit", {})
    if not isinstance(fit, dict):
        raise QuantError(f"recipe {name}: [fit] must be a table, found {fit!r}")
    return Mix(name=name, description=desc, file_type=ft, types=types, source=source, tensors=per_tensor,
                       fit=fit)

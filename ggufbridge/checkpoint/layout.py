"""Tensor-name layouts in which MiniCPM-V 4.7 and its DSpark draft are published, mapped to one canonical form.

The converter reads canonical names only: transformers-native names for the target (`model.language_model.*`,
`model.vision_tower.*`, `model.merger.*`, `lm_head.*`, `mtp.*`) and bare upstream names for the draft (`layers.N.*`,
`fc.*`, ...). `canonicalize` finds the one layout that has every name of a checkpoint and renames through its
table. TensorRefs keep their real names, so reads, shape errors and `verify --source` see the source as stored.
Facts and their sources: docs/formats.md, "Checkpoint layouts".
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from ggufbridge.checkpoint.safetensors import TensorRef
from ggufbridge.errors import CheckpointError

# Rename templates: a source that ends in "." is a prefix (the rest of the name is kept), any other source is a
# whole name; `{i}` is a decimal index carried over to the canonical name.
Rename = tuple[str, str]

# Top-level names of the DSpark drafter (generic Qwen3DSparkModel: vLLM 0.33 qwen3_dspark.py, sglang 0.5.23 dspark.py)
DRAFT_ROOTS = ("layers.{i}.", "fc.", "hidden_norm.", "norm.", "markov_head.", "confidence_head.", "embed_tokens.",
               "lm_head.", "d2t", "t2d")


@dataclass(frozen=True)
class Layout:
    name: str
    family: str  # what the names describe: "MiniCPM-V 4.7" | "DSpark"
    renames: tuple[Rename, ...]  # (source, canonical), first match wins

    def canonical(self, name: str) -> str | None:
        """The canonical name of `name` in this layout, or None when the layout has no such name."""
        for src, dst in self.renames:
            m = _regex(src).fullmatch(name)
            if m:
                return dst.replace("{i}", m.groupdict().get("i") or "") + m["rest"]
        return None

    def roots(self, n: int = 3) -> str:
        """The first `n` source names/prefixes, for messages."""
        srcs = list(dict.fromkeys(src for src, _ in self.renames))
        return ", ".join(srcs[:n]) + (", …" if len(srcs) > n else "")


@functools.lru_cache(maxsize=None)
def _regex(src: str) -> re.Pattern:
    body = re.escape(src).replace(re.escape("{i}"), r"(?P<i>\d+)")
    return re.compile(body + (r"(?P<rest>.+)" if src.endswith(".") else r"(?P<rest>)"))


# One row per layout; when several have every name (only for degenerate name sets) the first wins.
LAYOUTS: tuple[Layout, ...] = (
    # transformers 5.23 modeling_minicpmv4_7.py (what save_pretrained writes); vLLM 0.33; OpenBMB's llama.cpp fork
    Layout("transformers", "MiniCPM-V 4.7", (
        ("model.language_model.", "model.language_model."),
        ("model.vision_tower.", "model.vision_tower."),  # vit_merger.* lives inside the tower here
        ("model.merger.", "model.merger."),
        ("lm_head.", "lm_head."),
        ("mtp.", "mtp."),  # declared by the 4.7 config, not shipped
        ("model.mtp.", "model.mtp."),
    )),
    # sglang 0.5.23 minicpmv.py `_V4_7_WEIGHT_PREFIXES` + `_v4_7_to_v4_6_weight_name`; mlx-vlm 0.7.10 accepts it too
    Layout("native-4.7", "MiniCPM-V 4.7", (
        ("llm.model.", "model.language_model."),
        ("llm.lm_head.", "lm_head."),
        # No loader attests where this layout keeps MTP weights (sglang loads none): under the LLM (`llm.mtp.`) or at
        # the top level as Qwen3.5 releases do. Either only reaches the "MTP present, not converted" note.
        ("llm.mtp.", "mtp."),
        ("mtp.", "mtp."),
        ("vit_merger.", "model.vision_tower.vit_merger."),  # top level here; its MLP keeps linear_1 / linear_2
        ("vpm.", "model.vision_tower."),
        # the connector MLPs are nn.Sequential(Linear, GELU, Linear): indices 0 and 2
        ("resampler.mlp.{i}.mlp.0.", "model.merger.mlp.{i}.linear_1."),
        ("resampler.mlp.{i}.mlp.2.", "model.merger.mlp.{i}.linear_2."),
        ("resampler.", "model.merger."),
    )),
    Layout("dspark", "DSpark", tuple((r, r) for r in DRAFT_ROOTS)),
    # under `model.`, with the head and the vocabulary maps outside it (the usual *ForCausalLM split) or inside
    Layout("dspark-model-prefixed", "DSpark",
           tuple(("model." + r, r) for r in DRAFT_ROOTS) + (("lm_head.", "lm_head."), ("d2t", "d2t"), ("t2d", "t2d"))),
)


def detect(names, where: str | Path = "checkpoint") -> tuple[Layout, dict[str, str]]:
    """(the first layout that has every name, source name → canonical name). Names of no layout, or of several
    layouts mixed, are refused."""
    names = sorted(names)
    has: dict[str, dict[str, str]] = {}
    for lay in LAYOUTS:
        has[lay.name] = {n: c for n in names if (c := lay.canonical(n)) is not None}
        if len(has[lay.name]) == len(names):
            return lay, has[lay.name]
    unknown = [n for n in names if not any(n in h for h in has.values())]
    if unknown:
        expected = "; ".join(f"{lay.name}: {lay.roots()}" for lay in LAYOUTS)
        raise CheckpointError(f"{where}: {len(unknown)} tensor name(s) belong to no known layout, e.g. {unknown[0]} "
                              f"(expected the names of one layout — {expected})")
    best = max(LAYOUTS, key=lambda lay: len(has[lay.name]))
    stray = [n for n in names if n not in has[best.name]]
    other = next(lay for lay in LAYOUTS if stray[0] in has[lay.name])
    example = next(n for n in names if n in has[best.name])
    raise CheckpointError(f"{where}: tensor names mix layouts: expected one layout, found {best.name} names "
                          f"(e.g. {example}) and {len(stray)} {other.name} name(s) (e.g. {stray[0]})")


def canonicalize(tensors: dict[str, TensorRef],
                 where: str | Path = "checkpoint") -> tuple[Layout, dict[str, TensorRef]]:
    """(the layout found, the same TensorRefs keyed by their canonical names)."""
    layout, canonical = detect(tensors, where)
    out: dict[str, TensorRef] = {}
    for name, ref in tensors.items():
        key = canonical[name]
        if key in out:  # e.g. vit_merger.x and vpm.vit_merger.x, or model.d2t and d2t
            raise CheckpointError(f"{where}: tensor {key} is stored twice in the {layout.name} layout "
                                  f"(as {out[key].name} and {name})")
        out[key] = ref
    return layout, out


def expect_family(layout: str, family: str, where: str | Path = "checkpoint") -> None:
    """Refuse e.g. a draft's shards given as the target: its names are a known layout, of the other model."""
    found = next(lay for lay in LAYOUTS if lay.name == layout)
    if found.family != family:
        expected = ", ".join(lay.name for lay in LAYOUTS if lay.family == family)
        raise CheckpointError(f"{where}: expected the tensor names of a {family} checkpoint ({expected}), "
                              f"found the {found.name} layout of a {found.family} checkpoint")

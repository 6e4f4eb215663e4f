"""ggufbridge's patch series over the pinned llama.cpp (patches/llama.cpp/NNNN-name.patch).

scripts/build_runtime.sh applies the series in order and keys its build folder by `series_hash()`; the build's
runtime.json lists the patches it carries. A runtime built elsewhere (`--llama-bin`, `LLAMA_CPP_BIN`) is
recognised by what its libraries contain: `CANVAS_KEY` is a string that only the canvas M-RoPE patch adds
to libmtmd, `ROLLBACK_KEY` one that only the recurrent-rollback patch adds to libllama.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

PATCH_DIR = Path(__file__).resolve().parents[2] / "patches" / "llama.cpp"
CANVAS_KEY = "clip.minicpmv.canvas_mrope"  # mmproj key read only by a patched libmtmd
# the graph input that patch memory-recurrent-rollback-snapshots-follow-cell adds: without that patch, drafting on
# several slots can roll a stream back into another one's recurrent state (docs/benchmarks.md, "Drafting with
# several streams")
ROLLBACK_KEY = "rs_s_copy_src"
STOCK_IMAGE_LOSS = ("a stock llama.cpp gives image tokens 1-D positions and letterboxes slices instead of "
                    "MiniCPM-V 4.7's canvas M-RoPE and stretched slices (tail KL up to 1.68 on synthetic "
                    "models, docs/vision.md); build the patched runtime with scripts/build_runtime.sh")


# What an mmproj gives on a runtime (docs/vision.md, "Which llama.cpp runs which file"): the runtime is read for
# the projector names it knows and for the canvas key; the file for its projector type and our keys.
UPSTREAM_47_LOSS = ("this runtime runs the minicpmv4_7 projector as upstream llama.cpp does: processor slicing and "
                    "<image_id>, but 1-D positions instead of canvas M-RoPE and video frames as pictures "
                    "(docs/vision.md); build the patched runtime with scripts/build_runtime.sh")
FOREIGN_46_LOSS = ("this mmproj has projector minicpmv4_6 without ggufbridge's clip.minicpmv.* keys (not written "
                   "by `ggufbridge convert`): images get the stock 1-D layout and llava-uhd slicing even on the "
                   "patched runtime; convert the checkpoint with ggufbridge, or use upstream's minicpmv4_7 file")


def image_fidelity(rt, kv: dict) -> tuple[str | None, str | None]:
    """(problem, loss) for serving images with the mmproj whose metadata is `kv` on runtime `rt` (locate.Runtime):
    `problem` when the runtime cannot load the projector at all, `loss` (one line) when it loads it but lays images
    out other than MiniCPM-V 4.7 does; (None, None) when images are served exactly."""
    proj = next((kv[k] for k in ("clip.projector_type", "clip.vision.projector_type") if isinstance(kv.get(k), str)),
                None)
    if proj is None or not rt.has_string(proj):
        return (f"this runtime's libmtmd does not know projector {proj!r} (it cannot load this mmproj); "
                + ("a runtime with upstream's MiniCPM-V 4.7 support, or the patched one with it, can" if
                   proj == "minicpmv4_7" else "build the patched runtime with scripts/build_runtime.sh"), None)
    canvas = rt.canvas_mrope
    if not canvas:
        return None, (UPSTREAM_47_LOSS if proj == "minicpmv4_7" else STOCK_IMAGE_LOSS)
    if proj == "minicpmv4_6" and kv.get(CANVAS_KEY) is not True:
        return None, FOREIGN_46_LOSS
    return None, None


# What a patch's subject may name before its colon ("mtmd-helper, server: ..."), and the files of the pinned tree
# each name covers. A patch touches the files of the components it names and nothing else, and touches each
# one it names: one concern, said where a reviewer reads first. A new subsystem gets its row here.
COMPONENTS: dict[str, tuple[str, ...]] = {
    "kv-cache": ("src/llama-kv-cache.",),
    "kv-cells": ("src/llama-kv-cells.",),
    "memory-recurrent": ("src/llama-memory-recurrent.",),
    "graph": ("src/llama-graph.",),
    "models": ("src/models/",),  # one model family's graph (src/models/<arch>.cpp)
    "batch": ("src/llama-batch.",),
    "llama-context": ("src/llama-context.",),
    "llama-ext": ("src/llama-ext.h", "src/llama-model.cpp"),
    "mtmd": ("tools/mtmd/clip", "tools/mtmd/mtmd.", "tools/mtmd/mtmd-image.", "tools/mtmd/models/"),
    "mtmd-helper": ("tools/mtmd/mtmd-helper.",),
    "server": ("tools/server/",),
    "llama-sampler": ("src/llama-sampler.",),
    "common": ("common/",),
    "ggml-cuda": ("ggml/src/ggml-cuda/",),
    "tests": ("tests/",),  # upstream's own tests (test-backend-ops cases for a kernel change)
}


@dataclass(frozen=True)
class Patch:
    path: Path

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def subject(self) -> str:
        """The header's `Subject:` line (what the patch does)."""
        for line in self.path.read_text(encoding="utf-8").splitlines():
            if line.startswith("Subject:"):
                return line.removeprefix("Subject:").strip().removeprefix("[PATCH]").strip()
            if line.startswith("diff --git"):
                break
        return ""


    @property
    def components(self) -> list[str]:
        """The subsystems the subject names before its colon."""
        head, sep, _ = self.subject.partition(":")
        return [c.strip() for c in head.split(",")] if sep else []

    @property
    def files(self) -> list[str]:
        """The files of the pinned tree the diff touches."""
        return [line.split()[2].removeprefix("a/") for line in self.path.read_text(encoding="utf-8").splitlines()
                if line.startswith("diff --git ")]


    def concern_problems(self) -> list[str]:
        """What breaks the one-concern rule: no component named, an unknown one, a file outside the named ones,
        a named one left untouched (empty when the patch keeps to what its subject says)."""
        if not self.components:
            return ["the subject names no subsystem ('mtmd: ...')"]
        unknown = [c for c in self.components if c not in COMPONENTS]
        if unknown:
            return [f"{unknown} not in patches.COMPONENTS"]
        covered = {c: [f for f in self.files if f.startswith(COMPONENTS[c])] for c in self.components}
        problems = [f"touches {f}, outside {self.components}" for f in self.files
                    if not any(f in fs for fs in covered.values())]
        return problems + [f"names {c} but leaves it alone" for c, fs in covered.items() if not fs]


def series(patch_dir: Path = PATCH_DIR) -> list[Patch]:
    """The patches in application order (empty without a patches folder, e.g. an installed wheel)."""
    if not patch_dir.is_dir():
        return []
    return [Patch(p) for p in sorted(patch_dir.glob("[0-9][0-9][0-9][0-9]-*.patch"))]


def series_hash(patches: list[Patch] | None = None) -> str:
    """The build cache key of scripts/build_runtime.sh: sha256 over each patch's file name, a newline and its
    bytes, in order; the first 12 hex digits ("none" for no patches)."""
    patches = series() if patches is None else patches
    if not patches:
        return "none"
    h = hashlib.sha256()
    for p in patches:
        h.update(p.path.name.encode() + b"\n")
        h.update(p.path.read_bytes())
    return h.hexdigest()[:12]

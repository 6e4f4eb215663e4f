"""ggufbridge's patch series over the pinned llama.cpp, in two parts, shipped with the package
(ggufbridge/runtime/native/, docs/patches.md is the ledger):

- `llama.cpp/`: what MiniCPM-V 4.7 needs to be served correctly (exact images and video, recurrent-state
  correctness, request and image guards); every build applies it.
- `llama.cpp-perf/`: performance patches, applied after it; CUDA builds apply it by default, CPU builds only with
  `--perf` (build_runtime.sh): each stays only with a recorded GPU gain.

Within a part the files apply in name order (NNNN-name.patch); a number names a patch for good, so a part may skip
numbers. This module is the one home of the rule that picks a build's patches and of its hash, the build's cache
key: native/build_runtime.sh asks it (`python3 patches.py select ...`, stdlib only, no package import), and
`locate` finds the build by the same hash. The build's runtime.json lists the patches it carries.

A runtime built elsewhere (`--llama-bin`, `LLAMA_CPP_BIN`) is recognised by what its libraries contain:
`CANVAS_KEY` is a string that only the canvas M-RoPE patch adds to libmtmd, `ROLLBACK_KEY` one that only the
recurrent-rollback patch adds to libllama.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

NATIVE = Path(__file__).resolve().parent / "native"
PARTS = ("llama.cpp", "llama.cpp-perf")  # application order
CORE, PERF = (NATIVE / part for part in PARTS)
PATCH_DIR = CORE
CANVAS_KEY = "clip.minicpmv.canvas_mrope"  # mmproj key read only by a patched libmtmd
# the graph input that patch memory-recurrent-rollback-snapshots-follow-cell adds: without that patch, drafting on
# several slots can roll a stream back into another one's recurrent state (docs/benchmarks.md, "Drafting with
# several streams")
ROLLBACK_KEY = "rs_s_copy_src"
STOCK_IMAGE_LOSS = ("a stock llama.cpp gives image tokens 1-D positions and letterboxes slices instead of "
                    "MiniCPM-V 4.7's canvas M-RoPE and stretched slices (tail KL up to 1.68 on synthetic "
                    "models, docs/vision.md); build the patched runtime with `ggufbridge build-runtime`")


# What an mmproj gives on a runtime (docs/vision.md, "Which llama.cpp runs which file"): the runtime is read for
# the projector names it knows and for the canvas key; the file for its projector type and our keys.
UPSTREAM_47_LOSS = ("this runtime runs the minicpmv4_7 projector as upstream llama.cpp does: processor slicing and "
                    "<image_id>, but 1-D positions instead of canvas M-RoPE and video frames as pictures "
                    "(docs/vision.md); build the patched runtime with `ggufbridge build-runtime`")
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
                   proj == "minicpmv4_7" else "build the patched runtime with `ggufbridge build-runtime`"), None)
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
    "llama-ext": ("src/llama-ext.h", "src/llama-model.cpp", "src/llama-model.h"),
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
    """The patches of one folder in application order (empty without it)."""
    if not patch_dir.is_dir():
        return []
    return [Patch(p) for p in sorted(patch_dir.glob("[0-9][0-9][0-9][0-9]-*.patch"))]


def perf_default(variant: str) -> bool:
    """Whether a build of `variant` ("cpu", "cuda") applies the performance part unless told otherwise: CUDA
    builds do, where its gains were measured; nothing in it was shown to pay on a CPU (docs/patches.md)."""
    return variant == "cuda"


def build_series(variant: str = "cpu", perf: bool | None = None) -> list[Patch]:
    """The patches a build of `variant` applies, in order: the core part, then the performance part when `perf`
    (default: `perf_default(variant)`)."""
    perf = perf_default(variant) if perf is None else perf
    return series(CORE) + (series(PERF) if perf else [])


def all_patches() -> list[Patch]:
    """Both parts, core first (what `doctor`, the ledger and the tests list)."""
    return series(CORE) + series(PERF)


def part_of(p: Patch) -> str:
    """The part ("llama.cpp" or "llama.cpp-perf") whose folder holds `p`."""
    return p.path.parent.name


def series_hash(patches: list[Patch] | None = None) -> str:
    """The build cache key of native/build_runtime.sh: sha256 over each patch's file name, a newline and its
    bytes, in application order; the first 12 hex digits ("none" for no patches). Default: a CPU build's."""
    patches = build_series() if patches is None else patches
    if not patches:
        return "none"
    h = hashlib.sha256()
    for p in patches:
        h.update(p.path.name.encode() + b"\n")
        h.update(p.path.read_bytes())
    return h.hexdigest()[:12]


class SelectError(ValueError):
    pass


def select(variant: str, perf: bool | None = None, without: list[str] = (), with_files: list[str] = ()) -> list[Patch]:
    """build_runtime.sh's choice: the build's series, less the one patch whose file name contains each `without`
    name, then each extra file of `with_files` in order (a candidate measured against the series)."""
    chosen = build_series(variant, perf)
    for name in without:
        hits = [p for p in chosen if name in p.path.name]
        if len(hits) != 1:
            raise SelectError(f"--without-patch '{name}' names {len(hits)} patches of the series "
                              f"({' '.join(p.path.name for p in hits) or 'none'}), not one")
        chosen.remove(hits[0])
    for f in with_files:
        if not Path(f).is_file():
            raise SelectError(f"no patch file '{f}'")
        chosen.append(Patch(Path(f).resolve()))
    return chosen


def main(argv: list[str] | None = None) -> int:
    """`python3 patches.py select --variant cpu|cuda [--perf|--no-perf] [--without NAME]... [--with FILE]...`:
    the hash on the first line, then one patch file a line, in application order (build_runtime.sh reads it).
    `python3 patches.py hash ...` (the same options): the hash only."""
    ap = argparse.ArgumentParser(prog="patches.py")
    ap.add_argument("what", choices=("select", "hash"))
    ap.add_argument("--variant", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--perf", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--without", action="append", default=[])
    ap.add_argument("--with", dest="with_files", action="append", default=[])
    a = ap.parse_args(argv)
    try:
        chosen = select(a.variant, a.perf, a.without, a.with_files)
    except SelectError as e:
        print(f"build_runtime: {e}", file=sys.stderr)
        return 2
    print(series_hash(chosen))
    if a.what == "select":
        for p in chosen:
            print(p.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

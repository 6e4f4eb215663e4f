"""What a MiniCPM-V 4.7 mmproj gives on a given llama.cpp build: exact images, inexact ones (1-D positions,
other slicing), or no load at all — decided from what the file is (its projector type and keys) and what the
runtime's libmtmd knows, never from who wrote the file. docs/vision.md has the table this encodes.

`image_fidelity(mmproj, runtime)` returns None when images are served exactly, else one line for `doctor` and
`serve` to print. `runtime` is anything with the two booleans of `runtime.locate.Runtime`: `canvas_mrope` (the
ggufbridge series: processor slicing, <image_id>, canvas M-RoPE, video frames) and `knows_minicpmv4_7` (libmtmd
has upstream's projector name for the 4.7 tower).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from ggufbridge.ggufio import names

INEXACT_STOCK = ("1-D positions instead of canvas M-RoPE, llava-uhd (letterboxed) slicing, no <image_id>, video "
                 "frames as separate images")
INEXACT_UPSTREAM = ("1-D positions instead of canvas M-RoPE (each crop its own chunk), video frames as separate "
                    "images")
REBUILD = "build the patched runtime with scripts/build_runtime.sh"


class RuntimeVision(Protocol):
    canvas_mrope: bool
    knows_minicpmv4_7: bool


def mmproj_kind(kv: dict) -> str:
    """'ours' (minicpmv4_6 with the keys that ask for the 4.7 processor and canvas M-RoPE), 'upstream-4.7'
    (projector minicpmv4_7), 'plain-4.6' (minicpmv4_6 without them) or 'other'."""
    ptype = kv.get(names.CLIP_PROJECTOR_TYPE) or kv.get(names.CLIP_VISION_PROJECTOR_TYPE)
    if ptype == names.PROJECTOR_MINICPMV4_7:
        return "upstream-4.7"
    if ptype != names.PROJECTOR_MINICPMV4_6:
        return "other"
    asks = kv.get(names.MINICPMV_CANVAS_MROPE) is True and kv.get(names.MINICPMV_PROCESSOR_SLICING) is True
    return "ours" if asks else "plain-4.6"


def fidelity_for(kind: str, runtime: RuntimeVision) -> str | None:
    if kind == "other":
        return "images: not a MiniCPM-V 4.6/4.7 projector (minicpmv4_6 or minicpmv4_7): not checked"
    if kind == "plain-4.6":
        return (f"images inexact on any runtime: this mmproj (minicpmv4_6 without the clip.minicpmv.* keys) asks "
                f"for the MiniCPM-V 4.6 path: {INEXACT_STOCK}; convert with ggufbridge for exact images")
    if runtime.canvas_mrope and (kind == "ours" or runtime.knows_minicpmv4_7):
        return None
    if kind == "upstream-4.7" and not runtime.knows_minicpmv4_7:
        return f"images: this runtime does not load projector minicpmv4_7 (unknown projector type); {REBUILD}"
    if kind == "upstream-4.7":
        return f"images inexact on this runtime (upstream MiniCPM-V 4.7 path): {INEXACT_UPSTREAM}; {REBUILD}"
    return f"images inexact on this runtime (stock minicpmv4_6 path): {INEXACT_STOCK}; {REBUILD}"


def image_fidelity(mmproj: str | os.PathLike, runtime: RuntimeVision) -> str | None:
    """None when `runtime` serves `mmproj`'s images exactly, else one line saying what is lost and what to do.
    Raises GGUFFileError for a file that is not a readable GGUF."""
    from ggufbridge.ggufio.reader import read_header

    return fidelity_for(mmproj_kind(read_header(Path(mmproj)).kv), runtime)

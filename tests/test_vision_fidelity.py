"""What each mmproj gives on each kind of runtime (docs/vision.md's table), decided from the file and libmtmd."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ggufbridge.ggufio import names
from ggufbridge.runtime import locate as loc
from ggufbridge.vision import fidelity as fid


@dataclass
class FakeRuntime:
    canvas_mrope: bool
    knows_minicpmv4_7: bool


OURS = {names.CLIP_PROJECTOR_TYPE: "minicpmv4_6", names.MINICPMV_PROCESSOR_SLICING: True,
        names.MINICPMV_CANVAS_MROPE: True}
UPSTREAM = {names.CLIP_PROJECTOR_TYPE: "minicpmv4_7", names.UPSTREAM_MAX_SLICE_NUMS: 9}
PLAIN = {names.CLIP_PROJECTOR_TYPE: "minicpmv4_6"}
PATCHED = FakeRuntime(True, True)  # pinned + our series
OLD_PATCHED = FakeRuntime(True, False)  # pinned + the series before it learnt minicpmv4_7
STOCK = FakeRuntime(False, False)  # the pinned tree as vendored
UPSTREAM_RT = FakeRuntime(False, True)  # upstream llama.cpp with 4.7 support

CASES = [  # file, runtime, expected: None (exact) or a fragment of the one line
    (OURS, PATCHED, None),
    (OURS, OLD_PATCHED, None),
    (OURS, STOCK, "stock minicpmv4_6 path"),
    (OURS, UPSTREAM_RT, "stock minicpmv4_6 path"),
    (UPSTREAM, PATCHED, None),
    (UPSTREAM, OLD_PATCHED, "does not load projector minicpmv4_7"),
    (UPSTREAM, STOCK, "does not load projector minicpmv4_7"),
    (UPSTREAM, UPSTREAM_RT, "upstream MiniCPM-V 4.7 path"),
    (PLAIN, PATCHED, "inexact on any runtime"),
    ({names.CLIP_PROJECTOR_TYPE: "qwen2vl_merger"}, PATCHED, "not a MiniCPM-V 4.6/4.7 projector"),
]


@pytest.mark.parametrize("kv,rt,want", CASES)
def test_fidelity_table(kv, rt, want):
    got = fid.fidelity_for(fid.mmproj_kind(kv), rt)
    if want is None:
        assert got is None
    else:
        assert want in got and "\n" not in got


def test_our_keys_must_be_true_to_count():
    """A file that spells the keys out but switches canvas M-RoPE off is not served exactly."""
    assert fid.mmproj_kind({**OURS, names.MINICPMV_CANVAS_MROPE: False}) == "plain-4.6"


def test_runtime_capabilities_are_read_from_libmtmd(tmp_path):
    """libmtmd names the projector types it loads as C strings; the canvas key is in the patched one only."""
    builds = {"stock": b"minicpmv4_6\0", "upstream": b"minicpmv4_6\0minicpmv4_7\0",
              "patched": b"minicpmv4_6\0minicpmv4_7\0clip.minicpmv.canvas_mrope\0"}
    want = {"stock": (False, False), "upstream": (False, True), "patched": (True, True)}
    for name, body in builds.items():
        d = tmp_path / name
        d.mkdir()
        (d / "libmtmd.so").write_bytes(b"\0clip.projector_type\0" + body)
        rt = loc.Runtime(bin_dir=d, source="--llama-bin")
        assert (rt.canvas_mrope, rt.knows_minicpmv4_7) == want[name], name

"""What a build's libmtmd knows, read from its C strings: the canvas key (our series) and upstream's projector name.
(What each mmproj gives on each build is patches.image_fidelity, tested in test_gguf_open.py.)"""

from __future__ import annotations

from ggufbridge.runtime import locate as loc


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

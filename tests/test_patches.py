"""The patch series over the pinned llama.cpp: its files, the build key, and how a runtime is recognised."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufbridge.cli import cli
from ggufbridge.runtime import locate as loc
from ggufbridge.runtime import patches

ROOT = Path(__file__).resolve().parents[1]


def test_every_patch_has_a_header_and_one_concern():
    series = patches.series()
    assert [p.name[:4] for p in series] == [f"{i:04d}" for i in range(1, len(series) + 1)]  # applied in order
    for p in series:
        text = p.path.read_text()
        head = text.split("\ndiff --git", 1)[0]
        assert head.startswith("From: ") and p.subject, p.name  # what, in the subject
        assert len(head.splitlines()) > 8, p.name  # and why, in the body
        assert "diff --git" in text


def test_series_hash_is_build_runtime_sh_cache_key():
    """Computed independently by the same shell pipeline build_runtime.sh runs."""
    files = " ".join(f"'{p.path}'" for p in patches.series())
    script = f"for f in {files}; do basename \"$f\"; cat \"$f\"; done | sha256sum | cut -c1-12"
    sh = subprocess.run(["bash", "-c", script],
                        capture_output=True, text=True, check=True).stdout.strip()
    assert patches.series_hash() == sh
    assert patches.series_hash([]) == "none"


def test_canvas_patch_is_recognised_in_the_library(tmp_path):
    """A build elsewhere (--llama-bin) is recognised by the key only the canvas patch adds to libmtmd."""
    for name, patched in (("stock", False), ("patched", True)):
        d = tmp_path / name / "bin"
        d.mkdir(parents=True)
        body = b"\0clip.projector_type\0minicpmv4_6\0" + (b"clip.minicpmv.canvas_mrope\0" if patched else b"")
        (d / "libmtmd.so").write_bytes(body)
        assert loc.Runtime(bin_dir=d, source="--llama-bin").canvas_mrope is patched


@pytest.mark.slow
def test_doctor_lists_the_patches_of_the_runtime():
    res = CliRunner().invoke(cli, ["doctor"])
    rt = loc.locate()
    assert rt.info.get("patch_hash") == patches.series_hash()  # the cached build is this checkout's series
    assert f"patches   ggufbridge series {patches.series_hash()}: " in res.stdout
    assert all(p.name in res.stdout for p in patches.series())
    assert "canvas M-RoPE and MiniCPM-V slicing: yes" in res.stdout
    assert "warning: vision" not in res.stderr

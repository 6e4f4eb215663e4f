"""The patch series over the pinned llama.cpp: its files, the build key, and how a runtime is recognised."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufbridge.cli import cli
from ggufbridge.runtime import locate as loc
from ggufbridge.runtime import patches

ROOT = Path(__file__).resolve().parents[1]


def assert_format_patch_with_a_why(p: patches.Patch) -> str:
    """format-patch output (git am's mbox line, From, Date, Subject), a body of a few sentences, a diff; the
    message part is returned."""
    head, _, rest = p.path.read_text().partition("\n---\n")
    lines = head.splitlines()
    assert lines[0].startswith("From 0000000000000000000000000000000000000000 "), p.name  # git am's mbox line
    assert lines[1].startswith("From: ") and lines[2].startswith("Date: ") and p.subject, p.name
    body = "\n".join(lines[4:]).strip()
    assert len(body.split()) >= 30, f"{p.name}: the body says why in a few sentences"
    assert "\ndiff --git " in rest
    return head


def test_every_patch_is_format_patch_output_with_a_why():
    series = patches.series()
    assert [p.name[:4] for p in series] == [f"{i:04d}" for i in range(1, len(series) + 1)]  # applied in order
    for p in series:
        assert_format_patch_with_a_why(p)


def test_every_patch_touches_exactly_the_components_its_subject_names():
    """One concern per patch, checked where it shows: a patch whose subject says "mtmd:" changes libmtmd and
    nothing else, and "mtmd-helper, server:" changes both and only those."""
    for p in patches.series():
        assert p.concern_problems() == [], p.name


def test_the_component_check_can_fail(tmp_path):
    """Ablation: a patch that says mtmd but also edits the server, and one that names a part it does not touch."""
    diff = "\n".join(["From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001", "From: x",
                      "Date: d", "Subject: [PATCH] {subject}", "", "why", "---",
                      "diff --git a/tools/mtmd/mtmd.cpp b/tools/mtmd/mtmd.cpp", "{more}"])
    for subject, more in (("mtmd: a", "diff --git a/tools/server/server.cpp b/tools/server/server.cpp"),
                          ("mtmd, server: a", "")):
        f = tmp_path / "0001-x.patch"
        f.write_text(diff.format(subject=subject, more=more))
        assert patches.Patch(f).concern_problems(), subject


@pytest.mark.slow
def test_series_round_trips_through_git(tmp_path):
    """scripts/patches.sh applies the series as commits (git am) and exports them back byte for byte: the files
    are what the tool writes, so the series is regenerated, never hand-edited."""
    res = subprocess.run(["bash", str(ROOT / "scripts" / "patches.sh"), "check"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "round-trips" in res.stderr


def test_series_hash_is_build_runtime_sh_cache_key():
    """Computed independently by the same shell pipeline build_runtime.sh runs."""
    files = " ".join(f"'{p.path}'" for p in patches.series())
    script = f"for f in {files}; do basename \"$f\"; cat \"$f\"; done | sha256sum | cut -c1-12"
    sh = subprocess.run(["bash", "-c", script],
                        capture_output=True, text=True, check=True).stdout.strip()
    assert patches.series_hash() == sh
    assert patches.series_hash([]) == "none"


def test_build_runtime_without_one_patch_keys_its_own_build():
    """--without-patch NAME (a benchmark's before/after builds) drops exactly one patch per flag: the reduced series
    gets its own cache key, the one the series' hash gives without those patches; a name matching none or several
    is refused with one line and exit 2, before anything is fetched or built."""
    script = ROOT / "scripts" / "build_runtime.sh"
    series = patches.series()
    gqa = [p for p in series if "fattn-gqa" in p.name]
    assert len(gqa) == 1
    res = subprocess.run(["bash", str(script), "--source-only", "--without-patch", "fattn-gqa"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    want = patches.series_hash([p for p in series if p is not gqa[0]])
    assert f"without {gqa[0].path.name} (hash {want})" in res.stderr and want != patches.series_hash()
    # repeated: the series without each (the anchor of the FA-at-depth benchmark drops the kernel and the mask patch)
    mask = [p for p in series if "mask-seq-summary" in p.name]
    res = subprocess.run(["bash", str(script), "--source-only", "--without-patch", "fattn-gqa",
                          "--without-patch", "mask-seq-summary"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    want2 = patches.series_hash([p for p in series if p is not gqa[0] and p is not mask[0]])
    assert f"without {gqa[0].path.name} {mask[0].path.name} (hash {want2})" in res.stderr and want2 != want
    for name in ("no-such-patch", "mtmd"):
        res = subprocess.run(["bash", str(script), "--without-patch", name], capture_output=True, text=True)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert "not one" in res.stderr


CANDIDATES = ROOT / "benchmarks" / "gpu" / "candidates"


def test_candidate_patches_are_series_patches_in_waiting():
    """The candidates (kernel changes measured on a GPU against the series before they join it) follow the series'
    rules: format-patch output with a why, one concern each, numbered after the series in the order they apply."""
    cands = patches.series(CANDIDATES)
    assert cands, "benchmarks/gpu/candidates/ is empty: drop this test with the folder"
    n = len(patches.series())
    assert [c.name[:4] for c in cands] == [f"{i:04d}" for i in range(n + 1, n + 1 + len(cands))]
    for c in cands:
        head = assert_format_patch_with_a_why(c)
        assert c.concern_problems() == [], c.name
        # each is off through an environment variable, so that one build measures before and after
        assert re.search(r"\b(GGML|LLAMA)_[A-Z0-9_]+=0\b", head), f"{c.name}: its off switch is in the message"


def test_build_runtime_with_candidate_patches_keys_its_own_build():
    """--with-patch FILE: the series and then FILE (repeatable, in order), keyed by the hash of all of them,
    computed here independently; a missing file is refused with one line and exit 2, before anything is built."""
    script = ROOT / "scripts" / "build_runtime.sh"
    cands = [c.path for c in patches.series(CANDIDATES)]
    args = [a for c in cands for a in ("--with-patch", str(c))]
    res = subprocess.run(["bash", str(script), "--source-only", *args], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    files = " ".join(f"'{f}'" for f in [p.path for p in patches.series()] + cands)
    pipeline = f"for f in {files}; do basename \"$f\"; cat \"$f\"; done | sha256sum | cut -c1-12"
    want = subprocess.run(["bash", "-c", pipeline], capture_output=True, text=True, check=True).stdout.strip()
    assert f"(hash {want})" in res.stderr and want != patches.series_hash()
    assert " ".join(c.name for c in cands) in res.stderr
    res = subprocess.run(["bash", str(script), "--with-patch", str(CANDIDATES / "no-such.patch")],
                         capture_output=True, text=True)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "no patch file" in res.stderr


@pytest.mark.slow
def test_candidate_patches_apply_on_top_of_the_series(tmp_path):
    """What a device build with STREAMS_CANDIDATES=1 does: the series' tree, then each candidate with patch -p1."""
    tree = tmp_path / "tree"
    res = subprocess.run(["bash", str(ROOT / "scripts" / "patches.sh"), "apply", str(tree)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    for c in patches.series(CANDIDATES):
        res = subprocess.run(["patch", "-p1", "--forward", "--batch", "-d", str(tree)], stdin=c.path.open(),
                             capture_output=True, text=True)
        assert res.returncode == 0, f"{c.name}: {res.stdout[-1000:]}"
    assert (tree / "ggml/src/ggml-cuda/mmvq-moe-shaped.cuh").is_file()


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


def test_cuda_flash_attention_patch_stays_in_the_cuda_backend():
    """The GQA flash-attention patch is one concern: the CUDA backend and upstream's op tests, nothing that a CPU
    build (the CI's, every test here) compiles differently."""
    (p,) = [p for p in patches.series() if "fattn-gqa" in p.name]
    files = [line.split(" b/", 1)[1] for line in p.path.read_text().splitlines() if line.startswith("diff --git ")]
    assert files and all(f.startswith("ggml/src/ggml-cuda/") or f == "tests/test-backend-ops.cpp" for f in files), files
    assert "ggml/src/ggml-cuda/fattn-mma-q.cuh" in files

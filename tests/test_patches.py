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


NOT_APPLIED = ROOT / "patches" / "not-applied"


def test_every_patch_is_format_patch_output_with_a_why():
    """Both parts (and the patches that left the series) are format-patch output with a why. A number names a patch
    for good: it is never given to a second one, in either part or among those that left (docs/patches.md cites
    them), so a part may skip numbers and a new patch takes the next free one."""
    parts = {part: patches.series(patches.NATIVE / part) for part in patches.PARTS}
    assert parts["llama.cpp"] and parts["llama.cpp-perf"]
    numbers = [p.name[:4] for ps in [*parts.values(), patches.series(NOT_APPLIED)] for p in ps]
    assert len(numbers) == len(set(numbers)), sorted(numbers)
    assert patches.all_patches() == parts["llama.cpp"] + parts["llama.cpp-perf"]  # core first: the order applied
    for p in patches.all_patches() + patches.series(NOT_APPLIED):
        assert_format_patch_with_a_why(p)


def test_builds_apply_the_core_part_and_cuda_builds_the_performance_part_too():
    """The rule of patches.build_series: every build the core part, CUDA builds (by default) then the performance
    part; --perf/--no-perf choose. Each choice has its own hash, so its own build folder."""
    core, perf = patches.series(patches.CORE), patches.series(patches.PERF)
    assert patches.build_series("cpu") == core and patches.build_series("cuda") == core + perf
    assert patches.build_series("cpu", perf=True) == core + perf and patches.build_series("cuda", perf=False) == core
    assert patches.series_hash() == patches.series_hash(core) != patches.series_hash(core + perf)
    assert all(patches.part_of(p) == "llama.cpp" for p in core)


def test_every_patch_touches_exactly_the_components_its_subject_names():
    """One concern per patch, checked where it shows: a patch whose subject says "mtmd:" changes libmtmd and
    nothing else, and "mtmd-helper, server:" changes both and only those."""
    for p in patches.all_patches():
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


def _pipeline_hash(files) -> str:
    """The hash rule computed apart from patches.py, by a shell pipeline over the files."""
    quoted = " ".join(f"'{f}'" for f in files)
    script = f"for f in {quoted}; do basename \"$f\"; cat \"$f\"; done | sha256sum | cut -c1-12"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.strip()


def test_series_hash_is_build_runtime_sh_cache_key():
    """The hash has one home (patches.py), which build_runtime.sh asks; checked here against the rule computed
    independently (a shell pipeline over the part folders' files), for a CPU and a CUDA build."""
    script = ROOT / "scripts" / "build_runtime.sh"
    core = sorted(patches.CORE.glob("[0-9]*.patch"))
    perf = sorted(patches.PERF.glob("[0-9]*.patch"))
    for flags, files in (([], core), (["--cuda"], core + perf), (["--perf"], core + perf)):
        res = subprocess.run(["bash", str(script), "--source-only", *flags], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr[-2000:]
        want = _pipeline_hash(files)
        assert f"{len(files)} patches (hash {want})" in res.stderr, (flags, res.stderr)
    assert patches.series_hash(patches.build_series("cuda")) == _pipeline_hash(core + perf)
    assert patches.series_hash([]) == "none"


def test_build_runtime_without_one_patch_keys_its_own_build():
    """--without-patch NAME (a benchmark's before/after builds) drops exactly one patch per flag: the reduced series
    gets its own cache key, the one the series' hash gives without those patches; a name matching none or several
    is refused with one line and exit 2, before anything is fetched or built."""
    script = ROOT / "scripts" / "build_runtime.sh"
    series = patches.build_series("cuda")
    gqa = [p for p in series if "fattn-gqa" in p.name]
    assert len(gqa) == 1
    res = subprocess.run(["bash", str(script), "--cuda", "--source-only", "--without-patch", "fattn-gqa"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    want = patches.series_hash([p for p in series if p is not gqa[0]])
    assert f"without {gqa[0].path.name} (hash {want})" in res.stderr and want != patches.series_hash(series)
    # repeated: the series without each (the anchor of the FA-at-depth benchmark drops the kernel and the mask patch)
    mask = [p for p in series if "mask-seq-summary" in p.name]
    res = subprocess.run(["bash", str(script), "--cuda", "--source-only", "--without-patch", "fattn-gqa",
                          "--without-patch", "mask-seq-summary"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    want2 = patches.series_hash([p for p in series if p is not gqa[0] and p is not mask[0]])
    assert f"without {gqa[0].path.name} {mask[0].path.name} (hash {want2})" in res.stderr and want2 != want
    # a CPU build has no performance part to drop a patch from
    for args in (["--without-patch", "no-such-patch"], ["--without-patch", "mtmd"], ["--without-patch", "fattn-gqa"]):
        res = subprocess.run(["bash", str(script), *args], capture_output=True, text=True)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert "not one" in res.stderr


def test_patches_that_left_the_series_wait_in_the_same_form():
    """patches/not-applied/ holds the performance patches without a recorded GPU gain (docs/patches.md): in the
    series' form, one concern each, so that a device session can measure one against the series
    (build_runtime.sh --cuda --with-patch FILE) and bring it back; each is in the ledger."""
    left = patches.series(NOT_APPLIED)
    assert left, "patches/not-applied/ is empty: drop this test with the folder"
    ledger = (ROOT / "docs" / "patches.md").read_text()
    for c in left:
        assert_format_patch_with_a_why(c)
        assert c.concern_problems() == [], c.name
        assert c.name in ledger, f"{c.name} is not in docs/patches.md"


def test_the_ledger_lists_every_patch_with_its_lines():
    """docs/patches.md has one row per patch of both parts, with the patch's own diffstat figures."""
    rows = {line.split("|")[1].strip().strip("`"): line for line in (ROOT / "docs" / "patches.md").read_text()
            .splitlines() if line.startswith("| `")}
    for p in patches.all_patches() + patches.series(NOT_APPLIED):
        assert p.name in rows, f"{p.name} has no row in docs/patches.md"
        stat = re.search(r"(\d+) insertions?\(\+\)(?:, (\d+) deletions?)?", p.path.read_text())
        assert f"+{stat.group(1)}/−{stat.group(2) or 0}" in rows[p.name], (p.name, rows[p.name])


def test_build_runtime_with_extra_patches_keys_its_own_build():
    """--with-patch FILE: the series and then FILE (repeatable, in order), keyed by the hash of all of them,
    computed here independently; a missing file is refused with one line and exit 2, before anything is built."""
    script = ROOT / "scripts" / "build_runtime.sh"
    extra = [c.path for c in patches.series(NOT_APPLIED)]
    args = [a for c in extra for a in ("--with-patch", str(c))]
    res = subprocess.run(["bash", str(script), "--cuda", "--source-only", *args], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    want = _pipeline_hash([p.path for p in patches.build_series("cuda")] + extra)
    assert f"(hash {want})" in res.stderr and want != patches.series_hash(patches.build_series("cuda"))
    assert " ".join(c.name for c in extra) in res.stderr
    res = subprocess.run(["bash", str(script), "--with-patch", str(NOT_APPLIED / "no-such.patch")],
                         capture_output=True, text=True)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "no patch file" in res.stderr


@pytest.mark.slow
def test_each_part_applies_on_its_own(tmp_path):
    """The core part alone, then the performance part on top of it (what CPU and CUDA builds apply), as git
    commits (git am: no fuzz); then the patches that left the series on top of both (patch -p1, as --with-patch)."""
    tree = tmp_path / "tree"
    res = subprocess.run(["bash", str(ROOT / "scripts" / "patches.sh"), "apply", str(tree), "--core"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"{len(patches.series(patches.CORE))} commits" in res.stderr
    res = subprocess.run(["bash", str(ROOT / "scripts" / "patches.sh"), "apply", str(tree)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"{len(patches.all_patches())} commits" in res.stderr
    for c in patches.series(NOT_APPLIED):
        res = subprocess.run(["patch", "-p1", "--forward", "--batch", "-d", str(tree)], stdin=c.path.open(),
                             capture_output=True, text=True)
        assert res.returncode == 0, f"{c.name}: {res.stdout[-1000:]}"


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
    carried = patches.build_series(rt.info.get("variant", "cpu"), perf=any(
        p.name in rt.patches for p in patches.series(patches.PERF)))
    assert rt.info.get("patch_hash") == patches.series_hash(carried)  # the cached build is this checkout's series
    assert f"patches   ggufbridge series {patches.series_hash(carried)}: " in res.stdout
    assert all(p.name in res.stdout for p in carried)
    assert "canvas M-RoPE and MiniCPM-V slicing: yes" in res.stdout
    assert "warning: vision" not in res.stderr


def test_cuda_flash_attention_patch_stays_in_the_cuda_backend():
    """The GQA flash-attention patch is one concern: the CUDA backend and upstream's op tests, nothing that a CPU
    build (the CI's, every test here) compiles differently."""
    (p,) = [p for p in patches.all_patches() if "fattn-gqa" in p.name]
    files = [line.split(" b/", 1)[1] for line in p.path.read_text().splitlines() if line.startswith("diff --git ")]
    assert files and all(f.startswith("ggml/src/ggml-cuda/") or f == "tests/test-backend-ops.cpp" for f in files), files
    assert "ggml/src/ggml-cuda/fattn-mma-q.cuh" in files

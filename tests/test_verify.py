"""`ggufbridge verify`: manifest hashes catch a flipped byte; the source comparison catches a tensor that was
changed and re-hashed. The references are hashlib and the checkpoint itself."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from gguf import GGUFReader

from ggufbridge.cli import cli
from ggufbridge.convert import convert


@pytest.fixture(scope="module")
def converted(make_ckpt, tmp_path_factory):
    ckpt = make_ckpt("tiny", dtype="bfloat16", vocab="small")
    out = tmp_path_factory.mktemp("verify") / "out"
    convert(ckpt, out, outtype="bf16", progress=False)  # target + mmproj
    return ckpt, out


def _copy(out: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(out, dst)
    return dst


def _verify(out: Path, *args) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["verify", str(out), *args])
    assert "Traceback" not in res.output
    return res.exit_code, res.output


def _target(out: Path) -> Path:
    man = json.loads((out / "manifest.json").read_text())
    return out / next(f["path"] for f in man["files"] if f["role"] == "target")


def _tensor_span(path: Path, name: str) -> tuple[int, int, str]:
    t = next(t for t in GGUFReader(str(path)).tensors if t.name == name)
    return int(t.data_offset), int(t.n_bytes), t.tensor_type.name


def test_clean_output_verifies(converted):
    ckpt, out = converted
    code, text = _verify(out, "--source", str(ckpt))
    assert code == 0, text
    assert text.rstrip().endswith("OK")
    # BF16 matrices are copies/permutations of the source: counted as equal to the source bytes
    assert " 0 equal to the source bytes" not in text and "0 differ" in text


def test_flipped_byte_is_caught_by_the_manifest(converted, tmp_path):
    _, out = converted
    out = _copy(out, tmp_path)
    target = _target(out)
    off, n, _ = _tensor_span(target, "blk.0.ffn_up_exps.weight")
    with open(target, "r+b") as f:
        f.seek(off + n // 2)
        b = f.read(1)
        f.seek(off + n // 2)
        f.write(bytes([b[0] ^ 0x01]))
    code, text = _verify(out)
    assert code == 3
    bad = [ln for ln in text.splitlines() if ln.strip().startswith("BAD")]
    assert len(bad) == 1 and target.name in bad[0] and "sha256" in bad[0]
    assert text.rstrip().endswith("FAILED")


def test_changed_passthrough_tensor_is_caught_by_the_source(converted, tmp_path):
    """A BF16 tensor altered in place and the manifest re-hashed: the files check passes, the source check not."""
    ckpt, out = converted
    out = _copy(out, tmp_path)
    target = _target(out)
    name = "blk.1.attn_gate.weight"  # a BF16 copy of in_proj_z with its value heads permuted
    off, n, t = _tensor_span(target, name)
    assert t == "BF16"
    with open(target, "r+b") as f:
        f.seek(off + 10)
        f.write(b"\x80\x3f")  # one element := 1.0
    man = json.loads((out / "manifest.json").read_text())
    for f in man["files"]:
        if f["role"] == "target":
            f["sha256"] = hashlib.sha256(target.read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(man))
    code, text = _verify(out)
    assert code == 0, text  # the manifest alone cannot tell
    code, text = _verify(out, "--source", str(ckpt))
    assert code == 3
    differs = [ln for ln in text.splitlines() if "DIFFERS" in ln]
    assert len(differs) == 1 and name in differs[0]


def test_changed_f32_tensor_is_caught(converted, tmp_path):
    """The norms are recomputed (+1) rather than copied: a change there is caught as well."""
    ckpt, out = converted
    out = _copy(out, tmp_path)
    target = _target(out)
    off, n, t = _tensor_span(target, "output_norm.weight")
    assert t == "F32"
    with open(target, "r+b") as f:
        f.seek(off)
        f.write(b"\x00\x00\x00\x00")
    man = json.loads((out / "manifest.json").read_text())
    for f in man["files"]:
        if f["role"] == "target":
            f["sha256"] = hashlib.sha256(target.read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(man))
    code, text = _verify(out, "--source", str(ckpt), "--json")
    rep = json.loads(text)
    assert code == 3 and not rep["ok"]
    assert [m for m in rep["mismatches"] if "output_norm.weight" in m]


def test_missing_file_and_missing_manifest(converted, tmp_path):
    _, out = converted
    out = _copy(out, tmp_path)
    _target(out).unlink()
    code, text = _verify(out)
    assert code == 3 and "missing" in text
    (out / "manifest.json").unlink()
    code, text = _verify(out)
    assert code == 2 and "no manifest.json" in text


def test_mmproj_written_with_a_non_default_downsample_verifies(make_ckpt, tmp_path):
    ckpt = make_ckpt("tiny", dtype="bfloat16", vocab="small")  # 16x by default
    out = tmp_path / "out"
    convert(ckpt, out, outtype="bf16", downsample="4x", progress=False)
    code, text = _verify(out, "--source", str(ckpt))
    assert code == 0, text


@pytest.mark.parametrize("with_source", [False, True])
def test_a_draft_source_that_cannot_be_checked_is_refused(converted, with_source):
    """--draft-source was silently ignored (verify said OK) without --source, or when the folder has no draft."""
    ckpt, out = converted
    args = ["--draft-source", str(ckpt)] + (["--source", str(ckpt)] if with_source else [])
    code, text = _verify(out, *args)
    assert code == 2, text
    assert ("lists no draft" if with_source else "--draft-source needs --source") in text, text

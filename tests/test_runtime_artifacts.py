"""OUT_DIR/manifest.json: the files serve/run/plan/bench use, and clear refusals when it is wrong."""

from __future__ import annotations

import hashlib
import json

import pytest
from click.testing import CliRunner

from ggufbridge.cli import cli
from ggufbridge.errors import ManifestError
from ggufbridge.runtime.artifacts import load_artifacts


def _out(tmp_path, files: dict[str, bytes], entries: list[dict] | None = None):
    out = tmp_path / "out"
    out.mkdir()
    for name, data in files.items():
        (out / name).write_bytes(data)
    if entries is None:
        entries = [{"role": "target", "path": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                    "type": "F16"} for name, data in files.items()]
    (out / "manifest.json").write_text(json.dumps({"files": entries, "source": {}, "ggufbridge": "0.1.0"}))
    return out


def test_roles_are_found(tmp_path):
    out = _out(tmp_path, {"t.gguf": b"tt", "m.gguf": b"mmm", "d.gguf": b"d"}, [
        {"role": "target", "path": "t.gguf", "bytes": 2}, {"role": "mmproj", "path": "m.gguf", "bytes": 3},
        {"role": "draft", "path": "d.gguf", "bytes": 1}])
    a = load_artifacts(out)
    assert (a.target.path.name, a.mmproj.path.name, a.draft.path.name) == ("t.gguf", "m.gguf", "d.gguf")


def test_hashes_are_checked_on_request(tmp_path):
    out = _out(tmp_path, {"t.gguf": b"abc"})
    load_artifacts(out, verify_hashes=True)
    (out / "t.gguf").write_bytes(b"abd")  # same size, other content
    load_artifacts(out)  # sizes only by default
    with pytest.raises(ManifestError, match="sha256"):
        load_artifacts(out, verify_hashes=True)


@pytest.mark.parametrize("entries, message", [
    ([{"role": "target", "path": "t.gguf", "bytes": 5}], "has 2 bytes, the manifest says 5"),
    ([{"role": "target", "path": "/etc/passwd", "bytes": 2}], "relative path inside OUT_DIR"),
    ([{"role": "target", "path": "../t.gguf", "bytes": 2}], "relative path inside OUT_DIR"),
    ([{"role": "weights", "path": "t.gguf", "bytes": 2}], "role expected one of target, mmproj, draft"),
    ([{"role": "mmproj", "path": "t.gguf", "bytes": 2}], "no file with role 'target'"),
    ([{"role": "target", "path": "t.gguf", "bytes": 2}, {"role": "target", "path": "t.gguf", "bytes": 2}],
     "a second 'target'"),
    ([{"role": "target", "path": "gone.gguf", "bytes": 2}], "is missing"),
    ([{"role": "target", "path": "t.gguf", "bytes": "2"}],
     r"bytes expected a file size \(an integer in \[0, 2\^64\)\)"),
])
def test_bad_manifests_are_refused(tmp_path, entries, message):
    out = _out(tmp_path, {"t.gguf": b"tt"}, entries)
    with pytest.raises(ManifestError, match=message):
        load_artifacts(out)


def test_missing_or_broken_manifest_through_the_cli(tmp_path):
    res = CliRunner().invoke(cli, ["plan", str(tmp_path)])
    assert res.exit_code == 2 and "no manifest.json" in res.stderr
    (tmp_path / "manifest.json").write_text("{not json")
    res = CliRunner().invoke(cli, ["serve", str(tmp_path), "--dry-run"])
    assert res.exit_code == 2 and "not valid JSON" in res.stderr and "Traceback" not in res.output
    (tmp_path / "manifest.json").write_text("[]")
    res = CliRunner().invoke(cli, ["run", str(tmp_path), "-p", "x"])
    assert res.exit_code == 2 and 'expected an object with a "files" list' in res.stderr


# Every reader of the manifest goes through ggufio.manifest.read_manifest: a manifest pointing outside OUT_DIR
# (or naming checkpoint files outside the checkpoint) is refused by each of them, before any file is opened.
def _readers():
    from ggufbridge.quant.imatrix import target_of
    from ggufbridge.verify import verify

    # run --image goes through serve's session (load_artifacts) since it is served by llama-server
    return {"serve/run/plan": load_artifacts, "verify": verify, "imatrix": target_of}


@pytest.mark.parametrize("reader", ["serve/run/plan", "verify", "imatrix"])
@pytest.mark.parametrize("manifest, message", [
    ({"files": [{"role": "target", "path": "../outside.gguf", "bytes": 2}]}, "relative path inside OUT_DIR"),
    ({"files": [{"role": "target", "path": "t.gguf", "bytes": 2}], "source": {"../../etc/passwd": "00"}},
     "inside the checkpoint folder"),
    ({"files": [{"role": "target", "path": "t.gguf", "bytes": 2, "sha256": 7}]}, "sha256 expected a string"),
    ({"files": [{"path": "t.gguf", "bytes": 2}]}, "role expected one of"),
])
def test_every_reader_refuses_a_manifest_reaching_outside(tmp_path, reader, manifest, message):
    from ggufbridge.errors import GGUFBridgeError

    out = tmp_path / "out"
    out.mkdir()
    (out / "t.gguf").write_bytes(b"tt")
    (tmp_path / "outside.gguf").write_bytes(b"oo")
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(GGUFBridgeError, match=message):
        _readers()[reader](out)

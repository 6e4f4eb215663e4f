"""GGUF files as users have them: roles from each file's metadata, split models, hub specs in llama.cpp's `-hf`
style, drafts in upstream's key conventions, and refusals of hostile or ambiguous input (one line, exit 2).

Quick lane: small GGUFs written here with PyPI gguf's writer (headers and tiny tensors), no runtime. The served
path (the converted demo model through the OpenAI API, the fake hub) is in tests/test_serve_gguf_files.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGUFReader, GGUFWriter

from ggufbridge.checkpoint.hub_gguf import GGUFSpec, choose, parse_gguf_spec
from ggufbridge.cli import cli
from ggufbridge.errors import GGUFFileError, HubError, ManifestError
from ggufbridge.ggufio.rewrite import rename_keys
from ggufbridge.runtime.artifacts import ModelSpec, load_artifacts, probe
from ggufbridge.ggufio.names import DRAFT_KEYS, upstream_draft_keys
from ggufbridge.runtime.pairing import draft_value


def _gguf(path: Path, arch: str | None, kv: dict | None = None, tensors: dict | None = None) -> Path:
    w = GGUFWriter(str(path), arch or "x")
    if arch is None:  # a later split part: gguf-split writes only the split keys there
        w.kv_data[0].pop("general.architecture", None)
    for k, v in (kv or {}).items():
        if k == "general.alignment":
            w.add_custom_alignment(v)
        elif isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        else:
            w.add_array(k, v)
    for name, a in (tensors or {"t.weight": np.zeros(4, np.float32)}).items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _target(p):
    return _gguf(p, "qwen35moe", {"qwen35moe.block_count": 4})


def _mmproj(p, proj="minicpmv4_6"):
    return _gguf(p, "clip", {"clip.projector_type": proj, "clip.has_vision_encoder": True})


def _draft(p, kv=None):
    return _gguf(p, "dflash", kv or {"dflash.block_size": 4})


def test_roles_come_from_metadata_not_names(tmp_path):
    _target(tmp_path / "weird-name.gguf")
    _mmproj(tmp_path / "a.gguf", "minicpmv4_7")  # upstream's projector type is a projector too
    _draft(tmp_path / "z.gguf")
    _gguf(tmp_path / "imatrix.gguf", None, {"general.type": "imatrix"})
    _gguf(tmp_path / "other.gguf", "llama")
    art = load_artifacts(tmp_path)
    assert (art.target.path.name, art.mmproj.path.name, art.draft.path.name) == ("weird-name.gguf", "a.gguf", "z.gguf")
    assert art.source == "folder"
    assert any("other.gguf: passed over" in n and "'llama'" in n for n in art.notes)


@pytest.mark.parametrize("kv, why", [
    ({"clip.projector_type": "qwen2vl_merger", "clip.has_vision_encoder": True},
     "a projector of type 'qwen2vl_merger'"),
    ({"clip.projector_type": "minicpmv4_6", "clip.has_vision_encoder": False}, "a projector without a vision encoder"),
])
def test_a_folders_projector_of_another_type_is_refused(tmp_path, kv, why):
    """Issue 40: it was passed over with a note and the model started text-only, although docs/gguf-files.md
    says another projector type is refused. Naming this model's projector with --mmproj still works."""
    _target(tmp_path / "m.gguf")
    _gguf(tmp_path / "mmproj-other.gguf", "clip", kv)
    with pytest.raises(ManifestError, match=f"mmproj-other.gguf is {why}.*: refused .*--mmproj FILE"):
        load_artifacts(tmp_path)
    (tmp_path / "ours").mkdir()
    ours = _mmproj(tmp_path / "ours" / "mmproj.gguf")
    art = load_artifacts(ModelSpec(str(tmp_path), mmproj=str(ours)))
    assert art.mmproj.path == ours


def test_ambiguity_names_the_candidates(tmp_path):
    _target(tmp_path / "m-Q4_K_M.gguf")
    _target(tmp_path / "m-Q8_0.gguf")
    with pytest.raises(ManifestError, match=r"2 candidates for the target \(m-Q4_K_M.gguf, m-Q8_0.gguf\)"):
        load_artifacts(tmp_path)
    # naming the file resolves it; the folder's other files are not looked at
    art = load_artifacts(ModelSpec(str(tmp_path / "m-Q8_0.gguf")))
    assert art.target.path.name == "m-Q8_0.gguf" and art.mmproj is None and art.source == "files"
    _mmproj(tmp_path / "p1.gguf")
    _mmproj(tmp_path / "p2.gguf")
    (tmp_path / "m-Q8_0.gguf").unlink()
    with pytest.raises(ManifestError, match=r"2 candidates for the mmproj \(p1.gguf, p2.gguf\); name one with"):
        load_artifacts(tmp_path)
    art = load_artifacts(ModelSpec(str(tmp_path), mmproj=str(tmp_path / "p2.gguf")))  # explicit wins
    assert art.mmproj.path.name == "p2.gguf"


@pytest.mark.parametrize("make, slot, message", [
    (_draft, "mmproj", "expected a projector .* found a DSpark draft"),
    (_mmproj, "draft", "expected a DSpark draft .* found a projector"),
    (lambda p: _gguf(p, "llama"), "model", "expected a text model \\(qwen35moe\\), found architecture 'llama'"),
    (lambda p: _mmproj(p, "qwen2vl_merger"), "mmproj", "a projector of type 'qwen2vl_merger', not MiniCPM-V 4.7's"),
    (lambda p: p.write_bytes(b"GGUF\x03\0\0\0" + b"\xff" * 16), "model", "cannot fit"),
    (lambda p: p.write_bytes(b"not a gguf"), "model", "bad magic"),
])
def test_a_file_must_be_what_its_slot_expects(tmp_path, make, slot, message):
    bad = tmp_path / "bad.gguf"
    make(bad)
    t = _target(tmp_path / "t.gguf")
    spec = {"model": ModelSpec(str(bad)), "mmproj": ModelSpec(str(t), mmproj=str(bad)),
            "draft": ModelSpec(str(t), draft=str(bad))}[slot]
    with pytest.raises((GGUFFileError, ManifestError), match=message):
        load_artifacts(spec)


def test_empty_or_foreign_folders_and_missing_paths(tmp_path):
    with pytest.raises(ManifestError, match="no manifest.json and no .gguf files"):
        load_artifacts(tmp_path)
    _mmproj(tmp_path / "only-mmproj.gguf")
    with pytest.raises(ManifestError, match="no qwen35moe text model .*mmproj: only-mmproj.gguf"):
        load_artifacts(tmp_path)
    with pytest.raises(ManifestError, match="no such file or folder"):
        load_artifacts(tmp_path / "nope.gguf")


def test_split_models_are_one_artifact(tmp_path):
    n = 3
    first = _gguf(tmp_path / f"m-Q4_K_M-00001-of-0000{n}.gguf", "qwen35moe", {"split.no": 0, "split.count": n})
    for i in range(1, n):
        _gguf(tmp_path / f"m-Q4_K_M-0000{i + 1}-of-0000{n}.gguf", None, {"split.no": i, "split.count": n},
              {f"t{i}.weight": np.zeros(8 * i, np.float32)})
    art = load_artifacts(tmp_path)
    assert art.target.path == first and [p.name for p in art.target.parts] == [
        "m-Q4_K_M-00001-of-00003.gguf", "m-Q4_K_M-00002-of-00003.gguf", "m-Q4_K_M-00003-of-00003.gguf"]
    assert art.target.bytes == sum(p.stat().st_size for p in art.target.parts)
    assert any("part 2 of a split model" in n for n in art.notes)
    (tmp_path / "m-Q4_K_M-00003-of-00003.gguf").unlink()
    with pytest.raises(GGUFFileError, match="split model of 3 parts; missing m-Q4_K_M-00003-of-00003.gguf"):
        load_artifacts(tmp_path)
    _gguf(tmp_path / "m-Q4_K_M-00003-of-00003.gguf", None, {"split.no": 1, "split.count": n})  # lies about its place
    with pytest.raises(GGUFFileError, match=r"expected split part 3 of 3 \(split.no 2\), found split.no 1"):
        load_artifacts(tmp_path)


def test_a_manifest_is_still_checked(tmp_path):
    t = _target(tmp_path / "t.gguf")
    (tmp_path / "manifest.json").write_text('{"files": [{"role": "target", "path": "t.gguf", "bytes": 1}]}')
    with pytest.raises(ManifestError, match=f"has {t.stat().st_size} bytes, the manifest says 1"):
        load_artifacts(tmp_path)


def test_cli_errors_are_one_line(tmp_path):
    _target(tmp_path / "a.gguf")
    _target(tmp_path / "b.gguf")
    for args in (["plan", str(tmp_path)], ["serve", str(tmp_path), "--dry-run"],
                 ["plan", str(tmp_path / "a.gguf"), "--mmproj", str(tmp_path / "b.gguf")],
                 ["plan", "hf://only-a-name"]):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 2, (args, res.output)
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("Error: ") and "Traceback" not in res.output


# --- hub specs: which files a spec names ---------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("hf://org/repo", GGUFSpec("org/repo")),
    ("hf://org/repo:Q4_K_M", GGUFSpec("org/repo", None, "Q4_K_M")),
    ("hf://org/repo@v1.0:q8_0", GGUFSpec("org/repo", "v1.0", "q8_0")),
    ("hf://org/repo@0123abc", GGUFSpec("org/repo", "0123abc")),
    ("./folder", None), ("model.gguf", None),
])
def test_parse_gguf_spec(text, expected):
    assert parse_gguf_spec(text) == expected


@pytest.mark.parametrize("text", ["hf://repo-without-org", "hf://org/repo:", "hf://org/../x", "hf://org/r:a:b",
                                  "ms://org/repo:Q4_K_M"])
def test_malformed_gguf_specs(text):
    with pytest.raises(HubError):
        parse_gguf_spec(text)


REPO = ["README.md", "Model-F16.gguf", "Model-Q4_K_M.gguf", "Model-Q8_0.gguf", "Model-Q4_K_S.gguf",
        "Model-UD-Q4_K_XL.gguf", "mmproj-Model-F16.gguf", "mmproj-Model-BF16.gguf", "mmproj-Model-F32.gguf",
        "Model-IQ4_XS.imatrix.gguf", "dspark-Model-Q8_0.gguf", "dspark-Model-F16.gguf",
        "BF16/Model-BF16-00001-of-00002.gguf", "BF16/Model-BF16-00002-of-00002.gguf", "../evil-Q6_K.gguf"]


@pytest.mark.parametrize("quant, target, mmproj", [
    ("Q8_0", ["Model-Q8_0.gguf"], "mmproj-Model-F16.gguf"),
    ("q4_k_m", ["Model-Q4_K_M.gguf"], "mmproj-Model-F16.gguf"),  # case-insensitive, Q4_K_S and XL not taken
    ("BF16", ["BF16/Model-BF16-00001-of-00002.gguf", "BF16/Model-BF16-00002-of-00002.gguf"], "mmproj-Model-BF16.gguf"),
    ("UD-Q4_K_XL", ["Model-UD-Q4_K_XL.gguf"], "mmproj-Model-F16.gguf"),
    (None, ["Model-Q4_K_M.gguf"], "mmproj-Model-F16.gguf"),  # llama.cpp's default quant
])
def test_choose_files_like_llama_cpp(quant, target, mmproj):
    got = choose(REPO, GGUFSpec("org/repo", None, quant), draft=False)
    assert got["target"] == target and got["mmproj"] == [mmproj] and "draft" not in got


def test_choose_draft_and_errors():
    assert choose(REPO, GGUFSpec("o/r", None, "Q8_0"), draft=True)["draft"] == ["dspark-Model-Q8_0.gguf"]
    assert choose(REPO, GGUFSpec("o/r", None, "Q4_K_M"), draft=True)["draft"] == ["dspark-Model-F16.gguf"]
    with pytest.raises(HubError, match="no GGUF file for Q6_K; the repository has .*Model-F16.gguf"):
        choose(REPO, GGUFSpec("o/r", None, "Q6_K"), draft=False)  # ../evil-Q6_K.gguf is never a candidate
    with pytest.raises(HubError, match="2 files match"):
        choose(["a-Q4_0.gguf", "b-Q4_0.gguf"], GGUFSpec("o/r", None, "Q4_0"), draft=False)
    with pytest.raises(HubError, match="2 GGUF models and no Q4_K_M; name one with :QUANT"):
        choose(["a-Q4_0.gguf", "a-Q8_0.gguf"], GGUFSpec("o/r"), draft=False)
    with pytest.raises(HubError, match="lists parts \\[1, 3\\] of 3"):
        choose(["m-00001-of-00003.gguf", "m-00003-of-00003.gguf"], GGUFSpec("o/r"), draft=False)
    with pytest.raises(HubError, match="no draft file"):
        choose(["m-Q8_0.gguf"], GGUFSpec("o/r", None, "Q8_0"), draft=True)
    with pytest.raises(HubError, match="holds no GGUF model file"):
        choose(["README.md", "mmproj-F16.gguf"], GGUFSpec("o/r"), draft=False)
    assert choose(["m.gguf"], GGUFSpec("o/r"), draft=False) == {"target": ["m.gguf"]}  # the only model


# --- drafts in upstream's key conventions --------------------------------------------------------------------

def test_draft_values_under_either_prefix(tmp_path):
    assert draft_value({"dflash.block_size": 4}, "block_size", "f") == 4
    assert draft_value({"dspark.block_size": 6}, "block_size", "f") == 6
    assert draft_value({"dflash.block_size": 4, "dspark.block_size": 4}, "block_size", "f") == 4
    with pytest.raises(Exception, match="dflash.block_size = 4 and dspark.block_size = 5 disagree"):
        draft_value({"dflash.block_size": 4, "dspark.block_size": 5}, "block_size", "f")
    assert upstream_draft_keys({"dspark.block_size": 4, "dflash.target_layers": [1]}) == ["dspark.block_size"]


def test_rename_keys_keeps_every_other_byte(tmp_path):
    """Renaming dflash.* → dspark.* and back gives the original file byte for byte; gguf-py reads the renamed one
    with the same values and tensors."""
    src = _gguf(tmp_path / "d.gguf", "dflash", {"dflash.block_size": 7, "dflash.target_layers": [1, 3],
                                                "dflash.sample_from_anchor": True, "general.alignment": 64},
                {"markov_w1.weight": np.arange(24, dtype=np.float32).reshape(3, 8),
                 "fc.weight": np.ones((5, 3), np.float16)})
    up = tmp_path / "upstream.gguf"
    renames = {ours: theirs for ours, theirs in DRAFT_KEYS.values()}
    rename_keys(src, up, renames)
    r = GGUFReader(up)
    assert "dflash.block_size" not in r.fields and int(r.fields["dspark.block_size"].parts[-1][0]) == 7
    assert [int(x) for x in r.fields["dspark.target_layers"].contents()] == [1, 3]
    ref = GGUFReader(src)
    for a, b in zip(ref.tensors, r.tensors):
        assert a.name == b.name and np.array_equal(a.data, b.data)
    back = tmp_path / "back.gguf"
    rename_keys(up, back, {v: k for k, v in renames.items()})
    assert back.read_bytes() == src.read_bytes()
    assert probe(up).role == "draft"
    with pytest.raises(GGUFFileError, match="already has it"):
        rename_keys(src, tmp_path / "x.gguf", {"dflash.block_size": "dflash.sample_from_anchor"})


# --- hub specs: fetching from a fake hub on 127.0.0.1 --------------------------------------------------------

HUB_REPO = "org/model-GGUF"


@pytest.fixture
def gguf_hub(tmp_path, monkeypatch):
    """A fake Hugging Face serving a GGUF repo: two quants (one split in two), two projectors, a draft, a card."""
    import huggingface_hub.constants

    from _hub_server import HubServer

    src = tmp_path / "src"
    src.mkdir()
    files = {
        "README.md": b"# model\n",
        "m-Q8_0.gguf": _gguf(src / "a.gguf", "qwen35moe", {}, {"t.weight": np.arange(4096, dtype=np.float32)})
        .read_bytes(),
        "m-F16-00001-of-00002.gguf": _gguf(src / "b.gguf", "qwen35moe", {"split.no": 0, "split.count": 2}).read_bytes(),
        "m-F16-00002-of-00002.gguf": _gguf(src / "c.gguf", None, {"split.no": 1, "split.count": 2}).read_bytes(),
        "mmproj-m-F16.gguf": _mmproj(src / "d.gguf").read_bytes(),
        "mmproj-m-F32.gguf": _mmproj(src / "e.gguf", "minicpmv4_7").read_bytes(),
        "dspark-m-Q8_0.gguf": _draft(src / "f.gguf").read_bytes(),
    }
    with HubServer() as fake:
        for k, v in {"HF_ENDPOINT": fake.url, "HF_HOME": tmp_path / "hf-home", "HF_HUB_CACHE": tmp_path / "hf",
                     "HF_HUB_DISABLE_TELEMETRY": "1"}.items():
            monkeypatch.setenv(k, str(v))
        for k in ("HF_TOKEN", "HF_HUB_OFFLINE"):
            monkeypatch.delenv(k, raising=False)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", True)
        monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 1 << 8)
        fake.add(HUB_REPO, files)
        fake.files = files
        yield fake


def test_hub_spec_fetches_only_its_files(gguf_hub, tmp_path):
    own = _mmproj(tmp_path / "own-mmproj.gguf")  # the user's own projector: the repo's is not fetched
    assert load_artifacts(ModelSpec(f"hf://{HUB_REPO}:Q8_0", mmproj=str(own))).mmproj.path == own
    assert not gguf_hub.gets_of("mmproj-m-F16.gguf")
    art = load_artifacts(ModelSpec(f"hf://{HUB_REPO}:Q8_0"), want_draft=True)
    assert art.target.path.name == "m-Q8_0.gguf" and art.target.path.read_bytes() == gguf_hub.files["m-Q8_0.gguf"]
    assert art.mmproj.path.name == "mmproj-m-F16.gguf" and art.draft.path.name == "dspark-m-Q8_0.gguf"
    assert art.source == f"hf://{HUB_REPO}:Q8_0"
    got = {r.path.rsplit("/", 1)[-1] for r in gguf_hub.requests("GET", "/resolve/")}
    assert got == {"m-Q8_0.gguf", "mmproj-m-F16.gguf", "dspark-m-Q8_0.gguf"}
    # a split quant: both parts, one artifact; without --draft no draft is fetched
    art = load_artifacts(ModelSpec(f"hf://{HUB_REPO}:F16"))
    assert [p.name for p in art.target.parts] == ["m-F16-00001-of-00002.gguf", "m-F16-00002-of-00002.gguf"]
    assert art.draft is None and len(gguf_hub.gets_of("dspark-m-Q8_0.gguf")) == 1


def test_hub_download_resumes_and_checks_sha256(gguf_hub, monkeypatch):
    from _hub_server import Fault

    gguf_hub.faults["m-Q8_0.gguf"] = Fault(truncate=3000)  # the connection drops after 3000 bytes, once
    art = load_artifacts(ModelSpec(f"hf://{HUB_REPO}:Q8_0"))
    assert art.target.path.read_bytes() == gguf_hub.files["m-Q8_0.gguf"]
    ranges = [r.headers.get("range") for r in gguf_hub.gets_of("m-Q8_0.gguf")]
    assert ranges[0] is None and len(ranges) == 2 and ranges[1].startswith("bytes=")  # resumed, not restarted
    gguf_hub.faults["m-F16-00002-of-00002.gguf"] = Fault(lie=True)
    with pytest.raises(HubError, match="checksum mismatch"):
        load_artifacts(ModelSpec(f"hf://{HUB_REPO}:F16"))


def test_hub_offline_uses_the_cache_and_errors_are_one_line(gguf_hub, monkeypatch):
    load_artifacts(ModelSpec(f"hf://{HUB_REPO}:Q8_0"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n = len(gguf_hub.log)
    assert load_artifacts(ModelSpec(f"hf://{HUB_REPO}:Q8_0")).target.path.name == "m-Q8_0.gguf"
    assert len(gguf_hub.log) == n  # no request at all
    with pytest.raises(HubError, match="not in the HF cache .* HF_HUB_OFFLINE is set"):
        load_artifacts(ModelSpec("hf://org/other-GGUF:Q8_0"))
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(HubError, match="repository not found"):
        load_artifacts(ModelSpec("hf://org/nope:Q8_0"))
    res = CliRunner().invoke(cli, ["plan", f"hf://{HUB_REPO}:Q5_K_M"])
    assert res.exit_code == 2 and res.stderr.startswith(f"Error: hf://{HUB_REPO}:Q5_K_M: no GGUF file for Q5_K_M")


def test_hub_errors_keep_the_quant_of_the_spec(gguf_hub):
    """Issue 40: the download machinery's messages named `hf://ORG/REPO`, dropping the `:QUANT` the user typed."""
    from _hub_server import Fault

    with pytest.raises(HubError, match=r"^hf://org/nope:Q8_0: repository not found"):
        load_artifacts(ModelSpec("hf://org/nope:Q8_0"))
    gguf_hub.faults["m-Q8_0.gguf"] = Fault(lie=True)
    with pytest.raises(HubError, match=rf"^hf://{HUB_REPO}:Q8_0: .*checksum mismatch"):
        load_artifacts(ModelSpec(f"hf://{HUB_REPO}:Q8_0"))
    res = CliRunner().invoke(cli, ["plan", "hf://org/nope:Q4_K_M"])
    assert res.exit_code == 2 and res.stderr.startswith("Error: hf://org/nope:Q4_K_M: repository not found"), res.stderr


# --- a draft against its target, from the headers --------------------------------------------------------------

TOKENS = [f"t{i}" for i in range(8)]


def _pair(tmp_path, **change):
    """A target/draft header pair that fits (every coupling value explicit), with `change` applied to the draft:
    key → value (None removes it), or tensor name → numpy shape (None removes it)."""
    from ggufbridge.ggufio.reader import read_header

    t = _gguf(tmp_path / "t.gguf", "qwen35moe", {"qwen35moe.block_count": 4, "qwen35moe.embedding_length": 16,
                                                 "tokenizer.ggml.tokens": TOKENS},
              {"token_embd.weight": np.zeros((8, 16), np.float32), "output.weight": np.zeros((8, 16), np.float32)})
    kv = {"dflash.embedding_length": 16, "dflash.block_size": 4, "dflash.target_layers": [1, 3],
          "tokenizer.ggml.tokens": TOKENS, "tokenizer.ggml.mask_token_id": 7}
    shapes = {"markov_w1.weight": (8, 2), "markov_w2.weight": (8, 2), "fc.weight": (16, 32)}
    for k, v in change.items():
        (shapes if k.endswith(".weight") or k == "d2t" else kv).pop(k, None)
        if v is not None:
            (shapes if k.endswith(".weight") or k == "d2t" else kv)[k] = v
    d = _gguf(tmp_path / "d.gguf", "dflash", kv, {n: np.zeros(s, np.float32) for n, s in shapes.items()})
    return [read_header(t)], read_header(d)


@pytest.mark.parametrize("change, message", [
    ({}, None),
    ({"dflash.block_size": None, "dspark.block_size": 4, "dflash.target_layers": None, "dspark.target_layers": [1, 2]},
     None),  # upstream's key convention
    ({"dflash.embedding_length": 32}, "embedding_length must equal the target's 16, found 32"),
    ({"dflash.target_layers": [1, 4]}, r"target layers must lie in \[1, 3\] for the 4-layer target, found \[1, 4\]"),
    ({"dflash.target_layers": [0]}, r"target layers must lie in \[1, 3\]"),
    ({"dflash.target_layers": "1,2"}, "target layers must be a list of layer numbers, found '1,2'"),
    ({"dflash.block_size": None}, "no block size"),
    ({"dflash.block_size": 0}, "block size must be a positive integer"),
    ({"dspark.block_size": 5}, "dflash.block_size = 4 and dspark.block_size = 5 disagree"),
    ({"tokenizer.ggml.mask_token_id": 8}, r"mask_token_id must be inside the target vocabulary \[0, 8\), found 8"),
    ({"tokenizer.ggml.tokens": TOKENS[:7] + ["x"]}, "tokenizer differs from the target's .* first difference at id 7"),
    ({"markov_w1.weight": (9, 2)}, r"markov_w1 must have one row per target token \(8\), found 9"),
    ({"markov_w2.weight": None}, "needs its Markov head"),
    ({"d2t": (4,), "markov_w2.weight": (4, 2)}, "needs its own output.weight with 4 rows"),
])
def test_draft_coupling_checks(tmp_path, change, message):
    from ggufbridge.errors import PairingError
    from ggufbridge.runtime.pairing import check_draft

    target, draft = _pair(tmp_path, **change)
    if message is None:
        check_draft(target, draft)
    else:
        with pytest.raises(PairingError, match=message):
            check_draft(target, draft)


# --- what images are like with a file on a runtime ------------------------------------------------------------

class _Runtime:
    """Stands in for locate.Runtime: the projector names its libmtmd holds, and whether it has the canvas patch."""

    def __init__(self, projectors, canvas):
        self.projectors, self.canvas_mrope = set(projectors), canvas

    def has_string(self, text, lib="libmtmd"):
        return text in self.projectors


OURS = {"clip.projector_type": "minicpmv4_6", "clip.minicpmv.canvas_mrope": True}
FOREIGN_46 = {"clip.projector_type": "minicpmv4_6"}
UPSTREAM_47 = {"clip.vision.projector_type": "minicpmv4_7", "clip.vision.max_slice_nums": 9}


@pytest.mark.parametrize("runtime, kv, problem, loss", [
    (_Runtime({"minicpmv4_6"}, True), OURS, None, None),  # the patched pinned runtime, our file: exact
    (_Runtime({"minicpmv4_6"}, True), FOREIGN_46, None, "without ggufbridge's clip.minicpmv"),
    (_Runtime({"minicpmv4_6"}, True), UPSTREAM_47, "does not know projector 'minicpmv4_7'", None),
    (_Runtime({"minicpmv4_6", "minicpmv4_7"}, True), UPSTREAM_47, None, None),  # a series that knows 4.7
    (_Runtime({"minicpmv4_6"}, False), OURS, None, "stock llama.cpp gives image tokens 1-D positions"),
    (_Runtime({"minicpmv4_6", "minicpmv4_7"}, False), UPSTREAM_47, None, "as upstream llama.cpp does"),
    (_Runtime({"minicpmv4_6", "minicpmv4_7"}, False), OURS, None, "stock llama.cpp gives image tokens 1-D"),
])
def test_image_fidelity_of_a_file_on_a_runtime(runtime, kv, problem, loss):
    from ggufbridge.runtime.patches import image_fidelity

    got_problem, got_loss = image_fidelity(runtime, kv)
    assert (got_problem is None) == (problem is None) and (problem is None or problem in got_problem)
    assert (got_loss is None) == (loss is None) and (loss is None or loss in got_loss)

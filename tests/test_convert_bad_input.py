"""Issue 2: every kind of bad checkpoint is refused with one line, exit code 2, no traceback, nothing written."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufbridge.cli import cli


@pytest.fixture(scope="module")
def small_ckpt(make_ckpt):
    return make_ckpt("tiny", vocab="small", max_shard_size="200KB")


@pytest.fixture
def ckpt(small_ckpt, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(small_ckpt, dst)
    return dst


def _shards(d: Path) -> list[Path]:
    return sorted(d.glob("model-*.safetensors"))


def _index(d: Path) -> dict:
    return json.loads((d / "model.safetensors.index.json").read_text())


def _edit_json(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def _rewrite_header(shard: Path, fn) -> None:
    """Rewrite a shard's JSON header; data offsets are relative to the data area, so the data just follows."""
    raw = shard.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    fn(header)
    new = json.dumps(header).encode()
    new = new.ljust(len(new) + (-len(new)) % 8, b" ")
    shard.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


def _first_tensor(header: dict) -> str:
    return next(k for k in header if k != "__metadata__")


def missing_shard(d):
    _shards(d)[-1].unlink()


def truncated_shard(d):
    s = _shards(d)[0]
    s.write_bytes(s.read_bytes()[:-1000])


def index_names_absent_tensor(d):
    _edit_json(d / "model.safetensors.index.json",
               lambda i: i["weight_map"].__setitem__("model.language_model.layers.0.extra.weight", _shards(d)[0].name))


def header_length_lies(d):
    s = _shards(d)[0]
    raw = bytearray(s.read_bytes())
    raw[:8] = struct.pack("<Q", len(raw) * 4)
    s.write_bytes(bytes(raw))


def header_length_huge(d):
    s = _shards(d)[0]
    raw = bytearray(s.read_bytes())
    raw[:8] = struct.pack("<Q", 2**62)
    s.write_bytes(bytes(raw))


def offsets_lie(d):
    def fn(h):
        name = _first_tensor(h)
        b, e = h[name]["data_offsets"]
        h[name]["data_offsets"] = [b + 10**9, e + 10**9]
    _rewrite_header(_shards(d)[0], fn)


def offsets_disagree_with_shape(d):
    def fn(h):
        name = _first_tensor(h)
        h[name]["shape"] = [x * 2 for x in h[name]["shape"]]
    _rewrite_header(_shards(d)[0], fn)


def unknown_architecture(d):
    _edit_json(d / "config.json", lambda c: c.__setitem__("architectures", ["LlamaForCausalLM"]))


def config_not_json(d):
    (d / "config.json").write_text("{ this is not json")


def preprocessor_not_json(d):
    (d / "preprocessor_config.json").write_text("[1, 2")


def missing_tokenizer(d):
    (d / "tokenizer.json").unlink()


def tokenizer_top_level_list(d):
    (d / "tokenizer.json").write_text("[1, 2, 3]")  # issue 15: crashed in data.get


def tokenizer_merges_integers(d):
    _edit_json(d / "tokenizer.json", lambda t: t["model"].update(merges=[[1, 2], [3, 4]]))  # issue 15: " ".join


def empty_folder(d):
    for p in d.iterdir():
        p.unlink()


def shapes_contradict_config(d):
    _edit_json(d / "config.json", lambda c: c["text_config"].__setitem__("hidden_size", 128))


def experts_contradict_config(d):
    _edit_json(d / "config.json", lambda c: c["text_config"].__setitem__("num_experts", 16))


def missing_config(d):
    (d / "config.json").unlink()


def unknown_text_model_type(d):
    _edit_json(d / "config.json", lambda c: c["text_config"].__setitem__("model_type", "llama"))


def layer_types_wrong_length(d):
    _edit_json(d / "config.json", lambda c: c["text_config"].__setitem__("layer_types", ["full_attention"]))


def vocab_size_absurd(d):
    # was: read_vocab padded the token list to 10**9 entries before any shape check (memory ran away)
    _edit_json(d / "config.json", lambda c: c["text_config"].__setitem__("vocab_size", 10**9))


def context_beyond_uint32(d):
    # was: struct.error from the GGUF writer (uint32 key), a traceback
    _edit_json(d / "config.json", lambda c: c["text_config"].__setitem__("max_position_embeddings", 10**12))


def rms_eps_zero(d):
    _edit_json(d / "config.json", lambda c: c["text_config"].__setitem__("rms_norm_eps", 0.0))


def rms_eps_nan(d):
    path = d / "config.json"  # Python's json reads (and writes) the non-standard NaN literal
    path.write_text(path.read_text().replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": NaN'))
    assert "NaN" in path.read_text()


def rope_theta_negative(d):
    _edit_json(d / "config.json", lambda c: c["text_config"]["rope_parameters"].__setitem__("rope_theta", -1.0))


def vision_eps_negative(d):
    _edit_json(d / "config.json", lambda c: c["vision_config"].__setitem__("layer_norm_eps", -1.0))


def chat_template_not_utf8(d):
    # was: UnicodeDecodeError traceback from read_text
    (d / "chat_template.jinja").write_bytes(b"\xff\xfe{{ messages }}")


def pickle_instead_of_safetensors(d):
    s = _shards(d)[0]
    s.write_bytes(b"\x80\x04\x95" + b"\0" * 64)  # a pickle stream is never unpickled: its "header" is nonsense


CASES = {
    missing_shard: "missing shard",
    truncated_shard: "truncated",
    index_names_absent_tensor: "does not contain",
    header_length_lies: "header length",
    header_length_huge: "limit",
    offsets_lie: "truncated or lying header",
    offsets_disagree_with_shape: "needs",
    unknown_architecture: "LlamaForCausalLM",
    config_not_json: "not valid JSON",
    preprocessor_not_json: "preprocessor_config.json: not valid JSON",
    missing_tokenizer: "tokenizer.json",
    tokenizer_top_level_list: "expected a JSON object at the top level, found list",
    tokenizer_merges_integers: "model.merges[0]",
    empty_folder: "empty",
    shapes_contradict_config: "expected shape",
    experts_contradict_config: "expected shape [16, 64]",
    missing_config: "config.json",
    unknown_text_model_type: "model_type",
    layer_types_wrong_length: "layer_types",
    vocab_size_absurd: "expected shape [1000000000, 64]",
    context_beyond_uint32: "max_position_embeddings must be at most 2147483647, found 1000000000000",
    rms_eps_zero: "rms_norm_eps must be a positive number, found 0.0",
    rms_eps_nan: "rms_norm_eps must be a finite number, found nan",  # judged where it is read (arch/config.py)
    rope_theta_negative: "rope_theta must be a positive number, found -1.0",
    vision_eps_negative: "layer_norm_eps must be a positive number, found -1.0",
    chat_template_not_utf8: "chat_template.jinja: not UTF-8 text (invalid start byte at byte 0)",
    pickle_instead_of_safetensors: "header length 9766016 runs past the end of the 67 byte file",
}


@pytest.mark.parametrize("breaker", list(CASES), ids=[f.__name__ for f in CASES])
def test_bad_checkpoint_is_refused_cleanly(breaker, ckpt, tmp_path):
    breaker(ckpt)
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["convert", str(ckpt), "-o", str(out), "--no-progress"])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    assert CASES[breaker] in lines[0], lines[0]
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())


def test_missing_model_dir(tmp_path):
    res = CliRunner().invoke(cli, ["convert", str(tmp_path / "nope"), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2 and "no such model folder" in res.output


def test_interrupt_leaves_nothing_under_final_names(small_ckpt, tmp_path, monkeypatch):
    """Ctrl-C in the middle of writing: no final file, no temp file, no manifest."""
    from ggufbridge.ggufio import writer

    real = writer.encode
    calls = {"n": 0}

    def interrupting(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 20:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(writer, "encode", interrupting)
    from ggufbridge.convert import convert

    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        convert(small_ckpt, out, outtype="f32", progress=False)
    assert not out.exists() or list(out.iterdir()) == []


def test_existing_output_is_kept_when_a_new_conversion_fails(small_ckpt, tmp_path, monkeypatch):
    from ggufbridge.convert import convert
    from ggufbridge.ggufio import writer

    out = tmp_path / "out"
    first = convert(small_ckpt, out, outtype="f32", progress=False, mmproj=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def boom(*a, **kw):
        raise RuntimeError("disk full")

    monkeypatch.setattr(writer, "encode", boom)
    with pytest.raises(RuntimeError):
        convert(small_ckpt, out, outtype="f32", progress=False, mmproj=False, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert first.path("target").exists()

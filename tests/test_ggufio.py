"""ggufbridge.ggufio: the bounded reader against gguf-py's GGUFReader (the independent reference), one tensor's
data through a memmap at the header's offset, and the manifest writer against the manifest reader."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf import quants as gguf_quants

from ggufbridge.errors import GGUFFileError, ManifestError
from ggufbridge.ggufio.manifest import MANIFEST, ManifestEntry, read_manifest, write_manifest
from ggufbridge.ggufio.reader import read_header


@pytest.fixture
def gguf_file(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "t.gguf"
    w = GGUFWriter(str(path), "qwen35moe")
    w.add_uint32("qwen35moe.block_count", 3)
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(1000)])
    w.add_array("qwen35moe.attention.recurrent_layers", [True, False, True])
    w.add_array("tokenizer.ggml.token_type", [1, 3, 6, 5])
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_string("ggufbridge.quant.recipe", "hq4")
    tensors = {
        "a.f32": rng.standard_normal((3, 5)).astype(np.float32),
        "b.f16": rng.standard_normal((4, 64)).astype(np.float16),
        "c.i32": np.arange(7, dtype=np.int32),
    }
    for name, a in tensors.items():
        w.add_tensor(name, a)
    bf16 = gguf_quants.quantize(rng.standard_normal((2, 32)).astype(np.float32), GGMLQuantizationType.BF16)
    w.add_tensor("d.bf16", bf16, raw_dtype=GGMLQuantizationType.BF16)
    q8 = gguf_quants.quantize(rng.standard_normal((2, 64)).astype(np.float32), GGMLQuantizationType.Q8_0)
    w.add_tensor("e.q8", q8, raw_dtype=GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, {**tensors, "d.bf16": bf16.view(np.uint16)}  # BF16 bit patterns, as the reader gives them


def test_header_matches_gguf_reader(gguf_file):
    path, _ = gguf_file
    h, ref = read_header(path), GGUFReader(str(path))
    assert [t.name for t in h.tensors] == [t.name for t in ref.tensors]
    for t, r in zip(h.tensors, ref.tensors):
        assert (t.type, t.shape, t.nbytes, t.n_elements) == (r.tensor_type.name, tuple(int(d) for d in r.shape),
                                                             int(r.n_bytes), int(r.n_elements))
        assert h.data_start + t.offset == int(r.data_offset)
        assert np.array_equal(h.tensor_data(t), np.asarray(r.data).reshape(-1).view(np.uint8))
    assert h.kv["tokenizer.ggml.tokens"] == ref.fields["tokenizer.ggml.tokens"].contents()
    assert [bool(x) for x in h.kv["qwen35moe.attention.recurrent_layers"]] == [True, False, True]
    types = ref.fields["tokenizer.ggml.token_type"].contents()
    assert [int(x) for x in h.kv["tokenizer.ggml.token_type"]] == types == [1, 3, 6, 5]
    assert h.kv["tokenizer.ggml.add_bos_token"] is ref.fields["tokenizer.ggml.add_bos_token"].contents() is False
    assert h.kv["ggufbridge.quant.recipe"] == "hq4"


def test_tensor_array_is_the_stored_array(gguf_file):
    path, arrays = gguf_file
    h = read_header(path)
    for name, a in arrays.items():
        got = h.tensor_array(name)
        assert got.shape == a.shape and np.array_equal(got.view(a.dtype), a), name
    with pytest.raises(GGUFFileError, match="Q8_0"):
        h.tensor_array("e.q8")  # quantised: bytes only
    with pytest.raises(GGUFFileError, match="no tensor 'nope'"):
        h.tensor("nope")


def test_cut_file_is_refused(gguf_file, tmp_path):
    path, _ = gguf_file
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(GGUFFileError, match="truncated"):
        read_header(cut)


def test_write_manifest_reads_back(tmp_path):
    (tmp_path / "t.gguf").write_bytes(b"x" * 5)
    entries = [ManifestEntry.of("target", tmp_path / "t.gguf", 5, "ab" * 32, "F16")]
    write_manifest(tmp_path / MANIFEST, entries, {"model.safetensors": "cd" * 32}, extra={"note": 1})
    m = read_manifest(tmp_path)
    assert m.files["target"] == entries[0]
    assert m.source == {"model.safetensors": "cd" * 32}
    assert m.extra["note"] == 1 and "ggufbridge" in m.extra
    assert json.loads((tmp_path / MANIFEST).read_text())["files"][0]["path"] == "t.gguf"


@pytest.mark.parametrize("roles", [["mmproj"], ["target", "target"], ["target", "vision"]])
def test_write_manifest_refuses_what_read_manifest_refuses(tmp_path, roles):
    entries = [ManifestEntry.of(r, tmp_path / f"{i}.gguf", 1, None, None) for i, r in enumerate(roles)]
    with pytest.raises(ManifestError, match="one target"):
        write_manifest(tmp_path / MANIFEST, entries)
    assert not (tmp_path / MANIFEST).exists()


def test_bf16_rounding_is_gguf_quantiser_bit_for_bit():
    from ggufbridge.ggufio.writer import f32_to_bf16_bits

    rng = np.random.default_rng(1)
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 3.4e38, -3.4e38, 1e-45, 1.00390625, 1.01171875],
                       dtype=np.float32)
    bits = rng.integers(0, 2**32, size=4096, dtype=np.uint64).astype(np.uint32).view(np.float32)  # every pattern
    a = np.concatenate([np.resize(special, 64), bits, rng.standard_normal(4096).astype(np.float32)]).reshape(-1, 64)
    ref = gguf_quants.quantize(a, GGMLQuantizationType.BF16).view(np.uint16)
    assert np.array_equal(f32_to_bf16_bits(a), ref)

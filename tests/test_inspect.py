"""`ggufbridge inspect`: each role's report checked against the checkpoint configs and against PyPI gguf's reader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGUFReader, GGUFWriter

from ggufbridge.cli import cli
from ggufbridge.convert import convert
from ggufbridge.testkit import dspark as fx


def _inspect(path: Path, *args) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["inspect", str(path), *args])
    return res.exit_code, res.output


def _report(path: Path) -> dict:
    code, out = _inspect(path, "--json")
    assert code == 0, out
    return json.loads(out)


def _check_totals(rep: dict, path: Path) -> None:
    """Counts and bytes agree with an independent reader, and the components partition the tensors."""
    ref = GGUFReader(path)
    assert rep["tensor_count"] == len(ref.tensors)
    assert rep["tensor_bytes"] == sum(int(t.n_bytes) for t in ref.tensors)
    assert sum(c["count"] for c in rep["components"]) == rep["tensor_count"]
    assert sum(c["bytes"] for c in rep["components"]) == rep["tensor_bytes"]
    assert rep["file_bytes"] == path.stat().st_size
    types: dict[str, int] = {}
    for t in ref.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    assert rep["types"] == types


@pytest.fixture(scope="module")
def pair(make_ckpt, tmp_path_factory):
    target = make_ckpt("tiny", vocab="small")
    root = tmp_path_factory.mktemp("inspect")
    draft = fx.make_dspark(root / "draft", target, "tiny2", schema="nested")
    res = convert(target, root / "out", outtype="f32", draft=draft, draft_outtype="f16", mmproj=False, progress=False)
    return target, draft, res


def _component(rep: dict, name: str) -> dict:
    return next(c for c in rep["components"] if c["component"] == name)


def test_target_report(pair):
    target, _, res = pair
    path = res.path("target")
    rep = _report(path)
    text = json.loads((target / "config.json").read_text())["text_config"]
    assert rep["role"] == "target" and rep["architecture"] == "qwen35moe" and rep["coupling"] is None
    hp = rep["hyperparameters"]
    assert hp["layers"] == text["num_hidden_layers"]
    assert hp["hidden"] == text["hidden_size"]
    assert hp["experts"] == text["num_experts"] and hp["experts used"] == text["num_experts_per_tok"]
    assert hp["head dim"] == text["head_dim"]
    assert hp["layer pattern"] == "".join("L" if t == "linear_attention" else "F" for t in text["layer_types"])
    assert rep["vocab"]["tokens"] == text["vocab_size"]
    _check_totals(rep, path)
    n_layer, e, x = text["num_hidden_layers"], text["hidden_size"], text["num_experts"]
    experts = _component(rep, "routed experts")
    assert experts["count"] == 3 * n_layer
    assert experts["bytes"] == 4 * n_layer * x * 3 * e * text["moe_intermediate_size"]  # F32
    assert _component(rep, "token embeddings")["bytes"] == 4 * text["vocab_size"] * e
    code, out = _inspect(path)
    assert code == 0 and "role          target" in out and "architecture  qwen35moe" in out and "routed experts" in out


def test_draft_report_shows_the_coupling(pair):
    _, draft, res = pair
    path = res.path("draft")
    rep = _report(path)
    cfg = json.loads((draft / "config.json").read_text())
    dc = cfg["dflash_config"]
    assert rep["role"] == "draft" and rep["architecture"] == "dflash"
    c = rep["coupling"]
    assert c["target_layers"] == [i + 1 for i in dc["target_layer_ids"]]
    assert c["hf_target_layer_ids"] == dc["target_layer_ids"]
    assert c["block_size"] == dc["block_size"]
    assert c["mask_token_id"] == dc["mask_token_id"] and c["mask_token"] == fx.MASK_TOKEN
    rank = fx.SPECS["tiny2"].markov_rank
    assert c["heads"] == [f"markov (rank {rank})", "confidence"]
    assert c["speculative_type"] == "draft-dspark"
    assert c["own_embeddings"] is False and c["own_head"] is False and c["draft_vocab"] is None
    assert c["sample_from_anchor"] is True and c["causal"] is None
    hp = rep["hyperparameters"]
    assert (hp["layers"], hp["hidden"], hp["kv heads"], hp["head dim"]) == (
        cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_key_value_heads"], cfg["head_dim"])
    _check_totals(rep, path)
    assert _component(rep, "markov head")["bytes"] == 2 * cfg["vocab_size"] * rank * 2  # two F16 tables
    code, out = _inspect(path)
    assert code == 0
    assert "role          draft" in out
    assert f"target layers      {c['target_layers']}" in out
    assert f"mask token id      {dc['mask_token_id']} '{fx.MASK_TOKEN}'" in out
    assert "--spec-type draft-dspark" in out


def test_reduced_vocabulary_draft_report(make_ckpt, tmp_path):
    target = make_ckpt("tiny", vocab="small")
    draft = fx.make_dspark(tmp_path / "draft", target, "reduced")
    path = convert(target, tmp_path / "out", outtype="f32", draft=draft, mmproj=False, progress=False).path("draft")
    rep = _report(path)
    assert rep["coupling"]["draft_vocab"] == fx.SPECS["reduced"].draft_vocab_size
    assert rep["coupling"]["own_head"] is True
    assert _component(rep, "d2t") == {"component": "d2t", "count": 1, "bytes": 8 * fx.SPECS["reduced"].draft_vocab_size}
    _check_totals(rep, path)


def _write_mmproj(path: Path) -> None:
    """A small minicpmv4_6 mmproj written by PyPI gguf's writer (independent of ggufbridge's)."""
    w = GGUFWriter(str(path), "clip")
    w.add_string("general.type", "mmproj")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "minicpmv4_6")
    w.add_uint32("clip.vision.image_size", 112)
    w.add_uint32("clip.vision.patch_size", 14)
    w.add_uint32("clip.vision.embedding_length", 32)
    w.add_uint32("clip.vision.feed_forward_length", 64)
    w.add_uint32("clip.vision.block_count", 2)
    w.add_uint32("clip.vision.attention.head_count", 2)
    w.add_uint32("clip.vision.projection_dim", 64)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_bool("clip.use_gelu", True)
    w.add_array("clip.vision.wa_layer_indexes", [1])
    rng = np.random.default_rng(0)
    for name, shape, dt in [("v.patch_embd.weight", (32, 3, 14, 14), np.float16),
                            ("v.position_embd.weight", (4900, 32), np.float32),
                            ("v.blk.0.attn_q.weight", (32, 32), np.float16),
                            ("v.blk.0.ln1.weight", (32,), np.float32),
                            ("v.vit_merger.attn_q.weight", (32, 32), np.float16),
                            ("mm.up.weight", (128, 128), np.float16),
                            ("mm.down.weight", (64, 128), np.float16)]:
        w.add_tensor(name, rng.standard_normal(shape).astype(dt))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_mmproj_report(tmp_path):
    path = tmp_path / "mmproj.gguf"
    _write_mmproj(path)
    rep = _report(path)
    assert rep["role"] == "mmproj" and rep["architecture"] == "clip" and rep["coupling"] is None
    hp = rep["hyperparameters"]
    assert hp["projector"] == "minicpmv4_6"
    assert (hp["slice size"], hp["patch size"], hp["hidden"], hp["layers"]) == (112, 14, 32, 2)
    assert hp["insert layer"] == [1] and hp["gelu (tanh)"] is True and hp["image mean"] == [0.5, 0.5, 0.5]
    assert _component(rep, "vision patch+position embeddings") == {
        "component": "vision patch+position embeddings", "count": 2, "bytes": 32 * 3 * 14 * 14 * 2 + 4900 * 32 * 4}
    assert _component(rep, "vision encoder")["count"] == 2
    assert _component(rep, "vision merger (vit_merger)")["count"] == 1
    assert _component(rep, "projector")["count"] == 2
    _check_totals(rep, path)
    code, out = _inspect(path)
    assert code == 0 and "role          mmproj" in out and "projector          minicpmv4_6" in out


@pytest.mark.parametrize("content", [b"", b"NOTGGUF" + b"\0" * 64, "truncated"])
def test_bad_files_are_one_line_errors(pair, tmp_path, content):
    bad = tmp_path / "bad.gguf"
    if content == "truncated":
        content = pair[2].path("draft").read_bytes()[:2000]
    bad.write_bytes(content)
    code, out = _inspect(bad)
    assert code == 2 and len(out.strip().splitlines()) == 1 and out.startswith("Error: "), out


def test_file_cut_in_half_is_refused_naming_the_sizes(pair, tmp_path):
    """Issue 15: a GGUF cut in half keeps its whole header; inspect reported its tensors as if present."""
    whole = pair[2].path("draft").read_bytes()
    bad = tmp_path / "half.gguf"
    bad.write_bytes(whole[: len(whole) // 2])
    code, out = _inspect(bad)
    assert code == 2 and len(out.strip().splitlines()) == 1, out
    assert "truncated GGUF" in out and f"the file has {len(whole) // 2}" in out, out
    assert "Traceback" not in out


def test_missing_file_is_a_one_line_error(tmp_path):
    code, out = _inspect(tmp_path / "nope.gguf")
    assert code == 2 and len(out.strip().splitlines()) == 1 and "nope.gguf" in out, out


@pytest.mark.slow
def test_real_vocabulary_draft_keeps_the_upstream_mask_token(tiny_ckpt, tmp_path):
    """With the real Qwen3.5 vocabulary (248,144 rows) the default mask id is the upstream one, 248076."""
    draft = fx.make_dspark(tmp_path / "draft", tiny_ckpt, "tiny")
    path = convert(tiny_ckpt, tmp_path / "out", outtype="f16", draft=draft, mmproj=False, progress=False).path("draft")
    rep = _report(path)
    assert rep["coupling"]["mask_token_id"] == 248076 and rep["coupling"]["mask_token"] == "<|audio_pad|>"
    assert rep["vocab"]["tokens"] == 248_144
    assert _component(rep, "markov head")["bytes"] == 2 * 248_144 * fx.SPECS["tiny"].markov_rank * 2
    assert sum(c["bytes"] for c in rep["components"]) == rep["tensor_bytes"] < rep["file_bytes"]


def test_converted_mmproj_report(make_ckpt, tmp_path):
    """The mmproj that `convert` writes for the tiny checkpoint, against the fixture's vision spec."""
    from ggufbridge.testkit.checkpoint import SPECS

    target = make_ckpt("tiny", vocab="small")
    res = convert(target, tmp_path / "out", outtype="f32", mmproj=True, mmproj_outtype="f16", progress=False)
    path = res.path("mmproj")
    rep = _report(path)
    spec = SPECS["tiny"]
    assert rep["role"] == "mmproj" and rep["coupling"] is None
    hp = rep["hyperparameters"]
    assert (hp["hidden"], hp["ff"], hp["layers"], hp["patch size"], hp["slice size"]) == (
        spec.vision_hidden, spec.vision_ff, spec.vision_layers, spec.patch_size, spec.slice_size)
    assert hp["insert layer"] == [spec.insert_layer_id]
    _check_totals(rep, path)


def test_importance_matrix_is_not_called_a_target(tmp_path):
    """`imatrix` writes OUT/imatrix.gguf; inspect called it "role target, architecture ?" (and compare tried to
    load it as a model)."""
    path = tmp_path / "imatrix.gguf"
    w = GGUFWriter(str(path), arch="", use_temp_file=False)  # llama-imatrix writes no architecture
    w.kv_data[0].pop("general.architecture", None)
    w.add_string("general.type", "imatrix")
    w.add_uint32("imatrix.chunk_count", 4)
    w.add_uint32("imatrix.chunk_size", 128)
    w.add_tensor("blk.0.ffn_down_exps.weight.in_sum2", np.ones((8, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    res = CliRunner().invoke(cli, ["inspect", str(path)])
    assert res.exit_code == 0, res.output
    assert "role          imatrix" in res.output and "chunks" in res.output, res.output

"""DSpark draft conversion: metadata and tensors against the draft checkpoint and the target GGUF (read back with
PyPI gguf's reader), both config schemas, every refused pairing (CLI: exit 2, one line, nothing written), and the
drafter sanity report."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGUFReader, GGUFValueType

from ggufbridge.cli import cli
from ggufbridge.convert import convert
from ggufbridge.errors import NonFiniteWeights
from ggufbridge.testkit import dspark as fx


@pytest.fixture(scope="module")
def target(make_ckpt):
    return make_ckpt("tiny", vocab="small")


def _convert(target, draft, out, **kw):
    kw.setdefault("outtype", "f32")
    kw.setdefault("draft_outtype", "f32")
    return convert(target, out, draft=draft, mmproj=False, progress=False, **kw)


def _fields(path) -> tuple[dict, dict]:
    r = GGUFReader(path)
    return {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}, {t.name: t for t in r.tensors}


def _val(f):
    return f.contents()


def _source(draft_dir: Path) -> dict[str, np.ndarray]:
    from safetensors.torch import load_file as load_torch

    return {k: (v.float().numpy() if v.is_floating_point() else v.numpy())
            for k, v in load_torch(draft_dir / "model.safetensors").items()}


@pytest.mark.parametrize("schema", fx.SCHEMAS)
def test_metadata_and_tensors_match_checkpoint_and_target(target, tmp_path, schema):
    spec = fx.SPECS["tiny2"]
    draft = fx.make_dspark(tmp_path / "draft", target, spec, schema=schema)
    res = _convert(target, draft, tmp_path / "out")
    assert res.path("draft").name.startswith("dspark-") and res.path("draft").name.endswith("-F32.gguf")
    cfg = json.loads((draft / "config.json").read_text())
    coupling = cfg.get("dflash_config", cfg)
    kv, tensors = _fields(res.path("draft"))
    tkv, ttensors = _fields(res.path("target"))

    assert _val(kv["general.architecture"]) == "dflash"
    assert _val(kv["dflash.target_layers"]) == [i + 1 for i in coupling["target_layer_ids"]]
    assert kv["dflash.block_size"].types == [GGUFValueType.UINT32]
    assert _val(kv["dflash.block_size"]) == coupling["block_size"]
    assert _val(kv["tokenizer.ggml.mask_token_id"]) == coupling["mask_token_id"]
    assert kv["tokenizer.ggml.mask_token_id"].types == [GGUFValueType.UINT32]
    assert _val(kv["dflash.sample_from_anchor"]) is True
    assert _val(kv["dflash.has_confidence_head"]) is True
    assert "dflash.attention.causal" not in kv  # the config does not state one
    assert _val(kv["dflash.embedding_length"]) == _val(tkv["qwen35moe.embedding_length"])
    assert _val(kv["dflash.block_count"]) == cfg["num_hidden_layers"]
    # a full copy of the target's tokenizer keys
    tok = sorted(k for k in tkv if k.startswith("tokenizer."))
    assert tok and sorted(k for k in kv if k.startswith("tokenizer.") and k != "tokenizer.ggml.mask_token_id") == tok
    for k in tok:
        assert _val(kv[k]) == _val(tkv[k]), k
    # no embeddings or head: the runtime borrows the target's
    assert "token_embd.weight" not in tensors and "output.weight" not in tensors
    assert "token_embd.weight" in ttensors

    src = _source(draft)
    pairs = {"fc.weight": "fc.weight", "markov_w1.weight": "markov_head.markov_w1.weight",
             "markov_w2.weight": "markov_head.markov_w2.weight", "conf_proj.weight": "confidence_head.proj.weight",
             "conf_proj.bias": "confidence_head.proj.bias",
             # Qwen3 norms are copied as they are (no +1)
             "output_norm.weight": "norm.weight", "enc.output_norm.weight": "hidden_norm.weight",
             "blk.1.attn_norm.weight": "layers.1.input_layernorm.weight",
             "blk.1.attn_k_norm.weight": "layers.1.self_attn.k_norm.weight",
             "blk.0.ffn_down.weight": "layers.0.mlp.down_proj.weight",
             "blk.1.attn_q.weight": "layers.1.self_attn.q_proj.weight"}
    for g, hf in pairs.items():
        got = np.asarray(tensors[g].data).reshape(src[hf].shape)
        np.testing.assert_array_equal(got, src[hf], err_msg=g)
    assert len(tensors) == 5 + 2 + 11 * spec.layers


def test_both_schemas_give_the_same_file(target, tmp_path):
    paths = []
    for schema in fx.SCHEMAS:
        d = fx.make_dspark(tmp_path / f"d-{schema}", target, "tiny", schema=schema)
        paths.append(_convert(target, d, tmp_path / f"out-{schema}").path("draft"))
    assert paths[0].read_bytes() == paths[1].read_bytes()


@pytest.mark.parametrize("schema,causal", [("flat", False), ("nested", True)])
def test_causal_flag_written_when_stated(target, tmp_path, schema, causal):
    from dataclasses import replace

    d = fx.make_dspark(tmp_path / "d", target, replace(fx.SPECS["tiny"], causal=causal), schema=schema)
    kv, _ = _fields(_convert(target, d, tmp_path / "out").path("draft"))
    assert _val(kv["dflash.attention.causal"]) is causal


def test_model_prefix_and_bf16_source(target, tmp_path):
    plain = fx.make_dspark(tmp_path / "a", target, "tiny", dtype="bfloat16")
    prefixed = fx.make_dspark(tmp_path / "b", target, "tiny", dtype="bfloat16", prefix="model.")
    a = _convert(target, plain, tmp_path / "oa", draft_outtype="bf16").path("draft")
    b = _convert(target, prefixed, tmp_path / "ob", draft_outtype="bf16").path("draft")
    assert a.read_bytes() == b.read_bytes()
    _, tensors = _fields(a)
    import torch
    from safetensors.torch import load_file as load_torch

    raw = load_torch(plain / "model.safetensors")["markov_head.markov_w1.weight"]  # BF16 as stored: same bits
    assert raw.dtype == torch.bfloat16 and tensors["markov_w1.weight"].tensor_type.name == "BF16"
    np.testing.assert_array_equal(np.asarray(tensors["markov_w1.weight"].data).view(np.uint16).reshape(-1),
                                  raw.view(torch.int16).numpy().view(np.uint16).reshape(-1))


def test_reduced_vocabulary_writes_d2t_as_absolute_i64_and_own_head(target, tmp_path):
    d = fx.make_dspark(tmp_path / "d", target, "reduced")
    _, tensors = _fields(_convert(target, d, tmp_path / "out").path("draft"))
    src = _source(d)
    assert tensors["d2t"].tensor_type.name == "I64"
    np.testing.assert_array_equal(np.asarray(tensors["d2t"].data), src["d2t"] + np.arange(src["d2t"].size))
    assert tuple(tensors["output.weight"].shape) == (64, 256)
    assert tuple(tensors["markov_w2.weight"].shape) == (16, 256)
    assert tuple(tensors["markov_w1.weight"].shape) == (16, 512)
    assert "t2d" not in tensors and "token_embd.weight" not in tensors


def test_embeddings_without_head_get_the_targets_head(target, tmp_path):
    from dataclasses import replace

    d = fx.make_dspark(tmp_path / "d", target, replace(fx.SPECS["tiny"], embed_tokens=True))
    res = _convert(target, d, tmp_path / "out")
    _, tensors = _fields(res.path("draft"))
    _, ttensors = _fields(res.path("target"))
    np.testing.assert_array_equal(np.asarray(tensors["output.weight"].data), np.asarray(ttensors["output.weight"].data))
    np.testing.assert_array_equal(np.asarray(tensors["token_embd.weight"].data).reshape(512, 64),
                                  _source(d)["embed_tokens.weight"])
    assert any("target's output head" in n for n in res.notes)


# --- refused pairings: (config overrides, tensor overrides, schema, words the one-line error must contain) --------

V, E, R = 512, 64, 16
INVALID = {
    "hidden size": ({"hidden_size": 32}, {}, "flat", ["hidden", "64", "32"]),
    "layer id past n_layer-2": ({"target_layer_ids": [0, 3]}, {}, "flat", ["[0, 2]", "3"]),
    "negative layer id": ({"target_layer_ids": [-1, 1]}, {}, "nested", ["[0, 2]", "-1"]),
    "mask id outside vocab": ({"mask_token_id": 512}, {}, "flat", ["mask_token_id", "512"]),
    "nested mask id outside vocab": ({"mask_token_id": 9999}, {}, "nested", ["mask_token_id", "9999", "512"]),
    "markov w1 rows": ({}, {"markov_head.markov_w1.weight": np.zeros((500, R), np.float32)}, "flat",
                       ["markov_w1", "512", "500"]),
    "markov w2 rows": ({}, {"markov_head.markov_w2.weight": np.ones((V + 8, R), np.float32)}, "flat",
                       ["markov_w2", "512", "520"]),
    "markov head type": ({"markov_head_type": "gated"}, {}, "flat", ["vanilla", "gated"]),
    "vocab size": ({"vocab_size": 1024}, {}, "flat", ["vocab_size", "512", "1024"]),
    "schemas disagree": ({"dflash_config": {"block_size": 8, "target_layer_ids": [0, 2], "mask_token_id": 504}},
                         {}, "flat", ["block_size", "4", "8"]),
    "reduced vocab without d2t": ({"draft_vocab_size": 256},
                                  {"markov_head.markov_w2.weight": np.ones((256, R), np.float32),
                                   "lm_head.weight": np.ones((256, E), np.float32)},
                                  "flat", ["d2t", "256", "512"]),
    "d2t not one-to-one": ({"draft_vocab_size": 4}, {"markov_head.markov_w2.weight": np.ones((4, R), np.float32),
                                                     "lm_head.weight": np.ones((4, E), np.float32),
                                                     "d2t": np.array([5, 4, 0, 0], np.int64)},
                           "flat", ["d2t", "one-to-one", "0 and 1", "target id 5"]),
    "architecture": ({"architectures": ["LlamaForCausalLM"]}, {}, "flat", ["Qwen3DSparkModel", "LlamaForCausalLM"]),
    "missing tap list": ({"target_layer_ids": None}, {}, "flat", ["target_layer_ids"]),
    "rms eps zero": ({"rms_norm_eps": 0.0}, {}, "flat", ["rms_norm_eps", "positive number", "0.0"]),
    "context beyond int32": ({"max_position_embeddings": 2**32}, {}, "flat",
                             ["max_position_embeddings", "2147483647", "4294967296"]),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_pairing_refused_before_writing(target, tmp_path, case):
    overrides, tensors, schema, words = INVALID[case]
    d = fx.make_dspark(tmp_path / "d", target, "tiny", schema=schema, config_overrides=overrides, tensors=tensors)
    cfg_path = d / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg = {k: v for k, v in cfg.items() if v is not None}  # None overrides delete a key
    cfg_path.write_text(json.dumps(cfg))
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["convert", str(target), "-o", str(out), "--draft", str(d), "--no-progress"])
    assert res.exit_code == 2, res.output
    err = res.output.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: "), res.output
    for w in words:
        assert w in err[0], (w, err[0])
    assert not out.exists() or not any(out.iterdir())


def test_valid_pairing_through_cli_writes_three_roles(target, tmp_path):
    d = fx.make_dspark(tmp_path / "d", target, "tiny")
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["convert", str(target), "-o", str(out), "--draft", str(d), "--no-progress",
                                   "--no-mmproj", "--draft-outtype", "bf16"])
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    draft = [f for f in manifest["files"] if f["role"] == "draft"]
    assert len(draft) == 1 and draft[0]["path"].startswith("dspark-") and draft[0]["type"] == "BF16"
    assert (out / draft[0]["path"]).stat().st_size == draft[0]["bytes"]


# --- sanity report ------------------------------------------------------------------------------------------------

def _norm_names(spec):
    names = ["hidden_norm.weight", "norm.weight"]
    for i in range(spec.layers):
        names += [f"layers.{i}.{n}" for n in ("input_layernorm.weight", "post_attention_layernorm.weight",
                                               "self_attn.q_norm.weight", "self_attn.k_norm.weight")]
    return names


def test_healthy_drafter_has_no_sanity_warnings(target, tmp_path, caplog):
    d = fx.make_dspark(tmp_path / "d", target, "tiny")
    with caplog.at_level(logging.WARNING):
        res = _convert(target, d, tmp_path / "out")
    assert not [n for n in res.notes if "sanity" in n]
    assert not [r for r in caplog.records if "sanity" in r.getMessage()]


@pytest.mark.parametrize("problem,words", [
    ("untrained norms", ["norm weights are exactly 1.0", "6 of 6"]),
    ("nan", ["NaN or Inf", "layers.0.mlp.up_proj.weight"]),
    ("inf bf16", ["NaN or Inf", "fc.weight"]),
    ("zero markov", ["all zero", "markov_w2"]),
])
def test_sanity_warnings(target, tmp_path, caplog, problem, words):
    spec = fx.SPECS["tiny"]
    rng = np.random.default_rng(1)
    t: dict = {}
    dtype = "float32"
    if problem == "untrained norms":
        t = {n: np.ones(spec.head_dim if ".self_attn." in n else 64, np.float32) for n in _norm_names(spec)}
    elif problem == "nan":
        up = rng.standard_normal((spec.ff, 64)).astype(np.float32)
        up[3, 5] = np.nan
        t = {"layers.0.mlp.up_proj.weight": up}
    elif problem == "inf bf16":
        fc = rng.standard_normal((64, 128)).astype(np.float32)
        fc[0, 0] = np.inf
        t, dtype = {"fc.weight": fc}, "bfloat16"
    else:
        t = {"markov_head.markov_w2.weight": np.zeros((512, spec.markov_rank), np.float32)}
    d = fx.make_dspark(tmp_path / "d", target, spec, tensors=t, dtype=dtype)
    nonfinite = problem in ("nan", "inf bf16")
    if nonfinite:  # refused by default (issue 15); --allow-nonfinite writes them, and the sanity note still comes
        with pytest.raises(NonFiniteWeights, match=words[1]):
            _convert(target, d, tmp_path / "refused")
    with caplog.at_level(logging.WARNING):
        res = _convert(target, d, tmp_path / "out", allow_nonfinite=nonfinite)
    notes = [n for n in res.notes if "sanity" in n]
    assert len(notes) == 1, res.notes
    for w in words:
        assert w in notes[0], (w, notes[0])
    assert any("sanity" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)

"""Issue 2: shapes and storage forms beyond the default tiny model, each checked against transformers or against
the source bytes; plus the output contract (file names, manifest, general.* metadata, HF-cache ids)."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil

import pytest
from gguf import GGUFReader
from safetensors import safe_open

from ggufbridge.convert import convert
from ggufbridge.compare.sources import GGUFSource, HFSource
from ggufbridge.compare.teacher_forced import logits, parity, router_margins

IDS = [505, 100, 101, 102, 200, 33, 44, 55, 66, 77, 88, 99, 7, 300, 301, 17, 42, 5, 250, 499]


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["r3", "r4", "r1", "uneven", "x6", "x16"])
def test_shape_variants_match_transformers(spec, make_ckpt, tmp_path):
    """Several V heads per K head (3, 4, and none), an uneven layer pattern, other expert counts."""
    ckpt = make_ckpt(spec, vocab="small")
    hf = HFSource(ckpt)
    ref = logits(hf, IDS)
    tied = router_margins(hf.model, IDS) < 1e-4
    with GGUFSource(convert(ckpt, tmp_path, outtype="f32", progress=False, mmproj=False).path("target"),
                    n_ctx=512, chunk=512) as gguf:
        par = parity(ref, logits(gguf, IDS))
    assert tied.sum() <= 2
    assert par.kl[~tied].mean() < 1e-5 and par.top1[~tied].all(), (par.kl, tied)


def _tensors(path) -> dict[str, tuple[str, bytes]]:
    r = GGUFReader(str(path))
    return {t.name: (t.tensor_type.name, bytes(t.data.tobytes())) for t in r.tensors}


@pytest.mark.slow
def test_fused_experts_convert_to_the_same_file(make_gguf):
    """Experts stored fused (gate_up_proj / down_proj) give byte-identical tensors to per-expert storage."""
    a = _tensors(make_gguf("tiny", "f32", vocab="small"))
    b = _tensors(make_gguf("tiny", "f32", vocab="small", fused_experts=True))
    assert a.keys() == b.keys()
    assert all(a[k] == b[k] for k in a)


@pytest.mark.slow
def test_bf16_weights_pass_through_bit_exact(make_ckpt, make_gguf):
    """BF16 → BF16: untransformed matrices keep their exact bits (read independently with safetensors)."""
    ckpt = make_ckpt("tiny", vocab="small", dtype="bfloat16")
    got = _tensors(make_gguf("tiny", "bf16", vocab="small", dtype="bfloat16"))
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    pairs = {"output.weight": "lm_head.weight",
             "token_embd.weight": "model.language_model.embed_tokens.weight",
             "blk.3.attn_q.weight": "model.language_model.layers.3.self_attn.q_proj.weight",
             "blk.0.ffn_down_shexp.weight": "model.language_model.layers.0.mlp.shared_expert.down_proj.weight"}
    for gname, hf in pairs.items():
        with safe_open(ckpt / index[hf], "pt") as f:
            src = f.get_tensor(hf).view(dtype=__import__("torch").int16).numpy().tobytes()
        assert got[gname] == ("BF16", src), gname
    assert got["blk.0.attn_norm.weight"][0] == "F32" and got["blk.0.ssm_a"][0] == "F32"


def test_manifest_names_and_general_metadata(make_ckpt, tmp_path, caplog):
    ckpt = make_ckpt("tiny", vocab="small")
    card = tmp_path / "card"
    shutil.copytree(ckpt, card)
    (card / "README.md").write_text("---\nlicense: apache-2.0\nbase_model:\n- openbmb/MiniCPM-V-4.7-35B-A3B\n---\n"
                                    "# card\n")
    with caplog.at_level(logging.INFO):
        convert(card, tmp_path / "out", outtype="q8_0", progress=False, mmproj=False)
    assert any("MTP" in r.getMessage() and "without MTP" in r.getMessage() for r in caplog.records)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert set(manifest) == {"files", "source", "ggufbridge"}
    (entry,) = [f for f in manifest["files"] if f["role"] == "target"]
    path = tmp_path / "out" / entry["path"]
    assert entry["type"] == "Q8_0" and path.name.startswith("MiniCPM-V-4_7-") and path.name.endswith("-Q8_0.gguf")
    assert entry["bytes"] == path.stat().st_size
    assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    for name, digest in manifest["source"].items():
        assert digest == hashlib.sha256((card / name).read_bytes()).hexdigest()
    assert {"config.json", "tokenizer.json", "model.safetensors.index.json"} <= set(manifest["source"])
    f = GGUFReader(str(path)).fields
    assert f["general.architecture"].contents() == "qwen35moe"
    assert f["general.basename"].contents() == "MiniCPM-V-4_7"
    assert f["general.license"].contents() == "apache-2.0"
    assert f["general.base_model.0.repo_url"].contents() == "https://huggingface.co/openbmb/MiniCPM-V-4.7-35B-A3B"
    label = f["general.size_label"].contents()
    assert path.name == f"MiniCPM-V-4_7-{label}-Q8_0.gguf" and "-A" in label
    assert list(f["qwen35moe.attention.recurrent_layers"].contents()) == [True, True, True, False]
    assert "nextn_predict_layers" not in str(list(f))
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]


def test_size_label_of_the_real_shapes():
    """35B-A3B for the real model's shapes (computed from a plan of the real dimensions, no weights)."""
    from ggufbridge.ggufio.plan import ConversionPlan, PlannedTensor
    from ggufbridge.convert import size_label

    E, V, L, X, Fe = 2048, 248144, 40, 256, 512
    plan = ConversionPlan("qwen35moe")
    plan.u32("qwen35moe.expert_count", X)
    plan.u32("qwen35moe.expert_used_count", 8)
    t = lambda name, *shape: PlannedTensor(name, shape, [], None)  # noqa: E731
    plan.tensors += [t("token_embd.weight", V, E), t("output.weight", V, E)]
    for il in range(L):
        plan.tensors += [t(f"blk.{il}.ffn_{k}_exps.weight", X, Fe, E) for k in ("gate", "up", "down")]
        if il % 4 != 3:  # gated delta net: qkv, z, out, a, b
            plan.tensors += [t(f"blk.{il}.qkv", 8192, E), t(f"blk.{il}.z", 4096, E), t(f"blk.{il}.out", E, 4096),
                             t(f"blk.{il}.ab", 2 * 32, E)]
        else:  # gated attention: q (with gate), k, v, o
            plan.tensors += [t(f"blk.{il}.q", 2 * 16 * 256, E), t(f"blk.{il}.kv", 2 * 2 * 256, E),
                             t(f"blk.{il}.o", E, 16 * 256)]
        plan.tensors += [t(f"blk.{il}.router", X, E), t(f"blk.{il}.shexp", 3 * 512, E)]
    assert size_label(plan) == "35B-A3B"


def test_hf_cache_repo_id_resolves_offline(make_ckpt, tmp_path, monkeypatch):
    ckpt = make_ckpt("tiny", vocab="small")
    hub = tmp_path / "hub"
    snap = hub / "models--openbmb--MiniCPM-V-4_7-tiny" / "snapshots" / "abc123"
    shutil.copytree(ckpt, snap)
    (hub / "models--openbmb--MiniCPM-V-4_7-tiny" / "refs").mkdir()
    (hub / "models--openbmb--MiniCPM-V-4_7-tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    res = convert("openbmb/MiniCPM-V-4_7-tiny", tmp_path / "out", outtype="f16", progress=False, mmproj=False)
    assert res.path("target").exists()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(Exception, match="HF cache"):
        convert("openbmb/MiniCPM-V-4_7-tiny", tmp_path / "out2", progress=False)


def test_tensor_types_follow_the_f32_rules(make_ckpt, tmp_path):
    """Element-wise weights stay F32 whatever --outtype (the CPU binary ops abort on F16 norms)."""
    out = convert(make_ckpt("tiny", vocab="small"), tmp_path, outtype="f16", progress=False,
                  mmproj=False).path("target")
    types = {n: t for n, (t, _) in _tensors(out).items()}
    for name, typ in types.items():
        if name.endswith(("norm.weight", ".ssm_a", "ssm_dt.bias", "ssm_conv1d.weight", "ffn_gate_inp.weight")):
            assert typ == "F32", name
        elif name.endswith(("exps.weight", "attn_qkv.weight", "output.weight", "attn_q.weight")):
            assert typ == "F16", name

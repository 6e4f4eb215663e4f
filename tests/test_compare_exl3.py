"""The exllamav3 shim for MiniCPM-V 4.7 (CPU: against a stand-in of exllamav3's Config), and the GPU run."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from ggufbridge.compare import exl3
from ggufbridge.errors import GGUFBridgeError


class StandInConfig:
    """What exllamav3's `Config.__init__` does with config.json (model/config.py): assign the parsed json to
    `self.config_dict`, check architectures[0] against `arch_string`, then read fields from `config_dict`."""

    arch_string = None

    def __init__(self, directory, model_classes, **kwargs):
        with open(os.path.join(directory, "config.json"), encoding="utf8") as f:
            self.config_dict = json.load(f)
        arch = self.config_dict["architectures"][0]
        assert arch == self.arch_string, f"Unexpected architecture {arch}, should be {self.arch_string}."
        self.model_classes = model_classes
        self.vocab_size = self.config_dict.get("vocab_size")


class StandInQwen35MoeConfig(StandInConfig):
    """Reads the text hyper-parameters at top level, as exllamav3 1.6.5's Qwen3_5MoeForCausalLM config does."""

    arch_string = "Qwen3_5MoeForCausalLM"

    def __init__(self, directory, **kwargs):
        super().__init__(directory, {"text": StandInModel}, **kwargs)
        d = self.config_dict
        self.hidden_size = d["hidden_size"]
        self.num_experts = d["num_experts"]
        self.layer_types = d["layer_types"]
        self.rope_theta = d["rope_parameters"]["rope_theta"]


class StandInModel:
    config_class = StandInQwen35MoeConfig


def stand_in_table():
    return {"Qwen3_5MoeForCausalLM": {"architecture": "Qwen3_5MoeForCausalLM",
                                      "config_class": StandInQwen35MoeConfig, "model_class": StandInModel}}


@pytest.fixture(scope="module")
def small_ckpt(make_ckpt):
    return make_ckpt("tiny", vocab="small")


def test_shim_reads_the_text_tower(small_ckpt):
    table = stand_in_table()
    assert exl3.install_shim(table) == "Qwen3_5MoeForCausalLM"
    assert exl3.install_shim(table) == "Qwen3_5MoeForCausalLM"  # idempotent
    entry = table[exl3.ARCH]
    assert entry["model_class"] is StandInModel
    cfg = entry["config_class"](str(small_ckpt))
    text = json.loads((small_ckpt / "config.json").read_text())["text_config"]
    assert cfg.hidden_size == text["hidden_size"]
    assert cfg.num_experts == text["num_experts"]
    assert cfg.layer_types == text["layer_types"]
    assert cfg.rope_theta == text["rope_parameters"]["rope_theta"]
    assert cfg.vocab_size == text["vocab_size"]
    assert cfg.model_classes == {"text": StandInModel}


def test_shim_needs_a_qwen35_moe_base():
    with pytest.raises(GGUFBridgeError, match="Qwen3_5MoeForCausalLM"):
        exl3.install_shim({"LlamaForCausalLM": {}})


def test_text_only_view(small_ckpt, tmp_path):
    view = exl3.text_only_view(small_ckpt, tmp_path / "view")
    cfg = json.loads((view / "config.json").read_text())
    text = json.loads((small_ckpt / "config.json").read_text())["text_config"]
    assert cfg["architectures"] == ["Qwen3_5MoeForCausalLM"]
    assert "text_config" not in cfg and "vision_config" not in cfg
    assert all(cfg[k] == v for k, v in text.items() if k != "architectures")
    # every other file is the checkpoint's own (symlinked, nothing copied)
    others = sorted(p.name for p in small_ckpt.iterdir() if p.name != "config.json")
    assert sorted(p.name for p in view.iterdir() if p.name != "config.json") == others
    assert all((view / n).resolve() == (small_ckpt / n).resolve() for n in others)
    # the unmodified Qwen3.5-MoE config class reads the view like the shim reads the original
    plain = StandInQwen35MoeConfig(str(view))
    shimmed_table = stand_in_table()
    exl3.install_shim(shimmed_table)
    shimmed = shimmed_table[exl3.ARCH]["config_class"](str(small_ckpt))
    assert (plain.hidden_size, plain.layer_types) == (shimmed.hidden_size, shimmed.layer_types)
    # a second run replaces the links
    exl3.text_only_view(small_ckpt, tmp_path / "view")
    with pytest.raises(GGUFBridgeError, match="architectures must be"):
        exl3.text_only_view(view, tmp_path / "again")


def test_module_entry_point(small_ckpt, tmp_path, capsys):
    assert exl3.main(["text-only", str(small_ckpt), str(tmp_path / "v")]) == 0
    assert (tmp_path / "v" / "config.json").is_file()
    assert exl3.main(["bogus"]) == 2


gpu = pytest.mark.gpu


def _cuda():
    import torch

    return torch.cuda.is_available()


@gpu
@pytest.mark.slow
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU and exllamav3 (GPU run only; see docs/compare.md)")
def test_exl3_pack_against_gguf_and_hf(make_ckpt, tmp_path):
    """Quantise the K-quant-safe synthetic model with exllamav3 at 6 bpw, dump its logits and compare."""
    from ggufbridge.cli import cli
    from ggufbridge.convert import convert

    ckpt = make_ckpt("ksafe", vocab="small", dtype="bfloat16")  # exllamav3 wants bf16 (dt_bias)
    pack = exl3.quantize(ckpt, tmp_path / "exl3-6.0", bits=6.0)
    q8 = convert(ckpt, tmp_path / "q8", outtype="q8_0", mmproj=False, progress=False).path("target")
    ev = tmp_path / "eval.jsonl"
    ev.write_text(json.dumps({"text": "The quick brown fox jumps over the lazy dog. " * 8}) + "\n")
    r = CliRunner().invoke(cli, ["dump-logits", "--model", f"exl3:{pack}", "--eval", str(ev), "--ctx", "256",
                                 "-o", str(tmp_path / "exl3.safetensors"), "--no-progress"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["compare", str(q8), f"exl3:{pack}", "--reference", f"hf:{ckpt}", "--eval", str(ev),
                                 "--ctx", "256", "--json", str(tmp_path / "r.json"), "--no-progress"])
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "r.json").read_text())
    q8_res, exl3_res = res["results"]
    assert exl3_res["label"] == pack.name and 5.0 < exl3_res["bits_per_weight"] < 7.0
    assert 0 < exl3_res["kl_mean"] < 1.0 and exl3_res["top1"] > 0.5
    assert res["floor"] is not None
    # the dump of the pack, used as the reference, agrees with the pack itself (KL of a model against itself)
    r = CliRunner().invoke(cli, ["compare", f"exl3:{pack}", "--reference", f"logits:{tmp_path / 'exl3.safetensors'}",
                                 "--eval", str(ev), "--ctx", "256", "--json", str(tmp_path / "s.json"),
                                 "--no-progress"])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "s.json").read_text())["kl_mean"] < 1e-3


@gpu
@pytest.mark.slow
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU and exllamav3 (GPU run only; see docs/compare.md)")
def test_exl3_pack_named_as_minicpmv47_loads_through_the_shim(make_ckpt, tmp_path):
    """A pack whose config.json is the 4.7 one (text_config nested, as an EXL3 release of the model ships it) goes
    through install_shim and gives exactly the logits of the same pack read as Qwen3.5-MoE."""
    import numpy as np

    from ggufbridge.compare.evalset import Row
    from ggufbridge.compare.sources import EXL3Source

    ckpt = make_ckpt("ksafe", vocab="small", dtype="bfloat16")  # exllamav3 wants bf16 (dt_bias)
    pack = exl3.quantize(ckpt, tmp_path / "exl3-4.0", bits=4.0)
    as47 = tmp_path / "exl3-4.0-as-4.7"
    as47.mkdir()
    for f in pack.iterdir():
        if f.name != "config.json":
            (as47 / f.name).symlink_to(f.resolve())
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["quantization_config"] = json.loads((pack / "config.json").read_text())["quantization_config"]
    (as47 / "config.json").write_text(json.dumps(cfg))
    assert cfg["architectures"] == [exl3.ARCH] and "text_config" in cfg
    row = Row(tuple(int(i) for i in np.random.default_rng(0).integers(0, 472, 200)))
    logits = {}
    for name, path in (("qwen35", pack), ("4.7", as47)):
        src = EXL3Source(path, n_ctx=256)
        try:
            logits[name] = np.concatenate([c.logits for c in src.chunks(0, row, 64)])
            if name == "4.7":
                assert type(src.config).__name__ == "MiniCPMV47TextConfig"
        finally:
            src.close()
    assert logits["4.7"].shape == (200, 512) and np.isfinite(logits["4.7"]).all()
    # same weights, same kernels: equal up to run-to-run float noise of the GPU kernels
    np.testing.assert_allclose(logits["4.7"], logits["qwen35"], rtol=0, atol=1e-3)
    assert (logits["4.7"].argmax(-1) == logits["qwen35"].argmax(-1)).all()

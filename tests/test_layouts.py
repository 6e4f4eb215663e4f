"""Issue 12: every published tensor-name layout converts to the same GGUF bytes; mixed or unknown layouts are refused;
config variations are read as the upstream processors read them.

The native 4.7 rewriter below is written out from docs/formats.md ("Checkpoint layouts") (sglang 0.5.23
`_V4_7_WEIGHT_PREFIXES` and its nn.Sequential connector names), independently of ggufbridge.checkpoint.layout, so a
wrong production table makes these tests fail.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufbridge.arch import minicpmv4_7_vision as V
from ggufbridge.checkpoint.model_dir import INDEX_NAME, SINGLE_NAME, ModelDir
from ggufbridge.cli import cli
from ggufbridge.convert import convert
from ggufbridge.testkit import dspark as fx

# transformers-native prefix → native 4.7 prefix (the inverse of sglang's table; vit_merger before the tower)
TO_NATIVE = (
    ("model.language_model.", "llm.model."),
    ("lm_head.", "llm.lm_head."),
    ("model.vision_tower.vit_merger.", "vit_merger."),
    ("model.vision_tower.", "vpm."),
    ("model.merger.", "resampler."),
)
MTP_NAMES = {  # Qwen3.5-style MTP block: not converted, but it must not stop a conversion
    "mtp.fc.weight": (64, 128),
    "mtp.norm.weight": (64,),
    "mtp.pre_fc_norm_embedding.weight": (64,),
    "mtp.layers.0.input_layernorm.weight": (64,),
}


def to_native(name: str, mtp: str = "mtp.") -> str:
    if name.startswith("mtp."):
        return mtp + name[len("mtp."):]
    for old, new in TO_NATIVE:
        if name.startswith(old):
            name = new + name[len(old):]
            break
    # the connector MLPs are nn.Sequential: linear_1 → mlp.0, linear_2 → mlp.2 (the vit_merger keeps its names)
    name = re.sub(r"^(resampler\.mlp\.\d+)\.linear_1\.", r"\1.mlp.0.", name)
    return re.sub(r"^(resampler\.mlp\.\d+)\.linear_2\.", r"\1.mlp.2.", name)


def rewrite(src: Path, dst: Path, rename, extra: dict | None = None) -> Path:
    """Copy a checkpoint folder with every tensor renamed: same shards, same tensors and bytes, index rewritten.
    `extra` (final name → torch tensor) goes into one more shard, named in the index."""
    from safetensors.torch import load_file, save_file

    indexed = (src / INDEX_NAME).is_file()
    assert indexed or not extra, "extra tensors need an indexed checkpoint"
    dst.mkdir(parents=True)
    for p in src.iterdir():
        if p.is_file() and not p.name.endswith(".safetensors") and p.name != INDEX_NAME:
            shutil.copy2(p, dst / p.name)
    shards = [SINGLE_NAME]
    if indexed:
        shards = sorted(set(json.loads((src / INDEX_NAME).read_text())["weight_map"].values()))
    weight_map = {}
    for shard in shards:
        tensors = {rename(k): v for k, v in load_file(src / shard).items()}
        save_file(tensors, str(dst / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, shard))
    if extra:
        save_file(extra, str(dst / "model-extra.safetensors"))
        weight_map.update(dict.fromkeys(extra, "model-extra.safetensors"))
    if indexed:
        (dst / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


def mtp_tensors() -> dict:
    import torch

    g = torch.Generator().manual_seed(3)
    return {k: torch.randn(shape, generator=g) for k, shape in MTP_NAMES.items()}


def names(ckpt: Path) -> set[str]:
    return set(json.loads((ckpt / INDEX_NAME).read_text())["weight_map"])


def files(res) -> dict[str, tuple[str, bytes]]:
    return {f["role"]: (f["path"], (res.out_dir / f["path"]).read_bytes()) for f in res.files}


@pytest.fixture(scope="module")
def base(make_ckpt):
    """transformers-native checkpoints, sharded with an index: per-expert and fused experts."""
    return {"per-expert": make_ckpt("tiny", vocab="small", max_shard_size="200KB"),
            "fused": make_ckpt("tiny", vocab="small", max_shard_size="200KB", fused_experts=True)}


@pytest.fixture(scope="module")
def hf(base, tmp_path_factory):
    """(experts, with MTP) → a transformers-native checkpoint and its conversion (target + mmproj)."""
    cache = {}

    def get(experts: str, mtp: bool):
        if (experts, mtp) not in cache:
            root = tmp_path_factory.mktemp(f"hf-{experts}-{mtp}")
            ckpt = rewrite(base[experts], root / "ckpt", str, mtp_tensors()) if mtp else base[experts]
            cache[experts, mtp] = ckpt, convert(ckpt, root / "out", progress=False)
        return cache[experts, mtp]

    return get


@pytest.mark.parametrize("mtp", [None, "mtp.", "llm.mtp."], ids=["no-mtp", "mtp", "llm.mtp"])
@pytest.mark.parametrize("experts", ["per-expert", "fused"])
def test_native_layout_converts_to_the_same_bytes(experts, mtp, hf, tmp_path, caplog):
    ref_ckpt, ref = hf(experts, mtp is not None)
    native = rewrite(ref_ckpt, tmp_path / "native", lambda n: to_native(n, mtp or "mtp."))
    got = names(native)
    # the rewrite really is the native layout: nothing transformers-native is left
    assert not [n for n in got if n.startswith("model.")], sorted(got)[:3]
    assert {"resampler.mlp.0.mlp.0.weight", "resampler.mlp.0.mlp.2.bias", "resampler.mlp.0.pre_norm.weight",
            "vit_merger.linear_1.weight", "llm.lm_head.weight", "llm.model.embed_tokens.weight"} <= got
    assert ("llm.model.layers.0.mlp.experts.gate_up_proj" in got) == (experts == "fused")
    assert (f"{mtp}fc.weight" in got) if mtp else not [n for n in got if "mtp." in n]
    assert len(set(native.glob("*.safetensors"))) > 10  # sharded

    md = ModelDir.open(native)
    assert md.layout == "native-4.7"
    ref_md = ModelDir.open(ref_ckpt)
    assert md.tensors.keys() == ref_md.tensors.keys()  # canonical names; the refs keep the stored ones
    assert md.tensors["model.merger.mlp.0.linear_1.weight"].name == "resampler.mlp.0.mlp.0.weight"

    with caplog.at_level(logging.INFO, logger="ggufbridge.convert"):
        res = convert(native, tmp_path / "out", progress=False)
    assert files(res) == files(ref)  # same roles, same file names, same bytes: target and mmproj
    assert set(files(res)) == {"target", "mmproj"}
    assert "target checkpoint: native-4.7 tensor-name layout" in res.notes
    assert any("native-4.7" in r.getMessage() for r in caplog.records)  # the user sees it (INFO is the CLI default)
    if mtp:
        assert any("MTP layers present but not converted" in n for n in res.notes), res.notes


@pytest.mark.parametrize("form", ["all-prefixed", "head-outside"])
def test_draft_in_the_other_prefix_form_converts_to_the_same_bytes(form, base, tmp_path):
    """Target native vs transformers-native, draft `model.`-prefixed vs bare: all three files byte-identical."""
    target = base["per-expert"]
    bare = fx.make_dspark(tmp_path / "bare", target, "reduced")  # own lm_head + d2t/t2d: every kind of draft name
    outside = ("lm_head.weight", "d2t", "t2d")  # a *ForCausalLM keeps its head outside `model.`
    prefixed = rewrite(bare, tmp_path / "prefixed",
                       lambda n: n if form == "head-outside" and n in outside else "model." + n)
    native = rewrite(target, tmp_path / "native", to_native)

    ref = convert(target, tmp_path / "ref", draft=bare, progress=False)
    res = convert(native, tmp_path / "out", draft=prefixed, progress=False)
    assert set(files(res)) == {"target", "mmproj", "draft"}
    assert files(res) == files(ref)
    assert ModelDir.open(bare).layout == "dspark"
    assert ModelDir.open(prefixed).layout == "dspark-model-prefixed"
    assert "draft checkpoint: dspark-model-prefixed tensor-name layout" in res.notes


def test_verify_source_reads_the_native_layout(base, tmp_path):
    """`verify --source` compares the output with the checkpoint through the stored (native) names."""
    native = rewrite(base["per-expert"], tmp_path / "native", to_native)
    convert(native, tmp_path / "out", outtype="f32", progress=False)
    res = CliRunner().invoke(cli, ["verify", str(tmp_path / "out"), "--source", str(native)])
    assert res.exit_code == 0, res.output
    assert res.output.rstrip().endswith("OK") and "0 differ" in res.output, res.output


# --- refused layouts (CLI: exit 2, one line, no traceback, nothing written) ---------------------------------------

def _mixed(ckpt, d):  # the vision tower left in transformers names, the rest native
    return rewrite(ckpt, d, lambda n: n if n.startswith("model.vision_tower.") else to_native(n))


def _unknown(ckpt, d):  # GPT-2 style text-tower names
    return rewrite(ckpt, d, lambda n: n.replace("model.language_model.", "transformer.", 1))


def _twice(ckpt, d):  # the window merger at the top level and again under the tower
    import torch

    return rewrite(ckpt, d, to_native, {"vpm.vit_merger.linear_1.bias": torch.zeros(4)})


def _draft_names_target_config(ckpt, d):  # DSpark shards beside a MiniCPM-V 4.7 config.json
    draft = fx.make_dspark(d.parent / "draft", ckpt, "tiny")
    shutil.copytree(draft, d)
    shutil.copy2(ckpt / "config.json", d / "config.json")
    return d


REFUSED = {
    _mixed: ["mix layouts", "expected one layout", "native-4.7", "transformers", "model.vision_tower."],
    _unknown: ["belong to no known layout", "transformer.", "expected", "llm.model."],
    _twice: ["stored twice", "vit_merger.linear_1.bias", "vpm.vit_merger.linear_1.bias"],
    _draft_names_target_config: ["expected the tensor names of a MiniCPM-V 4.7 checkpoint", "found the dspark"],
}


@pytest.mark.parametrize("make", list(REFUSED), ids=[f.__name__.strip("_") for f in REFUSED])
def test_bad_layouts_are_refused_cleanly(make, base, tmp_path):
    ckpt = make(base["per-expert"], tmp_path / "ckpt")
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["convert", str(ckpt), "-o", str(out), "--no-progress"])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and (res.exception is None or isinstance(res.exception, SystemExit))
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    for word in REFUSED[make]:
        assert word in lines[0], (word, lines[0])
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())


def test_mixed_draft_prefixes_are_refused(base, tmp_path):
    bare = fx.make_dspark(tmp_path / "bare", base["per-expert"], "tiny")
    mixed = rewrite(bare, tmp_path / "mixed", lambda n: "model." + n if n.startswith("layers.") else n)
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["convert", str(base["per-expert"]), "-o", str(out), "--draft", str(mixed),
                                   "--no-progress"])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "mix layouts" in lines[0] and "model.layers.0." in lines[0], res.output
    assert not out.exists() or not any(out.iterdir())


# --- config variations ----------------------------------------------------------------------------------------------

def _copy_with(ckpt: Path, d: Path, config=None, pre=None) -> Path:
    shutil.copytree(ckpt, d)
    for name, edit in (("config.json", config), ("preprocessor_config.json", pre)):
        if edit:
            data = json.loads((d / name).read_text())
            edit(data)
            (d / name).write_text(json.dumps(data))
    return d


def test_stale_numeric_version_is_ignored(hf, tmp_path):
    """4.7 configs still carry a numeric `version` of an older MiniCPM-V: architectures decide, the bytes agree."""
    ref_ckpt, ref = hf("per-expert", False)
    ckpt = _copy_with(ref_ckpt, tmp_path / "ckpt", config=lambda c: c.update(version=2.6))
    assert files(convert(ckpt, tmp_path / "out", progress=False)) == files(ref)


def _vision(ckpt: Path) -> V.VisionParams:
    return V.read_params(ModelDir.open(ckpt), 64)


def _kv(plan, key):
    return next(kv.value for kv in plan.kvs if kv.key == key)


def test_missing_scale_resolution_defaults_to_448(base, tmp_path):
    # config.json's image_size (112 in the fixture) is not the processor's slice size: processors default to 448
    ckpt = _copy_with(base["per-expert"], tmp_path / "ckpt", pre=lambda p: p.pop("scale_resolution"))
    assert json.loads((ckpt / "config.json").read_text())["image_size"] == 112
    assert _vision(ckpt).slice_size == 448
    assert _kv(V.plan_mmproj(ModelDir.open(ckpt), 64), "clip.vision.image_size") == 448
    assert _vision(base["per-expert"]).slice_size == 112  # an explicit value is used as it is


@pytest.mark.parametrize("config_mode,pre_mode,want", [
    ("4x", None, "4x"),  # only in config.json (4.7): used
    ("16x", None, "16x"),
    ("4x", "16x", "16x"),  # an explicit preprocessor value wins
    ("16x", "4x", "4x"),
    (None, None, "16x"),  # neither: the processors' default
])
def test_downsample_mode_from_config_or_preprocessor(config_mode, pre_mode, want, base, tmp_path):
    def cfg(c):
        c.pop("downsample_mode", None)
        if config_mode:
            c["downsample_mode"] = config_mode

    def pre(p):
        p.pop("downsample_mode", None)
        if pre_mode:
            p["downsample_mode"] = pre_mode

    ckpt = _copy_with(base["per-expert"], tmp_path / "ckpt", config=cfg, pre=pre)
    assert _vision(ckpt).downsample == want
    plan = V.plan_mmproj(ModelDir.open(ckpt), 64)
    assert _kv(plan, "clip.vision.projector.scale_factor") == {"16x": 4, "4x": 2}[want]
    assert any(t.name.startswith("v.vit_merger.") for t in plan.tensors) == (want == "16x")


def test_max_slice_nums_is_read_from_the_preprocessor(base, tmp_path):
    ckpt = _copy_with(base["per-expert"], tmp_path / "ckpt", config=lambda c: c.update(max_slice_nums=2),
                      pre=lambda p: p.update(max_slice_nums=4))
    assert _vision(ckpt).max_slice_nums == 4
    ckpt = _copy_with(base["per-expert"], tmp_path / "ckpt2", config=lambda c: c.update(max_slice_nums=2),
                      pre=lambda p: p.pop("max_slice_nums"))
    assert _vision(ckpt).max_slice_nums == 9  # the processors' default, not config.json's


"""The mmproj GGUF: keys/types the runtime reads, the 70×70 position table, 4x/16x, refusals, and embedding
parity of the runtime's encoder (libmtmd through llama-cpp-python) against transformers' get_image_features."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from _vision_helpers import cosines, hf_crop_features, hf_processor, random_image
from ggufbridge.arch import minicpmv4_7_vision as V
from ggufbridge.checkpoint.model_dir import ModelDir
from ggufbridge.convert import convert
from ggufbridge.errors import ConfigError, VisionModelError


@pytest.fixture(scope="module")
def conv(make_ckpt, tmp_path_factory):
    """convert(spec, downsample) → ConvertResult, F32 text + F16 mmproj, cached per module."""
    cache = {}

    def run(spec="tiny", downsample=None, mmproj_outtype="f16"):
        key = (spec, downsample, mmproj_outtype)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"mmproj-{spec}-{downsample}")
            cache[key] = convert(make_ckpt(spec, vocab="small"), out, outtype="f32", downsample=downsample,
                                 mmproj_outtype=mmproj_outtype, progress=False)
        return cache[key]

    return run


def _fields(r: GGUFReader) -> dict:
    return {k: (f.types, f.contents()) for k, f in r.fields.items()}


@pytest.mark.slow
def test_keys_and_types_16x(conv, make_ckpt):
    res = conv("tiny")
    assert res.path("mmproj").name == "mmproj-MiniCPM-V-4_7-333K-A185K-F16.gguf"  # the small vocabulary's size
    r = GGUFReader(res.path("mmproj"))
    f = _fields(r)
    cfg = json.loads((make_ckpt("tiny", vocab="small") / "config.json").read_text())
    pre = json.loads((make_ckpt("tiny", vocab="small") / "preprocessor_config.json").read_text())
    vc = cfg["vision_config"]
    want = {
        "clip.projector_type": ([GGUFValueType.STRING], "minicpmv4_6"),
        "general.type": ([GGUFValueType.STRING], "mmproj"),
        "clip.has_vision_encoder": ([GGUFValueType.BOOL], True),
        "clip.use_gelu": ([GGUFValueType.BOOL], True),
        "clip.vision.embedding_length": ([GGUFValueType.UINT32], vc["hidden_size"]),
        "clip.vision.feed_forward_length": ([GGUFValueType.UINT32], vc["intermediate_size"]),
        "clip.vision.block_count": ([GGUFValueType.UINT32], vc["num_hidden_layers"]),
        "clip.vision.attention.head_count": ([GGUFValueType.UINT32], vc["num_attention_heads"]),
        "clip.vision.image_size": ([GGUFValueType.UINT32], pre["scale_resolution"]),
        "clip.vision.patch_size": ([GGUFValueType.UINT32], vc["patch_size"]),
        "clip.vision.projection_dim": ([GGUFValueType.UINT32], cfg["text_config"]["hidden_size"]),
        "clip.vision.projector.scale_factor": ([GGUFValueType.UINT32], 4),
        "clip.vision.wa_layer_indexes": ([GGUFValueType.ARRAY, GGUFValueType.INT32], [cfg["insert_layer_id"]]),
        "clip.vision.image_mean": ([GGUFValueType.ARRAY, GGUFValueType.FLOAT32], pre["image_mean"]),
        "clip.vision.image_std": ([GGUFValueType.ARRAY, GGUFValueType.FLOAT32], pre["image_std"]),
    }
    for key, (types, value) in want.items():
        assert key in f, key
        assert f[key][0] == types, (key, f[key][0])
        assert f[key][1] == pytest.approx(value), (key, f[key][1])
    assert f["clip.vision.attention.layer_norm_epsilon"][0] == [GGUFValueType.FLOAT32]
    names = {t.name: t for t in r.tensors}
    assert names["v.position_embd.weight"].shape.tolist() == [vc["hidden_size"], 4900]
    assert "v.vit_merger.ds_ffn_up.weight" in names and "v.vit_merger.attn_q.weight" in names
    assert names["mm.down.weight"].shape.tolist() == [4 * vc["hidden_size"], cfg["text_config"]["hidden_size"]]
    # element-wise weights must be F32 for the CPU backend
    assert all(t.tensor_type.name == "F32" for t in r.tensors if len(t.shape) == 1)


@pytest.mark.slow
def test_downsample_override_4x_drops_vit_merger(conv):
    r = GGUFReader(conv("tiny", "4x").path("mmproj"))
    f = _fields(r)
    assert f["clip.vision.projector.scale_factor"] == ([GGUFValueType.UINT32], 2)
    assert not [t.name for t in r.tensors if t.name.startswith("v.vit_merger.")]
    assert any("vit_merger tensors not written" in n for n in conv("tiny", "4x").notes)


def test_position_table_matches_hf_buckets(make_ckpt):
    """The runtime indexes row floor(70·i/H)·70 + floor(70·j/W); that row must hold HF's nearest-bucket row
    (transformers' own get_vision_nearest_position_ids) for every patch of every grid the processor can make."""
    import torch
    from transformers.vision_utils import get_vision_nearest_position_ids

    md = ModelDir.open(make_ckpt("tiny4x", vocab="small"))
    ref = md.tensors["model.vision_tower.embeddings.position_embedding.weight"]
    table = ref.read_f32()
    grid = int(round(table.shape[0] ** 0.5))
    assert grid == 14  # the spec's 196-pixel ViT: not the runtime's 70
    big = V.expand_position_table(table, grid)
    assert big.shape == (4900, table.shape[1])
    for h, w in [(8, 8), (4, 12), (6, 10), (16, 8), (32, 32), (2, 2), (20, 12)]:
        hf_ids = get_vision_nearest_position_ids(torch.tensor([[h, w]]), grid).numpy()
        i, j = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        rt_rows = ((70 * i) // h * 70 + (70 * j) // w).reshape(-1)
        np.testing.assert_array_equal(big[rt_rows], table[hf_ids], err_msg=f"grid {h}x{w}")


def _edited_ckpt(src, dst, edit):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_refuses_ff_equal_hidden(make_ckpt, tmp_path):
    ck = _edited_ckpt(make_ckpt("tiny", vocab="small"), tmp_path / "ck",
                      lambda c: c["vision_config"].update(intermediate_size=32))
    with pytest.raises(ConfigError, match="intermediate_size must differ from hidden_size.*swap.*found 32"):
        V.plan_mmproj(ModelDir.open(ck), 64)


def test_refuses_wrong_activation_and_bad_downsample(make_ckpt, tmp_path):
    ck = _edited_ckpt(make_ckpt("tiny", vocab="small"), tmp_path / "ck",
                      lambda c: c["vision_config"].update(hidden_act="relu"))
    with pytest.raises(ConfigError, match="hidden_act must be one of .*found 'relu'"):
        V.plan_mmproj(ModelDir.open(ck), 64)
    with pytest.raises(ConfigError, match="downsample mode must be one of .*found '8x'"):
        V.plan_mmproj(ModelDir.open(make_ckpt("tiny", vocab="small")), 64, downsample="8x")


def test_refuses_output_width_mismatch(make_ckpt):
    with pytest.raises(Exception, match=r"model.merger.mlp.0.linear_2.weight: expected shape \[48, 128\]"):
        V.plan_mmproj(ModelDir.open(make_ckpt("tiny", vocab="small")), 48)


@pytest.mark.slow
def test_runtime_rejects_mmproj_of_another_width(conv, tmp_path):
    from ggufbridge.testkit.checkpoint import TinySpec, make_minicpmv47
    from ggufbridge.testkit.bindings import VisionSession

    ck = make_minicpmv47(tmp_path / "ck", TinySpec(hidden=32), vocab="small")
    other = convert(ck, tmp_path / "o", outtype="f32", progress=False)
    with pytest.raises(VisionModelError,
                       match="mmproj output width must equal the text model's hidden size 32, found 64"):
        VisionSession(other.path("target"), conv("tiny").path("mmproj"))


# --- embedding parity ---------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("spec,downsample,size", [
    ("tiny", None, (112, 112)),  # 16x, one crop
    ("tiny4x", None, (112, 112)),  # 4x, 14×14 ViT grid expanded to 70×70
    ("tiny", None, (250, 130)),  # 16x, thumbnail + 1×2 slices
    ("tiny", None, (130, 250)),  # 16x, thumbnail + 2×1 slices
    ("tiny", "4x", (230, 170)),  # --downsample 4x on a 16x checkpoint, 2×2 slices
])
def test_embeddings_match_transformers(conv, make_ckpt, spec, downsample, size):
    """The patched libmtmd slices the image itself (as the processor does) and encodes every crop: its visual rows
    equal transformers' get_image_features on the processor's own pixels, crop by crop."""
    from ggufbridge.testkit.checkpoint import load_reference
    from ggufbridge.testkit.bindings import VisionSession

    # not about the vocabulary: the small one (the vision weights of its random draw end 1 - cos <= 7e-7 from
    # transformers in all five cases, as the real vocabulary's did; the bound is 1e-4)
    res = conv(spec, downsample)
    ck = make_ckpt(spec, vocab="small")
    img = random_image(*size, seed=sum(size))
    proc = hf_processor(ck, downsample)
    hf_in = proc(images=[img], text=["<unk>"], return_tensors="pt")
    ref = load_reference(ck)
    with VisionSession(res.path("target"), res.path("mmproj"), n_ctx=512) as s:
        chunks = s.chunks(s.marker, [img])
    frame = next(c for c in chunks if c.kind == "image")
    ids = hf_in["input_ids"][0].tolist()
    start = ids.index(proc.tokenizer.convert_tokens_to_ids("<image>"))
    visual = np.array(ids[start:start + frame.n_tokens]) == proc.image_token_id
    assert frame.n_tokens == len(ids) - start  # the frame is everything from <image> on
    want = hf_crop_features(ref, hf_in["pixel_values"], hf_in["target_sizes"], downsample)
    ours = frame.embd[visual]
    assert ours.shape == np.concatenate(want).shape
    assert cosines(ours, np.concatenate(want)).min() > 0.9999

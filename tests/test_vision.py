"""Image prompts: preprocessing and prompt layout against transformers' processor, bad inputs, and end-to-end
teacher-forced logits of the bindings path (canvas M-RoPE) against transformers."""

from __future__ import annotations

import dataclasses
import struct
import zlib

import numpy as np
import pytest

from _vision_helpers import SPEC_THW, hf_logits, hf_pixels, hf_processor, kl_rows, random_image
from ggufbridge.convert import convert
from ggufbridge.errors import VisionInputError, VisionModelError
from ggufbridge.vision.preprocess import SliceConfig, load_image, make_crops, plan_slices

# --- preprocessing against the reference processor (fast) ---------------------------------------------------------

SIZES = [(112, 112), (250, 130), (130, 250), (300, 300), (640, 200), (90, 60), (1000, 700), (113, 500)]


@pytest.mark.parametrize("downsample", ["16x", "4x"])
def test_crops_are_hf_pixels(tiny_ckpt, downsample):
    proc = hf_processor(tiny_ckpt, downsample)
    cfg = SliceConfig(112, 14, 4 if downsample == "16x" else 2)
    for k, (w, h) in enumerate(SIZES):
        img = random_image(w, h, seed=k)
        want = proc(images=[img], text=["<unk>"], return_tensors="pt")
        crops = make_crops(img, cfg)
        pv, ts = hf_pixels([crops])
        assert ts.tolist() == want["target_sizes"].tolist(), (w, h)
        assert np.array_equal(pv.numpy(), want["pixel_values"].numpy()), (w, h)
        # the grid shows in the placeholder text: slice rows are joined by a newline
        grid = plan_slices((h, w), cfg).grid
        text = proc.tokenizer.decode(want["input_ids"][0])
        assert text.count("<slice>") == (grid[0] * grid[1] if grid else 0), (w, h)
        assert text.count("\n") == (grid[0] - 1 if grid else 0), (w, h)


def _png(w: int, h: int, body: bytes | None = None) -> bytes:
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    raw = body if body is not None else zlib.compress(b"".join(b"\0" + b"\x80" * (3 * w) for _ in range(h)))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")


def test_load_image_accepts_png_and_composites_alpha(tmp_path):
    from PIL import Image

    p = tmp_path / "a.png"
    Image.new("RGBA", (5, 4), (0, 0, 0, 0)).save(p)
    img = load_image(p)
    assert img.mode == "RGB" and img.size == (5, 4)
    assert np.asarray(img).min() == 255  # transparent → white, as the reference processor does
    q = tmp_path / "b.png"
    q.write_bytes(_png(7, 3))
    assert load_image(q).size == (7, 3)


@pytest.mark.parametrize("name,content,match", [
    ("missing.png", None, "no such image file"),
    ("empty.png", b"", r"empty \(0 bytes\)"),
    ("text.png", b"this is not an image at all\n" * 10, "not an image in a supported format"),
    ("trunc.png", "TRUNC", "truncated or corrupt"),
    ("huge.png", "HUGE", r"10000×10000 = 100000000 pixels, more than the limit .*nothing decoded"),
    ("bomb.png", "BOMB", "image is too large .*decompression bomb"),
    ("img.ppm", b"P6\n2 2\n255\n" + b"\x00" * 12, "image format PPM is not supported"),
])
def test_bad_images(tmp_path, name, content, match):
    p = tmp_path / name
    if content == "TRUNC":
        full = _png(64, 64, zlib.compress(np.random.default_rng(0).integers(0, 256, 64 * 193, dtype=np.uint8).tobytes()))
        p.write_bytes(full[: len(full) // 2])
    elif content == "HUGE":  # a valid header announcing 100 megapixels, and no pixel data to speak of
        p.write_bytes(_png(10000, 10000, zlib.compress(b"\0" * 16)))
    elif content == "BOMB":  # 10 gigapixels: Pillow's own guard refuses it while parsing the header
        p.write_bytes(_png(100000, 100000, zlib.compress(b"\0" * 16)))
    elif content is not None:
        p.write_bytes(content)
    with pytest.raises(VisionInputError, match=match):
        load_image(p)


def test_pixel_limit_is_configurable(tmp_path):
    p = tmp_path / "b.png"
    p.write_bytes(_png(40, 30))
    with pytest.raises(VisionInputError, match="1200 pixels, more than the limit of 1000"):
        load_image(p, max_pixels=1000)


# --- end to end through the bindings (slow) -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def thw(tmp_path_factory):
    """A checkpoint whose M-RoPE rotates t, h and w, converted: text F32, mmproj F32."""
    from ggufbridge.fixtures.checkpoint import load_reference, make_minicpmv47

    ck = make_minicpmv47(tmp_path_factory.mktemp("thw-ck"), SPEC_THW)
    res = convert(ck, tmp_path_factory.mktemp("thw-out"), outtype="f32", mmproj_outtype="f32", progress=False)
    return ck, res, load_reference(ck)


def _session(res, **kw):
    from ggufbridge.vision.bindings import VisionSession

    return VisionSession(res.path("target"), res.path("mmproj"), n_ctx=1024, **kw)


IMAGES = [(130, 250), (300, 300), (112, 112)]  # 2×1 slices (row newline), 3×3 slices, unsliced


@pytest.mark.slow
def test_prompt_layout_and_positions_match_transformers(thw):
    ck, res, ref = thw
    imgs = [random_image(w, h, seed=i) for i, (w, h) in enumerate(IMAGES)]
    proc = hf_processor(ck)
    text = "<|im_start|>user\n<unk>\n<unk>\n<unk>\nWhat differs?<|im_end|>\n<|im_start|>assistant\n"
    want = proc(images=imgs, text=[text], return_tensors="pt")
    with _session(res) as s:
        crops = [s.prepare_image(im, strict=True)[0] for im in imgs]
        from ggufbridge.vision.bindings import chat_parts

        pr = s.build_prompt(chat_parts(crops, "What differs?"))
    assert pr.ids == want["input_ids"][0].tolist()
    assert [int(v) for v in pr.visual] == want["mm_token_type_ids"][0].tolist()
    pos, delta = ref.model.get_rope_index(want["input_ids"], mm_token_type_ids=want["mm_token_type_ids"],
                                          target_sizes=want["target_sizes"])
    np.testing.assert_array_equal(pr.positions, pos[:, 0].numpy())
    assert pr.next_pos == int(delta[0, 0]) + len(pr.ids)


@pytest.fixture(scope="module")
def e2e(thw):
    """Logits of one multi-image prompt: transformers, the bindings path, and the bindings path with 1-D
    positions (the ablation: what the stock runtime's positions would do with the same embeddings)."""
    from ggufbridge.vision.bindings import chat_parts

    ck, res, ref = thw
    imgs = [random_image(w, h, seed=i) for i, (w, h) in enumerate(IMAGES)]
    with _session(res) as s:
        crops = [s.prepare_image(im, strict=True)[0] for im in imgs]
        pr = s.build_prompt(chat_parts(crops, "Describe both pictures, then compare them."))
        n = len(pr.ids)
        ours = s.eval_prompt(pr, logits_for=range(n))
        flat = dataclasses.replace(pr, positions=np.tile(np.arange(n), (3, 1)), next_pos=n)
        ours_1d = s.eval_prompt(flat, logits_for=range(n))
        steps = s.schedule(pr)
        s.schedule = lambda prompt, start_max=None: _in_order(prompt)
        naive = s.eval_prompt(pr, logits_for=range(n))
    return {"ref": hf_logits(ref, pr, crops), "ours": ours, "1d": ours_1d, "naive": naive, "prompt": pr,
            "steps": steps}


def _in_order(prompt):
    """Ablation of the decode schedule: every token causal, in sequence order (the runtime then masks cached
    thumbnail tokens whose canvas cell lies after a slice token's)."""
    from ggufbridge.vision.bindings import _pinned

    pinned, steps = _pinned(prompt), []
    for i, p in enumerate(pinned):
        kind = "embd" if p else "tok"
        if steps and steps[-1][0] == kind:
            steps[-1][2].append(i)
        else:
            steps.append((kind, True, [i]))
    return steps


@pytest.mark.slow
def test_e2e_logits_match_transformers(e2e):
    k = kl_rows(e2e["ref"], e2e["ours"])
    assert k.mean() < 1e-3, k.mean()
    # the text after the images is where the positions matter most
    tail = ~np.array(e2e["prompt"].visual)
    tail[: int(np.flatnonzero(e2e["prompt"].visual)[-1])] = False
    assert k[tail].mean() < 1e-3
    assert (e2e["ref"][tail].argmax(1) == e2e["ours"][tail].argmax(1)).all()
    # the schedule really exercised both decode modes (solo non-causal steps for slice tokens)
    assert any(not causal for _, causal, _ in e2e["steps"]) and any(causal for _, causal, _ in e2e["steps"])


@pytest.mark.slow
def test_e2e_1d_positions_are_measurably_wrong(e2e):
    """The same embeddings decoded with plain 1-D positions diverge from transformers: the parity above is
    due to the canvas positions, and the KL measure can fail."""
    tail = ~np.array(e2e["prompt"].visual)
    tail[: int(np.flatnonzero(e2e["prompt"].visual)[-1])] = False
    good = kl_rows(e2e["ref"], e2e["ours"])[tail].mean()
    bad = kl_rows(e2e["ref"], e2e["1d"])[tail].mean()
    assert bad > 1e-3 and bad > 20 * good, (good, bad)


@pytest.mark.slow
def test_e2e_in_order_causal_decode_is_measurably_wrong(e2e):
    good = kl_rows(e2e["ref"], e2e["ours"]).mean()
    bad = kl_rows(e2e["ref"], e2e["naive"]).mean()
    assert bad > 3 * good, (good, bad)


@pytest.mark.slow
def test_e2e_4x(make_ckpt, tmp_path):
    from ggufbridge.fixtures.checkpoint import load_reference

    ck = make_ckpt("tiny4x")
    # F32 mmproj: with F16 embeddings one visual token of this random MoE flips an expert choice (KL ≈ 0.1 there)
    res = convert(ck, tmp_path / "o", outtype="f32", mmproj_outtype="f32", progress=False)
    img = random_image(230, 170, seed=3)
    with _session(res) as s:
        crops, _ = s.prepare_image(img, strict=True)
        pr = s.build_prompt(["<|im_start|>user\n", crops, "\nWhat is this?<|im_end|>\n<|im_start|>assistant\n"])
        ours = s.eval_prompt(pr, logits_for=range(len(pr.ids)))
    assert kl_rows(hf_logits(load_reference(ck), pr, [crops]), ours).mean() < 1e-3


@pytest.mark.slow
def test_run_image_answers_and_rejects_bad_input(thw, tmp_path):
    from ggufbridge.vision import run_image

    _, res, _ = thw
    p = tmp_path / "i.png"
    random_image(250, 130).save(p)
    out = run_image(res.out_dir, p, "What is in the picture?", n_predict=4)
    assert isinstance(out, str)
    (tmp_path / "bad.png").write_bytes(b"")
    with pytest.raises(VisionInputError, match="empty"):
        run_image(res.out_dir, tmp_path / "bad.png", "x")
    with pytest.raises(VisionModelError, match="no manifest.json"):
        run_image(tmp_path, p, "x")


def test_crop_adjustment_for_the_runtime_preprocessor():
    """Crop sizes the runtime would resize again are moved to the nearest size it takes unchanged (or refused
    with strict); sizes it takes unchanged are left alone."""
    from ggufbridge.vision.bindings import MmprojInfo, fit_plan, passes_unchanged

    info16 = MmprojInfo(None, 448, 14, 4, 64)
    assert passes_unchanged((448, 448), info16) and passes_unchanged((392, 504), info16)
    assert not passes_unchanged((392, 392), info16)  # squashed to 448² by the runtime
    assert not passes_unchanged((784, 280), info16)  # area > 448²: refitted to 728×280 by the runtime
    assert passes_unchanged((392, 560), info16)  # area > 448², but the runtime's refit lands on itself
    plan = plan_slices((900, 1900), SliceConfig(448, 14, 4))
    assert not passes_unchanged(plan.source, info16)
    fitted, notes = fit_plan(plan, info16, strict=False)
    for hw in fitted.crop_sizes():
        assert passes_unchanged(hw, info16)
    assert fitted.grid == plan.grid and fitted.slice == plan.slice
    assert notes == ["thumbnail 336×672 → 280×560"]
    with pytest.raises(VisionModelError, match="thumbnail 336×672 would be resized again"):
        fit_plan(plan, info16, strict=True)
    assert fit_plan(plan_slices((1000, 1300), SliceConfig(448, 14, 4)), info16, strict=True)[1] == []

"""Image prompts: bad inputs, and the patched runtime (libmtmd's slicing, layout and canvas M-RoPE, batched
prefill) against transformers' processor, get_rope_index and logits, through the bindings."""

from __future__ import annotations

import dataclasses
import struct
import zlib

import numpy as np
import pytest

from _vision_helpers import SPEC_THW, flat_prompt, hf_processor, kl_rows, random_image
from ggufbridge.convert import convert
from ggufbridge.errors import VisionInputError
from ggufbridge.vision.preprocess import load_image

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
    ("bomb.png", "BOMB", "image is too large, more than the limit .*decompression bomb"),
    ("img.ppm", b"P6\n2 2\n255\n" + b"\x00" * 12, "image format PPM is not supported"),
])
def test_bad_images(tmp_path, name, content, match):
    p = tmp_path / name
    if content == "TRUNC":
        pixels = np.random.default_rng(0).integers(0, 256, 64 * 193, dtype=np.uint8).tobytes()
        full = _png(64, 64, zlib.compress(pixels))
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


# --- the patched runtime's layout, positions and logits, through the bindings (slow) ------------------------------

SIZES = [(112, 112), (250, 130), (130, 250), (300, 300), (640, 200), (90, 60), (1000, 700), (113, 500)]
IMAGES = [(130, 250), (300, 300), (112, 112)]  # 2×1 slices (row newline), 3×3 slices, unsliced


@pytest.fixture(scope="module")
def thw(tmp_path_factory):
    """A checkpoint whose M-RoPE rotates t, h and w, converted: text F32, mmproj F32 (16x), and a 4x mmproj."""
    from ggufbridge.testkit.checkpoint import load_reference, make_minicpmv47

    ck = make_minicpmv47(tmp_path_factory.mktemp("thw-ck"), SPEC_THW, vocab="small")  # not about the vocabulary
    res = convert(ck, tmp_path_factory.mktemp("thw-out"), outtype="f32", mmproj_outtype="f32", progress=False)
    res4 = convert(ck, tmp_path_factory.mktemp("thw-out4"), outtype="f32", mmproj_outtype="f32", downsample="4x",
                   progress=False)
    return ck, res, res4, load_reference(ck)


def _session(res, **kw):
    from ggufbridge.testkit.bindings import VisionSession

    return VisionSession(res.path("target"), res.path("mmproj"), n_ctx=2048, **kw)


def _chat(placeholder: str, n_images: int, question: str) -> str:
    """ChatML user turn, images first (each followed by a newline), as both sides see it."""
    return ("<|im_start|>user\n" + (placeholder + "\n") * n_images + question
            + "<|im_end|>\n<|im_start|>assistant\n")


def _hf_layout(ck, ref, imgs, question, downsample=None):
    """transformers' processor output and get_rope_index positions [3, n] for the chat."""
    proc = hf_processor(ck, downsample)
    want = proc(images=imgs, text=[_chat("<unk>", len(imgs), question)], return_tensors="pt")
    kw = {"downsample_mode": downsample} if downsample else {}
    rope, _ = ref.model.get_rope_index(want["input_ids"], mm_token_type_ids=want["mm_token_type_ids"],
                                       target_sizes=want["target_sizes"], **kw)
    return want, rope[:, 0].numpy()


def _hf(ck, ref, imgs, question, downsample=None):
    import torch

    want, rope = _hf_layout(ck, ref, imgs, question, downsample)
    kw = {"downsample_mode": downsample} if downsample else {}
    with torch.no_grad():
        logits = ref(input_ids=want["input_ids"], pixel_values=want["pixel_values"], target_sizes=want["target_sizes"],
                     mm_token_type_ids=want["mm_token_type_ids"], **kw).logits[0].float().numpy()
    return want, rope, logits


def _check_layout(chunks, want, rope):
    ids, pos = flat_prompt(chunks)
    hf_ids = want["input_ids"][0].tolist()
    assert len(ids) == len(hf_ids)
    assert [a for a in ids if a >= 0] == [b for a, b in zip(ids, hf_ids) if a >= 0]  # the text around images
    assert all(a == b for a, b in zip(ids, hf_ids) if a >= 0)
    np.testing.assert_array_equal(pos, rope)  # canvas M-RoPE of markers, thumbnails and slices


@pytest.mark.slow
@pytest.mark.parametrize("downsample", [None, "4x"])
def test_layout_and_positions_match_transformers(thw, downsample):
    """libmtmd (patched) lays out every image as the processor does — slicing, <image_id>, markers, rows, and the
    newline after an image absorbed into its frame — with get_rope_index's canvas positions, over 8 sizes."""
    ck, res, res4, ref = thw
    with _session(res4 if downsample else res) as s:
        for k, (w, h) in enumerate(SIZES):
            imgs = [random_image(w, h, seed=k)]
            want, rope = _hf_layout(ck, ref, imgs, "What is it?", downsample)
            _check_layout(s.chunks(_chat(s.marker, 1, "What is it?"), imgs, encode=False), want, rope)


@pytest.fixture(scope="module")
def e2e(thw):
    """One multi-image prompt: transformers' logits, and the patched runtime's at batch 512 and token by token."""
    ck, res, _, ref = thw
    imgs = [random_image(w, h, seed=i) for i, (w, h) in enumerate(IMAGES)]
    question = "Describe both pictures, then compare them."
    want, rope, hf_logits = _hf(ck, ref, imgs, question)
    with _session(res) as s:
        chunks = s.chunks(_chat(s.marker, len(imgs), question), imgs)
        batched = s.eval(chunks)
        single = s.eval(chunks, batch=1)
        oned = s.eval(_one_d(chunks))
    return {"want": want, "rope": rope, "ref": hf_logits, "chunks": chunks, "batched": batched, "single": single,
            "1d": oned, "visual": want["mm_token_type_ids"][0].numpy().astype(bool)}


def _one_d(chunks):
    """The ablation: the same chunks with every image token at a plain 1-D position, as a stock runtime places
    them (each token one step, the chunk advancing by its token count)."""
    out, t = [], 0
    for c in chunks:
        if c.kind == "image":
            c = dataclasses.replace(c, pos=np.tile(t + np.arange(c.n_tokens), (4, 1)), n_pos=c.n_tokens)
        out.append(c)
        t += c.n_pos if c.kind == "image" else c.n_tokens
    return out


def _tail(visual):
    tail = ~visual
    tail[: int(np.flatnonzero(visual)[-1])] = False
    return tail


@pytest.mark.slow
def test_e2e_logits_match_transformers(e2e):
    _check_layout(e2e["chunks"], e2e["want"], e2e["rope"])
    k = kl_rows(e2e["ref"], e2e["batched"].logits)
    assert k.mean() < 1e-3, k.mean()
    tail = _tail(e2e["visual"])  # the text after the images: where positions matter most
    assert k[tail].mean() < 1e-3
    assert (e2e["ref"][tail].argmax(1) == e2e["batched"].logits[tail].argmax(1)).all()


@pytest.mark.slow
def test_batched_prefill_is_exact(e2e):
    """The patched mask lets tokens of equal t attend in decode order, so one batch equals token-by-token decoding
    (where every token sees exactly the cache before it), also for slices after a stretched thumbnail."""
    b, s1 = e2e["batched"], e2e["single"]
    assert b.n_decode_calls == len(e2e["chunks"]) and s1.n_decode_calls == len(s1.logits)  # one call per chunk
    assert kl_rows(s1.logits, b.logits).max() < 1e-6


@pytest.mark.slow
def test_mask_change_is_a_no_op_in_raster_order(thw):
    """Where decode order equals (y, x) order (an unsliced frame: <image>, the thumbnail row by row, </image>), the
    old (y, x) rule and the decode-order rule hide the same cells; the batched result equals token by token and
    transformers there too."""
    ck, res, _, ref = thw
    imgs = [random_image(112, 112, seed=7)]
    want, rope, hf_logits = _hf(ck, ref, imgs, "What is it?")
    with _session(res) as s:
        chunks = s.chunks(_chat(s.marker, 1, "What is it?"), imgs)
        img = next(c for c in chunks if c.kind == "image")
        order = list(zip(img.pos[1].tolist(), img.pos[2].tolist()))
        assert order[:-1] == sorted(order[:-1])  # raster order up to the newline absorbed at the frame's origin
        b, one = s.eval(chunks), s.eval(chunks, batch=1)
    assert kl_rows(one.logits, b.logits).max() < 1e-6
    assert kl_rows(hf_logits, b.logits).mean() < 1e-3


@pytest.mark.slow
def test_e2e_1d_positions_are_measurably_wrong(e2e):
    """Ablation: the same embeddings at plain 1-D positions (what a stock runtime does) move the tail."""
    tail = _tail(e2e["visual"])
    good = kl_rows(e2e["ref"], e2e["batched"].logits)[tail].mean()
    bad = kl_rows(e2e["ref"], e2e["1d"].logits)[tail].mean()
    assert bad > 10 * good and bad > 1e-3, (good, bad)

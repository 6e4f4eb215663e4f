"""Shared helpers for the video tests: clips with known content (PyAV), and transformers' MiniCPM-V video
processor as the reference."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np


def make_clip(path: Path, n_frames: int, fps: Fraction | int, w: int = 64, h: int = 48, codec: str = "mpeg4",
              seed: int = 0, options: dict | None = None) -> Path:
    """An encoded clip whose frame k carries k in its colours (red = 37k mod 256, green = k mod 256) over a
    random texture, so that a wrong frame index shows up in the pixels."""
    import av

    rng = np.random.default_rng(seed)
    tex = rng.integers(0, 64, (h, w, 3), dtype=np.uint8)
    with av.open(str(path), "w", options=options or {}) as c:
        st = c.add_stream(codec, rate=fps)
        st.width, st.height, st.pix_fmt = w, h, "yuv420p"
        for k in range(n_frames):
            a = tex.copy()
            a[:, :, 0] += np.uint8((k * 37) % 192)
            a[:, :, 1] += np.uint8(k % 192)
            for pkt in st.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                c.mux(pkt)
        for pkt in st.encode():
            c.mux(pkt)
    return path


def _torch_resize(video, size, resample=None, antialias=True, **_):
    """torchvision v2's resize of a uint8 CPU tensor (bicubic, antialias: float interpolate, round, clamp), for the
    processor's `resize`: torchvision has no wheel for this torch+cpu build, and transformers' video processor
    resizes (and normalises) through it. Everything else in the reference is transformers' own code."""
    import torch

    out = torch.nn.functional.interpolate(video.reshape(-1, *video.shape[-3:]).float(), size=(size.height, size.width),
                                          mode="bicubic", antialias=antialias, align_corners=False)
    out = out.round_().clamp_(0, 255).to(video.dtype)
    return out.reshape(*video.shape[:-2], size.height, size.width)


def hf_video_processor(ckpt: Path, downsample: str | None = None, **overrides):
    """transformers' MiniCPMV4_6VideoProcessor with the checkpoint's processing settings (resize: `_torch_resize`)."""
    from transformers.models.minicpmv4_6.video_processing_minicpmv4_6 import MiniCPMV4_6VideoProcessor

    class VideoProcessor(MiniCPMV4_6VideoProcessor):
        def resize(self, video, size, resample=None, **kw):
            return _torch_resize(video, size, resample, **kw)

        def normalize(self, image, mean, std, inplace=False, **kw):  # torchvision's normalize: (x - mean) / std
            import torch

            m = torch.as_tensor(mean, dtype=image.dtype).view(-1, 1, 1)
            return (image - m) / torch.as_tensor(std, dtype=image.dtype).view(-1, 1, 1)

        def fetch_videos(self, url, sample_indices_fn=None):  # transformers' PyAV reader (torchcodec: not here)
            from transformers.video_utils import load_video

            if isinstance(url, list):
                return list(zip(*[self.fetch_videos(x, sample_indices_fn) for x in url]))
            return load_video(url, backend="pyav", sample_indices_fn=sample_indices_fn)

    cfg = json.loads((Path(ckpt) / "preprocessor_config.json").read_text())
    keep = ("image_mean", "image_std", "rescale_factor", "scale_resolution", "max_slice_nums", "patch_size",
            "slice_mode", "downsample_mode", "use_image_id")
    kw = {k: cfg[k] for k in keep if k in cfg}
    if downsample:
        kw["downsample_mode"] = downsample
    kw.update(overrides)
    return VideoProcessor(**kw)


def hf_processor_with_video(ckpt: Path, downsample: str | None = None):
    """transformers' MiniCPM-V 4.7 processor with the real video processor (PIL image processor beside it)."""
    from ggufbridge.testkit.vision import hf_processor

    return hf_processor(ckpt, downsample, video_processor=hf_video_processor(ckpt, downsample))

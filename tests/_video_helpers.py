"""Shared helpers for the video tests: clips with known content (PyAV), and transformers' MiniCPM-V video
processor as the reference (ggufbridge.testkit.vision.hf_video_processor: torchvision's CPU resize, exactly)."""

from __future__ import annotations

from pathlib import Path


from ggufbridge.testkit.vision import hf_processor, hf_video_processor, make_clip  # noqa: F401  (the tests' names)


def hf_processor_with_video(ckpt: Path, downsample: str | None = None):
    """transformers' MiniCPM-V 4.7 processor with the real video processor (PIL image processor beside it)."""
    return hf_processor(ckpt, downsample, video_processor=hf_video_processor(ckpt, downsample))

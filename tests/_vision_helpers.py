"""Shared helpers for the vision tests: transformers as the reference (processor, features, logits)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ggufbridge.fixtures.checkpoint import TinySpec

# A spec whose M-RoPE rotates all three axes (t, h, w): the "tiny" spec's sections [1, 1, 0] never use w.
SPEC_THW = TinySpec(head_dim=24, mrope_section=(1, 1, 1))


def random_image(w: int, h: int, seed: int = 0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def hf_processor(ckpt: Path, downsample: str | None = None):
    """transformers' MiniCPM-V 4.7 processor with the PIL image processor (torchvision is not installed, and
    the video processor it would also load needs it)."""
    from transformers import AutoTokenizer
    from transformers.models.minicpmv4_6.image_processing_pil_minicpmv4_6 import MiniCPMV4_6ImageProcessorPil
    from transformers.models.minicpmv4_7.processing_minicpmv4_7 import MiniCPMV4_7Processor

    cfg = json.loads((Path(ckpt) / "preprocessor_config.json").read_text())
    cfg = {k: v for k, v in cfg.items() if k not in ("image_processor_type", "processor_class")}
    if downsample:
        cfg["downsample_mode"] = downsample
    ip = MiniCPMV4_6ImageProcessorPil(**cfg)

    class Processor(MiniCPMV4_7Processor):
        def check_argument_for_proper_class(self, name, arg):  # the PIL stand-in for the video processor
            return arg

    proc = Processor(image_processor=ip, video_processor=ip, tokenizer=AutoTokenizer.from_pretrained(str(ckpt)))
    proc.video_token, proc.video_token_id = "<no-video>", -1  # the fixture tokenizer names <unk> for both
    return proc


def hf_crop_features(ref, pixel_values, target_sizes, downsample: str | None = None) -> list[np.ndarray]:
    """transformers' get_image_features, one crop at a time."""
    import torch

    out, off = [], 0
    for h, w in target_sizes.tolist():
        n = h * w
        with torch.no_grad():
            f = ref.get_image_features(pixel_values[:, :, :, off * 14:(off + n) * 14], torch.tensor([[h, w]]),
                                       downsample_mode=downsample)
        out.append(torch.cat(list(f.pooler_output)).float().numpy())
        off += n
    return out


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def kl_rows(ref_logits: np.ndarray, test_logits: np.ndarray) -> np.ndarray:
    """KL(reference ‖ test) per row."""
    lr, lt = log_softmax(ref_logits.astype(np.float64)), log_softmax(test_logits.astype(np.float64))
    return (np.exp(lr) * (lr - lt)).sum(-1)

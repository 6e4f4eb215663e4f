"""Vision inputs for the synthetic model: a checkpoint shape whose M-RoPE uses every axis, random test images, and
transformers' MiniCPM-V 4.7 processor as the reference side of image chats (benchmarks/served_vision_table.py and the
vision tests)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ggufbridge.testkit.checkpoint import TinySpec

# A spec whose M-RoPE rotates all three axes (t, h, w): the "tiny" spec's sections [1, 1, 0] never use w.
SPEC_THW = TinySpec(head_dim=24, mrope_section=(1, 1, 1))


def random_image(w: int, h: int, seed: int = 0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def hf_processor(ckpt: Path, downsample: str | None = None, video_processor=None):
    """transformers' MiniCPM-V 4.7 processor with the PIL image processor (torchvision is not installed, and
    the video processor it would also load needs it). With `video_processor`, that one serves videos and images
    are switched off instead: the fixture tokenizer names <unk> for both placeholders."""
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

    proc = Processor(image_processor=ip, video_processor=video_processor or ip,
                     tokenizer=AutoTokenizer.from_pretrained(str(ckpt)))
    if video_processor is None:
        proc.video_token, proc.video_token_id = "<no-video>", -1
    else:
        proc.image_token, proc.image_token_id = "<no-image>", -1
    return proc


def png_of_size(width: int, height: int, *, truncate: bool = False) -> bytes:
    """A valid grayscale PNG of any size, compressed row by row (a 20000x20000 one is ~400 KB: the image bomb of
    the hostile-input cases); `truncate`: cut in the middle of its data, without an end chunk."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    z = zlib.compressobj(6)
    row = b"\0" * (width + 1)
    data = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    if truncate:
        data = data[: len(data) // 2]
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", data)
    return png if truncate else png + chunk(b"IEND", b"")

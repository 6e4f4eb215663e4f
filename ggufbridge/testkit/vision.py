"""Vision inputs for the synthetic model: a checkpoint shape whose M-RoPE uses every axis, random test images, and
transformers' MiniCPM-V 4.7 processors as the reference side of image and video chats: the PIL image processor
(OpenBMB's original), the torchvision one (transformers' default when torchvision is installed) and the video
processor (torchvision only), the last two with torchvision's CPU resize restated as the torch call it is
(benchmarks/served_vision_table.py and the vision tests; docs/vision.md, "The references")."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np

from ggufbridge.testkit.checkpoint import TinySpec

# A spec whose M-RoPE rotates all three axes (t, h, w): the "tiny" spec's sections [1, 1, 0] never use w.
SPEC_THW = TinySpec(head_dim=24, mrope_section=(1, 1, 1))


def random_image(w: int, h: int, seed: int = 0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def torch_cpu_resize(images, size, resample=None, antialias: bool = True, **_):
    """torchvision's bicubic resize (MiniCPM-V's processors' `resample`) of a uint8 tensor on the CPU, exactly:
    `transforms.v2.functional.resize_image` hands a uint8 tensor to torch's own uint8 kernel for bicubic
    (`_do_native_uint8_resize_on_cpu`), i.e. `torch.nn.functional.interpolate` on the uint8 tensor itself (int16
    weights, horizontal pass first). This is that call, for transformers' torchvision-backed processors' `resize`;
    torchvision has no wheel for this torch+cpu build. (On a GPU torchvision interpolates in float and rounds:
    not what a CPU user gets.)"""
    import torch

    shape = images.shape
    if (size.height, size.width) == tuple(shape[-2:]):
        return images
    flat = images.reshape(-1, *shape[-3:])
    out = torch.nn.functional.interpolate(flat, size=(size.height, size.width), mode="bicubic",
                                          antialias=antialias, align_corners=False)
    return out.reshape(*shape[:-2], size.height, size.width)


def _torch_normalize(image, mean, std):
    """torchvision's normalize: (x - mean) / std per channel (transformers fuses the 1/255 rescale into both)."""
    import torch

    m = torch.as_tensor(mean, dtype=image.dtype).view(-1, 1, 1)
    return (image - m) / torch.as_tensor(std, dtype=image.dtype).view(-1, 1, 1)


def _processor_kwargs(ckpt: Path, downsample: str | None, keep: tuple[str, ...] | None = None) -> dict:
    cfg = json.loads((Path(ckpt) / "preprocessor_config.json").read_text())
    cfg = {k: v for k, v in cfg.items() if k not in ("image_processor_type", "processor_class")
           and (keep is None or k in keep)}
    if downsample:
        cfg["downsample_mode"] = downsample
    return cfg


def hf_image_processor(ckpt: Path, downsample: str | None = None, backend: str = "pil"):
    """transformers' MiniCPM-V 4.6/4.7 image processor: "pil" (MiniCPMV4_6ImageProcessorPil, OpenBMB's original
    processing) or "torchvision" (MiniCPMV4_6ImageProcessor, what `AutoImageProcessor` picks when torchvision is
    installed) with torchvision's CPU resize and normalize restated (torch_cpu_resize; everything else is
    transformers' own code)."""
    if backend == "pil":
        from transformers.models.minicpmv4_6.image_processing_pil_minicpmv4_6 import MiniCPMV4_6ImageProcessorPil

        return MiniCPMV4_6ImageProcessorPil(**_processor_kwargs(ckpt, downsample))
    if backend != "torchvision":
        raise ValueError(f"image processor backend must be 'pil' or 'torchvision', not {backend!r}")
    from transformers.models.minicpmv4_6.image_processing_minicpmv4_6 import MiniCPMV4_6ImageProcessor

    class ImageProcessor(MiniCPMV4_6ImageProcessor):
        def resize(self, image, size, resample=None, antialias=True, **kw):
            return torch_cpu_resize(image, size, resample, antialias)

        def normalize(self, image, mean, std, inplace=False, **kw):
            return _torch_normalize(image, mean, std)

    return ImageProcessor(**_processor_kwargs(ckpt, downsample))


VIDEO_SETTINGS = ("image_mean", "image_std", "rescale_factor", "scale_resolution", "max_slice_nums", "patch_size",
                  "slice_mode", "downsample_mode", "use_image_id")


def hf_video_processor(ckpt: Path, downsample: str | None = None, **overrides):
    """transformers' MiniCPMV4_6VideoProcessor (it exists only torchvision-backed) with the checkpoint's settings,
    as transformers runs it on the CPU: resize = torch_cpu_resize, torchvision's normalize, transformers' own PyAV
    reader (its torchcodec default is not installed here); every other step is transformers' code."""
    from transformers.models.minicpmv4_6.video_processing_minicpmv4_6 import MiniCPMV4_6VideoProcessor

    class VideoProcessor(MiniCPMV4_6VideoProcessor):
        def resize(self, video, size, resample=None, antialias=True, **kw):
            return torch_cpu_resize(video, size, resample, antialias)

        def normalize(self, image, mean, std, inplace=False, **kw):
            return _torch_normalize(image, mean, std)

        def fetch_videos(self, url, sample_indices_fn=None):
            from transformers.video_utils import load_video

            if isinstance(url, list):
                return list(zip(*[self.fetch_videos(x, sample_indices_fn) for x in url]))
            return load_video(url, backend="pyav", sample_indices_fn=sample_indices_fn)

    kw = _processor_kwargs(ckpt, downsample, VIDEO_SETTINGS)
    kw.update(overrides)
    return VideoProcessor(**kw)


def hf_processor(ckpt: Path, downsample: str | None = None, video_processor=None, image_backend: str = "pil"):
    """transformers' MiniCPM-V 4.7 processor with the image processor of `image_backend` (hf_image_processor).
    With `video_processor`, that one serves videos and images are switched off instead: the fixture tokenizer
    names <unk> for both placeholders."""
    from transformers import AutoTokenizer
    from transformers.models.minicpmv4_7.processing_minicpmv4_7 import MiniCPMV4_7Processor

    ip = hf_image_processor(ckpt, downsample, image_backend)

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


def make_clip(path: Path, n_frames: int, fps: Fraction | int, w: int = 64, h: int = 48, codec: str = "mpeg4",
              seed: int = 0, options: dict | None = None, pix_fmt: str = "yuv420p") -> Path:
    """An encoded clip whose frame k carries k in its colours (red = 37k mod 256, green = k mod 256) over a
    random texture, so that a wrong frame index shows up in the pixels."""
    import av

    rng = np.random.default_rng(seed)
    tex = rng.integers(0, 64, (h, w, 3), dtype=np.uint8)
    with av.open(str(path), "w", options=options or {}) as c:
        st = c.add_stream(codec, rate=fps)
        st.width, st.height, st.pix_fmt = w, h, pix_fmt
        for k in range(n_frames):
            a = tex.copy()
            a[:, :, 0] += np.uint8((k * 37) % 192)
            a[:, :, 1] += np.uint8(k % 192)
            for pkt in st.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                c.mux(pkt)
        for pkt in st.encode():
            c.mux(pkt)
    return path


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

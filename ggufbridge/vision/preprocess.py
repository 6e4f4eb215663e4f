"""Safe image loading: bounded size, clear errors, transparency on white (as MiniCPM-V's processor does).

Slicing and everything after it happen in the (patched) runtime, exactly as MiniCPM-V 4.7's processor does them.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path


from ggufbridge.errors import VisionInputError

# Decoded RGB pixels we accept by default (64 MP ≈ 192 MiB of RGB) and the longest side: checked from the header,
# before decoding. The server path has the same bound (patch mtmd-helper-image-size-before-decode,
# MTMD_HELPER_MAX_IMAGE_PIXELS / _SIDE).
MAX_PIXELS = 64 * 1024 * 1024
MAX_SIDE = 16384
FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF")


def check_image(path: str | os.PathLike, max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """The checks of `load_image` that need only the header (exists, format, size): cheap enough to run on every
    input before anything else starts. Returns (width, height)."""
    img = _open_checked(Path(path), max_pixels)
    img.close()
    return img.size


def load_image(path: str | os.PathLike, max_pixels: int = MAX_PIXELS):
    """Open an image file as PIL RGB with bounded memory: the size is read from the header and checked before
    any pixel is decoded. Transparent images are composited on white (as the reference processor does)."""
    p = Path(path)
    return _decoded(_open_checked(p, max_pixels), p)


def load_image_bytes(data: bytes, label: str, max_pixels: int = MAX_PIXELS):
    """`load_image` for an image handed over as bytes (llama-server's media reader, vision/ffshim.py); `label`
    names it in messages ("image (N bytes)")."""
    import io

    return _decoded(_open_header(io.BytesIO(data), label, max_pixels), label)


def image_signature(head: bytes) -> str | None:
    """The image format a file's first bytes announce (None: not one of FORMATS by its signature)."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if head.startswith(b"BM"):
        return "BMP"
    if head[:4] in (b"II*\0", b"MM\0*"):
        return "TIFF"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    return None


def _decoded(img, label):
    from PIL import Image

    try:
        try:
            img.load()
        except Image.DecompressionBombError as e:
            raise VisionInputError(f"{label}: refused by Pillow's decompression-bomb guard ({e})") from None
        except (OSError, ValueError, SyntaxError) as e:
            raise VisionInputError(f"{label}: the image data is truncated or corrupt ({e})") from None
        return to_rgb(img)
    finally:
        img.close()


def _open_checked(p: Path, max_pixels: int):
    """The image file opened lazily (header parsed, nothing decoded) and checked; closed again on any error."""
    if not p.is_file():
        raise VisionInputError(f"{p}: no such image file")
    if p.stat().st_size == 0:
        raise VisionInputError(f"{p}: the image file is empty (0 bytes)")
    return _open_header(p, p, max_pixels)


def _open_header(src, label, max_pixels: int):
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():  # our own pixel limit below decides; Pillow's warning would be noise
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(src)  # lazy: parses the header only
    except Image.DecompressionBombError as e:  # Pillow's own guard, at twice its limit: far past ours
        raise VisionInputError(f"{label}: image is too large, more than the limit of {max_pixels} pixels "
                               f"(checked from the header, nothing decoded: {e})") from None
    except UnidentifiedImageError:
        raise VisionInputError(f"{label}: not an image in a supported format "
                               f"(expected one of {', '.join(FORMATS)})") from None
    except (OSError, ValueError) as e:
        raise VisionInputError(f"{label}: cannot read the image ({e})") from None
    try:
        if img.format not in FORMATS:
            raise VisionInputError(f"{label}: image format {img.format} is not supported "
                                   f"(expected one of {', '.join(FORMATS)})")
        w, h = img.size
        if w <= 0 or h <= 0:
            raise VisionInputError(f"{label}: image has zero size ({w}×{h})")
        # two bounds, each named when it is the one passed: a 1×20000 strip has few pixels but too long a side
        if max(w, h) > MAX_SIDE:
            side = "width" if w >= h else "height"
            raise VisionInputError(f"{label}: image is {w}×{h}: its {side} of {max(w, h)} pixels is more than the "
                                   f"limit of {MAX_SIDE} per side (checked from the header, nothing decoded)")
        if w * h > max_pixels:
            raise VisionInputError(f"{label}: image is {w}×{h} = {w * h} pixels, more than the limit of {max_pixels} "
                                   f"(checked from the header, nothing decoded)")
    except BaseException:
        img.close()
        raise
    return img


def to_rgb(img):
    from PIL import Image

    if img.mode == "RGB":
        return img.copy()
    rgba = img.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")

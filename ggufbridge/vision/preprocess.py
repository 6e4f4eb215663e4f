"""MiniCPM-V 4.7 image preprocessing: safe loading, the llava-uhd slice plan, and the crops it produces.

The slice plan follows the MiniCPM-V 4.6/4.7 image processor (which 4.7 reuses): a thumbnail ("source") resized
so that its area is about `scale_resolution²`, plus — when the image is larger than one slice — a `rows × cols`
grid of slices cut from a second resize. Every side is a multiple of `patch · merge` so the token grid is whole.
Normalisation is left to the runtime (it reads mean/std from the mmproj); this module yields uint8 RGB crops.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ggufbridge.errors import VisionInputError

# Decoded RGB pixels we accept by default (64 MP ≈ 192 MiB of RGB): checked from the header, before decoding.
MAX_PIXELS = 64 * 1024 * 1024
FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF")


@dataclass(frozen=True)
class SliceConfig:
    """What the processor needs (from the checkpoint's preprocessor_config.json or the mmproj)."""

    slice_size: int = 448  # scale_resolution
    patch: int = 14
    merge: int = 4  # LLM-token merge per side: 4 in "16x" mode, 2 in "4x"
    max_slice_nums: int = 9

    @property
    def align(self) -> int:
        return self.patch * self.merge


@dataclass(frozen=True)
class SlicePlan:
    """Sizes are (height, width) in pixels. `grid` is (rows, cols), or None for an unsliced image."""

    source: tuple[int, int]
    grid: tuple[int, int] | None = None
    refine: tuple[int, int] | None = None

    @property
    def slice(self) -> tuple[int, int] | None:
        if self.grid is None:
            return None
        return self.refine[0] // self.grid[0], self.refine[1] // self.grid[1]

    def crop_sizes(self) -> list[tuple[int, int]]:
        """(height, width) of every crop, thumbnail first, then the slices row by row."""
        out = [self.source]
        if self.grid is not None:
            out += [self.slice] * (self.grid[0] * self.grid[1])
        return out


@dataclass
class ImageCrops:
    plan: SlicePlan
    crops: list[np.ndarray] = field(repr=False)  # uint8 [h, w, 3], thumbnail first

    def token_grids(self, cfg: SliceConfig) -> list[tuple[int, int]]:
        """LLM-token grid (rows, cols) of every crop."""
        return [(h // cfg.align, w // cfg.align) for h, w in self.plan.crop_sizes()]


def _round_to(length: float, unit: int) -> int:
    # Python's round (half to even) on purpose: the reference processor uses it.
    return max(round(length / unit) * unit, unit)


def fit_area(hw: tuple[float, float], cfg: SliceConfig, upscale: bool) -> tuple[int, int]:
    """Scale (h, w) to an area of about slice_size² keeping the aspect (only shrinking unless `upscale`), then
    align both sides to patch·merge."""
    h, w = hw
    if h * w > cfg.slice_size ** 2 or upscale:
        aspect = w / h
        h = int(cfg.slice_size / math.sqrt(aspect))
        w = int(h * aspect)
    return _round_to(h, cfg.align), _round_to(w, cfg.align)


def best_grid(hw: tuple[int, int], cfg: SliceConfig) -> tuple[int, int] | None:
    """(rows, cols) of the slice grid, or None when the image fits one slice. Among 1-off slice counts around
    area/slice², the grid whose aspect (log cols/rows) is closest to the image's wins; ties favour more rows."""
    h, w = hw
    want = min(math.ceil(h * w / cfg.slice_size ** 2), cfg.max_slice_nums)
    if want <= 1:
        return None
    log_aspect = math.log(w / h)
    best, best_err = (1, 1), math.inf
    for n in (want - 1, want, want + 1):
        if n == 1 or n > cfg.max_slice_nums:
            continue
        for rows in range(1, n + 1):
            if n % rows:
                continue
            err = abs(log_aspect - math.log((n // rows) / rows))
            if err < best_err or (err == best_err and rows > best[0]):
                best, best_err = (rows, n // rows), err
    return best


def plan_slices(hw: tuple[int, int], cfg: SliceConfig, slice_mode: bool = True) -> SlicePlan:
    grid = best_grid(hw, cfg) if slice_mode else None
    source = fit_area(hw, cfg, upscale=grid is None)
    if grid is None:
        return SlicePlan(source)
    rows, cols = grid
    ref_h, ref_w = _round_to(hw[0], rows), _round_to(hw[1], cols)
    cell_h, cell_w = fit_area((ref_h / rows, ref_w / cols), cfg, upscale=True)
    return SlicePlan(source, grid, (cell_h * rows, cell_w * cols))


def _resize(img, hw: tuple[int, int]) -> np.ndarray:
    from PIL import Image

    h, w = hw
    if img.size == (w, h):
        return np.asarray(img, dtype=np.uint8)
    return np.asarray(img.resize((w, h), Image.Resampling.BICUBIC), dtype=np.uint8)


def make_crops(img, cfg: SliceConfig, slice_mode: bool = True, plan: SlicePlan | None = None) -> ImageCrops:
    """The thumbnail and slices of a PIL RGB image, as uint8 arrays (`plan` overrides the computed plan)."""
    w, h = img.size
    plan = plan or plan_slices((h, w), cfg, slice_mode)
    crops = [_resize(img, plan.source)]
    if plan.grid is not None:
        refined = _resize(img, plan.refine)
        sh, sw = plan.slice
        for r in range(plan.grid[0]):
            for c in range(plan.grid[1]):
                crops.append(np.ascontiguousarray(refined[r * sh:(r + 1) * sh, c * sw:(c + 1) * sw]))
    return ImageCrops(plan, crops)


def load_image(path: str | os.PathLike, max_pixels: int = MAX_PIXELS):
    """Open an image file as PIL RGB with bounded memory: the size is read from the header and checked before
    any pixel is decoded. Transparent images are composited on white (as the reference processor does)."""
    from PIL import Image, UnidentifiedImageError

    p = Path(path)
    if not p.is_file():
        raise VisionInputError(f"{p}: no such image file")
    if p.stat().st_size == 0:
        raise VisionInputError(f"{p}: the image file is empty (0 bytes)")
    try:
        with warnings.catch_warnings():  # our own pixel limit below decides; Pillow's warning would be noise
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(p)  # lazy: parses the header only
    except Image.DecompressionBombError as e:
        raise VisionInputError(f"{p}: image is too large ({e})") from None
    except UnidentifiedImageError:
        raise VisionInputError(f"{p}: not an image in a supported format (expected one of {', '.join(FORMATS)})") from None
    except (OSError, ValueError) as e:
        raise VisionInputError(f"{p}: cannot read the image ({e})") from None
    try:
        if img.format not in FORMATS:
            raise VisionInputError(f"{p}: image format {img.format} is not supported (expected one of {', '.join(FORMATS)})")
        w, h = img.size
        if w <= 0 or h <= 0:
            raise VisionInputError(f"{p}: image has zero size ({w}×{h})")
        if w * h > max_pixels:
            raise VisionInputError(f"{p}: image is {w}×{h} = {w * h} pixels, more than the limit of {max_pixels} "
                                   f"(checked from the header, nothing decoded)")
        try:
            img.load()
        except Image.DecompressionBombError as e:
            raise VisionInputError(f"{p}: refused by Pillow's decompression-bomb guard ({e})") from None
        except (OSError, ValueError, SyntaxError) as e:
            raise VisionInputError(f"{p}: the image data is truncated or corrupt ({e})") from None
        return to_rgb(img)
    finally:
        img.close()


def to_rgb(img):
    from PIL import Image

    if img.mode == "RGB":
        return img.copy()
    rgba = img.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")

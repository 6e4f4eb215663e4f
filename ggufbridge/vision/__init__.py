"""Image input for MiniCPM-V 4.7 GGUFs: preprocessing, canvas M-RoPE positions, and the bindings decode path."""

from __future__ import annotations


def run_image(out_dir, image, prompt: str, **kw) -> str:
    """See ggufbridge.vision.bindings.run_image (imported lazily: it loads llama-cpp-python)."""
    from ggufbridge.vision.bindings import run_image as _run

    return _run(out_dir, image, prompt, **kw)


__all__ = ["run_image"]

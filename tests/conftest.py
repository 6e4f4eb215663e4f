"""Shared pytest fixtures: synthetic MiniCPM-V 4.7 checkpoints, built once per session under tmp_path.

Nothing here writes outside pytest's temporary directories except the tokenizer cache of
`ggufbridge.testkit.vocab` (under ${GGUFBRIDGE_CACHE:-~/.cache/ggufbridge}/fixtures/, built once per machine).
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def make_ckpt(tmp_path_factory):
    """Factory: `make_ckpt(spec_name, **make_minicpmv47_kwargs) -> Path`, cached by its arguments per session.

    Callers must treat the folder as read-only (it is shared); copy it to tmp_path before corrupting it.
    """
    import inspect

    from ggufbridge.testkit.checkpoint import make_minicpmv47

    signature = inspect.signature(make_minicpmv47)
    cache = {}

    def make(spec_name: str = "tiny", **kw):
        bound = signature.bind("-", spec_name, **kw)
        bound.apply_defaults()  # make_ckpt("tiny") and make_ckpt("tiny", dtype="float32") share one folder
        args = {k: v for k, v in bound.arguments.items() if k not in ("out_dir", "spec")}
        key = (spec_name, tuple(sorted(args.items())))
        if key not in cache:
            label = "-".join([spec_name] + [f"{k}={v}" for k, v in sorted(kw.items())])
            cache[key] = make_minicpmv47(tmp_path_factory.mktemp(label.replace("/", "_")), spec_name, **kw)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_ckpt(make_ckpt):
    """The "tiny" spec, float32, real Qwen3.5 vocabulary (~130 MB, a few seconds)."""
    return make_ckpt("tiny")


@pytest.fixture(scope="session")
def tiny_ckpt_bf16(make_ckpt):
    """The "tiny" spec in bfloat16 (same seed, so its weights are tiny_ckpt's rounded to bf16)."""
    return make_ckpt("tiny", dtype="bfloat16")


@pytest.fixture(scope="session")
def confident_ckpt(tiny_ckpt, tmp_path_factory):
    """tiny_ckpt with its head refitted to continue _synthetic.confident.TEXT decisively."""
    from _synthetic.confident import make_confident

    return make_confident(tiny_ckpt, tmp_path_factory.mktemp("confident"))


@pytest.fixture(scope="session")
def ksafe_bf16(make_ckpt, tmp_path_factory):
    """(checkpoint, BF16 target GGUF) of the K-quant-compatible synthetic model (every row a multiple of 256),
    converted once for test_quant and test_quant_fit (both only read it: their outputs go to tmp_path)."""
    from ggufbridge.convert import convert

    ckpt = make_ckpt("ksafe", dtype="bfloat16", vocab="small")
    res = convert(ckpt, tmp_path_factory.mktemp("ksafe-bf16"), outtype="bf16", mmproj=False, progress=False)
    return ckpt, res.path("target")

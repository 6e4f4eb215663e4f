"""Converted tiny models for the serve / run / bench tests, built once per session.

Everything comes from the real pipeline: the synthetic MiniCPM-V 4.7 checkpoint fixture (small vocabulary),
the synthetic DSpark drafter fixture for it, and `ggufbridge.convert.convert`, which writes the target, the
mmproj and (when asked) the draft GGUF plus manifest.json. The drafter's weights are random: drafting must
never change greedy output whatever the draft proposes, so it is a fair probe of the serving path, not a
fidelity test.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ggufbridge.runtime import server as sv

_CACHE: dict = {}


def converted(make_ckpt, tmp_path_factory, *, with_draft: bool = True, spec: str = "tiny") -> Path:
    """OUT_DIR of `convert` for the fixture `spec` (F32 target, small vocabulary), with a draft when asked."""
    key = (spec, with_draft)
    if key not in _CACHE:
        from ggufbridge.convert import convert
        from ggufbridge.testkit.dspark import make_dspark

        ckpt = make_ckpt(spec, vocab="small")
        root = tmp_path_factory.mktemp(f"served-{spec}-{'draft' if with_draft else 'plain'}")
        draft = make_dspark(root / "dspark-ckpt", ckpt, "tiny") if with_draft else None
        convert(ckpt, root / "out", outtype="f32", draft=draft, progress=False)
        _CACHE[key] = root / "out"
    return _CACHE[key]


def serve_process(out_dir: Path, console: Path, *args: str, timeout: float = 300.0,
                  env: dict | None = None) -> sv.Server:
    """`python -m ggufbridge serve OUT_DIR --port P ARGS` (the user's command) on a free port, waited for until
    /health answers; its own output goes to `console`. `.stop()` sends SIGTERM to its process group."""
    port = sv.free_port()
    argv = [sys.executable, "-m", "ggufbridge", "serve", str(out_dir), "--port", str(port), *args]
    srv = sv.Server(argv, "127.0.0.1", port, console, env=env).start()
    srv.wait_ready(timeout)
    return srv


def needs_perf_patch(name: str):
    """A skip mark for the test of a patch of the performance part (ggufbridge/runtime/native/llama.cpp-perf/), which
    CPU builds leave out by default (docs/patches.md): the test runs where the runtime carries the patch (a CUDA
    build, or `ggufbridge build-runtime --perf` on a CPU) and says why it does not elsewhere."""
    import pytest

    from ggufbridge.errors import RuntimeNotFound
    from ggufbridge.runtime import locate as loc

    try:
        carried = any(name in p for p in loc.locate().patches)
    except RuntimeNotFound:
        carried = False
    return pytest.mark.skipif(not carried, reason=f"the runtime does not carry performance patch {name} (CPU builds "
                                                  f"apply the core part only; `ggufbridge build-runtime --perf`)")

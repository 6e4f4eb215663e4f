"""Running converted folders with the pinned llama.cpp: what `serve`, `run` and `bench` call, callable from Python.

    from ggufbridge.runtime import serve, run_once, bench
    run_once("OUT", "Describe this", images=["photo.jpg"])      # -> the answer's text
    bench("OUT", prompt_lengths=[1024], draft=True)            # -> the result bench.json holds
    serve("OUT", recipe="spark", say=print)                     # blocks until SIGINT/SIGTERM

They are imported on first use, so that importing one runtime module does not load them all.
"""

from __future__ import annotations

import importlib

_API = {"serve": "ggufbridge.runtime.serving", "run_once": "ggufbridge.runtime.oneshot",
        "bench": "ggufbridge.runtime.benchmark"}
__all__ = sorted(_API)


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

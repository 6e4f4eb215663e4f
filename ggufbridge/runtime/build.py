"""`ggufbridge build-runtime`: the patched llama.cpp runtime built by the script that ships with the package
(native/build_runtime.sh, the one scripts/setup.sh runs too), for this package's patch series (patches.py), into
the cache where `locate` finds it, with the llama_cpp bindings of an interpreter bound to it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from ggufbridge.errors import RuntimeNotFound

SCRIPT = Path(__file__).resolve().parent / "native" / "build_runtime.sh"


def command_line(cuda: bool = False, cuda_arch: str | None = None, perf: bool | None = None,
                 python: str | None = None) -> list[str]:
    """The build script's command line. `python` (default: this interpreter) gets llama_cpp's Python package bound
    to the built libraries; "" skips that."""
    bash = shutil.which("bash")
    if bash is None:
        raise RuntimeNotFound("building the runtime needs bash (and cmake, a C++ compiler, git)")
    args = [bash, str(SCRIPT)]
    if cuda:
        args.append("--cuda")
    if cuda_arch:
        args += ["--cuda-arch", cuda_arch]
    if perf is not None:
        args.append("--perf" if perf else "--no-perf")
    python = sys.executable if python is None else python
    if python:
        args += ["--python", python]
    return args


def build_runtime(cuda: bool = False, cuda_arch: str | None = None, perf: bool | None = None,
                  python: str | None = None) -> None:
    """Run the build (its progress lines go straight to the terminal: it takes minutes, a CUDA build longer).
    Raises RuntimeNotFound when it fails; the script's own last lines say why."""
    missing = [t for t in ("cmake", "git") if shutil.which(t) is None]
    if missing:
        raise RuntimeNotFound(f"building the runtime needs {' and '.join(missing)} on PATH (and a C++ compiler)")
    env = dict(os.environ)
    env.setdefault("GGUFBRIDGE_PYTHON", sys.executable)  # the interpreter that runs patches.py for the script
    res = subprocess.run(command_line(cuda, cuda_arch, perf, python), env=env)
    if res.returncode != 0:
        raise RuntimeNotFound(f"the runtime build failed (exit {res.returncode}; its messages above say where)")

"""Commands that load models in-process import the bindings (libllama, the ggml backends) before numpy: on the
H200 image a CLI process with numpy imported first died at its first GPU model load (ggufbridge/cli/__init__.py
BINDINGS_FIRST says why). CI has no GPU, so what is checked here is the order itself, in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

ORDER = r"""
import builtins, json, sys
seen = []
_imp = builtins.__import__
def hook(name, *a, **k):
    top = name.split(".")[0]
    if top in ("numpy", "llama_cpp") and top not in seen and top not in sys.modules:
        seen.append(top)
    return _imp(name, *a, **k)
builtins.__import__ = hook
from ggufbridge.cli import cli
cli.get_command(None, sys.argv[1])
print(json.dumps(seen))
"""


def _first_imports(command: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", ORDER, command], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("command", ["quantize", "compare", "dump-logits", "imatrix", "demo"])
def test_model_loading_commands_import_the_bindings_before_numpy(command):
    seen = _first_imports(command)
    assert seen and seen[0] == "llama_cpp", seen


def test_doctor_leaves_the_bindings_to_its_child_interpreter():
    # doctor must report a broken runtime, not die importing it
    assert "llama_cpp" not in _first_imports("doctor")

"""The package as a user installs it: a wheel built from this checkout, installed into a fresh virtual environment
outside it, run from a folder that is not the checkout.

The wheel must carry the runtime's build (native/build_runtime.sh, build_ui.sh) and both parts of the patch series,
so that the installed copy computes the same series hashes as the checkout and so finds the runtime the checkout
built (the cache folder is keyed by them), and `ggufbridge build-runtime` runs the same script. The venv sees the
test environment's packages (a .pth file: torch and the llama_cpp bindings are not installed again), but
ggufbridge itself must come from the wheel.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ggufbridge.runtime import locate as loc
from ggufbridge.runtime import patches

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv python, the venv's ggufbridge command, a working folder outside the checkout)."""
    tmp = tmp_path_factory.mktemp("install")
    wheels = tmp / "wheels"
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    (wheel,) = wheels.glob("ggufbridge-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    # this environment's packages (torch, gguf, the llama_cpp bindings) as plain path entries after the venv's own:
    # not its .pth files, so the checkout's editable ggufbridge stays out
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "_test_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    res = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    work = tmp / "elsewhere"
    work.mkdir()
    return wheel, py, venv / "bin" / "ggufbridge", work


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LLAMA_CPP_BIN", "VIRTUAL_ENV")}
    return env


def test_the_wheel_carries_the_series_and_its_build(installed):
    wheel, *_ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    for rel in ("native/build_runtime.sh", "native/build_ui.sh", "patches.py", "llama_cpp.pin"):
        assert f"ggufbridge/runtime/{rel}" in names, rel
    for p in patches.all_patches():
        assert f"ggufbridge/runtime/native/{patches.part_of(p)}/{p.path.name}" in names, p.path.name
    assert not any("not-applied" in n for n in names)  # what left the series stays out of the package


def test_the_installed_copy_has_the_checkouts_series_hashes(installed):
    _, py, _, work = installed
    code = ("import ggufbridge, ggufbridge.runtime.patches as p; print(ggufbridge.__file__); "
            "print(p.series_hash(p.build_series('cpu')), p.series_hash(p.build_series('cuda')))")
    res = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=work, env=_env(), check=True)
    where, hashes = res.stdout.splitlines()
    assert Path(where).is_relative_to(py.parent.parent), where  # the wheel's copy, not the checkout's
    assert hashes.split() == [patches.series_hash(patches.build_series(v)) for v in ("cpu", "cuda")]


def test_doctor_from_the_installed_copy_finds_the_checkouts_runtime(installed):
    """The runtime built for this series (scripts/setup.sh) is the installed copy's too: doctor finds it in the
    cache by the hash, and the package's build script sees it built (no second build)."""
    _, py, ggufbridge_cmd, work = installed
    rt = loc.locate()  # this checkout's runtime (the suite runs on one)
    if not rt.source.startswith("cache"):
        pytest.skip(f"the runtime in use is {rt.source}'s, not a cached build of this series")
    res = subprocess.run([str(ggufbridge_cmd), "doctor"], capture_output=True, text=True, cwd=work, env=_env())
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert f"runtime   {rt.bin_dir}  (found via cache" in res.stdout
    assert f"(hash {patches.series_hash()}, CPU builds)" in res.stdout
    res = subprocess.run([str(ggufbridge_cmd), "build-runtime", "--python", ""], capture_output=True, text=True,
                         cwd=work, env=_env(), timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    # build-runtime without flags is this machine's default series (CPU: the core part), whichever build the
    # checkout's bindings are bound to (after `build-runtime --perf` locate picks that one)
    from ggufbridge.files import cache_dir

    default = cache_dir() / f"llama.cpp-{loc.RUNTIME_VERSION}-cpu-p{patches.series_hash()}" / "build" / "bin"
    assert f"runtime ready in {default}" in res.stdout and "configuring" not in res.stdout


def test_doctor_from_the_installed_copy_without_a_runtime_names_the_command(installed, tmp_path):
    _, _, ggufbridge_cmd, work = installed
    env = _env() | {"GGUFBRIDGE_CACHE": str(tmp_path / "empty-cache")}
    res = subprocess.run([str(ggufbridge_cmd), "doctor"], capture_output=True, text=True, cwd=work, env=env)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "runtime   none" in res.stdout and "`ggufbridge build-runtime`" in res.stderr


def test_the_demo_runs_from_the_installed_copy(installed):
    """Issue 41's "installable": the installed command's demo, run outside the checkout, builds its folder there
    (target, mmproj and draft), drafts with its greedy output unchanged and ends with the serve command."""
    _, _, ggufbridge_cmd, work = installed
    if not loc.locate().source.startswith("cache"):
        pytest.skip("the runtime in use is not a cached build of this series, which the installed copy looks for")
    res = subprocess.run([str(ggufbridge_cmd), "demo"], capture_output=True, text=True, cwd=work, env=_env(),
                         timeout=1800)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert (work / "ggufbridge-demo" / "model" / "manifest.json").is_file()
    assert "output equal to target-only" in res.stdout, res.stdout[-3000:]
    assert "serve ggufbridge-demo/model --draft" in res.stdout

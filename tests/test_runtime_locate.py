"""Runtime discovery and `ggufbridge doctor`: the real cached build, and fake bin dirs that lack things."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufbridge.cli import cli
from ggufbridge.errors import RuntimeNotFound
from ggufbridge.runtime import locate as loc
from ggufbridge.runtime.patches import series_hash


def _exe(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def fake_bin(tmp_path: Path, *, tools=("llama-server",), help_text="--spec-type none,draft-simple,draft-dflash",
             llama_strings=("qwen35moe",), mtmd_strings=None, commit="deadbee") -> Path:
    """A bin dir with a shell-script llama-server and string-table stand-ins for the shared libraries."""
    b = tmp_path / "fakebin"
    b.mkdir()
    for t in tools:
        if t == "llama-server":
            _exe(b / t, f'case "$1" in\n --version) echo "version: 9.9.9 (build 7, commit {commit})"'
                        f' >&2 ;;\n --help) echo "{help_text}" ;;\nesac\n')
        else:
            _exe(b / t, "exit 0\n")
    if llama_strings is not None:
        (b / "libllama.so").write_bytes(b"\x7fELF\0" + b"\0".join(s.encode() for s in llama_strings) + b"\0")
    if mtmd_strings is not None:
        (b / "libmtmd.so").write_bytes(b"\x7fELF\0" + b"\0".join(s.encode() for s in mtmd_strings) + b"\0")
    return b


def _problems(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("problem:")]


# ------------------------------------------------------------------ the real runtime built by build_runtime.sh


@pytest.fixture(scope="module")
def real_runtime() -> loc.Runtime:
    return loc.locate()


def test_real_runtime_is_the_pinned_build(real_runtime):
    results = {r.name: r for r in loc.check(real_runtime)}
    bad = [f"{r.name}: {r.detail}" for r in results.values() if not r.ok]
    assert not bad, bad
    # runtime.json is written by scripts/build_runtime.sh from its own pinned commit: an independent record
    assert loc.PINNED_COMMIT.startswith(real_runtime.commit)
    assert real_runtime.info["commit"].startswith(real_runtime.commit)
    assert set(real_runtime.info["backends"]) <= set(real_runtime.backends)


def test_real_runtime_page_as_recorded(real_runtime):
    """The page read from the server library agrees with runtime.json's record of what build_runtime.sh embedded
    (the hash of the page's sources, or "none" when npm was missing)."""
    recorded = real_runtime.info.get("ui", "none")
    assert real_runtime.lib(loc.SERVER_LIB) is not None  # a shared build: the page is looked for there
    assert real_runtime.has_page == (recorded != "none"), recorded


def _python_with_bindings() -> str:
    venv = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def test_doctor_on_real_runtime():
    py = _python_with_bindings()
    res = CliRunner().invoke(cli, ["doctor", "--python", py])
    out = res.stdout
    for cap in loc.CAPABILITIES:
        assert f"ok       {cap.name}" in out, out
    assert "commit 0c1e570" in out
    bindings = loc.probe_bindings(py)
    if bindings.error is None and not bindings.outside(loc.locate()):
        assert res.exit_code == 0, res.stderr
        assert "all checks passed" in out
        # the bindings must map the runtime's own libllama, not a copy compiled by pip
        assert any(Path(p).name.startswith("libllama") for p in bindings.libs)
    else:  # an interpreter without the bound bindings: exactly that is reported
        assert res.exit_code == 2
        assert [p for p in _problems(res) if "bindings" not in p] == []


# ------------------------------------------------------------------ fake bin dirs


def test_doctor_refuses_a_bin_dir_that_lacks_things(tmp_path):
    b = fake_bin(tmp_path, tools=("llama-server", "llama-cli"))
    res = CliRunner().invoke(cli, ["doctor", "--llama-bin", str(b), "--python", sys.executable])
    assert res.exit_code == 2
    problems = _problems(res)
    text = "\n".join(problems)
    # one line per problem, each naming the missing piece and a fix
    for missing in ("tool llama-mtmd-cli", "tool llama-quantize", "tool ggml-rpc-server", "arch dflash",
                    "spec-type draft-dspark", "projector minicpmv4_6"):
        assert any(p.startswith(f"problem: {missing}") for p in problems), (missing, text)
    assert all("build_runtime.sh" in p for p in problems if "bindings" not in p)
    # what the fake does have is not reported
    for present in ("tool llama-server", "tool llama-cli", "arch qwen35moe", "llama-server --version"):
        assert not any(p.startswith(f"problem: {present}") for p in problems), (present, text)
    assert "commit deadbee" in res.stdout and "(ggufbridge pins 0c1e57098)" in res.stdout


def test_diagnose_from_python_is_what_doctor_prints(tmp_path):
    """`runtime.doctor.diagnose` is the command's whole report: its lines and problems are what doctor prints."""
    from ggufbridge.runtime.doctor import diagnose

    b = fake_bin(tmp_path, tools=("llama-server", "llama-cli"))
    report = diagnose(str(b), sys.executable)
    assert any(p.startswith("tool llama-quantize") for p in report.problems)
    res = CliRunner().invoke(cli, ["doctor", "--llama-bin", str(b), "--python", sys.executable])
    # the machine line's available memory is read again by the command, a moment later
    def steady(lines):
        return [re.sub(r"\([\d.]+ GiB available\)", "(… GiB available)", x) for x in lines]

    assert steady(res.stdout.splitlines()) == steady([text for text, err in report.lines if not err])
    assert _problems(res) == [f"problem: {p}" for p in report.problems]


def test_doctor_says_whether_the_page_is_there(tmp_path):
    b = fake_bin(tmp_path)
    res = CliRunner().invoke(cli, ["doctor", "--llama-bin", str(b), "--python", sys.executable])
    assert "warning: page: this llama-server has no chat page (API only)" in res.stderr and "npm" in res.stderr
    (b / "libllama-server-impl.so").write_bytes(b"\x7fELF\0" + loc.PAGE_MARKER.encode() + b"\0")
    res = CliRunner().invoke(cli, ["doctor", "--llama-bin", str(b), "--python", sys.executable])
    assert "page      llama-server's chat page: yes" in res.stdout and "chat page" not in res.stderr


def test_capabilities_found_when_present(tmp_path):
    b = fake_bin(tmp_path, help_text="--spec-type none,draft-dflash,draft-dspark,ngram-simple",
                 llama_strings=("qwen35moe", "dflash"), mtmd_strings=("minicpmv4_6",))
    rt = loc.locate(b)
    results = {r.name: r.ok for r in loc.check(rt)}
    assert all(results[c.name] for c in loc.CAPABILITIES), results


@pytest.mark.parametrize("strings, needle, expected", [
    (("qwen35moe",), "qwen35moe", True),
    (("qwen35moe",), "qwen35", False),       # a prefix of another name is not the name
    (("xqwen35moe",), "qwen35moe", False),   # nor a suffix
    (("dflash", "minicpmv4_6"), "minicpmv4_6", True),
    (("minicpmv4_5",), "minicpmv4_6", False),
])
def test_c_string_is_matched_whole(tmp_path, strings, needle, expected):
    f = tmp_path / "lib.so"
    f.write_bytes(b"\0" + b"\0".join(s.encode() for s in strings) + b"\0")
    assert loc.has_c_string(f, needle) is expected


def test_help_word_is_matched_whole(tmp_path):
    # "draft-dspark2" must not satisfy "draft-dspark"
    b = fake_bin(tmp_path, help_text="--spec-type none,draft-dspark2")
    results = {r.name: r.ok for r in loc.check(loc.locate(b))}
    assert results["spec-type draft-dspark"] is False


def test_non_executable_and_broken_server(tmp_path):
    b = fake_bin(tmp_path)
    (b / "llama-server").chmod(0o644)
    results = {r.name: r for r in loc.check(loc.locate(b))}
    assert not results["tool llama-server"].ok
    assert "missing" in results["tool llama-server"].detail

    b2 = tmp_path / "broken"
    b2.mkdir()
    _exe(b2 / "llama-server",
         'echo "llama-server: error while loading shared libraries: libllama.so.0" >&2\nexit 127\n')
    res = CliRunner().invoke(cli, ["doctor", "--llama-bin", str(b2), "--python", sys.executable])
    assert res.exit_code == 2
    assert any(p.startswith("problem: llama-server --version") and "shared libraries" in p for p in _problems(res))


# ------------------------------------------------------------------ search order


def _cached(cache: Path, variant: str, patch_hash: str | None = None) -> Path:
    """A build folder as build_runtime.sh names it: keyed by the hash of the patches a build of `variant` applies."""
    from ggufbridge.runtime.patches import build_series

    prefix = cache / f"llama.cpp-{loc.RUNTIME_VERSION}-{variant}-p{patch_hash or series_hash(build_series(variant))}"
    (prefix / "build" / "bin").mkdir(parents=True)
    (prefix / "runtime.json").write_text(json.dumps({"version": loc.RUNTIME_VERSION, "commit": loc.PINNED_COMMIT,
                                                     "variant": variant, "backends": ["cpu", variant],
                                                     "bin": str(prefix / "build" / "bin")}))
    return prefix / "build" / "bin"


def test_search_order(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("GGUFBRIDGE_CACHE", str(cache))
    monkeypatch.delenv("LLAMA_CPP_BIN", raising=False)
    with pytest.raises(RuntimeNotFound, match="no cached build .*llama.cpp-0.3.36-cuda-p[0-9a-f]{12}/runtime.json"):
        loc.locate()
    _cached(cache, "cuda", patch_hash="0123456789ab")  # a build of another patch series is not this checkout's
    with pytest.raises(RuntimeNotFound, match="no cached build"):
        loc.locate()
    cpu = _cached(cache, "cpu")
    assert loc.locate().bin_dir == cpu
    cuda = _cached(cache, "cuda")
    rt = loc.locate()
    assert rt.bin_dir == cuda and rt.source == "cache (cuda)"  # cuda preferred when both exist
    assert rt.info["variant"] == "cuda"
    own = fake_bin(tmp_path)
    monkeypatch.setenv("LLAMA_CPP_BIN", str(own))
    assert loc.locate().bin_dir == own.resolve() and loc.locate().source == "LLAMA_CPP_BIN"
    other = tmp_path / "other"
    other.mkdir()
    assert loc.locate(other).source == "--llama-bin"  # the explicit option beats the environment
    with pytest.raises(RuntimeNotFound, match="is not a directory"):
        loc.locate(tmp_path / "nope")


def test_the_build_the_bindings_are_bound_to_comes_first(tmp_path, monkeypatch):
    """`build-runtime --perf` on a CPU binds the bindings to the core + performance build while the core build
    stays cached: the tools must then be the same build as the bindings, not the first in the default order."""
    from ggufbridge.runtime.patches import build_series

    cache = tmp_path / "cache"
    monkeypatch.setenv("GGUFBRIDGE_CACHE", str(cache))
    monkeypatch.delenv("LLAMA_CPP_BIN", raising=False)
    core = _cached(cache, "cpu")
    perf = _cached(cache, "cpu", patch_hash=series_hash(build_series("cpu", True)))
    monkeypatch.setattr(loc, "bindings_bin_dir", lambda: perf)
    assert loc.locate().bin_dir == perf
    monkeypatch.setattr(loc, "bindings_bin_dir", lambda: core)
    assert loc.locate().bin_dir == core
    monkeypatch.setattr(loc, "bindings_bin_dir", lambda: tmp_path)  # bound elsewhere: the documented order
    assert loc.locate().bin_dir == core


def test_bindings_bin_dir_is_where_the_bindings_load_libllama_from():
    """Read from the llama_cpp/lib links without importing the bindings: the same folder a child interpreter that
    imports them maps libllama from."""
    import subprocess
    import sys

    bound = loc.bindings_bin_dir()
    if bound is None:
        pytest.skip("the bindings are not bound by build_runtime.sh here")
    out = subprocess.run([sys.executable, "-c", "import llama_cpp, os; print(sorted({os.path.dirname(l.split()[-1]) "
                          "for l in open('/proc/self/maps') if 'libllama.so' in l}))"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str([str(bound)])


def test_doctor_without_any_runtime(tmp_path, monkeypatch):
    monkeypatch.setenv("GGUFBRIDGE_CACHE", str(tmp_path / "empty"))
    monkeypatch.delenv("LLAMA_CPP_BIN", raising=False)
    res = CliRunner().invoke(cli, ["doctor"])
    assert res.exit_code == 2
    assert "runtime   none: no llama.cpp runtime" in res.stdout and "Traceback" not in res.output
    # the one command that builds it, and the series it would build (its hash is the cache key)
    assert "problem: runtime: no llama.cpp build" in res.stderr and "`ggufbridge build-runtime`" in res.stderr
    assert f"(hash {series_hash()}, CPU builds)" in res.stdout


def test_a_cpu_build_with_the_performance_part_is_found_too(tmp_path, monkeypatch):
    """build_runtime.sh --perf on a CPU (or --no-perf with --cuda) keys its folder by that choice's hash; locate
    looks for it after the variant's default."""
    from ggufbridge.runtime.patches import build_series

    monkeypatch.setenv("GGUFBRIDGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LLAMA_CPP_BIN", raising=False)
    perf = _cached(tmp_path / "cache", "cpu", patch_hash=series_hash(build_series("cpu", perf=True)))
    assert loc.locate().bin_dir == perf
    core = _cached(tmp_path / "cache", "cpu")
    assert loc.locate().bin_dir == core  # the default first


def test_launch_env_puts_the_runtime_libs_first(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/somewhere/else")
    rt = loc.locate(fake_bin(tmp_path))
    assert rt.env()["LD_LIBRARY_PATH"].split(os.pathsep) == [str(rt.bin_dir), "/somewhere/else"]


def test_installed_prefix_layout(tmp_path):
    """`cmake --install` puts the tools in PREFIX/bin and the libraries in PREFIX/lib."""
    b = fake_bin(tmp_path, help_text="--spec-type draft-dspark", llama_strings=None)
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libllama.so").write_bytes(b"\0qwen35moe\0dflash\0")
    (lib / "libmtmd.so").write_bytes(b"\0minicpmv4_6\0")
    (lib / "libggml-cuda.so").write_bytes(b"\0")
    rt = loc.locate(b)
    results = {r.name: r.ok for r in loc.check(rt)}
    assert all(results[c.name] for c in loc.CAPABILITIES), results
    assert "cuda" in rt.backends
    assert rt.env()["LD_LIBRARY_PATH"].split(os.pathsep)[:2] == [str(rt.bin_dir), str(lib.resolve())]

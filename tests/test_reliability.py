"""Issue 15: what a fault-injection pass found. Termination signals, files left by killed runs, an output folder
that already holds a conversion, NaN/Inf weights, a full disk, and `verify` on what a folder really holds.

Each test is the reported case, run through the CLI where it is a user path: exit code 2 (or 128 + signal) and
one line, no traceback."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from _slow_convert import start_slow_convert

from ggufbridge.cli import cli
from ggufbridge.convert import convert


@pytest.fixture(scope="module")
def small_ckpt(make_ckpt):
    return make_ckpt("tiny", vocab="small", max_shard_size="200KB")  # float32


@pytest.fixture(scope="module")
def converted(small_ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("reliability") / "out"
    convert(small_ckpt, out, outtype="f32", progress=False)  # target + mmproj
    return out


def _invoke(*args) -> tuple[int, str]:
    res = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res.exit_code, res.output


def _one_error_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), text
    return lines[0]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _target(out: Path) -> Path:
    man = json.loads((out / "manifest.json").read_text())
    return out / next(f["path"] for f in man["files"] if f["role"] == "target")


# --- 2. signals and what killed runs leave ---------------------------------------------------------------------


def test_sigterm_takes_the_ctrl_c_cleanup_path(small_ckpt, tmp_path, monkeypatch):
    """SIGTERM mid-write used to end the process without any clean-up, leaving a `.NAME.gguf.<pid>.part`."""
    from ggufbridge.ggufio import writer

    real, calls = writer.encode, {"n": 0}

    def terminated_midway(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 20:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **kw)

    monkeypatch.setattr(writer, "encode", terminated_midway)
    out = tmp_path / "out"
    code, text = _invoke("convert", small_ckpt, "-o", out, "--no-progress")
    assert code == 128 + signal.SIGTERM
    assert "interrupted by SIGTERM" in _one_error_line(text)
    assert not out.exists() or list(out.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is the command's only


def test_sigterm_to_a_real_process_leaves_nothing(small_ckpt, tmp_path):
    out = tmp_path / "out"
    p = start_slow_convert(small_ckpt, out)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert "interrupted by SIGTERM" in err and "Traceback" not in err
    assert not out.exists() or list(out.iterdir()) == []


def test_sigkill_leftovers_are_removed_by_the_next_run(small_ckpt, tmp_path, caplog):
    """SIGKILL runs no handler: its `.part` file stays until the next run, which removes it and says so (the pid
    in the name is not running). A killed `--quant` leaves its intermediate under the same kind of name."""
    out = tmp_path / "out"
    p = start_slow_convert(small_ckpt, out)
    p.kill()
    p.communicate(timeout=60)
    left = [x for x in out.iterdir() if x.name.endswith(".part")]
    assert left
    intermediate = out / f".MiniCPM-V-4_7-1M-Q4_K_M.f16-intermediate.gguf.{_dead_pid()}.part"
    intermediate.write_bytes(b"GGUF" + b"\0" * 100)
    caplog.set_level("INFO")
    code, text = _invoke("convert", small_ckpt, "-o", out, "--no-progress", "--outtype", "f32")
    assert code == 0, text
    assert not [x.name for x in out.iterdir() if x.name.endswith(".part")]
    assert "no longer running" in caplog.text and intermediate.name in caplog.text
    code, text = _invoke("verify", out)
    assert code == 0 and "half-written" not in text, text


def test_a_commit_cut_by_sigkill_is_completed_by_the_next_run(converted, tmp_path):
    """Killed between the renames of the commit: the pending manifest and complete temporary files are there; the
    next run finishes the commit instead of leaving GGUFs that no manifest describes."""
    from ggufbridge.ggufio import generation

    pid = _dead_pid()
    out = tmp_path / "out"
    out.mkdir()
    man = json.loads((converted / "manifest.json").read_text())
    target, mmproj = (next(f["path"] for f in man["files"] if f["role"] == r) for r in ("target", "mmproj"))
    shutil.copy(converted / target, out / target)  # already renamed
    shutil.copy(converted / mmproj, out / f".{mmproj}.{pid}.part")  # not yet
    shutil.copy(converted / "manifest.json", out / f".manifest.json.{pid}.part")
    generation.recover(out)
    assert sorted(x.name for x in out.iterdir()) == sorted([target, mmproj, "manifest.json"])
    code, text = _invoke("verify", out)
    assert code == 0, text


# --- 3. an output folder that already holds a conversion ----------------------------------------------------------


def test_existing_conversion_is_refused_without_force(small_ckpt, converted, tmp_path):
    out = _copy(converted, tmp_path / "out")
    before = {x.name: x.stat().st_mtime_ns for x in out.iterdir()}
    code, text = _invoke("convert", small_ckpt, "-o", out, "--no-progress", "--outtype", "bf16")
    assert code == 2
    line = _one_error_line(text)
    assert "already holds a conversion" in line and "--force" in line
    assert {x.name: x.stat().st_mtime_ns for x in out.iterdir()} == before


def test_force_replaces_the_whole_generation(small_ckpt, converted, tmp_path):
    """Before: the new manifest and mmproj replaced the old ones and the old F32 target stayed, unlisted."""
    out = _copy(converted, tmp_path / "out")
    old_target = _target(out)
    code, text = _invoke("convert", small_ckpt, "-o", out, "--no-progress", "--outtype", "bf16", "--force")
    assert code == 0, text
    assert not old_target.exists()
    assert _target(out).name.endswith("-BF16.gguf")
    assert sorted(x.suffix for x in out.iterdir()) == [".gguf", ".gguf", ".json"]
    code, text = _invoke("verify", out)
    assert code == 0, text


def test_verify_reports_a_gguf_the_manifest_does_not_list(converted, tmp_path):
    out = _copy(converted, tmp_path / "out")
    shutil.copy(_target(out), out / "MiniCPM-V-4_7-1M-Q8_0.gguf")  # a stale file a user might pick by name
    code, text = _invoke("verify", out)
    assert code == 3, text  # verify's exit code for a difference it found (docs/usage.md)
    assert "unlisted" in text and "MiniCPM-V-4_7-1M-Q8_0.gguf" in text and "does not list" in text


# --- 5. NaN / Inf in the source ---------------------------------------------------------------------------------


def _poison(ckpt: Path, name_part: str) -> str:
    """Write one NaN and two Infs into the first float32 tensor whose name contains `name_part`."""
    for shard in sorted(ckpt.glob("*.safetensors")):
        raw = bytearray(shard.read_bytes())
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
        for name, info in header.items():
            if name != "__metadata__" and name_part in name and info["dtype"] == "F32":
                start = 8 + n + info["data_offsets"][0]
                raw[start:start + 12] = np.array([np.nan, np.inf, -np.inf], dtype="<f4").tobytes()
                shard.write_bytes(bytes(raw))
                return name
    raise AssertionError(f"no F32 tensor named like {name_part}")


@pytest.mark.parametrize("part", ["lm_head", "norm.weight"])
def test_nonfinite_weights_are_refused_then_allowed_with_a_warning(small_ckpt, tmp_path, part, caplog):
    ckpt = _copy(small_ckpt, tmp_path / "ckpt")
    _poison(ckpt, part)
    out = tmp_path / "out"
    code, text = _invoke("convert", ckpt, "-o", out, "--no-progress", "--no-mmproj")
    assert code == 2
    line = _one_error_line(text)
    assert "1 NaN and 2 Inf" in line and "--allow-nonfinite" in line, line
    assert not out.exists() or list(out.iterdir()) == []
    caplog.set_level("WARNING")
    code, text = _invoke("convert", ckpt, "-o", out, "--no-progress", "--no-mmproj", "--allow-nonfinite")
    assert code == 0, text
    assert "1 NaN and 2 Inf" in caplog.text and "written as they are" in caplog.text


def test_nonfinite_counts_per_storage_type():
    from ggufbridge.ggufio.writer import f32_to_bf16_bits, nonfinite_counts

    a = np.array([1.0, np.nan, np.inf, -np.inf, 0.0, np.nan], dtype=np.float32)
    assert nonfinite_counts(a, "F32") == (2, 2)
    assert nonfinite_counts(a.astype(np.float16), "F16") == (2, 2)
    assert nonfinite_counts(f32_to_bf16_bits(a), "BF16") == (2, 2)
    assert nonfinite_counts(np.array([3e38, -1.0], dtype=np.float32), "F32") == (0, 0)
    assert nonfinite_counts(np.array([1, 2], dtype=np.int64), "I64") == (0, 0)


# --- 6. disk full, and verify on a symlink to a device ----------------------------------------------------------


def test_disk_full_names_the_file(small_ckpt, tmp_path, monkeypatch):
    from ggufbridge.ggufio import writer

    real = writer._HashingFile.write

    def full(self, b):
        if self.n > 64 << 10:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as f.write raises it: no file name
        real(self, b)

    monkeypatch.setattr(writer._HashingFile, "write", full)
    out = tmp_path / "out"
    code, text = _invoke("convert", small_ckpt, "-o", out, "--no-progress", "--no-mmproj")
    assert code == 2
    line = _one_error_line(text)
    assert os.strerror(errno.ENOSPC) in line and "MiniCPM-V-4_7-" in line and ".gguf" in line, line
    assert not out.exists() or list(out.iterdir()) == []


def test_verify_calls_a_symlink_to_a_device_not_a_regular_file(converted, tmp_path):
    out = _copy(converted, tmp_path / "out")
    target = _target(out)
    target.unlink()
    target.symlink_to("/dev/null")
    code, text = _invoke("verify", out)
    assert code == 3
    line = next(x for x in text.splitlines() if target.name in x)
    assert "not a regular file" in line and "/dev/null" in line and "missing" not in line, line
    target.unlink()
    target.symlink_to(tmp_path / "nowhere.gguf")
    code, text = _invoke("verify", out)
    assert code == 3 and "missing (dangling symlink" in text, text

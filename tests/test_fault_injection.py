"""The bounded form of `python -m benchmarks.fault_injection` that CI runs: a few random kills of `convert`, then every
hostile-input case of issue 27 as a real process (ggufbridge.testkit.faults and .hostile; the full runs and their
reports are in docs/benchmarks.md)."""

from __future__ import annotations

import shutil

import pytest

from ggufbridge.testkit.faults import run_kills
from ggufbridge.testkit.hostile import run_cases

pytestmark = pytest.mark.slow


def test_fault_injection_bounded(make_ckpt, tmp_path):
    work = tmp_path / "work"
    # the session's checkpoints (copies: the fixtures stay read-only), so no case builds one
    shutil.copytree(make_ckpt("ksafe", vocab="small"), work / "ckpt")
    shutil.copytree(make_ckpt("tiny", vocab="small", dtype="bfloat16"), work / "ckpt-bf16")
    report = run_kills(work / "ckpt", work, kills=3, seed=15)
    assert report["summary"]["runs_with_problems"] == 0, report["runs"]
    hostile = run_cases(work, work / "ckpt")
    failed = [r for r in hostile["results"] if not r["held"]]
    assert not failed, failed
    assert hostile["cases"] >= 40

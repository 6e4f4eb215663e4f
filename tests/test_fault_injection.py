"""The bounded form of benchmarks/fault_injection.py that CI runs: a few random kills of `convert`, then every
hostile-input case of issue 27 as a real process (the full runs and their reports are in docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_fault_injection_bounded(make_ckpt, tmp_path):
    report = tmp_path / "fault_injection.json"
    work = tmp_path / "work"
    # the session's checkpoints (copies: the fixtures stay read-only), so the script's process needs no torch
    shutil.copytree(make_ckpt("ksafe", vocab="small"), work / "ckpt")
    shutil.copytree(make_ckpt("tiny", vocab="small", dtype="bfloat16"), work / "ckpt-bf16")
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "fault_injection.py"), "--kills", "3", "--hostile",
                          "--work", str(work), "--json", str(report)],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=1200)
    assert report.is_file(), res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(report.read_text())
    failed = [r for r in data["hostile"]["results"] if not r["held"]]
    assert not failed, failed
    assert data["summary"]["runs_with_problems"] == 0, data["runs"]
    assert data["hostile"]["cases"] >= 40
    assert res.returncode == 0, res.stdout[-2000:]

"""A real `ggufbridge convert` process slowed down (every tensor encode sleeps 50 ms), started and waited on until
its first `.part` file exists: what the signal, lock and concurrency tests interrupt or race against."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SLOW_CONVERT = """
import sys, time
from ggufbridge.ggufio import writer
real = writer.encode
def slow(*a, **kw):
    time.sleep(0.05)
    return real(*a, **kw)
writer.encode = slow
sys.argv = ["ggufbridge"] + sys.argv[1:]
import ggufbridge.__main__ as m
m.main()
"""


def start_slow_convert(ckpt: Path, out: Path, *extra: str) -> subprocess.Popen:
    """`convert CKPT -o OUT --no-progress --outtype f32 EXTRA...`, returned once it is writing (a `.part` in OUT)."""
    p = subprocess.Popen([sys.executable, "-c", SLOW_CONVERT, "convert", str(ckpt), "-o", str(out),
                          "--no-progress", "--outtype", "f32", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    deadline = time.monotonic() + 120
    while not (out.is_dir() and any(x.name.endswith(".part") for x in out.iterdir())):
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.02)
    return p

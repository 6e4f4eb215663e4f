"""Running one of llama.cpp's tools (llama-quantize, llama-imatrix) with a progress bar read from its own output.

The tools say how far they are in their log: llama-quantize one `[  12/ 733] NAME ...` line per tensor
(src/llama-quant.cpp:1227),
llama-imatrix `computing over N chunks` and then `[i]PPL,` per chunk (tools/imatrix/imatrix.cpp:855, 939). Their
output is captured (it is the tools' log, shown only as the reason of a failure, or with `ggufbridge -v`) and
scanned as it arrives for those markers, which move a tqdm bar on stderr.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from dataclasses import dataclass

from tqdm import tqdm

log = logging.getLogger(__name__)

_KEEP = 4096  # characters of an unfinished line kept for the next read (a marker split between two reads)


@dataclass(frozen=True)
class Progress:
    """How a tool reports progress: `step` matches one unit done (group 1: units done so far; group 2, if any:
    the total), `total` (optional) the total announced once."""

    desc: str
    unit: str
    step: re.Pattern
    total: re.Pattern | None = None


QUANTIZE = Progress("quantising tensors", "tensor", re.compile(r"\[\s*(\d+)/\s*(\d+)\]"))
IMATRIX = Progress("imatrix chunks", "chunk", re.compile(r"\[(\d+)\][-+0-9.naif]+,"),
                   re.compile(r"computing over (\d+) chunks"))


def run_tool(argv: list[str], *, env: dict | None, progress: Progress, show: bool = True) -> tuple[int, str]:
    """Run `argv` to its end with stdin a closed pipe (the tools log nothing with stdin on /dev/null), stdout and
    stderr together captured; (exit code, output). With `show`, a tqdm bar follows the tool's own progress lines;
    with `-v` (debug logging) each output line is also logged. An interrupt stops the tool before it propagates."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    proc.stdin.close()
    chunks: list[str] = []
    pending = ""
    bar = None  # made once the tool says how much there is to do

    def bar_of(total: int) -> tqdm:
        return tqdm(total=total, desc=progress.desc, unit=progress.unit, disable=not show)

    try:
        fd = proc.stdout.fileno()
        while True:
            raw = os.read(fd, 65536)
            if not raw:
                break
            text = raw.decode(errors="replace")
            chunks.append(text)
            pending += text
            if progress.total is not None and bar is None:
                m = progress.total.search(pending)
                if m:
                    bar = bar_of(int(m.group(1)))
            done = None
            for m in progress.step.finditer(pending):
                done = m
            if done is not None:
                if bar is None:
                    bar = bar_of(int(done.group(2)) if done.lastindex and done.lastindex >= 2 else 0)
                bar.update(int(done.group(1)) - bar.n)
                pending = pending[done.end():]
            pending = pending[-_KEEP:]
        code = proc.wait()
        if code == 0 and bar is not None and bar.total:
            # done means all of it: a clean exit whose last progress line we did not see (llama.cpp logs from a
            # thread of its own; a loaded machine's run once ended the bar at 3/4) still fills the bar
            bar.update(bar.total - bar.n)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        if bar is not None:
            bar.close()
        proc.stdout.close()
    out = "".join(chunks)
    for line in out.splitlines():  # llama.cpp's own log: only with -v
        log.debug("%s", line)
    return code, out

"""Importance matrices with the runtime's `llama-imatrix`: per input channel of every matrix, the mean squared
activation over a calibration text. llama-quantize weighs each weight's rounding error by it."""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ggufbridge.native import quiet_native
from ggufbridge.errors import ManifestError, QuantError
from ggufbridge.ggufio.manifest import MANIFEST, read_manifest
from ggufbridge.ggufio.writer import refuse_input_as_output
from ggufbridge.outlock import exclusive, sharing
from ggufbridge.quant.quantize import _default_threads, _error_line
from ggufbridge.quant.toolrun import IMATRIX, run_tool

log = logging.getLogger(__name__)
DEFAULT_NAME = "imatrix.gguf"


@dataclass
class ImatrixResult:
    path: Path
    model: Path
    chunks: int | None
    log: str
    coverage: list = field(default_factory=list)  # ExpertCoverage per stacked-expert tensor, before any filling
    filled: list[str] = field(default_factory=list)  # one line per tensor whose starved experts were filled


def target_of(out_dir: str | os.PathLike) -> Path:
    """The text model of a convert output folder (manifest role "target"), or the GGUF itself if given one."""
    p = Path(out_dir)
    if p.is_file() and p.suffix == ".gguf":
        return p
    target = read_manifest(p).files["target"]
    if not target.path.is_file():
        raise ManifestError(f"{p / MANIFEST} names {target.rel}, which is missing")
    return target.path


def compute_imatrix(model, text, out=None, *, ctx: int = 512, chunks: int | None = None,
                    threads: int | None = None, runtime=None, fill_missing: bool = True,
                    progress: bool = False) -> ImatrixResult:
    """Run llama-imatrix over `text` (a UTF-8 file) with the unquantised target `model` (GGUF, or a convert
    output folder); write the matrix (GGUF format) to `out` (default: beside the model, imatrix.gguf).
    The per-expert coverage is reported; experts no token reached get their layer's mean (ggufbridge.quant.
    coverage) unless `fill_missing` is False. `progress`: a bar per chunk, from the tool's own output."""
    model = target_of(model)
    text = Path(text)
    out = Path(out) if out is not None else model.parent / DEFAULT_NAME
    refuse_input_as_output(out, model, text)
    if not text.is_file():
        raise QuantError(f"calibration text {text} does not exist")
    if text.stat().st_size == 0:
        raise QuantError(f"calibration text {text} is empty")
    if ctx < 8:
        raise QuantError(f"--ctx must be at least 8 tokens, found {ctx}")
    if chunks is not None and chunks < 1:
        raise QuantError(f"--chunks must be at least 1, found {chunks}")
    n_tokens = count_tokens(model, text)
    if n_tokens is not None and n_tokens < 2 * ctx:
        # the tool's own rule (tools/imatrix/imatrix.cpp:818): two contexts' worth of tokens at least
        raise QuantError(f"calibration text {text} is too short: {n_tokens} tokens, llama-imatrix needs at least "
                         f"{2 * ctx} for --ctx {ctx} (use a longer text or a smaller --ctx)")
    if runtime is None:
        from ggufbridge.runtime.locate import locate

        runtime = locate()
    exe = runtime.tool("llama-imatrix")
    # -b = ctx: one sequence per batch, so a short calibration text still yields whole chunks
    # perplexity stays on: its `[i]PPL,` per chunk is the tool's only progress output (quant.toolrun), and the
    # logits it needs are computed either way (tools/imatrix/imatrix.cpp:887-892)
    argv = [str(exe), "-m", str(model), "-f", str(text), "-o", str(out), "-c", str(ctx), "-b", str(ctx),
            "-t", str(threads or _default_threads())]
    if chunks is not None:
        argv += ["--chunks", str(chunks)]
    tmp_out = out.with_name(f".{out.name}.{os.getpid()}.part")
    argv[argv.index(str(out))] = str(tmp_out)
    log.info("computing an importance matrix for %s over %s", model.name, text.name)
    # a second run writing the same matrix stops at once, and so does one writing into a folder a convert is writing
    with sharing(out.parent), exclusive(out, is_folder=False):
        return _run_imatrix(argv, exe, runtime, model, out, tmp_out, ctx, fill_missing, progress)


def _run_imatrix(argv, exe, runtime, model: Path, out: Path, tmp_out: Path, ctx: int,
                 fill_missing: bool, progress: bool) -> ImatrixResult:
    with tempfile.TemporaryDirectory(prefix="ggufbridge-imatrix-") as tmp:
        # the tool's asynchronous logger may drop its last lines on a pipe when it exits early; its log file
        # keeps them (that is where the reason for a failure is)
        logfile = Path(tmp) / "imatrix.log"
        try:
            code, piped = run_tool(argv + ["--log-file", str(logfile)], env=runtime.env(), progress=IMATRIX,
                                   show=progress)
        except OSError as e:
            raise QuantError(f"cannot run {exe}: {e}") from None
        except BaseException:  # interrupted: run_tool has stopped the tool; its half-written output goes too
            tmp_out.unlink(missing_ok=True)
            raise
        outtext = logfile.read_text(errors="replace") if logfile.is_file() else ""
        outtext = outtext or piped
    if code != 0 or not tmp_out.is_file():
        tmp_out.unlink(missing_ok=True)
        hint = _error_line(outtext)
        if "you need at least" in outtext:
            hint += f" (the text is too short for --ctx {ctx}: use a longer text or a smaller --ctx)"
        raise QuantError(f"llama-imatrix failed (exit {code}): {hint}")
    from ggufbridge.quant.coverage import coverage, fill_missing as fill

    cov = coverage(tmp_out)
    filled = fill(tmp_out) if fill_missing else []
    os.replace(tmp_out, out)
    return ImatrixResult(out, model, _chunk_count(out), outtext, cov, filled)


def count_tokens(model: Path, text: Path) -> int | None:
    """Tokens of the calibration text under the model's own tokenizer (vocabulary only: no weights are loaded)."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    with quiet_native():
        llm = Llama(str(model), vocab_only=True, verbose=False)
    try:
        return len(llm.tokenize(text.read_bytes(), add_bos=True, special=False))
    finally:
        llm.close()


def _chunk_count(path: Path) -> int | None:
    from ggufbridge.ggufio.reader import read_header

    count = read_header(path).kv.get("imatrix.chunk_count")
    return int(count) if count is not None else None

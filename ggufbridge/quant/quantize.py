"""Quantise a GGUF with the pinned runtime's own quantiser (`llama-quantize`).

Two ways in:
* a llama-quantize file type (`quant="Q4_K_M"`): llama.cpp's own per-tensor mixture for that type;
* a mix (`mix="hq4"`): ggufbridge decides every tensor's type from its class (ggufbridge.quant.classes),
  applies the runtime's fallback rule for rows that are not whole blocks itself (so the fallbacks are known and
  reported), and hands llama-quantize one exact `--tensor-type` pattern per tensor. The result is read back and
  every tensor's stored type is checked against that plan.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ggufbridge.errors import QuantError
from ggufbridge.ggufio.reader import GGUFHeader, read_header
from ggufbridge.ggufio.writer import refuse_input_as_output, remove_stale_parts, tmp_name
from ggufbridge.outlock import exclusive, sharing
from ggufbridge.quant import toolrun
from ggufbridge.quant import types as qt
from ggufbridge.quant.classes import BY_NAME, classify
from ggufbridge.quant.mix import Mix, load_mix
from ggufbridge.ggufio.names import QUANT_FALLBACKS, QUANT_MIX, QUANT_TYPE
from ggufbridge.quant.report import QuantReport, quant_report
from ggufbridge.quant.toolrun import run_tool
from ggufbridge.units import human_size

log = logging.getLogger(__name__)

UNQUANTISED = {"F32", "F16", "BF16"}
# llama-quantize's warning for a row that is not whole blocks (src/llama-quant.cpp:396-438)
_FALLBACK_RE = re.compile(r"warning: (\S+)\s+- ncols\s+(\d+) not divisible by\s+(\d+) \(required for type\s+(\S+)\)"
                          r".*?-> falling back to\s+(\S+)")


@dataclass
class TensorChoice:
    name: str
    cls: str
    row: int  # ne0, the row length blocks are cut from
    source_type: str
    wanted: str
    final: str

    @property
    def fallback(self) -> str | None:
        if self.final == self.wanted:
            return None
        return (f"{self.name}: rows of {self.row} are not whole {self.wanted} blocks "
                f"({qt.block_size(self.wanted)}) → {self.final}")


@dataclass
class QuantResult:
    path: Path
    source: Path
    file_type: str
    mix: str | None
    imatrix: Path | None
    fallbacks: list[str]
    report: QuantReport
    choices: list[TensorChoice] = field(default_factory=list)  # mix runs only


def plan_mix(header: GGUFHeader, mix: Mix) -> list[TensorChoice]:
    """Every tensor's type under `mix`; kept classes stay as stored."""
    arch = header.kv.get("general.architecture")
    if arch != "qwen35moe":
        raise QuantError(f"{header.path}: recipes are written for the qwen35moe text model, found architecture "
                         f"{arch!r}; use --quant TYPE for other files")
    unknown = sorted(set(mix.tensors) - {t.name for t in header.tensors})
    if unknown:
        raise QuantError(f"recipe {mix.name} names tensor(s) {', '.join(unknown[:3])} that {header.path.name} "
                         f"does not have (a mix made for another model?)")
    out = []
    for t in header.tensors:
        c = classify(t.name)
        if c.name == "other":
            raise QuantError(f"{header.path}: tensor {t.name} belongs to no class of recipe {mix.name}")
        wanted = mix.type_for(t.name, c.name)
        if c.kept:
            if t.type != wanted:
                raise QuantError(f"{header.path}: {t.name} ({c.label}) is stored as {t.type}; recipe {mix.name} "
                                 f"keeps it {wanted} and llama.cpp never quantises it: reconvert the source")
            final = t.type
        else:
            final = qt.fit_row(wanted, t.shape[0])
        out.append(TensorChoice(t.name, c.name, t.shape[0], t.type, wanted, final))
    return out


def _check_source(header: GGUFHeader, allow_requantize: bool) -> None:
    already = sorted({t.type for t in header.tensors if t.type not in UNQUANTISED and t.type not in ("I32", "I64")})
    if already and not allow_requantize:
        raise QuantError(f"{header.path} already holds {', '.join(already)} tensors; quantising a quantised file "
                         f"loses quality: convert with --outtype bf16 (or f32/f16) first, or allow requantising")


def _default_threads() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def quantize_file(src, dst, quant: str | None = None, mix: str | Mix | None = None, imatrix=None, *,
                  runtime=None, allow_requantize: bool = False, threads: int | None = None,
                  progress: bool = False, internal: bool = False) -> QuantResult:
    """Quantise GGUF `src` into `dst` (written directly: the caller picks temporary names and renames); `progress`:
    a bar per tensor quantised, read from llama-quantize's own output (quant.toolrun).

    Exactly one of `quant` (a llama-quantize type, e.g. "Q4_K_M") or `mix` (a packaged name, a TOML path or a
    Mix). `imatrix`: an importance matrix from `compute_imatrix` (required by the very-low-bit types).
    `internal`: a step of a larger command the user did not ask for by name (logged at debug level).
    """
    if (quant is None) == (mix is None):
        raise QuantError("give exactly one of a quantisation type (--quant) or a mix (--mix)")
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise QuantError(f"input and output are the same file: {src}")
    header = read_header(src)
    _check_source(header, allow_requantize)
    rec = None
    choices: list[TensorChoice] = []
    if mix is not None:
        rec = mix if isinstance(mix, Mix) else load_mix(mix)
        ftype = rec.file_type
        choices = plan_mix(header, rec)
        needs = sorted({c.final for c in choices if c.final in qt.NEEDS_IMATRIX})
        label = f"recipe {rec.name}"
    else:
        ftype = qt.file_type(quant)
        needs = [ftype] if qt.FILE_TYPES[ftype][1] else []
        label = ftype
    if needs and imatrix is None:
        raise QuantError(f"{label} uses {', '.join(needs)}, which llama.cpp quantises only with an importance "
                         f"matrix: compute one with `ggufbridge imatrix` and pass --imatrix")
    if imatrix is not None:
        imatrix = Path(imatrix)
        if not imatrix.is_file():
            raise QuantError(f"importance matrix {imatrix} does not exist")

    if runtime is None:
        from ggufbridge.runtime.locate import locate

        runtime = locate()
    exe = runtime.tool("llama-quantize")
    fallbacks = [c.fallback for c in choices if c.fallback]
    with tempfile.TemporaryDirectory(prefix="ggufbridge-quant-") as tmp:
        argv = [str(exe)]
        if imatrix is not None:
            argv += ["--imatrix", str(imatrix)]
        if allow_requantize:
            argv.append("--allow-requantize")
        if rec is not None:
            # one anchored pattern per tensor: the quantiser matches patterns with regex_search, so a bare
            # `attn_q` would also catch `attn_qkv`
            tt = Path(tmp) / "tensor-types.txt"
            tt.write_text("".join(f"^{re.escape(c.name)}$={c.final}\n" for c in choices
                                  if not BY_NAME[c.cls].kept))
            argv += ["--tensor-type-file", str(tt)]
            argv += ["--override-kv", f"{QUANT_MIX}=str:{rec.name}"]
        argv += ["--override-kv", f"{QUANT_TYPE}=str:{ftype}"]
        if fallbacks:
            argv += ["--override-kv", f"{QUANT_FALLBACKS}=str:" + _short_fallbacks(choices)]
        argv += [str(src), str(dst), ftype, str(threads or _default_threads())]
        log.log(logging.DEBUG if internal else logging.INFO, "quantising %s → %s (%s)", src.name, dst.name, label)
        try:
            code, out = run_tool(argv, env=runtime.env(), progress=toolrun.QUANTIZE, show=progress)
        except OSError as e:
            raise QuantError(f"cannot run {exe}: {e}") from None
    if code != 0:
        dst.unlink(missing_ok=True)
        raise QuantError(f"llama-quantize failed ({label}, exit {code}): {_error_line(out)}"
                         f"{_space_note(src, dst)}")
    if rec is None:
        fallbacks = [f"{m.group(1)}: rows of {m.group(2)} are not whole {m.group(4).upper()} blocks "
                     f"({m.group(3)}) → {m.group(5).upper()}" for m in _FALLBACK_RE.finditer(out)]
    for f in fallbacks:
        log.warning("fallback: %s", f)
    written = read_header(dst)
    if rec is not None:
        _check_result(written, choices, rec)
    report = quant_report(written)
    if rec is None and fallbacks:
        report.fallbacks = fallbacks
    return QuantResult(dst, src, ftype, rec.name if rec else None, imatrix, fallbacks, report, choices)


@contextmanager
def all_or_nothing(dst, *inputs):
    """A temporary path beside `dst` to write into (first removing what a killed run left there), renamed to `dst`
    once the block completes. On an error or an interrupt nothing is left under either name. `dst` may not be one
    of `inputs`."""
    refuse_input_as_output(dst, *inputs)
    final = Path(dst)
    # a second run writing the same file stops at once, and so does one writing into a folder a convert is writing
    with sharing(final.parent), exclusive(final, is_folder=False):
        remove_stale_parts(final.parent)
        tmp = tmp_name(final)
        try:
            yield tmp
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)


def quantize_to(src, dst, **kwargs) -> QuantResult:
    """`quantize_file` into `dst`, all or nothing (`all_or_nothing`)."""
    with all_or_nothing(dst, src, kwargs.get("imatrix")) as tmp:
        res = quantize_file(src, tmp, **kwargs)
    res.path = Path(dst)
    res.report.path = str(dst)
    return res


def _short_fallbacks(choices: list[TensorChoice]) -> str:
    # metadata strings are capped at 127 characters by the override mechanism: summarise per class
    per: dict[tuple[str, str, str], int] = {}
    for c in choices:
        if c.fallback:
            key = (c.cls, c.wanted, c.final)
            per[key] = per.get(key, 0) + 1
    text = ";".join(f"{cls} {n}x {w}->{f}" for (cls, w, f), n in per.items())
    return text[:120]


def _check_result(written: GGUFHeader, choices: list[TensorChoice], rec: Mix) -> None:
    got = {t.name: t.type for t in written.tensors}
    for c in choices:
        if got.get(c.name) != c.final:
            raise QuantError(f"{written.path}: {c.name} was stored as {got.get(c.name)}, recipe {rec.name} planned "
                             f"{c.final}")


def _space_note(src: Path, dst: Path) -> str:
    """llama-quantize reports a failed write (a full disk) only as "iostream error": name the free space when it is
    less than the source's size (an upper bound of the output's for an unquantised source)."""
    try:
        free, need = shutil.disk_usage(dst.parent).free, src.stat().st_size
    except OSError:
        return ""
    return (f" (only {human_size(free)} free in {dst.parent}; the output may need up to {human_size(need)})"
            if free < need else "")


def _error_line(out: str) -> str:
    """The tool's own error message(s): lines logged at level E, else the last line that says it failed."""
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    tagged = [re.sub(r"^[\d.]+ E ", "", ln) for ln in lines if re.match(r"^[\d.]+ E ", ln)]
    if tagged:
        return "; ".join(tagged[-2:])
    for ln in reversed(lines):
        low = ln.lower()
        if "error" in low or "failed" in low or "exception" in low or "what()" in low:
            return ln
    return " | ".join(lines[-3:]) if lines else "no output"

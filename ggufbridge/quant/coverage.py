"""Per-expert coverage of an importance matrix, and what to do with experts the calibration never reached.

`llama-imatrix` (GGUF format) stores per weight tensor `NAME.in_sum2` [n_mat, n_in] (sums of squared inputs) and
`NAME.counts` [n_mat] (tokens seen), one row per expert for the stacked expert tensors (`ffn_*_exps`). An expert
no calibration token was routed to has count 0. In the pinned tree the tool writes such partial entries (with a
"partial data" warning) and llama-quantize gives that expert's rows the importance 1 for every column
(tools/quantize/quantize.cpp, load_imatrix): the expert is quantised as if there were no importance matrix, while
its neighbours use theirs — silently. (Older trees dropped the whole tensor's entry.)

ggufbridge reports the coverage (tokens routed to each expert of each layer) and fills every expert without data
from its layer's mean over the experts that have it, with a warning that lists them: the layer mean is the best
estimate of which input channels matter for an expert of that layer.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ggufbridge.errors import QuantError
from ggufbridge.quant.classes import BLOCK

log = logging.getLogger(__name__)
_SUM, _COUNT = ".in_sum2", ".counts"
KEY_FILLED = "ggufbridge.imatrix.filled"


@dataclass
class Entry:
    name: str  # the weight tensor, e.g. blk.0.ffn_down_exps.weight
    sums: np.ndarray  # [n_mat, n_in]
    counts: np.ndarray  # [n_mat]


@dataclass
class ExpertCoverage:
    tensor: str
    layer: int | None
    counts: list[int]  # tokens routed to each expert

    @property
    def missing(self) -> list[int]:
        return [i for i, c in enumerate(self.counts) if c == 0]


def read_entries(path) -> tuple[dict[str, Entry], dict]:
    """The matrix's entries and its metadata fields (for rewriting).

    gguf-py's GGUFReader, not ggufio.reader: rewriting the matrix copies each key with its GGUF value type, which
    the bounded reader does not keep; an imatrix has no vocabulary arrays, so GGUFReader's cost does not arise."""
    from gguf import GGUFReader

    path = Path(path)
    if not path.is_file():
        raise QuantError(f"importance matrix {path} does not exist")
    try:
        r = GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 - gguf-py raises bare ValueError/struct errors on junk
        raise QuantError(f"{path}: not a GGUF importance matrix ({e})") from None
    tensors = {t.name: t for t in r.tensors}
    entries = {}
    for name, t in tensors.items():
        if not name.endswith(_SUM):
            continue
        base = name[: -len(_SUM)]
        c = tensors.get(base + _COUNT)
        if c is None:
            raise QuantError(f"{path}: {name} has no {base + _COUNT} (not a GGUF-format imatrix?)")
        counts = np.asarray(c.data, dtype=np.float32).reshape(-1)
        sums = np.asarray(t.data, dtype=np.float32).reshape(len(counts), -1)
        entries[base] = Entry(base, sums.copy(), counts.copy())
    if not entries:
        raise QuantError(f"{path}: no importance matrix entries (expected NAME.in_sum2 / NAME.counts tensors)")
    fields = {k: f for k, f in r.fields.items() if not k.startswith("GGUF.")}
    return entries, fields


def coverage(path) -> list[ExpertCoverage]:
    """Tokens per expert for every stacked-expert entry (n_mat > 1), by layer."""
    entries, _ = read_entries(path)
    out = []
    for name, e in sorted(entries.items(), key=lambda kv: _sort_key(kv[0])):
        if len(e.counts) > 1:
            m = BLOCK.match(name)
            out.append(ExpertCoverage(name, int(m.group(1)) if m else None, [int(round(c)) for c in e.counts]))
    return out


def _sort_key(name: str):
    m = BLOCK.match(name)
    return (int(m.group(1)) if m else -1, name)


def format_coverage(cov: list[ExpertCoverage]) -> str:
    if not cov:
        return "expert coverage: no stacked-expert entries (not a MoE model?)"
    lines = ["expert coverage (tokens routed per expert)",
             f"  {'tensor':<34} {'experts':>7} {'min':>7} {'median':>7} {'max':>7}  without tokens"]
    for c in cov:
        a = np.asarray(c.counts)
        miss = c.missing
        lines.append(f"  {c.tensor:<34} {len(a):>7} {a.min():>7} {int(np.median(a)):>7} {a.max():>7}  "
                     f"{_ranges(miss) if miss else '-'}")
    n_miss = sum(len(c.missing) for c in cov)
    lines.append(f"  {n_miss} expert slot(s) of {sum(len(c.counts) for c in cov)} got no calibration tokens"
                 if n_miss else "  every expert of every layer got calibration tokens")
    return "\n".join(lines)


def _ranges(ids: list[int]) -> str:
    out, start = [], None
    for i, x in enumerate(ids):
        if start is None:
            start = x
        if i + 1 == len(ids) or ids[i + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ",".join(out)


def fill_missing(path, out=None) -> list[str]:
    """Give every expert without tokens its layer's mean importance (mean over covered experts of sums/counts,
    stored with count 1). Rewrites `path` (or writes `out`) only when something was filled; returns one line per
    filled tensor. A tensor no expert of which saw a token is left as it is (nothing to take a mean of), with a
    warning."""
    entries, fields = read_entries(path)
    filled = []
    for name, e in sorted(entries.items(), key=lambda kv: _sort_key(kv[0])):
        if len(e.counts) < 2:
            continue
        miss = np.flatnonzero(e.counts == 0)
        if len(miss) == 0:
            continue
        covered = np.flatnonzero(e.counts > 0)
        if len(covered) == 0:
            log.warning("imatrix: %s: no expert got tokens; left without importance data (quantised unweighted)",
                        name)
            continue
        mean = (e.sums[covered] / e.counts[covered, None]).mean(axis=0)
        e.sums[miss] = mean
        e.counts[miss] = 1.0
        filled.append(f"{name}: experts {_ranges(miss.tolist())} got no tokens; filled from the mean of the "
                      f"{len(covered)} covered expert(s)")
        log.warning("imatrix: %s", filled[-1])
    if filled:
        _write(entries, fields, Path(out or path), filled)
    elif out is not None and Path(out) != Path(path):
        import shutil

        shutil.copyfile(path, out)
    return filled


def _write(entries: dict[str, Entry], fields: dict, dst: Path, filled: list[str]) -> None:
    from gguf import GGUFValueType, GGUFWriter

    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.part")
    w = GGUFWriter(str(tmp), arch="imatrix")
    # GGUFWriter always adds general.architecture; the tool's own keys are copied as they are
    for key, f in fields.items():
        if key == "general.architecture":
            continue
        vt = f.types[0]
        if vt == GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), vt, sub_type=f.types[1])
        else:
            w.add_key_value(key, f.contents(), vt)
    w.add_string(KEY_FILLED, "; ".join(filled)[:1000])
    for name in sorted(entries):
        e = entries[name]
        w.add_tensor(name + _SUM, e.sums.astype(np.float32))
        w.add_tensor(name + _COUNT, e.counts.astype(np.float32).reshape(-1, 1))
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)

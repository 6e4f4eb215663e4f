"""Logits dumps: the top-K form of every position of an eval set in one safetensors file.

Tensors (N = total positions of all rows, rows concatenated in eval order; K = top-k):

* `topk_logp`  F32 [N, K]  log-probabilities of the K most likely tokens, decreasing
* `topk_ids`   I32 [N, K]  their token ids
* `rest_logmass` F32 [N]  log of the probability of every other token (-inf if none)
* `label_logp` F32 [N]     log-probability of the next token (NaN at each row's last position)
* `row_offsets` I64 [R+1]  position range of row r: [row_offsets[r], row_offsets[r+1])
* `sample_ids` I32 [N, M], `sample_logp` F32 [N, M]  (only when M > 0) M tokens drawn from the distribution
  restricted to the rest, with their log-probabilities: they make the KL an unbiased estimate of the
  full-vocabulary KL instead of a lower bound (see ggufbridge.compare.metrics and docs/compare.md)

`__metadata__["ggufbridge.logits"]` is a JSON object: format version, source spec, vocab_size, top_k, ctx,
the sha256 of each row's ids (`row_sha256`) and of the whole set (`set_sha256`), each row's kind, and the
BF16-vs-FP32 floor figures when they were measured.

The file is written streaming: the header is computed up front (every size is known from the eval rows), the
data region is memory-mapped, filled chunk by chunk, and the file renamed into place once complete.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ggufbridge.compare.metrics import TopK
from ggufbridge.errors import LogitsMismatch
from ggufbridge.units import INT32_MAX
from ggufbridge.untrusted import finite_numbers, parse_json

FORMAT = "ggufbridge.logits"
VERSION = 1
_DTYPES = {"F32": np.dtype("<f4"), "I32": np.dtype("<i4"), "I64": np.dtype("<i8")}


REQUIRED = ("topk_logp", "topk_ids", "rest_logmass", "label_logp", "row_offsets")


def _layout(n_pos: int, n_rows: int, k: int, m: int = 0) -> list[tuple[str, str, tuple[int, ...]]]:
    out = [
        ("topk_logp", "F32", (n_pos, k)),
        ("topk_ids", "I32", (n_pos, k)),
        ("rest_logmass", "F32", (n_pos,)),
        ("label_logp", "F32", (n_pos,)),
        ("row_offsets", "I64", (n_rows + 1,)),
    ]
    if m > 0:
        out += [("sample_ids", "I32", (n_pos, m)), ("sample_logp", "F32", (n_pos, m))]
    return out


class DumpWriter:
    """Write a dump position chunk by position chunk (rows in order). Use as a context manager."""

    def __init__(self, path, *, row_lengths: list[int], top_k: int, samples: int = 0, meta: dict):
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.partial")
        self.k, self.m = top_k, samples
        layout = _layout(int(sum(row_lengths)), len(row_lengths), top_k, samples)
        n_pos = int(sum(row_lengths))
        header: dict = {}
        offset = 0
        for name, dt, shape in layout:
            nbytes = int(np.prod(shape)) * _DTYPES[dt].itemsize
            header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        header["__metadata__"] = {FORMAT: json.dumps({"version": VERSION, **meta})}
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned
        self._start = 8 + len(raw)
        self._header = header
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.tmp, "wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            f.truncate(self._start + offset)
        self._arrays = {}
        for name, dt, shape in layout:
            a, b = header[name]["data_offsets"]
            if b > a:
                self._arrays[name] = np.memmap(self.tmp, dtype=_DTYPES[dt], mode="r+", offset=self._start + a,
                                               shape=shape)
        self._arrays["row_offsets"][:] = np.concatenate([[0], np.cumsum(row_lengths)])
        self._pos = 0
        self._n_pos = n_pos

    def add(self, chunk: TopK) -> None:
        a, b = self._pos, self._pos + chunk.n
        if b > self._n_pos:
            raise ValueError(f"dump overflow: {b} positions written, {self._n_pos} planned")
        self._arrays["topk_logp"][a:b] = chunk.logp
        self._arrays["topk_ids"][a:b] = chunk.ids
        self._arrays["rest_logmass"][a:b] = chunk.rest
        self._arrays["label_logp"][a:b] = chunk.label_logp
        if self.m:
            self._arrays["sample_ids"][a:b] = chunk.sample_ids
            self._arrays["sample_logp"][a:b] = chunk.sample_logp
        self._pos = b

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        for arr in self._arrays.values():
            arr.flush()
        self._arrays.clear()
        if exc_type is None and self._pos != self._n_pos:
            self.tmp.unlink(missing_ok=True)
            raise ValueError(f"dump incomplete: {self._pos} of {self._n_pos} positions written")
        if exc_type is None:
            os.replace(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)
        return False


@dataclass
class DumpReader:
    """Read a dump row by row (position slices; nothing is loaded whole)."""

    path: Path
    meta: dict
    offsets: np.ndarray
    has_samples: bool = False

    @classmethod
    def open(cls, path) -> DumpReader:
        from safetensors import SafetensorError, safe_open

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(2, "No such file", str(path))
        try:
            with safe_open(str(path), framework="numpy") as f:
                raw = (f.metadata() or {}).get(FORMAT)
                names = set(f.keys())
                offsets = f.get_tensor("row_offsets") if "row_offsets" in names else None
        except SafetensorError as e:
            raise LogitsMismatch(f"{path}: not a safetensors file ({e})") from None
        if raw is None or offsets is None:
            raise LogitsMismatch(f"{path}: not a ggufbridge logits dump (no {FORMAT} metadata)")
        meta = parse_json(raw, f"{path}: {FORMAT} metadata", LogitsMismatch)
        if not isinstance(meta, dict) or meta.get("version") != VERSION:
            version = meta.get("version") if isinstance(meta, dict) else None
            raise LogitsMismatch(f"{path}: dump format version {version}, expected {VERSION}")
        # the fields compare uses, judged here (the JSON reader judges no values)
        vocab, hashes, floor = meta.get("vocab_size"), meta.get("row_sha256"), meta.get("floor")
        if isinstance(vocab, bool) or not isinstance(vocab, int) or not 0 < vocab <= INT32_MAX:
            raise LogitsMismatch(f"{path}: {FORMAT} metadata: vocab_size expected a positive integer of at most "
                                 f"{INT32_MAX}, found {str(vocab)[:40]}")
        if not isinstance(hashes, list) or not all(isinstance(h, str) for h in hashes):
            raise LogitsMismatch(f"{path}: {FORMAT} metadata: row_sha256 expected a list of strings")
        if floor is not None:
            if not isinstance(floor, dict):
                raise LogitsMismatch(f"{path}: {FORMAT} metadata: floor expected an object, found {str(floor)[:40]}")
            finite_numbers(floor, f"{path}: {FORMAT} metadata: floor", LogitsMismatch)
        missing = set(REQUIRED) - names
        if missing:
            raise LogitsMismatch(f"{path}: dump lacks tensors {sorted(missing)}")
        return cls(path, meta, offsets, "sample_ids" in names and "sample_logp" in names)

    @property
    def n_rows(self) -> int:
        return len(self.offsets) - 1

    def chunks(self, row: int, chunk: int):
        """The row's positions as TopK chunks of at most `chunk` positions."""
        from safetensors import safe_open

        a0, b0 = int(self.offsets[row]), int(self.offsets[row + 1])
        with safe_open(str(self.path), framework="numpy") as f:
            names = ["topk_logp", "topk_ids", "rest_logmass", "label_logp"]
            names += ["sample_ids", "sample_logp"] if self.has_samples else []
            sl = {n: f.get_slice(n) for n in names}
            for a in range(a0, b0, chunk):
                b = min(a + chunk, b0)
                yield TopK(
                    logp=sl["topk_logp"][a:b],
                    ids=sl["topk_ids"][a:b].astype(np.int64),
                    rest=sl["rest_logmass"][a:b],
                    label_logp=sl["label_logp"][a:b],
                    sample_ids=sl["sample_ids"][a:b].astype(np.int64) if self.has_samples else None,
                    sample_logp=sl["sample_logp"][a:b] if self.has_samples else None,
                )

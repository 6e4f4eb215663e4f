"""Reading safetensors shards as untrusted input, without unpickling and without loading whole files.

A shard's header is bounded and checked (every offset inside the data area, no overlaps, sizes that agree with
shape × dtype) before any tensor is read. Tensors are read on demand with positioned reads, so the memory held
is the tensor being converted, never the shard: mmap would also be lazy, but every page it touches stays in the
process's resident set until the mapping goes away, which defeats bounded-memory conversion of 70 GB.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ggufbridge.errors import CheckpointError
from ggufbridge.untrusted import parse_json

MAX_HEADER_BYTES = 100 * 1024 * 1024

# safetensors dtype -> (numpy dtype used to hold the raw bytes, bytes per element)
# BF16 has no numpy dtype: it is carried as uint16 bit patterns and widened explicitly where needed.
DTYPES: dict[str, tuple[np.dtype, int]] = {
    "F64": (np.dtype("<f8"), 8),
    "F32": (np.dtype("<f4"), 4),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),
    "I64": (np.dtype("<i8"), 8),
    "I32": (np.dtype("<i4"), 4),
    "I16": (np.dtype("<i2"), 2),
    "I8": (np.dtype("i1"), 1),
    "U8": (np.dtype("u1"), 1),
    "BOOL": (np.dtype("?"), 1),
}


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor lives: enough to read it later, nothing read yet."""

    name: str
    path: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute file offset of the first byte
    nbytes: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def read(self, out: np.ndarray | None = None) -> np.ndarray:
        """The tensor as a numpy array in its stored dtype (BF16 as uint16 bit patterns).

        `out`, if given, is a C-contiguous array of that dtype and shape to read into (e.g. one expert's slot of a
        stacked tensor, so stacking needs no second copy)."""
        np_dtype, _ = DTYPES[self.dtype]
        if out is None:
            out = np.empty(self.shape, dtype=np_dtype)
        elif out.dtype != np_dtype or out.shape != self.shape or not out.flags.c_contiguous:
            raise ValueError(f"{self.name}: cannot read {self.dtype}{list(self.shape)} into "
                             f"{out.dtype}{list(out.shape)}")
        buf = memoryview(out.reshape(-1).view(np.uint8)) if self.nbytes else memoryview(b"")
        with open(self.path, "rb", buffering=0) as f:
            f.seek(self.start)
            got = 0
            while got < self.nbytes:
                n = f.readinto(buf[got:])
                if not n:
                    raise CheckpointError(
                        f"{self.path.name}: tensor {self.name} ends at byte {self.start + self.nbytes}, "
                        f"but the file ends at {self.start + got} (truncated shard?)"
                    )
                got += n
        return out

    def read_f32(self) -> np.ndarray:
        """The tensor widened to float32 (for transforms that need arithmetic)."""
        return to_f32(self.read(), self.dtype)


def to_f32(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    if dtype in ("F32", "F16", "F64"):
        return a.astype(np.float32, copy=False)
    raise CheckpointError(f"expected a floating-point tensor, found dtype {dtype}")


U64 = 2**64


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def read_header(path: Path) -> tuple[dict[str, TensorRef], dict[str, str]]:
    """Parse and validate one shard's header. Returns (tensors by name, __metadata__)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path.name}: {size} bytes is too short for a safetensors file")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES:
                raise CheckpointError(
                    f"{path.name}: header length {n} exceeds the {MAX_HEADER_BYTES} byte limit "
                    f"(corrupt or hostile file)"
                )
            if 8 + n > size:
                raise CheckpointError(f"{path.name}: header length {n} runs past the end of the {size} byte file")
            raw = f.read(n)
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror or e}") from None
    header = parse_json(raw, f"{path.name}: safetensors header", CheckpointError, max_bytes=MAX_HEADER_BYTES)
    if not isinstance(header, dict):
        raise CheckpointError(f"{path.name}: safetensors header is not a JSON object")

    data_start = 8 + n
    data_len = size - data_start
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise CheckpointError(f"{path.name}: __metadata__ expected an object of strings, found {str(meta)[:60]}")
    tensors: dict[str, TensorRef] = {}
    spans = []
    for name, info in header.items():
        try:
            dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError):
            raise CheckpointError(f"{path.name}: malformed header entry for tensor {name!r}") from None
        # integers only, as the safetensors library requires: 512.7 is not a dimension (int() would take 512)
        if (not isinstance(shape, list) or not isinstance(offsets, list) or len(offsets) != 2
                or not all(_is_int(x) for x in shape + offsets)):
            raise CheckpointError(f"{path.name}: tensor {name!r} needs an integer shape and two integer data_offsets, "
                                  f"found shape {str(shape)[:40]} and data_offsets {str(offsets)[:40]}")
        shape, (begin, end) = tuple(shape), offsets
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise CheckpointError(f"{path.name}: tensor {name} has unsupported dtype {dtype!r}")
        if any(d < 0 for d in shape):
            raise CheckpointError(f"{path.name}: tensor {name} has a negative dimension {str(list(shape))[:80]}")
        # The JSON reader judges no values: the format's own bound is judged here. Dimensions and offsets are
        # u64 in safetensors (and in GGUF); the product is cut off as soon as it passes 2^64.
        if any(d >= U64 for d in shape) or not all(-1 < x < U64 for x in offsets):
            raise CheckpointError(f"{path.name}: tensor {name}: shape and data_offsets must be unsigned 64-bit "
                                  f"integers, found shape {str(list(shape))[:60]} and data_offsets "
                                  f"{str(offsets)[:60]}")
        numel = 1
        for d in shape:
            numel = numel * d if numel < U64 else numel
        want = numel * DTYPES[dtype][1]
        if want >= U64:
            raise CheckpointError(f"{path.name}: tensor {name}: shape {list(shape)} × {dtype} is 2^64 bytes or more")
        if not (0 <= begin <= end):
            raise CheckpointError(f"{path.name}: tensor {name} has invalid data offsets [{begin}, {end}]")
        if end - begin != want:
            raise CheckpointError(
                f"{path.name}: tensor {name} declares {end - begin} bytes but shape {list(shape)} × {dtype} "
                f"needs {want}"
            )
        if end > data_len:
            raise CheckpointError(
                f"{path.name}: tensor {name} ends at data byte {end} but the shard holds only {data_len} "
                f"(truncated or lying header)"
            )
        spans.append((begin, end, name))
        tensors[name] = TensorRef(name, path, dtype, shape, data_start + begin, want)
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise CheckpointError(f"{path.name}: tensors {n0} and {n1} overlap in the data area")
    return tensors, meta

"""The one GGUF reader: `read_header(path)` parses a GGUF v2/v3 file's metadata and tensor table, bounded (every
count and length is checked against the file size before it is used, so an untrusted or cut file is a one-line
GGUFFileError, never a huge allocation), and reads no tensor data. A tensor's bytes are then one `np.memmap` at the
offset the table gives (`GGUFHeader.tensor_data` / `tensor_array`), so a 70 GB file costs what its header costs.

Why not gguf-py's `GGUFReader`: it builds a numpy view per element of every array, which for the 248,144-entry
vocabulary of MiniCPM-V 4.7 takes ~12 s and ~900 MB before the first key can be looked at (docs/benchmarks.md,
"Start-up"). The tests read files back with `GGUFReader` as the independent reference for this reader.
"""

from __future__ import annotations

import mmap
import struct
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from ggufbridge.errors import GGUFFileError

MAGIC = struct.pack("<I", GGUF_MAGIC)  # b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 8
_SCALARS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
_NP = {vt: np.dtype(fmt) for vt, fmt in _SCALARS.items()}
# GGML types a tensor can be viewed as directly (BF16 as its uint16 bit patterns, as the converter carries it)
PLAIN_DTYPES = {
    "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "F64": np.dtype("<f8"),
    "I8": np.dtype("i1"), "I16": np.dtype("<i2"), "I32": np.dtype("<i4"), "I64": np.dtype("<i8"),
}


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: fastest-varying first
    type: str
    nbytes: int
    offset: int = 0  # within the data section

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class GGUFHeader:
    path: Path
    version: int
    kv: dict[str, object]
    tensors: list[TensorInfo]
    file_bytes: int
    data_start: int = 0  # absolute offset of the (aligned) tensor data section
    header_end: int = 0  # where the tensor table ends: the header's bytes before the alignment padding

    def tensor(self, name: str) -> TensorInfo:
        t = next((t for t in self.tensors if t.name == name), None)
        if t is None:
            raise GGUFFileError(f"{self.path}: no tensor {name!r} (the file has {len(self.tensors)} tensors)")
        return t

    def tensor_data(self, name_or_info: str | TensorInfo) -> np.memmap:
        """The stored bytes of one tensor (read-only, mapped: nothing is read until used)."""
        t = self.tensor(name_or_info) if isinstance(name_or_info, str) else name_or_info
        if t.nbytes == 0:
            return np.zeros(0, dtype=np.uint8)
        return np.memmap(self.path, dtype=np.uint8, mode="r", offset=self.data_start + t.offset, shape=(t.nbytes,))

    def tensor_blocks(self, name_or_info: str | TensorInfo) -> np.memmap:
        """One tensor's stored bytes in numpy order with the last axis in bytes: the layout gguf-py's
        `gguf.quants.dequantize` takes, for any type (quantised or not)."""
        t = self.tensor(name_or_info) if isinstance(name_or_info, str) else name_or_info
        block, bsize = GGML_QUANT_SIZES[GGMLQuantizationType[t.type]]
        shape = t.shape[::-1]
        return self.tensor_data(t).reshape(*shape[:-1], shape[-1] // block * bsize)

    def tensor_array(self, name_or_info: str | TensorInfo) -> np.ndarray:
        """One unquantised tensor as an array in numpy (PyTorch) order; BF16 as uint16 bit patterns."""
        t = self.tensor(name_or_info) if isinstance(name_or_info, str) else name_or_info
        dt = PLAIN_DTYPES.get(t.type)
        if dt is None:
            raise GGUFFileError(f"{self.path}: tensor {t.name} is {t.type}, expected one of {sorted(PLAIN_DTYPES)} "
                                f"to view it as an array")
        return self.tensor_data(t).view(dt).reshape(t.shape[::-1])


_U64 = struct.Struct("<Q")


class _Reader:
    """Cursor over the mapped file; every length is checked against the file size before it is used."""

    def __init__(self, buf, size: int, path: Path):
        self.buf, self.size, self.path, self.pos = buf, size, path, 0

    def read(self, n: int) -> bytes:
        end = self.pos + n
        if end > self.size:
            raise GGUFFileError(f"{self.path}: truncated GGUF header (wanted {n} more bytes at {self.pos})")
        b = self.buf[self.pos:end]
        self.pos = end
        return b

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def count(self, what: str, unit: int = 1) -> int:
        n = _U64.unpack(self.read(8))[0]
        if n * unit > self.size:
            raise GGUFFileError(f"{self.path}: {what} count {n} cannot fit a {self.size} byte file")
        return n

    def string(self) -> str:
        n = self.count("string length")
        return self.read(n).decode("utf-8", errors="replace")

    def strings(self, n: int) -> list[str]:
        """`n` strings; the same checks as `string()`, in one loop (a vocabulary holds ~250k of them)."""
        buf, pos, size, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        out = []
        append = out.append
        for _ in range(n):
            if pos + 8 > size:
                raise GGUFFileError(f"{self.path}: truncated GGUF header (wanted 8 more bytes at {pos})")
            length = unpack(buf, pos)[0]
            if length > size:
                raise GGUFFileError(f"{self.path}: string length count {length} cannot fit a {size} byte file")
            pos += 8
            end = pos + length
            if end > size:
                raise GGUFFileError(f"{self.path}: truncated GGUF header (wanted {length} more bytes at {pos})")
            append(buf[pos:end].decode("utf-8", errors="replace"))
            pos = end
        self.pos = pos
        return out

    def value(self, vt: int):
        if vt == GGUFValueType.STRING:
            return self.string()
        if vt == GGUFValueType.ARRAY:
            et = self.unpack("<I")
            n = self.count("array element", 1)
            if et == GGUFValueType.STRING:
                return self.strings(n)
            if et not in _NP:
                raise GGUFFileError(f"{self.path}: unsupported array element type {et}")
            return np.frombuffer(self.read(n * _NP[et].itemsize), dtype=_NP[et])
        if vt not in _SCALARS:
            raise GGUFFileError(f"{self.path}: unknown metadata value type {vt}")
        return self.unpack(_SCALARS[vt])


MAX_ELEMENTS = 2**63 - 1  # ggml counts elements and bytes in int64


def _tensor_nbytes(path: Path, name: str, dims: tuple[int, ...], t: GGMLQuantizationType) -> int:
    """The tensor's byte size from its dimensions, exactly (Python integers: a product that would wrap in 64 bits,
    as numpy's did, is refused rather than read as 0 or negative)."""
    block, bsize = GGML_QUANT_SIZES[t]
    # as the runtime reads them (ggml/src/gguf.cpp:691-718): each dimension is an int64, so 2^63 or more is
    # negative there and refused even beside a zero dimension; the running product is checked dimension by
    # dimension, so [2^40, 2^40, 0] is refused as well although its product is 0
    n = dims[0] if dims else 1
    for d in dims[1:]:
        if d > 1 and n > MAX_ELEMENTS // d:
            raise GGUFFileError(f"{path}: tensor {name} has dimensions {list(dims)} whose product overflows 64 bits")
        n *= d
    if n * bsize // block > MAX_ELEMENTS:
        raise GGUFFileError(f"{path}: tensor {name} has dimensions {list(dims)} whose product overflows 64 bits")
    big = next((d for d in dims if d > MAX_ELEMENTS), None)
    if big is not None:
        raise GGUFFileError(f"{path}: tensor {name} has a dimension of {big} in {list(dims)}: more than the "
                            f"runtime's limit of 2^63 - 1 per dimension")
    if dims and dims[0] % block:
        raise GGUFFileError(f"{path}: tensor {name} is {t.name} with rows of {dims[0]} values, not a multiple of "
                            f"its block of {block}")
    return n // block * bsize


def read_header(path: str | Path) -> GGUFHeader:
    """Metadata and tensor table of a GGUF v2/v3 file (no tensor data is read)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        # mapped, not read: only the pages the header spans are touched (an empty file cannot be mapped)
        with open(path, "rb") as f, (mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size
                                     else nullcontext(b"")) as buf:
            r = _Reader(buf, size, path)
            if r.read(4) != MAGIC:
                raise GGUFFileError(f"{path}: not a GGUF file (bad magic)")
            version = r.unpack("<I")
            if version not in VERSIONS:
                raise GGUFFileError(f"{path}: GGUF version must be 2 or 3, found {version}")
            n_tensors = r.count("tensor", 8)
            n_kv = r.count("metadata", 8)
            kv = {}
            for _ in range(n_kv):
                key = r.string()
                kv[key] = r.value(r.unpack("<I"))
            tensors = []
            for _ in range(n_tensors):
                name = r.string()
                nd = r.unpack("<I")
                if nd > MAX_DIMS:
                    raise GGUFFileError(f"{path}: tensor {name} has {nd} dimensions (at most {MAX_DIMS} expected)")
                dims = struct.unpack(f"<{nd}Q", r.read(8 * nd))
                qt = r.unpack("<I")
                offset = r.unpack("<Q")
                try:
                    t = GGMLQuantizationType(qt)
                except ValueError:
                    raise GGUFFileError(f"{path}: tensor {name} has unknown GGML type {qt}") from None
                tensors.append(TensorInfo(name, dims, t.name, _tensor_nbytes(path, name, dims, t), offset))
            # a file cut short keeps a whole header: only the data section's end against the file size tells
            align = kv.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
            align = align if isinstance(align, int) and align > 0 else GGUF_DEFAULT_ALIGNMENT
            header_end = r.pos
            data_start = r.pos + (-r.pos) % align
            end = data_start + max((t.offset + t.nbytes for t in tensors), default=0)
            if end > size:
                raise GGUFFileError(f"{path}: truncated GGUF: its tensor data needs {end} bytes, the file has {size}")
    except OSError as e:
        raise GGUFFileError(f"cannot read {path}: {e.strerror or e}") from None
    return GGUFHeader(path, version, kv, tensors, size, data_start, header_end)

"""A streaming GGUF v3 writer: header and tensor table first (all sizes are known from the plan), then each tensor
is built, converted, written and dropped in turn. The file is hashed while it is written, so a 70 GB output is
never read back, and it is written under a temporary name; only `commit()` gives it its final name.

Why our own encoder of the header, KV and tensor-info records rather than gguf-py's `GGUFWriter` (a dependency):
- hashing while writing: `GGUFWriter` opens its output file itself (`open_output_file(path)`), so the only ways to
  get the sha256 the manifest records are to re-read the finished file (minutes for 70 GB) or to replace its
  private file handle;
- all-or-nothing output: the temporary name, the NaN/Inf check and the shape/size checks per tensor, and the
  cleanup on any error or signal (see `write_gguf`) sit between tensors, where `GGUFWriter` gives no hook;
- exact value types: the runtime's reads are type-strict (`u32` vs `i32`, INT32 array elements), so each KV
  carries its kind explicitly (ggufio.plan.KV) instead of being inferred from the Python value.
The format constants (magic, version, alignment), the GGML type sizes and the quantisers are gguf's; the BF16
rounding below is gguf's `quants.BF16` formula (tests/test_ggufio.py checks them bit-equal) done in uint32, half
the temporary memory of gguf's uint64 version on the largest expert tensors. Tensor names and metadata keys come from
gguf's constants through ggufbridge.ggufio.names.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, GGMLQuantizationType, GGUFValueType
from gguf import quants as gguf_quants

from ggufbridge.ggufio.plan import ConversionPlan, PlannedTensor
from ggufbridge.checkpoint.safetensors import to_f32
from ggufbridge.errors import GGUFBridgeError, NonFiniteWeights, OutputError

log = logging.getLogger(__name__)
MAGIC = struct.pack("<I", GGUF_MAGIC)  # b"GGUF"
VERSION = GGUF_VERSION  # 3
ALIGNMENT = GGUF_DEFAULT_ALIGNMENT  # 32

OUTTYPES = {
    "f32": GGMLQuantizationType.F32,
    "f16": GGMLQuantizationType.F16,
    "bf16": GGMLQuantizationType.BF16,
    "q8_0": GGMLQuantizationType.Q8_0,
}
# general.file_type values (llama_ftype) for the output types we write ourselves
FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}
# dtype tag of a built tensor that is already encoded: a flat uint8 array of the planned type's blocks
RAW = "RAW"


def choose_type(t: PlannedTensor, outtype: str) -> GGMLQuantizationType:
    if t.ggml_type:
        return GGMLQuantizationType[t.ggml_type]
    if t.force_f32 or len(t.shape) == 1:
        return GGMLQuantizationType.F32
    qt = OUTTYPES[outtype]
    block = GGML_QUANT_SIZES[qt][0]
    if t.shape[-1] % block:
        # Rows that do not fill whole blocks cannot be quantised (the runtime rejects the file): keep them F16.
        return GGMLQuantizationType.F16
    return qt


def tensor_nbytes(shape: tuple[int, ...], qt: GGMLQuantizationType) -> int:
    block, size = GGML_QUANT_SIZES[qt]
    n = 1
    for d in shape:
        n *= d
    return n // block * size


def f32_to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 → bfloat16 bit patterns (NaN kept quiet)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = ((bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def encode(arr: np.ndarray, tag: str, qt: GGMLQuantizationType) -> np.ndarray:
    """Turn a built tensor (storage dtype `tag`) into the bytes of GGML type `qt`."""
    if tag == RAW:
        return arr  # already the bytes of `qt` (blocks built by the caller)
    if qt == GGMLQuantizationType.BF16 and tag == "BF16":
        return arr  # bit-exact passthrough
    if qt == GGMLQuantizationType.F16 and tag == "F16":
        return arr
    if tag in ("I64", "I32") and qt in (GGMLQuantizationType.I64, GGMLQuantizationType.I32):
        return arr
    f = to_f32(arr, tag)
    if qt == GGMLQuantizationType.F32:
        return np.ascontiguousarray(f)
    if qt == GGMLQuantizationType.F16:
        return f.astype(np.float16)
    if qt == GGMLQuantizationType.BF16:
        return f32_to_bf16_bits(f)
    return gguf_quants.quantize(np.ascontiguousarray(f), qt)


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


_SCALAR = {
    "u32": (GGUFValueType.UINT32, "<I"),
    "i32": (GGUFValueType.INT32, "<i"),
    "f32": (GGUFValueType.FLOAT32, "<f"),
    "bool": (GGUFValueType.BOOL, "<?"),
}


def _kv(key: str, value, kind: str) -> bytes:
    out = _str(key)
    if kind in _SCALAR:
        vt, fmt = _SCALAR[kind]
        return out + struct.pack("<I", vt) + struct.pack(fmt, value)
    if kind == "str":
        return out + struct.pack("<I", GGUFValueType.STRING) + _str(value)
    if kind == "arr":
        if not value:
            raise GGUFBridgeError(f"metadata {key}: empty arrays are not written by the runtime's tools")
        first = value[0]
        # bool before int: bool is an int subclass. Ints are INT32, which the runtime accepts for integer arrays.
        if isinstance(first, bool):
            et, body = GGUFValueType.BOOL, struct.pack(f"<{len(value)}?", *value)
        elif isinstance(first, int):
            et, body = GGUFValueType.INT32, np.asarray(value, dtype="<i4").tobytes()
        elif isinstance(first, float):
            et, body = GGUFValueType.FLOAT32, np.asarray(value, dtype="<f4").tobytes()
        elif isinstance(first, str):
            et, body = GGUFValueType.STRING, b"".join(_str(s) for s in value)
        else:
            raise GGUFBridgeError(f"metadata {key}: unsupported array element {type(first).__name__}")
        return out + struct.pack("<I", GGUFValueType.ARRAY) + struct.pack("<IQ", et, len(value)) + body
    raise GGUFBridgeError(f"metadata {key}: unknown value kind {kind!r}")


def _pad(n: int) -> int:
    return (-n) % ALIGNMENT


class _HashingFile:
    def __init__(self, f):
        self.f = f
        self.sha = hashlib.sha256()
        self.n = 0

    def write(self, b) -> None:
        mv = memoryview(b).cast("B") if not isinstance(b, bytes) else b
        self.sha.update(mv)
        self.f.write(mv)
        self.n += len(mv)


@dataclass
class Written:
    path: Path  # the temporary path until commit()
    final: Path
    nbytes: int
    sha256: str
    types: dict[str, int]  # GGML type name → tensor count

    def commit(self) -> None:
        os.replace(self.path, self.final)
        self.path = self.final

    def discard(self) -> None:
        if self.path != self.final:
            self.path.unlink(missing_ok=True)


def tmp_name(final: Path, pid: int | None = None) -> Path:
    return final.with_name(f".{final.name}.{os.getpid() if pid is None else pid}.part")


def refuse_input_as_output(dst, *inputs) -> None:
    """An output must not replace one of the command's inputs (`quantize F16.gguf -o F16.gguf` did): same path,
    or the same file through a link."""
    dst = Path(dst)
    for src in inputs:
        if src is None:
            continue
        src = Path(src)
        same = dst.resolve() == src.resolve() or (dst.exists() and src.exists() and os.path.samefile(dst, src))
        if same:
            raise OutputError(f"output {dst} is the input {src}: write the result under another name")


_PART = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.part$")


def part_pid(path: Path) -> int | None:
    """The process id in a `tmp_name()` name, or None for any other name."""
    m = _PART.match(path.name)
    return int(m["pid"]) if m else None


def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_stale_parts(folder: Path) -> list[Path]:
    """Delete temporary files in `folder` whose writer is no longer running (killed with SIGKILL, power loss).

    The pid in the name is what tells a dead writer's file from a live concurrent one's."""
    removed = []
    for p in sorted(Path(folder).iterdir()) if Path(folder).is_dir() else []:
        pid = part_pid(p)
        if pid is None or pid_alive(pid) or not p.is_file():
            continue
        p.unlink(missing_ok=True)
        log.info("removed %s, a temporary file left by process %d (no longer running)", p, pid)
        removed.append(p)
    return removed


def nonfinite_counts(arr: np.ndarray, tag: str) -> tuple[int, int]:
    """(NaN count, Inf count) of a built tensor in storage dtype `tag`; (0, 0) for integers and encoded blocks."""
    if tag == "BF16":
        bits = arr.view(np.uint16)
        special = (bits & 0x7F80) == 0x7F80  # exponent all ones
        if not special.any():
            return 0, 0
        nan = int(np.count_nonzero(special & ((bits & 0x7F) != 0)))
        return nan, int(np.count_nonzero(special)) - nan
    if tag in ("F32", "F16", "F64"):
        if arr.dtype.kind != "f":
            arr = arr.view({"F32": np.float32, "F16": np.float16, "F64": np.float64}[tag])
        finite = np.isfinite(arr)
        if finite.all():
            return 0, 0
        nan = int(np.count_nonzero(np.isnan(arr)))
        return nan, int(arr.size - np.count_nonzero(finite)) - nan
    return 0, 0


def check_finite(t: PlannedTensor, arr: np.ndarray, tag: str, allow: bool) -> None:
    nan, inf = nonfinite_counts(arr, tag)
    if not (nan or inf):
        return
    src = t.sources[0].name if t.sources else "?"
    msg = f"{t.name} (from {src}) holds {nan} NaN and {inf} Inf among {arr.size} values"
    if not allow:
        raise NonFiniteWeights(f"{msg}: refused (--allow-nonfinite writes them as they are)")
    log.warning("warning: %s; written as they are (--allow-nonfinite)", msg)


def write_gguf(plan: ConversionPlan, final: Path, outtype: str, progress=None,
               allow_nonfinite: bool = False) -> Written:
    """Write `plan` to a temporary file beside `final`. `progress(nbytes)` is called as source bytes are consumed.
    A tensor holding NaN/Inf is refused (NonFiniteWeights) unless `allow_nonfinite`."""
    if outtype not in OUTTYPES:
        raise GGUFBridgeError(f"output type must be one of {sorted(OUTTYPES)}, found {outtype!r}")
    types = [choose_type(t, outtype) for t in plan.tensors]
    names = [t.name for t in plan.tensors]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise GGUFBridgeError(f"internal: tensor {dup} planned twice")

    kvs = [_kv("general.architecture", plan.arch, "str")]
    kvs += [_kv(kv.key, kv.value, kv.kind) for kv in plan.kvs]
    kvs.append(_kv("general.alignment", ALIGNMENT, "u32"))

    infos, offset, sizes = [], 0, []
    for t, qt in zip(plan.tensors, types):
        nb = tensor_nbytes(t.shape, qt)
        sizes.append(nb)
        dims = t.shape[::-1]  # ggml order: fastest-varying first
        infos.append(_str(t.name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
                     + struct.pack("<IQ", qt, offset))
        offset += nb + _pad(nb)

    tmp = tmp_name(final)
    counts: dict[str, int] = {}
    try:
        with open(tmp, "wb") as raw:
            f = _HashingFile(raw)
            f.write(MAGIC + struct.pack("<IQQ", VERSION, len(plan.tensors), len(kvs)))
            for b in kvs + infos:
                f.write(b)
            f.write(b"\0" * _pad(f.n))
            for t, qt, nb in zip(plan.tensors, types, sizes):
                arr, tag = t.build()
                if tag != RAW and tuple(arr.shape) != tuple(t.shape):
                    raise GGUFBridgeError(f"internal: {t.name} built with shape {arr.shape}, planned {t.shape}")
                check_finite(t, arr, tag, allow_nonfinite)
                data = encode(arr, tag, qt)
                del arr
                if data.nbytes != nb:
                    raise GGUFBridgeError(f"internal: {t.name} encoded to {data.nbytes} bytes, planned {nb}")
                f.write(np.ascontiguousarray(data).reshape(-1).view(np.uint8).data)
                f.write(b"\0" * _pad(nb))
                del data
                counts[qt.name] = counts.get(qt.name, 0) + 1
                if progress:
                    progress(t.source_bytes)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        # a write error (ENOSPC, EIO) carries no file name of its own
        raise OutputError(f"cannot write {final} (as {tmp.name}): {e.strerror or e}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return Written(tmp, final, f.n, f.sha.hexdigest(), counts)

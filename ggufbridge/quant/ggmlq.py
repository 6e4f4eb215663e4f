"""llama.cpp's own quantisers, called in-process: `ggml_quantize_chunk` and the type traits' `to_float` of the
runtime's libggml-base (the library the llama_cpp bindings load), through ctypes.

`quantize --fit-bytes` measures one unit at a time with them (ggufbridge.quant.sensitivity): the bytes are the
ones llama-quantize writes for the same tensor, type and importance matrix (llama-quantize converts the source
rows to float32 with the same `to_float` and calls the same `ggml_quantize_chunk` per expert matrix with that
expert's importance row, src/llama-quant.cpp:781-830 and 1311-1353 of the pinned tree; the test compares the
two byte for byte), so the KL measured on them is llama.cpp's, without quantising the whole model per unit.
"""

from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ggufbridge.errors import QuantError


class _Traits(ctypes.Structure):
    # struct ggml_type_traits (ggml/include/ggml.h:2976-2984 of the pinned tree)
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p), ("from_float_ref", ctypes.c_void_p)]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int64)
_lock = threading.Lock()
_lib = None


def _library_path(stem: str = "libggml-base") -> Path:
    """A ggml library the bindings use: loaded by `import llama_cpp`, found in this process's maps; else the
    located runtime's."""
    import llama_cpp  # noqa: F401  (loads libllama and its ggml libraries)

    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split()[-1] if line.split() else ""
                if Path(p).name.startswith(stem + ".") and os.path.isfile(p):
                    return Path(p)
    except OSError:
        pass
    from ggufbridge.runtime.locate import locate

    p = locate().lib(stem)
    if p is None:
        raise QuantError(f"cannot find the runtime's {stem} (the quantiser --fit-bytes measures with)")
    return p


def _gpu_device() -> tuple[ctypes.CDLL, int | None]:
    """libggml and its first GPU device (GGML_BACKEND_DEVICE_TYPE_GPU, ggml/include/ggml-backend.h:134-145)."""
    L = ctypes.CDLL(str(_library_path("libggml")))
    L.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    L.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    return L, L.ggml_backend_dev_by_type(1)


def has_gpu() -> bool:
    """Whether the runtime has a GPU device. `llama_supports_gpu_offload` is no test: a CPU build with the RPC
    backend says yes."""
    return bool(_gpu_device()[1])


def gpu_memory() -> tuple[int, int] | None:
    """(free, total) bytes of the runtime's first GPU device (ggml_backend_dev_memory: cudaMemGetInfo on CUDA, the
    shared pool on a unified-memory GPU), or None without one."""
    L, dev = _gpu_device()
    if not dev:
        return None
    L.ggml_backend_dev_memory.restype = None
    L.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                          ctypes.POINTER(ctypes.c_size_t)]
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    L.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def lib() -> ctypes.CDLL:
    global _lib
    with _lock:
        if _lib is None:
            L = ctypes.CDLL(str(_library_path()))
            L.ggml_quantize_chunk.restype = ctypes.c_size_t
            L.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                              ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
            L.ggml_row_size.restype = ctypes.c_size_t
            L.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
            L.ggml_get_type_traits.restype = ctypes.POINTER(_Traits)
            L.ggml_get_type_traits.argtypes = [ctypes.c_int]
            L.ggml_quantize_init.restype = None
            L.ggml_quantize_init.argtypes = [ctypes.c_int]
            _lib = L
        return _lib


def type_id(name: str) -> int:
    try:
        return int(GGMLQuantizationType[name])
    except KeyError:
        raise QuantError(f"unknown ggml type {name!r}") from None


def row_bytes(t: str, n_per_row: int) -> int:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[t]]
    if n_per_row % block:
        raise QuantError(f"rows of {n_per_row} are not whole {t} blocks ({block})")
    return n_per_row // block * size


def _to_float_fn(t: str):
    tr = lib().ggml_get_type_traits(type_id(t)).contents
    if not tr.to_float:
        raise QuantError(f"the runtime cannot convert {t} to float")
    return _TO_FLOAT(tr.to_float)


def _chunks(n_rows: int, threads: int, n_per_row: int) -> list[tuple[int, int]]:
    # about 1M values per job: enough to keep the threads busy without one job per row
    step = max(1, min(-(-n_rows // max(1, threads)), (1 << 20) // max(1, n_per_row)))
    return [(a, min(n_rows, a + step)) for a in range(0, n_rows, step)]


class Quantiser:
    """Quantise / dequantise 2-D float32 row blocks with the runtime's routines, on `threads` threads (ctypes
    releases the GIL while ggml runs)."""

    def __init__(self, threads: int = 1):
        self.threads = max(1, threads)
        self.L = lib()
        self._pool = ThreadPoolExecutor(self.threads) if self.threads > 1 else None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _map(self, fn, jobs):
        if self._pool is None or len(jobs) < 2:
            return [fn(*j) for j in jobs]
        return list(self._pool.map(lambda j: fn(*j), jobs))

    def to_float(self, t: str, data: np.ndarray, n: int) -> np.ndarray:
        """`n` values stored as type `t` (raw bytes, C order) → float32."""
        data = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if t == "F32":
            return data.view(np.float32)[:n].copy()
        out = np.empty(n, dtype=np.float32)
        fn = _to_float_fn(t)
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[t]]
        n_blocks = n // block
        jobs = [(a, b) for a, b in _chunks(n_blocks, self.threads, block)]

        def run(a, b):
            fn(data[a * size:].ctypes.data, out[a * block:].ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
               (b - a) * block)
        self._map(run, jobs)
        return out

    def quantize(self, t: str, rows: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
        """float32 rows [n_rows, n_per_row] (one matrix: one importance row) → the type's bytes, as
        llama-quantize stores them."""
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        n_rows, n_per_row = rows.shape
        rb = row_bytes(t, n_per_row)
        out = np.empty(n_rows * rb, dtype=np.uint8)
        tid = type_id(t)
        self.L.ggml_quantize_init(tid)  # once, before the threads (ggml_quantize_chunk would do it in each)
        im = None
        if imatrix is not None:
            im = np.ascontiguousarray(imatrix, dtype=np.float32)
            if im.shape != (n_per_row,):
                raise QuantError(f"importance row of {im.shape} for rows of {n_per_row}")

        def run(a, b):
            got = self.L.ggml_quantize_chunk(tid, rows[a:].ctypes.data, out[a * rb:].ctypes.data, 0, b - a,
                                             n_per_row, im.ctypes.data if im is not None else None)
            if got != (b - a) * rb:
                raise QuantError(f"ggml_quantize_chunk({t}) wrote {got} bytes for {b - a} rows of {rb}")
        self._map(run, _chunks(n_rows, self.threads, n_per_row))
        return out

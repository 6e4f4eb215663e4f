"""Probe models whose cost follows the probed unit, not the model: llama.cpp evaluates the source with one unit's
tensors swapped for their quantised form, and nothing else is rewritten.

The source is laid out once as a *split* GGUF (the layout `gguf-split` writes and llama.cpp loads,
src/llama-model-loader.cpp:594-671 of the pinned tree): split 1 holds every KV pair of the source and every tensor
outside the units; split i + 1 holds unit i's tensors. The splits llama.cpp opens are symbolic links in one
folder (`probe-0000K-of-0000N.gguf`), each pointing at the unit's source-type file; a probe re-points one link at
that unit's quantised file (written once, from the bytes `ggufbridge.quant.ggmlq` made) and loads the model
again: the mapped source pages stay in the page cache, only the unit's pages are new. The model llama.cpp builds
is the one a whole-model llama-quantize with the same per-tensor types would write (same types, same bytes), so
its logits are the same (tests/test_quant_probe.py compares the two KLs).

With a runtime that can write a loaded weight (`llama_model_set_tensor_data`, patch
0029-llama-ext-model-tensor-set of our series), the probes do not reload at all (`ResidentModel`): the source is
loaded once, with its weights in writable memory, and a probe writes its unit's values into it, as llama.cpp's
quantiser makes them and its dequantiser reads them back, in the source's own type (BF16/F16/F32), then writes the
source's bytes back. A probe then costs its unit's upload (at most ~1 GB for the 35B-A3B's experts of one layer),
not the whole model's (69 GB on a GPU, 11-31 s a probe by the H200's figures, docs/quant.md). The values differ
from the quantised tensor's only by their rounding to the source type (≤ 2^-9 relative for BF16, against a probe
type's ~10%), and the matrix product runs on the source type's kernel instead of the quantised type's: the KL
agrees with the split layout's to well within the probes' spread (tests/test_quant_probe.py measures how close).

The evaluation reuses what does not change between probes: the tokenised calibration rows and the reference
(a `dump-logits` file, opened once). KL is computed by the same code as `ggufbridge compare`.
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from pathlib import Path

import numpy as np
from gguf import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUFValueType

from ggufbridge.errors import QuantError
from ggufbridge.ggufio.reader import GGUFHeader, TensorInfo, read_header
from ggufbridge.ggufio.writer import _str
from ggufbridge.quant import types as qt
from ggufbridge.quant.classes import BLOCK

SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"
_COPY = 64 << 20  # bytes per read when copying source tensors


def _kv_u16(key: str, v: int) -> bytes:
    return _str(key) + struct.pack("<IH", GGUFValueType.UINT16, v)


def _kv_i32(key: str, v: int) -> bytes:
    return _str(key) + struct.pack("<Ii", GGUFValueType.INT32, v)


def _kv_u32(key: str, v: int) -> bytes:
    return _str(key) + struct.pack("<II", GGUFValueType.UINT32, v)


def _info_bytes(name: str, shape, type_id: int, offset: int) -> bytes:
    return _str(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape) + struct.pack(
        "<IQ", type_id, offset)


def _kv_section(h: GGUFHeader) -> tuple[int, bytes]:
    """(count, raw bytes) of the source's KV pairs: copied verbatim into split 1 (vocabulary and all)."""
    infos = sum(len(_info_bytes(t.name, t.shape, 0, 0)) for t in h.tensors)
    start, end = 24, h.header_end - infos
    with open(h.path, "rb") as f:
        head = f.read(24)
        magic, version, n_tensors, n_kv = struct.unpack("<IIQQ", head)
        if magic != GGUF_MAGIC or version != 3 or n_tensors != len(h.tensors):
            raise QuantError(f"{h.path}: not a little-endian GGUF v3 file (the sensitivity pass copies its header)")
        f.seek(start)
        raw = f.read(end - start)
    if any("\ufffd" in t.name for t in h.tensors) or len(raw) != end - start:
        raise QuantError(f"{h.path}: tensor names that are not UTF-8; the sensitivity pass cannot copy its header")
    return n_kv, raw


def _pad(n: int, align: int) -> int:
    return (-n) % align


def _write_split(path: Path, *, kv_raw: bytes, n_kv: int, idx: int, count: int, n_tensors_total: int,
                 tensors: list[tuple[str, tuple[int, ...], int, object]], align: int) -> None:
    """One split file. `tensors`: (name, ggml shape, ggml type id, data) where data is a numpy uint8 array or a
    callable writing the bytes to a file object."""
    kv = kv_raw + _kv_u16(SPLIT_NO, idx) + _kv_u16(SPLIT_COUNT, count) + _kv_i32(SPLIT_TENSORS, n_tensors_total)
    n_kv += 3
    if idx > 0 and align != GGUF_DEFAULT_ALIGNMENT:
        kv += _kv_u32("general.alignment", align)
        n_kv += 1
    _write_gguf(path, kv=kv, n_kv=n_kv, tensors=tensors, align=align)


def _write_gguf(path: Path, *, kv: bytes, n_kv: int, tensors: list[tuple[str, tuple[int, ...], int, object]],
                align: int) -> None:
    """A GGUF v3 file from raw KV bytes and `tensors` (as `_write_split`), written under a temporary name first."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    infos, offset, sizes = [], 0, []
    for name, shape, tid, _ in tensors:
        block, bsize = GGML_QUANT_SIZES[GGMLQuantizationType(tid)]
        n = int(np.prod(shape)) // block * bsize
        infos.append(_info_bytes(name, shape, tid, offset))
        sizes.append(n)
        offset += n + _pad(n, align)
    head = struct.pack("<IIQQ", GGUF_MAGIC, 3, len(tensors), n_kv) + kv + b"".join(infos)
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(head + b"\0" * _pad(len(head), align))
        for (name, _, _, data), n in zip(tensors, sizes):
            if callable(data):
                data(f)
            else:
                b = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
                if b.size != n:
                    raise QuantError(f"internal: {name} has {b.size} bytes, its type needs {n}")
                f.write(memoryview(b))
            f.write(b"\0" * _pad(n, align))
    os.replace(tmp, path)


def _twin_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    # 2 wherever the source has more than 1: ggml_n_dims (the dims llama-quantize writes for a tensor,
    # ggml/src/gguf.cpp gguf_write_to_buf) counts up to the last axis > 1, so the twin's tensor table is as long
    return tuple(2 if d > 1 else 1 for d in shape)


def write_header_twin(h: GGUFHeader, path: Path) -> None:
    """A GGUF with `h`'s KV section byte for byte and its tensors (names, types, number of dims) at 2 elements per
    axis, zeros: llama-quantize writes the same header for it as for the source (it copies the KVs and lists every
    tensor with its name, dims, type and offset; no key depends on the data), in a fraction of a second instead of
    a copy of the source (69 GB for the 35B-A3B) only to read that header back. Tensors keep their (unquantised)
    types, whose block is one element. Checked against a real output in tests/test_quant_probe.py."""
    from gguf import GGMLQuantizationType

    n_kv, kv = _kv_section(h)
    if SPLIT_COUNT in h.kv:
        raise QuantError(f"{h.path}: one part of a split GGUF; join it first (`ggufbridge quantize {h.path} -o "
                         "ONE.gguf --quant BF16`)")
    align = int(h.kv.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))
    tensors = []
    for t in h.tensors:
        if qt.block_size(t.type) != 1:
            raise QuantError(f"{h.path}: {t.name} is stored as {t.type}; the header is measured on unquantised "
                             "sources")
        shape = _twin_shape(t.shape)
        tensors.append((t.name, shape, int(GGMLQuantizationType[t.type]), np.zeros(qt.nbytes(t.type, shape), np.uint8)))
    _write_gguf(path, kv=kv, n_kv=n_kv, tensors=tensors, align=align)


def _copier(src: Path, start: int, n: int):
    def write(f):
        with open(src, "rb") as s:
            s.seek(start)
            left = n
            while left:
                b = s.read(min(_COPY, left))
                if not b:
                    raise QuantError(f"{src}: truncated tensor data")
                f.write(b)
                left -= len(b)
    return write


def _split_name(folder: Path, i: int, n: int) -> Path:
    return folder / f"probe-{i + 1:05d}-of-{n:05d}.gguf"  # llama_split_path's pattern (src/llama.cpp)


class ProbeModel:
    """The split layout of `src` for the units (unit → its tensor names), in `folder`."""

    def __init__(self, src: Path, units: dict[str, list[str]], folder: Path):
        from gguf import GGMLQuantizationType

        self.src, self.folder = Path(src), Path(folder)
        self.header = h = read_header(src)
        self.units = list(units)
        self.unit_tensors = {u: list(ts) for u, ts in units.items()}
        self.n = len(self.units) + 1
        if self.n > 65535:
            raise QuantError(f"{len(self.units)} units: more than a split GGUF can hold")
        self.align = int(h.kv.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))
        self.n_kv, self.kv_raw = _kv_section(h)
        self._tid = lambda t: int(GGMLQuantizationType[t])
        self.folder.mkdir(parents=True, exist_ok=True)
        self.main = _split_name(self.folder, 0, self.n)

    def _source_file(self, i: int) -> Path:
        return self.folder / f"unit-{i:05d}.src.gguf"

    def probe_file(self, unit: str) -> Path:
        return self.folder / f"unit-{self.units.index(unit) + 1:05d}.probe.gguf"

    def _info(self, name: str) -> TensorInfo:
        return self.header.tensor(name)

    def _source_tensors(self, names) -> list:
        h = self.header
        return [(n, tuple(h.tensor(n).shape), self._tid(h.tensor(n).type),
                 _copier(h.path, h.data_start + h.tensor(n).offset, h.tensor(n).nbytes)) for n in names]

    def build(self) -> None:
        """Write split 1 and each unit's source-type split (skipped where a complete one is there: a resumed run)
        and point every link at the source."""
        in_units = {n for ts in self.unit_tensors.values() for n in ts}
        total = len(self.header.tensors)
        rest = [t.name for t in self.header.tensors if t.name not in in_units]
        main_data = self.folder / "main.gguf"
        if not main_data.is_file():
            _write_split(main_data, kv_raw=self.kv_raw, n_kv=self.n_kv, idx=0, count=self.n, n_tensors_total=total,
                         tensors=self._source_tensors(rest), align=self.align)
        self._link(self.main, main_data)
        for i, u in enumerate(self.units, start=1):
            f = self._source_file(i)
            if not f.is_file():
                _write_split(f, kv_raw=b"", n_kv=0, idx=i, count=self.n, n_tensors_total=total,
                             tensors=self._source_tensors(self.unit_tensors[u]), align=self.align)
            self._link(_split_name(self.folder, i, self.n), f)

    def write_probe(self, unit: str, data: dict[str, tuple[str, np.ndarray]]) -> Path:
        """Unit's split with each tensor as (type, bytes)."""
        i = self.units.index(unit) + 1
        ts = [(n, tuple(self._info(n).shape), self._tid(data[n][0]), data[n][1]) for n in self.unit_tensors[unit]]
        path = self.probe_file(unit)
        _write_split(path, kv_raw=b"", n_kv=0, idx=i, count=self.n, n_tensors_total=len(self.header.tensors),
                     tensors=ts, align=self.align)
        return path

    @staticmethod
    def _link(link: Path, target: Path) -> None:
        tmp = link.with_name(link.name + ".lnk")
        tmp.unlink(missing_ok=True)
        os.symlink(target.name, tmp)
        os.replace(tmp, link)

    @contextlib.contextmanager
    def swapped(self, unit: str, path: Path | None = None):
        """The model with `unit` read from `path` (default its probe file); the link is restored after."""
        i = self.units.index(unit) + 1
        link = _split_name(self.folder, i, self.n)
        self._link(link, path or self.probe_file(unit))
        try:
            yield self.main
        finally:
            self._link(link, self._source_file(i))


# ------------------------------------------------------------------------------- probes in the loaded model


def set_tensor_fn():
    """The runtime's `llama_model_set_tensor_data` (patch 0029-llama-ext-model-tensor-set), or None: a runtime
    without the patch (built elsewhere) measures with the split layout instead."""
    import ctypes

    from ggufbridge.quant.ggmlq import _library_path

    try:
        f = ctypes.CDLL(str(_library_path("libllama"))).llama_model_set_tensor_data
    except (AttributeError, OSError, QuantError):
        return None
    f.restype = ctypes.c_int32
    f.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
    return f


_SET_ERRORS = {-1: "the model has no such tensor", -2: "the size is not the tensor's",
               -3: "the tensor is read from a memory-mapped file"}


def probe_values(q, header: GGUFHeader, kept: dict[str, tuple[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """A probe's tensors ({name: (type, bytes)} as `unit_errors` keeps them) in their source types: dequantised
    by llama.cpp's `to_float` of their type, then stored as the source stores them (ggml's own F16/BF16 rounding,
    `ggml_quantize_chunk`)."""
    out = {}
    for n, (t, data) in kept.items():
        info = header.tensor(n)
        f = q.to_float(t, data, info.n_elements)
        out[n] = f.view(np.uint8) if info.type == "F32" else q.quantize(info.type, f.reshape(-1, info.shape[0]))
    return out


class ResidentModel:
    """The source loaded once, its weights in writable memory (`use_mmap = False`: llama.cpp maps a file read-only);
    `swapped` writes a probe's tensors into it and the source's bytes back after."""

    def __init__(self, src: Path, *, ctx: int, chunk: int, n_gpu_layers: int, threads: int | None):
        from ggufbridge.compare.sources import GGUFSource

        self._set = set_tensor_fn()
        if self._set is None:
            raise QuantError("this runtime cannot write a loaded weight (llama_model_set_tensor_data): build it "
                             "with `ggufbridge build-runtime`")
        self.header = read_header(src)
        self.source = GGUFSource(Path(src), n_ctx=ctx, chunk=chunk, n_gpu_layers=n_gpu_layers, n_threads=threads,
                                 use_mmap=False)
        self._model = self.source.llm._model.model

    def write(self, name: str, data: np.ndarray) -> None:
        b = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        rc = self._set(self._model, name.encode(), b.ctypes.data, b.size)
        if rc != 0:
            raise QuantError(f"cannot write {name} into the loaded model: {_SET_ERRORS.get(rc, rc)}")

    def restore(self, name: str) -> None:
        self.write(name, np.asarray(self.header.tensor_data(name)))

    @contextlib.contextmanager
    def swapped(self, values: dict[str, np.ndarray]):
        """The loaded model with `values` ({name: bytes in the tensor's source type}); restored after, also when
        the evaluation fails (a resumed run's next probe must see the source)."""
        written = []
        try:
            for n, v in values.items():
                self.write(n, v)
                written.append(n)
            yield self.source
        finally:
            for n in written:
                self.restore(n)

    def close(self) -> None:
        self.source.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# of the GPU's free memory, kept for what is not weights: the compute buffers (a 256-token chunk's logits over
# 248,144 entries alone are 0.25 GB), the calibration rows' KV cache and recurrent state, and other processes' growth
GPU_RESERVE = 2 << 30
GPU_RESERVE_SHARE = 0.05


def _layer_bytes(header: GGUFHeader) -> tuple[list[int], int]:
    """(weight bytes of each block and, last, of the output layer; of the input layer, the token embedding)."""
    blocks: dict[int, int] = {}
    output = inputs = 0
    for t in header.tensors:
        m = BLOCK.match(t.name)
        if m:
            blocks[int(m[1])] = blocks.get(int(m[1]), 0) + t.nbytes
        elif t.name.startswith("token_embd"):
            inputs += t.nbytes
        else:  # output.weight, output_norm.weight
            output += t.nbytes
    n_layer = max(blocks) + 1 if blocks else 0
    return [blocks.get(i, 0) for i in range(n_layer)] + [output], inputs


def _host_bytes(per: list[int], inputs: int, n_gpu_layers: int) -> int:
    from ggufbridge.runtime.memory import offloaded

    ngl = len(per) if n_gpu_layers < 0 else n_gpu_layers
    return inputs + sum(b for b, gpu in zip(per, offloaded(len(per) - 1, ngl)) if not gpu)


def host_bytes(header: GGUFHeader, n_gpu_layers: int) -> int:
    """Weight bytes that stay in host memory when `header`'s model is loaded with `n_gpu_layers` (-1: all)."""
    return _host_bytes(*_layer_bytes(header), n_gpu_layers)


def gpu_layers(header: GGUFHeader | None = None) -> int:
    """How many layers the measurement offloads: 0 without a GPU device (CUDA, Metal, ...); -1 (all) when the
    weights fit the GPU's free memory less a reserve (or without a header); else as many as fit, counted as
    llama.cpp counts them, the output layer first and then the last blocks (ggufbridge.runtime.memory.offloaded):
    a 24 GB RTX 4090 holds ~11 of the 35B-A3B's 40 BF16 blocks, where offloading all of them could not load."""
    from ggufbridge.quant.ggmlq import gpu_memory

    mem = gpu_memory()
    if mem is None:
        return 0
    if header is None:
        return -1
    free, total = mem
    room = free - GPU_RESERVE - int(GPU_RESERVE_SHARE * total)
    per, inputs = _layer_bytes(header)
    weights = sum(per) + inputs
    for ngl in range(len(per), 0, -1):
        if weights - _host_bytes(per, inputs, ngl) <= room:
            return -1 if ngl == len(per) else ngl
    return 0


class Evaluator:
    """KL of models against one reference on fixed calibration rows; the rows and the reference stay open."""

    def __init__(self, ref_spec: str, rows, ctx: int, n_gpu_layers: int | None = None, threads: int | None = None):
        from ggufbridge.compare.run import default_chunk
        from ggufbridge.compare.sources import open_source

        self.rows, self.ctx = rows, ctx
        self._stack = contextlib.ExitStack()
        self.ref = self._stack.enter_context(open_source(ref_spec, n_ctx=ctx, chunk=ctx))
        self.chunk = default_chunk(self.ref.vocab_size, ctx)
        self.n_gpu_layers = gpu_layers() if n_gpu_layers is None else n_gpu_layers
        self.threads = threads
        check = getattr(self.ref, "check_rows", None)
        if check is not None:
            check(rows)
        self.last_timing: dict[str, float] = {}

    def kl(self, model, rows=None) -> float:
        """Mean KL(reference → model) over the rows (the first `rows` of them when given), as compare reports it.
        `model`: a GGUF file (loaded for this pass) or a source already open (a `ResidentModel`'s)."""
        from ggufbridge.compare.run import _compare_one
        from ggufbridge.compare.sources import GGUFSource

        rows = self.rows if rows is None else self.rows[:rows]
        t0 = time.perf_counter()
        with contextlib.ExitStack() as stack:
            if isinstance(model, (str, os.PathLike)):
                cand = stack.enter_context(GGUFSource(Path(model), n_ctx=self.ctx, chunk=self.chunk,
                                                      n_gpu_layers=self.n_gpu_layers, n_threads=self.threads))
            else:
                cand = model
            t1 = time.perf_counter()
            if cand.vocab_size != self.ref.vocab_size:
                raise QuantError(f"{cand.spec}: vocabulary of {cand.vocab_size}, the reference has "
                                 f"{self.ref.vocab_size}")
            acc = _compare_one(self.ref, cand, rows, self.chunk, False, "probe", self.threads)
        t2 = time.perf_counter()
        self.last_timing = {"load_s": t1 - t0, "eval_s": t2 - t1, "tokens": sum(len(r.ids) for r in rows)}
        return float(acc.summary()["kl_mean"])

    def close(self) -> None:
        self._stack.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

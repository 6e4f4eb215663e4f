"""How much KL each part of a model adds when it is stored at each llama.cpp type: the measurement behind
`quantize --fit-bytes`.

A *unit* is what the allocator gives one type: a tensor class in one layer, with the routed experts' gate/up and
down projections separate (`experts_down@3`), plus the embeddings and the head. For a unit u and a type t the
added KL is modelled as

    ΔKL(u, t) = s_u · E_u(t)

where E_u(t) is the squared error the pinned quantiser really makes on u's weights at t (every candidate type is
applied to the whole model once by llama-quantize, with the same importance matrix, and read back), and s_u, the
unit's sensitivity, is measured: the model with only u quantised at the probe type, every other tensor as stored
in the source, is run by llama.cpp on the calibration rows and compared with the reference logits (KL mean minus
the unquantised source's own KL). For small perturbations KL is quadratic in the logit change and that change is
linear in the weight error, so KL grows with the error's energy; summing ΔKL over units treats the units'
errors as independent (they are: different weights, independent rounding).

Everything lands in a work folder keyed by what was measured, so a second `--fit-bytes` at another budget reuses
it (`sensitivity.json`) and only allocates.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import resource
import shutil
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ggufbridge.native import quiet_native
from ggufbridge.errors import QuantError
from ggufbridge.ggufio.reader import GGUFHeader, read_header
from ggufbridge.quant import types as qt
from ggufbridge.quant.classes import BLOCK, classify
from ggufbridge.quant.filesize import HeaderModel
from ggufbridge.quant.mix import KEPT_TYPE, Mix
from ggufbridge.units import human_size

log = logging.getLogger(__name__)

# Types the allocator chooses from (all of them quantise without an importance matrix); with one, the 2-bit
# and IQ3_XXS types join.
CANDIDATE_TYPES = ("Q2_K", "Q3_K", "IQ3_S", "IQ4_XS", "Q4_K", "Q5_K", "Q6_K", "Q8_0")
IMATRIX_TYPES = ("IQ2_XS", "IQ2_S", "IQ3_XXS")
PROBE_TYPE = "Q3_K"  # coarse enough that one unit's KL stands clear of the eval noise
FORMAT = 2  # 2: probes of one unit in a split layout, errors from ggml in-process
# llama-quantize type argument for a mix whose bytes are mostly this tensor type (general.file_type)
FILE_TYPE_OF = {"Q2_K": "Q2_K", "Q3_K": "Q3_K_M", "IQ3_S": "IQ3_S", "IQ3_XXS": "IQ3_XXS", "IQ2_XS": "IQ2_XS",
                "IQ2_S": "IQ2_M", "IQ4_XS": "IQ4_XS", "IQ4_NL": "IQ4_NL", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M",
                "Q6_K": "Q6_K", "Q8_0": "Q8_0"}


def unit_of(tensor: str) -> str | None:
    """The unit a tensor belongs to (None: never quantised)."""
    c = classify(tensor)
    if c.kept or c.name == "other":
        return None
    m = BLOCK.match(tensor)
    return f"{c.name}@{m.group(1)}" if m else c.name


def units_of(header: GGUFHeader) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for t in header.tensors:
        u = unit_of(t.name)
        if u is not None:
            out.setdefault(u, []).append(t.name)
    return out


def source_types(header: GGUFHeader) -> dict[str, str]:
    """The unquantised type each quantisable tensor keeps when it is not being probed."""
    return {t.name: t.type for t in header.tensors if unit_of(t.name) is not None}


def exact_mix(name: str, header: GGUFHeader, tensors: dict[str, str], file_type: str = "Q8_0") -> Mix:
    """A recipe naming every quantisable tensor's type (class defaults are placeholders, all overridden)."""
    from ggufbridge.quant.classes import CLASSES

    types = {c.name: (KEPT_TYPE if c.kept else "Q8_0") for c in CLASSES}
    return Mix(name=name, description="", file_type=file_type, types=types, source="generated",
                       tensors=dict(tensors))


@dataclass
class Sensitivity:
    source: str
    key: str
    reference: str
    calibration: str
    n_tokens: int
    probe_type: str
    types: list[str]
    base_kl: float  # the unquantised source against the reference
    units: dict[str, dict]  # unit → {"tensors": [...], "probe_kl": float, "error": {type: float}}
    shapes: dict[str, list[int]]
    source_types: dict[str, str]
    all_types: dict[str, str]  # every tensor of the source, as stored
    header: dict  # HeaderModel fields, measured on a quantised output of this source
    imatrix: str | None = None
    timings: dict = field(default_factory=dict)

    def header_model(self) -> HeaderModel:
        return HeaderModel(**self.header)

    def sensitivity(self, unit: str) -> float:
        u = self.units[unit]
        err = u["error"][self.probe_type]
        return max(u["probe_kl"] - self.base_kl, 0.0) / err if err > 0 else 0.0

    def added_kl(self, unit: str, t: str) -> float:
        """Predicted ΔKL of storing `unit` at type `t`."""
        return self.sensitivity(unit) * self.units[unit]["error"][t]

    def to_json(self) -> dict:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, d: dict) -> "Sensitivity":
        d = {k: v for k, v in d.items() if k != "format"}
        return cls(**d)


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(str(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _file_id(path: Path) -> str:
    from ggufbridge.compare.run import fingerprint

    return fingerprint(f"gguf:{path}")


def _tokenizer(src: Path):
    from llama_cpp import Llama

    with quiet_native():
        llm = Llama(str(src), vocab_only=True, verbose=False)
    return llm, (lambda text: list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)))


def calibration_rows(src: Path, calibration, ctx: int, max_rows: int | None):
    """The calibration set as eval rows (a .jsonl eval set, or a text file cut into rows of `ctx` tokens)."""
    from ggufbridge.compare import evalset

    calibration = Path(calibration)
    if not calibration.is_file():
        raise QuantError(f"calibration set {calibration} does not exist")
    llm, tok = _tokenizer(src)
    try:
        if calibration.suffix == ".jsonl":
            rows = evalset.load_rows(eval_path=calibration, ctx=ctx, tokenize=tok)
        else:
            rows = evalset.load_rows(text_path=calibration, ctx=ctx, tokenize=tok)
    finally:
        llm.close()
    return rows[:max_rows] if max_rows else rows


MIN_TOKENS = 16  # fewer calibration tokens than this measure noise, not the units
# tokens the cost estimate times a pass on: at least two chunks, so that the first chunk's warm-up (once per pass)
# and the rate per token are told apart (_pass_rates)
CALIBRATION_TOKENS = 384


def first_tokens(rows, n: int | None):
    """The first `n` tokens of the calibration rows (the last row kept cut short); all of them when n is None."""
    from ggufbridge.compare.evalset import Row

    if n is None:
        return rows
    out, left = [], n
    for r in rows:
        if left <= 0:
            break
        out.append(r if len(r.ids) <= left else Row(tuple(r.ids[:left]), r.kind, None))
        left -= len(r.ids)
    return out


def _peak_rss_mib() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) / 1024  # kB on Linux



# ------------------------------------------------------------------------------------------ one unit, in-process

SLAB = 1 << 22  # source weights converted to float32 at a time (16 MiB): memory stays flat for any tensor
# weights of a tensor quantised at every candidate type (the probe type sees all): 512 blocks of 256. At
# ~4 µs per weight for the eight types together (IQ3_S alone ~2 µs), the full tensors would cost more than every
# probe together; the per-type mean error of 512 blocks is within a few per cent (test_quant_probe).
ERROR_SAMPLE = 1 << 17


def importance(imatrix) -> dict[str, np.ndarray]:
    """Per weight tensor, its importance rows [matrices, inputs] as llama-quantize loads them (sums / count; a
    matrix that saw no token gets 1, tools/quantize/quantize.cpp:196-215)."""
    if imatrix is None:
        return {}
    from ggufbridge.quant.coverage import read_entries

    out = {}
    for name, e in read_entries(imatrix)[0].items():
        c = e.counts.astype(np.float32).reshape(-1, 1)
        out[name] = np.where(c > 0, e.sums.astype(np.float32) / np.where(c > 0, c, 1), np.float32(1))
    return out


def _slabs(header: GGUFHeader, name: str):
    """(matrix index, first row, raw rows [r, row bytes]) of a 2-D or stacked 3-D tensor, SLAB weights at a time."""
    t = header.tensor(name)
    blocks = header.tensor_blocks(t)
    mats = blocks.reshape(-1, *blocks.shape[-2:]) if blocks.ndim >= 3 else blocks.reshape(1, *blocks.shape[-2:])
    step = max(1, SLAB // t.shape[0])
    for m in range(mats.shape[0]):
        for a in range(0, mats.shape[1], step):
            yield m, a, mats[m, a:a + step]


def _sample_plan(shape, sample: int) -> list[tuple[int, slice]]:
    """About `sample` weights of a tensor of ggml `shape` as (matrix index, row slice): spread evenly over its
    matrices (experts) and rows, the same rows for every type, so the types' errors are compared on equal terms."""
    n_per_row, n_rows = shape[0], shape[1]
    n_mat = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    want = max(1, sample // n_per_row)  # rows in all
    mat_step = max(1, n_mat // want)
    mats = range(0, n_mat, mat_step)
    per = max(1, want // len(mats))
    step = max(1, n_rows // per)
    return [(m, slice(0, step * per, step)) for m in mats]


def _sample_rows(header: GGUFHeader, name: str, sample: int):
    t = header.tensor(name)
    blocks = header.tensor_blocks(t)
    mats = blocks.reshape(-1, *blocks.shape[-2:]) if blocks.ndim >= 3 else blocks.reshape(1, *blocks.shape[-2:])
    for m, rows in _sample_plan(t.shape, sample):
        yield m, np.asarray(mats[m, rows])


def unit_errors(q, header: GGUFHeader, names: list[str], types, keep: str | None = None,
                imatrix: dict[str, np.ndarray] | None = None, sample: int | None = None):
    """Squared error (summed over the unit's weights) of every type, each tensor quantised by llama.cpp's own
    routine as llama-quantize would (row-length fallback included), and the bytes of type `keep` per tensor
    ({name: (final type, bytes)}) for the probe.

    With `sample`, a tensor larger than that is quantised at every type on about `sample` of its weights (rows
    spread over its experts), and only at `keep` in full: a type's error is then the sampled error scaled by
    the ratio of `keep`'s full error to its sampled one (without `keep`: by the weights' ratio). The error of a
    block depends on the block alone, so a few hundred blocks estimate a type's mean error to a few per cent."""
    from ggufbridge.quant.ggmlq import row_bytes

    err = {t: 0.0 for t in types}
    kept: dict[str, tuple[str, np.ndarray]] = {}

    def sq(t, f, im):
        b = q.quantize(t, f, im)
        d = q.to_float(t, b, f.size)
        d -= f.reshape(-1)
        return float(np.dot(d, d)), b

    for n in names:
        info = header.tensor(n)
        n_per_row = info.shape[0]
        final = {t: qt.fit_row(t, n_per_row) for t in types}
        im = (imatrix or {}).get(n)
        if im is not None and im.size != n_per_row * (info.shape[2] if len(info.shape) > 2 else 1):
            im = None  # llama-quantize refuses this, except for token_embd; the planner's check is its own

        if im is None and any(final[t] in qt.NEEDS_IMATRIX for t in types):
            # ggml_quantize_chunk aborts the process without one (ggml.c: GGML_ASSERT(imatrix != NULL)), and
            # llama-quantize refuses the tensor: those types are no option for this unit
            types = [t for t in types if final[t] not in qt.NEEDS_IMATRIX]
            for t in [t for t in err if t not in types]:
                err.pop(t)

        def rows_f32(raw):
            return q.to_float(info.type, np.asarray(raw), raw.shape[0] * n_per_row).reshape(raw.shape[0], n_per_row)

        full = sample is None or info.n_elements <= sample
        full_types = list(types) if full else ([keep] if keep is not None else [])
        tensor_err = {t: 0.0 for t in full_types}
        parts = []
        for m, _, raw in _slabs(header, n) if full_types else ():
            f = rows_f32(raw)
            for t in full_types:
                e, b = sq(final[t], f, None if im is None else im[m])
                tensor_err[t] += e
                if t == keep:
                    parts.append(b)
        if not full:
            part = {t: 0.0 for t in types}
            n_sampled = 0
            for m, raw in _sample_rows(header, n, sample):
                f = rows_f32(raw)
                n_sampled += f.size
                for t in types:
                    part[t] += sq(final[t], f, None if im is None else im[m])[0]
            if keep is not None and part[keep] > 0:
                scale = tensor_err[keep] / part[keep]
            else:
                scale = info.n_elements / n_sampled
            for t in types:
                tensor_err[t] = tensor_err[keep] if t == keep else part[t] * scale
        for t in types:
            err[t] += tensor_err[t]
        if keep is not None:
            data = np.concatenate(parts) if len(parts) > 1 else parts[0]
            assert data.size == row_bytes(final[keep], n_per_row) * (info.n_elements // n_per_row)
            kept[n] = (final[keep], data)
    return err, kept


def sampled_weights(header: GGUFHeader, names, sample: int | None) -> int:
    """Weights `unit_errors` quantises at every type (the rest only at the probe type)."""
    total = 0
    for n in names:
        info = header.tensor(n)
        if sample is None or info.n_elements <= sample:
            total += info.n_elements
        else:
            total += sum(len(range(info.shape[1])[rows]) * info.shape[0] for _, rows in _sample_plan(info.shape,
                                                                                                     sample))
    return total


# ---------------------------------------------------------------------------------------------- measurements


class Measurements:
    """`measurements.jsonl` in the measurement's folder: one line per finished step, appended and flushed as each
    finishes, so an interrupted run resumes from them (the folder is keyed by source, rows, reference, imatrix,
    types and probe type: nothing else can have written it)."""

    def __init__(self, path: Path):
        self.path = path
        self.base: float | None = None
        self.units: dict[str, dict] = {}
        if path.is_file():
            for line in path.read_text(errors="replace").splitlines():
                try:
                    d = json.loads(line)
                except ValueError:
                    continue  # the line a killed run was writing
                if not isinstance(d, dict):
                    continue
                if d.get("kind") == "base" and isinstance(d.get("kl"), (int, float)):
                    self.base = float(d["kl"])
                elif (d.get("kind") == "unit" and isinstance(d.get("unit"), str)
                      and isinstance(d.get("probe_kl"), (int, float)) and isinstance(d.get("error"), dict)):
                    self.units[d["unit"]] = {"probe_kl": float(d["probe_kl"]),
                                             "error": {str(k): float(v) for k, v in d["error"].items()}}

    def add(self, d: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(d) + "\n")
            f.flush()
            os.fsync(f.fileno())


# ------------------------------------------------------------------------------------------------ calibration


def _time_copy(src: GGUFHeader, work: Path) -> float:
    """Seconds per byte to copy source tensor data into the work folder (64 MiB, or the whole data if smaller)."""
    n = min(64 << 20, src.file_bytes - src.data_start)
    tmp = work / "copy-timing.part"
    t0 = time.perf_counter()
    with open(src.path, "rb") as f, open(tmp, "wb") as g:
        f.seek(src.data_start)
        g.write(f.read(n))
    dt = time.perf_counter() - t0
    tmp.unlink(missing_ok=True)
    return dt / max(1, n)


def _time_pass(src: Path, rows, ctx: int, n_gpu_layers: int, threads: int, resident: bool = False,
               tensor: str | None = None) -> tuple[float, float, float, float]:
    """(load seconds, seconds per token, of which the KL's share, seconds per byte to write a loaded weight) of
    one llama.cpp pass over calibration rows with the KL against a top-K reference, timed on the source over its
    first CALIBRATION_TOKENS tokens (a second load: the first one may read the file from disk). `resident`: loaded
    as the probes' resident model is (no mmap), and the write of `tensor` (its own bytes, twice) timed on it."""
    from ggufbridge.compare.metrics import chunk_stats_threaded, default_threads, topk_form
    from ggufbridge.compare.run import default_chunk
    from ggufbridge.compare.sources import GGUFSource
    from ggufbridge.quant.probe import ResidentModel

    def load():
        t0 = time.perf_counter()
        if resident:
            r = ResidentModel(src, ctx=ctx, chunk=ctx, n_gpu_layers=n_gpu_layers, threads=threads)
            return r, r.source, time.perf_counter() - t0
        s = GGUFSource(src, n_ctx=ctx, chunk=ctx, n_gpu_layers=n_gpu_layers, n_threads=threads)
        return s, s, time.perf_counter() - t0

    owner, _, _ = load()
    owner.close()
    owner, s, load_s = load()
    set_byte_s = 0.0
    # the probes' KL runs on a pool of host threads (compare.run._compare_one): timed the same way
    pool = ThreadPoolExecutor(threads or default_threads(), thread_name_prefix="kl")
    parts = []  # per chunk: (model seconds, KL seconds, positions)
    try:
        chunk = default_chunk(s.vocab_size, ctx)
        rng = np.random.default_rng(0)
        for i, row in enumerate(first_tokens(rows, CALIBRATION_TOKENS)):
            pos, t0 = 0, time.perf_counter()
            for c in s.chunks(i, row, chunk):
                t1 = time.perf_counter()
                labels = row.labels[pos:pos + c.n]
                ref = topk_form(c.logits, 64, labels, 32, rng)  # a probe reads this from the dump instead
                t2 = time.perf_counter()
                chunk_stats_threaded(ref, c, labels, pool)
                t3 = time.perf_counter()
                parts.append((t1 - t0, t3 - t2, c.n))
                pos, t0 = pos + c.n, t3
        if resident and tensor is not None:
            data = np.ascontiguousarray(owner.header.tensor_data(tensor))  # read once: the write alone is timed
            owner.write(tensor, data)
            t0 = time.perf_counter()
            owner.write(tensor, data)
            set_byte_s = (time.perf_counter() - t0) / max(1, data.nbytes)
    finally:
        pool.shutdown()
        owner.close()
    return (*_pass_rates(load_s, parts), set_byte_s)


def _pass_rates(load_s: float, parts) -> tuple[float, float, float]:
    """(seconds per pass before its first token, per token, of which the KL) from per-chunk timings of one pass.

    A freshly loaded model's first chunk carries a one-off warm-up (a GPU's kernels, graphs and cuBLAS handles:
    ~0.4 s on an H200, where a token costs ~1 ms), and every probe loads a fresh model: so the warm-up is a cost
    per pass, not per token. Counted per token over a 128-token calibration it made an H200's estimate 1.8× the
    measured time at 4 layers (docs/quant.md). The rate comes from the chunks after the first; the first
    chunk's excess over that rate is added to the load. With one chunk only, the warm-up stays in the rate."""
    n = max(1, sum(p[2] for p in parts))
    kl = sum(p[1] for p in parts) / n
    if len(parts) < 2:
        return load_s, sum(p[0] + p[1] for p in parts) / n, kl
    rest = parts[1:]
    m = sum(p[2] for p in rest)
    rate = sum(p[0] + p[1] for p in rest) / m
    first = parts[0][0] + parts[0][1]
    return load_s + max(0.0, first - parts[0][2] * rate), rate, sum(p[1] for p in rest) / m


def _time_quantisation(q, header: GGUFHeader, units: dict[str, list[str]], types, probe_type: str) -> dict:
    """Seconds per weight, each on slabs of the largest tensor (at least 4 M weights and 1 M per thread, after one
    untimed round: the first touch of the mapped source and of the thread pool; one 1 M-weight slab, timed cold,
    read 18.7 ns per weight on an H200's 16 cores where the pass then took 10.5, docs/quant.md):

    * `element_s`: quantise, dequantise and compare at every candidate type together (the error pass's sample);
    * `probe_element_s`: the same at the probe type alone (every weight of every unit);
    * `final_element_s`: source → float → a type, what llama-quantize does per weight for the final mix, as the
      mean over the candidate types (the mix is chosen later); before, the whole quantise-dequantise-compare
      round of all types over their number made the H200's estimate of that step 3.3x the measured time at 4
      layers;
    * `swap_element_s`: a resident probe's values, the probe type dequantised and stored in the source's type."""
    from ggufbridge.quant.ggmlq import type_id as ggmlq_type_id

    name = max((n for ts in units.values() for n in ts), key=lambda n: header.tensor(n).n_elements)
    info = header.tensor(name)
    want = max(4 << 20, q.threads << 20)
    slabs, n = [], 0
    for _, _, raw in _slabs(header, name):
        slabs.append(np.asarray(raw))
        n += raw.shape[0] * info.shape[0]
        if n >= want:
            break
    for t in types:
        q.L.ggml_quantize_init(ggmlq_type_id(t))  # the IQ grids are built once per process: not per weight

    def one(t, raw):
        """Seconds (to quantise: the source to float, then type t; to dequantise and compare; of the dequantise, plus
        storing the values at the source's type: a resident probe's values, timed for the probe type only)"""
        rows = raw.shape[0]
        t0 = time.perf_counter()
        f = q.to_float(info.type, raw, rows * info.shape[0]).reshape(rows, info.shape[0])
        b = q.quantize(qt.fit_row(t, info.shape[0]), f)
        t1 = time.perf_counter()
        d = q.to_float(qt.fit_row(t, info.shape[0]), b, f.size)
        t2 = time.perf_counter()
        store = 0.0
        if t == probe_type and info.type != "F32":
            q.quantize(info.type, d.reshape(rows, info.shape[0]))
            store = time.perf_counter() - t2
        d -= f.reshape(-1)
        float(np.dot(d, d))
        return t1 - t0, time.perf_counter() - t1 - store, t2 - t1 + store

    one(probe_type, slabs[0])
    per, quant, swap_s = {}, {}, 0.0
    for t in types:
        got = [one(t, raw) for raw in slabs]
        quant[t] = sum(a for a, _, _ in got) / n
        per[t] = sum(a + b for a, b, _ in got) / n
        if t == probe_type:
            swap_s = sum(c for _, _, c in got)
    # the final mix's types are not known before the measurement: priced at the candidate types' mean quantise cost
    # (a K-quant mix costs less, one with IQ4_XS/IQ3_S heads more; measured against both in docs/quant.md)
    return {"element_s": sum(per.values()), "probe_element_s": per[probe_type],
            "final_element_s": sum(quant.values()) / len(quant), "swap_element_s": swap_s / n}


RESIDENT_RAM_SHARE = 0.5  # a CPU-only resident model (its weights in anonymous memory) takes at most this share


def _mem_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def resident_probes(probes: str, header: GGUFHeader, n_gpu_layers: int) -> bool:
    """Whether the probes run in one resident model (ggufbridge.quant.probe.ResidentModel) or in the split layout.
    `probes`: "auto", "resident" or "layout". Auto: resident when the runtime can write a loaded weight and the
    weights left in host memory with `n_gpu_layers` offloaded (all of them on a CPU, the token embedding when every
    layer is on a GPU) fit in half of the memory available here; the layout's mapped pages can be evicted, so it
    measures a source larger than the memory (at a reload per probe)."""
    from ggufbridge.quant.probe import host_bytes, set_tensor_fn

    if probes not in ("auto", "resident", "layout"):
        raise QuantError(f"probes must be auto, resident or layout, found {probes!r}")
    if probes == "layout":
        return False
    if set_tensor_fn() is None:
        if probes == "resident":
            raise QuantError("this runtime cannot write a loaded weight (llama_model_set_tensor_data, patch "
                             "0029-llama-ext-model-tensor-set): build it with `ggufbridge build-runtime`")
        return False
    host, avail = host_bytes(header, n_gpu_layers), _mem_available()
    if probes == "resident" and avail and host > avail:  # loaded unmapped: the kernel would kill the run
        raise QuantError(f"--fit-probes resident keeps {human_size(host)} of weights in memory and "
                         f"{human_size(avail)} is available: use --fit-probes layout (mapped, evictable) or auto")
    return probes == "resident" or host <= RESIDENT_RAM_SHARE * avail


def _check_disk(work: Path, header: GGUFHeader) -> None:
    """The probe layout (a copy of the source, kept until the measurement ends) needs the source's size free in the
    work folder: refused before it is written, not halfway through a copy (a 35B-A3B source is 69 GB). Resident
    probes write no copy."""
    # a resumed run's layout is already written: only what is missing counts
    layout = work / "probe"
    have = sum(f.stat().st_size for f in [*layout.glob("*.src.gguf"), *layout.glob("main.gguf")]) \
        if layout.is_dir() else 0
    need = int(header.file_bytes * 1.02) + (64 << 20) - have
    free = shutil.disk_usage(work).free
    if free < need:
        raise QuantError(f"--work {work}: the sensitivity pass needs {human_size(need)} free there (a copy of the "
                         f"source for its probes; --fit-probes resident writes none), {human_size(free)} is free; "
                         "give --work a folder on a larger disk")


def _measure_header(header: GGUFHeader, work: Path, imatrix, threads, runtime) -> HeaderModel:
    """The KV section and tensor table llama-quantize writes for this source: measured on its output of the
    source's header twin (ggufbridge.quant.probe.write_header_twin: the same KVs and tensor table, two elements
    per axis), every tensor kept at its source type. Until 2026-12-05 this quantised the source itself: a whole
    copy (69 GB at the full size) written and deleted only for its header."""
    from ggufbridge.quant.probe import write_header_twin
    from ggufbridge.quant.quantize import quantize_file

    twin, out = work / f"header-twin.{os.getpid()}.gguf", work / f"header.{os.getpid()}.gguf"  # runs may share work
    rec = exact_mix("fit-header", header, source_types(header), "Q8_0")
    try:
        write_header_twin(header, twin)
        quantize_file(twin, out, mix=rec, imatrix=imatrix, threads=threads, runtime=runtime, internal=True)
        return HeaderModel.measure(out)
    finally:
        twin.unlink(missing_ok=True)
        out.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------------ measure


def measure(src, calibration, *, work, reference: str | None = None, ctx: int = 256, max_rows: int | None = 16,
            imatrix=None, types: tuple[str, ...] | None = None, probe_type: str = PROBE_TYPE,
            threads: int | None = None, progress: bool = False, runtime=None, budget_s: float | None = None,
            report=None, n_gpu_layers: int | None = None, max_tokens: int | None = None,
            probes: str = "auto") -> Sensitivity:
    """Measure (or load from `work`) the sensitivity of every unit of the unquantised GGUF `src`.

    reference: `hf:DIR`, `logits:FILE` (a dump-logits file made on the same rows) or `gguf:FILE`; default the
    source itself. It is dumped once (top-64 + 32 samples) into `work`, so each probe costs one llama.cpp pass.
    Each probe quantises only its unit (ggufbridge.quant.ggmlq) and evaluates the source with that unit swapped
    in (ggufbridge.quant.probe): written into one resident model or loaded from a split layout (`probes`: auto,
    resident or layout; `resident_probes` says what auto picks). `max_tokens`: only the first calibration tokens
    (cheaper, noisier). Before the work starts, the cost is measured and given to `report` (a callable taking a
    line; ggufbridge.quant.cost); with `budget_s`, fewer calibration tokens are used when the estimate is over it,
    and the run is refused when even MIN_TOKENS would not fit. Finished steps are recorded in the measurement's
    folder and an interrupted run resumes from them. `n_gpu_layers`: None offloads what fits the GPU's free
    memory, every layer where the weights fit (ggufbridge.quant.probe.gpu_layers); 0 without a GPU backend.
    """
    from tqdm import tqdm

    from ggufbridge.compare import evalset
    from ggufbridge.compare.run import dump_logits
    from ggufbridge.quant.cost import CostModel, human_time
    from ggufbridge.quant.ggmlq import Quantiser
    from ggufbridge.quant.probe import Evaluator, ProbeModel, ResidentModel, gpu_layers, probe_values
    from ggufbridge.quant.quantize import _default_threads

    t_start = time.perf_counter()
    say = report or (lambda line: log.info("%s", line))
    src = Path(src)
    header = read_header(src)
    parts = header.kv.get("split.count")
    if isinstance(parts, int) and parts > 1:  # the tensor table here is this part's only
        from ggufbridge.errors import GGUFFileError
        from ggufbridge.runtime.artifacts import split_parts

        try:
            files = split_parts(src, header.kv) or (src,)
        except GGUFFileError:  # parts missing or misnamed: what this one holds
            files = (src,)
        by_bytes = Counter()  # the weights' type: the join keeps it
        for t in (t for f in files for t in read_header(f).tensors):
            if t.type in ("BF16", "F16", "F32"):
                by_bytes[t.type] += t.nbytes
        as_type = by_bytes.most_common(1)[0][0] if by_bytes else "BF16"
        raise QuantError(f"{src} is one part of a {parts}-part split GGUF; --fit-bytes measures a single file: join "
                         f"it first (`ggufbridge quantize {src} -o ONE.gguf --quant {as_type}`: llama-quantize reads "
                         "every part and copies tensors already at that type)")
    if header.kv.get("general.architecture") != "qwen35moe":
        raise QuantError(f"{src}: --fit-bytes measures qwen35moe text models, found architecture "
                         f"{header.kv.get('general.architecture')!r}")
    quantised = sorted({t.type for t in header.tensors if unit_of(t.name) and t.type not in ("F32", "F16", "BF16")})
    if quantised:
        raise QuantError(f"{src} already holds {', '.join(quantised)} tensors: measure from the unquantised "
                         "(BF16/F16/F32) file")
    types = tuple(types or (CANDIDATE_TYPES + (IMATRIX_TYPES if imatrix else ())))
    bad = [t for t in types if t in qt.NEEDS_IMATRIX and imatrix is None]
    if bad:
        raise QuantError(f"types {', '.join(bad)} need an importance matrix (--imatrix)")
    if probe_type not in types:
        raise QuantError(f"the probe type {probe_type} must be among the candidate types {', '.join(types)}")
    if budget_s is not None and budget_s <= 0:
        raise QuantError(f"--fit-budget-time must be positive, found {budget_s}")
    imatrix = str(Path(imatrix)) if imatrix is not None else None
    threads = threads or _default_threads()
    n_gpu_layers = gpu_layers(header) if n_gpu_layers is None else n_gpu_layers
    resident = resident_probes(probes, header, n_gpu_layers)
    if max_tokens is not None and max_tokens < MIN_TOKENS:
        raise QuantError(f"--calibration-tokens must be at least {MIN_TOKENS}, found {max_tokens}")
    rows = first_tokens(calibration_rows(src, calibration, ctx, max_rows), max_tokens)
    # the source as its own reference is keyed by its content (already in the key), not by where it lies: the
    # same file at another path (convert --fit-bytes's intermediate, a copy) reuses the measurement
    ref_key = reference or "source"
    reference = reference or f"gguf:{src}"
    src_id = _file_id(src)
    im_id = imatrix and _file_id(Path(imatrix))

    def key_of(rows):
        # resident probes measure the units' dequantised values on the source type's kernels: their own records
        return _digest(FORMAT, src_id, evalset.set_hash(rows), ref_key, im_id, ",".join(types), probe_type, ctx,
                       *(("resident",) if resident else ()))

    def cached(rows) -> Sensitivity | None:
        p = Path(work) / key_of(rows) / "sensitivity.json"
        if p.is_file():
            say(f"sensitivity pass: reusing {p}")
            return Sensitivity.from_json(json.loads(p.read_text()))
        return None

    found = cached(rows)
    if found is not None:
        return found
    units = units_of(header)
    Path(work).mkdir(parents=True, exist_ok=True)
    # the write timed: a layer's tensor (on a GPU the token embedding stays in host memory, a cheaper write)
    in_units = [n for ts in units.values() for n in ts]
    largest = max([n for n in in_units if BLOCK.match(n)] or in_units, key=lambda n: header.tensor(n).nbytes)

    # --- the cost, measured here before anything long runs
    q = Quantiser(threads)
    try:
        t0 = time.perf_counter()
        load_s, token_s, kl_token_s, set_byte_s = _time_pass(src, rows, ctx, n_gpu_layers, threads, resident,
                                                             largest)
        qtime = _time_quantisation(q, header, units, types, probe_type)
        byte_s = _time_copy(header, Path(work))
        header_model = _measure_header(header, Path(work), imatrix, threads, runtime)  # a second or two: no copy

        def ref_file_of(rows):
            return Path(work) / (f"reference-{_digest(src_id, evalset.set_hash(rows), ref_key, ctx)}"
                                 ".safetensors")

        def cost_for(rows) -> CostModel:
            m = Measurements(Path(work) / key_of(rows) / "measurements.jsonl")
            left = [u for u in units if u not in m.units]
            return CostModel(
                units=len(left), rows=len(rows), tokens=sum(len(r.ids) for r in rows),
                elements=sum(header.tensor(n).n_elements for u in left for n in units[u]),
                sampled=sum(sampled_weights(header, units[u], ERROR_SAMPLE) for u in left), types=len(types),
                source_bytes=header.file_bytes, load_s=load_s, token_s=token_s, kl_token_s=kl_token_s,
                element_s=qtime["element_s"], probe_element_s=qtime["probe_element_s"], byte_s=byte_s,
                reference_passes=0 if reference.startswith("logits:") or ref_file_of(rows).is_file() else 1,
                spent_s=time.perf_counter() - t_start,
                device="GPU" if n_gpu_layers < 0 else f"GPU, {n_gpu_layers} layers" if n_gpu_layers else "CPU",
                done=len(m.units), final_element_s=qtime["final_element_s"], resident=resident,
                unit_bytes=sum(header.tensor(n).nbytes for u in left for n in units[u]), set_byte_s=set_byte_s,
                swap_element_s=qtime["swap_element_s"])

        cost = cost_for(rows)
        if budget_s is not None and cost.total() > budget_s:
            k = cost.tokens_for(budget_s)
            if k < MIN_TOKENS:
                say(cost.describe())
                raise QuantError(
                    f"the sensitivity pass would take about {human_time(cost.total(MIN_TOKENS))} here even on "
                    f"{MIN_TOKENS} calibration tokens ({cost.units} units), over --fit-budget-time "
                    f"{human_time(budget_s)}: allow more time, use a machine with a GPU, or a fixed mix (--mix hq4)")
            say(f"--fit-budget-time {human_time(budget_s)}: the full calibration ({cost.tokens:,} tokens) would take "
                f"about {human_time(cost.total())}; measuring on the first {k:,} tokens")
            rows = first_tokens(rows, k)
            found = cached(rows)
            if found is not None:
                return found
            cost = cost_for(rows)
        timings: dict[str, float] = {"calibration_s": time.perf_counter() - t0}
        say(cost.describe())

        key = key_of(rows)
        ref_file = ref_file_of(rows)
        work = Path(work) / key
        work.mkdir(parents=True, exist_ok=True)
        done = Measurements(work / "measurements.jsonl")
        rows_path = work / "calibration.jsonl"
        evalset.write_rows(rows, rows_path)
        t0 = time.perf_counter()
        if reference.startswith("logits:"):
            ref_spec = reference
        else:
            if not ref_file.is_file():
                tmp = work / "reference.part.safetensors"
                dump_logits(reference, tmp, eval_path=rows_path, ctx=ctx, top_k=64, samples=32, floor=False,
                            progress=progress, n_gpu_layers=n_gpu_layers)
                os.replace(tmp, ref_file)
            ref_spec = f"logits:{ref_file}"
        timings["reference_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        if not resident:
            _check_disk(work, header)
            layout = ProbeModel(src, units, work / "probe")
            layout.build()
        timings["layout_s"] = time.perf_counter() - t0

        shapes = {t.name: list(t.shape) for t in header.tensors}
        keep = source_types(header)
        im = importance(imatrix)
        t0 = time.perf_counter()
        with Evaluator(ref_spec, rows, ctx, n_gpu_layers, threads) as ev, contextlib.ExitStack() as stack:
            if resident:  # loaded once: every probe below writes its unit into it and the source back after
                model = stack.enter_context(ResidentModel(src, ctx=ctx, chunk=ev.chunk, n_gpu_layers=n_gpu_layers,
                                                          threads=threads))
                timings["resident_load_s"] = time.perf_counter() - t0
            if done.base is None:
                done.base = ev.kl(model.source if resident else src)
                done.add({"kind": "base", "kl": done.base})
            timings["base_pass_s"] = time.perf_counter() - t0
            err_s = probe_s = 0.0
            todo = [u for u in units if u not in done.units]
            for u in tqdm(todo, desc="sensitivity (quantise + probe per unit)", unit="unit", disable=not progress):
                t1 = time.perf_counter()
                err, kept = unit_errors(q, header, units[u], types, keep=probe_type, imatrix=im,
                                        sample=ERROR_SAMPLE)
                if resident:
                    values = probe_values(q, header, kept)
                    t2 = time.perf_counter()
                    with model.swapped(values) as loaded:
                        kl = ev.kl(loaded)
                else:
                    path = layout.write_probe(u, kept)
                    t2 = time.perf_counter()
                    with layout.swapped(u, path) as m:
                        kl = ev.kl(m)
                    path.unlink()
                err_s += t2 - t1
                probe_s += time.perf_counter() - t2
                done.units[u] = {"probe_kl": kl, "error": err}
                done.add({"kind": "unit", "unit": u, "probe_kl": kl, "error": err})
                log.info("sensitivity %s: KL %.5f at %s", u, kl, probe_type)
    finally:
        q.close()
    timings.update({"quantisation_error_s": err_s, "probes_s": probe_s, "probes": len(todo), "resident": resident,
                    "estimate_s": cost.total(), "cost": cost.to_json(), "measured_s": time.perf_counter() - t_start,
                    "peak_rss_mib": _peak_rss_mib()})
    sens = Sensitivity(
        source=str(src), key=key, reference=reference, calibration=str(calibration),
        n_tokens=sum(len(r.ids) for r in rows), probe_type=probe_type, types=list(types), base_kl=done.base,
        units={u: {"tensors": ts, **done.units[u]} for u, ts in units.items()},
        shapes=shapes, source_types=keep,
        all_types={t.name: t.type for t in header.tensors}, header=asdict(header_model), imatrix=imatrix,
        timings=timings)
    cached_path = work / "sensitivity.json"
    tmp = cached_path.with_suffix(".part")
    tmp.write_text(json.dumps(sens.to_json(), indent=1))
    os.replace(tmp, cached_path)
    shutil.rmtree(work / "probe", ignore_errors=True)  # a copy of the source: not kept once measured
    return sens

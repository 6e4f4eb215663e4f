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

import hashlib
import json
import logging
import os
import re
import resource
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ggufbridge.native import quiet_native
from ggufbridge.errors import QuantError
from ggufbridge.ggufio.reader import GGUFHeader, read_header
from ggufbridge.quant import types as qt
from ggufbridge.quant.classes import classify
from ggufbridge.quant.filesize import HeaderModel
from ggufbridge.quant.mix import KEPT_TYPE, Mix

log = logging.getLogger(__name__)

# Types the allocator chooses from (all of them quantise without an importance matrix); with one, the 2-bit
# and IQ3_XXS types join.
CANDIDATE_TYPES = ("Q2_K", "Q3_K", "IQ3_S", "IQ4_XS", "Q4_K", "Q5_K", "Q6_K", "Q8_0")
IMATRIX_TYPES = ("IQ2_XS", "IQ2_S", "IQ3_XXS")
PROBE_TYPE = "Q3_K"  # coarse enough that one unit's KL stands clear of the eval noise
FORMAT = 1
_LAYER = re.compile(r"^blk\.(\d+)\.")
# llama-quantize type argument for a mix whose bytes are mostly this tensor type (general.file_type)
FILE_TYPE_OF = {"Q2_K": "Q2_K", "Q3_K": "Q3_K_M", "IQ3_S": "IQ3_S", "IQ3_XXS": "IQ3_XXS", "IQ2_XS": "IQ2_XS",
                "IQ2_S": "IQ2_M", "IQ4_XS": "IQ4_XS", "IQ4_NL": "IQ4_NL", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M",
                "Q6_K": "Q6_K", "Q8_0": "Q8_0"}


def unit_of(tensor: str) -> str | None:
    """The unit a tensor belongs to (None: never quantised)."""
    c = classify(tensor)
    if c.kept or c.name == "other":
        return None
    m = _LAYER.match(tensor)
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


def _errors(src: GGUFHeader, out_path: Path, names: list[str]) -> dict[str, float]:
    """Squared error of each tensor of `out_path` against the source, after dequantising both."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    out = read_header(out_path)
    errs = {}
    for n in names:
        a_raw, b_raw = src.tensor_blocks(n), out.tensor_blocks(n)
        a_type, b_type = (GGMLQuantizationType[h.tensor(n).type] for h in (src, out))
        total = 0.0
        # one expert (outermost slice) at a time: memory stays at one matrix even for the 35B's stacked experts
        slices = range(a_raw.shape[0]) if a_raw.ndim >= 3 else [slice(None)]
        for i in slices:
            a = dequantize(np.asarray(a_raw[i]), a_type).astype(np.float32).ravel()
            b = dequantize(np.asarray(b_raw[i]), b_type).astype(np.float32).ravel()
            d = a - b
            total += float(np.dot(d, d))
        errs[n] = total
    return errs


def _peak_rss_mib() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) / 1024  # kB on Linux


def measure(src, calibration, *, work, reference: str | None = None, ctx: int = 256, max_rows: int | None = 16,
            imatrix=None, types: tuple[str, ...] | None = None, probe_type: str = PROBE_TYPE,
            threads: int | None = None, progress: bool = False, runtime=None) -> Sensitivity:
    """Measure (or load from `work`) the sensitivity of every unit of the unquantised GGUF `src`.

    reference: `hf:DIR`, `logits:FILE` (a dump-logits file made on the same rows) or `gguf:FILE`; default the
    source itself. It is dumped once (top-64 + 32 samples) into `work`, so each probe costs one llama.cpp pass.
    """
    from tqdm import tqdm

    from ggufbridge.compare import evalset
    from ggufbridge.compare.run import compare, dump_logits
    from ggufbridge.quant.quantize import quantize_file

    src = Path(src)
    header = read_header(src)
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
    imatrix = str(Path(imatrix)) if imatrix is not None else None
    rows = calibration_rows(src, calibration, ctx, max_rows)
    # the source as its own reference is keyed by its content (already in the key), not by where it lies: the
    # same file at another path (convert --fit-bytes's intermediate, a copy) reuses the measurement
    ref_key = reference or "source"
    reference = reference or f"gguf:{src}"
    key = _digest(FORMAT, _file_id(src), evalset.set_hash(rows), ref_key, imatrix and _file_id(Path(imatrix)),
                  ",".join(types), probe_type, ctx)
    # the reference dump depends on the rows and the reference only: shared by measurements of other types
    ref_file = Path(work) / f"reference-{_digest(_file_id(src), evalset.set_hash(rows), ref_key, ctx)}.safetensors"
    work = Path(work) / key
    cached = work / "sensitivity.json"
    if cached.is_file():
        log.info("sensitivity: reusing %s", cached)
        return Sensitivity.from_json(json.loads(cached.read_text()))
    work.mkdir(parents=True, exist_ok=True)
    rows_path = work / "calibration.jsonl"
    evalset.write_rows(rows, rows_path)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    if reference.startswith("logits:"):
        ref_spec = reference
    else:
        if not ref_file.is_file():
            tmp = work / "reference.part.safetensors"
            dump_logits(reference, tmp, eval_path=rows_path, ctx=ctx, top_k=64, samples=32, floor=False)
            os.replace(tmp, ref_file)
        ref_spec = f"logits:{ref_file}"
    timings["reference_s"] = time.perf_counter() - t0

    units = units_of(header)
    shapes = {t.name: list(t.shape) for t in header.tensors}
    keep = source_types(header)
    error: dict[str, dict[str, float]] = {u: {} for u in units}
    header_model = None
    t0 = time.perf_counter()
    names = [n for ts in units.values() for n in ts]
    for t in tqdm(types, desc="quantisation error per type", disable=not progress, unit="type"):
        out = work / f"uniform-{t}.gguf"
        rec = exact_mix("fit-uniform-" + t, header, {n: t for n in names}, FILE_TYPE_OF.get(t, "Q8_0"))
        quantize_file(src, out, mix=rec, imatrix=imatrix, threads=threads, runtime=runtime)
        if header_model is None:
            header_model = HeaderModel.measure(out)
        errs = _errors(header, out, names)
        for u, ts in units.items():
            error[u][t] = sum(errs[n] for n in ts)
        out.unlink()
    # the source type itself: no error
    timings["quantisation_error_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    base = compare(ref_spec, [f"gguf:{src}"], eval_path=rows_path, ctx=ctx).results[0].summary["kl_mean"]
    probe_kl: dict[str, float] = {}
    for u, ts in tqdm(units.items(), desc="sensitivity probes", disable=not progress, unit="unit"):
        out = work / "probe.gguf"
        rec = exact_mix("fit-probe", header, {**keep, **{n: probe_type for n in ts}},
                           FILE_TYPE_OF.get(probe_type, "Q8_0"))
        quantize_file(src, out, mix=rec, imatrix=imatrix, threads=threads, runtime=runtime)
        probe_kl[u] = compare(ref_spec, [f"gguf:{out}"], eval_path=rows_path, ctx=ctx).results[0].summary["kl_mean"]
        out.unlink()
        log.info("sensitivity %s: KL %.5f at %s", u, probe_kl[u], probe_type)
    timings["probes_s"] = time.perf_counter() - t0
    timings["probes"] = len(units)
    timings["peak_rss_mib"] = _peak_rss_mib()
    sens = Sensitivity(
        source=str(src), key=key, reference=reference, calibration=str(calibration),
        n_tokens=sum(len(r.ids) for r in rows), probe_type=probe_type, types=list(types), base_kl=base,
        units={u: {"tensors": ts, "probe_kl": probe_kl[u], "error": error[u]} for u, ts in units.items()},
        shapes=shapes, source_types=keep,
        all_types={t.name: t.type for t in header.tensors}, header=asdict(header_model), imatrix=imatrix,
        timings=timings)
    tmp = cached.with_suffix(".part")
    tmp.write_text(json.dumps(sens.to_json(), indent=1))
    os.replace(tmp, cached)
    return sens

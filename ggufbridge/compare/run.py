"""Drivers: feed eval rows through a reference and candidates chunk by chunk, or dump a model's top-K logits.

Candidates are opened one at a time (several quantisations of a large model rarely fit memory together); the
reference stays open and is re-read for each candidate (a `logits:` reference makes that cheap). Within a row,
the reference and the candidate advance in lockstep over position chunks, so each holds at most one chunk.
"""

from __future__ import annotations

import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from ggufbridge.compare import evalset
from ggufbridge.compare.evalset import Row
from ggufbridge.compare.metrics import Accumulator, default_threads, topk_form
from ggufbridge.compare.sources import (LogitsSource, Source, gguf_role, hub_model, localize, open_source,
                                       parse_spec, require_device_for)
from ggufbridge.errors import EvalDataError, GGUFBridgeError, LogitsMismatch
from ggufbridge.textfile import read_utf8
from ggufbridge.untrusted import finite_numbers, load_json

log = logging.getLogger(__name__)

DEFAULT_CTX = 1024
DEFAULT_TOP_K = 256
DEFAULT_SAMPLES = 64
# Elements of one logits chunk [positions, vocab]: ~16M (64 MB float32, 128 MB as float64 while computing KL).
CHUNK_ELEMENTS = 1 << 24
# Tokenizers must agree on this text too, so that id-only eval sets are still checked.
PROBE_TEXT = ("Hello, world! The quick brown fox jumps over the lazy dog. 12345 日本語 中文 한국어 😀\n"
              "<|im_start|>user\nHi<|im_end|>\n")


# Candidates need full-vocabulary logits: GGUF files first of all, EXL3 packs / checkpoints for like-for-like tables.
CANDIDATE_KINDS = ("gguf", "exl3", "hf")


def _size_bytes(spec: str) -> int:
    path = parse_spec(spec)[1]
    if path.is_dir():
        return sum(p.stat().st_size for p in path.glob("*.safetensors"))
    return path.stat().st_size


def _cap_chunk(chunk: int | None, ctx: int) -> int | None:
    """No row is longer than ctx, so no chunk needs to be: a larger --chunk only sized buffers (chunk × vocab)."""
    return None if chunk is None else min(chunk, ctx)


def default_chunk(vocab_size: int, ctx: int) -> int:
    return max(1, min(ctx, CHUNK_ELEMENTS // max(1, vocab_size)))


# keys of a JSON result that describe the candidate rather than its figures
RESULT_KEYS = ("label", "candidate", "bits_per_weight", "file_bytes", "family")


@dataclass
class Result:
    """One candidate's comparison: `summary` holds the JSON figures, `kl_by_kind` the per-position KL."""

    label: str
    spec: str
    summary: dict
    kl_by_kind: dict[str, np.ndarray]
    bits_per_weight: float | None = None
    file_bytes: int | None = None
    family: str | None = None  # plot grouping (Source.family); None: by backend


@dataclass
class Comparison:
    reference: str
    results: list[Result]
    floor: dict | None = None  # BF16-vs-FP32 summary, when measured
    floor_note: str = ""
    n_rows: int = 0
    n_tokens: int = 0
    ctx: int = DEFAULT_CTX
    eval_source: str = ""
    eval_sha256: str = ""
    reference_id: str = ""
    notes: list[str] = field(default_factory=list)


def _tokenizer_of(sources: list[Source]):
    for s in sources:
        if s.tokenize("a") is not None:
            return s
    return None


def check_compatible(a: Source, b: Source, rows: list[Row], text: str | None = None) -> None:
    """Refuse sources that do not share a vocabulary size and (where both have one) a tokenizer."""
    if a.vocab_size != b.vocab_size:
        raise LogitsMismatch(f"vocabulary mismatch: {a.spec} has {a.vocab_size} entries, {b.spec} has "
                             f"{b.vocab_size}")
    if a.tokenize("a") is None or b.tokenize("a") is None:
        return
    probes = [("probe text", PROBE_TEXT)] + [(f"row {i}", r.text) for i, r in enumerate(rows) if r.text]
    if text is not None:
        probes.append(("--text file", text))
    for what, t in probes:
        ta, tb = a.tokenize(t), b.tokenize(t)
        if ta != tb:
            k = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
            raise LogitsMismatch(f"tokenizer mismatch on the {what}: {a.spec} and {b.spec} differ at token {k} "
                                 f"({ta[k:k + 3]} vs {tb[k:k + 3]}; {len(ta)} vs {len(tb)} tokens)")


def _compare_one(ref: Source, cand: Source, rows: list[Row], chunk: int, progress: bool, desc: str,
                 threads: int | None = None) -> Accumulator:
    """The figures of `cand` against `ref` on the rows; the per-position statistics on `threads` host threads
    (default: every core this process may use; the model itself is not running while they do)."""
    acc = Accumulator()
    with ThreadPoolExecutor(threads or default_threads(), thread_name_prefix="kl") as pool, \
            tqdm(total=sum(len(r.ids) for r in rows), unit="tok", disable=not progress, desc=desc, leave=False) as bar:
        for i, row in enumerate(rows):
            labels = row.labels
            pos = 0
            for rc, cc in zip(ref.chunks(i, row, chunk), cand.chunks(i, row, chunk), strict=True):
                if rc.n != cc.n:
                    raise LogitsMismatch(f"row {i}: reference gave {rc.n} positions, candidate {cc.n}")
                acc.add(i, row.kind, rc, cc, labels[pos:pos + cc.n], pool)
                pos += cc.n
                bar.update(cc.n)
            if pos != len(row.ids):
                raise LogitsMismatch(f"row {i}: {pos} positions compared, row has {len(row.ids)}")
    return acc


def _label(spec: str) -> str:
    found = hub_model(spec)
    if found is not None:  # not the snapshot folder's name (a commit hash)
        return found.repo_id.rsplit("/", 1)[-1] + (f"@{found.revision}" if found.revision else "")
    return parse_spec(spec)[1].name


def _read_rows(sources, eval_path, text_path, ctx):
    tok_src = _tokenizer_of(sources)
    tokenize = tok_src.tokenize if tok_src is not None else None
    rows = evalset.load_rows(eval_path=eval_path, text_path=text_path, ctx=ctx, tokenize=tokenize)
    text = read_utf8(text_path, EvalDataError) if text_path is not None else None
    return rows, text


def _language_models(candidates: list[str], labels: list[str]) -> tuple[list[str], list[str]]:
    """`compare OUT/*.gguf` (the README's form) lists the folder's mmproj and imatrix too: they are skipped, with a
    warning, unless nothing else is left (then the source refuses them in one line)."""
    keep = []
    for spec, label in zip(candidates, labels):
        kind, path = parse_spec(spec)
        role = gguf_role(path) if kind == "gguf" and path.is_file() else "target"
        if role == "target":
            keep.append((spec, label))
        else:
            log.warning("skipping %s: a %s GGUF, not a language model", path, role)
    if not keep:
        return candidates, labels
    return [s for s, _ in keep], [label for _, label in keep]


def compare(reference: str, candidates: list[str], *, eval_path=None, text_path=None, ctx: int = DEFAULT_CTX,
            chunk: int | None = None, floor: bool | None = None, hf_dtype: str = "float32",
            progress: bool = False, merge_paths=()) -> Comparison:
    """Compare each candidate (GGUF files; also exl3:/hf: models) against the reference on an eval set; then
    `merge` the results of earlier `compare --json` files, which are read and checked first, before any model runs."""
    if not candidates:
        raise GGUFBridgeError("no candidate model given")
    merges = [(read_merge_file(p), str(p)) for p in merge_paths]
    chunk = _cap_chunk(chunk, ctx)
    shown, labels = reference, [_label(c) for c in candidates]
    # hub models (hf://, ms://) are downloaded here, once, with progress; from then on they are hf: folders
    reference, candidates = localize(reference, progress=progress), [localize(c, progress=progress) for c in candidates]
    for spec in (reference, *candidates):
        require_device_for(spec)
    candidates, labels = _language_models(candidates, labels)
    bad = [c for c in candidates if parse_spec(c)[0] not in CANDIDATE_KINDS]
    if bad:
        raise GGUFBridgeError(f"candidates must be models ({', '.join(k + ':' for k in CANDIDATE_KINDS)}), "
                              f"found {bad}")
    ref_kind, ref_path = parse_spec(reference)
    with contextlib.ExitStack() as stack:
        ref = stack.enter_context(open_source(reference, n_ctx=ctx, chunk=chunk or ctx, hf_dtype=hf_dtype))
        chunk = chunk or default_chunk(ref.vocab_size, ctx)
        # rows are tokenised by the reference's tokenizer, else (a dump) by the first candidate's
        if ref.tokenize("a") is None and evalset.needs_tokenizer(eval_path, text_path):
            with open_source(candidates[0], n_ctx=ctx, chunk=chunk) as first:
                rows, text = _read_rows([first], eval_path, text_path, ctx)
        else:
            rows, text = _read_rows([ref], eval_path, text_path, ctx)
        evalset.check_ids_fit(rows, ref.vocab_size, ref.spec)
        if isinstance(ref, LogitsSource):
            ref.check_rows(rows)
        dump_floor = ref.meta.get("floor") if isinstance(ref, LogitsSource) else None
        if floor and ref_kind != "hf" and dump_floor is None:
            raise GGUFBridgeError("--floor needs an hf: reference (or a logits: dump that carries one)")
        results = []
        for spec, label in zip(candidates, labels):
            with open_source(spec, n_ctx=ctx, chunk=chunk) as cand:
                check_compatible(ref, cand, rows, text)
                acc = _compare_one(ref, cand, rows, chunk, progress, label)
                results.append(Result(label, spec, acc.summary(), acc.kl_by_kind(), cand.bits_per_weight,
                                      _size_bytes(spec), cand.family))
        floor_summary, floor_note = None, ""
        if ref_kind == "hf" and floor is not False:
            with open_source(f"hf:{ref_path}", n_ctx=ctx, chunk=chunk, hf_dtype="bfloat16") as bf16:
                ref32 = ref if hf_dtype == "float32" else stack.enter_context(_hf_float32(ref_path))
                floor_summary = _compare_one(ref32, bf16, rows, chunk, progress, "floor").summary()
                floor_note = "transformers BF16 vs FP32 on the same rows"
        elif dump_floor is not None and floor is not False:
            floor_summary = dump_floor
            floor_note = f"from the dump ({ref.meta.get('floor_note', 'BF16 vs FP32')})"
        elif floor is False:
            floor_note = "not measured (--no-floor)"
        else:
            floor_note = "not measured (needs an hf: reference or a dump made from one)"
    cmp = Comparison(reference=shown, results=results, floor=floor_summary, floor_note=floor_note,
                     n_rows=len(rows), n_tokens=sum(len(r.ids) for r in rows), ctx=ctx,
                     eval_source=str(eval_path or text_path), eval_sha256=evalset.set_hash(rows),
                     reference_id=fingerprint(reference))
    for other, source in merges:
        merge(cmp, other, source)
    return cmp


def fingerprint(spec: str) -> str:
    """Identity of a reference that survives copying between machines: sha256 over a file's size and its first
    and last MiB, or over a folder's file names and sizes plus its config.json."""
    import hashlib

    kind, path = parse_spec(spec)
    h = hashlib.sha256(kind.encode())
    if path.is_dir():
        for f in sorted(path.iterdir()):
            if f.is_file() and (f.suffix == ".safetensors" or f.name == "config.json"):
                h.update(f"{f.name}:{f.stat().st_size};".encode())
        if (path / "config.json").is_file():
            h.update((path / "config.json").read_bytes())
    else:
        size = path.stat().st_size
        h.update(str(size).encode())
        with open(path, "rb") as f:
            h.update(f.read(1 << 20))
            f.seek(max(0, size - (1 << 20)))
            h.update(f.read(1 << 20))
    return h.hexdigest()


def merge(cmp: Comparison, other: dict, source: str) -> None:
    """Append the results of an earlier `compare --json` (e.g. EXL3 packs measured on a GPU machine) made on the
    same eval set against the same reference; they lack per-position KL, so plots show them in the bpw panel."""
    for key, mine in (("eval_sha256", cmp.eval_sha256), ("reference_id", cmp.reference_id)):
        if other.get(key) != mine:
            raise LogitsMismatch(f"{source}: {key} {str(other.get(key))[:12]} differs from this run's {mine[:12]} "
                                 "(results made on another eval set or against another reference)")
    for r in other.get("results", []):
        summary = {k: v for k, v in r.items() if k not in RESULT_KEYS}
        cmp.results.append(Result(r["label"], r["candidate"], summary, {}, r.get("bits_per_weight"),
                                  r.get("file_bytes"), r.get("family")))
    cmp.notes.append(f"merged {len(other.get('results', []))} result(s) from {source}")


def read_merge_file(path) -> dict:
    """A `compare --json` file, read and checked in full (before any model runs: a bad file is refused at once)."""
    other = load_json(path, GGUFBridgeError, max_bytes=256 << 20, what="compare --json file")
    if not isinstance(other, dict) or not isinstance(other.get("results", []), list):
        raise GGUFBridgeError(f"{path}: not a compare --json file (expected an object with a \"results\" list)")
    for i, r in enumerate(other.get("results", [])):
        if not isinstance(r, dict) or not isinstance(r.get("label"), str) or not isinstance(r.get("candidate"), str):
            raise GGUFBridgeError(f"{path}: results[{i}] expected an object with string \"label\" and \"candidate\"")
        for key in ("bits_per_weight", "file_bytes"):
            if r.get(key) is not None and (isinstance(r[key], bool) or not isinstance(r[key], (int, float))):
                raise GGUFBridgeError(f"{path}: results[{i}].{key} expected a number, found {str(r[key])[:40]}")
        # every number of a result is formatted, summed or compared in the report: finite and of usable size
        finite_numbers(r, f"{path}: results[{i}]", GGUFBridgeError)
        if r.get("family") is not None and not isinstance(r["family"], str):
            raise GGUFBridgeError(f"{path}: results[{i}].family expected a string, found {str(r['family'])[:40]}")
    for key in ("eval_sha256", "reference_id"):
        if not isinstance(other.get(key), str):
            raise GGUFBridgeError(f"{path}: not a compare --json file ({key} missing)")
    return other



def _hf_float32(path):
    """The float32 side of the floor when the main hf source runs in another dtype."""
    from ggufbridge.compare.sources import HFSource

    return HFSource(path, "float32")


def dump_logits(model: str, out, *, eval_path=None, text_path=None, ctx: int = DEFAULT_CTX,
                top_k: int = DEFAULT_TOP_K, samples: int = DEFAULT_SAMPLES, chunk: int | None = None,
                floor: bool | None = None, hf_dtype: str = "float32", progress: bool = False, rows_out=None,
                n_gpu_layers: int = 0) -> dict:
    """Write the top-K form of `model` on an eval set to `out` (see ggufbridge.compare.dump); returns its metadata.
    `n_gpu_layers`: layers a gguf: model offloads (-1: all)."""
    from ggufbridge.compare.dump import DumpWriter

    model = localize(model, progress=progress)  # a hub model: downloaded first; the dump names its snapshot folder
    kind, path = parse_spec(model)
    if kind == "logits":
        raise GGUFBridgeError("dump-logits needs a model (hf:, gguf: or exl3:), not a logits: file")
    if samples < 0:
        raise GGUFBridgeError(f"--samples must be >= 0, found {samples}")
    if top_k < 5:
        raise GGUFBridgeError(f"--top-k must be at least 5 (top-5 overlap needs it), found {top_k}")
    require_device_for(model)
    chunk = _cap_chunk(chunk, ctx)
    with open_source(model, n_ctx=ctx, chunk=chunk or ctx, hf_dtype=hf_dtype, n_gpu_layers=n_gpu_layers) as src:
        chunk = chunk or default_chunk(src.vocab_size, ctx)
        rows, _ = _read_rows([src], eval_path, text_path, ctx)
        evalset.check_ids_fit(rows, src.vocab_size, src.spec)
        if rows_out is not None:
            evalset.write_rows(rows, rows_out)
        top_k = min(top_k, src.vocab_size)
        meta = {
            "source": model + ("" if hf_dtype == "float32" or kind != "hf" else f" ({hf_dtype})"),
            "vocab_size": src.vocab_size,
            "top_k": top_k,
            "samples": samples,
            "ctx": ctx,
            "row_sha256": [r.sha256 for r in rows],
            "set_sha256": evalset.set_hash(rows),
            "kinds": [r.kind for r in rows],
            "bits_per_weight": src.bits_per_weight,
        }
        # the floor goes into the header, which is written before the first chunk: measure it first
        if kind == "hf" and floor is not False:
            with open_source(f"hf:{path}", n_ctx=ctx, chunk=chunk, hf_dtype="bfloat16") as bf16:
                ref32 = src if hf_dtype == "float32" else _hf_float32(path)
                floor_summary = _compare_one(ref32, bf16, rows, chunk, progress, "floor").summary()
            meta["floor"] = floor_summary
            meta["floor_note"] = "transformers BF16 vs FP32, measured at dump time"
        elif floor:
            raise GGUFBridgeError("--floor needs an hf: model")
        with DumpWriter(out, row_lengths=[len(r.ids) for r in rows], top_k=top_k, samples=samples,
                        meta=meta) as w, \
                tqdm(total=sum(len(r.ids) for r in rows), unit="tok", disable=not progress, desc="dump",
                     leave=False) as bar:
            for i, row in enumerate(rows):
                labels = row.labels
                pos = 0
                rng = np.random.default_rng(int(row.sha256[:16], 16))  # reproducible per row
                for c in src.chunks(i, row, chunk):
                    w.add(topk_form(c.logits, top_k, labels[pos:pos + c.n], samples, rng))
                    pos += c.n
                    bar.update(c.n)
    return meta

"""The per-file "what is quantised and what is not" table: per tensor class, the tensor count, the stored type(s),
bits per weight, bytes and share of the file — read from the GGUF header alone."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ggufbridge.ggufio import names
from ggufbridge.ggufio.reader import GGUFHeader, read_header
from ggufbridge.quant.classes import CLASSES, OTHER, classify
from ggufbridge.units import human_size

# metadata keys ggufbridge's quantiser writes into its results


@dataclass
class ClassRow:
    cls: str
    label: str
    count: int
    types: dict[str, int]  # stored type → tensor count
    params: int
    bytes: int
    bpw: float
    share: float  # of the file's bytes

    @property
    def types_text(self) -> str:
        return ", ".join(t if n == self.count else f"{t} ×{n}" for t, n in sorted(self.types.items()))


@dataclass
class QuantReport:
    path: str
    file_bytes: int
    recipe: str | None
    quant_type: str | None
    fallbacks: list[str]
    rows: list[ClassRow]
    bpw: float  # all tensors

    def to_dict(self) -> dict:
        d = asdict(self)
        for r, row in zip(d["rows"], self.rows):
            r["types_text"] = row.types_text
        return d


def quant_report(source: str | GGUFHeader) -> QuantReport:
    h = source if isinstance(source, GGUFHeader) else read_header(source)
    acc: dict[str, ClassRow] = {}
    for t in h.tensors:
        c = classify(t.name)
        row = acc.setdefault(c.name, ClassRow(c.name, c.label, 0, {}, 0, 0, 0.0, 0.0))
        n = 1
        for d in t.shape:
            n *= d
        row.count += 1
        row.types[t.type] = row.types.get(t.type, 0) + 1
        row.params += n
        row.bytes += t.nbytes
    order = [c.name for c in CLASSES] + [OTHER.name]
    rows = [acc[k] for k in order if k in acc]
    for r in rows:
        r.bpw = 8 * r.bytes / r.params if r.params else 0.0
        r.share = r.bytes / h.file_bytes if h.file_bytes else 0.0
    total_params = sum(r.params for r in rows)
    fb = h.kv.get(names.QUANT_FALLBACKS)
    return QuantReport(
        path=str(h.path), file_bytes=h.file_bytes,
        recipe=h.kv.get(names.QUANT_MIX) if isinstance(h.kv.get(names.QUANT_MIX), str) else None,
        quant_type=h.kv.get(names.QUANT_TYPE) if isinstance(h.kv.get(names.QUANT_TYPE), str) else None,
        fallbacks=[s for s in fb.split(";") if s] if isinstance(fb, str) else [],
        rows=rows, bpw=8 * sum(r.bytes for r in rows) / total_params if total_params else 0.0)


def format_quant_report(r: QuantReport) -> str:
    return format_quant_dict(r.to_dict())


def format_quant_dict(d: dict) -> str:
    """The table, from `QuantReport.to_dict()` (the form `ggufbridge inspect` carries)."""
    how = (f"recipe {d['recipe']}" if d["recipe"] else
           f"llama-quantize {d['quant_type']}" if d["quant_type"] else "as stored")
    lines = [f"what is quantised and what is not ({how}; {d['bpw']:.2f} bits per weight overall)",
             f"  {'class':<40} {'count':>5}  {'stored as':<24} {'bpw':>6} {'bytes':>11} {'share':>7}"]
    for row in d["rows"]:
        lines.append(f"  {row['label']:<40} {row['count']:>5}  {row['types_text']:<24} {row['bpw']:>6.2f} "
                     f"{human_size(row['bytes']):>11} {100 * row['share']:>6.2f}%")
    lines += [f"  fallback: {f}" for f in d["fallbacks"]]
    return "\n".join(lines)

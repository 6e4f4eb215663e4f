"""What a sensitivity pass (`quantize --fit-bytes`) will cost on this machine, measured before it runs.

The pass is: the reference dumped once, one llama.cpp pass over the calibration rows for the source and for each
unit (a probe), every unit quantised at every candidate type once (llama.cpp's quantiser, in-process), the
probe layout written once (a copy of the source), and at the end the chosen mix quantised by llama-quantize.
A short calibration times each kind of work here and now:

* a pass = loading the model (`load_s`) + `tokens` × (`token_s`: one calibration token through llama.cpp and
  its KL against the reference), timed on the source over the first calibration rows;
* quantisation = weights × `probe_element_s` (the probe type, every weight) + sampled weights × `element_s`
  (every candidate type on a sample of each large tensor), timed on one slab of the largest tensor on the
  threads the pass will use;
* copies = source bytes × `byte_s`, timed on the source's first tensor data.

So the total is  spent + layout + reference + (units + 1) × pass + quantisation + final,  and a
time budget (`--fit-budget-time`) is met by measuring on fewer calibration tokens (a pass is linear in them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ggufbridge.units import human_size


def human_time(s: float) -> str:
    s = max(0.0, s)
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


@dataclass
class CostModel:
    units: int
    rows: int
    tokens: int
    elements: int  # weights in the units (each quantised at the probe type)
    sampled: int  # of which quantised at every candidate type (a sample of each large tensor)
    types: int
    source_bytes: int
    load_s: float
    token_s: float
    element_s: float  # per weight: every candidate type (quantise, dequantise, compare)
    probe_element_s: float  # per weight: the probe type alone
    byte_s: float
    kl_token_s: float = 0.0  # of token_s: the KL in numpy (host work, whatever runs the model)
    reference_passes: float = 1  # 1 when the reference is a GGUF dumped here, 0 for a logits: file or a cached dump
    spent_s: float = 0.0  # the calibration itself
    device: str = "CPU"
    done: int = 0  # units measured by an earlier, interrupted run (not counted above)

    @property
    def probes(self) -> int:
        return self.units + 1  # + the source's own KL

    def pass_s(self, tokens: int | None = None) -> float:
        return self.load_s + (self.tokens if tokens is None else tokens) * self.token_s

    def parts(self, tokens: int | None = None) -> dict[str, float]:
        return {
            "probe layout + header": 2 * self.source_bytes * self.byte_s,
            "reference": self.reference_passes * self.pass_s(tokens),
            "quantisation error": self.elements * self.probe_element_s + self.sampled * self.element_s,
            "probes": self.probes * self.pass_s(tokens),
            "final quantisation": self.elements * self.element_s / max(1, self.types) + self.source_bytes * self.byte_s,
        }

    def total(self, tokens: int | None = None) -> float:
        return self.spent_s + sum(self.parts(tokens).values())

    def tokens_for(self, budget_s: float) -> int:
        """The most calibration tokens (a prefix) whose run fits `budget_s` (the total is linear in tokens)."""
        fixed, per = self.total(0), self.total(1) - self.total(0)
        return min(self.tokens, int((budget_s - fixed) // per)) if per > 0 and budget_s > fixed else 0

    def describe(self) -> str:
        p = self.parts()
        resumed = f" ({self.done} more measured before: resumed)" if self.done else ""
        lines = [f"sensitivity pass: {self.units} units{resumed}, {self.probes} llama.cpp passes ({self.device}) of "
                 f"{self.tokens:,} calibration tokens ({self.rows} rows), {self.types} candidate types on "
                 f"{self.sampled / 1e6:,.1f} M of {self.elements / 1e6:,.0f} M weights, source "
                 f"{human_size(self.source_bytes)}",
                 f"  one pass {human_time(self.pass_s())} (load {self.load_s:.1f} s + {1e3 * self.token_s:.2f} ms "
                 f"per token); quantisation {1e9 * self.element_s:.0f} ns per weight at all types, "
                 f"{1e9 * self.probe_element_s:.0f} at the probe type"]
        lines += [f"  {k:<24}{human_time(v):>10}" for k, v in p.items()]
        lines.append(f"  {'estimated total':<24}{human_time(self.total()):>10}  (calibration {self.spent_s:.0f} s "
                     "included)")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {**asdict(self), "estimate_s": self.total()}

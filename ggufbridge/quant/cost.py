"""What a sensitivity pass (`quantize --fit-bytes`) will cost on this machine, measured before it runs.

The pass is: the reference dumped once, one llama.cpp pass over the calibration rows for the source and for each
unit (a probe), every unit quantised at every candidate type once (llama.cpp's quantiser, in-process), and at
the end the chosen mix quantised by llama-quantize. The probes run either in one resident model (`resident`:
loaded once, each probe writes its unit into it and the source back after, ggufbridge.quant.probe.ResidentModel)
or, on a runtime that cannot write a loaded weight or a source too large for memory, in a split layout of the
source that each probe loads again (a copy of the source, written once). A short calibration times each kind of
work here and now:

* a pass = loading the model and its first chunk's warm-up (`load_s`) + `tokens` × (`token_s`: one calibration
  token through llama.cpp and its KL against the reference), timed on the source over the first calibration rows;
  a resident probe pays the tokens only, plus its unit's values (`swap_element_s` per weight: dequantised, stored
  at the source's type) written into the model and the source's written back (`set_byte_s` per byte, timed on
  the largest tensor of a layer);
* quantisation = weights × `probe_element_s` (the probe type, every weight) + sampled weights × `element_s`
  (every candidate type on a sample of each large tensor), timed on slabs of the largest tensor on the threads
  the pass will use;
* the final mix = weights × `final_element_s` (source → float → a type, what llama-quantize does per weight,
  the mean over the candidate types: the mix is not known yet) + the output written;
* copies = source bytes × `byte_s`, timed on the source's first tensor data: the layout probes' copy of the
  source and the final mix's output (llama-quantize's header is measured in the calibration, on the source's
  header twin: no copy).

So the total is  spent + copies + reference + probes + quantisation + final,  and a time budget
(`--fit-budget-time`) is met by measuring on fewer calibration tokens (the total is linear in them).
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
    final_element_s: float | None = None  # per weight, the final llama-quantize (None: element_s / types, as before)
    resident: bool = False  # probes written into one loaded model (no reload, no layout copy)
    unit_bytes: int = 0  # source bytes of the units: each written into the resident model and back once
    set_byte_s: float = 0.0
    swap_element_s: float = 0.0

    @property
    def probes(self) -> int:
        return self.units + 1  # + the source's own KL

    def pass_s(self, tokens: int | None = None) -> float:
        return self.load_s + (self.tokens if tokens is None else tokens) * self.token_s

    def probes_s(self, tokens: int | None = None) -> float:
        if not self.resident:
            return self.probes * self.pass_s(tokens)
        tokens = self.tokens if tokens is None else tokens
        return (self.load_s + self.probes * tokens * self.token_s + self.elements * self.swap_element_s
                + 2 * self.unit_bytes * self.set_byte_s)

    def parts(self, tokens: int | None = None) -> dict[str, float]:
        final = self.final_element_s if self.final_element_s is not None else self.element_s / max(1, self.types)
        return {
            **({} if self.resident else {"probe layout": self.source_bytes * self.byte_s}),
            "reference": self.reference_passes * self.pass_s(tokens),
            "quantisation error": self.elements * self.probe_element_s + self.sampled * self.element_s,
            "probes": self.probes_s(tokens),
            "final quantisation": self.elements * final + self.source_bytes * self.byte_s,
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
        how = "in one resident model" if self.resident else "each loading the model"
        lines = [f"sensitivity pass: {self.units} units{resumed}, {self.probes} llama.cpp passes ({self.device}, "
                 f"{how}) of {self.tokens:,} calibration tokens ({self.rows} rows), {self.types} candidate types on "
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

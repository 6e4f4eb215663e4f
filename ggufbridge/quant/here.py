"""Which quantisation of a model fits this machine, and what `plan` adds to a plan: this machine, the verdict per
packaged recipe (runtime.machine) and the largest quantisation that fits here with the recipe asked for.

Sizes of llama-quantize types are estimated from the tensor shapes (each quantisable tensor at the type's main
tensor type, with the runtime's row fallback; llama.cpp's own mixes raise a few tensors a step); the packaged
mixes' are exact tensor data. Each is planned by the same planner (runtime.memory) and judged like the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from ggufbridge.errors import PlanError
from ggufbridge.units import human_size
from ggufbridge.runtime.machine import (Machine, Verdict, budget_warnings, gib, read_machine, recipe_verdicts,
                                        verdict)


# --- which quantisation fits here -------------------------------------------------------------------------------------

# llama-quantize types offered, largest first (their main tensor type from quant.types.FILE_TYPES)
QUANTS = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "IQ4_XS", "Q3_K_M", "Q2_K")


@dataclass
class QuantOption:
    name: str  # a llama-quantize type or a packaged mix
    kind: str  # "quant" (estimated: its main tensor type on every quantisable tensor) | "mix" (exact types)
    weight_bytes: int
    verdict: Verdict | None  # None: the recipe's planner finds no setting at all


def _tensor_bytes(headers, type_of) -> list[tuple[str, int]]:
    from ggufbridge.quant import types as qt
    from ggufbridge.quant.classes import classify

    out = []
    for h in headers:
        for t in h.tensors:
            c = classify(t.name)
            want = None if c.kept or c.name == "other" or len(t.shape) < 2 else type_of(t.name, c.name)
            size = t.nbytes if want is None else qt.nbytes(qt.fit_row(want, t.shape[0]), tuple(t.shape))
            out.append((t.name, size))
    return out


def quant_options(target_files, target, recipe, m: Machine, *, draft=None, mmproj_bytes: int = 0,
                  ctx: int | None = None, parallel: int | None = None) -> list[QuantOption]:
    """Each of QUANTS and the packaged mixes for the target file(s), planned by `recipe` and set against this
    machine. Sizes of QUANTS are estimates (llama-quantize's own mixes raise a few tensors a step); of mixes, exact
    tensor data."""
    from ggufbridge.ggufio.reader import read_header
    from ggufbridge.quant import types as qt
    from ggufbridge.quant.mix import load_mix, packaged_names
    from ggufbridge.runtime.memory import make_plan

    headers = [read_header(p) for p in target_files]
    candidates = [(q, "quant", lambda name, cls, q=q: qt.FILE_TYPES[q][0]) for q in QUANTS]
    for name in packaged_names():
        mix = load_mix(name)
        candidates.append((name, "mix", lambda tname, cls, mix=mix: mix.type_for(tname, cls)))
    out = []
    for name, kind, type_of in candidates:
        tensors = _tensor_bytes(headers, type_of)
        shape = target.with_tensor_bytes(tensors)
        try:
            plan = make_plan(shape, recipe, ctx=ctx, draft=draft, mmproj_bytes=mmproj_bytes, slots=parallel)
            v = verdict(plan, m)
        except PlanError:
            v = None
        out.append(QuantOption(name, kind, sum(b for _, b in tensors), v))
    return out


def quant_line(options: list[QuantOption], recipe: str) -> str:
    """The largest quantisation that fits here with `recipe`, and the mixes that do."""
    fit = [o for o in options if o.verdict is not None and o.verdict.fits]
    quants = [o for o in fit if o.kind == "quant"]
    mixes = [o for o in fit if o.kind == "mix"]
    if not fit:
        return (f"here with recipe {recipe}: no quantisation down to {QUANTS[-1]} fits this machine; pick another "
                f"recipe, a smaller --ctx or fewer --parallel slots")
    best = max(fit, key=lambda o: o.weight_bytes)
    about = "about " if best.kind == "quant" else ""
    size = human_size(best.weight_bytes)
    text = (f"here with recipe {recipe}: the largest that fits is {best.name} ({about}{size} of weights, "
            f"{gib(best.verdict.spare)} spare)")
    if quants:
        text += f"; types that fit: {', '.join(o.name for o in quants)}"
    if mixes:
        text += f"; mixes that fit: {', '.join(o.name for o in mixes)}"
    return text + " (ggufbridge quantize SRC -o OUT --quant TYPE | --mix NAME; --fit-bytes N for an exact budget)"


# --- what `plan` adds to a plan ---------------------------------------------------------------------------------------

@dataclass
class Here:
    machine: Machine
    verdict: Verdict  # the plan of the recipe asked for
    warnings: list[str]
    recipes: list[Verdict]  # every packaged recipe
    quants: list[QuantOption]

    def lines(self) -> list[str]:
        out = ["", "this machine:", *[f"  {x}" for x in self.machine.lines()], *self.warnings,
               "verdict per recipe (this model, this machine):"]
        out += [f"  {v.line()}" + ("   <- --recipe" if v.recipe == self.verdict.recipe else "")
                for v in self.recipes]
        if not any(v.recipe == self.verdict.recipe for v in self.recipes):
            out.append(f"  {self.verdict.line()}   <- --recipe")
        out.append(quant_line(self.quants, self.verdict.recipe))
        return out

    def to_dict(self) -> dict:
        return {"machine": self.machine.to_dict(), "verdict": self.verdict.to_dict(), "warnings": self.warnings,
                "recipes": [v.to_dict() for v in self.recipes],
                "quants": [{"name": o.name, "kind": o.kind, "weight_bytes": o.weight_bytes,
                            "fits": bool(o.verdict and o.verdict.fits),
                            "spare": o.verdict.spare if o.verdict else None} for o in self.quants]}


def judge(s, *, ctx: int | None = None, parallel: int | None = None, llama_bin: str | None = None,
          machine: Machine | None = None) -> Here:
    """A session's plan (runtime.session.prepare) against this machine: its verdict, the recipe's budgets this
    machine does not have, every packaged recipe's verdict, and the quantisations that fit here."""
    m = machine or read_machine(llama_bin)
    mmproj = s.plan.figures.get("mmproj", 0) or 0
    return Here(m, verdict(s.plan, m), budget_warnings(s.plan, m),
                recipe_verdicts(s.target, s.draft, mmproj, m, ctx=ctx, parallel=parallel),
                quant_options(s.art.target.files, s.target, s.recipe, m, draft=s.draft, mmproj_bytes=mmproj,
                              ctx=ctx, parallel=parallel))

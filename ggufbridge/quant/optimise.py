"""`quantize --fit-bytes N` / `--fit HARDWARE`: the KL-guided mix for a byte budget.

measure (ggufbridge.quant.sensitivity) → options per unit with exact bytes (ggufbridge.quant.filesize) →
allocate (ggufbridge.quant.allocate) → a mix TOML naming every tensor's type (reusable with `--mix FILE`)
→ llama-quantize through the ordinary mix path. The file written is never larger than the budget: sizes are
exact, and the written file is checked against the prediction.
"""

from __future__ import annotations

import dataclasses
import os
import hashlib
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ggufbridge.errors import QuantError
from ggufbridge.quant import types as qt
from ggufbridge.quant.allocate import Option, allocate
from ggufbridge.quant.classes import CLASSES, classify
from ggufbridge.quant.filesize import tensor_bytes
from ggufbridge.quant.mix import KEPT_TYPE, Mix
from ggufbridge.ggufio.names import QUANT_FALLBACKS, QUANT_MIX, QUANT_TYPE
from ggufbridge.quant.sensitivity import FILE_TYPE_OF, Sensitivity

log = logging.getLogger(__name__)
NAME_PREFIX = "fit-"
DEFAULT_CTX = 8192  # the context a mix leaves room for when --ctx is not given
_LONGEST_FILE_TYPE = max(list(FILE_TYPE_OF.values()) + ["Q8_0"], key=len)
_FALLBACK_RESERVE = "x" * 120  # quantize.py caps the fallback summary at 120 characters


@dataclass
class FitPlan:
    mix: Mix
    tensor_types: dict[str, str]  # every tensor's stored type (after the runtime's fallback rule)
    unit_types: dict[str, str]
    file_bytes: int  # predicted, exact
    budget: int
    predicted_kl: float
    tensor_bytes: dict[str, int]  # unpadded, as the planner counts them


def _final(t: str, shape) -> str:
    return t if t in ("F16", "BF16", "F32") else qt.fit_row(t, shape[0])


def unit_options(sens: Sensitivity) -> dict[str, list[Option]]:
    align = sens.header["alignment"]
    out = {}
    for u, info in sens.units.items():
        ts = info["tensors"]
        opts = []
        for t in sens.types:
            if t not in info["error"]:  # not possible for this unit (a type that needs an importance row it lacks)
                continue
            b = sum(tensor_bytes(_final(t, sens.shapes[n]), tuple(sens.shapes[n]), align) for n in ts)
            opts.append(Option(t, b, sens.added_kl(u, t)))
        src_t = sens.source_types[ts[0]]
        opts.append(Option(src_t, sum(tensor_bytes(sens.source_types[n], tuple(sens.shapes[n]), align) for n in ts),
                           0.0))
        out[u] = opts
    return out


def _strings(name: str, file_type: str, fallbacks: str | None) -> dict[str, str | None]:
    return {QUANT_MIX: name, QUANT_TYPE: file_type, QUANT_FALLBACKS: fallbacks}


def plan_fit(sens: Sensitivity, budget: int) -> FitPlan:
    """The mix with the least predicted KL whose whole file (header, padding, every tensor) is ≤ budget bytes."""
    from ggufbridge.quant.quantize import _short_fallbacks, TensorChoice

    hm = sens.header_model()
    shapes = {n: tuple(s) for n, s in sens.shapes.items()}
    in_units = {n for info in sens.units.values() for n in info["tensors"]}
    fixed = sum(tensor_bytes(sens_type, shapes[n], hm.alignment)
                for n, sens_type in _kept_types(sens).items() if n not in in_units)
    # the header's strings are not known before the choice: reserve their longest form, then count exactly
    reserve = hm.bytes_for(_strings(NAME_PREFIX + "0" * 12, _LONGEST_FILE_TYPE, _FALLBACK_RESERVE))
    avail = budget - reserve - fixed
    options = unit_options(sens)
    if avail <= 0:
        raise QuantError(f"a budget of {budget:,} bytes does not even hold the header and unquantised tensors "
                         f"({reserve + fixed:,} bytes)")
    choice = allocate(options, avail)
    wanted = {n: choice[u].type for u, info in sens.units.items() for n in info["tensors"]}
    mix = make_mix(sens, wanted, budget)
    final = {n: _final(t, shapes[n]) for n, t in wanted.items()}
    choices = [TensorChoice(n, classify(n).name, shapes[n][0], sens.source_types[n], wanted[n], final[n])
               for n in wanted]
    fb = _short_fallbacks(choices) or None
    types = {**_kept_types(sens), **final}
    size = hm.bytes_for(_strings(mix.name, mix.file_type, fb)) + sum(
        tensor_bytes(types[n], shapes[n], hm.alignment) for n in shapes)
    if size > budget:  # cannot happen (the reserve bounds the strings); kept as the invariant's guard
        raise QuantError(f"internal: the planned mix is {size:,} bytes, over the budget of {budget:,}")
    kl = sens.base_kl + sum(choice[u].kl for u in sens.units)
    mix.fit.update({"file_bytes": size, "predicted_kl": round(kl, 6)})
    return FitPlan(mix, types, {u: o.type for u, o in choice.items()}, size, budget, kl,
                   {n: qt.nbytes(types[n], shapes[n]) for n in shapes})


def _kept_types(sens: Sensitivity) -> dict[str, str]:
    """Every tensor's type in the source (the never-quantised ones keep it)."""
    return dict(sens.all_types)


def make_mix(sens: Sensitivity, wanted: dict[str, str], budget: int) -> Mix:
    """The chosen types as a mix: per class the type holding most of its bytes, the rest per tensor."""
    per_class: dict[str, Counter] = {}
    for n, t in wanted.items():
        per_class.setdefault(classify(n).name, Counter())[t] += qt.nbytes(t, tuple(sens.shapes[n]))
    types = {}
    for c in CLASSES:
        types[c.name] = KEPT_TYPE if c.kept else (per_class[c.name].most_common(1)[0][0] if c.name in per_class
                                                  else "Q8_0")
    tensors = {n: t for n, t in sorted(wanted.items()) if t != types[classify(n).name]}
    by_type = Counter()
    for n, t in wanted.items():
        by_type[t] += qt.nbytes(t, tuple(sens.shapes[n]))
    main = next((t for t, _ in by_type.most_common() if t in FILE_TYPE_OF), "Q8_0")
    digest = hashlib.sha256(repr(sorted(wanted.items())).encode()).hexdigest()[:12]
    fit = {"budget_bytes": budget, "reference": sens.reference, "calibration": sens.calibration,
           "calibration_tokens": sens.n_tokens, "sensitivity_key": sens.key, "probe_type": sens.probe_type}
    return Mix(name=NAME_PREFIX + digest, description=f"KL-guided mix for {budget:,} bytes",
                       file_type=FILE_TYPE_OF[main], types=types, source="generated", tensors=tensors, fit=fit)


def mix_toml(rec: Mix) -> str:
    """The mix as TOML in the packaged mixes' format (+ [tensors], [fit]); `--mix FILE` reads it back."""
    def q(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

    def val(v) -> str:
        return q(v) if isinstance(v, str) else repr(v)

    lines = [f"# {rec.name}: written by ggufbridge quantize --fit-bytes", f"description = {q(rec.description)}",
             f"file_type = {q(rec.file_type)}", "", "[types]"]
    lines += [f"{c} = {q(t)}" for c, t in rec.types.items()]
    if rec.tensors:
        lines += ["", "[tensors]"] + [f"{q(n)} = {q(t)}" for n, t in rec.tensors.items()]
    lines += ["", "[fit]"] + [f"{k} = {val(v)}" for k, v in rec.fit.items()]
    return "\n".join(lines) + "\n"


def context_bytes(src, ctx: int) -> int:
    """KV cache (F16) for `ctx` tokens + one sequence's recurrent state, as --fit-bytes has always counted it."""
    if ctx == 0:
        return 0
    from ggufbridge.runtime.memory import KV_PAD, target_from_gguf

    shape = target_from_gguf(Path(src))
    cells = -(-ctx // KV_PAD) * KV_PAD
    return shape.kv_bytes_per_token("f16", "f16") * cells + shape.state_bytes_per_slot()


def plan_for_hardware(src, sens: Sensitivity, hardware: str, ctx: int) -> FitPlan:
    """The largest mix the hardware recipe's planner fits fully on its GPU(s) at `ctx` (bisection on bytes)."""
    from ggufbridge.runtime.memory import evaluate, target_from_gguf
    from ggufbridge.runtime.recipes import load_recipe

    hw = load_recipe(hardware)
    if not hw.memory["gpu_gib"]:
        raise QuantError(f"--fit {hardware}: the recipe has no GPU memory to fit; use --fit-bytes")
    base = target_from_gguf(Path(src))

    def fits(plan: FitPlan) -> bool:
        shape = base.with_tensor_bytes(plan.tensor_bytes.items())  # the quantised file, as the planner sees it
        # one slot of `ctx` tokens: the fit is for the model and its context; serving more slots (the recipe's
        # server.parallel, --parallel) is planned when serving, which then shortens each slot's context if needed
        p = evaluate(shape, hw, ctx=ctx, ngl=base.n_layer + 1, n_cpu_moe=0, slots=1)
        return all(pool.fits for pool in p.pools if pool.kind == "gpu")

    hi = sum(max(o.bytes for o in opts) for opts in unit_options(sens).values()) + 2 * sum(
        qt.nbytes(t, tuple(sens.shapes[n])) for n, t in _kept_types(sens).items()) + (1 << 20)
    lo, best = 0, None
    while hi - lo > max(4096, hi // 4096):
        mid = (lo + hi) // 2
        try:
            plan = plan_fit(sens, mid)
        except QuantError:
            lo = mid
            continue
        if fits(plan):
            lo, best = mid, plan
        else:
            hi = mid
    if best is None:
        raise QuantError(f"nothing fits recipe {hardware} at --ctx {ctx}: even the smallest mix does not fit its "
                         "GPU memory; lower --ctx or use a larger machine")
    return dataclasses.replace(best)


def smallest_tensor_bytes(src, with_imatrix: bool) -> int:
    """A lower bound of any mix's file size, known before measuring: every tensor at its smallest candidate type."""
    from ggufbridge.ggufio.reader import read_header
    from ggufbridge.quant.sensitivity import CANDIDATE_TYPES, IMATRIX_TYPES, unit_of

    types = CANDIDATE_TYPES + (IMATRIX_TYPES if with_imatrix else ())
    total = 0
    for t in read_header(src).tensors:
        total += (min(qt.nbytes(_final(c, t.shape), t.shape) for c in types) if unit_of(t.name) else t.nbytes)
    return total


def default_work() -> Path:
    from ggufbridge.files import cache_dir

    return cache_dir() / "sensitivity"


def default_calibration() -> Path:
    from importlib import resources

    return Path(str(resources.files("ggufbridge").joinpath("data", "calibration.txt")))


def fit_quantize(src, dst, *, fit_bytes: int | None = None, hardware: str | None = None, ctx: int | None = None,
                 calibration=None, reference: str | None = None, imatrix=None, work=None, mix_out=None,
                 threads: int | None = None, progress: bool = False, budget_s: float | None = None, report=None,
                 calibration_tokens: int | None = None, probes: str = "auto"):
    """Measure (or reuse), allocate for the budget, write the mix to `mix_out`, quantise `src` into `dst`
    (written directly; the caller renames). Returns (QuantResult, FitPlan, Sensitivity). `budget_s` and `report`:
    the measurement's time limit and where its cost estimate goes, `calibration_tokens` how many calibration
    tokens it uses, `probes` how its probes run (ggufbridge.quant.sensitivity.measure)."""
    from ggufbridge.quant.quantize import quantize_file
    from ggufbridge.quant.sensitivity import measure

    if (fit_bytes is None) == (hardware is None):
        raise QuantError("give exactly one of --fit-bytes N and --fit HARDWARE")
    if fit_bytes is not None and fit_bytes <= 0:
        raise QuantError(f"--fit-bytes must be a positive number of bytes, found {fit_bytes}")
    ctx = DEFAULT_CTX if ctx is None else ctx
    if ctx < 0 or (hardware is not None and ctx < 1):
        raise QuantError(f"--ctx must be at least {0 if hardware is None else 1}, found {ctx}")
    if fit_bytes is not None:
        floor = smallest_tensor_bytes(src, imatrix is not None)
        if fit_bytes - context_bytes(src, ctx) < floor:
            raise QuantError(f"--fit-bytes {fit_bytes:,} does not even hold the smallest mix: its tensors alone need "
                             f"{floor:,} bytes, plus {context_bytes(src, ctx):,} for --ctx {ctx}")
    sens = measure(src, calibration or default_calibration(), work=work or default_work(), reference=reference,
                   imatrix=imatrix, threads=threads, progress=progress, budget_s=budget_s, report=report,
                   max_tokens=calibration_tokens, probes=probes)
    if hardware is not None:
        plan = plan_for_hardware(src, sens, hardware, ctx)
    else:
        room = fit_bytes - context_bytes(src, ctx)
        if room <= 0:
            raise QuantError(f"--fit-bytes {fit_bytes:,} leaves nothing for the weights: the context of --ctx {ctx} "
                             f"alone needs {fit_bytes - room:,} bytes; lower --ctx (0: the file alone)")
        plan = plan_fit(sens, room)
    if mix_out is not None:
        mix_out = Path(mix_out)
        tmp = mix_out.with_name(f".{mix_out.name}.part")
        tmp.write_text(mix_toml(plan.mix))
        os.replace(tmp, mix_out)
    res = quantize_file(src, dst, mix=plan.mix, imatrix=sens.imatrix, threads=threads, progress=progress)
    size = Path(dst).stat().st_size
    if size != plan.file_bytes or size > plan.budget:
        raise QuantError(f"internal: {dst} is {size:,} bytes, the plan said {plan.file_bytes:,} "
                         f"(budget {plan.budget:,})")
    return res, plan, sens

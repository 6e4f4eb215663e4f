"""This machine, as `plan` and `doctor` judge it: host memory, CPU cores, and the GPUs the runtime itself sees.

GPUs come from the runtime's own device listing, `llama-server --list-devices` (common/arg.cpp:1141-1164,
`common_print_available_devices`: every non-CPU ggml backend device as `NAME: DESCRIPTION (TOTAL MiB, FREE MiB
free)`), so a device counts exactly when llama.cpp would use it and its free memory is what it reports. Host
memory is /proc/meminfo's MemTotal and MemAvailable.

A memory plan (runtime.memory) is made against a recipe's nominal budgets; `verdict` sets it against what is
here: each pool's planned use against the memory of the device it names (the host pool against available RAM),
spare or short by how much. `quant_options` says which quantisation of the model (a llama-quantize type,
estimated from the tensor shapes, or a packaged mix, exact) the same recipe would fit here.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ggufbridge.errors import GGUFBridgeError, PlanError

GIB = 1 << 30
MIB = 1 << 20
_DEVICE = re.compile(r"^\s+(\S+): (.*) \((\d+) MiB, (\d+) MiB free\)\s*$")


@dataclass(frozen=True)
class Device:
    name: str  # llama.cpp's device name: CUDA0, Vulkan0, MTL0, ...
    description: str
    total: int  # bytes
    free: int


@dataclass
class Machine:
    ram_total: int | None
    ram_available: int | None
    cpus: int
    devices: list[Device] = field(default_factory=list)
    devices_from: str = ""  # how GPUs were read, or why they could not be

    def device(self, name: str | None) -> Device | None:
        return next((d for d in self.devices if d.name == name), None)

    def lines(self) -> list[str]:
        ram = (f"{gib(self.ram_total)} RAM ({gib(self.ram_available)} available)" if self.ram_total
               else "RAM unknown")
        out = [f"machine: {ram}, {self.cpus} CPU core(s)"]
        if self.devices:
            out += [f"GPU {d.name}: {d.description}, {gib(d.total)} ({gib(d.free)} free)" for d in self.devices]
        out.append(f"GPUs: {len(self.devices) or 'none'} ({self.devices_from})")
        return out

    def to_dict(self) -> dict:
        return {"ram_total": self.ram_total, "ram_available": self.ram_available, "cpus": self.cpus,
                "devices": [d.__dict__ for d in self.devices], "devices_from": self.devices_from}


def gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


def meminfo(path: str | Path = "/proc/meminfo") -> tuple[int | None, int | None]:
    """(MemTotal, MemAvailable) in bytes; (None, None) where the file is not there (not Linux)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None, None
    vals = {m.group(1): int(m.group(2)) * 1024 for m in re.finditer(r"^(\w+):\s+(\d+) kB", text, re.M)}
    return vals.get("MemTotal"), vals.get("MemAvailable", vals.get("MemFree"))


def parse_devices(text: str) -> list[Device]:
    """The devices of `--list-devices` output (`(none)` and other lines are not devices)."""
    out = []
    for line in text.splitlines():
        m = _DEVICE.match(line)
        if m:
            out.append(Device(m.group(1), m.group(2), int(m.group(3)) * MIB, int(m.group(4)) * MIB))
    return out


def read_machine(llama_bin: str | None = None, runtime=None) -> Machine:
    """This machine; GPUs through the runtime's llama-server (none listed when no runtime is found: said so)."""
    total, avail = meminfo()
    m = Machine(total, avail, os.cpu_count() or 1)
    try:
        if runtime is None:
            from ggufbridge.runtime.locate import locate

            runtime = locate(llama_bin)
        exe = runtime.tool("llama-server")
        p = subprocess.run([str(exe), "--list-devices"], capture_output=True, text=True, errors="replace",
                           env=runtime.env(), timeout=60, stdin=subprocess.DEVNULL)
    except (GGUFBridgeError, OSError, subprocess.TimeoutExpired) as e:
        m.devices_from = f"not read: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        return m
    m.devices = parse_devices(p.stdout)
    m.devices_from = f"as the runtime lists them: {Path(exe).name} --list-devices"
    return m


# --- a plan against this machine --------------------------------------------------------------------------------------

@dataclass
class PoolFit:
    pool: str
    need: int
    have: int | None  # None: not checked from here (an RPC worker's memory), or no such device here
    where: str  # what `have` is: "available RAM", "CUDA0 free", "no CUDA1 here", "RPC worker, not checked"

    @property
    def spare(self) -> int | None:
        return None if self.have is None else self.have - self.need


@dataclass
class Verdict:
    recipe: str
    fits: bool
    spare: int | None  # the least spare memory over the pools checked (negative: short by that much)
    pools: list[PoolFit]
    missing: list[str] = field(default_factory=list)  # devices the recipe plans on that this machine lacks
    error: str | None = None  # the recipe's own plan failed (PlanError)

    def line(self) -> str:
        if self.error:
            return f"recipe {self.recipe}: no plan ({self.error})"
        if self.missing:
            return f"recipe {self.recipe}: does not fit here: it plans on {', '.join(self.missing)}, not found here"
        if self.spare is None:
            return f"recipe {self.recipe}: not checked here (RPC workers only)"
        worst = min((p for p in self.pools if p.spare is not None), key=lambda p: p.spare)
        if self.fits:
            return (f"recipe {self.recipe}: fits here with {gib(self.spare)} spare (least on {worst.pool}: "
                    f"{worst.where})")
        return (f"recipe {self.recipe}: does not fit here by {gib(-self.spare)} ({worst.pool} needs "
                f"{gib(worst.need)}, {worst.where} is {gib(worst.have)})")

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "fits": self.fits, "spare": self.spare, "missing": self.missing,
                "error": self.error, "pools": [p.__dict__ | {"spare": p.spare} for p in self.pools]}


def verdict(plan, m: Machine) -> Verdict:
    """Each pool of `plan` (runtime.memory.MemoryPlan) against what this machine has: the host pool against
    available RAM, a GPU pool against its device's free memory (a unified pool, whose device this runtime does not
    list, against available RAM), an RPC worker not at all."""
    fits, pools, missing = True, [], []
    for p in plan.pools:
        if p.kind == "rpc":
            pools.append(PoolFit(p.name, p.total, None, "RPC worker, not checked from here"))
            continue
        if p.kind == "host":
            have, where = m.ram_available, "available RAM"
        else:
            dev = m.device(p.device)
            if dev is not None:
                have, where = dev.free, f"{dev.name} free"
            elif "unified" in p.name and p.device is None:
                have, where = m.ram_available, "available RAM (unified)"
            else:
                missing.append(p.device or p.name)
                pools.append(PoolFit(p.name, p.total, None, f"no {p.device or p.name} here"))
                fits = False
                continue
        if have is None:
            pools.append(PoolFit(p.name, p.total, None, f"{where} unknown"))
            continue
        pools.append(PoolFit(p.name, p.total, have, where))
        fits = fits and have >= p.total
    checked = [x.spare for x in pools if x.spare is not None]
    return Verdict(plan.recipe, fits and bool(checked), min(checked) if checked else None, pools, missing)


def budget_warnings(plan, m: Machine) -> list[str]:
    """A recipe's nominal budgets larger than what this machine has: the plan's figures are the recipe's, not
    this machine's."""
    out = []
    for p in plan.pools:
        if p.kind == "host" and m.ram_total is not None and p.budget > m.ram_total:
            out.append(f"warning: recipe {plan.recipe} budgets {gib(p.budget)} of host memory; this machine has "
                       f"{gib(m.ram_total)} ({gib(m.ram_available)} available): the table above is the recipe's "
                       f"machine, not this one")
        if p.kind == "gpu" and p.device is not None:
            dev = m.device(p.device)
            if dev is None:
                out.append(f"warning: recipe {plan.recipe} plans {gib(p.budget)} on {p.device}, which this "
                           f"machine does not have")
            elif p.budget > dev.total:
                out.append(f"warning: recipe {plan.recipe} budgets {gib(p.budget)} on {p.device}; this one has "
                           f"{gib(dev.total)}")
    return out


def recipe_verdicts(target, draft, mmproj_bytes: int, m: Machine, *, ctx: int | None = None,
                    parallel: int | None = None) -> list[Verdict]:
    """Every packaged hardware recipe's plan for this model, against this machine."""
    from ggufbridge.runtime.memory import make_plan
    from ggufbridge.runtime.recipes import load_recipe, packaged_names

    out = []
    for name in packaged_names():
        rec = load_recipe(name)
        try:
            plan = make_plan(target, rec, ctx=ctx, draft=draft, mmproj_bytes=mmproj_bytes, slots=parallel)
        except PlanError as e:
            out.append(Verdict(name, False, None, [], error=str(e).split(":")[0]))
            continue
        out.append(verdict(plan, m))
    return out


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
    text = (f"here with recipe {recipe}: the largest that fits is {best.name} ({about}{gib(best.weight_bytes)} of "
            f"weights, {gib(best.verdict.spare)} spare)")
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

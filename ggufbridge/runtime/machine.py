"""This machine, as `plan` and `doctor` judge it: host memory, CPU cores, and the GPUs the runtime itself sees.

GPUs come from the runtime's own device listing, `llama-server --list-devices` (common/arg.cpp:1141-1164,
`common_print_available_devices`: every non-CPU ggml backend device as `NAME: DESCRIPTION (TOTAL MiB, FREE MiB
free)`), so a device counts exactly when llama.cpp would use it and its free memory is what it reports. Host
memory is /proc/meminfo's MemTotal and MemAvailable.

A memory plan (runtime.memory) is made against a recipe's nominal budgets; `verdict` sets it against what is
here: each pool's planned use against the memory of the device it names (the host pool against available RAM),
spare or short by how much. Which quantisation would fit here is quant.here's question (it sizes quantised
files).
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

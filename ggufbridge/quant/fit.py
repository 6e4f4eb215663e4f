"""Pick the best quantisation that leaves room for a requested context: `--fit-bytes N` or `--fit HARDWARE`.

Candidates are tried best first (LADDER); the first whose predicted footprint fits wins. A candidate's size is
predicted exactly before anything is written: a recipe's from its per-tensor plan, a llama-quantize type's from
the quantiser's own `--dry-run` listing. The context's cost comes from the runner's memory planner
(ggufbridge.runtime.plan): KV cache of the full-attention layers and the gated-delta-net state.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ggufbridge.errors import QuantError
from ggufbridge.ggufio.reader import GGUFHeader, read_header
from ggufbridge.quant import types as qt
from ggufbridge.quant.quantize import _error_line, plan_recipe
from ggufbridge.quant.recipes import load_quant_recipe

# Best first, by mean KL in the synthetic benchmark of docs/quant.md (random weights: a provisional order until
# measured on the real model). An entry that is both worse and larger than one before it is never picked.
LADDER: tuple[str, ...] = ("Q8_0", "Q6_K", "hq4", "Q5_K_M", "hq3", "Q4_K_M", "IQ4_XS", "Q3_K_M", "Q2_K")
RECIPE_PREFIX = "hq"  # ladder entries that are recipes rather than llama-quantize types
DEFAULT_CTX = 8192
# one line per tensor of `llama-quantize --dry-run`: "[  7/ 76] NAME - [ ne0, ...], type = bf16, size = ... (q5_K)"
_DRY_RE = re.compile(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[([\d,\s]+)\], type =\s+(\w+),.*?(?:\((\w+)\))?\s*$")


@dataclass
class Candidate:
    name: str  # ladder entry
    tensor_bytes: dict[str, int]  # tensor name → predicted bytes
    weights: int
    need: int  # bytes the fit criterion compares
    fits: bool
    detail: str


def _is_recipe(entry: str) -> bool:
    return entry.startswith(RECIPE_PREFIX)


def as_request(entry: str) -> tuple[str | None, str | None]:
    """(mix, quant) for `quantize_file(recipe=..., quant=...)` from a ladder entry `choose` picked."""
    return (entry, None) if _is_recipe(entry) else (None, entry)


def predict_recipe(header: GGUFHeader, recipe: str) -> dict[str, int]:
    rec = load_quant_recipe(recipe)
    shapes = {t.name: t.shape for t in header.tensors}
    return {c.name: qt.nbytes(c.final, shapes[c.name]) for c in plan_recipe(header, rec)}


def predict_file_type(src: Path, ftype: str, runtime=None) -> dict[str, int]:
    """Per-tensor bytes llama-quantize would write for `ftype`, from its --dry-run (nothing is written)."""
    if runtime is None:
        from ggufbridge.runtime.locate import locate

        runtime = locate()
    exe = runtime.tool("llama-quantize")
    p = subprocess.run([str(exe), "--dry-run", str(src), qt.file_type(ftype)], capture_output=True, text=True,
                       errors="replace", env=runtime.env(), input="")
    out = (p.stdout or "") + (p.stderr or "")
    if p.returncode != 0:
        raise QuantError(f"llama-quantize --dry-run {ftype} failed: {_error_line(out)}")
    sizes = {}
    for line in out.splitlines():
        m = _DRY_RE.match(line.strip())
        if m:
            name, dims, src_t, new_t = m.group(1), m.group(2), m.group(3), m.group(4)
            shape = tuple(int(d) for d in dims.split(","))
            sizes[name] = qt.nbytes((new_t or src_t).upper(), shape)
    if not sizes:
        raise QuantError(f"llama-quantize --dry-run {ftype} listed no tensors")
    return sizes


def _target_shape(src: Path, tensor_bytes: dict[str, int]):
    """The planner's view of the quantised file: the source's shape with the predicted bytes per tensor."""
    from ggufbridge.runtime.plan import BLOCK_RE, EXPERT_RE, target_from_gguf

    base = target_from_gguf(src)
    block = [0] * base.n_layer
    experts = [0] * base.n_layer
    inp = out = 0
    for name, n in tensor_bytes.items():
        m = EXPERT_RE.match(name) or BLOCK_RE.match(name)
        if m:
            il = min(int(m.group(1)), base.n_layer - 1)
            (experts if EXPERT_RE.match(name) else block)[il] += n
        elif name.startswith("token_embd."):
            inp += n
        else:
            out += n
    return dataclasses.replace(base, block_bytes=tuple(block), expert_bytes=tuple(experts), input_bytes=inp,
                               output_bytes=out)


def choose(src, *, fit_bytes: int | None = None, hardware: str | None = None, ctx: int | None = None,
           ladder: tuple[str, ...] = LADDER, runtime=None) -> tuple[str, list[Candidate]]:
    """The best ladder entry that fits, and every candidate tried (for the report).

    fit_bytes: weights + KV cache (F16) for `ctx` tokens + one sequence's recurrent state must be ≤ N bytes.
    hardware: a hardware recipe (ggufbridge/recipes/*.toml): with every layer and every routed expert on the
    GPU(s), at `ctx`, with the recipe's KV cache types, the planner must find it fits.
    """
    if (fit_bytes is None) == (hardware is None):
        raise QuantError("give exactly one of --fit-bytes N and --fit HARDWARE")
    if fit_bytes is not None and fit_bytes <= 0:
        raise QuantError(f"--fit-bytes must be a positive number of bytes, found {fit_bytes}")
    src = Path(src)
    header = read_header(src)
    ctx = ctx or DEFAULT_CTX
    if ctx < 1:
        raise QuantError(f"--ctx must be at least 1, found {ctx}")
    from ggufbridge.runtime.plan import KV_PAD, evaluate, target_from_gguf

    shape = target_from_gguf(src)
    hw = None
    if hardware is not None:
        from ggufbridge.runtime.recipes import load_recipe

        hw = load_recipe(hardware)
        if not hw.memory["gpu_gib"]:
            raise QuantError(f"--fit {hardware}: the recipe has no GPU memory to fit; use --fit-bytes")
    tried: list[Candidate] = []
    for entry in ladder:
        sizes = predict_recipe(header, entry) if _is_recipe(entry) else predict_file_type(src, entry, runtime)
        weights = sum(sizes.values())
        if hw is None:
            cells = -(-ctx // KV_PAD) * KV_PAD
            need = weights + shape.kv_bytes_per_token("f16", "f16") * cells + shape.state_bytes_per_slot()
            fits = need <= fit_bytes
            detail = f"weights {weights:,} B + context {need - weights:,} B {'≤' if fits else '>'} {fit_bytes:,} B"
        else:
            plan = evaluate(_target_shape(src, sizes), hw, ctx=ctx, ngl=shape.n_layer + 1, n_cpu_moe=0)
            gpus = [p for p in plan.pools if p.name.startswith("gpu")]
            need = sum(p.total for p in gpus)
            fits = all(p.fits for p in gpus)
            detail = "; ".join(f"{p.name} {p.total / 2**30:.2f} of {p.budget / 2**30:.2f} GiB" for p in gpus)
        tried.append(Candidate(entry, sizes, weights, need, fits, detail))
        if fits:
            return entry, tried
    smallest = min(tried, key=lambda c: c.need)
    target = f"{fit_bytes:,} bytes" if hw is None else f"recipe {hardware}"
    raise QuantError(f"nothing fits {target} at --ctx {ctx}: the smallest candidate, {smallest.name}, needs "
                     f"{smallest.need:,} bytes ({smallest.detail}); lower --ctx or allow more memory")

"""What serve / run / plan / bench share: the recipe, the files, the runtime, and a plan that fits."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ggufbridge.errors import RuntimeNotFound
from ggufbridge.ggufio.reader import read_header
from ggufbridge.runtime import locate as loc
from ggufbridge.runtime import memory as pl
from ggufbridge.runtime.artifacts import Artifacts, load_artifacts
from ggufbridge.runtime.recipes import Recipe, load_recipe
from ggufbridge.vision.fidelity import mmproj_kind

# capability (locate.CAPABILITIES name) -> what needs it
_NEEDS = {"arch qwen35moe": "the target", "arch dflash": "the draft", "spec-type draft-dspark": "--draft",
          "projector minicpmv4_6": "the mmproj"}


@dataclass
class Session:
    recipe: Recipe
    art: Artifacts
    target: pl.TargetShape
    draft: pl.DraftShape | None
    plan: pl.MemoryPlan
    rt: loc.Runtime | None
    problems: list[str] = field(default_factory=list)  # why this runtime cannot run the plan


def prepare(out_dir: str | Path, recipe_name: str, *, draft: bool = False, ctx: int | None = None,
            llama_bin: str | None = None, rpc_workers: int | None = None, need_runtime: bool = True) -> Session:
    """Load and plan; with need_runtime, also locate and check the runtime (problems are listed, not raised)."""
    recipe = load_recipe(recipe_name)
    art = load_artifacts(out_dir)
    target = pl.target_from_gguf(art.target.path)
    dshape = None
    if draft:
        if art.draft is None:
            from ggufbridge.errors import ManifestError
            raise ManifestError(f"--draft: {Path(out_dir) / 'manifest.json'} lists no 'draft' file; convert the "
                                f"DSpark draft into this folder first")
        dshape = pl.draft_from_gguf(art.draft.path)
    mmproj = pl.gguf_tensor_bytes(art.mmproj.path) if art.mmproj else 0
    plan = pl.make_plan(target, recipe, ctx=ctx, draft=dshape, mmproj_bytes=mmproj, rpc_workers=rpc_workers)
    s = Session(recipe, art, target, dshape, plan, None)
    if not need_runtime:
        return s
    try:
        s.rt = loc.locate(llama_bin)
    except RuntimeNotFound as e:
        s.problems.append(str(e))
        return s
    s.problems += runtime_problems(s)
    return s


def runtime_problems(s: Session) -> list[str]:
    rt, recipe = s.rt, s.recipe
    out = []
    needed = {"arch qwen35moe"}
    if s.draft is not None:
        needed |= {"arch dflash", "spec-type draft-dspark"}
    if s.art.mmproj is not None:
        needed.add("projector minicpmv4_6")
        if mmproj_kind(read_header(s.art.mmproj.path).kv) == "upstream-4.7" and not rt.knows_minicpmv4_7:
            out.append(f"projector minicpmv4_7 (the mmproj): libmtmd in {rt.bin_dir} does not load upstream's "
                       f"MiniCPM-V 4.7 projector type; build the patched runtime with scripts/build_runtime.sh")
    for r in loc.check(rt):
        if (r.name in needed or r.name in ("tool llama-server", "llama-server --version")) and not r.ok:
            out.append(f"{r.name} ({_NEEDS.get(r.name, 'serving')}): {r.detail}; {r.fix}")
    backends = rt.backends
    if recipe.backend not in backends:
        out.append(f"recipe {recipe.name} needs the {recipe.backend} backend; the runtime in {rt.bin_dir} has "
                   f"{', '.join(backends) or 'none'}: run scripts/build_runtime.sh --{recipe.backend} or pick "
                   f"--recipe cpu")
    if s.plan.pools and recipe.rpc["workers"] and "rpc" not in backends:
        out.append(f"recipe {recipe.name} offloads to RPC workers; the runtime in {rt.bin_dir} was built without "
                   f"the rpc backend (GGML_RPC=ON)")
    return out

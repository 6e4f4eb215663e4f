"""What serve / run / plan / bench share: the recipe, the files, the runtime, and a plan that fits."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ggufbridge.errors import ManifestError, RuntimeNotFound
from ggufbridge.ggufio.reader import read_header
from ggufbridge.runtime import locate as loc
from ggufbridge.runtime import memory as pl
from ggufbridge.runtime import pairing, patches
from ggufbridge.runtime.artifacts import Artifact, Artifacts, ModelSpec, load_artifacts
from ggufbridge.runtime.recipes import Recipe, load_recipe

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
    image_loss: str | None = None  # one line when this runtime and mmproj lay images out other than the model does


def prepare(out_dir: "str | Path | ModelSpec", recipe_name: str, *, draft: bool = False, ctx: int | None = None,
            llama_bin: str | None = None, rpc_workers: int | None = None, need_runtime: bool = True,
            parallel: int | None = None) -> Session:
    """Load and plan (`parallel` slots, default the recipe's server.parallel); with need_runtime, also locate and
    check the runtime (problems are listed, not raised).
    `out_dir`: an OUT_DIR, a folder of GGUFs, a .gguf file or a hub spec, or a ModelSpec naming the projector and
    draft files too (runtime.artifacts)."""
    recipe = load_recipe(recipe_name)
    spec = ModelSpec.of(out_dir)
    art = load_artifacts(spec, want_draft=draft, progress=True)
    target = pl.target_from_gguf(art.target.path, art.target.parts)
    dshape = None
    if draft:
        if art.draft is None:
            raise ManifestError(f"--draft: {art.missing('draft')}; convert the DSpark "
                                f"draft into this folder first, or name one with --model-draft FILE")
        pairing.check_draft([read_header(p) for p in art.target.files], read_header(art.draft.path))
        dshape = pl.draft_from_gguf(art.draft.path)
    mmproj = pl.gguf_tensor_bytes(art.mmproj.path, art.mmproj.parts) if art.mmproj else 0
    plan = pl.make_plan(target, recipe, ctx=ctx, draft=dshape, mmproj_bytes=mmproj, rpc_workers=rpc_workers,
                        slots=parallel)
    s = Session(recipe, art, target, dshape, plan, None)
    if not need_runtime:
        return s
    try:
        s.rt = loc.locate(llama_bin)
    except RuntimeNotFound as e:
        s.problems.append(str(e))
        return s
    s.problems += runtime_problems(s)
    if s.art.mmproj is not None:
        problem, s.image_loss = patches.image_fidelity(s.rt, read_header(s.art.mmproj.path).kv)
        if problem:
            s.problems.append(f"the mmproj {s.art.mmproj.path.name}: {problem}")
    if s.draft is not None and not s.problems:
        s.art = _readable_draft(s)
    return s


def _readable_draft(s: Session) -> Artifacts:
    """A draft whose DSpark values are stored as upstream's `dspark.*` keys, on a runtime that reads only
    `dflash.*`: served from a copy with the keys renamed (runtime.pairing.normalised_draft)."""
    d = s.art.draft
    if s.rt.has_string(pairing.DRAFT_KEYS["block_size"][1], "libllama"):
        return s.art
    path = pairing.normalised_draft(d.path, loc.cache_dir() / "drafts")
    if path == d.path:
        return s.art
    files = dict(s.art.files, draft=Artifact(d.role, path, path.stat().st_size, None, d.type))
    return Artifacts(s.art.out_dir, files, s.art.source, s.art.notes)


def runtime_problems(s: Session) -> list[str]:
    rt, recipe = s.rt, s.recipe
    out = []
    needed = {"arch qwen35moe"}
    if s.draft is not None:
        needed |= {"arch dflash", "spec-type draft-dspark"}
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

"""`ggufbridge plan`: the memory plan of a model (a converted folder or GGUF files) under a hardware recipe, from
the GGUF headers."""

from __future__ import annotations

import json

import click

from ggufbridge.cli import _options as opt
from ggufbridge.quant.here import judge
from ggufbridge.runtime.session import prepare


@click.command(cls=opt.ModelCommand)
@opt.model("Include the DSpark draft (weights, KV, recurrent snapshots): MODEL's, or the --model-draft FILE.")
@opt.recipe()
@opt.ctx(help="Fixed context size (per slot) instead of searching.")
@opt.parallel()
@opt.llama_bin()
@opt.as_json("Print the plan as JSON (this machine and the verdicts under \"here\").")
def command(model, recipe_name, draft, ctx, parallel, llama_bin, as_json):
    """Weights per device, slots, KV cache, gated-delta-net state, draft, mmproj and compute margin; the chosen
    -c / -np / -ngl / --n-cpu-moe. Then this machine (RAM, and the GPUs with their free memory as the runtime lists
    them) and a verdict per recipe: fits with N GiB spare, or does not fit by N GiB; and which quantisation fits
    here. Exit 2 with an explanation when nothing fits the recipe. MODEL: an OUT_DIR of `convert`, a folder of
    GGUF files, a .gguf file, or hf://ORG/REPO[:QUANT]."""
    s = prepare(model, recipe_name, draft=draft, ctx=ctx, need_runtime=False, parallel=parallel)
    here = judge(s, ctx=ctx, parallel=parallel, llama_bin=llama_bin)
    if as_json:
        click.echo(json.dumps(s.plan.to_dict() | {"here": here.to_dict()}, indent=2))
    else:
        click.echo(s.plan.format())
        click.echo("\n".join(here.lines()))

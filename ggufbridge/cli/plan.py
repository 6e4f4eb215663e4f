"""`ggufbridge plan`: the memory plan of a model (a converted folder or GGUF files) under a hardware recipe, from
the GGUF headers."""

from __future__ import annotations

import json

import click

from ggufbridge.cli import _options as opt
from ggufbridge.runtime.session import prepare


@click.command()
@opt.model("Include the DSpark draft (weights, KV, recurrent snapshots): MODEL's, or FILE.")
@opt.recipe()
@opt.ctx(help="Fixed context size instead of searching.")
@opt.as_json("Print the plan as JSON.")
def command(model, recipe_name, draft, ctx, as_json):
    """Weights per device, KV cache, gated-delta-net state, draft, mmproj and compute margin; the chosen
    -c / -ngl / --n-cpu-moe. Exit 2 with an explanation when nothing fits. MODEL: an OUT_DIR of `convert`, a
    folder of GGUF files, a .gguf file, or hf://ORG/REPO[:QUANT]."""
    s = prepare(model, recipe_name, draft=draft, ctx=ctx, need_runtime=False)
    if as_json:
        click.echo(json.dumps(s.plan.to_dict(), indent=2))
    else:
        click.echo(s.plan.format())

"""`ggufbridge plan`: the memory plan of a converted folder under a hardware recipe, from the GGUF headers."""

from __future__ import annotations

import json

import click

from ggufbridge.cli import _options as opt
from ggufbridge.runtime.session import prepare


@click.command()
@click.argument("out_dir", type=click.Path(file_okay=False))
@opt.recipe()
@opt.draft("Include the DSpark draft (weights, KV, recurrent snapshots).")
@opt.ctx(help="Fixed context size (per slot) instead of searching.")
@opt.parallel()
@opt.as_json("Print the plan as JSON.")
def command(out_dir, recipe_name, draft, ctx, parallel, as_json):
    """Weights per device, slots, KV cache, gated-delta-net state, draft, mmproj and compute margin; the chosen
    -c / -np / -ngl / --n-cpu-moe. Exit 2 with an explanation when nothing fits."""
    s = prepare(out_dir, recipe_name, draft=draft, ctx=ctx, need_runtime=False, parallel=parallel)
    if as_json:
        click.echo(json.dumps(s.plan.to_dict(), indent=2))
    else:
        click.echo(s.plan.format())

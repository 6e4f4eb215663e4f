"""`ggufbridge verify OUT_DIR [--source MODEL_DIR]`: files against the manifest, tensors against the source."""

from __future__ import annotations

import json

import click

from ggufbridge.cli import _options as opt

# "verified, and something differs": neither a usage error (2) nor a bug (1), so scripts can tell the three apart
DIFFERS = 3


@click.command("verify")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--source", default=None, help="The checkpoint OUT_DIR was converted from: compare tensors with it.")
@click.option("--draft-source", "draft", default=None, help="The DSpark draft checkpoint, to compare the draft too.")
@opt.as_json()
@click.pass_context
def command(ctx, out_dir, source, draft, as_json):
    """Check every file of OUT_DIR against manifest.json (size, sha256) and, with --source, every tensor stored
    unquantised against what the source converts to, byte for byte. Exit 0 when all matches, 3 when anything
    differs, 2 when it cannot be checked (no manifest, a bad option)."""
    from dataclasses import asdict

    from ggufbridge.verify import verify

    rep = verify(out_dir, source=source, draft=draft)
    if as_json:
        d = asdict(rep)
        d["out_dir"] = str(rep.out_dir)
        d["ok"] = rep.ok
        click.echo(json.dumps(d, indent=2))
    else:
        click.echo(rep.format())
    if not rep.ok:
        ctx.exit(DIFFERS)

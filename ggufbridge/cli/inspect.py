"""`ggufbridge inspect FILE.gguf`: role, architecture, hyperparameters, bytes per component, draft coupling."""

from __future__ import annotations

import json

import click

from ggufbridge.cli import _options as opt


@click.command("inspect")
@click.argument("gguf_file", type=click.Path(dir_okay=False))
@opt.as_json("Print the report as JSON.")
def command(gguf_file: str, as_json: bool) -> None:
    """Describe a GGUF file written for llama.cpp: a target, an mmproj or a DSpark/DFlash draft.

    Reads only the header and tensor table, so it is quick on any file size.
    """
    from ggufbridge.inspect import format_report, inspect_gguf

    report = inspect_gguf(gguf_file)
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else format_report(report))

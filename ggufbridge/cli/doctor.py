"""`ggufbridge doctor`: which llama.cpp runtime is in use and whether it can run MiniCPM-V 4.7."""

from __future__ import annotations

import sys

import click

from ggufbridge.cli import _options as opt


@click.command()
@opt.llama_bin()
@click.option("--python", "python", default=None, metavar="PY",
              help="Interpreter whose llama_cpp bindings to inspect [default: this one].")
def command(llama_bin: str | None, python: str | None) -> None:
    """Show the runtime (path, commit, backends), check its capabilities, and say how to fix what is missing.

    Exit code 0 when everything is in place, 2 otherwise (one `problem:` line per missing piece on stderr).
    """
    from ggufbridge.runtime.doctor import diagnose

    report = diagnose(llama_bin, python)
    for text, err in report.lines:
        click.echo(text, err=err)
    for p in report.problems:
        click.echo(f"problem: {p}", err=True)
    if report.problems:
        sys.exit(2)
    click.echo("all checks passed")

"""The `ggufbridge` command: a click group whose subcommands live one per module in this package.

Subcommands are imported only when invoked, so `ggufbridge --help` stays fast and a missing optional
dependency of one command cannot break the others.
"""

from __future__ import annotations

import importlib
import logging
import sys

import click

from ggufbridge import __version__

# command name -> module in ggufbridge.cli exporting `command` (a click.Command)
COMMANDS = {
    "convert": "convert",
    "demo": "demo",
    "doctor": "doctor",
    "inspect": "inspect",
    "serve": "serve",
    "plan": "plan",
    "run": "run",
    "bench": "bench",
    "compare": "compare",
    "dump-logits": "dump_logits",
    "quantize": "quantize",
    "imatrix": "imatrix",
    "verify": "verify",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        module = COMMANDS.get(name)
        if module is None:
            return None
        return importlib.import_module(f"ggufbridge.cli.{module}").command


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="ggufbridge")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def cli(verbose: int) -> None:
    """Convert MiniCPM-V 4.7 35B-A3B and its DSpark draft to GGUF, serve them with llama.cpp,
    and measure how close the result is to the original model."""
    level = logging.WARNING - 10 * verbose if verbose else logging.INFO
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)


def main() -> None:
    cli(prog_name="ggufbridge")

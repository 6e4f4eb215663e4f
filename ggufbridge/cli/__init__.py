"""The `ggufbridge` command: a click group whose subcommands live one per module in this package.

Subcommands are imported only when invoked, so `ggufbridge --help` stays fast and a missing optional
dependency of one command cannot break the others. The group is where errors become exit codes: an error the user
can act on is one line and exit 2 (`_common.user_errors`), a click usage error is click's message and exit 2, and
Ctrl-C/SIGTERM is one line and exit 128 + signal
(`_common.interruptible`); anything else is a bug: its traceback, an "internal error" line and exit 1 (`main`).
"""

from __future__ import annotations

import importlib
import logging
import sys
import traceback

import click

from ggufbridge import __version__
from ggufbridge.cli._common import INTERNAL_ERROR, interruptible, user_errors

# command name -> module in ggufbridge.cli exporting `command` (a click.Command)
COMMANDS = {
    "build-runtime": "build_runtime",
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

# commands that load models in this process through the bindings (llama_cpp): the bindings' native libraries are
# loaded before the command imports numpy. On the H200 image a process that had imported numpy first died with
# SIGSEGV at its first GPU model load, the unpatched tree too (4 runs of 4; llama_cpp first: 2 of 2 loaded;
# benchmarks/device.sh import-order, docs/quant.md "Known problem"); llama-cpp-python users report the same for
# pandas imported first (abetlen/llama-cpp-python#1581). `doctor` imports the bindings in a child interpreter on
# purpose and is left out.
BINDINGS_FIRST = frozenset({"compare", "dump-logits", "quantize", "imatrix", "demo"})


def _load_bindings_first() -> None:
    try:
        import llama_cpp  # noqa: F401
    except Exception:  # noqa: BLE001 - a missing or broken runtime is reported where the command uses it
        pass


# -v / -vv: the level of ggufbridge's own loggers and of everything else (libraries: huggingface_hub, urllib3...).
# Without -v ggufbridge says at INFO what it decided on the user's behalf (a layout it recognised, a file it removed
# or replaced, a download's path); -v adds its DEBUG lines, -vv the libraries' too.
LOG_LEVELS = {0: (logging.INFO, logging.WARNING), 1: (logging.DEBUG, logging.WARNING),
              2: (logging.DEBUG, logging.DEBUG)}


class BarAwareHandler(logging.StreamHandler):
    """A line logged while a progress bar runs (a unit's KL during `--fit-bytes`, a fallback while quantising) is
    written above the bar (tqdm.write clears it and draws it again below) instead of being glued to its end."""

    def emit(self, record: logging.LogRecord) -> None:
        tq = sys.modules.get("tqdm")  # no bar without tqdm imported: not imported here for that
        if tq is None or not getattr(tq.tqdm, "_instances", None):
            super().emit(record)
            return
        try:
            tq.tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 (logging's own contract: a handler reports, never raises)
            self.handleError(record)


def configure_logging(verbose: int) -> None:
    """Messages on stderr, without decoration; levels by LOG_LEVELS[min(verbose, 2)]."""
    ours, others = LOG_LEVELS[min(verbose, 2)]
    root = logging.getLogger()
    if not root.handlers:  # an embedding program (or pytest) that configured logging keeps its handlers
        handler = BarAwareHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
    root.setLevel(others)
    logging.getLogger("ggufbridge").setLevel(ours)


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        module = COMMANDS.get(name)
        if module is None:
            return None
        if name in BINDINGS_FIRST and "numpy" not in sys.modules:
            _load_bindings_first()
        cmd = importlib.import_module(f"ggufbridge.cli.{module}").command
        if not getattr(cmd, "_ggufbridge_errors", False):  # wrap once per process, however often it is looked up
            cmd.callback = user_errors(interruptible(cmd.callback))
            cmd._ggufbridge_errors = True
        return cmd


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="ggufbridge")
@click.option("-v", "--verbose", count=True, help="More log output: -v ggufbridge's debug lines, -vv libraries' too.")
def cli(verbose: int) -> None:
    """Convert MiniCPM-V 4.7 35B-A3B and its DSpark draft to GGUF, serve them with llama.cpp,
    and measure how close the result is to the original model."""
    configure_logging(verbose)


def main() -> None:
    try:
        cli(prog_name="ggufbridge")
    except Exception as e:  # click has already handled usage and user errors: what is left is a bug
        traceback.print_exc()
        print(INTERNAL_ERROR.format(f"{type(e).__name__}: {e}"), file=sys.stderr)
        sys.exit(1)

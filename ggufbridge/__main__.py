"""The `ggufbridge` program (console script and `python -m ggufbridge`).

Termination signals are handled from this module's first statement, before anything else is imported: `_signal`
and `os` are modules the interpreter has already loaded while starting, so installing the handlers costs no import
(`signal` itself would first import `enum`). Until a command installs its own handlers around its body
(`signals.interrupts_as_exceptions`), SIGINT, SIGTERM and SIGHUP end the program at once with one line and exit
128 + signal. What is left uncovered is the interpreter's own start-up before this module runs (measured in
docs/internals.md, "Signals from the first instruction").
"""

import _signal
import os

_NAMES = {getattr(_signal, n): n for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(_signal, n)}


def _exit_now(signum, _frame):
    # the same line and code as ggufbridge.signals gives during a command: nothing has been written or started yet
    os.write(2, f"Error: interrupted by {_NAMES.get(signum, signum)}\n".encode())
    os._exit(128 + signum)


for _s in _NAMES:
    _signal.signal(_s, _exit_now)


def main() -> None:
    from ggufbridge.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()

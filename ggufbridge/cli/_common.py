"""Shared pieces of the CLI: turning library errors into one-line messages with exit code 2, and termination
signals into the clean-up path of Ctrl-C for commands that write files."""

from __future__ import annotations

import functools
import signal

import click

from ggufbridge.errors import GGUFBridgeError


class UserError(click.ClickException):
    exit_code = 2


class SignalExit(click.ClickException):
    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}; temporary files removed, nothing "
                         f"half-written left under a final name")
        self.exit_code = 128 + signum  # the shell's convention for "killed by signal N"


def user_errors(fn):
    """Run a command body; a GGUFBridgeError (or OSError) becomes `Error: <one line>` and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except GGUFBridgeError as e:
            raise UserError(str(e)) from None
        except OSError as e:
            raise UserError(f"{e.strerror or e}: {e.filename}" if e.filename else str(e)) from None

    return wrapper


def writes_files(fn):
    """For commands that write: SIGTERM/SIGHUP unwind like Ctrl-C (so every `except`/`finally` removes its
    temporary files), and any of them ends in one line and exit 128 + signal number."""
    from ggufbridge.signals import interrupts_as_exceptions

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with interrupts_as_exceptions():
            try:
                return fn(*args, **kwargs)
            except KeyboardInterrupt as e:
                raise SignalExit(getattr(e, "signum", signal.SIGINT)) from None

    return wrapper

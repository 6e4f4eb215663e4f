"""Shared pieces of the CLI: which exceptions are the user's to act on (one line, exit 2) and which are bugs
(traceback, exit 1), and termination signals as the clean-up path of Ctrl-C for commands that write files."""

from __future__ import annotations

import errno
import functools
import signal

import click

from ggufbridge.errors import GGUFBridgeError

# OSErrors about the machine rather than about our code, even when they name no file: the user can act on them.
ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS}
INTERNAL_ERROR = ("ggufbridge: internal error (a bug in ggufbridge, not a problem with your input): {}\n"
                  "Please report it with the traceback above.")


class UserError(click.ClickException):
    exit_code = 2


class SignalExit(click.ClickException):
    def __init__(self, signum: int, cleaned: bool = True):
        super().__init__(f"interrupted by {signal.Signals(signum).name}" + (
            "; temporary files removed, nothing half-written left under a final name" if cleaned else ""))
        self.exit_code = 128 + signum  # the shell's convention for "killed by signal N"


def user_message(e: BaseException) -> str | None:
    """The one-line message of an error the user can act on: the project's own exceptions (ggufbridge.errors), and
    an OSError naming a file (missing, unreadable, a directory) or about the machine (disk full, permissions).
    None for anything else: that is a bug, and it shows as one (traceback, exit 1)."""
    if isinstance(e, GGUFBridgeError):
        return one_line(str(e))
    if isinstance(e, OSError):
        if e.filename:
            return one_line(f"{e.strerror or e}: {e.filename}")
        if e.errno in ENVIRONMENT_ERRNOS:
            return one_line(str(e))
    return None


def one_line(msg: str) -> str:
    """Messages quote untrusted names (tensor names, keys, file names): their line breaks and other control
    characters are shown escaped, so that the message stays the one line it promises to be."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in msg)


def user_errors(fn):
    """Run a command body; an error the user can act on (see `user_message`) becomes `Error: <one line>` and
    exit 2. The `ggufbridge` group applies this to every command; scripts with their own click command use it."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (GGUFBridgeError, OSError) as e:
            msg = user_message(e)
            if msg is None:
                raise
            raise UserError(msg) from None

    return wrapper


def _on_signals(cleaned: bool):
    def decorate(fn):
        from ggufbridge.signals import interrupts_as_exceptions

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with interrupts_as_exceptions():
                try:
                    return fn(*args, **kwargs)
                except KeyboardInterrupt as e:
                    raise SignalExit(getattr(e, "signum", signal.SIGINT), cleaned) from None

        return wrapper

    return decorate


# For commands that write: SIGTERM/SIGHUP unwind like Ctrl-C (so every `except`/`finally` removes its temporary
# files), and any of them ends in one line and exit 128 + signal number.
writes_files = _on_signals(cleaned=True)
# The same for every command (the `ggufbridge` group applies it): Ctrl-C is exit 130 and one line, never click's
# "Aborted!" and exit 1 (the code of a bug), and child processes are stopped by the `finally` that started them.
interruptible = _on_signals(cleaned=False)

"""Termination signals as exceptions, shared by every command that writes files.

SIGTERM (what `kill`, `timeout`, systemd and container stops send) would otherwise end the process without running
any `except`/`finally`, leaving temporary files behind. Inside `interrupts_as_exceptions()` SIGINT, SIGTERM and
SIGHUP all raise `Interrupted` (a KeyboardInterrupt), so they take the same clean-up path as Ctrl-C.
`deferred()` holds them back for the few renames that commit an output generation, which must not be cut halfway.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


class Interrupted(KeyboardInterrupt):
    """A termination signal arrived; `signum` says which."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_state = {"deferring": 0, "pending": None}


def _raise(signum, _frame):
    if _state["deferring"]:
        _state["pending"] = signum
        return
    raise Interrupted(signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def interrupts_as_exceptions():
    """SIGINT/SIGTERM/SIGHUP raise `Interrupted` in the main thread while the block runs (no-op elsewhere)."""
    if not _main_thread():
        yield
        return
    old = {s: signal.signal(s, _raise) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextmanager
def deferred():
    """Hold termination signals until the block has finished, then deliver the first one that arrived."""
    if not _main_thread():
        yield
        return
    old = {s: signal.signal(s, _raise) for s in SIGNALS}
    _state["deferring"] += 1
    try:
        yield
    finally:
        _state["deferring"] -= 1
        for s, h in old.items():
            signal.signal(s, h)
        if not _state["deferring"]:
            pending, _state["pending"] = _state["pending"], None
            if pending is not None:
                signal.raise_signal(pending)  # to whatever handler was in place before: the usual behaviour

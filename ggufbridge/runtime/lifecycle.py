"""A llama-server in the foreground: started, watched until it is ready, kept until a signal or its own exit,
and never left behind.

`serve` runs a server for as long as the user wants it. SIGINT and SIGTERM are forwarded to the server's process
group (it shuts down cleanly, then we return); a signal that arrives while the process is being created is
delivered once it exists; whatever happens, the server is stopped before `run_foreground` returns or raises.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ggufbridge.errors import ServerError
from ggufbridge.runtime import server as sv

FORWARDED = (signal.SIGINT, signal.SIGTERM)


@dataclass
class Outcome:
    """How a foreground server ended: `signum` is the signal that stopped it; `ready` whether it got that far."""

    signum: int
    ready: bool
    exit_code: int | None


def run_foreground(srv: sv.Server, timeout: float, on_ready: Callable[[], None],
                   before_start: Callable[[], None] | None = None) -> Outcome:
    """Start `srv`, wait up to `timeout` s for /health, call `on_ready()`, then wait for a signal.

    `before_start()` runs under the same signal handling, before the server process exists (serve's local RPC
    workers start there); a signal during it stops before the server is created.

    Returns the Outcome of a stop by SIGINT/SIGTERM (before or after ready). Raises ServerError when the server
    fails to become ready or exits on its own (with the last lines of its log)."""
    stopping: dict[str, int | None] = {"sig": None}

    def forward(signum, _frame):
        stopping["sig"] = signum
        if srv.proc is not None:
            sv.signal_group(srv.proc, signal.SIGTERM)

    old = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        if before_start is not None:
            before_start()
            if stopping["sig"] is not None:
                return Outcome(stopping["sig"], False, None)
        srv.start()
        if stopping["sig"] is not None:  # a signal that arrived while the process was being created
            sv.signal_group(srv.proc, signal.SIGTERM)
        try:
            srv.wait_ready(timeout)
        except ServerError:
            if stopping["sig"] is not None:
                return Outcome(stopping["sig"], False, srv.proc.poll())
            raise
        on_ready()
        code = srv.proc.wait()
        if stopping["sig"] is None:
            raise ServerError(f"llama-server exited unexpectedly with code {code}: {sv.log_reason(srv.log_path)} "
                              f"(log: {srv.log_path})")
        return Outcome(stopping["sig"], True, code)
    finally:
        srv.stop()
        for sig, h in old.items():
            signal.signal(sig, h)


def default_log(out_dir: Path | None) -> Path:
    """OUT_DIR/llama-server.log, or a temporary folder when OUT_DIR is read-only (a shared model store) or None (a
    model in the hub cache)."""
    if out_dir is not None and os.access(out_dir, os.W_OK):
        return out_dir / "llama-server.log"
    return Path(tempfile.mkdtemp(prefix="ggufbridge-serve-")) / "llama-server.log"


def check_workers(endpoints: list[str]) -> None:
    """ServerError naming the first RPC worker that does not accept a connection, with the command to start it."""
    for ep in endpoints:
        h, p = ep.rsplit(":", 1)
        if not reachable(h.strip("[]"), int(p)):
            raise ServerError(f"RPC worker {ep} is not reachable; on that host run "
                              f"`ggml-rpc-server --host {h} --port {p}`")


def reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=3):
            return True
    except OSError:
        return False


def wildcard(host: str) -> bool:
    """Whether `host` listens on every address: 0.0.0.0, ::, and spellings the resolver maps there ("0", "[::]")."""
    h = host.strip().strip("[]")
    if h in ("", "*"):
        return True
    try:
        return ipaddress.ip_address(h).is_unspecified
    except ValueError:
        pass
    try:
        return socket.inet_aton(h) == b"\0\0\0\0"  # "0", "0.0", "0x0": inet_aton's short forms
    except OSError:
        return False

"""A llama-server in the foreground: started, watched until it is ready, kept until a signal or its own exit,
and never left behind.

`serve` runs a server for as long as the user wants it, and stops it within seconds of being asked, whatever its
clients do. The first SIGINT or SIGTERM is forwarded to the server's process group as SIGTERM; a server that has
not exited `STOP_GRACE` seconds later is killed (SIGKILL), which also closes every client connection it held. A
second signal kills it at once. A signal that arrives while the process is being created is delivered once it
exists; whatever happens, the server is stopped before `run_foreground` returns or raises.

Why the grace is still there: llama-server's own shutdown ends its task loop (after the batch it is computing),
then waits for its HTTP threads (tools/server/server.cpp:542-545, ctx_http.join() after start_loop()). A thread
answering a request waited for results the stopped loop never sends, for as long as its client kept the
connection open (server-queue.cpp:550-558 gives up only when the client has gone), and the signal handler could
deadlock on a mutex the interrupted thread held, so the first SIGTERM alone never ended a server with clients in
flight; patch 0030 (server-shutdown-answers-in-flight-requests) runs the shutdown off the handler, answers them 503
within a polling interval and the server exits 0. The kill remains for what the patch cannot shorten (a batch
longer than the grace, a hang) and for a runtime built without it.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ggufbridge.errors import ServerError
from ggufbridge.runtime import server as sv

FORWARDED = (signal.SIGINT, signal.SIGTERM)
# seconds from SIGTERM to SIGKILL: an idle llama-server exits in well under one; the budget the user sees is this
# plus the instant a kill takes (docs/usage.md, "Stopping `serve`")
STOP_GRACE = 5.0


@dataclass
class Outcome:
    """How a foreground server ended: `signum` is the signal that stopped it; `ready` whether it got that far;
    `exit_code` the server's (negative: the signal that ended it, -9 when it had to be killed)."""

    signum: int
    ready: bool
    exit_code: int | None

    def summary(self) -> str:
        """What `serve` says when it stops: "stopped by SIGTERM; llama-server exit code 0"."""
        how = exit_status(self.exit_code)
        if self.exit_code == -signal.SIGKILL:
            how += f": it had not stopped {STOP_GRACE:g} s after SIGTERM, or a second signal came"
        return f"stopped by {signal.Signals(self.signum).name}; llama-server {how}"


def exit_status(code: int | None) -> str:
    """A process's end in words: "exit code 1", "killed by SIGSEGV (signal 11)"."""
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "a signal"
        return f"killed by {name} (signal {-code})"
    return f"exit code {code}"


class _Stopper:
    """The signal side of `run_foreground`: the first signal asks the server to stop, the second kills it."""

    def __init__(self, srv: sv.Server):
        self.srv = srv
        self.sig: int | None = None
        self.asked_at: float | None = None  # when the server's group was sent SIGTERM
        self.kill = False

    def on_signal(self, signum, _frame):
        if self.sig is None:
            self.sig = signum
        else:
            self.kill = True
        self.signal_server()

    def signal_server(self) -> None:
        proc = self.srv.proc
        if proc is None:
            return
        if self.kill:
            sv.signal_group(proc, signal.SIGKILL)
        elif self.asked_at is None:
            self.asked_at = time.monotonic()
            sv.signal_group(proc, signal.SIGTERM)

    def stop(self) -> int | None:
        """Stop the server (if it runs): SIGTERM, SIGKILL once the grace has passed; its exit code."""
        proc = self.srv.proc
        if proc is None:
            return None
        if proc.poll() is None:
            self.signal_server()  # SIGTERM now where none was sent yet (an error, not a signal, brought us here)
            try:
                proc.wait(0 if self.kill else max(0.0, self.asked_at + STOP_GRACE - time.monotonic()))
            except subprocess.TimeoutExpired:
                sv.signal_group(proc, signal.SIGKILL)
                proc.wait()
        return proc.returncode


def run_foreground(srv: sv.Server, timeout: float, on_ready: Callable[[], None],
                   before_start: Callable[[], None] | None = None) -> Outcome:
    """Start `srv`, wait up to `timeout` s for /health, call `on_ready()`, then wait for a signal.

    `before_start()` runs under the same signal handling, before the server process exists (serve's local RPC
    workers start there); a signal during it stops before the server is created.

    Returns the Outcome of a stop by SIGINT/SIGTERM (before or after ready) within `STOP_GRACE` s of the signal.
    Raises ServerError when the server fails to become ready or exits on its own (its exit status and the last
    lines of its log)."""
    stopper = _Stopper(srv)
    old = {sig: signal.signal(sig, stopper.on_signal) for sig in FORWARDED}
    try:
        if before_start is not None:
            before_start()
            if stopper.sig is not None:
                return Outcome(stopper.sig, False, None)
        srv.start()
        if stopper.sig is not None:  # a signal that arrived while the process was being created
            stopper.signal_server()
        log_at = 0
        try:
            srv.wait_ready(timeout, give_up=lambda: stopper.sig is not None)
            log_at = _size(srv.log_path)
        except ServerError:
            if stopper.sig is not None:
                return Outcome(stopper.sig, False, stopper.stop())
            raise
        on_ready()
        while stopper.sig is None:
            try:
                code = srv.proc.wait(0.25)
            except subprocess.TimeoutExpired:
                continue
            if stopper.sig is not None:  # the signal came during the wait, and the server stopped on it
                break
            raise ServerError(f"llama-server stopped while serving ({exit_status(code)}); the last lines of its log: "
                              f"{sv.log_last(srv.log_path, log_at)} (log: {srv.log_path})")
        return Outcome(stopper.sig, True, stopper.stop())
    finally:
        stopper.stop()
        for sig, h in old.items():
            signal.signal(sig, h)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


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
    """Whether `host` listens on every address: 0.0.0.0, ::, their IPv4-mapped form (::ffff:0.0.0.0, which the
    resolver hands to an IPv4 socket as 0.0.0.0), and spellings the resolver maps there ("0", "[::]")."""
    h = host.strip().strip("[]").split("%", 1)[0]  # an IPv6 zone (fe80::1%eth0) names an interface, not an address
    if h in ("", "*"):
        return True
    try:
        ip = ipaddress.ip_address(h)
        mapped = getattr(ip, "ipv4_mapped", None)
        return ip.is_unspecified or (mapped is not None and mapped.is_unspecified)
    except ValueError:
        pass
    try:
        return socket.inet_aton(h) == b"\0\0\0\0"  # "0", "0.0", "0x0": inet_aton's short forms
    except OSError:
        return False

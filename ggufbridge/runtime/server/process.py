"""Starting llama.cpp tools and making sure they never outlive us; reading why one stopped from its log.

A launched tool runs in its own process group (so a signal reaches all of it) and, on Linux, with
PR_SET_PDEATHSIG: the kernel kills it when the ggufbridge process that started it dies, even by SIGKILL.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ggufbridge.errors import ServerError
from ggufbridge.runtime.server.client import http_json

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int):
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

    def setup():
        # runs in the child between fork and exec (after setsid from start_new_session)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)
    return setup


def spawn(argv: list[str], *, env: dict | None = None, log_path: Path | None = None, stdin=subprocess.DEVNULL,
          stdout=None, stderr=None) -> subprocess.Popen:
    """Start a tool in its own session/process group, killed by the kernel if this process dies."""
    if log_path is not None:
        log = open(log_path, "ab")
        stdout = stderr = log
    kw = {}
    if sys.platform.startswith("linux"):
        kw["preexec_fn"] = _die_with_parent(os.getpid())
    try:
        return subprocess.Popen(argv, env=env, stdin=stdin, stdout=stdout, stderr=stderr, start_new_session=True,
                                **kw)
    except OSError as e:
        raise ServerError(f"cannot start {argv[0]}: {e.strerror or e}") from None
    finally:
        if log_path is not None:
            log.close()


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> int:
    """SIGTERM the process group, SIGKILL it after `timeout`; returns the exit code."""
    if proc.poll() is None:
        signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def check_bindable(host: str, port: int) -> None:
    """Raise ServerError unless llama-server could listen on host:port: the port taken, or a --host that is no
    address of this machine (an unknown name, another machine's address), each said as what it is."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # same option the server sets, so a port in TIME_WAIT is not mistaken for one in use
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ServerError(f"port {port} on {host} is already in use; pick another with --port") from None
            if e.errno == errno.EACCES:
                raise ServerError(f"port {port} on {host}: permission denied (ports below 1024 need privileges); "
                                  f"pick another with --port") from None
            reason = e.strerror or str(e)
            raise ServerError(f"--host {host}: cannot listen there ({reason}); expected an address of this machine, "
                              f"e.g. 127.0.0.1 or 0.0.0.0") from None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def log_tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


# llama.cpp's log lines: "0.01.673.542 E llama_model_load: error loading model: ..." (E: error level)
_TAGGED_ERROR = re.compile(r"\d+\.\d+\.\d+\.\d+ E (.*)")


def log_has_error(path: Path) -> bool:
    try:
        return any(_TAGGED_ERROR.search(ln) for ln in path.read_text(errors="replace").splitlines())
    except OSError:
        return False


def log_reason(path: Path) -> str:
    """Why a llama.cpp tool stopped, in one line: its first error-level log line (the cause; later ones are the
    consequences), else the first line that says error, else its last line. The whole tail goes to the debug log."""
    tail = log_tail(path, 40)
    log.debug("last lines of %s:\n%s", path, tail)
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    for ln in lines:
        m = _TAGGED_ERROR.search(ln)
        if m:
            return " ".join(m.group(1).split())
    said = [ln for ln in lines if "error" in ln.lower()]
    return " ".join((said[0] if said else lines[-1] if lines else "(empty log)").split())


def log_last(path: Path, offset: int = 0, n: int = 3) -> str:
    """The last `n` lines of a log from byte `offset` on (a server's, from the moment it was ready), joined into
    one line. What a process wrote last is what it was doing when it died; a line that merely contains "error"
    earlier on (a warning while loading) is not the reason."""
    try:
        with open(path, "rb") as f:
            f.seek(max(offset, f.seek(0, os.SEEK_END) - 65536))  # a long log: its end is enough
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    last = [" ".join(ln.split()) for ln in text.splitlines() if ln.strip()][-n:]
    return " | ".join(last) if last else "(nothing after it was ready)"


class Server:
    """A running llama-server: start(), wait_ready(), url, stop(). Use as a context manager."""

    def __init__(self, argv: list[str], host: str, port: int, log_path: Path, env: dict | None = None):
        self.argv, self.host, self.port, self.log_path, self.env = argv, host, port, Path(log_path), env
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}"

    def start(self) -> "Server":
        check_bindable(self.host, self.port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_bytes(b"")
        self.proc = spawn(self.argv, env=self.env, log_path=self.log_path)
        return self

    def wait_ready(self, timeout: float = 600.0, give_up: Callable[[], bool] | None = None) -> None:
        """Poll /health until 200. /v1/models is no signal: it answers while the model is still loading. A
        ServerError as soon as `give_up()` says so (a signal asked us to stop)."""
        deadline = time.monotonic() + timeout
        while True:
            if give_up is not None and give_up():
                raise ServerError("stopped before llama-server was ready")
            code = self.proc.poll()
            if code is not None:
                raise ServerError(f"llama-server exited with code {code} during start-up: "
                                  f"{log_reason(self.log_path)} (log: {self.log_path})")
            try:
                status, _ = http_json(self.url + "/health", timeout=2.0)
                if status == 200:
                    return
            except (OSError, ValueError):
                pass  # not listening yet
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(f"llama-server did not become healthy within {timeout:.0f} s: "
                                  f"{log_reason(self.log_path)} (log: {self.log_path})")
            time.sleep(0.2)

    def stop(self, timeout: float = 10.0) -> int | None:
        return stop(self.proc, timeout) if self.proc is not None else None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

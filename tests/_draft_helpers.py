"""Test helpers for the DSpark draft tests: a llama-server that never outlives the test, and greedy completions."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from ggufbridge.runtime.locate import locate
from _cores import THREADS


def _die_with_parent() -> None:
    """In the child: ask the kernel to kill the server if the test process dies without cleaning up (Linux)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def post_json(url: str, body: dict, timeout: float = 120.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def llama_server(model: Path, draft: Path | None = None, *, extra: tuple[str, ...] = (), log_path: Path,
                 timeout: float = 120.0, slots: tuple[str, ...] = ("-c", "512", "-np", "1")):
    """Start llama-server on 127.0.0.1:<free port>; yield its base URL; stop it (and only it) at the end.
    `slots`: its context and slot arguments (a plan's `context_args()` for several)."""
    rt = locate()
    port = free_port()
    argv = [str(rt.tool("llama-server")), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            *slots, "-t", str(THREADS), "--no-warmup", "--no-webui", *extra]
    if draft is not None:
        argv += ["-md", str(draft), "--spec-type", "draft-dspark"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=rt.env(), start_new_session=True, preexec_fn=_die_with_parent)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode}:\n{_tail(log_path)}")
            try:
                if _get(url + "/health")[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama-server not ready after {timeout}s:\n{_tail(log_path)}")
            time.sleep(0.2)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: the group is exactly this server
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def greedy(url: str, prompt, n_predict: int = 24) -> tuple[list[int], dict]:
    """Greedy continuation (token ids) of a text or token-id prompt, and the server's timings for it."""
    res = post_json(url + "/completion", {
        "prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "seed": 0,
        "cache_prompt": False, "return_tokens": True, "ignore_eos": True,
    })
    return list(res["tokens"]), res.get("timings", {})

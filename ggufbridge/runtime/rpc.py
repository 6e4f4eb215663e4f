"""RPC workers started by `serve --rpc local`: the recipe's ggml-rpc-server workers on this machine, on loopback.

For trying a multi-host recipe (spark-x2) on one box, and for a machine with several GPUs: worker i gets GPU i
(`-d CUDA<i>`) when the recipe's backend is CUDA. Workers bind 127.0.0.1 only (the RPC protocol has no
authentication) and run like llama-server: own process group, killed by the kernel if ggufbridge dies, and stopped
by `stop_workers` when the command ends.
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ggufbridge.errors import ServerError
from ggufbridge.runtime import server as sv

LOOPBACK = "127.0.0.1"


@dataclass
class Worker:
    proc: subprocess.Popen
    endpoint: str
    log: Path


def worker_argv(rpc_bin: Path, port: int, index: int, backend: str, threads: int | None = None) -> list[str]:
    a = [str(rpc_bin), "--host", LOOPBACK, "--port", str(port)]
    if backend == "cuda":
        a += ["-d", f"CUDA{index}"]
    if threads:
        a += ["-t", str(threads)]
    return a


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((LOOPBACK, port)) == 0


def start_workers(rpc_bin: Path, n: int, log_dir: Path, *, backend: str, env: dict | None = None,
                  threads: int | None = None, timeout: float = 30.0) -> list[Worker]:
    """Start n workers on free loopback ports and wait until each accepts connections; on failure, stop them all."""
    workers: list[Worker] = []
    try:
        for i in range(n):
            port = sv.free_port(LOOPBACK)
            log = log_dir / f"rpc-worker-{i}.log"
            log.write_bytes(b"")
            proc = sv.spawn(worker_argv(rpc_bin, port, i, backend, threads), env=env, log_path=log)
            workers.append(Worker(proc, f"{LOOPBACK}:{port}", log))
        deadline = time.monotonic() + timeout
        for w in workers:
            port = int(w.endpoint.rsplit(":", 1)[1])
            while not _listening(port):
                if w.proc.poll() is not None:
                    raise ServerError(f"RPC worker {w.endpoint} exited with code {w.proc.returncode} at start-up: "
                                      f"{sv.log_reason(w.log)} (log: {w.log})")
                if time.monotonic() > deadline:
                    raise ServerError(f"RPC worker {w.endpoint} did not listen within {timeout:.0f} s: "
                                      f"{sv.log_reason(w.log)} (log: {w.log})")
                time.sleep(0.1)
    except BaseException:
        stop_workers(workers)
        raise
    return workers


def stop_workers(workers: list[Worker]) -> None:
    for w in workers:
        sv.stop(w.proc)

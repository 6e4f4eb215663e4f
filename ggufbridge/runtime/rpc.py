"""RPC workers started by `serve --rpc local`: the recipe's ggml-rpc-server workers on this machine, on loopback.

For trying a multi-host recipe (spark-x2) on one box, and for a machine with several GPUs. With a GPU backend the
server keeps the local GPUs its plan counts (GPU 0 for spark-x2; none when the recipe lists no local GPU) and
worker i takes the next one, `-d CUDA<n_local + i>`, wrapping around on a box with fewer GPUs (one GPU then holds
both sides: the memory split and the loopback traffic are real, the parallel hardware is not). Workers bind
127.0.0.1 only (the RPC protocol has no authentication) and run like llama-server: own process group, killed by
the kernel if ggufbridge dies, and stopped by `stop_workers` when the command ends.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ggufbridge.errors import ServerError
from ggufbridge.runtime import server as sv
from ggufbridge.runtime.memory import DEVICE_PREFIX

LOOPBACK = "127.0.0.1"


@dataclass
class Worker:
    proc: subprocess.Popen
    endpoint: str
    log: Path


def worker_argv(rpc_bin: Path, port: int, device: str | None, threads: int | None = None) -> list[str]:
    a = [str(rpc_bin), "--host", LOOPBACK, "--port", str(port)]
    if device:
        a += ["-d", device]
    if threads:
        a += ["-t", str(threads)]
    return a


def local_gpus(server_bin: Path, backend: str, env: dict | None = None) -> list[str]:
    """The runtime's own names of this machine's GPUs of `backend` (`llama-server --list-devices`)."""
    prefix = DEVICE_PREFIX.get(backend)
    if prefix is None:
        return []
    try:
        out = subprocess.run([str(server_bin), "--list-devices"], capture_output=True, text=True, env=env,
                             timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ServerError(f"{server_bin} --list-devices failed: {e}") from e
    return re.findall(rf"^\s*({prefix}\d+):", out, flags=re.M)


def worker_devices(n_workers: int, n_local: int, gpus: list[str]) -> list[str | None]:
    """Device of each worker: the GPUs after the server's own n_local, wrapping around; None without GPUs."""
    return [gpus[(n_local + i) % len(gpus)] if gpus else None for i in range(n_workers)]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((LOOPBACK, port)) == 0


def start_workers(rpc_bin: Path, devices: list[str | None], log_dir: Path, *, env: dict | None = None,
                  threads: int | None = None, timeout: float = 30.0) -> list[Worker]:
    """Start one worker per entry of devices (its -d, or the worker's default with None) on free loopback ports
    and wait until each accepts connections; on failure, stop them all."""
    workers: list[Worker] = []
    try:
        for i, device in enumerate(devices):
            port = sv.free_port(LOOPBACK)
            log = log_dir / f"rpc-worker-{i}.log"
            log.write_bytes(b"")
            proc = sv.spawn(worker_argv(rpc_bin, port, device, threads), env=env, log_path=log)
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


def start_local(s, log_dir: Path, *, threads: int | None = None) -> list[Worker]:
    """`--rpc local` for a prepared session: its recipe's workers, placed beside the server's planned GPUs."""
    n_local = sum(1 for p in sv.plan_devices(s.plan) if p.kind != "rpc")
    gpus = local_gpus(s.rt.bin_dir / "llama-server", s.recipe.backend, s.rt.env())
    devices = worker_devices(s.recipe.rpc["workers"], n_local, gpus)
    return start_workers(s.rt.tool("ggml-rpc-server"), devices, log_dir, env=s.rt.env(), threads=threads)


def stop_workers(workers: list[Worker]) -> None:
    for w in workers:
        sv.stop(w.proc)

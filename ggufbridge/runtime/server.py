"""Build the llama-server command from a recipe and a plan, launch it, and make sure it never outlives us.

A launched tool runs in its own process group (so a signal reaches all of it) and, on Linux, with
PR_SET_PDEATHSIG: the kernel kills it when the ggufbridge process that started it dies, even by SIGKILL.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ggufbridge.errors import ServerError
from ggufbridge.runtime.artifacts import Artifacts
from ggufbridge.runtime.plan import Plan
from ggufbridge.runtime.recipes import Recipe

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
_HOSTPORT = re.compile(r"^(?:\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):(\d{1,5})$")


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    draft: bool = False
    rpc: list[str] = field(default_factory=list)
    threads: int | None = None
    metrics: bool = True
    extra: list[str] = field(default_factory=list)
    think: bool | None = None  # None: the recipe's server.think
    reasoning_budget: int | None = None  # None: the recipe's server.reasoning_budget (-1 = unlimited)


def parse_rpc(value: str | None, workers: int) -> list[str]:
    """`HOST:PORT[,HOST:PORT...]`, exactly `workers` of them (the recipe's [rpc] workers)."""
    items = [v.strip() for v in value.split(",") if v.strip()] if value else []
    for v in items:
        m = _HOSTPORT.match(v)
        if not m or not 0 < int(m.group(1)) < 65536:
            raise ServerError(f"--rpc: expected HOST:PORT, found {v!r}")
        if v.startswith("0.0.0.0:"):
            raise ServerError(f"--rpc: {v} is not an address to connect to; give the worker's own address")
    if len(items) != workers:
        raise ServerError(f"--rpc: the recipe needs {workers} worker endpoint(s) (HOST:PORT), found {len(items)}"
                          + ("; start `ggml-rpc-server --host ADDR --port 50052` on the second host and pass "
                             "--rpc ADDR:50052" if workers and not items else ""))
    return items


def model_alias(art: Artifacts) -> str:
    return art.target.path.name.removesuffix(".gguf")


def _common_args(recipe: Recipe, plan: Plan, art: Artifacts, opts: ServeOptions) -> list[str]:
    srv, drf = recipe.server, recipe.draft
    a = ["-m", str(art.target.path), "-b", str(srv["batch"]), "-ub", str(srv["ubatch"]),
         "-fa", srv["flash_attn"], "-ctk", srv["cache_type_k"], "-ctv", srv["cache_type_v"],
         "-ngl", str(plan.n_gpu_layers), "--fit", "off"]  # --fit off: run exactly the planned settings
    if plan.n_cpu_moe:
        a += ["--n-cpu-moe", str(plan.n_cpu_moe)]
    if plan.tensor_split:
        a += ["--tensor-split", ",".join(f"{x:g}" for x in plan.tensor_split)]
    if opts.rpc:
        a += ["--rpc", ",".join(opts.rpc)] + device_args(recipe, plan, mmproj=art.mmproj is not None,
                                                         draft=opts.draft)
    threads = opts.threads or srv["threads"]
    if threads:
        a += ["-t", str(threads)]
    if art.mmproj is not None:
        a += ["--mmproj", str(art.mmproj.path)]
        if not srv["mmproj_offload"]:
            a.append("--no-mmproj-offload")
    a += _reasoning_args(recipe, opts)
    if opts.draft:
        if art.draft is None:
            raise ServerError(f"--draft: {art.out_dir}/manifest.json lists no 'draft' file; convert the DSpark "
                              f"draft into this folder first")
        ngld = drf["n_gpu_layers"]
        a += ["-md", str(art.draft.path), "--spec-type", "draft-dspark",
              "--spec-draft-n-max", str(drf["n_max"]), "--spec-draft-n-min", str(drf["n_min"]),
              "-ngld", str(ngld), "-ctkd", drf["cache_type_k"], "-ctvd", drf["cache_type_v"]]
        if drf["p_min"] > 0:
            a += ["--spec-draft-p-min", f"{drf['p_min']:g}"]
    return a + list(srv["extra_args"]) + list(opts.extra)


def plan_devices(plan: Plan) -> list[tuple[str, str]]:
    """(llama.cpp device name, plan pool name) of each planned device, in the runtime's order (RPC first)."""
    return [(p.device, p.name) for p in plan.pools if p.device]


def device_args(recipe: Recipe, plan: Plan, *, mmproj: bool, draft: bool) -> list[str]:
    """With RPC workers, exactly the planned devices. Left to itself the runtime also takes every local GPU the
    plan did not count (on a box of several GPUs, the ones `--rpc local` gave the workers), and the projector and
    the draft follow the first device, which is a worker: over the network, against the plan."""
    devs = plan_devices(plan)
    if not devs:
        return []
    a = ["--device", ",".join(name for name, _ in devs)]
    local = [name for name, pool in devs if not pool.startswith("rpc")]
    if mmproj:
        a += ["--mmproj-device", local[0] if local and recipe.server["mmproj_offload"] else "none"]
    if draft and recipe.draft["n_gpu_layers"] != 0:
        a += ["--device-draft", devs[-1][0]]  # the plan puts the draft on the last device
    return a


def _reasoning_args(recipe: Recipe, opts: ServeOptions) -> list[str]:
    """Thinking through the runtime's own switch, always explicit: its default `auto` follows the template, and
    turns thinking on for Qwen3.5's (which thinks unless `enable_thinking` is false). `--reasoning` sets the
    template's `enable_thinking` default; a request's `chat_template_kwargs` still overrides it."""
    think = recipe.server["think"] if opts.think is None else opts.think
    budget = recipe.server["reasoning_budget"] if opts.reasoning_budget is None else opts.reasoning_budget
    a = ["--reasoning", "on" if think else "off"]
    if budget >= 0:
        a += ["--reasoning-budget", str(budget)]
    return a


def server_argv(server_bin: str | Path, recipe: Recipe, plan: Plan, art: Artifacts, opts: ServeOptions) -> list[str]:
    a = [str(server_bin), *plan.context_args(), *_common_args(recipe, plan, art, opts), "--host", opts.host,
         "--port", str(opts.port), "-a", model_alias(art), "--jinja",
         # thoughts in message.reasoning_content (OpenAI clients' field), not inline <think> text in content
         "--reasoning-format", "deepseek"]
    if opts.metrics:
        a.append("--metrics")
    if opts.api_key:
        a += ["--api-key", opts.api_key]
    return a


def cli_argv(cli_bin: str | Path, recipe: Recipe, plan: Plan, art: Artifacts, opts: ServeOptions, *, prompt: str,
             n_predict: int, temp: float, seed: int, out_file: str | Path) -> list[str]:
    """llama-cli in this tree is a chat client; -st answers one turn and exits, -o writes the transcript."""
    if plan.slots != 1:
        raise ValueError(f"llama-cli runs one sequence; plan it with one slot, not {plan.slots}")
    return [str(cli_bin), "-c", str(plan.ctx), *_common_args(recipe, plan, art, opts), "-p", prompt, "-st", "-n", str(n_predict),
            "--temp", f"{temp:g}", "--seed", str(seed), "-o", str(out_file), "--jinja"]


def printable(argv: list[str]) -> str:
    """The command as a shell line, with an API key masked."""
    shown = list(argv)
    for i, a in enumerate(shown[:-1]):
        if a == "--api-key":
            shown[i + 1] = "***"
    return shlex.join(shown)


# ------------------------------------------------------------------------------------------- processes


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


def http_json(url: str, body: dict | None = None, api_key: str | None = None, timeout: float = 600.0):
    """(status, parsed JSON or text) for a GET (body None) or a JSON POST."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


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

    def wait_ready(self, timeout: float = 600.0) -> None:
        """Poll /health until 200. /v1/models is no signal: it answers while the model is still loading."""
        deadline = time.monotonic() + timeout
        while True:
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

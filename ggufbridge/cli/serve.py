"""`ggufbridge serve`: run llama-server on a converted folder with a hardware recipe."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import click

from ggufbridge.cli._common import user_errors
from ggufbridge.cli._think import think_options
from ggufbridge.errors import RuntimeNotFound, ServerError
from ggufbridge.runtime import patches
from ggufbridge.runtime import rpc as rpcw
from ggufbridge.runtime import server as sv
from ggufbridge.runtime.recipes import load_recipe
from ggufbridge.runtime.session import prepare


@click.command()
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--recipe", "recipe_name", default="cpu", show_default=True,
              help="Packaged recipe (cpu, rtx4090, spark, spark-x2) or a path to a recipe .toml.")
@click.option("--draft", is_flag=True, help="Speculative decoding with the folder's DSpark draft (opt-in: it "
              "pays only on short prompts; the context is capped at the recipe's draft.ctx_cap unless --ctx).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535))
@click.option("--ctx", type=click.IntRange(256), default=None, help="Context size (default: the plan's).")
@click.option("--api-key", default=None, envvar="GGUFBRIDGE_API_KEY", help="Require this bearer key.")
@click.option("--rpc", default=None, metavar="HOST:PORT[,...]|local",
              help="RPC worker endpoints (spark-x2), or `local`: start the recipe's workers on this machine on "
                   "127.0.0.1 (one per GPU with CUDA) and stop them with this command.")
@click.option("--threads", type=click.IntRange(1), default=None, help="CPU threads for llama-server.")
@click.option("--llama-bin", type=click.Path(file_okay=False), envvar="LLAMA_CPP_BIN",
              help="A llama.cpp build/bin directory to use instead of the cached build.")
@click.option("--media-path", type=click.Path(file_okay=False, exists=True), default=None,
              help="Folder whose images clients may name as file://RELATIVE/PATH in image_url (off by default).")
@click.option("--dry-run", is_flag=True, help="Print the command and the memory plan; start nothing.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), default=None,
              help="llama-server log file (default: OUT_DIR/llama-server.log).")
@click.option("--timeout", type=click.FloatRange(1), default=900.0, show_default=True,
              help="Seconds to wait for /health.")
@think_options
@user_errors
def command(out_dir, recipe_name, draft, host, port, ctx, api_key, rpc, threads, llama_bin, media_path, dry_run,
            log_path, timeout, think, reasoning_budget):
    """Serve OUT_DIR (written by `ggufbridge convert`) with llama-server, OpenAI-compatible under /v1."""
    recipe = load_recipe(recipe_name)
    workers = recipe.rpc["workers"]
    local = rpc is not None and rpc.strip().lower() == "local"
    if local and not workers:
        raise ServerError(f"--rpc local: recipe {recipe.name} has no RPC workers ([rpc] workers = 0)")
    if local:  # the real ports are picked when the workers start
        endpoints = [f"{rpcw.LOOPBACK}:PORT{i}" for i in range(workers)]
    elif dry_run and workers and not rpc:
        endpoints = [f"WORKER{i}:{recipe.rpc['default_port']}" for i in range(workers)]
    else:
        endpoints = sv.parse_rpc(rpc, workers)
    s = prepare(out_dir, recipe_name, draft=draft, ctx=ctx, llama_bin=llama_bin, rpc_workers=workers)
    opts = sv.ServeOptions(host=host, port=port, api_key=api_key, draft=draft, rpc=endpoints, threads=threads,
                           extra=["--media-path", str(Path(media_path).resolve())] if media_path else [],
                           think=think, reasoning_budget=reasoning_budget)
    server_bin = s.rt.bin_dir / "llama-server" if s.rt else Path("llama-server")
    argv = sv.server_argv(server_bin, s.recipe, s.plan, s.art, opts)
    if dry_run:
        if _wildcard(host) and not api_key:
            click.echo(f"warning: listening on {host} without --api-key: anyone on the network can use it", err=True)
        click.echo(f"recipe: {s.recipe.name} - {s.recipe.description}")
        for i, ep in enumerate([] if local else endpoints):
            click.echo(f"on RPC worker {i} (never bind 0.0.0.0): ggml-rpc-server --host {ep.rsplit(':', 1)[0]} "
                       f"--port {ep.rsplit(':', 1)[1]}")
        click.echo(f"command: {sv.printable(argv)}")
        click.echo(s.plan.format())
        for p in s.problems:
            click.echo(f"note: this runtime would refuse to serve: {p}")
        return
    if s.problems:
        raise RuntimeNotFound(s.problems[0] if len(s.problems) == 1 else " | ".join(s.problems))
    if s.art.mmproj is not None and not s.rt.canvas_mrope:
        click.echo(f"warning: images: {patches.STOCK_IMAGE_LOSS}", err=True)
    if _wildcard(host) and not api_key:
        click.echo(f"warning: listening on {host} without --api-key: anyone on the network can use it", err=True)
    for ep in [] if local else endpoints:
        h, p = ep.rsplit(":", 1)
        if not _reachable(h.strip("[]"), int(p)):
            raise ServerError(f"RPC worker {ep} is not reachable; on that host run "
                              f"`ggml-rpc-server --host {h} --port {p}`")
    log = Path(log_path) if log_path else _default_log(Path(out_dir))
    srv = sv.Server(argv, host, port, log, env=s.rt.env())
    stopping = {"sig": None}
    pool: list[rpcw.Worker] = []

    def forward(signum, _frame):
        stopping["sig"] = signum
        if srv.proc is not None:
            sv.signal_group(srv.proc, signal.SIGTERM)
        elif local:  # still starting the workers: leave through the finally below, which stops them
            raise KeyboardInterrupt

    old = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if local:
            log.parent.mkdir(parents=True, exist_ok=True)
            pool += rpcw.start_workers(s.rt.tool("ggml-rpc-server"), workers, log.parent, backend=s.recipe.backend,
                                       env=s.rt.env(), threads=threads)
            opts.rpc = [w.endpoint for w in pool]
            for i, w in enumerate(pool):
                click.echo(f"RPC worker {i}: {w.endpoint} (log {w.log})")
            srv.argv = argv = sv.server_argv(server_bin, s.recipe, s.plan, s.art, opts)
        click.echo(f"command: {sv.printable(argv)}")
        click.echo(s.plan.format())
        sys.stdout.flush()
        srv.start()
        if stopping["sig"] is not None:  # a signal that arrived while the process was being created
            sv.signal_group(srv.proc, signal.SIGTERM)
        try:
            srv.wait_ready(timeout)
        except ServerError:
            if stopping["sig"] is not None:
                click.echo("stopped before the model finished loading", err=True)
                sys.exit(128 + stopping["sig"])
            raise
        click.echo(f"ready: {srv.url}/v1  (model {sv.model_alias(s.art)}; health {srv.url}/health; "
                   f"log {log})")
        sys.stdout.flush()
        code = srv.proc.wait()
        if stopping["sig"] is None:
            raise ServerError(f"llama-server exited unexpectedly with code {code}; last log lines ({log}):\n"
                              f"{sv.log_tail(log)}")
        click.echo(f"stopped (signal {stopping['sig']}), llama-server exit code {code}", err=True)
        sys.exit(0)
    except KeyboardInterrupt:
        click.echo(f"stopped (signal {stopping['sig']}) while starting the RPC workers", err=True)
        sys.exit(128 + (stopping["sig"] or signal.SIGINT))
    finally:
        srv.stop()
        rpcw.stop_workers(pool)
        for sig, h in old.items():
            signal.signal(sig, h)


def _default_log(out_dir: Path) -> Path:
    """OUT_DIR/llama-server.log, or a temporary folder when OUT_DIR is read-only (a shared model store)."""
    import os
    import tempfile

    if os.access(out_dir, os.W_OK):
        return out_dir / "llama-server.log"
    return Path(tempfile.mkdtemp(prefix="ggufbridge-serve-")) / "llama-server.log"


def _reachable(host: str, port: int) -> bool:
    import socket

    try:
        with socket.create_connection((host, port), timeout=3):
            return True
    except OSError:
        return False


def _wildcard(host: str) -> bool:
    """Whether `host` listens on every address: 0.0.0.0, ::, and spellings the resolver maps there ("0", "[::]")."""
    import ipaddress
    import socket

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

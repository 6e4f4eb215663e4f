"""`ggufbridge serve`: run llama-server on a converted folder with a hardware recipe."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ggufbridge.cli import _options as opt
from ggufbridge.errors import RuntimeNotFound, ServerError
from ggufbridge.runtime import lifecycle
from ggufbridge.runtime import rpc as rpcw
from ggufbridge.runtime import server as sv
from ggufbridge.runtime.recipes import load_recipe
from ggufbridge.runtime.session import prepare
from ggufbridge.vision.fidelity import image_fidelity


@click.command()
@click.argument("out_dir", type=click.Path(file_okay=False))
@opt.recipe()
@opt.draft("Speculative decoding with the folder's DSpark draft (opt-in: it pays only on short prompts; the "
           "context is capped at the recipe's draft.ctx_cap unless --ctx).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535))
@opt.ctx()
@click.option("--api-key", default=None, envvar="GGUFBRIDGE_API_KEY", help="Require this bearer key.")
@click.option("--rpc", default=None, metavar="HOST:PORT[,...]|local",
              help="RPC worker endpoints (spark-x2), or `local`: start the recipe's workers on this machine on "
                   "127.0.0.1 (each on its own GPU where there are enough) and stop them with this command.")
@opt.threads()
@opt.llama_bin()
@click.option("--media-path", type=click.Path(file_okay=False, exists=True), default=None,
              help="Folder whose images and videos clients may name as file://RELATIVE/PATH in image_url / video_url "
                   "(off by default).")
@click.option("--dry-run", is_flag=True, help="Print the command and the memory plan; start nothing.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), default=None,
              help="llama-server log file (default: OUT_DIR/llama-server.log).")
@opt.timeout()
@opt.think
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
    extra = ["--media-path", str(Path(media_path).resolve())] if media_path else []
    if s.art.mmproj is not None:  # video_url parts: frames sampled as MiniCPM-V's video processor does
        from ggufbridge.vision import ffshim
        from ggufbridge.vision.video import VideoSettings

        extra += ffshim.server_args(VideoSettings.of_mmproj(s.art.mmproj.path))
    opts = sv.ServeOptions(host=host, port=port, api_key=api_key, draft=draft, rpc=endpoints, threads=threads,
                           extra=extra,
                           think=think, reasoning_budget=reasoning_budget)
    server_bin = s.rt.bin_dir / "llama-server" if s.rt else Path("llama-server")
    argv = sv.server_argv(server_bin, s.recipe, s.plan, s.art, opts)
    if dry_run:
        _warn_wildcard(host, api_key)
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
    if s.art.mmproj is not None and (loss := image_fidelity(s.art.mmproj.path, s.rt)):
        click.echo(f"warning: {loss}", err=True)
    _warn_wildcard(host, api_key)
    if not local:
        lifecycle.check_workers(endpoints)
    log = Path(log_path) if log_path else lifecycle.default_log(Path(out_dir))
    srv = sv.Server(argv, host, port, log, env=s.rt.env())
    pool: list[rpcw.Worker] = []

    def start_workers():
        """--rpc local: the workers on loopback, then the server command that names their real ports."""
        if local:
            log.parent.mkdir(parents=True, exist_ok=True)
            pool.extend(rpcw.start_local(s, log.parent, threads=threads))
            opts.rpc = [w.endpoint for w in pool]
            for i, w in enumerate(pool):
                click.echo(f"RPC worker {i}: {w.endpoint} (log {w.log})")
            srv.argv = sv.server_argv(server_bin, s.recipe, s.plan, s.art, opts)
        click.echo(f"command: {sv.printable(srv.argv)}")
        click.echo(s.plan.format())
        sys.stdout.flush()

    def ready():
        click.echo(f"ready: {srv.url}/v1  (model {sv.model_alias(s.art)}; health {srv.url}/health; log {log})")
        sys.stdout.flush()

    try:
        end = lifecycle.run_foreground(srv, timeout, ready, before_start=start_workers)
    finally:
        rpcw.stop_workers(pool)
    if not end.ready:
        click.echo("stopped before the model finished loading", err=True)
        sys.exit(128 + end.signum)
    click.echo(f"stopped (signal {end.signum}), llama-server exit code {end.exit_code}", err=True)
    sys.exit(0)


def _warn_wildcard(host: str, api_key: str | None) -> None:
    if lifecycle.wildcard(host) and not api_key:
        click.echo(f"warning: listening on {host} without --api-key: anyone on the network can use it", err=True)

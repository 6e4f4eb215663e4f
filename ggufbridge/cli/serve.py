"""`ggufbridge serve`: run llama-server on a model (a converted folder or GGUF files) with a hardware recipe
(`ggufbridge.runtime.serving.serve`)."""

from __future__ import annotations

import sys

import click

from ggufbridge.cli import _options as opt
from ggufbridge.runtime.server import SERVE_N_PREDICT
from ggufbridge.runtime.serving import serve


def _say(line: str) -> None:
    click.echo(line)
    sys.stdout.flush()  # whoever reads our stdout through a pipe waits for the `ready:` line


@click.command(cls=opt.ModelCommand)
@opt.model("Speculative decoding with the DSpark draft, MODEL's or --model-draft FILE (opt-in: it pays only on "
           "short prompts; the context is capped at the recipe's draft.ctx_cap unless --ctx).")
@opt.recipe()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535), help="Port to listen on.")
@opt.ctx(help="Context size per slot [default: the plan's].")
@click.option("-n", "--n-predict", type=click.IntRange(-1, opt.INT32_MAX), default=SERVE_N_PREDICT, show_default=True,
              help="Most tokens answered to a request that sets no max_tokens (the chat page sets none); -1: until "
                   "the context is full. A request's own max_tokens still decides.")
@opt.parallel()
@click.option("--api-key", default=None, envvar="GGUFBRIDGE_API_KEY", help="Require this bearer key.")
@click.option("--rpc", default=None, metavar="HOST:PORT[,...]|local",
              help="RPC worker endpoints (spark-x2), or `local`: start the recipe's workers on this machine on "
                   "127.0.0.1 (each on its own GPU where there are enough) and stop them with this command.")
@opt.threads()
@opt.llama_bin()
@click.option("--media-path", type=click.Path(file_okay=False, exists=True), default=None,
              help="Folder whose images and videos clients may name as file://RELATIVE/PATH in image_url / video_url "
                   "[default: none, off]")
@click.option("--dry-run", is_flag=True, help="Print the command and the memory plan; start nothing.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), default=None,
              help="llama-server log file [default: MODEL's folder/llama-server.log; a temporary folder for a hub "
                   "spec or a read-only folder].")
@opt.timeout()
@opt.think
def command(model, recipe_name, draft, host, port, ctx, n_predict, parallel, api_key, rpc, threads, llama_bin,
            media_path, dry_run, log_path, timeout, think, reasoning_budget):
    """Serve MODEL with llama-server, OpenAI-compatible under /v1. MODEL: an OUT_DIR of `ggufbridge convert`, a folder
    of GGUF files, a .gguf file (the mmproj and draft beside it are found as in a folder; --mmproj / --model-draft
    FILE name others), or hf://ORG/REPO[:QUANT]."""
    end = serve(model, recipe=recipe_name, draft=draft, host=host, port=port, ctx=ctx, parallel=parallel,
                api_key=api_key, rpc=rpc,
                threads=threads, llama_bin=llama_bin, media_path=media_path, think=think,
                reasoning_budget=reasoning_budget, n_predict=n_predict, dry_run=dry_run, log_path=log_path,
                timeout=timeout,
                say=_say, warn=lambda line: click.echo(line, err=True))
    if end is None:  # --dry-run
        return
    if not end.ready:
        click.echo("stopped before the model finished loading", err=True)
        sys.exit(128 + end.signum)
    click.echo(end.summary(), err=True)
    sys.exit(0)

"""`ggufbridge run`: one prompt, one answer (`ggufbridge.runtime.oneshot.run_once`)."""

from __future__ import annotations

import click

from ggufbridge.cli import _options as opt
from ggufbridge.runtime.oneshot import run_once


@click.command(cls=opt.ModelCommand)
@opt.model()
@click.option("-p", "--prompt", required=True, help="The user message.")
@opt.recipe()
@opt.n_predict()
@click.option("--temp", type=opt.FiniteFloatRange(0), default=0.0, show_default=True, help="0 = greedy.")
@click.option("--seed", type=click.IntRange(max=opt.INT32_MAX), default=0, show_default=True,
              help="Sampling seed (with --temp > 0; greedy output does not depend on it).")
@opt.ctx(default=4096, help="Context size.")
@click.option("--image", "images", type=click.Path(dir_okay=False), multiple=True,
              help="Ask about this image (repeatable): the chat goes through the patched llama-server, with "
                   "MiniCPM-V 4.7's slicing and canvas M-RoPE, batched prefill and --draft.")
@click.option("--video", "videos", type=click.Path(dir_okay=False), multiple=True,
              help="Ask about this video (repeatable): frames sampled as MiniCPM-V 4.7's video processor does "
                   "(PyAV), laid out on the patched llama-server like --image.")
@opt.llama_bin()
@click.option("--show-command", is_flag=True,
              help="Print the llama.cpp command on stderr: llama-cli for text, llama-server for --image/--video.")
@opt.think
def command(model, prompt, recipe_name, draft, n_predict, temp, seed, ctx, images, videos, llama_bin, show_command,
            think, reasoning_budget):
    """Answer PROMPT once with MODEL's chat template and print the text. MODEL: an OUT_DIR of `convert`, a folder
    of GGUF files, a .gguf file, or hf://ORG/REPO[:QUANT]."""

    def show(line: str) -> None:
        click.echo(f"command: {line}", err=True)

    click.echo(run_once(model, prompt, recipe=recipe_name, draft=draft, n_predict=n_predict, temp=temp, seed=seed,
                        ctx=ctx, images=list(images), videos=list(videos), llama_bin=llama_bin, think=think,
                        reasoning_budget=reasoning_budget, on_command=show if show_command else None,
                        on_warning=lambda line: click.echo(line, err=True)))

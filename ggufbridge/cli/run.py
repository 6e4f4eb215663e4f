"""`ggufbridge run`: one prompt, one answer: through llama-cli for text, through a private llama-server for
images (llama-cli in this tree takes no image on the command line)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from ggufbridge.cli import _options as opt
from ggufbridge.errors import RuntimeNotFound, ServerError
from ggufbridge.runtime import server as sv
from ggufbridge.runtime.session import prepare
from ggufbridge.vision.fidelity import image_fidelity


def assistant_text(transcript: str) -> str:
    """The answer from llama-cli's -o transcript ("User:\\n...\\n\\nAssistant:\\n<answer>\\n\\n")."""
    marker = "Assistant:\n"
    i = transcript.rfind(marker)
    if i < 0:
        raise ServerError(f"llama-cli wrote no answer (transcript: {transcript[:200]!r})")
    return transcript[i + len(marker):].removesuffix("\n").removesuffix("\n")


@click.command()
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("-p", "--prompt", required=True, help="The user message.")
@opt.recipe()
@opt.draft()
@opt.n_predict()
@click.option("--temp", type=click.FloatRange(0), default=0.0, show_default=True, help="0 = greedy.")
@click.option("--seed", type=click.IntRange(max=opt.INT32_MAX), default=0, show_default=True)
@opt.ctx(default=4096, help="Context size.")
@click.option("--image", "images", type=click.Path(dir_okay=False), multiple=True,
              help="Ask about this image (repeatable): the chat goes through the patched llama-server, with "
                   "MiniCPM-V 4.7's slicing and canvas M-RoPE, batched prefill and --draft.")
@click.option("--video", "videos", type=click.Path(dir_okay=False), multiple=True,
              help="Ask about this video (repeatable): frames sampled as MiniCPM-V 4.7's video processor does "
                   "(PyAV), laid out on the patched llama-server like --image.")
@opt.llama_bin()
@click.option("--show-command", is_flag=True, help="Print the llama-cli command on stderr.")
@opt.think
def command(out_dir, prompt, recipe_name, draft, n_predict, temp, seed, ctx, images, videos, llama_bin, show_command,
            think, reasoning_budget):
    """Answer PROMPT once with the chat template of the converted model and print the text."""
    s = prepare(out_dir, recipe_name, draft=draft, ctx=ctx, llama_bin=llama_bin, rpc_workers=0)
    if s.problems:
        raise RuntimeNotFound(" | ".join(s.problems))
    if images or videos:
        from ggufbridge.runtime.oneshot import ask_with_images

        if s.art.mmproj is None:
            flag = "--image" if images else "--video"
            raise ServerError(f"{flag}: {out_dir}/manifest.json lists no mmproj; convert with the vision tower")
        if loss := image_fidelity(s.art.mmproj.path, s.rt):
            click.echo(f"warning: {loss}", err=True)
        click.echo(ask_with_images(s, prompt, list(images), draft=draft, n_predict=n_predict, temp=temp, seed=seed,
                                   show_command=show_command, think=think, reasoning_budget=reasoning_budget,
                                   videos=list(videos)))
        return
    opts = sv.ServeOptions(draft=draft, think=think, reasoning_budget=reasoning_budget)
    with tempfile.TemporaryDirectory(prefix="ggufbridge-run-") as tmp:
        out_file, log = Path(tmp) / "transcript.txt", Path(tmp) / "llama-cli.log"
        argv = sv.cli_argv(s.rt.tool("llama-cli"), s.recipe, s.plan, s.art, opts, prompt=prompt,
                           n_predict=n_predict, temp=temp, seed=seed, out_file=out_file)
        if show_command:
            click.echo(f"command: {sv.printable(argv)}", err=True)
        proc = sv.spawn(argv, env=s.rt.env(), log_path=log)
        try:
            code = proc.wait()
        finally:
            sv.stop(proc)
        if code != 0 or not out_file.is_file():
            raise ServerError(f"llama-cli failed (exit {code}): {sv.log_reason(log)}")
        # bytes, not read_text: universal newlines would turn a generated "\r" into "\n"
        answer = assistant_text(out_file.read_bytes().decode("utf-8", errors="replace"))
        if not answer and sv.log_has_error(log):
            # llama-cli refuses a turn (e.g. a prompt longer than the context) in its log and still exits 0
            raise ServerError(f"llama-cli gave no answer: {sv.log_reason(log)}")
        click.echo(answer)

"""`ggufbridge bench`: target-only vs DSpark-drafted decoding per prompt length, on a real llama-server."""

from __future__ import annotations

from pathlib import Path

import click

from ggufbridge.cli import _options as opt


@click.command()
@opt.model("Also run with the DSpark draft (MODEL's, or FILE) and compare; says whether drafting pays on this "
           "machine and with which n_max.")
@click.option("--prompt-lengths", default="1k,2k,4k,8k", show_default=True,
              help="Comma-separated prompt lengths in tokens (k = 1024).")
@click.option("--draft-n-max", default=None, metavar="N[,N...]",
              help="Draft lengths to compare with --draft (default: the recipe's draft.n_max), e.g. 2,4,6,8.")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False), default=None,
              help="Your own prompts (JSONL: one JSON string or {\"prompt\": ...} per line) instead of "
                   "synthetic ones of --prompt-lengths.")
@opt.recipe()
@opt.n_predict(default=128, help="Tokens generated per request (EOS ignored).")
@click.option("--repeats", type=click.IntRange(1, opt.INT32_MAX), default=1, show_default=True)
@opt.threads()
@click.option("-o", "--out", "out", type=click.Path(file_okay=False), default=None,
              help="Where to write bench.json / bench.md / bench.png (default: MODEL's folder/bench; ./bench for a "
                   "hub spec).")
@opt.llama_bin()
@opt.timeout("Seconds to wait for each server's /health.")
def command(model, prompt_lengths, draft, draft_n_max, prompts_file, recipe_name, n_predict, repeats, threads, out,
            llama_bin, timeout):
    """Measure prefill and decode tokens/s, time to first token, draft acceptance and whether greedy outputs
    match, for each prompt length (or each of your --prompts); write JSON, a Markdown table and a PNG plot."""
    from ggufbridge.runtime import benchmark as bn
    from ggufbridge.runtime.recipes import MAX_DRAFT_N

    prompts = bn.load_prompts(prompts_file) if prompts_file else None
    lengths = bn.parse_lengths(prompt_lengths)
    sweep = bn.parse_n_max(draft_n_max, MAX_DRAFT_N) if draft_n_max else []
    if sweep and not draft:
        raise click.UsageError("--draft-n-max needs --draft")
    dest = Path(out) if out else bn.default_dir(model)
    result = bn.bench(model, prompt_lengths=lengths, draft=draft, draft_n_max=sweep, prompts=prompts,
                      recipe=recipe_name, n_predict=n_predict, repeats=repeats, threads=threads, log_dir=dest,
                      llama_bin=llama_bin, timeout=timeout,
                      on_command=lambda mode, cmd: click.echo(f"[{mode}] {cmd}", err=True))
    paths = bn.write_outputs(result, dest)
    click.echo(bn.markdown(result))
    for kind, p in paths.items():
        click.echo(f"{kind}: {p}")

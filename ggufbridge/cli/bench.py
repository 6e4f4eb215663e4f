"""`ggufbridge bench`: target-only vs DSpark-drafted decoding per prompt length, or per number of concurrent
clients (--concurrency), on a real llama-server."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from tqdm import tqdm

from ggufbridge.cli import _options as opt


@click.command(cls=opt.ModelCommand)
@opt.model("Also run with the DSpark draft (MODEL's, or --model-draft FILE) and compare; says whether drafting "
           "pays on this machine and with which n_max.")
@click.option("--prompt-lengths", "--depths", "prompt_lengths", default=None,
              help="Comma-separated prompt lengths (context depths) in tokens (k = 1024), e.g. 1k,32k,128k,250k: "
                   "decode and prefill speed at each depth, target-only and with --draft [default: 1k,2k,4k,8k; "
                   "with --concurrency one length, 1k].")
@click.option("--concurrency", default=None, metavar="N[,N...]",
              help="Many clients at once instead: for each N, N concurrent streamed chat requests through the OpenAI "
                   "API of one server with max(N) slots; aggregate and per-stream decode tok/s, time to first "
                   "token p50/p95 (with --draft: drafted too), plotted against N. E.g. 1,2,4,8,16.")
@click.option("--draft-n-max", default=None, metavar="N[,N...]",
              help="Draft lengths to compare with --draft [default: the recipe's draft.n_max], e.g. 2,4,6,8.")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False), default=None,
              help="Your own prompts (JSONL: one JSON string or {\"prompt\": ...} per line) instead of "
                   "synthetic ones of --prompt-lengths.")
@opt.recipe()
@opt.n_predict(default=128, help="Tokens generated per request (EOS ignored).")
@click.option("--repeats", type=click.IntRange(1, opt.INT32_MAX), default=1, show_default=True,
              help="Runs of each prompt length, or of each level with --concurrency (each level's row is then its run "
                   "with the median aggregate decode tok/s; every run is kept in concurrency.json).")
@opt.threads()
@click.option("-o", "--out", "out", type=click.Path(file_okay=False), default=None,
              help="Where to write bench.json / .md / .png, or concurrency.json / .md / .png with --concurrency "
                   "[default: MODEL's folder/bench; ./bench for a hub spec].")
@opt.llama_bin()
@opt.timeout("Seconds to wait for each server's /health.")
def command(model, prompt_lengths, concurrency, draft, draft_n_max, prompts_file, recipe_name, n_predict, repeats,
            threads, out, llama_bin, timeout):
    """Measure prefill and decode tokens/s, time to first token, draft acceptance and whether greedy outputs
    match, for each prompt length (or each of your --prompts); write JSON, a Markdown table and a PNG plot.
    With --concurrency: the same for many clients at once, per number of concurrent streams."""
    from ggufbridge.runtime import benchmark as bn
    from ggufbridge.runtime import concurrency as cc
    from ggufbridge.runtime.recipes import MAX_DRAFT_N

    if concurrency is None:
        prompts = bn.load_prompts(prompts_file) if prompts_file else None
        lengths = bn.parse_lengths(prompt_lengths or "1k,2k,4k,8k")
        sweep = bn.parse_n_max(draft_n_max, MAX_DRAFT_N) if draft_n_max else []
        if sweep and not draft:
            raise click.UsageError("--draft-n-max needs --draft")
    else:
        for flag, given in (("--prompts", prompts_file), ("--draft-n-max", draft_n_max)):
            if given:
                raise click.UsageError(f"{flag} does not go with --concurrency")
        levels = cc.parse_levels(concurrency)
        lengths = bn.parse_lengths(prompt_lengths or "1k")
        if len(lengths) != 1:
            raise click.UsageError(f"--concurrency takes one --prompt-lengths value, found {prompt_lengths!r}")
    dest = Path(out) if out else bn.default_dir(model)
    common = dict(draft=draft, recipe=recipe_name, n_predict=n_predict, threads=threads, log_dir=dest,
                  llama_bin=llama_bin, timeout=timeout,
                  on_command=lambda mode, cmd: tqdm.write(f"[{mode}] {cmd}", file=sys.stderr))
    if concurrency is None:
        bars = []  # made at the first request: a run refused before any server starts shows no bar

        def moved(done, total):
            if not bars:
                bars.append(tqdm(total=total, desc="bench requests", unit="request", file=sys.stderr))
            bars[0].update(done - bars[0].n)

        try:
            lib, result = bn, bn.bench(model, prompt_lengths=lengths, draft_n_max=sweep, prompts=prompts,
                                       repeats=repeats, on_progress=moved, **common)
        finally:
            for bar in bars:
                bar.close()
    else:
        with tqdm(total=len(levels) * (2 if draft else 1), desc="concurrency levels", unit="level",
                  file=sys.stderr) as bar:
            lib, result = cc, cc.bench_concurrency(model, levels=levels, prompt_tokens=lengths[0], repeats=repeats,
                                                   on_level=lambda mode, level: bar.update(1), **common)
    paths = lib.write_outputs(result, dest)
    click.echo(lib.markdown(result))
    for kind, p in paths.items():
        click.echo(f"{kind}: {p}")

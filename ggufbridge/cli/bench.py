"""`ggufbridge bench`: target-only vs DSpark-drafted decoding per prompt length, or per number of concurrent
clients (--concurrency), on a real llama-server."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ggufbridge.cli import _options as opt
from ggufbridge.errors import RuntimeNotFound
from ggufbridge.runtime import bench as bn
from ggufbridge.runtime import server as sv
from ggufbridge.runtime.session import prepare


@click.command()
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--prompt-lengths", default=None,
              help="Comma-separated prompt lengths in tokens (k = 1024) [default: 1k,2k,4k,8k; with --concurrency "
                   "one length, 1k].")
@click.option("--concurrency", default=None, metavar="N[,N...]",
              help="Many clients at once instead: for each N, N concurrent streamed chat requests through the OpenAI "
                   "API of one server with max(N) slots; aggregate and per-stream decode tok/s, time to first "
                   "token p50/p95 (with --draft: drafted too), plotted against N. E.g. 1,2,4,8,16.")
@opt.draft("Also run with the DSpark draft and compare; says whether drafting pays on this machine and with "
           "which n_max.")
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
              help="Where to write bench.json / .md / .png, or concurrency.json / .md / .png with --concurrency "
                   "(default: OUT_DIR/bench).")
@opt.llama_bin()
@opt.timeout("Seconds to wait for each server's /health.")
def command(out_dir, prompt_lengths, concurrency, draft, draft_n_max, prompts_file, recipe_name, n_predict, repeats,
            threads, out, llama_bin, timeout):
    """Measure prefill and decode tokens/s, time to first token, draft acceptance and whether greedy outputs
    match, for each prompt length (or each of your --prompts); write JSON, a Markdown table and a PNG plot.
    With --concurrency: the same for many clients at once, per number of concurrent streams."""
    import dataclasses

    from ggufbridge.runtime.recipes import MAX_DRAFT_N

    if concurrency is not None:
        _concurrency(out_dir, concurrency, prompt_lengths, draft, draft_n_max, prompts_file, recipe_name, n_predict,
                     repeats, threads, out, llama_bin, timeout)
        return
    prompts = bn.load_prompts(prompts_file) if prompts_file else None
    lengths = bn.parse_lengths(prompt_lengths or "1k,2k,4k,8k")
    sweep = bn.parse_n_max(draft_n_max, MAX_DRAFT_N) if draft_n_max else []
    if sweep and not draft:
        raise click.UsageError("--draft-n-max needs --draft")
    # one context for every mode, large enough for the longest prompt plus the answer (a token is >= 1 character
    # of the user's prompts, except for rare byte tokens)
    longest = max(len(p.encode()) for p in prompts) if prompts else lengths[-1]
    ctx = -(-(longest + n_predict + 16) // 256) * 256
    # one request at a time: one slot
    s = prepare(out_dir, recipe_name, draft=draft, ctx=ctx, llama_bin=llama_bin, rpc_workers=0, parallel=1)
    if s.problems:
        raise RuntimeNotFound(" | ".join(s.problems))
    dest = Path(out) if out else Path(out_dir) / "bench"
    dest.mkdir(parents=True, exist_ok=True)
    host = "127.0.0.1"
    commands, samples, counters = {}, [], {}
    n_max = {"draft": s.recipe.draft["n_max"]} if draft else {}
    n_max |= {f"draft-{n}": n for n in sweep if n != s.recipe.draft["n_max"]}
    for mode in ["target", *n_max]:
        port = sv.free_port(host)
        recipe = dataclasses.replace(s.recipe, draft=dict(s.recipe.draft, n_max=n_max[mode])) if mode in n_max \
            else s.recipe
        opts = sv.ServeOptions(host=host, port=port, draft=mode != "target", threads=threads)
        argv = sv.server_argv(s.rt.bin_dir / "llama-server", recipe, s.plan, s.art, opts)
        commands[mode] = sv.printable(argv)
        click.echo(f"[{mode}] {commands[mode]}", err=True)
        got, counters[mode] = bn.run_mode(mode, argv, host, port, dest / f"llama-server-{mode}.log", s.rt.env(),
                                          lengths, n_predict, repeats, timeout, prompts=prompts)
        samples += got
    if prompts:  # rows by the prompts' own token counts
        lengths = sorted({x.prompt_tokens for x in samples})
    result = {
        "model": s.art.target.path.name, "recipe": s.recipe.name, "ctx": ctx, "n_predict": n_predict,
        "repeats": repeats, "prompt_lengths": lengths,
        "runtime": {"bin": str(s.rt.bin_dir), "commit": s.rt.commit, "version": s.rt.version},
        "commands": commands, "rows": bn.summarize(samples, lengths), "samples": bn.sample_dicts(samples),
    }
    if draft:
        result["draft_counters"] = counters["draft"]
        result["draft_sweep"] = bn.draft_verdict(samples, counters, n_max)
    if prompts:
        result["prompts"] = prompts
    paths = bn.write_outputs(result, dest)
    click.echo(bn.markdown(result))
    for kind, p in paths.items():
        click.echo(f"{kind}: {p}")


def _concurrency(out_dir, levels_text, prompt_lengths, draft, draft_n_max, prompts_file, recipe_name, n_predict,
                 repeats, threads, out, llama_bin, timeout):
    """bench --concurrency: one server per mode with max(levels) slots (runtime/concurrency.py)."""
    from ggufbridge.runtime import concurrency as cc

    for flag, given in (("--prompts", prompts_file), ("--draft-n-max", draft_n_max), ("--repeats", repeats != 1)):
        if given:
            raise click.UsageError(f"{flag} does not go with --concurrency")
    levels = cc.parse_levels(levels_text)
    lengths = bn.parse_lengths(prompt_lengths or "1k")
    if len(lengths) != 1:
        raise click.UsageError(f"--concurrency takes one --prompt-lengths value, found {prompt_lengths!r}")
    s = prepare(out_dir, recipe_name, draft=draft, ctx=cc.slot_context(lengths[0], n_predict), llama_bin=llama_bin,
                rpc_workers=0, parallel=max(levels))
    if s.problems:
        raise RuntimeNotFound(" | ".join(s.problems))
    dest = Path(out) if out else Path(out_dir) / "bench"
    steps = len(levels) * (2 if draft else 1)
    with click.progressbar(length=steps, label="concurrency levels", file=sys.stderr) as bar:
        result, paths = cc.measure(s, levels, lengths[0], n_predict, draft=draft, dest=dest, threads=threads,
                                   timeout=timeout, on_level=lambda mode, level: bar.update(1))
    click.echo(cc.markdown(result))
    for kind, p in paths.items():
        click.echo(f"{kind}: {p}")

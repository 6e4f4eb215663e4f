"""`ggufbridge bench`: target-only vs DSpark-drafted decoding per prompt length, on a real llama-server."""

from __future__ import annotations

from pathlib import Path

import click

from ggufbridge.cli import _options as opt
from ggufbridge.errors import RuntimeNotFound
from ggufbridge.runtime import bench as bn
from ggufbridge.runtime import server as sv
from ggufbridge.runtime.session import prepare


@click.command()
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--prompt-lengths", "--depths", "prompt_lengths", default="1k,2k,4k,8k", show_default=True,
              help="Comma-separated prompt lengths (context depths) in tokens (k = 1024), e.g. 1k,32k,128k,250k: "
                   "decode and prefill speed at each depth, target-only and with --draft.")
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
              help="Where to write bench.json / bench.md / bench.png (default: OUT_DIR/bench).")
@opt.llama_bin()
@opt.timeout("Seconds to wait for each server's /health.")
def command(out_dir, prompt_lengths, draft, draft_n_max, prompts_file, recipe_name, n_predict, repeats, threads, out,
            llama_bin, timeout):
    """Measure prefill and decode tokens/s, time to first token, draft acceptance and whether greedy outputs
    match, for each prompt length (or each of your --prompts); write JSON, a Markdown table and a PNG plot."""
    import dataclasses

    from ggufbridge.runtime.recipes import MAX_DRAFT_N

    prompts = bn.load_prompts(prompts_file) if prompts_file else None
    lengths = bn.parse_lengths(prompt_lengths)
    sweep = bn.parse_n_max(draft_n_max, MAX_DRAFT_N) if draft_n_max else []
    if sweep and not draft:
        raise click.UsageError("--draft-n-max needs --draft")
    # one context for every mode, large enough for the longest prompt plus the answer (a token is >= 1 character
    # of the user's prompts, except for rare byte tokens)
    longest = max(len(p.encode()) for p in prompts) if prompts else lengths[-1]
    ctx = -(-(longest + n_predict + 16) // 256) * 256
    s = prepare(out_dir, recipe_name, draft=draft, ctx=ctx, llama_bin=llama_bin, rpc_workers=0)
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

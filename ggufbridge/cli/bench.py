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
@click.option("--prompt-lengths", default="1k,2k,4k,8k", show_default=True,
              help="Comma-separated prompt lengths in tokens (k = 1024).")
@opt.draft("Also run with the DSpark draft and compare.")
@opt.recipe()
@opt.n_predict(default=128, help="Tokens generated per request (EOS ignored).")
@click.option("--repeats", type=click.IntRange(1), default=1, show_default=True)
@opt.threads()
@click.option("-o", "--out", "out", type=click.Path(file_okay=False), default=None,
              help="Where to write bench.json / bench.md / bench.png (default: OUT_DIR/bench).")
@opt.llama_bin()
@opt.timeout("Seconds to wait for each server's /health.")
def command(out_dir, prompt_lengths, draft, recipe_name, n_predict, repeats, threads, out, llama_bin, timeout):
    """Measure prefill and decode tokens/s, time to first token, draft acceptance and whether greedy outputs
    match, for each prompt length; write JSON, a Markdown table and a PNG plot."""
    lengths = bn.parse_lengths(prompt_lengths)
    # one context for both modes, large enough for the longest prompt plus the answer
    ctx = -(-(lengths[-1] + n_predict + 16) // 256) * 256
    s = prepare(out_dir, recipe_name, draft=draft, ctx=ctx, llama_bin=llama_bin, rpc_workers=0)
    if s.problems:
        raise RuntimeNotFound(" | ".join(s.problems))
    dest = Path(out) if out else Path(out_dir) / "bench"
    dest.mkdir(parents=True, exist_ok=True)
    host = "127.0.0.1"
    commands, samples, counters = {}, [], None
    for mode in (("target", "draft") if draft else ("target",)):
        port = sv.free_port(host)
        opts = sv.ServeOptions(host=host, port=port, draft=mode == "draft", threads=threads)
        argv = sv.server_argv(s.rt.bin_dir / "llama-server", s.recipe, s.plan, s.art, opts)
        commands[mode] = sv.printable(argv)
        click.echo(f"[{mode}] {commands[mode]}", err=True)
        got, c = bn.run_mode(mode, argv, host, port, dest / f"llama-server-{mode}.log", s.rt.env(), lengths,
                             n_predict, repeats, timeout)
        samples += got
        if mode == "draft":
            counters = c
    result = {
        "model": s.art.target.path.name, "recipe": s.recipe.name, "ctx": ctx, "n_predict": n_predict,
        "repeats": repeats, "prompt_lengths": lengths,
        "runtime": {"bin": str(s.rt.bin_dir), "commit": s.rt.commit, "version": s.rt.version},
        "commands": commands, "rows": bn.summarize(samples, lengths), "samples": bn.sample_dicts(samples),
    }
    if counters is not None:
        result["draft_counters"] = counters
    paths = bn.write_outputs(result, dest)
    click.echo(bn.markdown(result))
    for kind, p in paths.items():
        click.echo(f"{kind}: {p}")

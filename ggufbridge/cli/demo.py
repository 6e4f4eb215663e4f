"""`ggufbridge demo`: the whole pipeline on a locally generated synthetic MiniCPM-V 4.7, with parity figures, a
DSpark draft whose drafts are accepted and one image answer, built into a stable folder that the printed next
commands serve (`ggufbridge.demo.run_demo`)."""

from __future__ import annotations

import os
import shlex
import sys

import click

from ggufbridge.cli import _options as opt


def _prog() -> str:
    """`ggufbridge` as the user typed it: `.venv/bin/ggufbridge` until the venv is active."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "ggufbridge" and os.sep in argv0:
        rel = os.path.relpath(argv0)
        return rel if not rel.startswith("..") else argv0
    return "ggufbridge"


@click.command("demo")
@click.option("--dir", "--work-dir", "work_dir", type=click.Path(file_okay=False), default=None,
              help="The folder to build into and reuse [default: ./ggufbridge-demo].")
@click.option("--force", is_flag=True, help="Build everything again (the demo's own subfolders only).")
@opt.llama_bin()
def command(work_dir, force, llama_bin):
    """Synthetic MiniCPM-V 4.7 → GGUF → llama.cpp: KL / top-1 against transformers, DSpark drafting (accepted
    drafts, greedy output equal to target-only) and an image answer; ends with the commands that serve the result.
    A second run reuses what the first built."""
    from ggufbridge.demo import run_demo
    from ggufbridge.runtime.server import ServeOptions

    res = run_demo(work_dir, echo=lambda s: click.echo(s, err=True), force=force, llama_bin=llama_bin)
    if res.reused:
        click.echo(f"reused from an earlier run (--force builds again): {', '.join(res.reused)}", err=True)
    click.echo(f"\nfiles in {res.out_dir}/:")
    for f in res.files:
        click.echo(f"  {f['role']:8s} {f['path']}  {f['bytes'] / 2**20:.1f} MiB")
    click.echo("\n| model | prompt | tokens | KL mean | KL mean (no router ties) | top-1 | max |Δlogit| "
               "| router ties |")
    click.echo("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in res.rows:
        p = r["prompt"].replace("\n", "\\n")[:28]
        click.echo(f"| {r['type']} | {p} | {r['tokens']} | {r['kl_mean']:.2e} | {r['kl_mean_untied']:.2e} | "
                   f"{r['top1']:.3f} | {r['max_abs']:.2e} | {r['router_ties']} |")
    click.echo(f"\nllama.cpp continues {res.rows[0]['prompt']!r} with: {res.generation!r}")
    click.echo("Random weights: the text is noise; the figures are the point. A router tie is a position where two\n"
               "experts score within 1e-4, so float rounding picks the expert. The floor rows show how sensitive this\n"
               "random model is: transformers' own BF16 already moves it that far from its float32.")
    d = res.drafting
    rate = f"{d['draft_n_accepted'] / d['draft_n']:.0%}" if d["draft_n"] else "n/a"
    click.echo(f"\ndrafting ({res.model_dir}, greedy, {d['tokens']} tokens after {d['prompt']!r}): "
               f"{d['draft_n_accepted']} of {d['draft_n']} drafted tokens accepted ({rate}); output "
               + ("equal to target-only" if d["equal"] else "DIFFERS from target-only"))
    click.echo(f"image answer ({os.path.relpath(res.image['path'])}, {res.image['prompt']!r}): {res.image['answer']!r}")
    port = ServeOptions().port
    serve_cmd = f"{_prog()} serve {shlex.quote(str(res.model_dir))} --draft"
    click.echo(f"\nnext: serve it (target, mmproj and DSpark draft) and open the chat page:\n"
               f"  {serve_cmd}\n"
               f"  chat page: http://127.0.0.1:{port}/   (OpenAI API: http://127.0.0.1:{port}/v1)")

"""`ggufbridge demo`: the whole pipeline on a locally generated synthetic MiniCPM-V 4.7, with parity figures."""

from __future__ import annotations

import click



@click.command("demo")
@click.option("--work-dir", type=click.Path(file_okay=False), default=None,
              help="Where to put the synthetic checkpoint and GGUFs (default: a new temporary folder).")
def command(work_dir):
    """Synthetic MiniCPM-V 4.7 → GGUF → llama.cpp generation, with KL / top-1 against transformers."""
    from ggufbridge.demo import run_demo

    res = run_demo(work_dir, echo=lambda s: click.echo(s, err=True))
    click.echo(f"\nfiles in {res.out_dir}:")
    for f in res.files:
        click.echo(f"  {f['role']:7s} {f['path']}  {f['bytes'] / 2**20:.1f} MiB")
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

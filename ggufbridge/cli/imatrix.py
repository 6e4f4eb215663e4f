"""`ggufbridge imatrix OUT_DIR --text FILE`: an importance matrix for the converted target, with llama-imatrix."""

from __future__ import annotations

import click

from ggufbridge.cli import _options as opt
from ggufbridge.cli._common import writes_files


@click.command("imatrix")
@click.argument("out_dir", type=click.Path())
@click.option("--text", "text", required=True, type=click.Path(dir_okay=False),
              help="Calibration text (UTF-8), ideally like what the model will see.")
@click.option("-o", "--out", "out", default=None, type=click.Path(dir_okay=False),
              help="Where to write the matrix [default: OUT_DIR/imatrix.gguf].")
@click.option("--ctx", type=click.IntRange(max=opt.INT32_MAX), default=512, show_default=True, help="Tokens per chunk.")
@click.option("--chunks", type=click.IntRange(max=opt.INT32_MAX), default=None,
              help="At most this many chunks of the text.")
@opt.quant_threads()
@click.option("--fill-missing/--no-fill-missing", default=True, show_default=True,
              help="Give experts that got no calibration tokens their layer's mean importance (with a warning).")
@writes_files
def command(out_dir, text, out, ctx, chunks, threads, fill_missing):
    """Compute an importance matrix for OUT_DIR's target GGUF (a `ggufbridge convert` folder, or a .gguf) over a
    calibration text; pass it to `ggufbridge quantize --imatrix`."""
    from ggufbridge.quant.imatrix import compute_imatrix

    from ggufbridge.quant.coverage import format_coverage

    res = compute_imatrix(out_dir, text, out, ctx=ctx, chunks=chunks, threads=threads, fill_missing=fill_missing,
                          progress=True)
    click.echo(f"wrote {res.path} ({res.chunks if res.chunks is not None else '?'} chunks of {ctx} tokens "
               f"through {res.model.name})")
    click.echo(format_coverage(res.coverage))
    for note in res.filled:
        click.echo(f"warning: {note}")
    if not fill_missing and any(c.missing for c in res.coverage):
        click.echo("warning: experts without tokens were not filled (--no-fill-missing): llama-quantize gives them "
                   "uniform importance")

"""`ggufbridge quantize IN.gguf -o OUT.gguf --quant TYPE | --mix NAME | --fit-bytes N | --fit HARDWARE`."""

from __future__ import annotations

import json

import click

from ggufbridge.cli import _options as opt
from ggufbridge.cli._common import writes_files


@click.command("quantize")
@click.argument("src", type=click.Path(dir_okay=False))
@click.option("-o", "--out", "dst", required=True, type=click.Path(dir_okay=False), help="Output GGUF file.")
@opt.quant_type()
@opt.mix()
@opt.fit_bytes()
@click.option("--fit", "fit_hw", default=None, metavar="HARDWARE",
              help="Pick the best type/mix that fits a hardware recipe (e.g. rtx4090) fully on its GPU at --ctx.")
@click.option("--ctx", type=int, default=None, help="Context to leave room for with --fit/--fit-bytes [8192].")
@opt.imatrix()
@opt.quant_threads("Quantiser threads (default: up to 8).")
@click.option("--allow-requantize", is_flag=True, help="Allow a source that is already quantised (loses quality).")
@opt.as_json()
@writes_files
def command(src, dst, quant, mix, fit_bytes, fit_hw, ctx, imatrix, threads, allow_requantize, as_json):
    """Quantise a GGUF written by `ggufbridge convert` (BF16/F16/F32) with the runtime's llama-quantize, and show
    what is quantised and what is not."""
    from ggufbridge.errors import QuantError
    from ggufbridge.quant import format_quant_report, quantize_to
    from ggufbridge.quant.fit import as_request, choose

    given = [n for n, v in (("--quant", quant), ("--mix", mix), ("--fit-bytes", fit_bytes),
                            ("--fit", fit_hw)) if v is not None]
    if len(given) != 1:
        raise QuantError(f"give exactly one of --quant, --mix, --fit-bytes, --fit; "
                         f"found {', '.join(given) or 'none'}")
    if ctx is not None and fit_bytes is None and fit_hw is None:
        raise QuantError("--ctx only applies with --fit or --fit-bytes")
    chosen_note = None
    if fit_bytes is not None or fit_hw is not None:
        entry, tried = choose(src, fit_bytes=fit_bytes, hardware=fit_hw, ctx=ctx)
        mix, quant = as_request(entry)
        chosen_note = [f"{c.name}: {'fits' if c.fits else 'too big'} ({c.detail})" for c in tried]
    res = quantize_to(src, dst, quant=quant, recipe=mix, imatrix=imatrix, threads=threads,
                      allow_requantize=allow_requantize)
    if as_json:
        d = res.report.to_dict()
        d["chosen"] = chosen_note
        click.echo(json.dumps(d, indent=2))
        return
    for line in chosen_note or []:
        click.echo(f"fit: {line}")
    click.echo(f"wrote {res.path}  {res.report.file_bytes / 2**20:.2f} MiB  "
               f"({'recipe ' + res.recipe if res.recipe else res.file_type})")
    click.echo(format_quant_report(res.report))

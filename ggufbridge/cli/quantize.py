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
@opt.fit_bytes(help="KL-guided mix: a type per layer and tensor class, least KL with file + KV cache for --ctx "
                    "+ state <= this many bytes (--ctx 0: the file alone).")
@click.option("--fit", "fit_hw", default=None, metavar="HARDWARE",
              help="KL-guided mix that fits a hardware recipe (e.g. rtx4090) fully on its GPU at --ctx.")
@click.option("--ctx", type=click.IntRange(0, opt.INT32_MAX), default=None,
              help="Context to leave room for with --fit/--fit-bytes [8192].")
@click.option("--calibration", type=click.Path(dir_okay=False), default=None,
              help="--fit*: calibration text (or eval .jsonl) for the sensitivity pass [packaged sample].")
@click.option("--reference", default=None, metavar="hf:DIR|logits:FILE|gguf:FILE",
              help="--fit*: reference logits for the sensitivity pass [the source GGUF].")
@click.option("--mix-out", type=click.Path(dir_okay=False), default=None,
              help="--fit*: where to write the chosen mix as a recipe TOML [OUT with .mix.toml].")
@click.option("--work", type=click.Path(file_okay=False), default=None,
              help="--fit*: sensitivity cache folder [~/.cache/ggufbridge/sensitivity].")
@opt.imatrix()
@opt.quant_threads("Quantiser threads (default: up to 8).")
@click.option("--allow-requantize", is_flag=True, help="Allow a source that is already quantised (loses quality).")
@opt.as_json()
@writes_files
def command(src, dst, quant, mix, fit_bytes, fit_hw, ctx, calibration, reference, mix_out, work, imatrix, threads,
            allow_requantize, as_json):
    """Quantise a GGUF written by `ggufbridge convert` (BF16/F16/F32) with the runtime's llama-quantize, and show
    what is quantised and what is not."""
    from pathlib import Path

    from ggufbridge.errors import QuantError
    from ggufbridge.quant import format_quant_report, quantize_to
    from ggufbridge.quant.quantize import all_or_nothing

    given = [n for n, v in (("--quant", quant), ("--mix", mix), ("--fit-bytes", fit_bytes),
                            ("--fit", fit_hw)) if v is not None]
    if len(given) != 1:
        raise QuantError(f"give exactly one of --quant, --mix, --fit-bytes, --fit; "
                         f"found {', '.join(given) or 'none'}")
    fitting = fit_bytes is not None or fit_hw is not None
    if not fitting:
        for name, v in (("--ctx", ctx), ("--calibration", calibration), ("--reference", reference),
                       ("--mix-out", mix_out), ("--work", work)):
            if v is not None:
                raise QuantError(f"{name} only applies with --fit or --fit-bytes")
    chosen_note = None
    if fitting:
        from ggufbridge.quant.optimise import fit_quantize

        mix_out = Path(mix_out) if mix_out else Path(dst).with_suffix(".mix.toml")
        with all_or_nothing(dst, src, imatrix, calibration) as tmp:
            res, plan, sens = fit_quantize(src, tmp, fit_bytes=fit_bytes, hardware=fit_hw, ctx=ctx,
                                           calibration=calibration, reference=reference, imatrix=imatrix,
                                           work=work, mix_out=mix_out, threads=threads, progress=not as_json)
        res.path, res.report.path = Path(dst), str(dst)
        chosen_note = [f"mix {plan.recipe.name}: {plan.file_bytes:,} bytes of {plan.budget:,} for the file, "
                       f"predicted KL {plan.predicted_kl:.4f} (sensitivity over {sens.n_tokens} tokens vs "
                       f"{sens.reference}); recipe written to {mix_out}"]
    else:
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

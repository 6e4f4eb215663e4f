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
              help="Context to leave room for with --fit/--fit-bytes [default: 8192].")
@click.option("--calibration", type=click.Path(dir_okay=False), default=None,
              help="--fit*: calibration text (or eval .jsonl) for the sensitivity pass [default: a packaged sample].")
@click.option("--reference", default=None, metavar="hf:DIR|logits:FILE|gguf:FILE",
              help="--fit*: reference logits for the sensitivity pass [default: the source GGUF].")
@click.option("--mix-out", type=click.Path(dir_okay=False), default=None,
              help="--fit*: where to write the chosen mix as a recipe TOML [default: OUT with .mix.toml].")
@click.option("--work", type=click.Path(file_okay=False), default=None,
              help="--fit*: sensitivity cache folder [default: ~/.cache/ggufbridge/sensitivity].")
@click.option("--fit-budget-time", type=opt.Duration(), default=None,
              help="--fit*: time the sensitivity pass may take here (300, 20m, 2h); its estimate is printed first, "
                   "and fewer calibration tokens are measured when it is over (refused if even 16 are).")
@click.option("--calibration-tokens", type=click.IntRange(16, opt.INT32_MAX), default=None,
              help="--fit*: measure on the first N calibration tokens only (cheaper, noisier) "
                   "[default: all, 16 rows of 256].")
@click.option("--fit-probes", type=click.Choice(["auto", "resident", "layout"]), default=None,
              help="--fit*: probe in one loaded model the runtime writes each unit into (resident), or load a split "
                   "copy of the source per probe (layout) [default: auto, resident where it fits in memory].")
@opt.imatrix()
@opt.quant_threads("Quantiser threads [default: up to 8].")
@click.option("--allow-requantize", is_flag=True, help="Allow a source that is already quantised (loses quality).")
@opt.as_json()
@writes_files
def command(src, dst, quant, mix, fit_bytes, fit_hw, ctx, calibration, reference, mix_out, work, fit_budget_time,
            calibration_tokens, fit_probes, imatrix, threads, allow_requantize, as_json):
    """Quantise a GGUF written by `ggufbridge convert` (BF16/F16/F32) with the runtime's llama-quantize, and show
    what is quantised and what is not."""
    from ggufbridge.quant import format_quant_report
    from ggufbridge.quant.pipeline import quantize_gguf

    res, chosen = quantize_gguf(src, dst, quant=quant, mix=mix, fit_bytes=fit_bytes, fit=fit_hw, ctx=ctx,
                                calibration=calibration, reference=reference, mix_out=mix_out, work=work,
                                imatrix=imatrix, threads=threads, allow_requantize=allow_requantize,
                                progress=not as_json, fit_budget_time=fit_budget_time,
                                calibration_tokens=calibration_tokens, fit_probes=fit_probes,
                                report=lambda line: click.echo(line, err=True))
    if as_json:
        d = res.report.to_dict()
        d["chosen"] = [chosen] if chosen else None
        click.echo(json.dumps(d, indent=2))
        return
    if chosen:
        click.echo(f"fit: {chosen}")
    click.echo(f"wrote {res.path}  {res.report.file_bytes / 2**20:.2f} MiB  "
               f"({'recipe ' + res.mix if res.mix else res.file_type})")
    click.echo(format_quant_report(res.report))

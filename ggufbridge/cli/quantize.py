"""`ggufbridge quantize IN.gguf -o OUT.gguf --quant TYPE | --recipe NAME | --fit-bytes N | --fit HARDWARE`."""

from __future__ import annotations

import json
import os
import re

import click

from ggufbridge.cli._common import user_errors, writes_files

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(|b|k|kb|kib|m|mb|mib|g|gb|gib|t|tb|tib)\s*$", re.I)
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


class ByteSize(click.ParamType):
    name = "BYTES"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        m = _SIZE.match(str(value))
        if not m:
            self.fail(f"expected a byte count such as 20000000000, 20GB or 18.5GiB, found {value!r}", param, ctx)
        return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


@click.command("quantize")
@click.argument("src", type=click.Path(dir_okay=False))
@click.option("-o", "--out", "dst", required=True, type=click.Path(dir_okay=False), help="Output GGUF file.")
@click.option("--quant", default=None, metavar="TYPE",
              help="A llama-quantize type (Q8_0, Q6_K, Q5_K_M, Q4_K_M, IQ4_XS, Q3_K_M, ...): llama.cpp's own mix.")
@click.option("--recipe", default=None, metavar="NAME|FILE.toml",
              help="A per-tensor-class recipe: hq4, hq3, or a TOML file (see docs/quant.md).")
@click.option("--fit-bytes", type=ByteSize(), default=None,
              help="KL-guided mix: a type per layer and tensor class, least KL with file + KV cache for --ctx "
                   "+ state <= this many bytes (--ctx 0: the file alone).")
@click.option("--fit", "fit_hw", default=None, metavar="HARDWARE",
              help="KL-guided mix that fits a hardware recipe (e.g. rtx4090) fully on its GPU at --ctx.")
@click.option("--ctx", type=int, default=None, help="Context to leave room for with --fit/--fit-bytes [8192].")
@click.option("--calibration", type=click.Path(dir_okay=False), default=None,
              help="--fit*: calibration text (or eval .jsonl) for the sensitivity pass [packaged sample].")
@click.option("--reference", default=None, metavar="hf:DIR|logits:FILE|gguf:FILE",
              help="--fit*: reference logits for the sensitivity pass [the source GGUF].")
@click.option("--mix-out", type=click.Path(dir_okay=False), default=None,
              help="--fit*: where to write the chosen mix as a recipe TOML [OUT with .mix.toml].")
@click.option("--work", type=click.Path(file_okay=False), default=None,
              help="--fit*: sensitivity cache folder [~/.cache/ggufbridge/sensitivity].")
@click.option("--imatrix", type=click.Path(dir_okay=False), default=None,
              help="Importance matrix from `ggufbridge imatrix` (needed by IQ1/IQ2/IQ3_XXS types).")
@click.option("--threads", type=int, default=None, help="Quantiser threads (default: up to 8).")
@click.option("--allow-requantize", is_flag=True, help="Allow a source that is already quantised (loses quality).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@user_errors
@writes_files
def command(src, dst, quant, recipe, fit_bytes, fit_hw, ctx, calibration, reference, mix_out, work, imatrix, threads,
            allow_requantize, as_json):
    """Quantise a GGUF written by `ggufbridge convert` (BF16/F16/F32) with the runtime's llama-quantize, and show
    what is quantised and what is not."""
    from ggufbridge.errors import QuantError
    from ggufbridge.ggufio.writer import remove_stale_parts, tmp_name
    from ggufbridge.quant import format_quant_report, quantize_file

    given = [n for n, v in (("--quant", quant), ("--recipe", recipe), ("--fit-bytes", fit_bytes),
                            ("--fit", fit_hw)) if v is not None]
    if len(given) != 1:
        raise QuantError(f"give exactly one of --quant, --recipe, --fit-bytes, --fit; "
                         f"found {', '.join(given) or 'none'}")
    fitting = fit_bytes is not None or fit_hw is not None
    if not fitting:
        for opt, v in (("--ctx", ctx), ("--calibration", calibration), ("--reference", reference),
                       ("--mix-out", mix_out), ("--work", work)):
            if v is not None:
                raise QuantError(f"{opt} only applies with --fit or --fit-bytes")
    chosen_note = None
    from pathlib import Path

    final = Path(dst)
    remove_stale_parts(final.parent)
    tmp = tmp_name(final)
    try:
        if fitting:
            from ggufbridge.quant.optimise import fit_quantize

            mix_out = Path(mix_out) if mix_out else final.with_suffix(".mix.toml")
            res, plan, sens = fit_quantize(src, tmp, fit_bytes=fit_bytes, hardware=fit_hw, ctx=ctx,
                                           calibration=calibration, reference=reference, imatrix=imatrix,
                                           work=work, mix_out=mix_out, threads=threads, progress=not as_json)
            chosen_note = [f"mix {plan.recipe.name}: {plan.file_bytes:,} bytes of {plan.budget:,} for the file, "
                           f"predicted KL {plan.predicted_kl:.4f} (sensitivity over {sens.n_tokens} tokens vs "
                           f"{sens.reference}); recipe written to {mix_out}"]
        else:
            res = quantize_file(src, tmp, quant=quant, recipe=recipe, imatrix=imatrix, threads=threads,
                                allow_requantize=allow_requantize)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    res.report.path = str(final)
    if as_json:
        d = res.report.to_dict()
        d["chosen"] = chosen_note
        click.echo(json.dumps(d, indent=2))
        return
    for line in chosen_note or []:
        click.echo(f"fit: {line}")
    click.echo(f"wrote {final}  {res.report.file_bytes / 2**20:.2f} MiB  "
               f"({'recipe ' + res.recipe if res.recipe else res.file_type})")
    click.echo(format_quant_report(res.report))

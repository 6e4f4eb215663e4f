"""`ggufbridge dump-logits --model SPEC (--eval FILE.jsonl | --text FILE) -o ref.safetensors`."""

from __future__ import annotations

import click

from ggufbridge.cli._options import INT32_MAX
from ggufbridge.cli.compare import check_eval_choice, eval_options


@click.command("dump-logits")
@click.option("--model", "-m", required=True,
              help="hf:DIR | gguf:FILE | exl3:DIR | hf://ORG/NAME[@REV] or ms://ORG/NAME[@REV] (a hub checkpoint "
                   "through transformers, downloaded first; also written hf:hf://...).")
@eval_options
@click.option("-o", "--out", "out", required=True, type=click.Path(dir_okay=False), help="Output .safetensors.")
@click.option("--top-k", type=click.IntRange(5, INT32_MAX), default=256, show_default=True,
              help="Log-probabilities kept per position (plus the log-mass of the rest).")
@click.option("--samples", type=click.IntRange(0, INT32_MAX), default=64, show_default=True,
              help="Tokens drawn per position from the rest of the distribution (0: top-K only, KL a lower bound).")
@click.option("--rows-out", type=click.Path(dir_okay=False), default=None,
              help="Also write the eval rows as token ids (JSONL), for --eval on another machine.")
def command(model, eval_path, text_path, ctx, chunk, hf_dtype, floor, progress, out, top_k, samples, rows_out):
    """Store a model's top-K log-probabilities on an eval set, for `compare --reference logits:FILE` elsewhere."""
    from ggufbridge.compare.report import check_outputs
    from ggufbridge.compare.run import dump_logits

    check_eval_choice(eval_path, text_path)
    check_outputs([eval_path, text_path, model], out=out, rows_out=rows_out)
    meta = dump_logits(model, out, eval_path=eval_path, text_path=text_path, ctx=ctx, top_k=top_k, samples=samples,
                       chunk=chunk, floor=floor, hf_dtype=hf_dtype, progress=progress, rows_out=rows_out)
    click.echo(f"{out}: {len(meta['row_sha256'])} rows, top-{meta['top_k']} + {meta['samples']} samples of "
               f"{meta['vocab_size']}, "
               f"set sha256 {meta['set_sha256'][:16]}" + (", with BF16 floor" if meta.get("floor") else ""))

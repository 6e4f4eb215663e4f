"""`ggufbridge compare GGUF [GGUF...] --reference SPEC (--eval FILE.jsonl | --text FILE)`."""

from __future__ import annotations

import click

from ggufbridge.units import INT32_MAX

EVAL_HELP = ('JSONL eval rows: {"ids": [...]} or {"text": "..."} (tokenised without BOS), optional "kind".')


def eval_options(fn):
    """Options shared by `compare` and `dump-logits`: the eval set, its context, the chunking, hf dtype."""
    for opt in reversed([
        click.option("--eval", "eval_path", type=click.Path(dir_okay=False, exists=True), help=EVAL_HELP),
        click.option("--text", "text_path", type=click.Path(dir_okay=False, exists=True),
                     help="Plain text file, cut into rows of --ctx tokens."),
        click.option("--ctx", type=click.IntRange(2, INT32_MAX), default=1024, show_default=True,
                     help="Tokens per row (rows longer than this are refused)."),
        click.option("--chunk", type=click.IntRange(1, INT32_MAX), default=None,
                     help="Positions per logits chunk [default: ~16M logits per chunk]."),
        click.option("--hf-dtype", type=click.Choice(["float32", "bfloat16"]), default="float32", show_default=True,
                     help="dtype of an hf: model."),
        click.option("--floor/--no-floor", default=None,
                     help="Measure the transformers BF16-vs-FP32 floor [default: when the model is hf:]."),
        click.option("--progress/--no-progress", default=True, help="Show a progress bar (tokens)."),
    ]):
        fn = opt(fn)
    return fn


def check_eval_choice(eval_path, text_path):
    if (eval_path is None) == (text_path is None):
        raise click.UsageError("give exactly one of --eval FILE.jsonl and --text FILE")


@click.command("compare")
@click.argument("ggufs", nargs=-1, required=True)
@click.option("--reference", "-r", required=True,
              help="hf:DIR | gguf:FILE | exl3:DIR | logits:FILE (a dump from `ggufbridge dump-logits`) | "
                   "hf://ORG/NAME[@REV] or ms://ORG/NAME[@REV] (a hub checkpoint through transformers, downloaded "
                   "first; also written hf:hf://...).")
@eval_options
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the figures as JSON.")
@click.option("--markdown", "md_path", type=click.Path(dir_okay=False), help="Write the Markdown table.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write a PNG plot.")
@click.option("--merge", "merge_paths", multiple=True, type=click.Path(dir_okay=False, exists=True),
              help="Add the results of an earlier --json run (same eval set and reference), e.g. EXL3 packs "
                   "measured on a GPU machine.")
def command(ggufs, reference, eval_path, text_path, ctx, chunk, hf_dtype, floor, progress, json_path, md_path,
            plot_path, merge_paths):
    """Compare GGUF files' next-token distributions with a reference: KL both ways, top-1/top-5, perplexity
    ratio, per kind, worst row, and the BF16-vs-FP32 numerics floor beside them.

    GGUFS are .gguf paths; exl3:DIR (EXL3 packs, CUDA only) and hf:DIR may be listed too, for like-for-like tables."""
    from ggufbridge.compare import report
    from ggufbridge.compare.run import compare

    check_eval_choice(eval_path, text_path)
    report.check_outputs([eval_path, text_path, reference, *ggufs, *merge_paths], json_path=json_path,
                         md_path=md_path, plot_path=plot_path)
    cmp = compare(reference, list(ggufs), eval_path=eval_path, text_path=text_path, ctx=ctx, chunk=chunk, floor=floor,
                  hf_dtype=hf_dtype, progress=progress, merge_paths=merge_paths)
    click.echo(report.to_markdown(cmp), nl=False)
    if json_path:
        report.write_json(cmp, json_path)
    if md_path:
        report.write_markdown(cmp, md_path)
    if plot_path:
        report.write_plot(cmp, plot_path)

#!/usr/bin/env python
"""Write a synthetic MiniCPM-V 4.7 checkpoint (a named TinySpec) to a folder.

    python scripts/make_fixtures.py tiny out/tiny47 --dtype bfloat16 --seed 1 --fused
"""

from __future__ import annotations

import click

from ggufbridge.cli._common import user_errors
from ggufbridge.testkit.checkpoint import DTYPES, SPECS, make_minicpmv47
from ggufbridge.testkit.vocab import get_vocab


@click.command()
@click.argument("spec", type=click.Choice(sorted(SPECS)))
@click.argument("out_dir", type=click.Path(file_okay=False, writable=True))
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True, help="Weight dtype.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random weights.")
@click.option("--fused", "fused_experts", is_flag=True, help="Store experts fused (gate_up_proj/down_proj).")
@click.option(
    "--vocab",
    type=click.Choice(["qwen35", "small"]),
    default="qwen35",
    show_default=True,
    help="Real Qwen3.5 vocabulary or a 512-token subset.",
)
@click.option("--max-shard-size", default="20MB", show_default=True, help="safetensors shard size limit.")
@user_errors
def main(spec, out_dir, dtype, seed, fused_experts, vocab, max_shard_size):
    """Write the synthetic checkpoint SPEC to OUT_DIR."""
    path = make_minicpmv47(
        out_dir, spec, dtype=dtype, seed=seed, fused_experts=fused_experts, vocab=vocab,
        max_shard_size=max_shard_size,
    )
    click.echo(f"{spec} ({dtype}, vocab {vocab}: {get_vocab(vocab).vocab_size} rows) -> {path}")


if __name__ == "__main__":
    main()

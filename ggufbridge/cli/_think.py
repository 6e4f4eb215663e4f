"""Options shared by `serve` and `run`: thinking mode and the reasoning budget (llm-style option decorator)."""

from __future__ import annotations

import click


def think_options(f):
    """--think/--no-think and --reasoning-budget; both default to the recipe's [server] think / reasoning_budget."""
    f = click.option("--reasoning-budget", type=click.IntRange(-1), default=None,
                     help="Most tokens to think before the end of thinking is forced (-1: no limit; default: the "
                          "recipe's server.reasoning_budget).")(f)
    f = click.option("--think/--no-think", default=None,
                     help="Let the model think first (thoughts come back in message.reasoning_content). Default: "
                          "the recipe's server.think, off in the packaged recipes, as upstream's recommended "
                          "serving; a request's chat_template_kwargs {\"enable_thinking\": ...} still decides.")(f)
    return f

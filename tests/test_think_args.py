"""--think/--no-think and --reasoning-budget become llama-server's own flags; a recipe may set both."""

from __future__ import annotations

import pytest

from ggufbridge.errors import RecipeError
from ggufbridge.runtime import server as sv
from ggufbridge.runtime.recipes import load_recipe


@pytest.mark.parametrize("think, budget, recipe_extra, expected", [
    (None, None, "", ["--reasoning", "off"]),  # packaged default: off, no budget flag
    (True, None, "", ["--reasoning", "on"]),
    (None, None, "think = true\nreasoning_budget = 64\n", ["--reasoning", "on", "--reasoning-budget", "64"]),
    (False, 0, "think = true\n", ["--reasoning", "off", "--reasoning-budget", "0"]),  # the option wins
    (True, -1, "reasoning_budget = 8\n", ["--reasoning", "on"]),  # -1: no limit, no flag
])
def test_reasoning_args(tmp_path, think, budget, recipe_extra, expected):
    path = tmp_path / "r.toml"
    path.write_text(f'base = "cpu"\nname = "r"\n[server]\nctx = 2048\n{recipe_extra}')
    opts = sv.ServeOptions(think=think, reasoning_budget=budget)
    assert sv.reasoning_args(load_recipe(str(path)), opts) == expected


@pytest.mark.parametrize("line, match", [("think = 1", "server.think: expected true or false"),
                                         ("reasoning_budget = -2", "server.reasoning_budget: expected an integer")])
def test_recipe_values_checked(tmp_path, line, match):
    path = tmp_path / "r.toml"
    path.write_text(f'base = "cpu"\nname = "r"\n[server]\nctx = 2048\n{line}\n')
    with pytest.raises(RecipeError, match=match):
        load_recipe(str(path))

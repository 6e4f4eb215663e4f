#!/usr/bin/env python3
"""How many slots each hardware recipe holds at its own context (issue 28): the planner on the real 35B-A3B shapes
of each recipe's file (recipes_report.py's full-shape tensors, no data), for 1..16 slots, target only and
with the DSpark draft. Prints the Markdown table of docs/benchmarks.md ("Slots per recipe").

    .venv/bin/python -m benchmarks.recipe_slots
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 1024**3
# the file each recipe names first (its `quant` line), as make_fullsize_gguf.py writes it
FILES = {"rtx4090": "hq3m", "spark": "q8_0", "spark-x2": "bf16", "h200": "q4_k_m", "cpu": "q8_0"}
DRAFT_BYTES = int(0.81 * GIB)  # make_fullsize_gguf.py's DSpark draft, F16 (docs/benchmarks.md, "GPU (H200)")


def slot_context(recipe, draft=None) -> int:
    """The context each slot gets: the recipe's, at most its draft.ctx_cap with a draft."""
    return recipe.server["ctx"] if draft is None else min(recipe.server["ctx"], recipe.draft["ctx_cap"])


def most_slots(target, recipe, *, draft=None, top=16) -> tuple[int, object]:
    """The most slots (<= top) that fit at the recipe's full context (never shrunk) without moving more routed
    experts to host memory than one slot does, and that plan."""
    from ggufbridge.errors import PlanError
    from ggufbridge.runtime import memory as pl

    ctx = slot_context(recipe, draft)
    best = (0, None)
    for n in range(1, top + 1):
        try:
            plan = pl.make_plan(target, recipe, ctx=ctx, draft=draft, slots=n)
        except PlanError:
            break
        if best[1] is not None and plan.n_cpu_moe > best[1].n_cpu_moe:
            break
        best = (n, plan)
    return best


def main() -> int:
    from ggufbridge.runtime import memory as pl
    from ggufbridge.runtime.recipes import load_recipe

    from benchmarks import recipes_report as rr
    draft = pl.DraftShape(n_layer=5, n_head_kv=2, key_length=256, value_length=256, weight_bytes=DRAFT_BYTES,
                          block_size=15)
    rows = ["| recipe | file | context per slot | slots that fit (of 16), experts where one slot has them | "
            "its default | per extra slot: KV + state on the device, checkpoints in RAM | with the draft (at its "
            "`draft.ctx_cap`): slots that fit |",
            "|---|---|---:|---:|---:|---|---:|"]
    for name, quant in FILES.items():
        recipe = load_recipe(name)
        target = rr.fullshape_target(quant)
        n, plan = most_slots(target, recipe)
        nd, _ = most_slots(target, recipe, draft=draft)
        f = plan.figures if plan else {}
        kv = f.get("kv_total", 0) / max(1, f.get("slots", 1))
        state = f.get("state_per_slot", 0)
        per = f"{kv / GIB:.2f} GiB + {state / 2**20:.0f} MiB, {32 * state / GIB:.2f} GiB" if plan else "n/a"
        cap = slot_context(recipe, draft)
        rows.append(f"| `{name}` | {quant} | {recipe.server['ctx']:,} | {n}{'+' if n == 16 else ''} | "
                    f"{recipe.server['parallel']} | {per} | {nd}{'+' if nd == 16 else ''} at {cap:,} |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

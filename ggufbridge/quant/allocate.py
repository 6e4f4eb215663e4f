"""Choose a type per unit that minimises the predicted KL under a byte budget (a multiple-choice knapsack).

Each unit offers options (type, bytes, ΔKL). `allocate` solves the knapsack by dynamic programming over the
budget cut into at most GRID cells, every option's bytes rounded *up* to whole cells (so any solution of the
grid problem fits the real budget), then spends the rounding slack on the best single upgrades. With GRID = 20,000
the rounding costs at most units × budget / 20,000 bytes of the budget (about 1% for 200 units).
`allocate_greedy` is the classic Lagrangian walk along each unit's lower convex hull (the options a price per
byte could ever pick); it is kept to compare against. The budget is a hard limit in bytes; sizes come from
ggufbridge.quant.filesize, so the file written is what was counted.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from ggufbridge.errors import QuantError


@dataclass(frozen=True)
class Option:
    type: str
    bytes: int
    kl: float  # predicted ΔKL


def _hull(options: list[Option]) -> list[Option]:
    """Options on the lower convex hull, by increasing bytes and strictly decreasing ΔKL."""
    pts = sorted(options, key=lambda o: (o.bytes, o.kl))
    frontier: list[Option] = []
    for o in pts:  # Pareto: more bytes must buy less KL
        if not frontier or o.kl < frontier[-1].kl:
            if frontier and frontier[-1].bytes == o.bytes:
                frontier.pop()
            frontier.append(o)
    hull: list[Option] = []
    for o in frontier:
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b is above the segment a→o: never the best at any price
            if (b.kl - a.kl) * (o.bytes - a.bytes) >= (o.kl - a.kl) * (b.bytes - a.bytes):
                hull.pop()
            else:
                break
        hull.append(o)
    return hull


GRID = 20_000


def _check(options: dict[str, list[Option]], budget: int) -> None:
    need = sum(min(o.bytes for o in opts) for opts in options.values())
    if need > budget:
        raise QuantError(f"the smallest mix needs {need:,} bytes of tensors, more than the {budget:,} available")


def allocate(options: dict[str, list[Option]], budget: int, grid: int = GRID) -> dict[str, Option]:
    """The chosen option per unit (least total ΔKL found); total bytes ≤ budget. Raises QuantError when even the
    smallest choice does not fit."""
    _check(options, budget)
    units = list(options)
    q = -(-budget // grid) if budget > grid else 1  # bytes per cell
    cells = budget // q
    best = np.zeros(cells + 1)  # least ΔKL using at most c cells, units so far
    pick = np.zeros((len(units), cells + 1), dtype=np.int16)
    for i, u in enumerate(units):
        new = np.full(cells + 1, np.inf)
        for j, o in enumerate(options[u]):
            w = -(-o.bytes // q)
            if w > cells:
                continue
            cand = best[: cells + 1 - w] + o.kl  # cells w.. only: below w the option does not fit
            tail, tail_pick = new[w:], pick[i, w:]  # views: updated in place
            better = cand < tail
            tail[better] = cand[better]
            tail_pick[better] = j
        best = new
    if not np.isfinite(best[cells]):  # the rounding made the smallest mix too large: fall back to the walk
        return allocate_greedy(options, budget)
    choice: dict[str, Option] = {}
    c = cells
    for i in range(len(units) - 1, -1, -1):
        o = options[units[i]][pick[i, c]]
        choice[units[i]] = o
        c -= -(-o.bytes // q)
    return _fill(options, choice, budget)


def _fill(options: dict[str, list[Option]], choice: dict[str, Option], budget: int) -> dict[str, Option]:
    """Spend what is left on the single change (any option) that saves the most ΔKL, until none fits."""
    used = sum(o.bytes for o in choice.values())
    while True:
        best = None
        for u, opts in options.items():
            cur = choice[u]
            for o in opts:
                gain = cur.kl - o.kl
                if gain > 0 and used - cur.bytes + o.bytes <= budget and (best is None or gain > best[0]):
                    best = (gain, u, o)
        if best is None:
            return choice
        _, u, o = best
        used += o.bytes - choice[u].bytes
        choice[u] = o


def allocate_greedy(options: dict[str, list[Option]], budget: int) -> dict[str, Option]:
    """The convex-hull walk: buy the upgrade with the most ΔKL saved per byte that still fits, then fill."""
    _check(options, budget)
    hulls = {u: _hull(opts) for u, opts in options.items()}
    choice = {u: h[0] for u, h in hulls.items()}
    used = sum(o.bytes for o in choice.values())
    step = {u: 0 for u in hulls}
    heap: list[tuple[float, str]] = []

    def push(u: str) -> None:
        h, i = hulls[u], step[u]
        if i + 1 < len(h):
            a, b = h[i], h[i + 1]
            heapq.heappush(heap, (-(a.kl - b.kl) / (b.bytes - a.bytes), u))

    for u in hulls:
        push(u)
    while heap:
        _, u = heapq.heappop(heap)
        h, i = hulls[u], step[u]
        extra = h[i + 1].bytes - h[i].bytes
        if used + extra <= budget:
            used += extra
            step[u] = i + 1
            choice[u] = h[i + 1]
            push(u)
        # an upgrade that does not fit is dropped; cheaper ones of other units may still fit
    return _fill(options, choice, budget)

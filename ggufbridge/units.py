"""Human-readable quantities shared by the report formatters (inspect, quantisation table, compare)."""

from __future__ import annotations


def human_size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"

"""Quantities shared across the package: human-readable sizes (inspect, quantisation table, compare) and the
bounds of the integers handed to llama.cpp."""

from __future__ import annotations

# The largest integer llama.cpp takes: its tools parse integer arguments with std::stoi (a C int) and GGUF count
# fields and ctypes parameters are int32. Every integer option, recipe value and config count is bounded by it.
INT32_MAX = 2**31 - 1


def human_size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"

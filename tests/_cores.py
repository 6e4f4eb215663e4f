"""How many threads a test gives llama.cpp and torch: its pytest-xdist worker's share of the cores.

scripts/test.sh runs a worker per core and one more (tests/conftest.py). Left at every core, each worker's torch and
llama.cpp threads spin at barriers against the other workers': on this loaded 2-core box a transformers reference of
the tiny vision model took 8.9 s instead of 0.3 s, and the drafted `bench` tests with --threads 2 beside one busy
process took twice as long as with one thread (15.9 s against 8.1 s).
tests/conftest.py exports the share as OMP_NUM_THREADS, RAYON_NUM_THREADS and LLAMA_ARG_THREADS (llama.cpp's common
arguments read -t from it), so tools started without --threads follow it; tests that pass a thread count pass THREADS.
"""

from __future__ import annotations

import os


def worker_share() -> int | None:
    """The cores per worker under pytest-xdist, None outside it."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


THREADS = worker_share() or min(4, os.cpu_count() or 1)

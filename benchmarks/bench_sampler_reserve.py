"""What a request start costs with the sampler chains in the graph (docs/benchmarks.md, "Many clients, measured as
clients see them"): llama-server's own prompt-evaluation time of a short prompt, host sampler against
`--backend-sampling`, on one or more runtimes one after the other.

    .venv/bin/python benchmarks/bench_sampler_reserve.py MODEL.gguf [BIN_DIR ...] [--requests 12]

BIN_DIR: llama.cpp build/bin folders to compare (default: the runtime ggufbridge finds). With the chains in the
graph, the pinned runtime rebuilt and re-reserved its scheduler whenever a slot's chain changed, twice per request;
patch llama-context-backend-sampler-keep-reserve only for a slot's first chain. The figure is the median of
`timings.prompt_ms` over the requests after the first (a 4-token prompt, 8 greedy tokens, no prompt cache): on a
tiny model, the request start's own cost.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def prompt_ms(model: Path, extra: tuple[str, ...], n: int, log: Path) -> float:
    from _draft_helpers import llama_server, post_json

    with llama_server(model, None, extra=extra, log_path=log) as url:
        ms = [post_json(url + "/completion", {"prompt": f"Request {i} says hello", "n_predict": 8,
                                              "temperature": 0.0, "top_k": 1, "cache_prompt": False}
                        )["timings"]["prompt_ms"] for i in range(n)]
    return statistics.median(ms[1:])


def main(argv: list[str] | None = None) -> None:
    import os

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("bins", nargs="*", help="llama.cpp build/bin folders (default: the runtime ggufbridge finds)")
    ap.add_argument("--requests", type=int, default=12)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        for b in a.bins or [None]:
            if b:
                os.environ["LLAMA_CPP_BIN"] = str(b)  # the test helper's locate() reads it
            for extra in ((), ("--backend-sampling",)):
                ms = prompt_ms(a.model, extra, a.requests, Path(tmp) / "server.log")
                print(f"{b or 'default runtime'}  {'graph' if extra else 'host '} sampler: prompt_ms median "
                      f"{ms:.2f} over {a.requests - 1} requests")


if __name__ == "__main__":
    main()

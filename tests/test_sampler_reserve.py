"""Patch llama-context-backend-sampler-keep-reserve: with the sampler chains in the graph (`--backend-sampling`, the
GPU recipes' `server.backend_sampling`), llama-server sets a new chain for a slot at every request and clears it when
the slot is reset. On the pinned runtime each of those made libllama rebuild and re-reserve its scheduler before the
next decode (`set_sampler`, src/llama-context.cpp), a stall of every stream's step and ~30 ms of time to first token
on the H200. With the patch a sequence whose chain was in the last reserve needs none for the next one.

Counted from libllama's own log line ("sched_reserve: reserving ..."), which llama-server prints with -v; the greedy
text is the same as with the host sampler."""

from __future__ import annotations

import pytest

from _draft_helpers import llama_server, post_json
from _runtime_models import converted

pytestmark = pytest.mark.slow

RESERVE = "sched_reserve: reserving"


def _requests(url: str, ids: range) -> list[list[int]]:
    return [post_json(url + "/completion", {"prompt": f"Request {i} says hello", "n_predict": 8, "temperature": 0.0,
                                            "top_k": 1, "seed": 0, "cache_prompt": False, "return_tokens": True}
                      )["tokens"] for i in ids]


def test_a_new_request_does_not_re_reserve_the_scheduler(make_ckpt, tmp_path_factory, tmp_path):
    out = converted(make_ckpt, tmp_path_factory, with_draft=False)
    target = next(p for p in out.glob("*.gguf") if "mmproj" not in p.name and "draft" not in p.name.lower())
    log = tmp_path / "server-bs.log"
    with llama_server(target, None, extra=("--backend-sampling", "-v"), log_path=log) as url:
        first = _requests(url, range(1))
        after_one = log.read_text(errors="replace").count(RESERVE)
        more = _requests(url, range(1, 5))
        after_five = log.read_text(errors="replace").count(RESERVE)
    with llama_server(target, None, log_path=tmp_path / "server-host.log") as url:
        host = _requests(url, range(5))
    assert after_one >= 2, after_one  # at start, and once the first chain joined the graph
    assert after_five == after_one, (after_one, after_five)  # the pinned runtime: one more per request
    assert first + more == host  # the same greedy text as the host sampler

"""The KQ mask's one-pass fill (patch `kv-cache-mask-seq-summary` of the performance part, issue 24) against the loop
it bypasses; run where the runtime carries it (CUDA builds, or a CPU build with --perf).

Before each ubatch libllama fills the attention mask on the host, one value per cached cell per token. The patch
fills a row in one pass over a compact per-cell sequence summary when no cell is shared by several sequences, and
keeps the original loop (every cell's sequence set, rule by rule) when one is. So the same decode, once over cells
of one sequence and once after `llama_memory_seq_cp` has shared the prefix's cells with a second sequence, runs the
new pass and the old loop on the same cells: the logits must be the same. Through libllama itself (the runtime's own
library), for a one-token decode step and for an 8-token ubatch (whose later rows re-check only the cells near the
batch), on the M-RoPE model (qwen35moe: tokens at the query's own temporal position take the decode-order rule).
The upstream side of the patch, `test-kv-cells` (scripts/patch_upstream_tests.sh), checks the summary itself against
the sequence sets through random sequences of every call that changes them.
"""

from __future__ import annotations

import numpy as np
import pytest
from _runtime_models import needs_perf_patch
from test_recurrent_rollback import TOL, Runtime

pytestmark = needs_perf_patch("kv-cache-mask-seq-summary")

PREFIX = [11 + (7 * i) % 50 for i in range(40)]
CHUNK = [61, 62, 63, 64, 65, 66, 67, 68]


@pytest.fixture(scope="module")
def rt(make_gguf):
    r = Runtime(make_gguf("tiny", "f32", vocab="small"))
    yield r
    r.close()


def _decode_after_prefix(rt, tokens: list[int], *, shared: bool, prefix: list[int] = PREFIX) -> dict:
    """Seq 0 decodes `prefix`, then (shared: after copying its cells to seq 1) `tokens` in one ubatch; every row's
    logits."""
    ctx = rt.context(2, 0, unified=True)
    rt.decode(ctx, [(0, i, t, False) for i, t in enumerate(prefix)])
    if shared:
        rt.L.llama_memory_seq_cp(rt.L.llama_get_memory(ctx), 0, 1, -1, -1)
    n = len(prefix)
    return rt.decode(ctx, [(0, n + k, t, True) for k, t in enumerate(tokens)])


@pytest.mark.parametrize("tokens", [CHUNK[:1], CHUNK], ids=["decode-step", "8-token-ubatch"])
def test_one_pass_mask_equals_the_loop(rt, tokens):
    fast = _decode_after_prefix(rt, tokens, shared=False)
    loop = _decode_after_prefix(rt, tokens, shared=True)
    for k in range(len(tokens)):
        diff = float(np.abs(fast[k] - loop[k]).max())
        assert diff < TOL, f"row {k}: max |Δ logit| {diff:.3g} between the one-pass mask and the loop"


def test_a_different_context_is_caught(rt):
    """Ablation: the comparison can fail. One token of the prefix changed (what a mask that hides or shows one
    cell too many amounts to) moves the logits far outside the tolerance."""
    fast = _decode_after_prefix(rt, CHUNK[:1], shared=False)
    other = _decode_after_prefix(rt, CHUNK[:1], shared=False, prefix=PREFIX[:-2] + [99] + PREFIX[-1:])
    assert float(np.abs(fast[0] - other[0]).max()) > 100 * TOL

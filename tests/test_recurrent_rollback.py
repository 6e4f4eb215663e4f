"""Rolling a sequence's gated-delta-net state back after a batch that held other sequences too (issue 28).

Speculative decoding verifies a draft by decoding it, then rolls the state back to the last accepted token
(`llama_memory_seq_rm` with n_rs_seq snapshots). llama-server puts every slot's tokens in one batch: a drafting
slot's verification beside other slots' tokens and prompts. The recurrent memory splits that batch into ubatches,
and for each one moves cells so that the ubatch's sequences sit in adjacent rows; a cell of a sequence outside the
ubatch can be moved too. The pinned runtime moved such a cell's current state but left its rollback snapshots in
the old row: a sequence verified in an earlier ubatch of the same batch then rolled back into the snapshots of
whichever sequence had held its new row. Patch `memory-recurrent-rollback-snapshots-follow-cell`
moves the snapshots with the cell.

Each case decodes, through libllama itself (the runtime's own library), a batch whose split moves the verifying
sequence's cell after its verification ubatch, rolls back, and compares the next token's logits with the same
sequence decoded alone without drafting (an independent reference: no batch, no rollback). The "verification-first"
cases failed on the pinned runtime at every rollback depth, with one KV pool and with one KV stream per sequence
(max |Δ logit| 5.7-11.8 on this random model); "verification-last" passed there too (the cell moves before the
snapshots are written).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from _cores import THREADS
from _runtime_models import needs_perf_patch

N_RS = 4          # snapshots per sequence: drafts of up to 4 tokens roll back
PROMPTS = {0: [11, 12, 13], 1: [21, 22, 23], 2: [31, 32, 33]}
SAMPLED, DRAFT, NEXT = 40, [41, 42, 43, 44], 45
TOL = 1e-3        # f32 model: the reference and the batched path differ by ~3e-6; a wrong state by whole logits


class _TensorHead(ctypes.Structure):
    """The leading fields of ggml's `struct ggml_tensor` (ggml/include/ggml.h), up to its name."""

    _fields_ = [("type", ctypes.c_int32), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int32), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]


class Runtime:
    """The target GGUF through llama-cpp-python's C API (bound to the runtime built by scripts/setup.sh)."""

    def __init__(self, path):
        import llama_cpp

        self.L = llama_cpp
        llama_cpp.llama_backend_init()
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
        assert self.model, path
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        self.contexts = []
        self.graphs = 0  # graph computations seen by the eval callback: one per ubatch
        # where each delta-net layer's input state lives: the name of the tensor its "state_predelta" view reads
        # (a view's view_src is its root): the cache itself (cache_s_l<il>) or a gathered copy (a GET_ROWS node)
        self.state_roots: list[bytes] = []

        def seen(t, ask, user_data):
            if ask:
                head = _TensorHead.from_address(t)
                if head.name == b"result_output":
                    self.graphs += 1
                elif head.name.startswith(b"state_predelta"):
                    self.state_roots.append(_TensorHead.from_address(head.view_src).name if head.view_src else b"")
            return False  # observe nothing: only the scheduler's question is counted

        self._cb = llama_cpp.ggml_backend_sched_eval_callback(seen)  # kept alive with the contexts

    def context(self, n_seq: int, n_rs: int, unified: bool, count_ubatches: bool = False):
        cp = self.L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 512, 64, 64
        cp.n_seq_max, cp.n_rs_seq, cp.kv_unified = n_seq, n_rs, unified
        cp.n_threads = cp.n_threads_batch = THREADS
        if count_ubatches:
            cp.cb_eval = self._cb
        ctx = self.L.llama_init_from_model(self.model, cp)
        assert ctx
        self.contexts.append(ctx)
        assert self.L.llama_n_rs_seq(ctx) == n_rs  # qwen35moe supports the rollback (the runtime clamps it otherwise)
        return ctx

    def decode(self, ctx, items) -> dict[int, np.ndarray]:
        """items: (seq, pos, token, logits?) in batch order; returns the logits of the marked ones by batch index."""
        L = self.L
        b = L.llama_batch_init(len(items), 0, 1)
        try:
            for i, (seq, pos, tok, out) in enumerate(items):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, out
                b.seq_id[i][0] = seq
            b.n_tokens = len(items)
            assert L.llama_decode(ctx, b) == 0
            return {i: np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), (self.n_vocab,)).copy()
                    for i, it in enumerate(items) if it[3]}
        finally:
            L.llama_batch_free(b)

    def rollback(self, ctx, seq: int, keep_until: int) -> None:
        """Drop positions > keep_until of `seq` (the rejected part of a verified draft)."""
        assert self.L.llama_memory_seq_rm(self.L.llama_get_memory(ctx), seq, keep_until + 1, -1)

    def close(self):
        for ctx in self.contexts:
            self.L.llama_free(ctx)
        self.L.llama_model_free(self.model)


@pytest.fixture(scope="module")
def rt(make_gguf):
    r = Runtime(make_gguf("tiny", "f32", vocab="small"))
    yield r
    r.close()


def _alone(rt, tokens: list[int]) -> np.ndarray:
    """Reference: `tokens` decoded as one sequence, one context, no snapshots; logits after the last one."""
    ctx = rt.context(1, 0, unified=True)
    rt.decode(ctx, [(0, i, t, False) for i, t in enumerate(tokens[:-1])])
    return rt.decode(ctx, [(0, len(tokens) - 1, tokens[-1], True)])[0]


def _prefill(rt, ctx, order: list[int]) -> None:
    """Each sequence's prompt in its own decode, in `order`: the recurrent cells are taken in that order."""
    for s in order:
        rt.decode(ctx, [(s, i, t, False) for i, t in enumerate(PROMPTS[s])])


def _verify_then_roll_back(rt, ctx, seq: int, others: list[int], accepted: int, *, verify_first: bool) -> np.ndarray:
    """One batch: `seq` verifies SAMPLED + DRAFT, the `others` decode one token each. Then `seq` keeps `accepted`
    drafted tokens (rolls back len(DRAFT) - accepted) and decodes NEXT; its logits."""
    n = len(PROMPTS[seq])
    verify = [(seq, n + k, t, True) for k, t in enumerate([SAMPLED] + DRAFT)]
    other = [(s, len(PROMPTS[s]), 50 + s, True) for s in others]
    rt.decode(ctx, verify + other if verify_first else other + verify)
    rt.rollback(ctx, seq, n + accepted)
    return rt.decode(ctx, [(seq, n + accepted + 1, NEXT, True)])[0]


def _expected(seq: int, accepted: int) -> list[int]:
    return PROMPTS[seq] + [SAMPLED] + DRAFT[:accepted] + [NEXT]


# (KV cache, prefill order, verifying sequence, the others, batch order): each case makes the memory move the
# verifying sequence's cell while it places the others' ubatch, after or before its verification ubatch
CASES = {
    # unified KV pool (what `serve --parallel N` plans): any sequences share a ubatch; cells 0,1,2 = seqs 0,1,2, the
    # verification (5 tokens) is split off first, then seqs 0 and 2 take cells 0-1 and seq 1 moves to cell 2
    "unified-verification-first": (True, [0, 1, 2], 1, [0, 2], True),
    # the same with the verification last: seq 1 moves before its verification ubatch (was already right)
    "unified-verification-last": (True, [0, 1, 2], 1, [0, 2], False),
    # one KV stream per sequence: ubatches take consecutive sequence ids; seq 1 prefilled first holds cell 0,
    # seq 0 cell 1: after seq 0's verification, seqs 1 and 2 take cells 0-1 and seq 0 moves to cell 2
    "streams-verification-first": (False, [1, 0, 2], 0, [1, 2], True),
}


@pytest.mark.parametrize("accepted", [0, 2])  # a rollback of 4 tokens (all rejected) and of 2
@pytest.mark.parametrize("case", sorted(CASES))
def test_rollback_after_a_shared_batch_equals_the_sequence_alone(rt, case, accepted):
    unified, order, seq, others, verify_first = CASES[case]
    ctx = rt.context(3, N_RS, unified)
    _prefill(rt, ctx, order)
    got = _verify_then_roll_back(rt, ctx, seq, others, accepted, verify_first=verify_first)
    diff = float(np.abs(got - _alone(rt, _expected(seq, accepted))).max())
    assert diff < TOL, f"{case}, {accepted} accepted: max |Δ logit| {diff:.3g} from the sequence decoded alone"


def test_a_state_one_token_off_is_caught(rt):
    """Ablation: the comparison above can fail. The state after keeping one drafted token more than the reference
    (what a rollback into the wrong snapshot leaves) gives logits far outside the tolerance."""
    ctx = rt.context(3, N_RS, True)
    _prefill(rt, ctx, [0, 1, 2])
    got = _verify_then_roll_back(rt, ctx, 1, [0, 2], 2, verify_first=False)
    assert float(np.abs(got - _alone(rt, _expected(1, 2))).max()) < TOL
    wrong = _alone(rt, PROMPTS[1] + [SAMPLED] + DRAFT[:3] + [NEXT])
    assert float(np.abs(got - wrong).max()) > 100 * TOL


@needs_perf_patch("memory-recurrent-state-in-place")
@pytest.mark.parametrize("n_rs", [0, N_RS])
def test_decode_steps_read_each_state_where_it_is(rt, n_rs):
    """Patch memory-recurrent-state-in-place (performance part): once each sequence's gated-delta-net state sits in
    its own cell, a decode step reads it there (the layer's state is a view of the cache, cache_s_l<il>, not a
    gathered copy of 2 MiB a sequence and layer at full shape), also a step of sequences 1 and 2 alone (their cells
    start at 1) and with rollback snapshots kept; every row's logits equal the sequence decoded alone. The check of
    where the state is read can fail: the step after a rollback must gather (it reads a snapshot group), and it
    does."""
    ctx = rt.context(3, n_rs, True, count_ubatches=True)
    _prefill(rt, ctx, [0, 1, 2])
    hist = {s: list(PROMPTS[s]) for s in PROMPTS}
    for step, seqs in enumerate([[0, 1, 2], [1, 2], [0, 1, 2]]):
        items = [(s, len(hist[s]), 60 + 3 * step + s, True) for s in seqs]
        rt.state_roots.clear()
        got = rt.decode(ctx, items)
        assert rt.state_roots and all(r.startswith(b"cache_s_l") for r in rt.state_roots), (step, rt.state_roots)
        for i, (s, _, tok, _) in enumerate(items):
            hist[s].append(tok)
            diff = float(np.abs(got[i] - _alone(rt, hist[s])).max())
            assert diff < TOL, f"step {step}, sequence {s}: max |Δ logit| {diff:.3g} from the sequence alone"
        # a state read from a neighbour's cell would be caught: the rows are far apart
        assert float(np.abs(got[0] - got[1]).max()) > 100 * TOL
    if n_rs:
        n = len(hist[1])
        rt.decode(ctx, [(1, n + k, t, True) for k, t in enumerate([SAMPLED] + DRAFT)])
        rt.rollback(ctx, 1, n + 1)
        rt.state_roots.clear()
        got = rt.decode(ctx, [(1, n + 2, NEXT, True)])[0]
        assert rt.state_roots and not any(r.startswith(b"cache_s_l") for r in rt.state_roots), rt.state_roots
        assert float(np.abs(got - _alone(rt, hist[1] + [SAMPLED, DRAFT[0], NEXT])).max()) < TOL

"""Issue 2 acceptance: the converted text tower computes what transformers computes.

Reference: transformers' own MiniCPMV4_7ForConditionalGeneration (float32) on a synthetic checkpoint. The logit
parity and its ablations use the small vocabulary (the first 472 byte-level BPE ranks of Qwen3.5 plus its specials):
they test the transforms of the layers, not the vocabulary, which tests/test_tokenizer_parity.py covers on the real
one; the greedy test keeps the real vocabulary (its confident head is fitted on it). Under test: llama.cpp (pinned
runtime, through llama-cpp-python) on our GGUF. Logits and KL come
from compare's stack (HFSource, GGUFSource, metrics), as `ggufbridge demo` and `compare` compute them; greedy
decoding, which compare does not do, from each library's own generate() (tests/_reference.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from ggufbridge.arch import qwen35moe
from ggufbridge.convert import convert
from _reference import gguf_greedy, gguf_model, hf_greedy, hf_model
from _synthetic.confident import TEXT
from ggufbridge.compare.sources import GGUFSource, HFSource
from ggufbridge.compare.teacher_forced import logits, parity, router_margins
from ggufbridge.testkit.vocab import reference_encode

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is Paris, and the capital of Germany is",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "日本語のテキストを書いています。中文测试：你好，世界！",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n",
]
KL_BOUND = 1e-5
# Router probability gap under which the top-k expert choice is a coin toss between float implementations.
TIE = 1e-4


VOCAB = "small"


@pytest.fixture(scope="module")
def small_ckpt(make_ckpt):
    return make_ckpt("tiny", vocab=VOCAB)


@pytest.fixture(scope="module")
def ref(small_ckpt):
    hf = HFSource(small_ckpt)
    return {p: logits(hf, reference_encode(p, VOCAB)) for p in PROMPTS}, hf.model


@pytest.fixture(scope="module")
def ties(ref):
    _, model = ref
    return {p: router_margins(model, reference_encode(p, VOCAB)) < TIE for p in PROMPTS}


def _convert(ckpt, tmp_path, outtype):
    return convert(ckpt, tmp_path / outtype, outtype=outtype, progress=False, mmproj=False).path("target")


def _parities(path, ref_logits):
    with GGUFSource(path, n_ctx=512, chunk=512) as gguf:
        return {p: parity(ref_logits[p], logits(gguf, reference_encode(p, VOCAB))) for p in PROMPTS}


def test_f32_logits_match_transformers(make_gguf, ref, ties):
    """KL mean < 1e-5 and the same top-1 at every position, except where the reference router itself is tied
    between two experts (then both implementations are right and pick differently); those positions must be
    rare and must be the only ones that deviate."""
    ref_logits, _ = ref
    n_tied = n_pos = 0
    for prompt, par in _parities(make_gguf("tiny", "f32", vocab=VOCAB), ref_logits).items():
        tied = ties[prompt]
        n_tied += int(tied.sum())
        n_pos += len(tied)
        assert par.kl[~tied].mean() < KL_BOUND, (prompt, par.kl[~tied].mean())
        assert par.top1[~tied].all(), (prompt, np.flatnonzero(~par.top1))
        assert (par.kl[~tied] < 1e-4).all(), (prompt, np.flatnonzero(par.kl >= 1e-4))
    assert n_tied <= n_pos // 20, f"{n_tied} of {n_pos} positions have router ties: the fixture is degenerate"


def test_q8_0_greedy_matches_transformers(confident_ckpt, tmp_path):
    """Q8_0 continues like the float32 reference for 16 tokens. On a random head that would be luck (flat
    distributions: transformers' own BF16 already changes ~16% of the argmaxes), so the reference here is the tiny
    model with a head that knows TEXT (see tests/_synthetic/confident.py); the layers are the same random ones."""
    model = hf_model(confident_ckpt)
    text_ids = reference_encode(TEXT)
    llm = gguf_model(_convert(confident_ckpt, tmp_path, "q8_0"))
    try:
        for start in (4, 15, 30):
            ids = text_ids[:start]
            want = hf_greedy(model, ids, 16)
            assert want == text_ids[start:start + 16], "the reference itself does not continue TEXT"
            assert gguf_greedy(llm, ids, 16) == want, start
    finally:
        llm.close()


def _no_offset(a, dtype, p):
    return qwen35moe.as_f32(a, dtype, p)


def _log_not_neg_exp(a, dtype, p):
    return qwen35moe.reorder_vheads(qwen35moe.to_f32(a, dtype), 0, p, 1), "F32"


ABLATIONS = {
    "no +1 on RMSNorm weights": ("TRANSFORMS", "rmsnorm_offset", _no_offset),
    "no V-head reorder": (None, "reorder_vheads", lambda a, axis, p, head_dim: a),
    "A_log instead of -exp(A_log)": ("TRANSFORMS", "neg_exp_a_log", _log_not_neg_exp),
}


@pytest.mark.parametrize("ablation", sorted(ABLATIONS))
def test_parity_fails_without_each_transform(ablation, small_ckpt, ref, tmp_path, monkeypatch):
    table, name, replacement = ABLATIONS[ablation]
    if table:
        monkeypatch.setitem(getattr(qwen35moe, table), name, replacement)
    else:
        monkeypatch.setattr(qwen35moe, name, replacement)
    ref_logits, _ = ref
    pars = _parities(_convert(small_ckpt, tmp_path, "f32"), ref_logits)
    worst = max(par.kl_mean for par in pars.values())
    assert worst > 100 * KL_BOUND, f"{ablation}: parity still holds (KL {worst:.2e}) — the test cannot see it"

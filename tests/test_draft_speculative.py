"""Speculative decoding with converted DSpark drafts in the pinned llama-server (`--spec-type draft-dspark`).

* Random-weight drafts: greedy output must equal target-only output token for token, while the server really
  drafted (its own `draft_n` counter > 0), for several prompts and several draft layouts / output types.
* Oracle pair: the target's greedy continuation is t → succ(t) by construction and the draft's Markov head encodes
  the same map, so the server must accept most drafts (its `draft_n_accepted` / `draft_n` > 50%), the output must
  still equal target-only output, and both must equal succ iterated (the independent reference). A control draft
  whose Markov head encodes t → succ(succ(t)) must get (almost) nothing accepted, with the output unchanged.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from _draft_helpers import greedy, llama_server
from ggufbridge.convert import convert
from ggufbridge.testkit import dspark as fx

pytestmark = pytest.mark.slow

PROMPTS = ["Hello world", "The quick brown fox jumps over the lazy dog.", "def fib(n):\n", [1, 2, 3, 4, 5], [300]]
N_PREDICT = 24
N_MAX = ("--spec-draft-n-max", "4")


def _run(target_gguf: Path, draft_gguf: Path | None, tmp_path: Path, tag: str, prompts=PROMPTS, extra=()):
    with llama_server(target_gguf, draft_gguf, extra=N_MAX + tuple(extra),
                      log_path=tmp_path / f"server-{tag}.log") as url:
        return [greedy(url, p, N_PREDICT) for p in prompts]


@pytest.fixture(scope="module")
def target(make_ckpt):
    return make_ckpt("tiny", vocab="small")


@pytest.fixture(scope="module")
def target_gguf(make_gguf):
    return make_gguf("tiny", "f32", vocab="small")


@pytest.fixture(scope="module")
def plain(target_gguf, tmp_path_factory):
    return _run(target_gguf, None, tmp_path_factory.mktemp("plain"), "plain")


@pytest.mark.parametrize("spec,schema,outtype", [
    ("tiny", "flat", "f16"),
    ("tiny2", "nested", "bf16"),
    ("reduced", "flat", "f32"),  # own head + d2t (I64): the runtime's scatter path
    ("tiny", "flat", "q8_0"),
])
def test_random_draft_keeps_greedy_output(target, plain, tmp_path, spec, schema, outtype):
    d = fx.make_dspark(tmp_path / "draft", target, spec, schema=schema, seed=7)
    res = convert(target, tmp_path / "out", outtype="f32", draft=d, draft_outtype=outtype, mmproj=False,
                  progress=False)
    spec_out = _run(res.path("target"), res.path("draft"), tmp_path, "spec")
    for prompt, (want, _), (got, timings) in zip(PROMPTS, plain, spec_out):
        assert len(want) == N_PREDICT
        assert got == want, prompt
        assert timings.get("draft_n", 0) > 0, timings  # the draft really proposed tokens
    log = (tmp_path / "server-spec.log").read_text(errors="replace")
    assert "adding speculative implementation 'draft-dspark'" in log


ORACLE_PROMPTS = ["Hello world", [1, 2, 3, 4, 5], [150], [163], "abc def"]


@pytest.fixture(scope="module")
def oracle_plain(oracle_pair, tmp_path_factory):
    """The oracle target's greedy output without a draft: what every drafted run below must reproduce."""
    _, res = oracle_pair
    return _run(res.path("target"), None, tmp_path_factory.mktemp("oracle-plain"), "plain", ORACLE_PROMPTS)


def test_oracle_pair_drafts_are_accepted(oracle_pair, oracle_plain, tmp_path):
    pair, res = oracle_pair
    plain = oracle_plain
    spec = _run(res.path("target"), res.path("draft"), tmp_path, "spec", ORACLE_PROMPTS)
    drafted = accepted = 0
    for prompt, (want, _), (got, timings) in zip(ORACLE_PROMPTS, plain, spec):
        assert got == want, prompt
        # the target really is the oracle: after the first token, each token is succ of the one before
        assert want[1:] == pair.continuation(want[0], N_PREDICT - 1), want
        if isinstance(prompt, list):
            assert want == pair.continuation(prompt[-1], N_PREDICT)
        drafted += timings["draft_n"]
        accepted += timings["draft_n_accepted"]
    print(f"oracle pair: {accepted}/{drafted} drafted tokens accepted")
    assert drafted > 0
    assert accepted / drafted > 0.5, (accepted, drafted)


def test_wrong_markov_map_gets_nothing_accepted(oracle_pair, oracle_plain, tmp_path):
    """Control: the same pair with the draft's Markov head shifted by one (t → succ(succ(t)))."""
    pair, _ = oracle_pair
    spec = replace(pair.draft_spec)
    import json

    cfg = json.loads((pair.draft_dir / "config.json").read_text())
    text = json.loads((pair.target_dir / "config.json").read_text())["text_config"]
    t = fx.oracle_draft_tensors(spec, text["hidden_size"], text["vocab_size"], pair.lo, pair.n)
    w2 = np.zeros_like(t["markov_head.markov_w2.weight"])
    cyc = np.arange(pair.lo, pair.lo + pair.n)
    w2[cyc, (cyc - pair.lo - 2) % pair.n] = 8.0
    t["markov_head.markov_w2.weight"] = w2
    wrong = fx.write_draft(tmp_path / "wrong", cfg, t, dtype="float32")
    res2 = convert(pair.target_dir, tmp_path / "out", outtype="f32", draft=wrong, mmproj=False, progress=False)
    plain = oracle_plain  # res2's target is the same file as the oracle's
    spec_out = _run(res2.path("target"), res2.path("draft"), tmp_path, "spec", ORACLE_PROMPTS)
    drafted = accepted = 0
    for (want, _), (got, timings) in zip(plain, spec_out):
        assert got == want
        drafted += timings["draft_n"]
        accepted += timings["draft_n_accepted"]
    print(f"control pair: {accepted}/{drafted} drafted tokens accepted")
    assert drafted > 0 and accepted / drafted < 0.1, (accepted, drafted)


@pytest.mark.parametrize("bias,accepts", [(10.0, True), (-10.0, False)])
def test_confidence_head_gates_drafting(oracle_pair, oracle_plain, tmp_path, bias, accepts):
    """With --spec-draft-p-min the runtime stops drafting where sigmoid(conf_proj · [h; w1[prev]] + b) < p_min:
    a confident head keeps the oracle's drafts, an unconfident one suppresses every draft."""
    import json

    pair, _ = oracle_pair
    cfg = json.loads((pair.draft_dir / "config.json").read_text())
    text = json.loads((pair.target_dir / "config.json").read_text())["text_config"]
    t = fx.oracle_draft_tensors(pair.draft_spec, text["hidden_size"], text["vocab_size"], pair.lo, pair.n)
    t["confidence_head.proj.weight"] = np.zeros_like(t["confidence_head.proj.weight"])
    t["confidence_head.proj.bias"] = np.array([bias], np.float32)
    d = fx.write_draft(tmp_path / "draft", cfg, t, dtype="float32")
    res = convert(pair.target_dir, tmp_path / "out", outtype="f32", draft=d, mmproj=False, progress=False)
    plain = oracle_plain  # the same target file as the oracle's
    gated = _run(res.path("target"), res.path("draft"), tmp_path, "gated", ORACLE_PROMPTS,
                 extra=("--spec-draft-p-min", "0.5"))
    drafted = accepted = 0
    for (want, _), (got, timings) in zip(plain, gated):
        assert got == want
        drafted += timings.get("draft_n", 0)
        accepted += timings.get("draft_n_accepted", 0)
    log = (tmp_path / "server-gated.log").read_text(errors="replace")
    assert "p_min=0.50" in log  # speculative decoding was set up with the threshold (not disabled)
    if accepts:
        assert drafted > 0 and accepted / drafted > 0.5, (accepted, drafted)
    else:
        assert drafted == 0, (accepted, drafted)

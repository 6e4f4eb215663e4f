"""ggufbridge.compare.metrics / evalset / dump against direct numpy computations (no models: fast)."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest

from ggufbridge.compare import evalset
from ggufbridge.compare.dump import DumpReader, DumpWriter
from ggufbridge.compare.evalset import Row
from ggufbridge.compare.metrics import Accumulator, Dense, chunk_stats, chunk_stats_threaded, topk_form
from ggufbridge.compare.run import _compare_one
from ggufbridge.compare.sources import Source
from ggufbridge.errors import EvalDataError


def softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def reference_figures(ref_logits, cand_logits, labels):
    """Per-position figures straight from the definitions (probabilities, not log-softmax)."""
    p, q = softmax(ref_logits.astype(np.float64)), softmax(cand_logits.astype(np.float64))
    kl = np.sum(p * np.log(p / q), axis=1)
    kl_rev = np.sum(q * np.log(q / p), axis=1)
    top1 = (np.argsort(-p, axis=1)[:, 0] == np.argsort(-q, axis=1)[:, 0]).astype(float)
    t5p, t5q = np.argsort(-p, axis=1)[:, :5], np.argsort(-q, axis=1)[:, :5]
    top5 = np.array([len(set(a) & set(b)) / 5 for a, b in zip(t5p, t5q)])
    have = labels >= 0
    nll_p = -np.log(p[np.nonzero(have)[0], labels[have]])
    nll_q = -np.log(q[np.nonzero(have)[0], labels[have]])
    return kl, kl_rev, top1, top5, nll_p, nll_q


def make_pair(rng, n, v, noise=0.3, scale=2.0):
    ref = rng.normal(0, scale, (n, v)).astype(np.float32)
    return ref, (ref + rng.normal(0, noise, (n, v))).astype(np.float32)


def test_chunk_stats_match_definitions():
    rng = np.random.default_rng(0)
    ref, cand = make_pair(rng, 40, 97)
    labels = rng.integers(0, 97, 40)
    labels[-1] = -1
    s = chunk_stats(Dense(ref), Dense(cand), labels)
    kl, kl_rev, top1, top5, nll_p, nll_q = reference_figures(ref, cand, labels)
    np.testing.assert_allclose(s["kl"], kl, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(s["kl_rev"], kl_rev, rtol=1e-9, atol=1e-15)
    np.testing.assert_array_equal(s["top1"], top1)
    np.testing.assert_array_equal(s["top5"], top5)
    np.testing.assert_allclose(s["nll_ref"][:-1], nll_p, rtol=1e-12)
    np.testing.assert_allclose(s["nll_cand"][:-1], nll_q, rtol=1e-12)
    assert np.isnan(s["nll_ref"][-1])
    # identical distributions: exactly zero, never negative
    z = chunk_stats(Dense(ref), Dense(ref.copy()), labels)
    assert np.all(z["kl"] == 0) and np.all(z["top1"] == 1) and np.all(z["top5"] == 1)


def _accumulate(rows, logits, chunk):
    acc = Accumulator()
    for i, (row, (r, c)) in enumerate(zip(rows, logits)):
        labels = row.labels
        for a in range(0, len(row.ids), chunk):
            acc.add(i, row.kind, Dense(r[a:a + chunk]), Dense(c[a:a + chunk]), labels[a:a + chunk])
    return acc.summary()


def test_summary_matches_numpy_and_is_chunk_invariant():
    rng = np.random.default_rng(1)
    v = 64
    lengths = [30, 17, 45, 8]
    kinds = ["prose", "code", "prose", "chat"]
    rows = [Row(tuple(int(x) for x in rng.integers(0, v, n)), kind=k) for n, k in zip(lengths, kinds)]
    # row 2 gets much more noise: it must come out as the worst row
    logits = [make_pair(rng, n, v, noise=1.5 if i == 2 else 0.2) for i, n in enumerate(lengths)]
    s = _accumulate(rows, logits, chunk=7)

    per = [reference_figures(r, c, row.labels) for row, (r, c) in zip(rows, logits)]

    def figures(sel):
        kl = np.concatenate([per[i][0] for i in sel])
        nll_p = np.concatenate([per[i][4] for i in sel])
        nll_q = np.concatenate([per[i][5] for i in sel])
        return {
            "kl_mean": kl.mean(), "kl_median": np.median(kl), "kl_p95": np.percentile(kl, 95),
            "kl_p99": np.percentile(kl, 99), "kl_max": kl.max(),
            "kl_rev_mean": np.concatenate([per[i][1] for i in sel]).mean(),
            "top1": np.concatenate([per[i][2] for i in sel]).mean(),
            "top5_overlap": np.concatenate([per[i][3] for i in sel]).mean(),
            "ppl_ratio": np.exp(nll_q.mean()) / np.exp(nll_p.mean()),
            "n_rows": len(sel), "n_tokens": len(kl),
        }

    def check(got, want):
        for k, w in want.items():
            assert got[k] == pytest.approx(w, rel=1e-9), k

    check(s, figures([0, 1, 2, 3]))
    check(s["per_kind"]["prose"], figures([0, 2]))
    check(s["per_kind"]["chat"], figures([3]))
    assert set(s["per_kind"]) == {"prose", "code", "chat"}
    row_means = [p[0].mean() for p in per]
    assert s["worst_row"]["row"] == int(np.argmax(row_means)) == 2
    assert s["worst_row"]["kl_mean"] == pytest.approx(row_means[2], rel=1e-9)
    check(s["without_worst"], figures([0, 1, 3]))
    # the same figures whatever the chunking
    for chunk in (1, 45):
        other = _accumulate(rows, logits, chunk)
        for k in ("kl_mean", "kl_p95", "top1", "top5_overlap", "ppl_ratio"):
            assert other[k] == pytest.approx(s[k], rel=1e-12)


def test_single_row_has_no_without_worst():
    rng = np.random.default_rng(2)
    rows = [Row(tuple(range(10)))]
    s = _accumulate(rows, [make_pair(rng, 10, 20)], chunk=4)
    assert s["without_worst"] is None and s["worst_row"]["row"] == 0


def test_topk_form_is_a_partition_and_lower_bound():
    rng = np.random.default_rng(3)
    ref, cand = make_pair(rng, 25, 300, noise=0.5)
    labels = rng.integers(0, 300, 25)
    full = chunk_stats(Dense(ref), Dense(cand), labels)
    for k in (5, 40, 300):
        t = topk_form(ref, k, labels)
        lp = np.log(softmax(ref.astype(np.float64)))
        # sorted, the true top-k, and top-k mass + rest mass = 1
        assert np.all(np.diff(t.logp, axis=1) <= 0)
        np.testing.assert_allclose(t.logp, -np.sort(-lp, axis=1)[:, :k], rtol=1e-12)
        np.testing.assert_allclose(np.exp(t.logp).sum(1) + np.exp(t.rest), 1.0, rtol=1e-12)
        np.testing.assert_allclose(t.label_logp, lp[np.arange(25), labels], rtol=1e-12)
        c = chunk_stats(t, Dense(cand), labels)
        # data-processing inequality: coarsening never increases KL; equal when nothing is left out
        assert np.all(c["kl"] <= full["kl"] + 1e-12)
        assert np.all(c["kl_rev"] <= full["kl_rev"] + 1e-12)
        np.testing.assert_array_equal(c["top1"], full["top1"])
        np.testing.assert_array_equal(c["top5"], full["top5"])
        np.testing.assert_allclose(c["nll_ref"], full["nll_ref"], rtol=1e-12)
    np.testing.assert_allclose(c["kl"], full["kl"], rtol=1e-9)  # k = vocabulary: exact


def test_threaded_chunk_stats_are_the_same_numbers_position_by_position():
    """The probes' and compare's KL runs split by positions over host threads: every figure must come back in
    position order and equal to the one-thread result (a chunk length that is no multiple of the split; a top-K
    reference with rest samples and a dense one)."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(9)
    ref, cand = make_pair(rng, 53, 400, noise=0.5)
    labels = rng.integers(-1, 400, 53)
    for r in (Dense(ref), topk_form(ref, 40, labels, 8, np.random.default_rng(1))):
        one = chunk_stats(r, Dense(cand), labels)
        with ThreadPoolExecutor(4) as pool:
            many = chunk_stats_threaded(r, Dense(cand), labels, pool)
        assert many.keys() == one.keys()
        for k in one:
            np.testing.assert_array_equal(many[k], one[k], err_msg=k)
    # and a swapped order would be caught: the figures differ from position to position
    assert len(set(np.round(one["kl"], 12))) > 40


def test_rest_samples_give_unbiased_kl():
    """With most mass outside the top-K, the sampled correction recovers the full KL on average."""
    rng = np.random.default_rng(4)
    ref, cand = make_pair(rng, 400, 2000, noise=0.3, scale=1.0)
    labels = np.full(400, -1)
    full = chunk_stats(Dense(ref), Dense(cand), labels)
    t0 = topk_form(ref, 16, labels)
    coarse = chunk_stats(t0, Dense(cand), labels)
    assert coarse["ref_rest"].mean() > 0.5  # the rest dominates: the coarse KL is far too low
    assert coarse["kl"].mean() < 0.5 * full["kl"].mean()
    t = topk_form(ref, 16, labels, samples=64, rng=np.random.default_rng(5))
    # samples really come from the rest, with their true log-probabilities
    assert not np.any(t.sample_ids[:, :, None] == t.ids[:, None, :])
    lp = np.log(softmax(ref.astype(np.float64)))
    np.testing.assert_allclose(t.sample_logp, np.take_along_axis(lp, t.sample_ids, 1), rtol=1e-12)
    est = chunk_stats(t, Dense(cand), labels)
    assert est["kl"].mean() == pytest.approx(full["kl"].mean(), rel=0.02)
    assert est["kl_rev"].mean() == pytest.approx(full["kl_rev"].mean(), rel=0.02)


def test_rest_sampling_follows_the_distribution():
    rng = np.random.default_rng(6)
    logits = rng.normal(0, 1.0, (1, 12))
    t = topk_form(np.repeat(logits, 4000, axis=0), 3, np.full(4000, -1), samples=8, rng=rng)
    counts = np.bincount(t.sample_ids.ravel(), minlength=12) / t.sample_ids.size
    p = softmax(logits)[0]
    p[t.ids[0]] = 0
    np.testing.assert_allclose(counts, p / p.sum(), atol=0.01)


def test_dump_roundtrip_read_by_safetensors(tmp_path):
    from safetensors.numpy import load_file

    rng = np.random.default_rng(7)
    lengths = [5, 9, 3]
    chunks = []
    with DumpWriter(tmp_path / "d.safetensors", row_lengths=lengths, top_k=6, samples=4,
                    meta={"vocab_size": 50, "row_sha256": ["a", "b", "c"]}) as w:
        for n in lengths:
            for a in range(0, n, 4):
                m = min(4, n - a)
                c = topk_form(rng.normal(size=(m, 50)), 6, rng.integers(0, 50, m), samples=4, rng=rng)
                chunks.append(c)
                w.add(c)
    plain = load_file(str(tmp_path / "d.safetensors"))  # the official reader agrees with our writer
    np.testing.assert_array_equal(plain["row_offsets"], [0, 5, 14, 17])
    np.testing.assert_allclose(plain["topk_logp"], np.concatenate([c.logp for c in chunks]).astype(np.float32))
    np.testing.assert_array_equal(plain["sample_ids"], np.concatenate([c.sample_ids for c in chunks]))
    r = DumpReader.open(tmp_path / "d.safetensors")
    assert r.n_rows == 3 and r.meta["vocab_size"] == 50 and r.has_samples
    got = list(r.chunks(1, 4))
    assert [c.n for c in got] == [4, 4, 1]
    np.testing.assert_array_equal(np.concatenate([c.ids for c in got]), plain["topk_ids"][5:14])
    assert not list(tmp_path.glob(".*partial"))


def test_dump_incomplete_leaves_no_file(tmp_path):
    with pytest.raises(ValueError, match="incomplete"):
        with DumpWriter(tmp_path / "d.safetensors", row_lengths=[4], top_k=5, meta={}) as w:
            w.add(topk_form(np.zeros((2, 10)), 5, np.full(2, -1)))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content, message", [
    ("", "empty eval set"),
    ("\n\n", "empty eval set"),
    ('{"ids": [1, 2, 3]}\n{"ids": [1, 2, 3, 4, 5, 6, 7, 8, 9]}\n', "row has 9 tokens, more than --ctx 8"),
    ('{"ids": []}\n', "no tokens"),
    ('{"ids": [1, -2]}\n', "non-negative integers"),
    ('{"ids": [1], "text": "x"}\n', "exactly one of"),
    ('not json\n', "not valid JSON"),
    ('{"ids": [1, 2], "kind": 3}\n', "'kind' must be"),
])
def test_bad_eval_files(tmp_path, content, message):
    p = tmp_path / "e.jsonl"
    p.write_text(content)
    with pytest.raises(EvalDataError, match=message):
        evalset.load_rows(eval_path=p, ctx=8, tokenize=lambda t: [1, 2])


def test_text_file_cut_into_ctx_rows(tmp_path):
    p = tmp_path / "book.txt"
    p.write_text("x")
    toks = list(range(23))
    rows = evalset.load_rows(text_path=p, ctx=8, tokenize=lambda t: toks)
    assert [r.ids for r in rows] == [tuple(toks[0:8]), tuple(toks[8:16]), tuple(toks[16:23])]
    assert {r.kind for r in rows} == {"book"}
    with pytest.raises(EvalDataError, match="empty eval set"):
        evalset.load_rows(text_path=p, ctx=8, tokenize=lambda t: [5])


class FakeSource(Source):
    """Deterministic pseudo-logits of a large vocabulary, made chunk by chunk (like a real model would)."""

    def __init__(self, vocab, seed, noise=0.0):
        self.spec, self.vocab_size, self.seed, self.noise = f"fake{seed}", vocab, seed, noise
        self.max_chunk = 0

    def chunks(self, index, row, chunk):
        for a in range(0, len(row.ids), chunk):
            n = min(chunk, len(row.ids) - a)
            base = np.random.default_rng([index, a]).normal(0, 2, (n, self.vocab_size)).astype(np.float32)
            if self.noise:
                base += np.random.default_rng([index, a, 1]).normal(0, self.noise, base.shape).astype(np.float32)
            self.max_chunk = max(self.max_chunk, n)
            yield Dense(base)


@pytest.mark.slow
def test_memory_stays_at_chunk_scale():
    """A row whose logits would take 100 MB is compared holding only a few chunks (numpy allocations traced; the
    peak, ~7 MB here, grows with the vocabulary like the row, so the vocabulary only sets the test's time)."""
    vocab, length, chunk = 25_000, 1_024, 4
    row_bytes = vocab * length * 4
    rows = [Row(tuple(range(length)), kind="a"), Row(tuple(range(length // 2)), kind="b")]
    ref, cand = FakeSource(vocab, 0), FakeSource(vocab, 0, noise=0.1)
    tracemalloc.start()
    try:
        acc = _compare_one(ref, cand, rows, chunk, False, "t")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ref.max_chunk == cand.max_chunk == chunk
    assert peak < row_bytes / 10, f"peak {peak / 2**20:.0f} MiB for a {row_bytes / 2**20:.0f} MiB row"
    s = acc.summary()
    assert s["n_tokens"] == length + length // 2 and s["n_rows"] == 2
    json.dumps(s)  # plain Python numbers only

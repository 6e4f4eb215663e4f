"""Fidelity metrics of a candidate model against a reference, accumulated over position chunks.

Pure numpy: no model, file or device code lives here. Drivers feed `Accumulator.add()` one chunk of positions of
one eval row at a time (a reference chunk, the candidate's chunk for the same positions, and the next-token
labels); only per-position scalars are kept, so memory grows with the number of tokens, never with the
vocabulary. `Accumulator.summary()` turns them into the figures the EXL3 model cards report:

* KL(ref → cand) mean / median / p95 / p99 / max over positions, and KL(cand → ref) mean;
* top-1 agreement (argmax equal) and top-5 overlap (share of the reference's top 5 also in the candidate's);
* perplexity ratio exp(mean NLL_cand − mean NLL_ref) over positions that have a next token;
* the same per "kind" of row, the row with the highest mean KL, and everything again without that row.

A reference chunk is either dense (full-vocabulary logits) or the top-K form stored by `dump-logits`: the K most
likely tokens' log-probabilities and ids, the log of the probability mass of all other tokens ("rest") and the
log-probability of the next token. Against a top-K reference both distributions are coarsened onto the same
K + 1 outcomes (the K ids, then "everything else"); by the data-processing inequality the coarse KL never
exceeds the full one, and the gap is rest_mass × KL of the two distributions restricted to the rest (see
docs/compare.md).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace

import numpy as np

TOP5 = 5
# Overall figures, in the order reports print them.
FIGURES = ("kl_mean", "kl_median", "kl_p95", "kl_p99", "kl_max", "kl_rev_mean", "top1", "top5_overlap", "ppl_ratio")


@dataclass
class Dense:
    """Full-vocabulary logits of `n` positions: float array [n, vocab]."""

    logits: np.ndarray

    @property
    def n(self) -> int:
        return self.logits.shape[0]


@dataclass
class TopK:
    """Top-K form of `n` positions (ids sorted by decreasing log-probability)."""

    logp: np.ndarray  # [n, K] float, log-probabilities of the K most likely tokens
    ids: np.ndarray  # [n, K] int
    rest: np.ndarray  # [n] float, log of the probability of every other token (-inf when none)
    label_logp: np.ndarray  # [n] float, log-probability of the next token (NaN where there is none)
    # Optional: tokens drawn from the reference restricted to the rest (probability ∝ p), with their
    # log-probabilities. They turn the coarse KL into an unbiased estimate of the full one (see chunk_stats).
    sample_ids: np.ndarray | None = None  # [n, M] int
    sample_logp: np.ndarray | None = None  # [n, M] float

    @property
    def n(self) -> int:
        return self.logp.shape[0]

    def rows(self, a: int, b: int) -> "TopK":
        return replace(self, **{f.name: getattr(self, f.name)[a:b] for f in fields(self)
                                if getattr(self, f.name) is not None})


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64 (the precision the KL sums need)."""
    x = np.asarray(logits, dtype=np.float64)
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    return x - (m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True)))


def _plogp_ratio(lp: np.ndarray, lq: np.ndarray) -> np.ndarray:
    """exp(lp) · (lp − lq) elementwise, 0 where the first distribution has no mass (avoids inf·0)."""
    p = np.exp(lp)
    with np.errstate(invalid="ignore"):
        t = p * (lp - lq)
    return np.where(p > 0, t, 0.0)


def _topn(lp: np.ndarray, n: int) -> np.ndarray:
    """Indices of the n largest entries per row (any order)."""
    n = min(n, lp.shape[1])
    return np.argpartition(-lp, n - 1, axis=1)[:, :n]


def _overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Share of each row of `a` also present in the same row of `b`."""
    return (a[:, :, None] == b[:, None, :]).any(axis=2).sum(axis=1) / a.shape[1]


def _label_logp(lp: np.ndarray, labels: np.ndarray) -> np.ndarray:
    out = np.full(lp.shape[0], np.nan)
    have = labels >= 0
    out[have] = lp[np.nonzero(have)[0], labels[have]]
    return out


def _masked_lse(lp: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """log Σ exp(lp) over each row's entries NOT in `ids` (the log-mass of the rest)."""
    x = lp.copy()
    np.put_along_axis(x, ids, -np.inf, axis=1)
    m = np.max(x, axis=1)
    finite = np.isfinite(m)
    out = np.full(lp.shape[0], -np.inf)
    if finite.any():
        xm = x[finite] - m[finite, None]
        out[finite] = m[finite] + np.log(np.sum(np.exp(xm), axis=1))
    return out


def _sample_rest(lp: np.ndarray, ids: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """`m` token ids per row drawn from the row's distribution restricted to the tokens not in `ids`.

    Systematic sampling (one uniform offset per row, m evenly spaced points on the rest's CDF): unbiased like
    independent draws, with lower variance."""
    n, v = lp.shape
    p = np.exp(lp)
    np.put_along_axis(p, ids, 0.0, axis=1)
    total = p.sum(axis=1, keepdims=True)
    empty = total[:, 0] <= 0
    total[empty] = 1.0
    cdf = np.cumsum(p / total, axis=1)
    cdf[:, -1] = np.inf  # rounding must not leave the last point past the end of a row
    u = (np.arange(m)[None, :] + rng.random((n, 1))) / m
    # one searchsorted over all rows: row r's CDF and targets shifted by 2r keep the flat array sorted
    shift = 2.0 * np.arange(n)[:, None]
    flat = np.where(np.isinf(cdf), 1.5, cdf) + shift
    pos = np.searchsorted(flat.ravel(), (u + shift).ravel(), side="left").reshape(n, m) - (np.arange(n) * v)[:, None]
    pos = np.minimum(pos, v - 1)
    pos[empty] = 0
    return pos


def topk_form(logits: np.ndarray, k: int, labels: np.ndarray, samples: int = 0,
              rng: np.random.Generator | None = None) -> TopK:
    """Reduce dense logits to the top-K form `dump-logits` stores (plus `samples` draws from the rest)."""
    lp = log_softmax(logits)
    k = min(k, lp.shape[1])
    idx = _topn(lp, k)
    vals = np.take_along_axis(lp, idx, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    idx = np.take_along_axis(idx, order, axis=1)
    vals = np.take_along_axis(vals, order, axis=1)
    out = TopK(logp=vals, ids=idx, rest=_masked_lse(lp, idx), label_logp=_label_logp(lp, labels))
    if samples > 0:
        sids = _sample_rest(lp, idx, samples, rng if rng is not None else np.random.default_rng(0))
        out.sample_ids = sids
        out.sample_logp = np.take_along_axis(lp, sids, axis=1)
    return out


def chunk_stats(ref: Dense | TopK, cand: Dense, labels: np.ndarray) -> dict[str, np.ndarray]:
    """Per-position figures of one chunk. `labels[i]` is the next token of position i, or -1 (no next token)."""
    if not isinstance(cand, Dense):
        raise TypeError("the candidate chunk must be dense logits")
    if ref.n != cand.n or labels.shape[0] != cand.n:
        raise ValueError(f"chunk sizes differ: reference {ref.n}, candidate {cand.n}, labels {labels.shape[0]}")
    lq = log_softmax(cand.logits)
    cand_top1 = np.argmax(lq, axis=1)
    cand_top5 = _topn(lq, TOP5)
    nll_cand = -_label_logp(lq, labels)
    if isinstance(ref, Dense):
        if ref.logits.shape[1] != lq.shape[1]:
            raise ValueError(f"vocabulary sizes differ: reference {ref.logits.shape[1]}, candidate {lq.shape[1]}")
        lp = log_softmax(ref.logits)
        kl = _plogp_ratio(lp, lq).sum(axis=1)
        kl_rev = _plogp_ratio(lq, lp).sum(axis=1)
        ref_top1 = np.argmax(lp, axis=1)
        ref_top5 = _topn(lp, TOP5)
        nll_ref = -_label_logp(lp, labels)
        rest = np.zeros(ref.n)
    else:
        if ref.ids.shape[1] < TOP5:
            raise ValueError(f"a top-K reference needs K >= {TOP5}, found {ref.ids.shape[1]}")
        lp_k = ref.logp.astype(np.float64)
        lp_r = ref.rest.astype(np.float64)
        lq_k = np.take_along_axis(lq, ref.ids, axis=1)
        lq_r = _masked_lse(lq, ref.ids)
        kl = _plogp_ratio(lp_k, lq_k).sum(axis=1) + _plogp_ratio(lp_r, lq_r)
        kl_rev = _plogp_ratio(lq_k, lp_k).sum(axis=1) + _plogp_ratio(lq_r, lp_r)
        if ref.sample_ids is not None and ref.sample_ids.shape[1] > 0:
            kl_in, rev_in = _rest_kl_estimates(ref, lq, lp_r, lq_r)
            kl = kl + np.exp(lp_r) * kl_in
            kl_rev = kl_rev + np.exp(lq_r) * rev_in
        ref_top1 = ref.ids[:, 0]
        ref_top5 = ref.ids[:, :TOP5]
        nll_ref = -ref.label_logp.astype(np.float64)
        rest = np.exp(lp_r)
    return {
        # rounding can leave a KL of identical distributions at -1e-17: KL is never negative
        "kl": np.maximum(kl, 0.0),
        "kl_rev": np.maximum(kl_rev, 0.0),
        "top1": (ref_top1 == cand_top1).astype(np.float64),
        "top5": _overlap(ref_top5, cand_top5),
        "nll_ref": nll_ref,
        "nll_cand": nll_cand,
        "ref_rest": rest,
    }


# rows per task of the threaded form: enough that numpy's per-call overhead is small, few enough that the
# threads share a chunk of a few hundred positions evenly
_ROWS_PER_TASK = 16


def chunk_stats_threaded(ref: Dense | TopK, cand: Dense, labels: np.ndarray, pool: ThreadPoolExecutor | None):
    """`chunk_stats` with the positions split over a thread pool: every figure is per position, and numpy
    releases the GIL in the vocabulary-wide work (log-softmax, partitions, sums), so the host keeps up with a
    GPU that returns a chunk's logits in milliseconds. The same numbers as `chunk_stats`, position by position."""
    n = cand.n
    if pool is None or n <= _ROWS_PER_TASK:
        return chunk_stats(ref, cand, labels)
    if ref.n != n or labels.shape[0] != n:
        raise ValueError(f"chunk sizes differ: reference {ref.n}, candidate {n}, labels {labels.shape[0]}")
    cuts = list(range(0, n, _ROWS_PER_TASK)) + [n]

    def part(ab):
        a, b = ab
        r = Dense(ref.logits[a:b]) if isinstance(ref, Dense) else ref.rows(a, b)
        return chunk_stats(r, Dense(cand.logits[a:b]), labels[a:b])

    parts = list(pool.map(part, zip(cuts[:-1], cuts[1:])))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def default_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _rest_kl_estimates(ref: TopK, lq: np.ndarray, lp_r: np.ndarray, lq_r: np.ndarray):
    """Unbiased, non-negative estimates of KL(p̄‖q̄) and KL(q̄‖p̄), p̄ and q̄ being the two distributions
    restricted to the rest, from tokens s drawn from p̄.

    With d = log p̄(s) − log q̄(s) and r = exp(−d) = q̄(s)/p̄(s): E_p̄[r] = 1, so E_p̄[d + r − 1] = KL(p̄‖q̄) and
    E_p̄[r·log r − r + 1] = KL(q̄‖p̄); both summands are ≥ 0 and vanish quadratically as q̄ → p̄, which keeps
    their variance low (Schulman's "k3" estimator and its mirror)."""
    lq_s = np.take_along_axis(lq, ref.sample_ids, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        d = (ref.sample_logp.astype(np.float64) - lp_r[:, None]) - (lq_s - lq_r[:, None])
        r = np.exp(-d)
        fwd = np.mean(d + r - 1.0, axis=1)
        rev = np.mean(-r * d - r + 1.0, axis=1)
    have = np.isfinite(lp_r) & np.isfinite(lq_r)
    return np.where(have, fwd, 0.0), np.where(have, rev, 0.0)


def summarize(stats: dict[str, np.ndarray], n_rows: int) -> dict:
    """The overall figures of a set of positions."""
    kl = stats["kl"]
    if kl.size == 0:
        raise ValueError("no positions to summarise")
    have = ~np.isnan(stats["nll_ref"]) & ~np.isnan(stats["nll_cand"])
    if have.any():
        nll_ref = float(np.mean(stats["nll_ref"][have]))
        nll_cand = float(np.mean(stats["nll_cand"][have]))
        ppl_ratio = float(np.exp(nll_cand - nll_ref))
        ppl_ref, ppl_cand = float(np.exp(nll_ref)), float(np.exp(nll_cand))
    else:
        ppl_ratio = ppl_ref = ppl_cand = None
    p50, p95, p99 = np.percentile(kl, [50, 95, 99])
    return {
        "kl_mean": float(np.mean(kl)),
        "kl_median": float(p50),
        "kl_p95": float(p95),
        "kl_p99": float(p99),
        "kl_max": float(np.max(kl)),
        "kl_rev_mean": float(np.mean(stats["kl_rev"])),
        "top1": float(np.mean(stats["top1"])),
        "top5_overlap": float(np.mean(stats["top5"])),
        "ppl_ratio": ppl_ratio,
        "ppl_ref": ppl_ref,
        "ppl_cand": ppl_cand,
        "ref_rest_mass_mean": float(np.mean(stats["ref_rest"])),
        "n_rows": int(n_rows),
        "n_tokens": int(kl.size),
    }


@dataclass
class Accumulator:
    """Per-position figures of every chunk fed so far, with the row and kind each position belongs to."""

    parts: dict[str, list[np.ndarray]] = field(default_factory=dict)
    row_of: list[np.ndarray] = field(default_factory=list)
    kinds: dict[int, str] = field(default_factory=dict)

    def add(self, row: int, kind: str, ref: Dense | TopK, cand: Dense, labels: np.ndarray,
            pool: ThreadPoolExecutor | None = None) -> None:
        """`pool`: where chunk_stats runs, split by positions (None: this thread)."""
        stats = chunk_stats_threaded(ref, cand, np.asarray(labels), pool)
        for k, v in stats.items():
            self.parts.setdefault(k, []).append(v)
        self.row_of.append(np.full(cand.n, row, dtype=np.int64))
        self.kinds[row] = kind

    def arrays(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        if not self.row_of:
            raise ValueError("nothing was accumulated")
        return {k: np.concatenate(v) for k, v in self.parts.items()}, np.concatenate(self.row_of)

    def summary(self) -> dict:
        """Overall figures plus `per_kind`, `worst_row` and `without_worst` (None when there is one row)."""
        stats, rows = self.arrays()

        def subset(mask):
            return summarize({k: v[mask] for k, v in stats.items()}, len(np.unique(rows[mask])))

        out = summarize(stats, len(self.kinds))
        kind_of_pos = np.array([self.kinds[r] for r in rows]) if rows.size else np.array([])
        out["per_kind"] = {k: subset(kind_of_pos == k) for k in sorted(set(self.kinds.values()))}
        row_ids = np.array(sorted(self.kinds))
        row_kl = np.array([stats["kl"][rows == r].mean() for r in row_ids])
        worst = int(row_ids[int(np.argmax(row_kl))])
        wmask = rows == worst
        out["worst_row"] = {
            "row": worst,
            "kind": self.kinds[worst],
            "kl_mean": float(stats["kl"][wmask].mean()),
            "kl_max": float(stats["kl"][wmask].max()),
            "top1": float(stats["top1"][wmask].mean()),
            "n_tokens": int(wmask.sum()),
        }
        out["without_worst"] = subset(~wmask) if len(row_ids) > 1 else None
        return out

    def kl_by_kind(self) -> dict[str, np.ndarray]:
        """Per-position KL grouped by kind (for plots)."""
        stats, rows = self.arrays()
        out = {}
        for kind in sorted(set(self.kinds.values())):
            members = [r for r, k in self.kinds.items() if k == kind]
            out[kind] = stats["kl"][np.isin(rows, members)]
        return out

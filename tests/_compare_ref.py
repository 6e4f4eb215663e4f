"""Independent numpy reference for compare's figures: probabilities straight from the definitions."""

from __future__ import annotations

import numpy as np


def softmax(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def per_position(ref_logits, cand_logits, ids):
    """KL both ways, top-1, top-5 overlap per position, and the next-token NLLs, of one row."""
    p, q = softmax(ref_logits), softmax(cand_logits)
    kl = np.sum(p * np.log(p / q), axis=1)
    kl_rev = np.sum(q * np.log(q / p), axis=1)
    top1 = (np.argsort(-p, axis=1)[:, 0] == np.argsort(-q, axis=1)[:, 0]).astype(float)
    t5p, t5q = np.argsort(-p, axis=1)[:, :5], np.argsort(-q, axis=1)[:, :5]
    top5 = np.array([len(set(a) & set(b)) / 5 for a, b in zip(t5p, t5q)])
    nxt = np.asarray(ids[1:])
    nll_p = -np.log(p[np.arange(len(nxt)), nxt])
    nll_q = -np.log(q[np.arange(len(nxt)), nxt])
    return {"kl": kl, "kl_rev": kl_rev, "top1": top1, "top5": top5, "nll_p": nll_p, "nll_q": nll_q}


def figures(rows: list[dict]) -> dict:
    """The summary figures of a set of rows given as per_position() outputs."""
    cat = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
    kl = cat["kl"]
    return {
        "kl_mean": kl.mean(),
        "kl_median": np.median(kl),
        "kl_p95": np.percentile(kl, 95),
        "kl_p99": np.percentile(kl, 99),
        "kl_max": kl.max(),
        "kl_rev_mean": cat["kl_rev"].mean(),
        "top1": cat["top1"].mean(),
        "top5_overlap": cat["top5"].mean(),
        "ppl_ratio": np.exp(cat["nll_q"].mean()) / np.exp(cat["nll_p"].mean()),
        "n_rows": len(rows),
        "n_tokens": kl.size,
    }

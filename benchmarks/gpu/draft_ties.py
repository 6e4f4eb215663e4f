"""Full-shape check on the GPU machine (see draft_ties.sh): when drafted greedy output leaves target-only greedy
output, is it a near-tie of the target resolved differently by other kernels (numerics), or a drafting bug?

For each prompt (token ids), with the full-size random target and draft that make_fullsize_gguf.py writes:
  T  target-only greedy, with the target's top-10 log-probabilities at every generated position;
  D  the same request with the DSpark draft (--spec-type draft-dspark);
  C  control without any draft: target-only again from prompt + T[:H], the first H generated tokens now prefilled
     in one batch instead of decoded one by one;
  K  at D's first divergence k: target-only from prompt + T[:k] prefilled, one token, top-10: how far batched
     evaluation moves the target's log-probabilities at exactly that position (the draft's verification is a
     batched evaluation too).
A drafting bug shows up as divergences where the target's choice is clear; numerics as divergences only at
near-ties, by no more than batched evaluation alone moves the log-probabilities there, with the control (no
draft at all) diverging the same way. (stdlib only)

    python3 draft_ties.py LLAMA_BIN_DIR FULLSIZE_DIR
"""
import json
import random
import statistics
import sys

from benchmarks.gpu.draft_equality import OUT, run

N, H = 64, 16  # tokens generated per prompt; generated tokens prefilled by the control


def first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def gap(top):
    """log p(top-1) - log p(top-2) at one position."""
    return top[0][1] - top[1][1]


def deficit(top, token):
    """How much less likely than the target's choice `token` is under the target: log p(top-1) - log p(token);
    None when `token` is not among the listed top tokens (or the server listed nothing there)."""
    lp = dict(top or ()).get(token)
    return None if lp is None else top[0][1] - lp


def main():
    bin_dir, fs = sys.argv[1], sys.argv[2]
    target, draft = f"{fs}/target.gguf", f"{fs}/draft.gguf"
    rng = random.Random(0)
    # plain-vocabulary ids (specials sit at the end of the 248,144 rows)
    prompts = [[rng.randrange(1000, 150000) for _ in range(n)] for n in (8, 16, 32, 64, 128, 256, 512, 1000)]
    common = dict(n=N, bin_dir=bin_dir, ctx=2048)
    plain = run(target, None, prompts, "plain", n_probs=10, **common)
    spec = run(target, draft, prompts, "spec", **common)
    control = run(target, None, [p + t["tokens"][:H] for p, t in zip(prompts, plain)], "control",
                  **{**common, "n": N - H})
    for name, res in (("plain", plain), ("spec", spec), ("control", control)):
        if isinstance(res, dict):
            sys.exit(f"{name}: llama-server {res['error']} (see {OUT}/server-{name}.log)")
    ks = [first_diff(t["tokens"], d["tokens"]) for t, d in zip(plain, spec)]
    at_k = []
    if any(k is not None for k in ks):
        at_k = run(target, None, [p + t["tokens"][:k] for p, t, k in zip(prompts, plain, ks) if k is not None],
                   "at-k", n_probs=10, **{**common, "n": 1})
        if isinstance(at_k, dict):
            sys.exit(f"at-k: llama-server {at_k['error']} (see {OUT}/server-at-k.log)")
    all_gaps = [gap(top) for t in plain for top in t["top"] if top]
    rows, at_k = [], iter(at_k)
    for p, t, d, c, k in zip(prompts, plain, spec, control, ks):
        kc = first_diff(t["tokens"][H:], c["tokens"])
        row = {"prompt_tokens": len(p), "drafted_first_diff": k, "drafts": d["draft_n"], "accepted": d["accepted"],
               "control_first_diff": None if kc is None else H + kc}
        if k is not None:
            row["drafted_deficit"] = deficit(t["top"][k], d["tokens"][k])
            batched = next(at_k)["top"][0]
            seq = dict(t["top"][k] or ())
            # largest change of a log-probability listed by both, batched prefill against one-by-one decode
            row["batched_shift"] = max((abs(lp - seq[i]) for i, lp in batched if i in seq), default=None)
            row["batched_took"] = ("target-only" if batched[0][0] == t["tokens"][k]
                                   else "drafted" if batched[0][0] == d["tokens"][k] else "other")
        if kc is not None:
            row["control_deficit"] = deficit(t["top"][H + kc], c["tokens"][kc])
        rows.append(row)
        print(json.dumps(row), flush=True)
    deficits = {w: [r[f"{w}_deficit"] for r in rows if r[f"{w}_first_diff"] is not None]
                for w in ("drafted", "control")}
    known = [x for xs in deficits.values() for x in xs if x is not None]
    summary = {
        "positions": len(all_gaps),
        "gap_median": statistics.median(all_gaps),
        "gap_p10": sorted(all_gaps)[len(all_gaps) // 10],
        "gap_min": min(all_gaps),
        "divergences_drafted": sum(r["drafted_first_diff"] is not None for r in rows),
        "divergences_control": sum(r["control_first_diff"] is not None for r in rows),
        "deficit_max_drafted": max((x for x in deficits["drafted"] if x is not None), default=None),
        "deficit_max_control": max((x for x in deficits["control"] if x is not None), default=None),
        "batched_shift_max": max((r["batched_shift"] for r in rows if r.get("batched_shift") is not None),
                                 default=None),
        "divergent_token_outside_top10": sum(x is None for xs in deficits.values() for x in xs),
        # share of all generated positions whose top-2 gap is at most the largest deficit seen at a divergence
        "share_of_positions_as_close": (sum(g <= max(known) for g in all_gaps) / len(all_gaps)) if known else None,
    }
    print(json.dumps(summary), flush=True)
    json.dump({"n": N, "h": H, "rows": rows, "summary": summary, "plain": plain, "spec": spec, "control": control},
              open(f"{OUT}/draft-ties.json", "w"))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        sys.exit("usage: python -m benchmarks.gpu.draft_ties BIN_DIR FULLSIZE_DIR (target.gguf + draft.gguf)")
    main()

#!/usr/bin/env python3
"""Flash-attention decode at depth with quantized K/V (issue 24): two llama.cpp builds side by side.

* `exact`: the same greedy request (a prompt of DEPTH tokens, 64 generated, top-20 log-probs per step) against
  each run (a build and environment variables): identical tokens, and the KL divergence between a run's
  next-token distributions and the first run's (restricted to the union of both top-20 lists, renormalised) at
  every step;
* `drafted`: decode speed with the DSpark draft at growing depth on the oracle pair of make_fullsize_gguf.py
  --oracle: filler tokens up to the depth, then the first 8 tokens of the cycle on which the draft is never wrong,
  so every round accepts n_max tokens (accepted per round read from the server's /metrics).

Target-only rows at depth are recipe_bench.py measure with a recipe file from `recipe` (a KV type over h200).

    python3 -m benchmarks.gpu.fattn_bench recipe DIR --kv q8_0 [--draft-n-max 4]      (prints the recipe path)
    python3 -m benchmarks.gpu.fattn_bench exact MODEL --bins B0,B0,B1 [--envs "K=V,K=V,"] --kv q8_0 --depth 32k --json F
    python3 -m benchmarks.gpu.fattn_bench drafted ORACLE --bin B --kv q8_0 --lengths 1k,32k --tag T --json F
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import urllib.request
from pathlib import Path

from benchmarks.gpu import recipe_bench as rb
from ggufbridge.runtime import benchmark as bn
from ggufbridge.runtime import server as sv
from ggufbridge.runtime.session import prepare


def recipe_file(dest: Path, kv: str, ctx: int, draft_n_max: int = 0) -> str:
    """h200 with the target's K/V cache type set (every other flag as the h200 recipe: all on the GPU)."""
    over = f'name = "h200-kv-{kv}"\n[server]\nctx = {ctx}\ncache_type_k = "{kv}"\ncache_type_v = "{kv}"\n'
    if draft_n_max:
        over += f'[draft]\nn_max = {draft_n_max}\nctx_cap = {ctx}\n'
    dest.mkdir(parents=True, exist_ok=True)
    return rb.user_recipe("h200", over, dest)


def complete_probs(url: str, ids: list[int], n: int, n_probs: int) -> list[dict]:
    """One greedy non-streamed completion: per generated token its id and {id: logprob} of the top n_probs."""
    body = {"prompt": ids, "n_predict": n, "temperature": 0.0, "top_k": 1, "cache_prompt": False,
            "ignore_eos": True, "n_probs": n_probs, "seed": 0}
    req = urllib.request.Request(url + "/completion", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=3600) as r:
        out = json.loads(r.read())
    steps = []
    for p in out["completion_probabilities"]:
        top = p.get("top_logprobs") or p.get("probs") or []
        lp = {int(t["id"]): float(t["logprob"]) if "logprob" in t else math.log(max(float(t["prob"]), 1e-30))
              for t in top}
        steps.append({"id": int(p["id"]), "top": lp})
    return steps


def kl_topk(a: dict[int, float], b: dict[int, float]) -> float:
    """KL(a || b) over the union of two top-k lists, each renormalised there (a token missing from one list gets
    that list's smallest log-prob, an upper bound on its true value)."""
    keys = set(a) | set(b)
    fa, fb = min(a.values()), min(b.values())
    pa = {k: math.exp(a.get(k, fa)) for k in keys}
    pb = {k: math.exp(b.get(k, fb)) for k in keys}
    za, zb = sum(pa.values()), sum(pb.values())
    return sum(pa[k] / za * math.log((pa[k] / za) / (pb[k] / zb)) for k in keys if pa[k] > 0)


def cmd_exact(a) -> None:
    """The same greedy request against each run (a bin folder and environment variables); every run after the first
    is compared with the first: with the first two runs the same build, their difference is the noise floor."""
    tmp = Path(tempfile.mkdtemp(prefix="fattn-exact-"))
    depth = bn.parse_lengths(a.depth)[0]
    ctx = max(8192, depth + a.n_predict + 256)
    bins = a.bins.split(",")
    env_specs = a.envs.split(",") if a.envs else [""] * len(bins)
    envs = [dict(kv.split("=", 1) for kv in e.split(";") if kv) for e in env_specs]
    if len(envs) != len(bins):
        sys.exit("--envs: one entry per --bins entry")
    runs = []
    for i, (b, env) in enumerate(zip(bins, envs)):
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            s = prepare(a.model, recipe_file(tmp, a.kv, ctx), ctx=ctx, llama_bin=b)
            if s.problems:
                sys.exit(" | ".join(s.problems))
            srv, argv = rb.start(s, log=a.logdir / f"server-exact-{a.kv}-{i}.log")
            try:
                srv.start()
                srv.wait_ready(a.timeout)
                ids = bn.prompt_ids(srv.url, depth)
                runs.append({"bin": b, "env": env, "command": sv.printable(argv),
                             "steps": complete_probs(srv.url, ids, a.n_predict, 20)})
            finally:
                srv.stop(30)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    first = runs[0]
    t0 = [s["id"] for s in first["steps"]]
    comparisons = []
    for i, r in enumerate(runs[1:], 1):
        t1 = [s["id"] for s in r["steps"]]
        kls = [kl_topk(x["top"], y["top"]) for x, y in zip(first["steps"], r["steps"])]
        first_diff = next((j for j, (x, y) in enumerate(zip(t0, t1)) if x != y), None)
        comparisons.append({"run": i, "against": 0, "identical": t0 == t1, "first_difference": first_diff,
                            "kl_max": max(kls), "kl_mean": sum(kls) / len(kls)})
        print(f"[exact {a.kv} {depth}] run {i} ({r['env']}) against run 0 ({first['env']}): identical={t0 == t1} "
              f"first_diff={first_diff} KL max {max(kls):.3g} mean {sum(kls) / len(kls):.3g}", flush=True)
    rec = {"kv": a.kv, "depth": depth, "n_predict": a.n_predict,
           "runs": [{k: r[k] for k in ("bin", "env", "command")} | {"tokens": [s["id"] for s in r["steps"]]}
                    for r in runs],
           "comparisons": comparisons}
    rb.append(a.json, rec)


def cmd_drafted(a) -> None:
    man = json.loads((Path(a.model) / "manifest.json").read_text())
    o = man["synthetic"]["oracle"]
    if not o:
        sys.exit(f"{a.model}: not an oracle pair (make_fullsize_gguf.py --oracle)")
    c = list(o["periods"]).index(0)  # the cycle where the draft is never wrong
    cycle = list(range(o["first"] + c * o["length"], o["first"] + (c + 1) * o["length"]))
    tmp = Path(tempfile.mkdtemp(prefix="fattn-drafted-"))
    s = prepare(a.model, recipe_file(tmp, a.kv, a.ctx, a.n_max), draft=bool(a.n_max), ctx=a.ctx,
                llama_bin=a.bin)
    if s.problems:
        sys.exit(" | ".join(s.problems))
    srv, argv = rb.start(s, draft=bool(a.n_max), log=a.logdir / f"server-{a.tag}.log")
    rec = {"tag": a.tag, "kv": a.kv, "n_max": a.n_max, "bin": a.bin, "ctx": a.ctx, "command": sv.printable(argv),
           "env": {k: v for k, v in os.environ.items() if k.startswith("GGML_")}, "rows": []}
    print(f"[{a.tag}] {rec['command']}", flush=True)
    try:
        srv.start()
        srv.wait_ready(a.timeout)
        sv.complete_stream(srv.url, cycle[:8], 8)  # warm-up
        for n in bn.parse_lengths(a.lengths):
            n = min(n, a.ctx - a.n_predict - 8)
            ids = (bn.prompt_ids(srv.url, n - 8) if n > 8 else []) + cycle[:8]
            before = sv.metrics(srv.url)
            ttft, _, t = sv.complete_stream(srv.url, ids, a.n_predict)
            after = sv.metrics(srv.url)
            row = {"prompt_tokens": len(ids), "prefill_tok_s": t["prompt_per_second"],
                   "decode_tok_s": t["predicted_per_second"], "ttft_s": ttft, "predicted": t["predicted_n"],
                   **rb.draft_stats(before, after, t)}
            rec["rows"].append(row)
            print(f"[{a.tag}] {json.dumps(row)}", flush=True)
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        print(f"[{a.tag}] error: {rec['error']}", flush=True)
    finally:
        srv.stop(30)
    rb.append(a.json, rec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("recipe")
    p.add_argument("dir", type=Path)
    p.add_argument("--kv", required=True)
    p.add_argument("--ctx", type=int, default=262144)
    p.add_argument("--draft-n-max", type=int, default=0)
    for name in ("exact", "drafted"):
        p = sub.add_parser(name)
        p.add_argument("model")
        p.add_argument("--kv", default="q8_0")
        p.add_argument("--json", type=Path, required=True)
        p.add_argument("--logdir", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
        p.add_argument("--timeout", type=float, default=600.0)
        p.add_argument("-n", "--n-predict", type=int, default=64)
        if name == "exact":
            p.add_argument("--bins", required=True, help="llama.cpp bin folders, comma-separated: one run each")
            p.add_argument("--envs", default="", help="per run, comma-separated: KEY=VAL;KEY=VAL set for that run")
            p.add_argument("--depth", default="32k")
        else:
            p.add_argument("--bin", required=True)
            p.add_argument("--tag", required=True)
            p.add_argument("--lengths", default="1k")
            p.add_argument("--ctx", type=int, default=262144)
            p.add_argument("--n-max", type=int, default=4)
    a = ap.parse_args(argv)
    if a.cmd == "recipe":
        print(recipe_file(a.dir, a.kv, a.ctx, a.draft_n_max))
        return 0
    a.logdir.mkdir(parents=True, exist_ok=True)
    {"exact": cmd_exact, "drafted": cmd_drafted}[a.cmd](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())

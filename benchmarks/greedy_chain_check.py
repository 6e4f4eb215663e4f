"""Series patch 0023 (`llama-sampler-common-greedy-chain`) checked: greedy requests served with the sampler chain in the
graph (--backend-sampling) give the same text with the shortened chain as with the full one, and the server's chain
is the short one.

`ggufbridge bench --concurrency` runs twice on one converted model, with LLAMA_SAMPLER_GREEDY_CHAIN=0 (the full
chain: top-k, top-p, min-p, temperature, dist) and without it (the patch's: temperature, greedy), both with
`--draft` so that drafted streams are compared too; every stream's text must be equal between the two runs, and
the server logs (at trace verbosity) must show each chain. The decode rates are printed beside each other (on a CPU
they say little: the chain is a few small ops per sequence there).

    [LLAMA_CPP_BIN=BIN_DIR] .venv/bin/python benchmarks/greedy_chain_check.py MODEL_DIR [--levels 1,4] [-n 64] \
        [--base h200]

BIN_DIR: a runtime of the series (scripts/build_runtime.sh's, found without it); exit 1 if a text differs or a
chain is not the expected one, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bench(model: Path, out: Path, recipe: Path, levels: str, n: int, env: dict) -> dict:
    cmd = [sys.executable, "-m", "ggufbridge", "bench", str(model), "--recipe", str(recipe), "--concurrency", levels,
           "--draft", "--prompt-lengths", "48", "-n", str(n), "-o", str(out)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if res.returncode != 0:
        raise SystemExit(f"bench failed ({res.returncode}): {res.stderr.strip().splitlines()[-1:]}")
    return json.loads((out / "concurrency.json").read_text())


def chains(out: Path) -> set[str]:
    """The sampler chains the servers printed (llama-server's `sampler chain: ...` trace line)."""
    found = set()
    for log in out.glob("llama-server-*.log"):
        found |= set(re.findall(r"sampler chain: (.*)", log.read_text(errors="replace")))
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path, help="a converted model folder (target and draft)")
    ap.add_argument("--levels", default="1,4")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--base", default="cpu", help="the hardware recipe to start from (h200 on the device)")
    a = ap.parse_args()
    if not a.model.is_dir():
        print(f"greedy_chain_check: {a.model} is not a folder", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        recipe = Path(tmp) / "backend-sampling.toml"
        # the recipe with the chain in the graph, as the GPU recipes serve it; trace verbosity prints the chain
        recipe.write_text(f'base = "{a.base}"\nname = "{a.base}-backend-sampling"\n[server]\nbackend_sampling = true\n'
                          'extra_args = ["-lv", "4"]\n')
        runs = {}
        for name, extra in (("full chain", {"LLAMA_SAMPLER_GREEDY_CHAIN": "0"}), ("greedy chain", {})):
            env = {k: v for k, v in os.environ.items() if k != "LLAMA_SAMPLER_GREEDY_CHAIN"} | extra
            out = Path(tmp) / name.replace(" ", "-")
            runs[name] = (bench(a.model, out, recipe, a.levels, a.n, env), chains(out))
    bad = 0
    texts = {name: {(s["mode"], s["level"], s["run"], s["index"]): s["text"] for s in r["streams"]}
             for name, (r, _) in runs.items()}
    full, short = texts["full chain"], texts["greedy chain"]
    same = [k for k in full if full[k] == short.get(k)]
    print(f"streams with equal text: {len(same)} of {len(full)}")
    bad += len(same) != len(full) or set(full) != set(short)
    for name, (r, ch) in runs.items():
        print(f"{name}: chains {sorted(ch)}")
        for row in r["rows"]:
            rate = row["aggregate_decode_tok_s"]
            print(f"  {row['mode']:<6} {row['streams']} streams: aggregate decode {rate:.1f} tok/s")
    full_ch, short_ch = runs["full chain"][1], runs["greedy chain"][1]
    ok_full = bool(full_ch) and all("dist" in c for c in full_ch)
    ok_short = bool(short_ch) and all("greedy" in c and "top-k" not in c and "dist" not in c for c in short_ch)
    print(f"full chain has dist: {'yes' if ok_full else 'NO'}; greedy chain is temperature + greedy: "
          f"{'yes' if ok_short else 'NO'}")
    bad += not (ok_full and ok_short)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

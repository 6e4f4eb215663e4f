#!/usr/bin/env python3
"""Image prefill: the patched llama-server against the old `run --image` path, in one run (issue 13).

    python -m benchmarks.bench_image_prefill OUT_DIR [--size 230x170] [--baseline-rev 0196e24] [--stock-bin DIR]
                                                  [--json benchmarks/results/image-prefill/DEVICE.json]

OUT_DIR is a `ggufbridge convert` folder (target + mmproj; a 4x mmproj for the issue's 2×2 4x case).

* patched: llama-server started as `ggufbridge serve OUT_DIR --recipe R` starts it (this checkout's runtime), one
  streamed chat with the image as a data URL: time to first token measured by the client, the server's own prompt
  time, its peak RSS, and the decode calls (the image chunk and the text around it, split into -ub ubatches).
* token_by_token: the same server with -ub 1, every prompt token decoded alone: what the old path cost where it
  had to decode slice tokens one by one (available on any machine, the GPU included).
* baseline: the `run --image` path as it was before the patch series (ggufbridge at --baseline-rev, checked out
  into a temporary git worktree, on the stock runtime --stock-bin): its bindings decoded the frame token by token
  wherever canvas positions broke raster order. Its decode calls are counted by wrapping its decode function, its
  time to first token is prompt layout + encoding + prefill + the first sampled token.

Both run the same chat (the image, then "What is in the picture?"), greedy, after one unmeasured warm-up request
(the server's prompt cache is off for the measured one). Ratios are token_by_token or baseline / patched.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What is in the picture?"

BASELINE = r'''
import json, sys, time
# the worktree's ggufbridge, not this environment's editable install (whose finder would win over PYTHONPATH)
sys.meta_path = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
import numpy as np
from PIL import Image
from ggufbridge.testkit import bindings as B
img = Image.open(sys.argv[3]).convert("RGB")
calls = {"n": 0}
orig = B.VisionSession._decode
def counted(self, *a, **k):
    calls["n"] += 1
    return orig(self, *a, **k)
B.VisionSession._decode = counted
t0 = time.perf_counter()
with B.VisionSession(sys.argv[1], sys.argv[2], n_ctx=8192) as s:
    crops, _ = s.prepare_image(img)  # warm-up, unmeasured (as for the server)
    s.generate(s.build_prompt(B.chat_parts([crops], sys.argv[4])), n_predict=1)
    calls["n"] = 0
    t_load = time.perf_counter()
    crops, notes = s.prepare_image(img)
    pr = s.build_prompt(B.chat_parts([crops], sys.argv[4]))
    t_prompt = time.perf_counter()
    first = s.generate(pr, n_predict=1)
    t_first = time.perf_counter()
print(json.dumps({"load_s": t_load - t0, "ttft_s": t_first - t_load, "prefill_s": t_first - t_prompt,
                  "decode_calls": calls["n"] - 1, "prompt_tokens": len(pr.ids), "notes": notes}))
'''


def data_url(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def peak_rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def patched(out_dir: Path, image: Path, recipe: str, log: Path, ubatch: int | None = None) -> dict:
    """One streamed image chat against llama-server started exactly as `ggufbridge serve` starts it (the recipe's
    argv), optionally with another -ub (ubatch 1 = every prompt token decoded alone: the old path's cost)."""
    import dataclasses

    from ggufbridge.runtime import server as sv
    from ggufbridge.runtime.session import prepare

    s = prepare(out_dir, recipe)
    if s.problems:
        raise SystemExit(" | ".join(s.problems))
    if ubatch:
        s.recipe = dataclasses.replace(s.recipe, server={**s.recipe.server, "ubatch": ubatch})
    port = sv.free_port()
    argv = sv.server_argv(s.rt.bin_dir / "llama-server", s.recipe, s.plan, s.art, sv.ServeOptions(port=port))
    url = f"http://127.0.0.1:{port}"
    with sv.Server(argv, "127.0.0.1", port, log, env=s.rt.env()) as srv:
        t0 = time.perf_counter()
        srv.wait_ready(900)
        t_load = time.perf_counter() - t0
        body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(image)}},
                                                          {"type": "text", "text": QUESTION}]}],
                "max_tokens": 1, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
                "cache_prompt": False}
        # one unmeasured request first: the first image also pays one-time set-up (vision graph, kernels, buffers)
        warm = json.loads(json.dumps(body))
        warm["stream"] = False
        warm.pop("stream_options")
        sv.http_json(url + "/v1/chat/completions", warm, timeout=1800)
        req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        ttft, timings, usage = None, {}, {}
        with urllib.request.urlopen(req, timeout=1800) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                if ttft is None and ev.get("choices") and any(
                        (c.get("delta") or {}).get("content") for c in ev["choices"]):
                    ttft = time.perf_counter() - t0
                timings = ev.get("timings") or timings
                usage = ev.get("usage") or usage
        ttft = ttft if ttft is not None else time.perf_counter() - t0
        rss = peak_rss_kib(srv.proc.pid)
    n_prompt = usage.get("prompt_tokens") or 0
    ub = s.recipe.server["ubatch"]
    # llama_decode calls: the prompt is three chunks (text, the image frame, text), each split into -ub ubatches,
    # and the server decodes the prompt's last tokens apart (for its context checkpoint): at most this many
    calls = n_prompt if ub == 1 else -(-n_prompt // ub) + 3
    return {"ubatch": ub, "load_s": t_load, "ttft_s": ttft, "prefill_s": timings.get("prompt_ms", 0) / 1000,
            "prompt_tokens": n_prompt, "decode_calls": calls, "peak_rss_mib": rss / 1024}


def baseline(out_dir: Path, image: Path, rev: str, stock_bin: Path) -> dict:
    from ggufbridge.ggufio.manifest import read_manifest

    files = read_manifest(out_dir).files
    with tempfile.TemporaryDirectory(prefix="ggufbridge-baseline-") as tmp:
        wt = Path(tmp) / "wt"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(wt), rev], check=True,
                       capture_output=True)
        try:
            env = dict(os.environ, PYTHONPATH=str(wt), LLAMA_CPP_LIB_PATH=str(stock_bin), MTMD_CPP_LIB=str(stock_bin))
            p = subprocess.run([sys.executable, "-c", BASELINE, str(files["target"].path), str(files["mmproj"].path),
                                str(image), QUESTION], capture_output=True, text=True, env=env, timeout=3600, cwd=wt)
            if p.returncode != 0:
                raise SystemExit(f"baseline failed:\n{p.stderr[-2000:]}")
            return json.loads(p.stdout.strip().splitlines()[-1])
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(wt)], capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--size", default="230x170", help="image WxH (default: a 2×2 grid at slice size 112)")
    ap.add_argument("--recipe", default="cpu")
    ap.add_argument("--baseline-rev", default="0196e24", help="ggufbridge before the patch series")
    ap.add_argument("--stock-bin", type=Path, default=None, help="stock (unpatched) runtime bin dir for the baseline")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    import numpy as np
    from PIL import Image

    w, h = (int(x) for x in a.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        image = Path(tmp) / "img.png"
        Image.fromarray(np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(image)
        res = {"size": a.size, "out_dir": str(a.out_dir), "recipe": a.recipe}
        res["patched"] = patched(a.out_dir, image, a.recipe, Path(tmp) / "server.log")
        res["token_by_token"] = patched(a.out_dir, image, a.recipe, Path(tmp) / "server1.log", ubatch=1)
        p = res["patched"]
        res["ratios"] = {}
        for key in ("token_by_token", "baseline"):
            if key == "baseline":
                if not a.stock_bin:
                    continue
                res["baseline"] = baseline(a.out_dir, image, a.baseline_rev, a.stock_bin)
            b = res[key]
            res["ratios"][key] = {"decode_calls": b["decode_calls"] / p["decode_calls"],
                                  "ttft": b["ttft_s"] / p["ttft_s"],
                                  "prefill": b["prefill_s"] / max(p["prefill_s"], 1e-9)}
    print(json.dumps(res, indent=2))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""On the GPU (benchmarks/device.sh draft-equality): does llama-server with a DSpark draft give the same greedy
tokens as without? The pairs come from draft_equality_prep.py. (stdlib only)

    python3 draft_equality.py LLAMA_BIN_DIR PAIRS_DIR
"""
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

OUT = os.environ.get("OUT", "/tmp")


def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(model, draft, prompts, tag, n=32, extra=(), bin_dir=None, ctx=1024, n_probs=0):
    """Greedy completions of each prompt (text or token ids) through a fresh llama-server; n_probs > 0 adds the
    target's top-n log-probabilities at every generated position."""
    p = port()
    argv = [f"{bin_dir or sys.argv[1]}/llama-server", "-m", model, "--host", "127.0.0.1", "--port", str(p),
            "-c", str(ctx), "-np", "1", "-ngl", "99", "--no-warmup", "--no-webui", *extra]
    if draft:
        argv += ["-md", draft, "--spec-type", "draft-dspark", "--spec-draft-n-max", "4", "-ngld", "99"]
    log = open(f"{OUT}/server-{tag}.log", "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{p}"
    try:
        for _ in range(600):
            if proc.poll() is not None:
                return {"error": f"exited {proc.returncode}"}
            try:
                if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                    break
            except Exception:
                time.sleep(0.2)
        res = []
        for pr in prompts:
            body = json.dumps({"prompt": pr, "n_predict": n, "temperature": 0.0, "top_k": 1, "seed": 0,
                               "cache_prompt": False, "return_tokens": True, "ignore_eos": True,
                               "n_probs": n_probs}).encode()
            req = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
            r = json.loads(urllib.request.urlopen(req, timeout=120).read())
            t = r.get("timings", {})
            out = {"tokens": r["tokens"], "draft_n": t.get("draft_n"), "accepted": t.get("draft_n_accepted")}
            if n_probs:
                # the server can leave out the entry of a token that ends inside a UTF-8 sequence: align by id
                entries, out["top"] = iter(r["completion_probabilities"]), []
                entry = next(entries, None)
                for tok in r["tokens"]:
                    if entry is not None and entry["id"] == tok:
                        out["top"].append([(c["id"], c["logprob"]) for c in entry["top_logprobs"]])
                        entry = next(entries, None)
                    else:
                        out["top"].append(None)
            res.append(out)
        return res
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)


def main():
    prompts = ["Hello world", [1, 2, 3, 4, 5], [150], [163], "abc def"]
    report = {}
    for name in ("oracle", "random"):
        d = f"{sys.argv[2]}/{name}"
        target = [f for f in glob.glob(f"{d}/*.gguf") if "dspark" not in f][0]
        draft = glob.glob(f"{d}/dspark-*.gguf")[0]
        plain = run(target, None, prompts, f"{name}-plain")
        spec = run(target, draft, prompts, f"{name}-spec")
        ok = isinstance(plain, list) and isinstance(spec, list)
        report[name] = {"plain": plain, "spec": spec,
                        "identical": [a["tokens"] == b["tokens"] for a, b in zip(plain, spec)] if ok else None}
        counts = [(s.get("draft_n"), s.get("accepted")) for s in spec] if isinstance(spec, list) else spec
        print(name, report[name]["identical"], counts, flush=True)
    json.dump(report, open(f"{OUT}/draft-equality.json", "w"), indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        sys.exit("usage: python -m benchmarks.gpu.draft_equality BIN_DIR PAIRS_DIR (draft_equality_prep's folder)")
    main()

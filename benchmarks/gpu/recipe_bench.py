#!/usr/bin/env python3
"""Hardware recipes measured as their users run them (issue 16): one llama-server per configuration, started
with exactly the argv `ggufbridge serve --recipe R` builds from its memory plan, then

* `measure`: prompts of each length (greedy, EOS ignored, no prompt cache), the server's own prefill/decode
  timings, peak GPU memory sampled by nvidia-smi every 100 ms (minus the idle baseline) and the server's own
  accounting (the buffer lines at load and the memory breakdown it prints when stopped), beside the plan;
* `draft`: the oracle pair of make_fullsize_gguf.py --oracle, one server per draft n_max and one target-only,
  each cycle of the oracle (a draft error period) one request: decode tok/s against accepted tokens per round;
* `compute`: start-up only, for each -ub / -c / KV type: the compute buffers the runtime reserves.

Every result is appended to the JSON file as soon as it exists, so a run cut short keeps what it measured.

    python3 -m benchmarks.gpu.recipe_bench measure DIR --recipe rtx4090 --ctx 262144 --lengths 1k,32k --json F
    python3 -m benchmarks.gpu.recipe_bench draft DIR --n-max 2,4,8,15 --json F
    python3 -m benchmarks.gpu.recipe_bench compute DIR --recipe h200 --ub 512,2048 --ctx 8192,262144 --json F
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


from ggufbridge.runtime import benchmark as bn
from ggufbridge.runtime import rpc as rpcw
from ggufbridge.runtime import server as sv
from ggufbridge.runtime.session import prepare

MIB = 1024**2
BUF_RE = re.compile(r"(\w+):\s+(\S+)\s+(model|KV|RS|compute|output) buffer size =\s*([\d.]+) MiB")
BREAKDOWN_RE = re.compile(r"memory_breakdown_print: \|\s+- (\S+)[^|]*\|\s*(\d+) = (\d+) \+ \(\s*(\d+) =\s*(\d+) \+"
                          r"\s*(\d+) \+\s*(\d+)\) \+\s*(-?\d+)")
HOST_BREAKDOWN_RE = re.compile(r"memory_breakdown_print: \|\s+- (Host|CPU)\s*\|\s*(\d+) =\s*(\d+) \+\s*(\d+) \+"
                               r"\s*(\d+)")


class GpuSampler:
    """Peak of nvidia-smi's memory.used (MiB) per GPU, every 100 ms, in a background thread; absent GPUs: None."""

    def __init__(self):
        self.proc = None
        self.n = len(gpu_used_now() or [])
        if not self.n:
            return
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                          "-lms", "100"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            return
        self.lock = threading.Lock()
        self._peaks = [0] * self.n
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        i = 0  # nvidia-smi prints one line per GPU per sample, in index order
        for line in self.proc.stdout:
            try:
                v = int(line.strip())
            except ValueError:
                continue
            with self.lock:
                self._peaks[i % self.n] = max(self._peaks[i % self.n], v)
            i += 1

    def per_gpu(self) -> list[int] | None:
        """The highest reading of each GPU since the last reset."""
        if not self.proc:
            return None
        time.sleep(0.3)
        with self.lock:
            return list(self._peaks)

    def peaks(self) -> dict:
        """{"gpu_peak_mib": the sum of the GPUs' peaks (one GPU: its peak), "gpu_peak_mib_per_gpu": each one}."""
        p = self.per_gpu()
        return {"gpu_peak_mib": sum(p) if p else None, "gpu_peak_mib_per_gpu": p}

    def close(self):
        if self.proc:
            self.proc.terminate()


def gpu_used_now() -> list[int] | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
        return [int(x) for x in out.split()]
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def parse_log(text: str) -> dict:
    """The runtime's own accounting: buffer sizes at load and the memory breakdown printed at exit (MiB)."""
    bufs: dict[str, dict[str, float]] = {}
    for _fn, dev, kind, mib in BUF_RE.findall(text):
        bufs.setdefault(kind, {})
        bufs[kind][dev] = bufs[kind].get(dev, 0.0) + float(mib)
    brk = {}
    for name, total, free, self_, model, ctx, comp, unacc in BREAKDOWN_RE.findall(text):
        brk[name] = {"total": int(total), "free": int(free), "self": int(self_), "model": int(model),
                     "context": int(ctx), "compute": int(comp), "unaccounted": int(unacc)}
    for name, self_, model, ctx, comp in HOST_BREAKDOWN_RE.findall(text):
        brk[name] = {"self": int(self_), "model": int(model), "context": int(ctx), "compute": int(comp)}
    return {"buffers_mib": bufs, "breakdown_mib": brk}


def append(path: Path, rec: dict) -> None:
    data = json.loads(path.read_text()) if path.exists() else []
    data.append(rec)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def draft_stats(before: dict, after: dict, t: dict) -> dict:
    """What a drafted request's timings and the server's /metrics before and after it say of drafting: drafted and
    accepted tokens, draft rounds, accepted per round."""
    rounds = after.get("spec_decode_num_drafts_total", 0) - before.get("spec_decode_num_drafts_total", 0)
    return {"draft_n": t.get("draft_n"), "draft_accepted": t.get("draft_n_accepted"), "rounds": rounds,
            "accepted_per_round": (t.get("draft_n_accepted") or 0) / rounds if rounds else None}


def user_recipe(base: str, overrides: str, dest: Path) -> str:
    """A recipe file `base = BASE` plus TOML overrides (the users' way to change a packaged recipe)."""
    f = dest / f"{base}-{abs(hash(overrides)) % 10**8}.toml"
    f.write_text(f'base = "{base}"\n{overrides}\n')
    return str(f)


def start(s, *, draft=False, log: Path, extra=(), rpc=()):
    host, port = "127.0.0.1", sv.free_port()
    # -lv 4: libllama's buffer lines and the exit memory breakdown are logged at that verbosity
    opts = sv.ServeOptions(host=host, port=port, draft=draft, rpc=list(rpc), extra=["-lv", "4", *extra])
    argv = sv.server_argv(s.rt.bin_dir / "llama-server", s.recipe, s.plan, s.art, opts)
    return sv.Server(argv, host, port, log, env=s.rt.env()), argv


def cmd_measure(a) -> None:
    base = gpu_used_now()
    s = prepare(a.model, a.recipe, ctx=a.ctx, llama_bin=a.llama_bin, parallel=1)  # one request at a time
    if s.problems:
        sys.exit(" | ".join(s.problems))
    log = a.logdir / f"server-{a.tag}.log"
    workers = []
    if s.recipe.rpc["workers"]:  # as `serve --rpc local`: loopback workers placed beside the server's own GPUs
        (a.logdir / a.tag).mkdir(exist_ok=True)
        workers = rpcw.start_local(s, a.logdir / a.tag)
    srv, argv = start(s, log=log, rpc=[w.endpoint for w in workers])
    rec = {"tag": a.tag, "recipe": s.recipe.name, "model": str(s.art.target.path), "file_bytes":
           s.art.target.path.stat().st_size, "ctx": s.plan.ctx, "plan": s.plan.to_dict(), "command":
           sv.printable(argv), "workers": [sv.printable(w.proc.args) for w in workers], "gpu_baseline_mib": base,
           "rows": []}
    print(f"[{a.tag}] {rec['command']}", flush=True)
    print(s.plan.format(), flush=True)
    sampler = GpuSampler()
    t0 = time.perf_counter()
    try:
        srv.start()
        srv.wait_ready(a.timeout)
        rec["load_s"] = time.perf_counter() - t0
        rec["gpu_after_load_mib"] = gpu_used_now()
        sv.complete_stream(srv.url, bn.prompt_ids(srv.url, 8), 4)  # warm-up
        for n in bn.parse_lengths(a.lengths):
            if n + a.n_predict > s.plan.ctx:
                n = s.plan.ctx - a.n_predict - 8
            ids = bn.prompt_ids(srv.url, n)
            ttft, _, t = sv.complete_stream(srv.url, ids, a.n_predict)
            row = {"prompt_tokens": n, "prefill_tok_s": t["prompt_per_second"],
                   "decode_tok_s": t["predicted_per_second"], "ttft_s": ttft, "predicted": t["predicted_n"],
                   **sampler.peaks(), "server_rss_peak_mib": rss_mib(srv.proc.pid)}
            rec["rows"].append(row)
            print(f"[{a.tag}] {json.dumps(row)}", flush=True)
    except Exception as e:  # record what was measured, and why it stopped
        rec["error"] = f"{type(e).__name__}: {e}"
        print(f"[{a.tag}] error: {rec['error']}", flush=True)
    finally:
        rec.update(sampler.peaks())
        sampler.close()
        srv.stop(60)
        rpcw.stop_workers(workers)
    rec["log"] = parse_log(log.read_text(errors="replace"))
    append(a.json, rec)
    print(f"[{a.tag}] log accounting {json.dumps(rec['log'])}", flush=True)


def cmd_draft(a) -> None:
    """Target-only, then one server per n_max; each oracle cycle (draft error period) is one request."""
    from ggufbridge.runtime.artifacts import load_artifacts

    man = json.loads((Path(a.model) / "manifest.json").read_text())
    o = man["synthetic"]["oracle"]
    if not o:
        sys.exit(f"{a.model}: not an oracle pair (make_fullsize_gguf.py --oracle)")
    cycles = [list(range(o["first"] + c * o["length"], o["first"] + (c + 1) * o["length"]))
              for c in range(len(o["periods"]))]
    load_artifacts(a.model)
    tmp = Path(tempfile.mkdtemp(prefix="draft-recipes-"))
    for n_max in [0] + [int(x) for x in a.n_max.split(",")]:
        over = f'name = "draft-{n_max}"\n[server]\nctx = {a.ctx}\nmin_ctx = {a.ctx}\n'
        if n_max:
            over += f'[draft]\nn_max = {n_max}\nctx_cap = {a.ctx}\n'
        s = prepare(a.model, user_recipe(a.recipe, over, tmp), draft=bool(n_max), ctx=a.ctx, parallel=1,
                    llama_bin=a.llama_bin)
        if s.problems:
            sys.exit(" | ".join(s.problems))
        tag = f"draft-nmax{n_max}" if n_max else "draft-target-only"
        log = a.logdir / f"server-{tag}.log"
        srv, argv = start(s, draft=bool(n_max), log=log)
        rec = {"tag": tag, "n_max": n_max, "command": sv.printable(argv), "rows": []}
        try:
            srv.start()
            srv.wait_ready(a.timeout)
            sv.complete_stream(srv.url, cycles[-1][:8], 8)  # warm-up
            for c, period in enumerate(o["periods"]):
                if not n_max and c:  # target-only: one cycle is enough, the target's cost does not depend on it
                    break
                before = sv.metrics(srv.url)
                _, _, t = sv.complete_stream(srv.url, cycles[c][:8], a.n_predict)
                after = sv.metrics(srv.url)
                row = {"period": period, "decode_tok_s": t["predicted_per_second"], "predicted": t["predicted_n"],
                       **draft_stats(before, after, t)}
                rec["rows"].append(row)
                print(f"[{tag}] {json.dumps(row)}", flush=True)
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"
            print(f"[{tag}] error: {rec['error']}", flush=True)
        finally:
            srv.stop(30)
        append(a.json, rec)


def cmd_compute(a) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="compute-recipes-"))
    for kv in a.kv.split(","):
        for ub in [int(x) for x in a.ub.split(",")]:
            for ctx in [int(x) for x in a.ctx_list.split(",")]:
                over = (f'name = "probe"\n[server]\nctx = {ctx}\nmin_ctx = {ctx}\nbatch = {max(ub, 2048)}\n'
                        f'ubatch = {ub}\ncache_type_k = "{kv}"\ncache_type_v = "{kv}"\nn_cpu_moe = 0\n'
                        f'n_gpu_layers = "all"\n')
                s = prepare(a.model, user_recipe(a.recipe, over, tmp), ctx=ctx, llama_bin=a.llama_bin, parallel=1)
                tag = f"compute-{kv}-ub{ub}-c{ctx}"
                log = a.logdir / f"server-{tag}.log"
                srv, argv = start(s, log=log, extra=["--no-warmup"])
                try:
                    srv.start()
                    srv.wait_ready(a.timeout)
                    err = None
                except Exception as e:
                    err = f"{type(e).__name__}: {e}"
                finally:
                    srv.stop(30)
                rec = {"tag": tag, "kv": kv, "ubatch": ub, "ctx": s.plan.ctx, "plan": s.plan.to_dict(),
                       "command": sv.printable(argv), "error": err, "log": parse_log(log.read_text(errors="replace"))}
                append(a.json, rec)
                print(f"[{tag}] compute {rec['log']['buffers_mib'].get('compute')} "
                      f"plan {[p['use']['compute'] / MIB for p in rec['plan']['pools']]} {err or ''}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("measure", "draft", "compute"):
        p = sub.add_parser(name)
        p.add_argument("model", help="a folder with manifest.json (make_fullsize_gguf.py or convert)")
        p.add_argument("--recipe", default="h200")
        p.add_argument("--json", type=Path, required=True)
        p.add_argument("--logdir", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
        p.add_argument("--llama-bin", default=None)
        p.add_argument("--timeout", type=float, default=600.0)
        if name == "measure":
            p.add_argument("--tag", required=True)
            p.add_argument("--ctx", type=int, default=None)
            p.add_argument("--lengths", default="1k")
            p.add_argument("-n", "--n-predict", type=int, default=64)
        elif name == "draft":
            p.add_argument("--n-max", default="2,3,4,6,8,11,15")
            p.add_argument("--ctx", type=int, default=4096)
            p.add_argument("-n", "--n-predict", type=int, default=160)
        else:
            p.add_argument("--ub", default="512")
            p.add_argument("--ctx", dest="ctx_list", default="8192")
            p.add_argument("--kv", default="f16")
    a = ap.parse_args(argv)
    a.logdir.mkdir(parents=True, exist_ok=True)
    {"measure": cmd_measure, "draft": cmd_draft, "compute": cmd_compute}[a.cmd](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())

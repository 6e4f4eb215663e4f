#!/usr/bin/env python3
"""What one over-long chat message costs the server before it is refused (issue 40).

    python -m benchmarks.bench_long_prompt OUT_DIR [--mb 10 50] [--ctx 2048] [--llama-bin DIR]

OUT_DIR is a `ggufbridge convert` folder. The model is served as `ggufbridge serve OUT_DIR --ctx CTX` does (this
checkout's runtime, or --llama-bin), and one chat per size is sent whose message is MB megabytes of text ("river "
repeated). Printed per size: the status, the seconds until the answer, llama-server's peak RSS (VmHWM) before and
after the request, and the start of the error message. Without patch server-request-body-guards the text is
tokenised whole before the slot refuses it for length; with it, it is refused before tokenisation.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _vmhwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--mb", type=float, nargs="+", default=[10.0, 50.0])
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--llama-bin", default=None)
    a = ap.parse_args()

    from ggufbridge.runtime import server as sv

    port = sv.free_port()
    argv = [sys.executable, "-m", "ggufbridge", "serve", a.out_dir, "--port", str(port), "--ctx", str(a.ctx)]
    if a.llama_bin:
        argv += ["--llama-bin", a.llama_bin]
    serve = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)), start_new_session=True)
    try:
        for line in serve.stdout:
            if line.startswith("ready: "):
                break
        kids = [int(x) for x in Path(f"/proc/{serve.pid}/task/{serve.pid}/children").read_text().split()]
        server = kids[0]
        for mb in a.mb:
            text = "river " * int(mb * 1e6 / 6)
            body = json.dumps({"messages": [{"role": "user", "content": text}], "max_tokens": 4,
                               "chat_template_kwargs": {"enable_thinking": False}}).encode()
            before = _vmhwm_mib(server)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            t0 = time.monotonic()
            conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            answer = r.read()
            took = time.monotonic() - t0
            conn.close()
            msg = json.loads(answer).get("error", {}).get("message", "")[:90]
            print(f"{mb:g} MB message: {r.status} in {took:.2f} s; llama-server peak RSS {before:.0f} -> "
                  f"{_vmhwm_mib(server):.0f} MiB; {msg}", flush=True)
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(30)


if __name__ == "__main__":
    main()

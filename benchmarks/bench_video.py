#!/usr/bin/env python3
"""Video input cost: a 60 s 720p clip through `ggufbridge serve`'s OpenAI API (issue 19), in one run.

    python -m benchmarks.bench_video OUT_DIR [--seconds 60] [--size 1280x720] [--fps 30] [--work DIR]
                                          [--json benchmarks/results/video/cpu.json]

OUT_DIR is a `ggufbridge convert` folder (target + mmproj). The clip is encoded here (H.264, moving content).

* reader: ggufbridge's video reader alone, in a child process (what llama-server runs for a `video_url` part):
  probe, MiniCPM-V sampling, the probe's check that decodes the clip to the last sampled frame, then the stream of
  RGB frames (decoding again); wall time (and the probe's part) and peak RSS.
* served: `ggufbridge serve OUT_DIR --ctx N` started as a user does; chats with the clip as a `video_url` data
  URL and max_tokens 1 (prompt cache off), after one unmeasured warm-up chat with a 2 s clip; the fastest of
  `--repeats`: time to the answer at the client (reading + frame layout + encoding + prefill), the server's
  prompt time (encoding + prefill), prompt tokens, and llama-server's peak RSS (VmHWM) after the warm-up and after
  the clip.
* anchor: the same server, chats (fastest of `--repeats`) with the clip's first frame as an `image_url` PNG: the
  cost of one picture of the same size, so `served / anchor` reads as "how many pictures the clip costs".
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What happens in the clip?"

READER = r'''
import resource, sys, time
from ggufbridge.vision import video
t0 = time.perf_counter()
info = video.probe(sys.argv[1])
idx = video.sample_indices(info)
video.check_decodes(sys.argv[1], info, idx)  # what the reader's ffprobe does before it answers
t1 = time.perf_counter()
n = sum(1 for _ in video.iter_frames(sys.argv[1], idx))  # what its ffmpeg streams
dt = time.perf_counter() - t0
print(f"{dt} {t1 - t0} {n} {info.total_frames} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}")
'''


def held_per_frame(out_dir: Path, w: int, h: int) -> dict:
    """What llama-server holds per sampled frame until it is encoded: the RGB bitmap (libmtmd expands all frames of
    a clip before tokenizing) and its preprocessed F32 crops (thumbnail + slices, sized by transformers' own
    MiniCPM-V resize and slicing rules with the mmproj's slice size)."""
    from transformers.models.minicpmv4_6.video_processing_minicpmv4_6 import MiniCPMV4_6VideoProcessor

    from ggufbridge.ggufio.manifest import read_manifest
    from ggufbridge.ggufio.reader import read_header

    kv = read_header(read_manifest(out_dir).files["mmproj"].path).kv
    size, ds = int(kv["clip.vision.image_size"]), "4x" if int(kv["clip.vision.projector.scale_factor"]) == 2 else "16x"
    vp = MiniCPMV4_6VideoProcessor()
    grid = vp.get_sliced_grid((h, w), int(kv.get("clip.minicpmv.max_slice_nums", 9)), size)
    sh, sw = vp.find_best_resize((h, w), size, 14, allow_upscale=grid is None, downsample_mode=ds)
    px = sh * sw
    if grid is not None:
        rh, rw = vp.get_refine_size((h, w), grid, size, 14, allow_upscale=True, downsample_mode=ds)
        px += rh * rw
    return {"slice_size": size, "grid": grid, "rgb_bytes": w * h * 3, "crops_f32_bytes": px * 3 * 4}


def make_clip(path: Path, seconds: float, w: int, h: int, fps: int, seed: int = 0) -> Path:
    """H.264 clip of moving gradients and a bouncing square (so that frames differ and compress like video)."""
    import av
    import numpy as np

    n = int(round(seconds * fps))
    yy, xx = np.mgrid[0:h, 0:w]
    tmp = path.with_suffix(".tmp.mp4")
    with av.open(str(tmp), "w") as c:
        st = c.add_stream("libx264", rate=Fraction(fps))
        st.width, st.height, st.pix_fmt = w, h, "yuv420p"
        st.options = {"preset": "ultrafast", "crf": "23"}
        for k in range(n):
            a = np.empty((h, w, 3), np.uint8)
            a[..., 0] = (xx + 3 * k + seed) % 256
            a[..., 1] = (yy + 2 * k) % 256
            a[..., 2] = ((xx + yy) // 4 + k) % 256
            x0, y0 = (7 * k) % (w - 80), (5 * k) % (h - 80)
            a[y0:y0 + 80, x0:x0 + 80] = 255
            for pkt in st.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                c.mux(pkt)
        for pkt in st.encode():
            c.mux(pkt)
    tmp.replace(path)
    return path


def chat(url: str, part: dict, timeout: float = 3600.0) -> tuple[float, dict]:
    import urllib.request

    body = {"messages": [{"role": "user", "content": [part, {"type": "text", "text": QUESTION}]}], "max_tokens": 1,
            "temperature": 0, "cache_prompt": False, "chat_template_kwargs": {"enable_thinking": False}}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read())
    return time.perf_counter() - t0, out


def video_part(clip: Path) -> dict:
    url = "data:video/mp4;base64," + base64.b64encode(clip.read_bytes()).decode()
    return {"type": "video_url", "video_url": {"url": url}}


def first_frame_part(clip: Path) -> dict:
    from ggufbridge.vision import video
    from PIL import Image

    frame = next(video.iter_frames(str(clip), [0]))
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def vm_hwm(pid: int) -> int:
    """Peak RSS (bytes) of llama-server: the child of `ggufbridge serve` whose command is llama-server."""
    for child in Path("/proc").iterdir():
        if not child.name.isdigit():
            continue
        try:
            st = (child / "status").read_text()
            cmd = (child / "cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if cmd.endswith(b"llama-server") and f"PPid:\t{pid}\n" in st:
            for line in st.splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--fps", type=int, default=30)
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--work", type=Path, default=Path("/tmp/ggufbridge-bench-video"))
    ap.add_argument("--repeats", type=int, default=2, help="measured requests of each kind (the fastest is kept)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    w, h = (int(x) for x in a.size.split("x"))
    a.work.mkdir(parents=True, exist_ok=True)
    clip = a.work / f"clip-{a.seconds:g}s-{w}x{h}-{a.fps}.mp4"
    warm = a.work / f"warm-2s-{w}x{h}-{a.fps}.mp4"
    t0 = time.perf_counter()
    if not clip.is_file():
        make_clip(clip, a.seconds, w, h, a.fps)
    if not warm.is_file():
        make_clip(warm, 2, w, h, a.fps, seed=99)
    print(f"clips ready ({time.perf_counter() - t0:.0f} s); {clip} {clip.stat().st_size / 2**20:.1f} MiB",
          file=sys.stderr)

    r = subprocess.run([sys.executable, "-c", READER, str(clip)], capture_output=True, text=True, check=True)
    rt, rprobe, rn, rtotal, rrss = r.stdout.split()
    reader = {"seconds": float(rt), "probe_seconds": float(rprobe), "frames": int(rn), "stream_frames": int(rtotal),
              "peak_rss_bytes": int(rrss) * 1024}
    print(f"reader: {reader}", file=sys.stderr)

    from ggufbridge.runtime import server as sv

    port = sv.free_port()
    console = a.work / "serve.console"
    srv = sv.Server([sys.executable, "-m", "ggufbridge", "serve", str(a.out_dir), "--port", str(port), "--ctx",
                     str(a.ctx), "--log", str(a.work / "llama-server.log")], "127.0.0.1", port, console).start()
    try:
        srv.wait_ready(600)
        chat(srv.url, video_part(warm))
        rss_warm = vm_hwm(srv.proc.pid)  # peak after loading and a 2-frame clip: the baseline
        # two measured requests of each (the machine is shared: the faster one is the less disturbed)
        runs_v = [chat(srv.url, video_part(clip)) for _ in range(a.repeats)]
        rss = vm_hwm(srv.proc.pid)
        runs_i = [chat(srv.url, first_frame_part(clip)) for _ in range(a.repeats)]
    finally:
        srv.stop(60)
    dt_v, out_v = min(runs_v, key=lambda r: r[0])
    dt_i, out_i = min(runs_i, key=lambda r: r[0])
    served = {"seconds": dt_v, "all_seconds": [r[0] for r in runs_v], "prompt_ms": out_v["timings"]["prompt_ms"],
              "prompt_tokens": out_v["usage"]["prompt_tokens"],
              "server_peak_rss_bytes": rss, "server_peak_rss_after_warmup_bytes": rss_warm}
    anchor = {"seconds": dt_i, "all_seconds": [r[0] for r in runs_i], "prompt_ms": out_i["timings"]["prompt_ms"],
              "prompt_tokens": out_i["usage"]["prompt_tokens"]}
    per = held_per_frame(a.out_dir, w, h)
    held = {**per, "frames": reader["frames"],
            "expected_bytes": reader["frames"] * (per["rgb_bytes"] + per["crops_f32_bytes"]),
            "measured_growth_bytes": rss - rss_warm}
    res = {"clip": {"path": clip.name, "seconds": a.seconds, "width": w, "height": h, "fps": a.fps,
                    "bytes": clip.stat().st_size}, "out_dir": str(a.out_dir), "reader": reader, "served": served,
           "held_until_encoded": held,
           "anchor_one_frame_as_image": anchor,
           "ratio_served_to_anchor": {"seconds": dt_v / dt_i, "prompt_ms": served["prompt_ms"] / anchor["prompt_ms"],
                                      "prompt_tokens": served["prompt_tokens"] / anchor["prompt_tokens"]},
           "date": time.strftime("%Y-%m-%d"), "machine": f"{os.uname().machine}, {os.cpu_count()} cores"}
    print(json.dumps(res, indent=2))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()

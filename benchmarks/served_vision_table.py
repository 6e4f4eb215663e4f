#!/usr/bin/env python3
"""Served image chats against transformers: the patched path and the stock layout, one table (docs/vision.md).

    python -m benchmarks.served_vision_table [--work DIR] [--tokens 12]
        [--json benchmarks/results/served-vision/cpu.json]
    python -m benchmarks.served_vision_table --sweep [--pictures 60] [--clips 12] [--mmproj f32 f16]
        [--default-attention] [--json FILE]

A synthetic MiniCPM-V 4.7 (M-RoPE over t, h and w; the small vocabulary, so the server's top_logprobs is the
whole distribution and the KL is exact) is converted (F32 target, F32 mmproj, 16x and 4x) and served twice with
`ggufbridge serve`: as converted (the patch series: processor slicing, <image_id>, canvas M-RoPE), and with the
mmproj keys that switch those on renamed, so that libmtmd takes its stock minicpmv4_6 path (letterboxed slices,
1-D positions) - what a stock llama.cpp does. Each chat is scored by transformers' processor + model,
teacher-forced on the server's own tokens; KL(transformers ‖ server) per generated token.

--sweep: the served-vision sweep (ggufbridge.testkit.served_sweep) on a model whose MoE router nearly ties at
every token: `--pictures` random pictures of as many shapes and the first `--clips` of served_sweep.CLIPS (12),
per mmproj type, each chat's largest |Δ log-probability| over the server's top-5 and greedy agreement against
transformers' PIL and torchvision image processors (pictures) and its video processor with torchvision's CPU
resize (clips). The text tower's attention is served in F32 (F32 K/V, flash attention off: served_sweep's
f32_attention_recipe); `--default-attention` serves with the cpu recipe as it is (F16 K/V, flash attention).
The runtime is `ggufbridge serve`'s (LLAMA_CPP_BIN picks another build: the ablation in docs/vision.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np


CASES = {"unsliced 112×112": ([(112, 112)], "16x"), "1×2 250×130": ([(250, 130)], "16x"),
         "2×1 130×250": ([(130, 250)], "16x"), "2×2 4x 230×170": ([(230, 170)], "4x"),
         "two images": ([(112, 112), (250, 130)], "16x")}


def serve(out_dir: Path, log: Path):
    """`ggufbridge serve OUT_DIR` (the user's command) on a free port, healthy."""
    from ggufbridge.runtime import server as sv

    port = sv.free_port()
    argv = [sys.executable, "-m", "ggufbridge", "serve", str(out_dir), "--port", str(port), "--ctx", "4096",
            "--log", str(log)]
    srv = sv.Server(argv, "127.0.0.1", port, log.with_name(log.name + ".console")).start()
    srv.wait_ready(300)
    return srv


def main() -> None:
    from ggufbridge.testkit.vision import SPEC_THW, hf_processor, random_image
    from ggufbridge.testkit import served_chat as sc
    from ggufbridge.convert import convert
    from ggufbridge.testkit.checkpoint import load_reference, make_minicpmv47

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--sweep", action="store_true", help="the tie-prone sweep of pictures and clips instead")
    ap.add_argument("--pictures", type=int, default=60)
    ap.add_argument("--clips", type=int, default=12, help="the first N of served_sweep.CLIPS")
    ap.add_argument("--mmproj", nargs="+", default=["f32", "f16"], choices=["f32", "f16"])
    ap.add_argument("--default-attention", action="store_true",
                    help="--sweep with serve's default recipe (F16 K/V, flash attention) instead of F32 attention")
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="served-vision-"))
    if a.sweep:
        run_sweep(work, a.pictures, a.clips, a.mmproj, a.json, not a.default_attention)
        return
    ck = work / "ck"
    if not (ck / "config.json").is_file():
        make_minicpmv47(ck, SPEC_THW, vocab="small")
    outs = {}
    for d in ("16x", "4x"):
        o = work / f"out-{d}"
        if not (o / "manifest.json").is_file():
            convert(ck, o, outtype="f32", mmproj_outtype="f32", downsample=d, progress=False)
        outs[("patched", d)] = o
        s = work / f"stock-{d}"
        if not s.exists():
            sc.stock_layout_copy(o, s)
        outs[("stock", d)] = s
    ref = load_reference(ck)
    ban = {str(i): False for i in sc.partial_utf8_ids(hf_processor(ck).tokenizer)}
    rows = []
    for (kind, d), out_dir in outs.items():
        srv = serve(out_dir, work / f"{kind}-{d}.log")
        url = srv.url
        try:
            for name, (sizes, mode) in CASES.items():
                if mode != d:
                    continue
                imgs = [random_image(w, h, seed=k + len(name)) for k, (w, h) in enumerate(sizes)]
                msgs = [sc.user_turn(imgs, "What is in the picture?")]
                turn = sc.chat(url, msgs, max_tokens=a.tokens, top_logprobs=512, logit_bias=ban)
                ds = None if d == "16x" else d
                inputs = sc.hf_prompt(hf_processor(ck, ds), msgs, ds)
                lp = sc.hf_scores(ref, inputs, turn.ids, ds)
                kl = sc.kl_to_served(lp, turn.top)
                top1 = float(np.mean([int(lp[i].argmax()) == max(turn.top[i], key=turn.top[i].get)
                                      for i in range(len(turn.ids))]))
                rows.append({"case": name, "path": kind, "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
                             "top1": top1, "tokens": len(turn.ids), "prompt_tokens": turn.usage.get("prompt_tokens"),
                             "hf_prompt_tokens": int(inputs["input_ids"].shape[1])})
        finally:
            srv.stop(60)
    print("| image | patched KL mean | patched KL max | patched top-1 | stock KL mean | stock top-1 |")
    print("|---|---|---|---|---|---|")
    for name in CASES:
        p = next(r for r in rows if r["case"] == name and r["path"] == "patched")
        s = next(r for r in rows if r["case"] == name and r["path"] == "stock")
        print(f"| {name} | {p['kl_mean']:.2g} | {p['kl_max']:.2g} | {p['top1']:.0%} | **{s['kl_mean']:.2g}** | "
              f"{s['top1']:.0%} |")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2) + "\n")


def run_sweep(work: Path, n_pictures: int, n_clips: int, mmprojs: list[str], json_path: Path | None,
              f32_attention: bool = True) -> None:
    from ggufbridge.convert import convert
    from ggufbridge.testkit import served_sweep as sw

    ck, ref = sw.make_model(work)
    pictures = sw.picture_sizes(n_pictures)
    result: dict = {"router_delta": sw.ROUTER_DELTA, "f32_attention": f32_attention}
    for mm in mmprojs:
        out = work / f"sweep-out-{mm}"
        if not (out / "manifest.json").is_file():
            convert(ck, out, outtype="f32", mmproj_outtype=mm, progress=False)
        rows = sw.sweep(out, ck, ref, pictures, sw.CLIPS[:n_clips], work, work / f"sweep-{mm}.log", progress=True,
                        f32_attention=f32_attention)
        result[mm] = rows
        pic = [r for r in rows if r["kind"] == "picture"]
        clips = [r for r in rows if r["kind"] == "clip"]
        attn = "F32 attention" if f32_attention else "serve's default attention (F16)"
        print(f"\n### {mm.upper()} projector, {attn}: {len(pic)} pictures "
              f"({len({r['case'] for r in pic})} shapes, "
              f"{len({r['grid'] for r in pic})} grids), {len(clips)} clips; outside the bound: "
              f"{len(sw.failures(rows))}\n")
        print(f"pictures vs PIL: max abs dlogp {max(r['pil_dlogp'] for r in pic):.2g}, greedy equal "
              f"{sum(r['pil_greedy'] for r in pic)}/{len(pic)}; vs torchvision: "
              f"{max(r['torchvision_dlogp'] for r in pic):.2g}, {sum(r['torchvision_greedy'] for r in pic)}/"
              f"{len(pic)}; clips vs the video processor: {max(r['video_dlogp'] for r in clips):.2g}, "
              f"{sum(r['video_greedy'] for r in clips)}/{len(clips)}\n")
        print(sw.table(rows))
        if json_path:
            json_path.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""How tie-prone the served sweep's router may be: per ROUTER_DELTA, float32 rounding against an F16 projector.

    python -m benchmarks.router_delta [--deltas 5e-4 2e-3 5e-3 1e-2 2e-2] [--work DIR]
        [--json benchmarks/results/served-vision/router-delta.json]

For each delta the sweep's model (ggufbridge.testkit.served_sweep, tie_prone_router) is built and converted (F32
target; F32 and F16 mmproj), and on the full sweep's 60 pictures plus the suite's 6 (tests/test_served_vision_sweep.py)
transformers float32 answers each picture greedily (6 tokens). Per picture, teacher-forced on those tokens:

* float64: transformers' float64 twin against float32, the largest |Δ log-probability| over the whole vocabulary
  and greedy agreement: two correct implementations that differ only by rounding;
* the router margins (third minus fourth expert logit, float32) of every layer at the 6 scored positions;
* F32 / F16: libllama + libmtmd through the bindings (F32 K/V cache, flash attention off: the text tower in F32,
  as the sweep serves it) with the F32 and the F16 mmproj, against float32 likewise.

A fair delta is one where float64 stays inside the sweep's bound (0.02, greedy equal) on every picture, which the
F32 runtime then can meet too, while the F16 projector still breaks it (docs/vision.md, "The references").
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

SUITE = [(150, 120), (300, 700), (1000, 420), (230, 170), (640, 640), (90, 500)]


def measure(work: Path, delta: float) -> list[dict]:
    import torch

    from ggufbridge.compare.metrics import log_softmax
    from ggufbridge.convert import convert
    from ggufbridge.testkit import served_chat as sc
    from ggufbridge.testkit import served_sweep as sw
    from ggufbridge.testkit.bindings import Chunk, VisionSession
    from ggufbridge.testkit.vision import hf_processor, random_image

    ck, ref = sw.make_model(work, delta)
    ref64, ban, proc = sw.float64_twin(ref), sw.ban_ids(ck), hf_processor(ck)
    banned = [int(k) for k in ban]
    margins: dict[int, np.ndarray] = {}

    def keep_margins(li):
        def hook(mod, args, out):  # the router's logits: (tokens, experts)
            top = torch.sort(out[0].detach().double(), -1, descending=True).values
            margins[li] = (top[:, 2] - top[:, 3]).numpy()  # SPEC: top-3, so the third expert is decided here
        return hook

    for li, layer in enumerate(ref.model.language_model.layers):
        layer.mlp.gate.register_forward_hook(keep_margins(li))
    sessions = {}
    for mm in ("f32", "f16"):
        out = work / f"out-{mm}"
        if not (out / "manifest.json").is_file():
            convert(ck, out, outtype="f32", mmproj_outtype=mm, progress=False)
        sessions[mm] = VisionSession(next(out.glob("MiniCPM-*.gguf")), next(out.glob("mmproj-*.gguf")), n_ctx=4096,
                                     f32_kv=True)
    pictures = [(size, k) for k, size in enumerate(sw.picture_sizes(60))] + [(s, k) for k, s in enumerate(SUITE)]
    rows = []
    try:
        for size, seed in pictures:
            img = random_image(*size, seed=seed)
            msgs = [sc.user_turn([img], sw.QUESTION)]
            inputs = sc.hf_prompt(proc, msgs)
            n = int(inputs["input_ids"].shape[1])
            ids = sw.reference_greedy(ref, inputs, ban)
            lp = sc.hf_scores(ref, inputs, ids)  # also fills `margins` for this teacher-forced pass
            scored = np.concatenate([m[n - 1:] for _, m in sorted(margins.items())])
            lp64 = sc.hf_scores(ref64, {**inputs, "pixel_values": inputs["pixel_values"].double()}, ids)
            row = {"case": f"{size[0]}x{size[1]}", "seed": seed, "ids": ids,
                   "f64_dlogp": float(np.abs(lp64 - lp).max()), "f64_greedy": sw.greedy_equal(lp64, ids, ban),
                   "scored_margins": scored.tolist()}
            text = proc.tokenizer.apply_chat_template(sc.hf_messages(msgs)[0], tokenize=False,
                                                      add_generation_prompt=True, **sc.TEMPLATE_KWARGS)
            for mm, s in sessions.items():
                chunks = s.chunks(text.replace("<unk>", s.marker), [img]) + [Chunk("text", ids[:-1])]
                lo = log_softmax(s.eval(chunks).logits.astype(np.float64)[n - 1:])
                row[f"{mm}_dlogp"] = float(np.abs(lo - lp).max())
                lo[:, banned] = -np.inf
                row[f"{mm}_greedy"] = bool((lo.argmax(1) == np.array(ids)).all())
            rows.append(row)
    finally:
        for s in sessions.values():
            s.close()
    return rows


def summary(delta: float, rows: list[dict], tolerance: float) -> dict:
    m = np.array([x for r in rows for x in r["scored_margins"]])

    def outside(key):
        return [r["case"] for r in rows if not (r[f"{key}_dlogp"] <= tolerance and r[f"{key}_greedy"])]

    return {"delta": delta, "pictures": len(rows), "scored_margins": int(m.size), "margin_median": float(np.median(m)),
            "margin_min": float(m.min()), "margins_below_1e-6": int((m < 1e-6).sum()),
            "f64_max": max(r["f64_dlogp"] for r in rows), "f64_outside": outside("f64"),
            "f32_max": max(r["f32_dlogp"] for r in rows), "f32_outside": outside("f32"),
            "f16_outside": outside("f16"),
            "suite_f16_outside": [c for c in outside("f16") if tuple(map(int, c.split("x"))) in SUITE]}


def main() -> None:
    from ggufbridge.testkit import served_sweep as sw

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deltas", nargs="+", type=float, default=[5e-4, 2e-3, 5e-3, 1e-2, 2e-2])
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="router-delta-"))
    result = []
    print("| ROUTER_DELTA | scored margins: median, smallest, below 1e-6 | float64 vs float32: max, outside | "
          "F32 runtime: max, outside | F16 projector: outside (suite's 6) |\n|---|---|---|---|---|")
    for d in a.deltas:
        rows = measure(work / f"delta-{d:g}", d)
        s = summary(d, rows, sw.TOLERANCE)
        result.append({**s, "rows": [{k: v for k, v in r.items() if k != "scored_margins"} for r in rows]})
        print(f"| {d:g} | {s['margin_median']:.2g}, {s['margin_min']:.2g}, {s['margins_below_1e-6']} of "
              f"{s['scored_margins']} | {s['f64_max']:.2g}, {len(s['f64_outside'])} {s['f64_outside'] or ''} | "
              f"{s['f32_max']:.2g}, {len(s['f32_outside'])} {s['f32_outside'] or ''} | {len(s['f16_outside'])} of "
              f"{s['pictures']} ({len(s['suite_f16_outside'])}) |", flush=True)
        if a.json:
            a.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

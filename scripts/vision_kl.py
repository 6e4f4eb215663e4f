"""Teacher-forced KL(transformers ‖ llama.cpp) on an image prompt: the ggufbridge bindings path (canvas M-RoPE)
and the stock runtime path (libmtmd preprocessing + 1-D positions), on a synthetic checkpoint.

usage: python scripts/vision_kl.py CKPT_DIR CONVERT_OUT_DIR [WIDTHxHEIGHT] [--downsample 4x|16x]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _vision_helpers import hf_logits, kl_rows, random_image  # noqa: E402

from ggufbridge.fixtures.checkpoint import load_reference  # noqa: E402
from ggufbridge.vision.bindings import VisionSession, resolve_files  # noqa: E402
from ggufbridge.vision.stock import stock_eval  # noqa: E402


def measure(ckpt, out_dir, size=(250, 130), downsample=None, question="Describe the picture in detail please.",
            seed=0) -> dict:
    model, mmproj = resolve_files(out_dir)
    img = random_image(*size, seed=seed)
    ref = load_reference(ckpt)
    before = "<|im_start|>user\n"  # build_prompt adds `<image_id>0</image_id>` itself; the stock path needs it as text
    after = f"\n{question}<|im_end|>\n<|im_start|>assistant\n"
    with VisionSession(model, mmproj, n_ctx=2048) as s:
        crops, notes = s.prepare_image(img, strict=True)
        pr = s.build_prompt([before, crops, after])
        ours = s.eval_prompt(pr, logits_for=range(len(pr.ids)))
        flat = dataclasses.replace(pr, positions=np.tile(np.arange(len(pr.ids)), (3, 1)), next_pos=len(pr.ids))
        ours_1d = s.eval_prompt(flat, logits_for=range(len(pr.ids)))
        ids, stock, n_img = stock_eval(s, before + "<image_id>0</image_id>", img, after)
    same_layout = len(ids) == len(pr.ids) and all(a == b for a, b in zip(ids, pr.ids) if a >= 0)
    ref_logits = hf_logits(ref, pr, [crops], downsample)
    n_tail = stock.shape[0]
    k_ours = kl_rows(ref_logits, ours)
    k_stock = kl_rows(ref_logits[-n_tail:], stock) if same_layout else np.array([np.nan])
    return {
        "tokens": len(pr.ids), "tail_tokens": n_tail, "same_layout": same_layout,
        "bindings_kl_mean_all": float(k_ours.mean()), "bindings_kl_mean_tail": float(k_ours[-n_tail:].mean()),
        "bindings_1d_positions_kl_mean_tail": float(kl_rows(ref_logits, ours_1d)[-n_tail:].mean()),
        "stock_kl_mean_tail": float(k_stock.mean()), "stock_kl_max_tail": float(k_stock.max()),
        "bindings_top1_tail": float((ref_logits[-n_tail:].argmax(1) == ours[-n_tail:].argmax(1)).mean()),
        "stock_top1_tail": float((ref_logits[-n_tail:].argmax(1) == stock.argmax(1)).mean()) if same_layout else None,
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("out_dir")
    ap.add_argument("size", nargs="?", default="250x130")
    ap.add_argument("--downsample", default=None)
    a = ap.parse_args()
    w, h = map(int, a.size.split("x"))
    for k, v in measure(a.ckpt, a.out_dir, (w, h), a.downsample).items():
        print(f"{k}: {v}")

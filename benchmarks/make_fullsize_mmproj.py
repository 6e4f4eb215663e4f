#!/usr/bin/env python3
"""A full-size-shaped, random-weight MiniCPM-V 4.7 vision tower, converted by ggufbridge into OUT_DIR's mmproj.

For image-prefill measurements at the real shapes (issue 13), beside benchmarks/make_fullsize_gguf.py's target: a
SigLIP tower of the real width (1152, 27 layers, ff 4304, 16 heads, patch 14, 980² position grid, window merger
after layer 6) and the downsample merger into the 2048-wide text model is written as a vision-only upstream
checkpoint (F16 noise, ~0.9 GB), then converted by the real converter (`arch.minicpmv4_7_vision.plan_mmproj`)
and registered in OUT_DIR/manifest.json as the mmproj.

    python -m benchmarks.make_fullsize_mmproj OUT_DIR [--downsample 4x|16x] [--text-hidden 2048]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np


from ggufbridge.arch import minicpmv4_7_vision as V
from ggufbridge.checkpoint.model_dir import ModelDir
from ggufbridge.ggufio.manifest import ManifestEntry, read_manifest, write_manifest
from ggufbridge.ggufio.writer import write_gguf

VISION = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
          "patch_size": 14, "image_size": 980, "layer_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh"}


SMOKE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4}


def vision_checkpoint(dst: Path, text_hidden: int, vision: dict, seed: int = 0) -> Path:
    from safetensors.numpy import save_file

    insert = min(6, vision["num_hidden_layers"] - 1)
    p = V.VisionParams(hidden=vision["hidden_size"], ff=vision["intermediate_size"],
                       n_layer=vision["num_hidden_layers"],
                       n_head=vision["num_attention_heads"], patch=14, grid=70, eps=1e-6, insert_layer_id=insert,
                       slice_size=448, mean=(0.5,) * 3, std=(0.5,) * 3, downsample="16x", text_hidden=text_hidden,
                       max_slice_nums=9, use_image_id=True)
    rng = np.random.default_rng(seed)
    names = [(r.source, r.shape(p)) for r in V.GLOBAL]
    names.append((V.TOWER + "embeddings.position_embedding.weight", (70 * 70, p.hidden)))
    for il in range(p.n_layer):
        names += [(f"{V.TOWER}encoder.layers.{il}.{r.source}", r.shape(p)) for r in V.EVERY_LAYER]
    names += [(f"{V.TOWER}vit_merger.{r.source}", r.shape(p)) for r in V.VIT_MERGER]
    tensors = {}
    for name, shape in names:
        scale = 1.0 if len(shape) == 1 and "weight" in name and "norm" in name else 0.02
        base = 1.0 if scale == 1.0 else 0.0
        tensors[name] = (base + scale * rng.standard_normal(shape, dtype=np.float32)).astype(np.float16)
    dst.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dst / "model.safetensors"))
    cfg = {"architectures": ["MiniCPMV4_7ForConditionalGeneration"], "model_type": "minicpmv4_7",
           "vision_config": vision, "text_config": {"hidden_size": text_hidden}, "insert_layer_id": insert,
           "merger_times": 1, "downsample_mode": "16x"}
    (dst / "config.json").write_text(json.dumps(cfg))
    (dst / "preprocessor_config.json").write_text(json.dumps(
        {"scale_resolution": 448, "patch_size": 14, "max_slice_nums": 9, "image_mean": [0.5] * 3,
         "image_std": [0.5] * 3, "use_image_id": True}))
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--downsample", choices=["4x", "16x"], default="4x")
    ap.add_argument("--text-hidden", type=int, default=2048)
    ap.add_argument("--smoke", action="store_true", help="tiny widths (to check the script, not to measure)")
    a = ap.parse_args()
    vision = {**VISION, **(SMOKE if a.smoke else {})}
    with tempfile.TemporaryDirectory(dir=a.out_dir) as tmp:
        md = ModelDir.open(vision_checkpoint(Path(tmp) / "vision", a.text_hidden, vision))
        plan = V.plan_mmproj(md, a.text_hidden, downsample=a.downsample)
        final = a.out_dir / f"mmproj-fullsize-{a.downsample}-F16.gguf"
        w = write_gguf(plan, final, "f16")
        w.commit()
    man = read_manifest(a.out_dir)
    files = [f for role, f in man.files.items() if role != "mmproj"]
    files.append(ManifestEntry.of("mmproj", final, final.stat().st_size, w.sha256, "F16"))
    write_manifest(man.path, files, man.source, extra=man.extra)
    print(f"{final}  {final.stat().st_size / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()

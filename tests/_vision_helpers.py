"""Shared helpers for the vision tests: transformers as the reference (processor, features, logits)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ggufbridge.testkit.vision import SPEC_THW, hf_processor, random_image  # noqa: F401  (the tests' names)


def hf_crop_features(ref, pixel_values, target_sizes, downsample: str | None = None) -> list[np.ndarray]:
    """transformers' get_image_features, one crop at a time."""
    import torch

    out, off = [], 0
    for h, w in target_sizes.tolist():
        n = h * w
        with torch.no_grad():
            f = ref.get_image_features(pixel_values[:, :, :, off * 14:(off + n) * 14], torch.tensor([[h, w]]),
                                       downsample_mode=downsample)
        out.append(torch.cat(list(f.pooler_output)).float().numpy())
        off += n
    return out


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def kl_rows(ref_logits: np.ndarray, test_logits: np.ndarray) -> np.ndarray:
    """KL(reference ‖ test) per row."""
    lr, lt = log_softmax(ref_logits.astype(np.float64)), log_softmax(test_logits.astype(np.float64))
    return (np.exp(lr) * (lr - lt)).sum(-1)


def flat_prompt(chunks):
    """Token ids (-1 inside image/frame chunks) and [3, n] positions of a whole prompt from libmtmd's chunks."""
    ids, pos, t = [], [], 0
    for c in chunks:
        if c.kind == "text":
            ids += c.ids
            pos.append(np.tile(np.arange(t, t + len(c.ids)), (3, 1)))
            t += len(c.ids)
        else:
            ids += [-1] * c.n_tokens
            pos.append(c.pos[:3])
            t += c.n_pos
    return ids, np.concatenate(pos, 1)


def refit_head(ck: Path, hidden, targets, boost: float = 30.0) -> None:
    """The least-squares head update of fixtures.confident, in place in the checkpoint folder `ck`: at each row of
    `hidden` (transformers' last hidden states, [n, D]) the token in `targets` ([n]) gets `boost` over the rest."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    hidden, targets = hidden.double(), torch.as_tensor(targets)
    rows = torch.unique(targets)
    delta = torch.linalg.pinv(hidden) @ (boost * (targets[:, None] == rows[None, :]).double())
    index = json.loads((Path(ck) / "model.safetensors.index.json").read_text())
    shard = Path(ck) / index["weight_map"]["lm_head.weight"]
    tensors = load_file(shard)
    head = tensors["lm_head.weight"].double()
    head[rows] += delta.T
    tensors["lm_head.weight"] = head.to(tensors["lm_head.weight"].dtype).contiguous()
    save_file(tensors, shard, metadata={"format": "pt"})


# upstream llama.cpp's conventions for a MiniCPM-V 4.7 mmproj (its converter after our pin; docs/vision.md): the
# projector type names the model, the slice limit sits under clip.vision, none of ggufbridge's clip.minicpmv.* keys
UPSTREAM_PROJECTOR = "minicpmv4_7"
UPSTREAM_MAX_SLICES = "clip.vision.max_slice_nums"


def upstream_convention_copy(out_dir: Path, dst: Path) -> Path:
    """A copy of a converted folder whose mmproj is rewritten to upstream's conventions: projector `minicpmv4_7`,
    `clip.vision.max_slice_nums` (UINT32) instead of our key, every `clip.minicpmv.*` key dropped; the tensors,
    their bytes and every other key as they were. The manifest names the new file's size and hash."""
    import json
    import shutil

    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    from ggufbridge.files import sha256_file

    shutil.copytree(out_dir, dst)
    mm = next(dst.glob("mmproj-*.gguf"))
    r = GGUFReader(str(next(out_dir.glob("mmproj-*.gguf"))), "r")
    tmp = mm.with_suffix(".tmp")
    w = GGUFWriter(str(tmp), arch="clip", endianess=r.endianess)
    max_slices = None
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        if f.name == "clip.minicpmv.max_slice_nums":
            max_slices = int(f.contents())
        if f.name.startswith("clip.minicpmv.") or f.name == UPSTREAM_MAX_SLICES:  # ours also writes upstream's key
            continue
        val = UPSTREAM_PROJECTOR if f.name == "clip.projector_type" else f.contents()
        if f.types[0] == GGUFValueType.ARRAY:
            w.add_key_value(f.name, val, GGUFValueType.ARRAY, f.types[-1])
        else:
            w.add_key_value(f.name, val, f.types[0])
    assert max_slices is not None, "the source mmproj carries clip.minicpmv.max_slice_nums"
    w.add_uint32(UPSTREAM_MAX_SLICES, max_slices)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=list(reversed([int(x) for x in t.shape])),
                     raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(mm)
    manifest = dst / "manifest.json"
    data = json.loads(manifest.read_text())
    for e in data["files"]:
        if e["role"] == "mmproj":
            e["bytes"], e["sha256"] = mm.stat().st_size, sha256_file(mm)
    manifest.write_text(json.dumps(data, indent=2))
    return dst

"""`inspect_gguf(path)`: what a GGUF file is (target, mmproj or draft), its key hyperparameters, where its bytes go,
and, for a DSpark/DFlash draft, how it couples to its target.

The header comes from the bounded reader (ggufbridge.ggufio.reader), so inspecting a 70 GB file reads only its
metadata and tensor table.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from gguf import LlamaFileType

from ggufbridge.ggufio.names import role_of
from ggufbridge.ggufio.reader import GGUFHeader, TensorInfo, read_header
from ggufbridge.quant.report import format_quant_dict, quant_report
from ggufbridge.units import human_size

# --- what to report, per role (data, not branches) ----------------------------------------------------------------

# general.architecture → role; anything else is a text (target) model

# (label, key; "{a}" = the architecture prefix)
HYPERPARAMETERS = {
    "target": [
        ("layers", "{a}.block_count"), ("hidden", "{a}.embedding_length"), ("context", "{a}.context_length"),
        ("attention heads", "{a}.attention.head_count"), ("kv heads", "{a}.attention.head_count_kv"),
        ("head dim", "{a}.attention.key_length"), ("rotary dims", "{a}.rope.dimension_count"),
        ("rope sections", "{a}.rope.dimension_sections"), ("rope theta", "{a}.rope.freq_base"),
        ("experts", "{a}.expert_count"), ("experts used", "{a}.expert_used_count"),
        ("expert ff", "{a}.expert_feed_forward_length"), ("shared expert ff", "{a}.expert_shared_feed_forward_length"),
        ("ssm state", "{a}.ssm.state_size"), ("ssm key heads", "{a}.ssm.group_count"),
        ("ssm value heads", "{a}.ssm.time_step_rank"), ("ssm conv kernel", "{a}.ssm.conv_kernel"),
        ("rms eps", "{a}.attention.layer_norm_rms_epsilon"),
    ],
    "draft": [
        ("layers", "{a}.block_count"), ("hidden", "{a}.embedding_length"), ("ff", "{a}.feed_forward_length"),
        ("attention heads", "{a}.attention.head_count"), ("kv heads", "{a}.attention.head_count_kv"),
        ("head dim", "{a}.attention.key_length"), ("rope theta", "{a}.rope.freq_base"),
        ("rope sections", "{a}.rope.dimension_sections"), ("context", "{a}.context_length"),
        ("rms eps", "{a}.attention.layer_norm_rms_epsilon"),
    ],
    "imatrix": [
        ("chunks", "imatrix.chunk_count"), ("chunk size", "imatrix.chunk_size"), ("datasets", "imatrix.datasets"),
    ],
    "mmproj": [
        ("projector", "clip.projector_type"), ("projector", "clip.vision.projector_type"),
        ("slice size", "clip.vision.image_size"), ("patch size", "clip.vision.patch_size"),
        ("hidden", "clip.vision.embedding_length"), ("ff", "clip.vision.feed_forward_length"),
        ("layers", "clip.vision.block_count"), ("attention heads", "clip.vision.attention.head_count"),
        ("projection dim", "clip.vision.projection_dim"), ("scale factor", "clip.vision.projector.scale_factor"),
        ("insert layer", "clip.vision.wa_layer_indexes"), ("gelu (tanh)", "clip.use_gelu"),
        ("image mean", "clip.vision.image_mean"), ("image std", "clip.vision.image_std"),
        ("layer norm eps", "clip.vision.attention.layer_norm_epsilon"),
    ],
}

# tensor name → component; the first matching pattern wins (vision names first: they contain attn_/ffn_ too)
COMPONENTS = [
    ("vision patch+position embeddings", r"^v\.(patch_embd|position_embd)\."),
    ("vision merger (vit_merger)", r"^v\.vit_merger\."),
    ("vision encoder", r"^v\."),
    ("projector", r"^mm\."),
    ("token embeddings", r"^token_embd\."),
    ("output head", r"^output\."),
    ("markov head", r"^markov_w[12]\."),
    ("confidence head", r"^conf_proj\."),
    ("d2t", r"^d2t$"),
    ("feature fusion (fc)", r"^(fc|enc\.output_norm)\."),
    ("routed experts", r"_exps\."),
    ("shared expert", r"(_shexp|_inp_shexp)\."),
    ("router", r"\.ffn_gate_inp\."),
    ("linear attention", r"\.(attn_qkv|attn_gate|ssm_\w+?)(\.|$)"),
    ("attention", r"\.attn_(q|k|v|output|q_norm|k_norm)\."),
    ("dense ffn", r"\.ffn_(gate|up|down)\."),
    ("norms", r"norm"),
]
_COMPONENTS = [(label, re.compile(p)) for label, p in COMPONENTS]


def component_of(name: str) -> str:
    return next((label for label, rx in _COMPONENTS if rx.search(name)), "other")


@dataclass
class Report:
    path: str
    file_bytes: int
    role: str
    architecture: str
    name: str | None
    file_type: int | None
    hyperparameters: dict[str, object]
    vocab: dict[str, object]
    coupling: dict[str, object] | None
    tensor_count: int
    tensor_bytes: int
    components: list[dict] = field(default_factory=list)  # {"component", "count", "bytes"} in table order
    types: dict[str, int] = field(default_factory=dict)  # GGML type → tensor count
    quantisation: dict | None = None  # target only: ggufbridge.quant.report's per-class table

    def to_dict(self) -> dict:
        return asdict(self)


def _plain(v):
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, list) and len(v) > 16:
        return f"[{len(v)} values]"
    if isinstance(v, float):
        return float(f"{v:.6g}")
    return v


def _coupling(kv: dict, tensors: dict[str, TensorInfo], path: Path) -> dict:
    """The draft's coupling values; the DSpark ones under our `dflash.*` or upstream's `dspark.*` keys."""
    from ggufbridge.ggufio.names import draft_value

    a = "dflash"
    taps = draft_value(kv, "target_layers", path)
    taps = [int(x) for x in taps] if taps is not None else None
    mask = kv.get("tokenizer.ggml.mask_token_id")
    tokens = kv.get("tokenizer.ggml.tokens")
    heads = []
    if "markov_w1.weight" in tensors:
        heads.append(f"markov (rank {tensors['markov_w1.weight'].shape[0]})")
    if "conf_proj.weight" in tensors:
        heads.append("confidence")
    out = {
        "target_layers": taps,
        "hf_target_layer_ids": [t - 1 for t in taps] if taps else None,
        "block_size": draft_value(kv, "block_size", path),
        "mask_token_id": mask,
        "mask_token": tokens[mask] if isinstance(tokens, list) and isinstance(mask, int) and 0 <= mask < len(tokens)
        else None,
        "sample_from_anchor": draft_value(kv, "sample_from_anchor", path),
        "causal": kv.get(f"{a}.attention.causal"),
        "has_confidence_head_key": draft_value(kv, "has_confidence_head", path),
        "heads": heads,
        "speculative_type": "draft-dspark" if "markov_w1.weight" in tensors else "draft-dflash",
        "own_embeddings": "token_embd.weight" in tensors,
        "own_head": "output.weight" in tensors,
        "draft_vocab": tensors["d2t"].shape[0] if "d2t" in tensors else None,
    }
    return out


def inspect_gguf(path: str | Path) -> Report:
    h = read_header(path)
    kv = h.kv
    role = role_of(kv)
    arch = kv.get("general.architecture") if isinstance(kv.get("general.architecture"), str) else "?"
    hp = {}
    for label, key in HYPERPARAMETERS[role]:
        k = key.format(a=arch)
        if k in kv and label not in hp:
            hp[label] = _plain(kv[k])
    rec = kv.get(f"{arch}.attention.recurrent_layers")
    if role == "target" and rec is not None:
        flags = [bool(x) for x in rec]
        hp["layer pattern"] = "".join("L" if f else "F" for f in flags)
    tokens = kv.get("tokenizer.ggml.tokens")
    vocab = {}
    if isinstance(tokens, list):
        vocab = {"tokens": len(tokens), "model": kv.get("tokenizer.ggml.model"), "pre": kv.get("tokenizer.ggml.pre"),
                 "merges": len(kv.get("tokenizer.ggml.merges") or []), "eos": kv.get("tokenizer.ggml.eos_token_id"),
                 "chat_template": "tokenizer.chat_template" in kv}
    by_name = {t.name: t for t in h.tensors}
    comps: dict[str, list[int]] = {}
    types: dict[str, int] = {}
    for t in h.tensors:
        c = comps.setdefault(component_of(t.name), [0, 0])
        c[0] += 1
        c[1] += t.nbytes
        types[t.type] = types.get(t.type, 0) + 1
    order = [label for label, _ in COMPONENTS] + ["other"]
    components = [{"component": k, "count": comps[k][0], "bytes": comps[k][1]} for k in order if k in comps]
    return Report(
        path=str(h.path), file_bytes=h.file_bytes, role=role, architecture=arch,
        name=kv.get("general.name"), file_type=kv.get("general.file_type"),
        hyperparameters=hp, vocab=vocab,
        coupling=_coupling(kv, by_name, h.path) if role == "draft" else None,
        tensor_count=len(h.tensors), tensor_bytes=sum(t.nbytes for t in h.tensors),
        components=components, types=dict(sorted(types.items())),
        quantisation=_quantisation(h) if role == "target" else None,
    )


def _quantisation(h: GGUFHeader) -> dict:
    return quant_report(h).to_dict()


def file_type_name(ft: int) -> str:
    try:
        return LlamaFileType(ft).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return "unknown"


def format_report(r: Report) -> str:
    lines = [
        f"file          {r.path}  ({human_size(r.file_bytes)})",
        f"role          {r.role}",
        f"architecture  {r.architecture}",
    ]
    if r.name:
        lines.append(f"name          {r.name}")
    if r.file_type is not None:
        lines.append(f"file type     {file_type_name(r.file_type)} ({r.file_type})")
    lines.append("hyperparameters")
    lines += [f"  {k:<18} {v}" for k, v in r.hyperparameters.items()]
    if r.vocab:
        v = r.vocab
        lines.append(f"vocabulary    {v['tokens']} tokens, {v['model']}/{v['pre']}, {v['merges']} merges"
                     + (", chat template" if v["chat_template"] else ""))
    if r.coupling:
        c = r.coupling
        lines.append("coupling (draft → target)")
        lines.append(f"  {'target layers':<18} {c['target_layers']} (HF target_layer_ids {c['hf_target_layer_ids']})")
        lines.append(f"  {'block size':<18} {c['block_size']}")
        mask = f" {c['mask_token']!r}" if c["mask_token"] is not None else ""
        lines.append(f"  {'mask token id':<18} {c['mask_token_id']}{mask}")
        lines.append(f"  {'sample from anchor':<18} {c['sample_from_anchor']}")
        causal = c["causal"] if c["causal"] is not None else "not set (non-causal block attention)"
        lines.append(f"  {'causal':<18} {causal}")
        lines.append(f"  {'heads':<18} {', '.join(c['heads']) or 'none'}  → --spec-type {c['speculative_type']}")
        own = [n for n, f in (("embeddings", c["own_embeddings"]), ("output head", c["own_head"])) if f]
        lines.append(f"  {'own':<18} {', '.join(own) if own else 'none (shares the target embeddings and head)'}"
                     + (f"; draft vocabulary {c['draft_vocab']} (d2t)" if c["draft_vocab"] else ""))
    lines.append(f"tensors       {r.tensor_count}, {human_size(r.tensor_bytes)}")
    for c in r.components:
        lines.append(f"  {c['component']:<34} {c['count']:>6}  {human_size(c['bytes']):>12}")
    lines.append("types         " + ", ".join(f"{k} × {v}" for k, v in r.types.items()))
    if r.quantisation:
        lines.append(format_quant_dict(r.quantisation))
    return "\n".join(lines)

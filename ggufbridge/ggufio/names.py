"""GGUF tensor names and metadata keys. They come from gguf-py's constants (`gguf.Keys`, `gguf.TENSOR_NAMES`,
`gguf.MODEL_TENSORS`), so a misspelt name fails at import or in tests/test_gguf_names.py, not when llama.cpp loads
the file. Below them, a local table of only what gguf 0.19 does not have: the `dflash` (DFlash/DSpark draft)
architecture, the MiniCPM-V 4.6/4.7 window merger (`v.vit_merger.*`), the `clip.minicpmv.*` keys read by
ggufbridge's patch series (docs/patches.md), and qwen35moe's per-layer recurrent flags.
"""

from __future__ import annotations

from gguf import MODEL_ARCH, MODEL_ARCH_NAMES, MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES, Keys  # noqa: F401  (re-exported)

from ggufbridge.errors import GGUFFileError

LAYER = "blk.{bid}."


def key(template: str, arch: str) -> str:
    """A gguf.Keys template (`{arch}.block_count`) for one architecture."""
    return template.format(arch=arch)


def tensor(t: MODEL_TENSOR, suffix: str | None = "weight") -> str:
    """The GGUF name of a global tensor (`token_embd.weight`), or of a per-layer one without its `blk.N.` prefix
    (`attn_norm.weight`: the converters' tables add the layer)."""
    name = TENSOR_NAMES[t].removeprefix(LAYER)
    return f"{name}.{suffix}" if suffix else name


def known_tensor_names(arch: MODEL_ARCH, n_layer: int) -> set[str]:
    """Every tensor name (without .weight/.bias) gguf lists for `arch`, formatted for layers 0..n_layer-1."""
    out = set()
    for t in MODEL_TENSORS[arch]:
        name = TENSOR_NAMES[t]
        out |= {name.format(bid=i) for i in range(n_layer)} if "{bid}" in name else {name}
    return out


def known_keys(arch: str) -> set[str]:
    """Every metadata key gguf.Keys defines, formatted for `arch`."""
    out: set[str] = set()

    def walk(cls) -> None:
        for k, v in vars(cls).items():
            if k.startswith("_"):
                continue
            if isinstance(v, str):
                out.add(v.replace("{arch}", arch))  # some templates hold other fields too ({dense}, {id})
            elif isinstance(v, type):
                walk(v)

    walk(Keys)
    return out


# --- what gguf 0.19 lacks --------------------------------------------------------------------------------------

# qwen35moe: which layers are gated delta-net (recurrent) rather than full attention (docs/formats.md, "Target")
RECURRENT_LAYERS = "{arch}.attention.recurrent_layers"

# MiniCPM-V 4.6/4.7 mmproj: the window-attention merger's tensors (runtime projector minicpmv4_6, docs/formats.md)
VIT_MERGER_TENSORS = ("ln1", "attn_q", "attn_k", "attn_v", "attn_out", "ds_ln", "ds_ffn_up", "ds_ffn_down")
VIT_MERGER = "v.vit_merger."
# the projector types of the MiniCPM-V 4.6/4.7 vision tower: the pinned runtime's name (ggufbridge writes it), and
# upstream llama.cpp's name for 4.7 (its converter after our pin writes it; loaded by our patch series, docs/vision.md)
PROJECTOR_MINICPMV4_6 = "minicpmv4_6"
PROJECTOR_MINICPMV4_7 = "minicpmv4_7"
CLIP_PROJECTOR_TYPE = "clip.projector_type"
CLIP_VISION_PROJECTOR_TYPE = "clip.vision.projector_type"  # the loader's fallback for mixed-modality files
# upstream's minicpmv4_7 files carry the processor's slice limit here (UINT32)
UPSTREAM_MAX_SLICE_NUMS = "clip.vision.max_slice_nums"
# ... and the keys ggufbridge's patched libmtmd reads (a stock runtime ignores them)
MINICPMV_PROCESSOR_SLICING = "clip.minicpmv.processor_slicing"
MINICPMV_MAX_SLICE_NUMS = "clip.minicpmv.max_slice_nums"
MINICPMV_CANVAS_MROPE = "clip.minicpmv.canvas_mrope"
MINICPMV_USE_IMAGE_ID = "clip.minicpmv.use_image_id"
# ... and upstream llama.cpp's key for the processor's slice cap (its converter writes it for minicpmv4_6 and
# minicpmv4_7 after our pin; docs/vision.md, "Which llama.cpp runs which file"): written beside ours, same value
CLIP_VISION_MAX_SLICE_NUMS = "clip.vision.max_slice_nums"
# ... and the video processor settings ggufbridge's video reader samples clips with (the runtime ignores them)
MINICPMV_VIDEO_MAX_NUM_FRAMES = "clip.minicpmv.video.max_num_frames"
MINICPMV_VIDEO_STACK_FRAMES = "clip.minicpmv.video.stack_frames"
MINICPMV_KEYS = (MINICPMV_PROCESSOR_SLICING, MINICPMV_MAX_SLICE_NUMS, MINICPMV_CANVAS_MROPE, MINICPMV_USE_IMAGE_ID,
                 MINICPMV_VIDEO_MAX_NUM_FRAMES, MINICPMV_VIDEO_STACK_FRAMES, CLIP_VISION_MAX_SLICE_NUMS)

# DFlash/DSpark draft (`dflash`, docs/formats.md, "Draft"): its own keys, and the tensors beside the usual blk.N.* ones
DFLASH_ARCH = "dflash"
DFLASH_TARGET_LAYERS = "{arch}.target_layers"
DFLASH_BLOCK_SIZE = "{arch}.block_size"
DFLASH_SAMPLE_FROM_ANCHOR = "{arch}.sample_from_anchor"
DFLASH_HAS_CONFIDENCE_HEAD = "{arch}.has_confidence_head"
DFLASH_KEYS = (DFLASH_TARGET_LAYERS, DFLASH_BLOCK_SIZE, DFLASH_SAMPLE_FROM_ANCHOR, DFLASH_HAS_CONFIDENCE_HEAD)
# Drafts written by upstream llama.cpp's converter after our pin store the same DSpark values as `dspark.*`
# (docs/gguf-files.md, "Drafts from other converters"): each value and the keys that may hold it, ours first
DSPARK_UPSTREAM_PREFIX = "dspark."
DRAFT_KEYS = {t.removeprefix("{arch}."): (key(t, "dflash"), DSPARK_UPSTREAM_PREFIX + t.removeprefix("{arch}."))
              for t in DFLASH_KEYS}
DFLASH_TENSORS = ("fc", "enc.output_norm", "markov_w1", "markov_w2", "conf_proj", "d2t")

# ggufbridge's own keys in a quantised target (written through llama-quantize --override-kv): the mix it was made
# with, the llama-quantize file type, and the tensors that fell back to another type
QUANT_MIX = "ggufbridge.quant.recipe"  # the key's text predates the name "mix"; files in the wild carry it
QUANT_TYPE = "ggufbridge.quant.type"
QUANT_FALLBACKS = "ggufbridge.quant.fallbacks"

# what a GGUF is, by its architecture (`general.architecture`); anything else with a qwen35moe-like header is the target
ROLE_OF_ARCH = {DFLASH_ARCH: "draft", "clip": "mmproj"}
TARGET_ARCH = MODEL_ARCH_NAMES[MODEL_ARCH.QWEN35MOE]  # the MiniCPM-V 4.7 text model's: "qwen35moe"


def draft_value(kv: dict, name: str, where) -> object:
    """The draft's DSpark value `name` (a DRAFT_KEYS entry) under either key convention; None when absent. Both
    present with different values: GGUFFileError naming both."""
    ours, theirs = (kv.get(k) for k in DRAFT_KEYS[name])
    plain = [v.tolist() if hasattr(v, "tolist") else v for v in (ours, theirs)]
    if ours is not None and theirs is not None and plain[0] != plain[1]:
        raise GGUFFileError(f"{where}: {DRAFT_KEYS[name][0]} = {plain[0]} and {DRAFT_KEYS[name][1]} = {plain[1]} "
                            f"disagree")
    return ours if ours is not None else theirs


def upstream_draft_keys(kv: dict) -> list[str]:
    """The `dspark.*` keys a draft holds without their `dflash.*` twin (what a runtime reading `dflash.*` misses)."""
    return [theirs for ours, theirs in DRAFT_KEYS.values() if theirs in kv and ours not in kv]


def role_of(kv: dict) -> str:
    """target, mmproj, draft or imatrix, from a GGUF's metadata."""
    if kv.get("general.type") == "imatrix":  # llama-imatrix's output: no architecture, per-tensor statistics
        return "imatrix"
    arch = kv.get("general.architecture")
    if isinstance(arch, str) and arch in ROLE_OF_ARCH:
        return ROLE_OF_ARCH[arch]
    if "clip.projector_type" in kv or "clip.has_vision_encoder" in kv or kv.get("general.type") == "mmproj":
        return "mmproj"
    return "target"

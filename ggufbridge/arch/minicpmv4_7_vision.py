"""MiniCPM-V 4.7 vision tower (SigLIP + window-attention vit_merger + downsample merger) → mmproj GGUF for the
runtime's `minicpmv4_6` projector.

Facts and their sources: docs/formats.md, "Vision projector". The name tables below are the whole mapping; the only
transform is the position-table expansion to the runtime's hard-coded 70×70 bucket grid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ggufbridge.arch.config import Cfg, check
from ggufbridge.arch.plan import Row, planned
from ggufbridge.ggufio.plan import ConversionPlan, PlannedTensor
from ggufbridge.checkpoint.model_dir import ModelDir, load_json
from ggufbridge.checkpoint.safetensors import to_f32
from ggufbridge.errors import CheckpointError, ConfigError
from ggufbridge.ggufio.names import (CLIP_VISION_MAX_SLICE_NUMS, MINICPMV_CANVAS_MROPE, MINICPMV_MAX_SLICE_NUMS,
                                    MINICPMV_PROCESSOR_SLICING, MINICPMV_USE_IMAGE_ID, MINICPMV_VIDEO_MAX_NUM_FRAMES,
                                    MINICPMV_VIDEO_STACK_FRAMES, Keys)
from ggufbridge.ggufio.names import VIT_MERGER as VIT_MERGER_PREFIX

ARCH = "clip"
# The runtime's projector for MiniCPM-V 4.6 and 4.7 (same graph). Not upstream's newer `minicpmv4_7`: the pinned
# stock runtime does not know that name and would refuse the file, while every build we know of with 4.7 support
# still runs `minicpmv4_6` (docs/vision.md, "Which llama.cpp runs which file").
PROJECTOR = "minicpmv4_6"
RUNTIME_GRID = 70  # the runtime indexes v.position_embd with a fixed 70×70 bucket grid
DEFAULT_SCALE_RESOLUTION = 448
TOWER = "model.vision_tower."
MERGER = "model.merger.mlp.0."
# downsample mode → (clip.vision.projector.scale_factor, merge factor per side, vit_merger in the graph)
DOWNSAMPLE = {"16x": (4, 4, True), "4x": (2, 2, False)}
# HF hidden_act → the runtime's MLP activation is tanh-GELU only with clip.use_gelu
TANH_GELU = ("gelu_pytorch_tanh", "gelu_new")


@dataclass(frozen=True)
class VisionParams:
    hidden: int  # D
    ff: int  # Fv
    n_layer: int
    n_head: int
    patch: int
    grid: int  # S: side of the HF position grid (vision image_size / patch)
    eps: float
    insert_layer_id: int
    slice_size: int  # processor scale_resolution → clip.vision.image_size
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    downsample: str
    text_hidden: int
    max_slice_nums: int
    use_image_id: bool

    @property
    def scale_factor(self) -> int:
        return DOWNSAMPLE[self.downsample][0]

    @property
    def merge(self) -> int:
        return DOWNSAMPLE[self.downsample][1]

    @property
    def has_vit_merger(self) -> bool:
        return DOWNSAMPLE[self.downsample][2]


def read_preprocessor(md: ModelDir) -> dict:
    path = md.file("preprocessor_config.json")
    return {} if path is None else load_json(path, "the image processor configuration")


# transformers 5.23 MiniCPMV4_6VideoProcessor's defaults for the settings that decide which frames a clip gives
VIDEO_DEFAULTS = {"max_num_frames": 128, "stack_frames": 1}
MAX_VIDEO_FRAMES = 4096  # main frames per clip: more is a broken config, not a model setting


def read_video_settings(md: ModelDir) -> dict[str, int]:
    """`max_num_frames` and `stack_frames` of the checkpoint's video processor, looked up as transformers 5.23
    does (processor_config.json's "video_processor", else video_preprocessor_config.json, else
    preprocessor_config.json); its defaults where absent."""
    cfg, where = None, "video processor"
    path = md.file("processor_config.json")
    if path is not None:
        nested = load_json(path, "the processor configuration").get("video_processor")
        if isinstance(nested, dict):
            cfg, where = nested, "processor_config.json: video_processor"
    for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
        path = md.file(name)
        if cfg is None and path is not None:
            cfg, where = load_json(path, "the video processor configuration"), name
    c = Cfg(cfg or {}, where)
    out = {k: c.positive(k, v) for k, v in VIDEO_DEFAULTS.items()}
    check(out["max_num_frames"] <= MAX_VIDEO_FRAMES,
          f"{where}: max_num_frames must be at most {MAX_VIDEO_FRAMES}, found {out['max_num_frames']}")
    return out


def _triple(pre: Cfg, key: str) -> tuple[float, float, float]:
    val = pre.get(key, list, [0.5, 0.5, 0.5])
    check(len(val) == 3 and all(isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) <= 1e6
                                and math.isfinite(v) for v in val),
          f"{pre.where}: {key} must be 3 finite numbers (RGB), found {str(val)[:80]}")
    if key == "image_std":
        check(all(v > 0 for v in val), f"{pre.where}: image_std must be positive, found {val!r}")
    return tuple(float(v) for v in val)


def read_params(md: ModelDir, text_hidden: int, downsample: str | None = None) -> VisionParams:
    root = Cfg(md.config)
    v = root.sub("vision_config")
    pre = Cfg(read_preprocessor(md), "preprocessor_config.json")
    hidden = v.positive("hidden_size")
    ff = v.positive("intermediate_size")
    n_head = v.positive("num_attention_heads")
    patch = v.positive("patch_size", 14)
    n_layer = v.positive("num_hidden_layers")
    img = v.positive("image_size", 980)
    check(hidden % n_head == 0,
          f"{v.where}: hidden_size ({hidden}) must be a multiple of num_attention_heads ({n_head})")
    check(img % patch == 0, f"{v.where}: image_size ({img}) must be a multiple of patch_size ({patch})")
    # The runtime swaps fc1/fc2 whenever ffn_down's row length equals the hidden size (legacy-export fix), which a
    # correct file with intermediate_size == hidden_size would trigger: the result would be silently wrong.
    check(ff != hidden, f"{v.where}: intermediate_size must differ from hidden_size ({hidden}) for the llama.cpp "
                        f"projector (it would silently swap fc1/fc2), found {ff}")
    act = v.get("hidden_act", str, "gelu_pytorch_tanh")
    check(act in TANH_GELU, f"{v.where}: hidden_act must be one of {list(TANH_GELU)} (the runtime's SigLIP MLP is "
                            f"tanh-GELU), found {act!r}")
    insert = root.get("insert_layer_id", int, v.get("insert_layer_id", int, 6))
    check(0 <= insert < n_layer, f"config.json: insert_layer_id must be in 0..{n_layer - 1}, found {insert}")
    merger_times = root.get("merger_times", int, 1)
    check(merger_times == 1,
          f"config.json: merger_times must be 1 (the runtime has one final merger), found {merger_times}")
    kernel = root.get("merge_kernel_size", list, [2, 2])
    check(list(kernel) == [2, 2], f"config.json: merge_kernel_size must be [2, 2], found {kernel}")

    # An explicit preprocessor value wins; 4.7 configs may keep downsample_mode in config.json only.
    mode = downsample or pre.get("downsample_mode", str, None) or root.get("downsample_mode", str, "16x")
    check(mode in DOWNSAMPLE, f"downsample mode must be one of {sorted(DOWNSAMPLE)}, found {mode!r}")
    # Processors never read config.json for the slice size: omitted, it is their default (transformers' image
    # processor, sglang, mlx-vlm: 448).
    slice_size = pre.positive("scale_resolution", DEFAULT_SCALE_RESOLUTION)
    pre_patch = pre.positive("patch_size", patch)
    check(pre_patch == patch,
          f"{pre.where}: patch_size must equal vision_config.patch_size ({patch}), found {pre_patch}")
    align = patch * DOWNSAMPLE[mode][1]
    # Warm-up encodes a slice_size² image; slices are aligned to patch·merge, so the slice size must be too.
    check(slice_size % (patch * 4) == 0,
          f"{pre.where}: scale_resolution must be a multiple of {patch * 4} (patch_size·4), found {slice_size}")
    check(slice_size % align == 0, f"{pre.where}: scale_resolution must be a multiple of {align}, found {slice_size}")
    return VisionParams(
        hidden=hidden, ff=ff, n_layer=n_layer, n_head=n_head, patch=patch, grid=img // patch,
        eps=v.positive_float("layer_norm_eps", 1e-6), insert_layer_id=insert, slice_size=slice_size,
        mean=_triple(pre, "image_mean"), std=_triple(pre, "image_std"), downsample=mode, text_hidden=text_hidden,
        max_slice_nums=pre.positive("max_slice_nums", 9), use_image_id=bool(pre.get("use_image_id", bool, True)),
    )


def expand_position_table(table: np.ndarray, grid: int) -> np.ndarray:
    """HF `[grid², D]` → runtime `[70², D]`: runtime bucket b covers [b/70, (b+1)/70); take the HF bucket of
    its centre (exact whenever no HF bucket boundary falls inside a runtime bucket, e.g. when grid divides 70)."""
    if grid == RUNTIME_GRID:
        return table
    src = np.minimum((grid * (np.arange(RUNTIME_GRID) + 0.5) / RUNTIME_GRID).astype(np.int64), grid - 1)
    rows = (src[:, None] * grid + src[None, :]).reshape(-1)
    return np.ascontiguousarray(table[rows])


# --- name tables: Row(GGUF name, HF name, expected HF shape from the params) -----------------------------------
# 4 * hidden / 4 * ff are the 2×2-concatenated widths of the mergers.

GLOBAL = [
    Row("v.patch_embd.weight", TOWER + "embeddings.patch_embedding.weight", lambda p: (p.hidden, 3, p.patch, p.patch)),
    Row("v.patch_embd.bias", TOWER + "embeddings.patch_embedding.bias", lambda p: (p.hidden,)),
    Row("v.post_ln.weight", TOWER + "post_layernorm.weight", lambda p: (p.hidden,)),
    Row("v.post_ln.bias", TOWER + "post_layernorm.bias", lambda p: (p.hidden,)),
    Row("mm.input_norm.weight", MERGER + "pre_norm.weight", lambda p: (4 * p.hidden,)),
    Row("mm.input_norm.bias", MERGER + "pre_norm.bias", lambda p: (4 * p.hidden,)),
    Row("mm.up.weight", MERGER + "linear_1.weight", lambda p: (4 * p.hidden, 4 * p.hidden)),
    Row("mm.up.bias", MERGER + "linear_1.bias", lambda p: (4 * p.hidden,)),
    Row("mm.down.weight", MERGER + "linear_2.weight", lambda p: (p.text_hidden, 4 * p.hidden)),
    Row("mm.down.bias", MERGER + "linear_2.bias", lambda p: (p.text_hidden,)),
]
ATTENTION = [  # a SigLIP attention block: each encoder layer's, and the window merger's
    Row("attn_q.weight", "self_attn.q_proj.weight", lambda p: (p.hidden, p.hidden)),
    Row("attn_q.bias", "self_attn.q_proj.bias", lambda p: (p.hidden,)),
    Row("attn_k.weight", "self_attn.k_proj.weight", lambda p: (p.hidden, p.hidden)),
    Row("attn_k.bias", "self_attn.k_proj.bias", lambda p: (p.hidden,)),
    Row("attn_v.weight", "self_attn.v_proj.weight", lambda p: (p.hidden, p.hidden)),
    Row("attn_v.bias", "self_attn.v_proj.bias", lambda p: (p.hidden,)),
    Row("attn_out.weight", "self_attn.out_proj.weight", lambda p: (p.hidden, p.hidden)),
    Row("attn_out.bias", "self_attn.out_proj.bias", lambda p: (p.hidden,)),
]
LN1 = [
    Row("ln1.weight", "layer_norm1.weight", lambda p: (p.hidden,)),
    Row("ln1.bias", "layer_norm1.bias", lambda p: (p.hidden,)),
]
EVERY_LAYER = ATTENTION + LN1 + [
    Row("ln2.weight", "layer_norm2.weight", lambda p: (p.hidden,)),
    Row("ln2.bias", "layer_norm2.bias", lambda p: (p.hidden,)),
    Row("ffn_up.weight", "mlp.fc1.weight", lambda p: (p.ff, p.hidden)),
    Row("ffn_up.bias", "mlp.fc1.bias", lambda p: (p.ff,)),
    Row("ffn_down.weight", "mlp.fc2.weight", lambda p: (p.hidden, p.ff)),
    Row("ffn_down.bias", "mlp.fc2.bias", lambda p: (p.hidden,)),
]
# only in 16x mode (the runtime skips the window merger when scale_factor is 2): ln1 + attention, then the 2×2
# downsample MLP
VIT_MERGER = [Row(VIT_MERGER_PREFIX + r.gguf, r.source, r.shape) for r in LN1 + ATTENTION] + [
    Row(VIT_MERGER_PREFIX + "ds_ln.weight", "pre_norm.weight", lambda p: (4 * p.hidden,)),
    Row(VIT_MERGER_PREFIX + "ds_ln.bias", "pre_norm.bias", lambda p: (4 * p.hidden,)),
    Row(VIT_MERGER_PREFIX + "ds_ffn_up.weight", "linear_1.weight", lambda p: (4 * p.ff, 4 * p.hidden)),
    Row(VIT_MERGER_PREFIX + "ds_ffn_up.bias", "linear_1.bias", lambda p: (4 * p.ff,)),
    Row(VIT_MERGER_PREFIX + "ds_ffn_down.weight", "linear_2.weight", lambda p: (p.hidden, 4 * p.ff)),
    Row(VIT_MERGER_PREFIX + "ds_ffn_down.bias", "linear_2.bias", lambda p: (p.hidden,)),
]
# Biases the runtime treats as optional (C.2): absent in the checkpoint → simply not written.
OPTIONAL_SUFFIX = ".bias"


def plan_mmproj(md: ModelDir, text_hidden: int, downsample: str | None = None) -> ConversionPlan | None:
    """The mmproj plan, or None when the checkpoint has no vision tower (a text-only release)."""
    if not any(n.startswith(TOWER) for n in md.tensors):
        return None
    p = read_params(md, text_hidden, downsample)
    plan = ConversionPlan(ARCH)
    plan.bool(Keys.Clip.HAS_VISION_ENCODER, True)
    plan.bool(Keys.Clip.HAS_AUDIO_ENCODER, False)
    plan.str(Keys.Clip.PROJECTOR_TYPE, PROJECTOR)
    plan.bool(Keys.ClipVision.USE_GELU, True)
    plan.u32(Keys.ClipVision.EMBEDDING_LENGTH, p.hidden)
    plan.u32(Keys.ClipVision.FEED_FORWARD_LENGTH, p.ff)
    plan.u32(Keys.ClipVision.BLOCK_COUNT, p.n_layer)
    plan.u32(Keys.ClipVision.Attention.HEAD_COUNT, p.n_head)
    plan.f32(Keys.ClipVision.Attention.LAYERNORM_EPS, p.eps)
    plan.u32(Keys.ClipVision.PROJECTION_DIM, p.text_hidden)
    plan.u32(Keys.ClipVision.IMAGE_SIZE, p.slice_size)
    plan.u32(Keys.ClipVision.PATCH_SIZE, p.patch)
    plan.arr(Keys.ClipVision.IMAGE_MEAN, [float(x) for x in p.mean])
    plan.arr(Keys.ClipVision.IMAGE_STD, [float(x) for x in p.std])
    plan.u32(Keys.ClipVision.Projector.SCALE_FACTOR, p.scale_factor)
    plan.arr(Keys.ClipVision.WA_LAYER_INDEXES, [int(p.insert_layer_id)])  # INT32 elements (the runtime insists)
    # read by ggufbridge's patched libmtmd only (the core patches, docs/vision.md): the processor's own slicing,
    # canvas M-RoPE and the <image_id> prefix; a stock runtime ignores unknown keys
    plan.bool(MINICPMV_PROCESSOR_SLICING, True)
    plan.u32(MINICPMV_MAX_SLICE_NUMS, p.max_slice_nums)
    plan.u32(CLIP_VISION_MAX_SLICE_NUMS, p.max_slice_nums)  # upstream's name for it: builds with 4.7 support read it
    plan.bool(MINICPMV_CANVAS_MROPE, True)
    plan.bool(MINICPMV_USE_IMAGE_ID, p.use_image_id)
    # read by ggufbridge's video reader (vision/ffshim.py): the frames a clip contributes
    video = read_video_settings(md)
    plan.u32(MINICPMV_VIDEO_MAX_NUM_FRAMES, video["max_num_frames"])
    plan.u32(MINICPMV_VIDEO_STACK_FRAMES, video["stack_frames"])

    def take(hf: str, want: tuple, gname: str) -> None:
        ref = md.tensors.get(hf)
        if ref is None:
            if gname.endswith(OPTIONAL_SUFFIX):
                return
            raise CheckpointError(f"tensor {hf} is missing from the checkpoint (needed for {gname})")
        # 1-D weights (norms, biases) go F32 (element-wise use); the writer keeps the patch embedding at least F16
        plan.tensors.append(planned(gname, ref, want, force_f32=len(want) == 1))

    for row in GLOBAL:
        take(row.source, row.shape(p), row.gguf)
    pos_name = TOWER + "embeddings.position_embedding.weight"
    pos = md.tensors.get(pos_name)
    if pos is None:
        raise CheckpointError(f"tensor {pos_name} is missing from the checkpoint")
    if pos.shape != (p.grid * p.grid, p.hidden):
        raise CheckpointError(f"tensor {pos_name}: expected shape {[p.grid * p.grid, p.hidden]} from vision_config "
                              f"image_size/patch_size, found {list(pos.shape)}")

    def build_pos():
        return expand_position_table(to_f32(pos.read(), pos.dtype), p.grid), "F32"

    plan.tensors.append(PlannedTensor("v.position_embd.weight", (RUNTIME_GRID ** 2, p.hidden), [pos], build_pos))
    for il in range(p.n_layer):
        for row in EVERY_LAYER:
            take(f"{TOWER}encoder.layers.{il}.{row.source}", row.shape(p), f"v.blk.{il}.{row.gguf}")
    if p.has_vit_merger:
        for row in VIT_MERGER:
            take(f"{TOWER}vit_merger.{row.source}", row.shape(p), row.gguf)
    else:
        plan.note("mmproj: 4x downsampling, vit_merger tensors not written (the runtime skips that stage)")
    if p.grid != RUNTIME_GRID:
        exact = RUNTIME_GRID % p.grid == 0
        plan.note(f"mmproj: position table {p.grid}×{p.grid} expanded to the runtime's 70×70 bucket grid"
                          + ("" if exact else " (bucket centres; not exact for every image size)"))
    out = md.tensors.get(MERGER + "linear_2.weight")
    if out is not None and out.shape[0] != p.text_hidden:
        raise ConfigError(f"mmproj output width (merger linear_2 rows) must equal the text hidden size "
                          f"{p.text_hidden}, found {out.shape[0]}")
    return plan

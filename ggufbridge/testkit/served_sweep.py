"""The served-vision sweep: random pictures of many shapes and clips of many kinds sent to `ggufbridge serve`
through the OpenAI chat API, each chat scored by transformers (teacher-forced on the server's tokens) against the
references docs/vision.md defines: pictures against both of transformers' image processors (PIL, the one the
served path reproduces bit for bit, and torchvision, transformers' default when torchvision is installed), clips
against the video processor as transformers runs it on the CPU. Per case: the largest |Δ log-probability| over
the server's top-5 at every generated position, and whether each served token is the reference's argmax there.

The model is the hard case for a vision path's float noise: a MoE router with a near-tie at every token
(`tie_prone_router`: the experts come in pairs whose router rows differ by `delta`, and the top-k reaches into the
second pair), so that a feature that moves by more than float noise flips an expert somewhere and moves the
log-probabilities by far more than the noise itself. Used by tests/test_served_vision_sweep.py (a few cases) and
python -m benchmarks.served_vision_table --sweep (the full table in docs/vision.md).
"""

from __future__ import annotations

import base64
import dataclasses
import json
from fractions import Fraction
from pathlib import Path

import numpy as np

from ggufbridge.testkit import served_chat as sc
from ggufbridge.testkit.vision import SPEC_THW, hf_processor, hf_video_processor, make_clip, random_image

SLICE = 224  # a small slice keeps the tower cheap while the processor still picks every grid up to 9 slices
# top-3 of 8 experts: the best pair, then one member of the second pair, whose two router rows nearly tie
SPEC = dataclasses.replace(SPEC_THW, slice_size=SLICE, linear_k_dim=16, linear_v_dim=16, experts=8, top_k=3)
# relative difference of the paired router rows (tie_prone_router). The margin that decides a pair scales with
# it; float32 rounding moves a margin by ~1e-7 (transformers float32 vs float64: median 7e-8, p99 4e-7 to 6e-7),
# an F16 projector by ~1e-5 (median; p90 4e-5). At 5e-4, 6 of the 1,584 scored (position, layer) margins of the
# sweep's and the suite's 66 pictures were below 1e-6, and one (93x248, layer 0, 5.5e-8, ~1 ulp) made transformers
# float32 and float64 differ by 1.05 in log-probability: a bound no float32 runtime can be held to. At 1e-2 the
# smallest is 9.5e-7 (that same token), float32 and float64 agree within 2e-5 on all 66, and the F16 projector
# still breaks the bound on 16 of them (benchmarks/router_delta.py; docs/vision.md, "The references")
ROUTER_DELTA = 0.01
TOP = 5
N_TOKENS = 6
TOLERANCE = 0.02
QUESTION = "What is in the picture?"
VIDEO_QUESTION = "What happens in the clip?"
BACKENDS = ("pil", "torchvision")


def tie_prone_router(ck: Path, delta: float = ROUTER_DELTA, seed: int = 0) -> None:
    """Make the checkpoint's MoE routers tie-prone, in place: router row 2i+1 becomes row 2i plus `delta`·(its
    norm) of random direction, so the two experts of a pair score within ~delta of each other at every token and
    a top-k that ends inside a pair (SPEC: top-3) decides between them on a near-tie."""
    import torch
    from safetensors.torch import load_file, save_file

    index = json.loads((Path(ck) / "model.safetensors.index.json").read_text())
    gen = torch.Generator().manual_seed(seed)
    by_shard: dict[str, list[str]] = {}
    for name, shard in index["weight_map"].items():
        if name.startswith("model.language_model.") and name.endswith(".mlp.gate.weight"):
            by_shard.setdefault(shard, []).append(name)
    if not by_shard:
        raise ValueError(f"{ck}: no MoE router weights (*.mlp.gate.weight) in the checkpoint")
    for shard, names in by_shard.items():
        tensors = load_file(Path(ck) / shard)
        for name in names:
            w = tensors[name].double()
            for e in range(0, w.shape[0] - 1, 2):
                noise = torch.randn(w.shape[1], generator=gen, dtype=torch.float64)
                w[e + 1] = w[e] + delta * w[e].norm() * noise / noise.norm()
            tensors[name] = w.to(tensors[name].dtype).contiguous()
        save_file(tensors, Path(ck) / shard, metadata={"format": "pt"})


def make_model(work: Path, delta: float | None = ROUTER_DELTA):
    """The sweep's checkpoint (tie-prone router unless `delta` is None) and transformers' model of it, with the
    video placeholder pointed at the fixture's (the fixture tokenizer names <unk> for pictures and clips)."""
    from ggufbridge.testkit.checkpoint import load_reference, make_minicpmv47

    ck = Path(work) / ("ck" if delta is not None else "ck-plain")
    if not (ck / "config.json").is_file():
        make_minicpmv47(ck, SPEC, vocab="small")
        if delta is not None:
            tie_prone_router(ck, delta)
    ref = load_reference(ck)
    ref.config.video_token_id = ref.model.config.video_token_id = ref.config.image_token_id
    return ck, ref


# --- cases ----------------------------------------------------------------------------------------------------

def picture_sizes(n: int, seed: int = 43) -> list[tuple[int, int]]:
    """`n` distinct random picture sizes (w, h) from 40 to 1000 px a side, tall, wide and square alike: with the
    224 px slice they cover the unsliced case and every grid up to the 9-slice limit."""
    rng = np.random.default_rng(seed)
    out: list[tuple[int, int]] = []
    while len(out) < n:
        area = float(np.exp(rng.uniform(np.log(40 * 40), np.log(900 * 900))))
        aspect = float(np.exp(rng.uniform(np.log(1 / 4), np.log(4))))
        w, h = int(round(np.sqrt(area * aspect))), int(round(np.sqrt(area / aspect)))
        if 40 <= w <= 1000 and 40 <= h <= 1000 and (w, h) not in out:
            out.append((w, h))
    return out


@dataclasses.dataclass(frozen=True)
class Clip:
    frames: int
    fps: Fraction | int
    size: tuple[int, int]  # (w, h)
    codec: str = "mpeg4"

    @property
    def suffix(self) -> str:
        # containers that store a frame count: transformers' reader samples from it
        return ".avi" if self.codec == "mjpeg" else ".mp4"

    @property
    def name(self) -> str:
        fps = f"{float(self.fps):.2f}".rstrip("0").rstrip(".")
        return f"{self.size[0]}x{self.size[1]} {fps} fps {self.frames} fr {self.codec}"


# sizes (unsliced, 1×2, 2×1, 2×2 and larger grids), frame rates (2 to 60, NTSC), lengths (1 to 6 s: one main
# frame per started second) and codecs
CLIPS = [
    Clip(8, 2, (112, 112)),
    Clip(20, 10, (250, 130), "libx264"),
    Clip(75, Fraction(30000, 1001), (130, 250)),
    Clip(30, 10, (448, 448), "libx264"),
    Clip(50, 25, (320, 180), "mpeg2video"),
    Clip(24, 24, (640, 360), "libx264"),
    Clip(120, 60, (200, 300), "mpeg4"),
    Clip(12, 4, (96, 400), "libvpx-vp9"),
    Clip(15, 5, (500, 260), "mjpeg"),
    Clip(90, 15, (176, 144), "libx264"),
    Clip(6, 1, (300, 700), "mpeg4"),
    Clip(40, 20, (720, 480), "libvpx-vp9"),
]


def write_clip(clip: Clip, path: Path, seed: int) -> Path:
    pix = "yuvj420p" if clip.codec == "mjpeg" else "yuv420p"
    return make_clip(path.with_suffix(clip.suffix), clip.frames, clip.fps, w=clip.size[0], h=clip.size[1],
                     codec=clip.codec, seed=seed, pix_fmt=pix)


# --- scoring ----------------------------------------------------------------------------------------------------

def deviation(ref_lp: np.ndarray, top: list[dict[int, float]]) -> float:
    """Largest |Δ log-probability| over the server's top-k tokens at every generated position."""
    return max(abs(lp - ref_lp[i, t]) for i, row in enumerate(top) for t, lp in row.items())


def greedy_equal(ref_lp: np.ndarray, ids: list[int], ban: dict[str, bool]) -> bool:
    """Every served (greedy) token is the reference's argmax at its position, teacher-forced, among the tokens the
    request allows (`ban`: its logit_bias)."""
    lp = ref_lp.copy()
    lp[:, [int(k) for k in ban]] = -np.inf
    return all(int(lp[i].argmax()) == t for i, t in enumerate(ids))


def ban_ids(ck: Path) -> dict[str, bool]:
    """logit_bias banning byte fragments and special tokens (see served_chat.partial_utf8_ids): a random model that
    emits the image placeholder would hand transformers a continuation with one image token too many."""
    tok = hf_processor(ck).tokenizer
    return {str(i): False for i in sc.partial_utf8_ids(tok) + list(tok.all_special_ids)}


def float64_twin(ref):
    """transformers' model of the checkpoint in float64 (experts computed eagerly: torch's grouped_mm takes no
    float64). A second correct implementation of the reference whose only difference is rounding."""
    import copy

    twin = copy.deepcopy(ref).double()
    twin.set_experts_implementation("eager")
    return twin


def reference_greedy(ref, inputs, ban: dict, n: int = N_TOKENS) -> list[int]:
    """transformers' own greedy continuation of a processed picture chat (`ban` as the server's logit_bias)."""
    import torch

    prompt, banned, ids = inputs["input_ids"][0].tolist(), [int(k) for k in ban], []
    for _ in range(n):
        tt = torch.cat([inputs["mm_token_type_ids"], torch.zeros(1, len(ids), dtype=torch.long)], 1)
        with torch.no_grad():
            last = ref(input_ids=torch.tensor([prompt + ids]), mm_token_type_ids=tt,
                       pixel_values=inputs["pixel_values"], target_sizes=inputs["target_sizes"]).logits[0, -1]
        last[banned] = -torch.inf
        ids.append(int(last.argmax()))
    return ids


def reference_noise(ck: Path, ref, ref64, size: tuple[int, int], seed: int, ban: dict) -> dict:
    """How far two correct implementations of the reference are apart on one sweep picture: transformers float32
    (the sweep's reference) against its float64 twin, teacher-forced on float32's own greedy tokens (N_TOKENS,
    `ban` as the server's logit_bias). A router whose near-ties fall below float32 rounding makes these two
    disagree as much as any served run can, and then the sweep's bound tests the rounding, not the runtime."""
    inputs = sc.hf_prompt(hf_processor(ck), [sc.user_turn([random_image(*size, seed=seed)], QUESTION)])
    ids = reference_greedy(ref, inputs, ban)
    lp32 = sc.hf_scores(ref, inputs, ids)
    lp64 = sc.hf_scores(ref64, {**inputs, "pixel_values": inputs["pixel_values"].double()}, ids)
    return {"case": f"{size[0]}x{size[1]}", "ids": ids, "dlogp": float(np.abs(lp64 - lp32).max()),
            "greedy": greedy_equal(lp64, ids, ban)}


def picture_row(url: str, ck: Path, ref, size: tuple[int, int], seed: int, ban: dict) -> dict:
    """One picture chat, scored against both image processors."""
    msgs = [sc.user_turn([random_image(*size, seed=seed)], QUESTION)]
    turn = sc.chat(url, msgs, max_tokens=N_TOKENS, top_logprobs=TOP, logit_bias=ban)
    row = {"case": f"{size[0]}x{size[1]}", "prompt_tokens": turn.usage.get("prompt_tokens"), "ids": turn.ids}
    lps, pixels = {}, {}
    for backend in BACKENDS:
        inputs = sc.hf_prompt(hf_processor(ck, image_backend=backend), msgs)
        lps[backend] = sc.hf_scores(ref, inputs, turn.ids)
        pixels[backend] = inputs["pixel_values"]
        row[f"{backend}_tokens"] = int(inputs["input_ids"].shape[1])
        row[f"{backend}_dlogp"] = deviation(lps[backend], turn.top)
        row[f"{backend}_greedy"] = greedy_equal(lps[backend], turn.ids, ban)
    # how far the two references are from each other: their pixels and their log-probabilities (server's top-5)
    d = (pixels["pil"] - pixels["torchvision"]).abs() * 127.5  # back to 8-bit steps (mean = std = 0.5)
    row["ref_pixel_max"] = float(d.max())
    row["ref_pixel_frac"] = float((d > 0.5).float().mean())
    row["ref_gap"] = max(abs(lps["pil"][i, t] - lps["torchvision"][i, t]) for i, r in enumerate(turn.top) for t in r)
    grid = hf_processor(ck).image_processor.get_sliced_grid((size[1], size[0]), 9, SLICE)
    row["grid"] = "unsliced" if grid is None else f"{grid[0]}x{grid[1]}"
    return row


def video_chat_text(question: str = VIDEO_QUESTION) -> str:
    """The prompt the server's chat template renders for one clip + question (thinking off), with the fixture's
    placeholder for the video."""
    return ("<|im_start|>user\n<unk>" + question + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")


def video_scores(ref, want, continuation: list[int]) -> np.ndarray:
    """transformers' log-probabilities for each continuation token, teacher-forced after the video prompt."""
    import torch

    from ggufbridge.compare.metrics import log_softmax

    ids = want["input_ids"][0].tolist()
    full = torch.tensor([ids + continuation[:-1]])
    tt = torch.cat([want["mm_token_type_ids"], torch.zeros(1, len(continuation) - 1, dtype=torch.long)], 1)
    with torch.no_grad():
        logits = ref(input_ids=full, mm_token_type_ids=tt, pixel_values_videos=want["pixel_values_videos"],
                     target_sizes_videos=want["target_sizes_videos"]).logits[0, len(ids) - 1:].double().numpy()
    return log_softmax(logits)


def clip_row(url: str, ck: Path, ref, clip: Clip, path: Path, ban: dict) -> dict:
    """One clip chat (an OpenAI `video_url` part), scored against the video processor."""
    data = "data:video/mp4;base64," + base64.b64encode(path.read_bytes()).decode()
    msgs = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": data}},
                                         {"type": "text", "text": VIDEO_QUESTION}]}]
    turn = sc.chat(url, msgs, max_tokens=N_TOKENS, top_logprobs=TOP, logit_bias=ban)
    proc = hf_processor(ck, video_processor=hf_video_processor(ck))
    want = proc(text=[video_chat_text()], videos=[str(path)], return_tensors="pt")
    lp = video_scores(ref, want, turn.ids)
    return {"case": clip.name, "prompt_tokens": turn.usage.get("prompt_tokens"),
            "video_tokens": int(want["input_ids"].shape[1]), "ids": turn.ids,
            "video_dlogp": deviation(lp, turn.top), "video_greedy": greedy_equal(lp, turn.ids, ban)}


def f32_attention_recipe(work: Path) -> Path:
    """A recipe file: serve's default (the packaged cpu recipe) with the text tower's attention in F32. The cpu
    recipe keeps K/V in F16 and lets flash attention on, and the CPU flash-attention path computes in F16 whatever
    the cache holds (llama-graph casts F32 K/V to F16, Q is converted to F16 for K·Q, V is summed in an F16
    accumulator): on this model that moves the served log-probabilities by 2e-4 to 1.4e-3 from transformers; with
    F32 K/V and flash attention off, by ~1e-5, as transformers float32 is from its float64 twin (docs/vision.md)."""
    path = Path(work) / "recipe-f32-attention.toml"
    path.write_text('base = "cpu"\n\n[server]\ncache_type_k = "f32"\ncache_type_v = "f32"\nflash_attn = "off"\n')
    return path


def sweep(out_dir: Path, ck: Path, ref, pictures: list[tuple[int, int]], clips: list[Clip], work: Path,
          log: Path, progress: bool = False, seeds: list[int] | None = None, f32_attention: bool = True) -> list[dict]:
    """Every picture and clip through one `ggufbridge serve OUT_DIR` session (the user's command), a row each;
    `f32_attention`: with f32_attention_recipe, so that an F32 model is served in F32 throughout (otherwise serve's
    default recipe). Picture k is random_image(seed=seeds[k]), by default seed k (the full sweep's numbering)."""
    import sys

    from tqdm import tqdm

    from ggufbridge.runtime import server as sv

    port = sv.free_port()
    argv = [sys.executable, "-m", "ggufbridge", "serve", str(out_dir), "--port", str(port), "--ctx", "8192",
            "--log", str(log)]
    if f32_attention:
        argv += ["--recipe", str(f32_attention_recipe(work))]
    srv = sv.Server(argv, "127.0.0.1", port, log.with_name(log.name + ".console")).start()
    rows = []
    try:
        srv.wait_ready(300)
        ban = ban_ids(ck)
        bar = tqdm(total=len(pictures) + len(clips), disable=not progress, desc="sweep")
        for k, size in enumerate(pictures):
            seed = k if seeds is None else seeds[k]
            rows.append({"kind": "picture", **picture_row(srv.url, ck, ref, size, seed, ban)})
            bar.update()
        for k, clip in enumerate(clips):
            path = write_clip(clip, Path(work) / f"clip{k}", seed=k)
            rows.append({"kind": "clip", **clip_row(srv.url, ck, ref, clip, path, ban)})
            bar.update()
        bar.close()
    finally:
        srv.stop(60)
    return rows


def _dlogp(x: float) -> str:
    return f"{x:.4f}" if x >= 1e-3 else f"{x:.1e}"  # served in F32 throughout, most cases are ~1e-5


def table(rows: list[dict]) -> str:
    """The sweep as a markdown table: per case the prompt lengths, the deviation and greedy agreement against each
    reference, and for pictures how far the two image references are from each other."""
    lines = ["| case | grid | prompt tokens (served / reference) | vs PIL: max abs dlogp, greedy | "
             "vs torchvision / video processor: max abs dlogp, greedy | PIL vs torchvision: pixels off (max), "
             "max abs dlogp |", "|---|---|---|---|---|---|"]
    for r in rows:
        if r["kind"] == "picture":
            lines.append(f"| {r['case']} | {r['grid']} | {r['prompt_tokens']} / {r['pil_tokens']} | "
                         f"{_dlogp(r['pil_dlogp'])} {'yes' if r['pil_greedy'] else '**no**'} | "
                         f"{_dlogp(r['torchvision_dlogp'])} {'yes' if r['torchvision_greedy'] else '**no**'} | "
                         f"{r['ref_pixel_frac']:.1%} ({r['ref_pixel_max']:.0f}) , {_dlogp(r['ref_gap'])} |")
        else:
            lines.append(f"| {r['case']} | clip | {r['prompt_tokens']} / {r['video_tokens']} | - | "
                         f"{_dlogp(r['video_dlogp'])} {'yes' if r['video_greedy'] else '**no**'} | - |")
    return "\n".join(lines)


def failures(rows: list[dict], tolerance: float = TOLERANCE) -> list[dict]:
    """The rows outside the acceptance: pictures against PIL (the reference the served path reproduces), clips
    against the video processor: prompt length, greedy agreement and |Δ log-probability| <= tolerance."""
    bad = []
    for r in rows:
        key = "pil" if r["kind"] == "picture" else "video"
        want_tokens = r["pil_tokens"] if key == "pil" else r["video_tokens"]
        if r["prompt_tokens"] != want_tokens or not r[f"{key}_greedy"] or not r[f"{key}_dlogp"] <= tolerance:
            bad.append(r)
    return bad

"""Image prompts through llama-cpp-python with MiniCPM-V 4.7's canvas M-RoPE.

The runtime encodes each crop with the mmproj (libmtmd), but its own image path would give image tokens plain
1-D positions (runtime-facts C.5). Here the prompt is laid out by ggufbridge (slicing, `<image_id>` prefixes,
markers), positions are computed by `positions.canvas_positions`, and everything is decoded with the low-level
batch API: embedding batches carry 4 position rows per token (t, h, w, e; section-major), text batches 1.

Attention masking: the runtime's M-RoPE KV cache masks a cached token when its (t, h, w) is lexicographically
greater than the query's (t first, then h, then w), instead of by sequence order. The model attends by sequence
order. So tokens are decoded in ubatches whose (t, h, w) strictly increase and exceed everything decoded before
(there both rules agree); a token below the running maximum (slice tokens after a stretched thumbnail) is
decoded alone with causal masking off, where it sees exactly the cache, i.e. everything before it.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ggufbridge.errors import ManifestError, VisionModelError
from ggufbridge.vision import positions as P
from ggufbridge.vision.preprocess import ImageCrops, SliceConfig, SlicePlan, load_image, make_crops

log = logging.getLogger(__name__)

MARKER_TEXT = {
    "image_start": "<image>", "image_end": "</image>", "slice_start": "<slice>", "slice_end": "</slice>",
    "image_id_start": "<image_id>", "image_id_end": "</image_id>", "image_token": "<unk>", "newline": "\n",
}
N_POS = 4  # position rows per embedding for the IMROPE text model (t, h, w, e)


# --- reading the GGUF files ---------------------------------------------------------------------------------------

def _kv(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


@dataclass(frozen=True)
class MmprojInfo:
    path: Path
    slice_size: int
    patch: int
    scale_factor: int
    out_width: int

    @property
    def merge(self) -> int:
        return self.scale_factor  # patches per LLM token along each side: 4 in 16x mode, 2 in 4x

    @property
    def slice_config(self) -> SliceConfig:
        return SliceConfig(self.slice_size, self.patch, self.merge)


def read_mmproj(path: str | os.PathLike) -> MmprojInfo:
    from gguf import GGUFReader

    p = Path(path)
    try:
        r = GGUFReader(p)
    except Exception as e:  # gguf raises ValueError/struct errors for non-GGUF files
        raise VisionModelError(f"{p}: not a readable GGUF file ({e})") from None
    ptype = _kv(r, "clip.projector_type") or _kv(r, "clip.vision.projector_type")
    if ptype != "minicpmv4_6":
        raise VisionModelError(f"{p}: clip.projector_type must be 'minicpmv4_6', found {ptype!r}")
    down = next((t for t in r.tensors if t.name == "mm.down.weight"), None)
    if down is None:
        raise VisionModelError(f"{p}: tensor mm.down.weight is missing")
    return MmprojInfo(p, int(_kv(r, "clip.vision.image_size")), int(_kv(r, "clip.vision.patch_size")),
                      int(_kv(r, "clip.vision.projector.scale_factor", 4)), int(down.shape[1]))


class TokenEmbeddings:
    """Rows of the text model's `token_embd.weight`, dequantised on demand (for marker tokens decoded as
    embeddings because they carry 2-D canvas positions)."""

    def __init__(self, path: str | os.PathLike):
        from gguf import GGUFReader

        r = GGUFReader(path)
        t = next((t for t in r.tensors if t.name == "token_embd.weight"), None)
        if t is None:
            raise VisionModelError(f"{path}: tensor token_embd.weight is missing")
        self.tensor = t
        self.n_embd = int(t.shape[0])

    def row(self, token: int) -> np.ndarray:
        from gguf import GGMLQuantizationType, quants

        raw = self.tensor.data[token]
        qt = GGMLQuantizationType(self.tensor.tensor_type)
        if qt == GGMLQuantizationType.F32:
            return np.asarray(raw, dtype=np.float32)
        if qt == GGMLQuantizationType.F16:
            return np.asarray(raw, dtype=np.float16).astype(np.float32)
        return quants.dequantize(np.asarray(raw).reshape(1, -1), qt).reshape(-1).astype(np.float32)


# --- which crop sizes reach the encoder unchanged --------------------------------------------------------------

def _c_round(x: float) -> int:
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def _runtime_fit(hw: tuple[int, int], slice_size: int, unit: int, upscale: bool) -> tuple[int, int]:
    """The runtime preprocessor's own area fit (single-precision floats, C rounding)."""
    h, w = hw
    if h * w > slice_size * slice_size or upscale:
        r = np.float32(w) / np.float32(h)
        h = int(np.float32(slice_size) / np.sqrt(r, dtype=np.float32))
        w = int(np.float32(h) * r)
    return (max(_c_round(float(np.float32(h) / np.float32(unit))) * unit, unit),
            max(_c_round(float(np.float32(w) / np.float32(unit))) * unit, unit))


def passes_unchanged(hw: tuple[int, int], info: MmprojInfo) -> bool:
    """True when the runtime's preprocessor hands a crop of this size to the encoder without resizing it.

    Its rules (runtime-facts C.4): in 4x mode a crop of at most slice² pixels is refitted to about slice²
    (upscaling allowed); otherwise a crop with no side above the slice size is squashed to slice×slice, and a
    larger one becomes an "overview" refitted only when its area exceeds slice² (any slices it also cuts are
    ignored). Unchanged means: the refit lands on the crop's own size."""
    h, w = hw
    s, unit = info.slice_size, info.patch * info.merge
    if h % unit or w % unit:
        return False
    if info.scale_factor == 2 and h * w <= s * s:
        return _runtime_fit(hw, s, unit, upscale=True) == (h, w)
    if h <= s and w <= s:
        return h == w == s
    return _runtime_fit(hw, s, unit, upscale=False) == (h, w)


def nearest_passable(hw: tuple[int, int], info: MmprojInfo) -> tuple[int, int]:
    """The passable crop size closest to `hw` (aspect first, then area)."""
    h, w = hw
    unit = info.patch * info.merge
    best, best_key = None, None
    for dh in range(-4, 5):
        for dw in range(-4, 5):
            c = (h + dh * unit, w + dw * unit)
            if c[0] <= 0 or c[1] <= 0 or not passes_unchanged(c, info):
                continue
            key = (abs(math.log((c[1] / c[0]) / (w / h))), abs(c[0] * c[1] - h * w))
            if best_key is None or key < best_key:
                best, best_key = c, key
    if best is None:
        raise VisionModelError(f"no crop size near {h}×{w} reaches the runtime's encoder unchanged")
    return best


def _fit_crop(size, info: MmprojInfo, strict: bool, what: str, notes: list[str], plural: str | None = None):
    """`size` if the runtime takes it unchanged, else the nearest size it does (noted), or refuse with `strict`."""
    if passes_unchanged(size, info):
        return size
    if strict:
        raise VisionModelError(f"{what} {size[0]}×{size[1]} would be resized again by the runtime")
    new = nearest_passable(size, info)
    notes.append(f"{plural or what} {size[0]}×{size[1]} → {new[0]}×{new[1]}")
    return new


def fit_plan(plan: SlicePlan, info: MmprojInfo, strict: bool) -> tuple[SlicePlan, list[str]]:
    """Adjust crop sizes the runtime would resize again (or refuse with `strict`)."""
    notes = []
    source = _fit_crop(plan.source, info, strict, "thumbnail", notes)
    if plan.grid is None:
        return SlicePlan(source), notes
    sl = _fit_crop(plan.slice, info, strict, "slice", notes, plural="slices")
    return SlicePlan(source, plan.grid, (sl[0] * plan.grid[0], sl[1] * plan.grid[1])), notes


# --- runtime logging ----------------------------------------------------------------------------------------------

_LOG_CB = None


def _quiet_runtime_logs() -> None:
    """Route libllama/libmtmd logs to Python logging (errors only) instead of stderr; idempotent."""
    global _LOG_CB
    if _LOG_CB is not None:
        return
    import llama_cpp
    from llama_cpp import mtmd_cpp

    @llama_cpp.llama_log_callback
    def _cb(level, text, user_data):
        if level == 4 and text:  # GGML_LOG_LEVEL_ERROR
            log.error("llama.cpp: %s", text.decode("utf-8", errors="replace").rstrip())

    _LOG_CB = _cb
    llama_cpp.llama_log_set(_cb, None)
    mtmd_cpp.mtmd_log_set(_cb, None)
    mtmd_cpp.mtmd_helper_log_set(_cb, None)


# --- the session ---------------------------------------------------------------------------------------------------

@dataclass
class Prompt:
    ids: list[int]
    visual: list[bool]
    grids: list[tuple[int, int]]  # LLM-token grid of every crop, in prompt order
    embeddings: list[np.ndarray] = field(repr=False)  # one [n_tokens, n_embd] array per crop
    positions: np.ndarray | None = field(default=None, repr=False)  # [3, n]
    next_pos: int = 0
    notes: list[str] = field(default_factory=list)


class VisionSession:
    """A text GGUF + its mmproj loaded through llama-cpp-python. Use as a context manager."""

    def __init__(self, model_path, mmproj_path, *, n_ctx: int = 4096, n_threads: int | None = None,
                 n_batch: int = 512, verbose: bool = False):
        import llama_cpp
        from llama_cpp import mtmd_cpp

        self.info = read_mmproj(mmproj_path)
        if not verbose:
            _quiet_runtime_logs()
        self.llm = llama_cpp.Llama(str(model_path), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                                   n_threads=n_threads, verbose=verbose)
        self._lc = llama_cpp
        self._mt = mtmd_cpp
        self.n_embd = llama_cpp.llama_model_n_embd(self.llm.model)
        if self.info.out_width != self.n_embd:
            self.close()
            raise VisionModelError(f"{self.info.path.name}: mmproj output width must equal the text model's hidden "
                                   f"size {self.n_embd}, found {self.info.out_width}")
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = True
        params.print_timings = False
        params.warmup = False
        if n_threads:
            params.n_threads = n_threads
        self.mctx = mtmd_cpp.mtmd_init_from_file(str(mmproj_path).encode(), self.llm.model, params)
        if not self.mctx:
            self.close()
            raise VisionModelError(f"{mmproj_path}: the runtime could not load the mmproj")
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.tok_embd = TokenEmbeddings(model_path)
        self.markers = {k: self._single_token(v) for k, v in MARKER_TEXT.items()}
        self.n_ctx = n_ctx

    # -- lifecycle
    def close(self) -> None:
        mctx = getattr(self, "mctx", None)
        if mctx:
            self._mt.mtmd_free(mctx)
            self.mctx = None
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.close()
            self.llm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- tokens
    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def _single_token(self, text: str) -> int:
        ids = self.tokenize(text)
        if len(ids) != 1:
            raise VisionModelError(f"the text model's vocabulary must hold {text!r} as one token, found {ids}")
        return ids[0]

    @property
    def marker_ids(self) -> P.Markers:
        m = self.markers
        return P.Markers(m["image_start"], m["image_end"], m["slice_start"], m["slice_end"], m["newline"])

    # -- vision
    def encode_crop(self, crop: np.ndarray) -> np.ndarray:
        """Embeddings [n_tokens, n_embd] of one crop (uint8 [h, w, 3]) that the runtime takes unchanged."""
        h, w = crop.shape[:2]
        if not passes_unchanged((h, w), self.info):
            raise VisionModelError(f"crop {h}×{w} would be resized by the runtime's preprocessor")
        out = self._encode_raw(crop)
        want = (h // (self.info.patch * self.info.merge)) * (w // (self.info.patch * self.info.merge))
        if out.shape[0] != want:
            raise VisionModelError(f"crop {h}×{w}: the runtime made {out.shape[0]} tokens, expected {want}")
        return out

    def _encode_raw(self, crop: np.ndarray) -> np.ndarray:
        """The runtime's embeddings of its first image chunk for this bitmap, after its own preprocessing."""
        mt = self._mt
        h, w = crop.shape[:2]
        data = np.ascontiguousarray(crop, dtype=np.uint8)
        bitmap = mt.mtmd_bitmap_init(w, h, data.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte)))
        chunks = mt.mtmd_input_chunks_init()
        try:
            marker = mt.mtmd_default_marker()
            text = mt.mtmd_input_text(marker, len(marker), False, False)
            rc = mt.mtmd_tokenize(self.mctx, chunks, ctypes.byref(text), (mt.mtmd_bitmap_p_ctypes * 1)(bitmap), 1)
            if rc != 0:
                raise VisionModelError(f"the runtime could not preprocess a {h}×{w} crop (mtmd_tokenize: {rc})")
            chunk = next((c for c in (mt.mtmd_input_chunks_get(chunks, i) for i in range(mt.mtmd_input_chunks_size(chunks)))
                          if mt.mtmd_input_chunk_get_type(c) == mt.MTMD_INPUT_CHUNK_TYPE_IMAGE), None)
            if chunk is None:
                raise VisionModelError("the runtime produced no image chunk")
            n = mt.mtmd_input_chunk_get_n_tokens(chunk)
            rc = mt.mtmd_encode_chunk(self.mctx, chunk)
            if rc != 0:
                raise VisionModelError(f"the runtime failed to encode a {h}×{w} crop (mtmd_encode_chunk: {rc})")
            ptr = mt.mtmd_get_output_embd(self.mctx)
            return np.ctypeslib.as_array(ptr, shape=(n * self.n_embd,)).reshape(n, self.n_embd).copy()
        finally:
            mt.mtmd_input_chunks_free(chunks)
            mt.mtmd_bitmap_free(bitmap)

    def prepare_image(self, image, *, slice_mode: bool = True, strict: bool = False) -> tuple[ImageCrops, list[str]]:
        """PIL image → crops whose sizes the runtime encodes unchanged."""
        from ggufbridge.vision.preprocess import plan_slices

        cfg = self.info.slice_config
        w, h = image.size
        plan, notes = fit_plan(plan_slices((h, w), cfg, slice_mode), self.info, strict)
        return make_crops(image, cfg, slice_mode, plan=plan), notes

    # -- prompt layout
    def image_text(self, crops: ImageCrops, index: int | None) -> str:
        """The placeholder text of one image, as MiniCPM-V 4.7's processor writes it."""
        t = MARKER_TEXT
        grids = crops.token_grids(self.info.slice_config)
        out = f"{t['image_id_start']}{index}{t['image_id_end']}" if index is not None else ""
        out += t["image_start"] + t["image_token"] * (grids[0][0] * grids[0][1]) + t["image_end"]
        if crops.plan.grid is not None:
            rows, cols = crops.plan.grid
            cells = iter(grids[1:])
            out += "\n".join("".join(t["slice_start"] + t["image_token"] * (g[0] * g[1]) + t["slice_end"]
                                     for g in (next(cells) for _ in range(cols))) for _ in range(rows))
        return out

    def build_prompt(self, parts: list, *, use_image_id: bool = True) -> Prompt:
        """`parts`: strings and ImageCrops in order. Returns ids, visual flags, crop grids and embeddings."""
        text, grids, embs = "", [], []
        n_img = 0
        for part in parts:
            if isinstance(part, str):
                text += part
            else:
                text += self.image_text(part, n_img if use_image_id else None)
                grids += part.token_grids(self.info.slice_config)
                embs += [self.encode_crop(c) for c in part.crops]
                n_img += 1
        ids = self.tokenize(text)
        visual = [t == self.markers["image_token"] for t in ids]
        if sum(visual) != sum(g[0] * g[1] for g in grids):
            raise VisionModelError("the prompt text itself contains the image placeholder token; remove it")
        pos, nxt = P.canvas_positions(ids, visual, grids, self.marker_ids)
        return Prompt(ids, visual, grids, embs, pos, nxt)

    # -- decoding
    def reset(self) -> None:
        lc = self._lc
        lc.llama_memory_clear(lc.llama_get_memory(self.llm.ctx), True)

    def _decode(self, kind: str, rows: list[int], ids, embd, pos4, want_logits) -> None:
        lc = self._lc
        n = len(rows)
        b = lc.llama_batch()
        b.n_tokens = n
        keep = []
        if kind == "tok":
            tok = (lc.llama_token * n)(*[ids[i] for i in rows])
            p = (lc.llama_pos * n)(*[int(pos4[0, i]) for i in rows])
            b.token, b.embd = tok, None
            keep += [tok]
        else:
            e = np.ascontiguousarray(np.stack([embd[i] for i in rows]), dtype=np.float32)
            p = (lc.llama_pos * (N_POS * n))(*np.ascontiguousarray(pos4[:, rows]).reshape(-1).tolist())
            b.token = None
            b.embd = e.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            keep += [e]
        seq0 = (lc.llama_seq_id * 1)(0)
        seq_ptrs = (ctypes.POINTER(lc.llama_seq_id) * n)(*([ctypes.cast(seq0, ctypes.POINTER(lc.llama_seq_id))] * n))
        nseq = (ctypes.c_int32 * n)(*([1] * n))
        logits = (ctypes.c_int8 * n)(*[1 if want_logits[i] else 0 for i in rows])
        b.pos, b.seq_id, b.n_seq_id, b.logits = p, seq_ptrs, nseq, logits
        keep += [p, seq0, seq_ptrs, nseq, logits]
        rc = lc.llama_decode(self.llm.ctx, b)
        if rc != 0:
            raise VisionModelError(f"llama_decode failed ({rc}) on {n} {'text' if kind == 'tok' else 'embedding'} "
                                   f"tokens at t={int(pos4[0, rows[0]])}")

    def schedule(self, prompt: Prompt, start_max: tuple | None = None) -> list[tuple[str, bool, list[int]]]:
        """Split the prompt into decode steps (kind, causal, token indices); see the module docstring."""
        n = len(prompt.ids)
        pos = prompt.positions
        pinned = _pinned(prompt)
        steps: list[tuple[str, bool, list[int]]] = []
        running = start_max
        cur: list[int] = []
        cur_kind = None

        def flush():
            nonlocal cur
            if cur:
                steps.append((cur_kind, True, cur))
            cur = []

        for i in range(n):
            key = (int(pos[0, i]), int(pos[1, i]), int(pos[2, i]))
            kind = "embd" if pinned[i] else "tok"
            if running is not None and key < running:
                flush()
                steps.append((kind, False, [i]))
                continue
            if running is not None and key == running or kind != cur_kind or len(cur) >= self.llm.n_batch:
                flush()
                cur_kind = kind
            cur.append(i)
            running = key
        flush()
        return steps

    def eval_prompt(self, prompt: Prompt, logits_for=None) -> np.ndarray | None:
        """Decode a prompt from an empty cache. Returns logits [len(logits_for), n_vocab] (rows for the given
        token indices, default: the last token)."""
        lc = self._lc
        n = len(prompt.ids)
        if prompt.next_pos + 1 > self.n_ctx or n > self.n_ctx:
            raise VisionModelError(f"the prompt needs {max(n, prompt.next_pos)} positions, the context has {self.n_ctx}")
        self.reset()
        idx = [n - 1] if logits_for is None else list(logits_for)
        want = np.zeros(n, dtype=bool)
        want[idx] = True
        embd = [None] * n
        crop_iter = iter(prompt.embeddings)
        for a, b in P.visual_runs(prompt.visual):
            e = next(crop_iter)
            for k, i in enumerate(range(a, b)):
                embd[i] = e[k]
        pos4 = np.zeros((N_POS, n), dtype=np.int64)
        pos4[:3] = prompt.positions
        for i in np.flatnonzero(_pinned(prompt)):
            if embd[i] is None:
                embd[i] = self.tok_embd.row(prompt.ids[i])
        out = {}
        for kind, causal, rows in self.schedule(prompt):
            lc.llama_set_causal_attn(self.llm.ctx, causal)
            try:
                self._decode(kind, rows, prompt.ids, embd, pos4, want)
            finally:
                lc.llama_set_causal_attn(self.llm.ctx, True)
            for j, i in enumerate(rows):
                if want[i]:
                    ptr = lc.llama_get_logits_ith(self.llm.ctx, j)
                    out[i] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()
        return np.stack([out[i] for i in idx])

    def generate(self, prompt: Prompt, n_predict: int = 256, temp: float = 0.0, seed: int = 0) -> list[int]:
        lc = self._lc
        logits = self.eval_prompt(prompt)[0]
        rng = np.random.default_rng(seed)
        pos = prompt.next_pos
        out: list[int] = []
        for _ in range(n_predict):
            tok = _sample(logits, temp, rng)
            if lc.llama_vocab_is_eog(self.vocab, tok):
                break
            out.append(tok)
            if pos + 1 > self.n_ctx:
                break
            pos4 = np.full((N_POS, 1), pos, dtype=np.int64)
            self._decode("tok", [0], [tok], None, pos4, np.array([True]))
            logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(self.llm.ctx, 0), shape=(self.n_vocab,)).copy()
            pos += 1
        return out

    def detokenize(self, ids: list[int]) -> str:
        return self.llm.detokenize(ids).decode("utf-8", errors="replace")


def _pinned(prompt: Prompt) -> np.ndarray:
    """Tokens that must go in as embeddings: visual ones, and text whose position is not a plain 1-D step past
    every earlier token (a text batch carries one position and must start past the cache's last t)."""
    pos = prompt.positions
    n = len(prompt.ids)
    out = np.zeros(n, dtype=bool)
    last_t = -1
    for i in range(n):
        t = int(pos[0, i])
        out[i] = prompt.visual[i] or not (t == pos[1, i] == pos[2, i]) or t <= last_t
        last_t = max(last_t, t)
    return out


def _sample(logits: np.ndarray, temp: float, rng) -> int:
    if temp <= 0:
        return int(np.argmax(logits))
    z = (logits - logits.max()) / temp
    p = np.exp(z)
    return int(rng.choice(len(p), p=p / p.sum()))


def chat_parts(images: list, prompt: str) -> list:
    """ChatML user turn with the images first, then the question (MiniCPM-V's usual order)."""
    parts: list = ["<|im_start|>user\n"]
    for img in images:
        parts += [img, "\n"]
    parts.append(f"{prompt}<|im_end|>\n<|im_start|>assistant\n")
    return parts


def resolve_files(out_dir) -> tuple[Path, Path]:
    """The target and mmproj GGUFs of a `ggufbridge convert` output folder (from manifest.json)."""
    from ggufbridge.ggufio.manifest import read_manifest

    d = Path(out_dir)
    try:
        files = read_manifest(d).files
    except ManifestError as e:
        raise VisionModelError(str(e)) from None
    if "mmproj" not in files:
        raise VisionModelError(f"{d}: manifest.json lists no mmproj file (converted with --no-mmproj?)")
    for role in ("target", "mmproj"):
        if not files[role].path.is_file():
            raise VisionModelError(f"{files[role].path}: listed in manifest.json but missing")
    return files["target"].path, files["mmproj"].path


def run_image(out_dir, image, prompt: str, *, n_predict: int = 256, temp: float = 0.0, seed: int = 0,
              n_ctx: int = 4096, n_threads: int | None = None, strict: bool = False,
              max_pixels: int | None = None) -> str:
    """Answer `prompt` about one image file (or several: pass a list) with canvas M-RoPE positions."""
    paths = image if isinstance(image, (list, tuple)) else [image]
    kw = {} if max_pixels is None else {"max_pixels": max_pixels}
    pil = [load_image(p, **kw) for p in paths]  # bad inputs fail before any model is loaded
    model, mmproj = resolve_files(out_dir)
    with VisionSession(model, mmproj, n_ctx=n_ctx, n_threads=n_threads) as s:
        crops = []
        for img in pil:
            c, notes = s.prepare_image(img, strict=strict)
            for note in notes:
                log.warning("image crop adjusted for the runtime: %s", note)
            crops.append(c)
        pr = s.build_prompt(chat_parts(crops, prompt))
        return s.detokenize(s.generate(pr, n_predict=n_predict, temp=temp, seed=seed))

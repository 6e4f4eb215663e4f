"""Image prompts through llama-cpp-python on the patched runtime: libmtmd lays them out, we decode.

With the core part of ggufbridge's patch series libmtmd itself slices an image as MiniCPM-V 4.7's processor
does, writes `<image_id>N</image_id>`, and turns the frame (markers and crops) into one chunk whose tokens carry
canvas M-RoPE positions (`mtmd_image_tokens_get_decoder_pos`). This module is the low-level window onto that
path, for tests and measurements: it tokenizes a prompt with libmtmd, encodes the image chunks, and decodes
everything with the batch API in ubatches of any size (the patched KV cache masks tokens of equal t by decode
order, so batching is exact), returning logits at every position. The product path is llama-server
(`ggufbridge serve` / `run --image`), which runs the same libmtmd code.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ggufbridge.errors import GGUFFileError, VisionModelError
from ggufbridge.ggufio import names

log = logging.getLogger(__name__)

N_POS = 4  # position rows per embedding for the IMROPE text model (t, h, w, e)


# --- reading the GGUF files ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MmprojInfo:
    path: Path
    out_width: int  # mm.down's rows: must equal the text model's hidden size


def read_mmproj(path: str | os.PathLike) -> MmprojInfo:
    """The mmproj's projector and output width, from the bounded header reader (no tensor data is read)."""
    from ggufbridge.ggufio.reader import read_header

    p = Path(path)
    try:
        h = read_header(p)
    except (GGUFFileError, OSError) as e:
        raise VisionModelError(f"{p}: not a readable GGUF file ({e})") from None
    ptype = h.kv.get(names.CLIP_PROJECTOR_TYPE) or h.kv.get(names.CLIP_VISION_PROJECTOR_TYPE)
    if ptype not in (names.PROJECTOR_MINICPMV4_6, names.PROJECTOR_MINICPMV4_7):
        raise VisionModelError(f"{p}: clip.projector_type must be 'minicpmv4_6' or 'minicpmv4_7', found {ptype!r}")
    down = next((t for t in h.tensors if t.name == "mm.down.weight"), None)
    if down is None:
        raise VisionModelError(f"{p}: tensor mm.down.weight is missing")
    return MmprojInfo(p, int(down.shape[1]))


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
class Chunk:
    """One chunk of a tokenized prompt. Text: `ids`. Image: `embd` [n, n_embd] (markers and crops, in order),
    `pos` [4, n] absolute positions, `n_pos` (how far the chunk advances the running position)."""

    kind: str  # "text" | "image"
    ids: list[int] = field(default_factory=list)
    embd: np.ndarray | None = field(default=None, repr=False)
    pos: np.ndarray | None = field(default=None, repr=False)
    n_pos: int = 0

    @property
    def n_tokens(self) -> int:
        return len(self.ids) if self.kind == "text" else int(self.embd.shape[0])


@dataclass
class Evaluated:
    chunks: list[Chunk]
    logits: np.ndarray = field(repr=False)  # [n_tokens, n_vocab], a row per prompt token
    n_decode_calls: int = 0


class VisionSession:
    """A text GGUF + its mmproj loaded through llama-cpp-python. Use as a context manager."""

    def __init__(self, model_path, mmproj_path, *, n_ctx: int = 4096, n_threads: int | None = None,
                 n_batch: int = 512, verbose: bool = False, f32_kv: bool = False):
        import llama_cpp
        from llama_cpp import mtmd_cpp

        self.info = read_mmproj(mmproj_path)
        if not verbose:
            _quiet_runtime_logs()
        # f32_kv: an F32 K/V cache (type 0 = GGML_TYPE_F32; flash attention stays off, as the bindings default it),
        # the text tower in F32 throughout; the default F16 cache moves this path's logits by ~1e-4
        kv = {"type_k": 0, "type_v": 0} if f32_kv else {}
        self.llm = llama_cpp.Llama(str(model_path), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                                   n_threads=n_threads, verbose=verbose, logits_all=False, **kv)
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
        self.n_ctx, self.n_batch = n_ctx, n_batch
        self.marker = mtmd_cpp.mtmd_default_marker().decode()

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

    def chunks(self, text: str, images: list, n_past: int = 0, encode: bool = True,
               frames: bool = False) -> list[Chunk]:
        """libmtmd's layout of `text`, where each `self.marker` stands for the next image (PIL RGB or an H×W×3
        uint8 array), with the image chunks placed from position `n_past` and (with `encode`) their embeddings
        computed. `frames`: the images are the frames of one clip, marked as mtmd-helper's video reader marks them."""
        mt = self._mt
        if text.count(self.marker) != len(images):
            raise VisionModelError(f"{len(images)} image(s) for {text.count(self.marker)} marker(s) in the prompt")
        arrays = [np.ascontiguousarray(im if isinstance(im, np.ndarray) else np.asarray(im.convert("RGB")),
                                       dtype=np.uint8) for im in images]
        bitmaps = [mt.mtmd_bitmap_init(a.shape[1], a.shape[0], a.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte)))
                   for a in arrays]
        for bm in bitmaps if frames else []:
            mt.mtmd_bitmap_set_mergeable(bm, True)
        raw = mt.mtmd_input_chunks_init()
        try:
            b = text.encode("utf-8")
            inp = mt.mtmd_input_text(b, len(b), False, True)
            rc = mt.mtmd_tokenize(self.mctx, raw, ctypes.byref(inp), (mt.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps),
                                  len(bitmaps))
            if rc != 0:
                raise VisionModelError(f"the runtime could not lay out the prompt (mtmd_tokenize: {rc})")
            out, pos = [], n_past
            for i in range(mt.mtmd_input_chunks_size(raw)):
                c = mt.mtmd_input_chunks_get(raw, i)
                if mt.mtmd_input_chunk_get_type(c) == mt.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    n = ctypes.c_size_t()
                    ptr = mt.mtmd_input_chunk_get_tokens_text(c, ctypes.byref(n))
                    out.append(Chunk("text", [ptr[k] for k in range(n.value)]))
                    pos += n.value
                    continue
                ch = self._image_chunk(c, pos, encode)
                out.append(ch)
                pos += ch.n_pos
            return out
        finally:
            mt.mtmd_input_chunks_free(raw)
            for bm in bitmaps:
                mt.mtmd_bitmap_free(bm)

    def _image_chunk(self, c, n_past: int, encode: bool) -> Chunk:
        mt = self._mt
        n = mt.mtmd_input_chunk_get_n_tokens(c)
        toks = mt.mtmd_input_chunk_get_tokens_image(c)
        pos = np.zeros((N_POS, n), dtype=np.int64)
        for i in range(n):
            p = mt.mtmd_image_tokens_get_decoder_pos(toks, n_past, i)
            pos[:, i] = (p.t, p.y, p.x, p.z)  # row order of the decoder: t, h (y), w (x), e
        if not encode:
            return Chunk("image", embd=np.zeros((n, 0), dtype=np.float32), pos=pos,
                         n_pos=mt.mtmd_input_chunk_get_n_pos(c))
        if mt.mtmd_encode_chunk(self.mctx, c) != 0:
            raise VisionModelError("the runtime failed to encode an image chunk (mtmd_encode_chunk)")
        ptr = mt.mtmd_get_output_embd(self.mctx)
        embd = np.ctypeslib.as_array(ptr, shape=(n * self.n_embd,)).reshape(n, self.n_embd).copy()
        return Chunk("image", embd=embd, pos=pos, n_pos=mt.mtmd_input_chunk_get_n_pos(c))

    # -- decoding
    def reset(self) -> None:
        lc = self._lc
        lc.llama_memory_clear(lc.llama_get_memory(self.llm.ctx), True)

    def _decode(self, ids, embd, pos4: np.ndarray) -> None:
        """One llama_decode of token ids (1-D positions pos4[0]) or embeddings (4 position rows), logits for all."""
        lc = self._lc
        n = pos4.shape[1]
        b = lc.llama_batch()
        b.n_tokens = n
        keep = []
        if ids is not None:
            tok = (lc.llama_token * n)(*ids)
            p = (lc.llama_pos * n)(*[int(x) for x in pos4[0]])
            b.token, b.embd = tok, None
            keep += [tok]
        else:
            e = np.ascontiguousarray(embd, dtype=np.float32)
            p = (lc.llama_pos * (N_POS * n))(*np.ascontiguousarray(pos4).reshape(-1).tolist())
            b.token = None
            b.embd = e.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            keep += [e]
        seq0 = (lc.llama_seq_id * 1)(0)
        seq_ptrs = (ctypes.POINTER(lc.llama_seq_id) * n)(*([ctypes.cast(seq0, ctypes.POINTER(lc.llama_seq_id))] * n))
        nseq = (ctypes.c_int32 * n)(*([1] * n))
        logits = (ctypes.c_int8 * n)(*([1] * n))
        b.pos, b.seq_id, b.n_seq_id, b.logits = p, seq_ptrs, nseq, logits
        keep += [p, seq0, seq_ptrs, nseq, logits]
        rc = lc.llama_decode(self.llm.ctx, b)
        if rc != 0:
            raise VisionModelError(f"llama_decode failed ({rc}) on {n} {'text' if ids is not None else 'embedding'} "
                                   f"tokens at t={int(pos4[0, 0])}")

    def eval(self, chunks: list[Chunk], batch: int | None = None) -> Evaluated:
        """Decode the chunks from an empty cache in ubatches of `batch` tokens (default n_batch; 1 = token by
        token), returning the logits of every token."""
        lc = self._lc
        batch = batch or self.n_batch
        self.reset()
        rows, calls, pos = [], 0, 0
        for ch in chunks:
            if ch.kind == "text":
                p = np.arange(pos, pos + len(ch.ids))[None, :]
                pieces = [(ch.ids[a:a + batch], None, p[:, a:a + batch]) for a in range(0, len(ch.ids), batch)]
                pos += len(ch.ids)
            else:
                if int(ch.pos[0].min()) != pos:
                    raise VisionModelError(f"image chunk placed at t={int(ch.pos[0].min())}, expected {pos}")
                pieces = [(None, ch.embd[a:a + batch], ch.pos[:, a:a + batch]) for a in range(0, ch.n_tokens, batch)]
                pos += ch.n_pos
            for ids, embd, p in pieces:
                if pos > self.n_ctx:
                    raise VisionModelError(f"the prompt needs {pos} positions, the context has {self.n_ctx}")
                self._decode(ids, embd, p)
                calls += 1
                for j in range(p.shape[1]):
                    ptr = lc.llama_get_logits_ith(self.llm.ctx, j)
                    rows.append(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy())
        return Evaluated(chunks, np.stack(rows), calls)

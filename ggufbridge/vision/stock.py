"""The stock runtime path for comparison: libmtmd's own preprocessing, layout and 1-D image positions
(what llama-server / llama-mtmd-cli do with the same files), evaluated through the mtmd helper."""

from __future__ import annotations

import ctypes

import numpy as np

from ggufbridge.errors import VisionModelError


def stock_eval(session, text_before: str, image, text_after: str) -> tuple[list[int], np.ndarray, int]:
    """Evaluate `text_before` + image + `text_after` the way the stock runtime does. Returns the token ids
    (image tokens as -1), the logits of every token of `text_after` (teacher forced) and how many tokens the
    image block took (markers included)."""
    from llama_cpp import mtmd_cpp as mt

    lc = session._lc
    rgb = np.ascontiguousarray(np.asarray(image, dtype=np.uint8))
    h, w = rgb.shape[:2]
    marker = mt.mtmd_default_marker().decode()
    bitmap = mt.mtmd_bitmap_init(w, h, rgb.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte)))
    chunks = mt.mtmd_input_chunks_init()
    try:
        raw = (text_before + marker + text_after).encode()
        text = mt.mtmd_input_text(raw, len(raw), False, True)
        rc = mt.mtmd_tokenize(session.mctx, chunks, ctypes.byref(text), (mt.mtmd_bitmap_p_ctypes * 1)(bitmap), 1)
        if rc != 0:
            raise VisionModelError(f"mtmd_tokenize failed ({rc})")
        n_chunks = mt.mtmd_input_chunks_size(chunks)
        ids: list[int] = []
        kinds = []
        for i in range(n_chunks):
            c = mt.mtmd_input_chunks_get(chunks, i)
            if mt.mtmd_input_chunk_get_type(c) == mt.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t()
                ptr = mt.mtmd_input_chunk_get_tokens_text(c, ctypes.byref(n))
                ids += [ptr[k] for k in range(n.value)]
                kinds.append("text")
            else:
                ids += [-1] * mt.mtmd_input_chunk_get_n_tokens(c)
                kinds.append("image")
        if kinds[-1] != "text":
            raise VisionModelError("text_after must not be empty")
        tail = mt.mtmd_input_chunks_get(chunks, n_chunks - 1)
        n_tail = ctypes.c_size_t()
        tptr = mt.mtmd_input_chunk_get_tokens_text(tail, ctypes.byref(n_tail))
        tail_ids = [tptr[k] for k in range(n_tail.value)]
        # everything but the last text chunk through the helper (the stock code path) ...
        session.reset()
        n_past = 0
        for i in range(n_chunks - 1):
            new = lc.llama_pos(n_past)  # the helper adds to it for text chunks
            rc = mt.mtmd_helper_eval_chunk_single(session.mctx, session.llm.ctx, mt.mtmd_input_chunks_get(chunks, i),
                                                  n_past, 0, session.llm.n_batch, False, ctypes.byref(new))
            if rc != 0:
                raise VisionModelError(f"mtmd_helper_eval_chunk_single failed ({rc}) on chunk {i}")
            n_past = new.value
        # ... and the last one as a plain text batch with logits for every token (what the helper would decode)
        pos4 = np.tile(np.arange(n_past, n_past + len(tail_ids)), (4, 1))
        session._decode("tok", list(range(len(tail_ids))), tail_ids, None, pos4, np.ones(len(tail_ids), dtype=bool))
        logits = np.stack([np.ctypeslib.as_array(lc.llama_get_logits_ith(session.llm.ctx, j),
                                                 shape=(session.n_vocab,)).copy() for j in range(len(tail_ids))])
        n_image = len(ids) - len(tail_ids) - len(session.tokenize(text_before))
        return ids, logits, n_image
    finally:
        mt.mtmd_input_chunks_free(chunks)
        mt.mtmd_bitmap_free(bitmap)

"""Image chats through llama-server's OpenAI API, scored against transformers' MiniCPM-V 4.7.

The server side is a plain HTTP client of `/v1/chat/completions` (images as data URLs, greedy, `logprobs` with
`top_logprobs`). The reference side is transformers itself: its processor lays out the same chat (the chat
template renders each image part as the image placeholder, the processor expands it into `<image_id>`, markers
and slices) and its model scores the prompt followed by the server's tokens, teacher-forced. Nothing of
ggufbridge's own vision code is on either side.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ggufbridge.compare.metrics import log_softmax
from ggufbridge.errors import GGUFFileError, ServerError
from ggufbridge.ggufio.names import MINICPMV_CANVAS_MROPE, MINICPMV_PROCESSOR_SLICING, MINICPMV_USE_IMAGE_ID

# mmproj keys only ggufbridge's patch series reads (docs/vision.md): renamed by stock_layout_copy, the runtime takes
# its stock path
PATCH_KEYS = tuple(k.encode() for k in (MINICPMV_PROCESSOR_SLICING, MINICPMV_CANVAS_MROPE, MINICPMV_USE_IMAGE_ID))


# both sides render the chat template with these (llama-server's own default for enable_thinking differs from
# transformers'; vLLM's recommended serving of MiniCPM-V 4.7 also switches thinking off)
TEMPLATE_KWARGS = {"enable_thinking": False}


def data_url(img) -> str:
    """A PIL image as a PNG data URL (lossless, so both sides see the same pixels)."""
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def user_turn(images: list, text: str) -> dict:
    """One user message: the images (PIL), then the text, as OpenAI content parts."""
    parts = [{"type": "image_url", "image_url": {"url": data_url(im)}} for im in images]
    return {"role": "user", "content": parts + [{"type": "text", "text": text}]}


@dataclass
class ServedTurn:
    ids: list[int]                   # generated token ids
    top: list[dict[int, float]]      # per generated position: token id -> log-probability (the server's top-k)
    content: str
    usage: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)


def chat(url: str, messages: list[dict], *, max_tokens: int, top_logprobs: int, timeout: float = 600.0,
         **extra) -> ServedTurn:
    """Greedy chat completion with per-position top-k log-probabilities (`url` = the server's root)."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "logprobs": True,
            "top_logprobs": top_logprobs, "chat_template_kwargs": TEMPLATE_KWARGS, **extra}
    req = urllib.request.Request(url.rstrip("/") + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read())
    choice = out["choices"][0]
    entries = (choice.get("logprobs") or {}).get("content") or []
    ids = [int(e["id"]) for e in entries]
    top = [{int(t["id"]): float(t["logprob"]) for t in e.get("top_logprobs", [])} for e in entries]
    n = out.get("usage", {}).get("completion_tokens", len(ids))
    if n != len(ids):
        raise ServerError(f"the server reported {len(ids)} logprobs entries for {n} generated tokens (a token that "
                         f"is not complete UTF-8 was merged into the next one; ban them with partial_utf8_ids)")
    return ServedTurn(ids, top, choice["message"].get("content") or "", out.get("usage", {}), out.get("timings", {}))


def partial_utf8_ids(tokenizer) -> list[int]:
    """Ids whose text alone is not complete UTF-8 (a byte-level BPE fragment). llama-server holds such a token back
    and reports its step merged into the next token's logprobs entry, which loses that step's distribution; a
    `logit_bias` that bans them keeps one entry per step (the reported log-probabilities are the raw ones, taken
    before any sampler, so the bias does not change them)."""
    return [i for i in range(len(tokenizer)) if "\ufffd" in tokenizer.decode([i])]


def hf_messages(messages: list[dict]) -> tuple[list[dict], list]:
    """The OpenAI messages as transformers chat messages (image parts → {"type": "image"}) and their PIL images,
    in order."""
    from PIL import Image

    out, images = [], []
    for m in messages:
        content = m["content"]
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        parts = []
        for p in content:
            if p["type"] == "image_url":
                raw = base64.b64decode(p["image_url"]["url"].split(",", 1)[1])
                images.append(Image.open(io.BytesIO(raw)).convert("RGB"))
                parts.append({"type": "image"})
            else:
                parts.append({"type": "text", "text": p["text"]})
        out.append({"role": m["role"], "content": parts})
    return out, images


def hf_prompt(processor, messages: list[dict], downsample: str | None = None, **template_kwargs):
    """transformers' processor output for the chat (generation prompt appended; `template_kwargs` as the server's
    `chat_template_kwargs`)."""
    msgs, images = hf_messages(messages)
    kwargs = {**TEMPLATE_KWARGS, **template_kwargs}
    text = processor.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kwargs)
    kw = {"downsample_mode": downsample} if downsample else {}
    return processor(images=images or None, text=[text], return_tensors="pt", **kw)


def hf_scores(model, inputs, continuation: list[int], downsample: str | None = None) -> np.ndarray:
    """Log-probabilities [len(continuation), vocab] that transformers gives each continuation token's position,
    teacher-forced on the prompt followed by the continuation."""
    import torch

    ids = inputs["input_ids"][0].tolist()
    n = len(ids)
    full = torch.tensor([ids + continuation[:-1]])
    tt = torch.cat([inputs["mm_token_type_ids"], torch.zeros(1, len(continuation) - 1, dtype=torch.long)], 1)
    kw = {"downsample_mode": downsample} if downsample else {}
    if "pixel_values" in inputs:
        kw.update(pixel_values=inputs["pixel_values"], target_sizes=inputs["target_sizes"])
    with torch.no_grad():
        logits = model(input_ids=full, mm_token_type_ids=tt, **kw).logits[0, n - 1:].double().numpy()
    return log_softmax(logits)


def kl_to_served(ref_logp: np.ndarray, top: list[dict[int, float]]) -> np.ndarray:
    """KL(reference ‖ served) per position. With the whole vocabulary in `top` it is the exact KL; with a top-k it
    is the KL of both distributions coarsened to {the k tokens, everything else} (a lower bound)."""
    out = np.zeros(len(top))
    for i, t in enumerate(top):
        ids = np.fromiter(t.keys(), dtype=np.int64)
        q = np.exp(np.fromiter(t.values(), dtype=np.float64))
        p = np.exp(ref_logp[i, ids])
        kl = float(np.sum(p * (np.log(np.maximum(p, 1e-300)) - np.log(np.maximum(q, 1e-300)))))
        p_rest, q_rest = max(1.0 - p.sum(), 0.0), max(1.0 - q.sum(), 0.0)
        if p_rest > 1e-12:
            kl += p_rest * (np.log(p_rest) - np.log(max(q_rest, 1e-300)))
        out[i] = kl
    return out


def stock_layout_copy(out_dir: Path, dst: Path) -> Path:
    """A copy of a converted folder whose mmproj the patched runtime reads as a stock one would: the keys only the
    patches read are renamed in place (same length, so sizes and offsets stay), and libmtmd takes its stock
    minicpmv4_6 path (letterboxed llava-uhd slicing, 1-D positions, no <image_id>)."""
    shutil.copytree(out_dir, dst)
    mm = next(dst.glob("mmproj-*.gguf"))
    raw = mm.read_bytes()
    for key in PATCH_KEYS:
        if raw.count(key) != 1:
            raise GGUFFileError(f"{mm}: expected the key {key.decode()} once, found it {raw.count(key)} times")
        raw = raw.replace(key, key[:-1] + b"X")
    mm.write_bytes(raw)
    return dst

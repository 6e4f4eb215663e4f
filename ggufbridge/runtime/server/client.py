"""The HTTP side of a running llama-server: JSON requests, one chat turn, streamed completions, /metrics.

Standard library only (urllib): what ggufbridge sends and reads, with no client library between us and the server.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request

from ggufbridge.errors import ServerError


def http_json(url: str, body: dict | None = None, api_key: str | None = None, timeout: float = 600.0):
    """(status, parsed JSON or text) for a GET (body None) or a JSON POST."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:  # an answer: its status and body (a URLError, no answer, stays an OSError)
        status, raw = e.code, e.read()
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def _open(req: urllib.request.Request, timeout: float):
    """urlopen, with every failure a ServerError that carries the server's own reason (its JSON `error.message`),
    not urllib's bare "HTTP Error 400: Bad Request" whose reason stays in the server's log."""
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        raw = e.read().decode(errors="replace")
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw or e.reason
        raise ServerError(f"{req.full_url}: {_error_text(e.code, body)}") from None
    except urllib.error.URLError as e:
        raise ServerError(f"{req.full_url}: cannot reach llama-server: {e.reason}") from None


def _error_text(status: int, body) -> str:
    err = body.get("error") if isinstance(body, dict) else None
    said = err.get("message") if isinstance(err, dict) else None
    return f"llama-server answered {status}: {' '.join(str(said or body)[:300].split())}"


def chat(url: str, request: dict, api_key: str | None = None, timeout: float = 600.0) -> str:
    """One /v1/chat/completions turn; the answer's text. ServerError with the server's own message otherwise."""
    status, body = http_json(url + "/v1/chat/completions", request, api_key, timeout=timeout)
    if status != 200 or not isinstance(body, dict):
        raise ServerError(_error_text(status, body))
    return body["choices"][0]["message"].get("content") or ""


def tokenize(url: str, text: str, api_key: str | None = None) -> list[int]:
    """The server's own token ids of `text`, without special tokens."""
    status, body = http_json(url + "/tokenize", {"content": text, "add_special": False}, api_key)
    if status != 200 or not isinstance(body, dict):
        raise ServerError(f"{url}/tokenize: {_error_text(status, body)}")
    return body["tokens"]


def complete_stream(url: str, ids: list[int] | str, n_predict: int, api_key: str | None = None,
                    timeout: float = 3600.0) -> tuple[float, str, dict]:
    """(seconds to the first token, generated text, final timings) for one greedy streamed completion.

    The text, not the chunks' "tokens" lists, is what is compared between modes: when the server holds back
    an incomplete UTF-8 sequence it sends several tokens in one chunk but lists only the last one there.
    """
    body = {"prompt": ids, "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "stream": True,
            "cache_prompt": False, "ignore_eos": True, "return_tokens": True, "seed": 0}
    req = urllib.request.Request(url + "/completion", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    t0 = time.perf_counter()
    ttft, text, timings = None, "", None
    with _open(req, timeout) as r:
        for raw in r:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:  # a failure after the stream began: the server's reason, as for a refused request
                err = chunk["error"]
                said = err.get("message") if isinstance(err, dict) else err
                said = " ".join(str(said)[:300].split())
                raise ServerError(f"{url}/completion: llama-server failed the stream: {said}")
            if chunk.get("tokens") or chunk.get("content"):
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text += chunk.get("content") or ""
            if chunk.get("stop"):
                timings = chunk.get("timings")
                break
    if timings is None:
        raise ServerError("the server's stream ended without timings")
    return (ttft if ttft is not None else time.perf_counter() - t0), text, timings


def chat_stream(url: str, prompt: str, n_predict: int, t0: float, api_key: str | None = None,
                timeout: float = 3600.0, progress: list[tuple[float, int]] | None = None,
                ) -> tuple[float, float | None, float | None, str, dict, dict]:
    """One greedy streamed chat completion through the OpenAI API, as a client sees it: (start, first content,
    last content, all perf_counter() - t0; text; usage; the server's timings). EOS is ignored and the prompt cache
    is not used. `progress`, if given, receives (arrival time, tokens generated so far) for every chunk: the
    request asks for llama-server's timings in every chunk (`timings_per_token`), because a chunk is not a token
    (a token that ends inside a UTF-8 character streams nothing until the next one completes it)."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": n_predict, "temperature": 0.0,
            "top_k": 1, "seed": 0, "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": True, "cache_prompt": False}
    if progress is not None:
        body["timings_per_token"] = True
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    start = time.perf_counter() - t0
    first = last = None
    text, usage, timings = "", {}, {}
    with _open(req, timeout) as r:
        for raw in r:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter() - t0  # one arrival time for everything this chunk carries
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise ServerError(f"the server failed a streamed request: {str(chunk['error'])[:200]}")
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                piece = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
                if piece:
                    first = now if first is None else first
                    last = now
                    text += piece
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
            if progress is not None and isinstance(chunk.get("timings"), dict):
                progress.append((now, int(chunk["timings"].get("predicted_n", 0))))
    return start, first, last, text, usage, timings


def metrics(url: str, api_key: str | None = None) -> dict[str, float]:
    """The server's Prometheus counters (llamacpp:NAME VALUE) by NAME; {} when /metrics is off."""
    status, text = http_json(url + "/metrics", api_key=api_key)
    if status != 200 or not isinstance(text, str):
        return {}
    out = {}
    for line in text.splitlines():
        m = re.match(r"^llamacpp:(\w+)\s+([-+0-9.eE]+|nan|inf)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out

"""What a client sends cannot cost the server more than a 4xx (patch server-request-body-guards, issue 40).

Each hostile body goes to a real `ggufbridge serve` (the tiny converted model) over a raw HTTP connection, and the
server must answer it 4xx and then still answer an ordinary chat. On the series without the patch
(`scripts/build_runtime.sh --without-patch server-request-body-guards`) the deep body kills llama-server
(SIGSEGV in a recursive copy), malformed JSON, invalid UTF-8 and NaN are answered 500, and a long text is
tokenised whole before the context check refuses it (a 50 MB message: 29 s at 3.6 GB).
"""

from __future__ import annotations

import http.client
import json
import random
import re
import socket
import threading
from urllib.parse import urlsplit

import pytest

from test_serve import CHAT, Serving, _alive, model_dir  # noqa: F401  (model_dir: the converted tiny model, a fixture)

pytestmark = pytest.mark.slow

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def served(model_dir):  # noqa: F811
    with Serving(model_dir, "--parallel", "2") as s:
        yield s, s.wait_ready()


def _post(url: str, body: bytes, path: str = "/v1/chat/completions") -> tuple[int, dict]:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
    finally:
        conn.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, {"raw": data[:200].decode(errors="replace")}


def _still_answers(s: Serving, url: str) -> None:
    status, body = _post(url, json.dumps(CHAT).encode())
    assert status == 200 and body["choices"][0]["message"]["content"], body
    assert _alive(s.server_pid)


def _chat(content: str, **extra) -> dict:
    return dict(CHAT, messages=[{"role": "user", "content": content}], **extra)


def _nested(depth: int) -> bytes:
    head = json.dumps(_chat("hi"))[:-1]  # without its closing brace
    return (head + ', "x_unread": ' + "[" * depth + "]" * depth + "}").encode()


# each body is built when its case runs (the largest is 100 MB)
HOSTILE = {
    # the cases
    "nested 1,000,000 deep": (lambda: _nested(1_000_000), "nested more than 256"),
    "nested 150,000 deep, in the message": (
        lambda: json.dumps(_chat("x")).replace('"x"', "[" * 150_000 + "]" * 150_000).encode(), "nested more than 256"),
    "random bytes": (lambda: random.Random(0).randbytes(MIB), "parse error"),
    "invalid UTF-8": (lambda: json.dumps(_chat("caf\u00e9"), ensure_ascii=False).encode().replace(b"\xc3\xa9", b"\xe9"),
                      "parse error"),
    "NaN": (lambda: json.dumps(_chat("hi", temperature=float("nan"))).encode(), "parse error"),
    "malformed": (lambda: b'{"messages": [{"role": "user", "content": "hi"}', "parse error"),
    # a text no context of this vocabulary holds: refused before it is tokenised
    "100 MB message": (lambda: json.dumps(_chat("river " * (100_000_000 // 6))).encode(), "bytes of text"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_body_gets_a_4xx_and_the_server_keeps_answering(served, case):
    s, url = served
    make, said = HOSTILE[case]
    status, answer = _post(url, make())
    assert status == 400, (status, answer)
    assert said in answer["error"]["message"], answer
    _still_answers(s, url)


def test_a_deep_body_within_the_bound_is_served(served):
    """256 levels is far beyond any real request and is still accepted; 257 is refused."""
    s, url = served
    assert _post(url, _nested(255))[0] == 200  # the body object itself is one level
    status, answer = _post(url, _nested(256))
    assert status == 400 and "nested more than 256" in answer["error"]["message"], answer


def test_a_prompt_over_the_context_by_tokens_is_still_refused_by_the_slot(served):
    """Under the byte bound but over the context in tokens: the slot's own check, as before the patch."""
    s, url = served
    status, answer = _post(url, json.dumps(_chat(" ".join(f"w{i}" for i in range(3000)))).encode())
    assert status == 400 and "exceeds the available context size" in answer["error"]["message"], answer
    assert "bytes of text" not in answer["error"]["message"]
    _still_answers(s, url)


def test_a_body_over_the_size_limit_is_answered_413(served):
    """llama-server's --max-body-size (default 100 MiB): the body is not read past the limit. The client keeps
    sending while the answer comes: the status is read from the socket as the server wrote it."""
    s, url = served
    u = urlsplit(url)
    size = 100 * MIB + MIB
    sock = socket.create_connection((u.hostname, u.port), timeout=120)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {u.hostname}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\n\r\n").encode()

    def send():
        try:
            sock.sendall(head)
            chunk = b" " * MIB
            for _ in range(size // MIB):
                sock.sendall(chunk)
        except OSError:
            pass  # the server stopped reading, as it should

    t = threading.Thread(target=send, daemon=True)
    t.start()
    got = b""
    try:
        while True:  # the head, then as much body as it announces
            head_end = got.find(b"\r\n\r\n")
            if head_end >= 0:
                n = re.search(rb"(?i)content-length:\s*(\d+)", got[:head_end])
                if n is None or len(got) >= head_end + 4 + int(n.group(1)):
                    break
            part = sock.recv(4096)
            if not part:
                break
            got += part
    finally:
        sock.close()
        t.join(30)
    assert got.startswith(b"HTTP/1.1 413"), got[:200]
    # in the API's error form, as every other refusal (cpp-httplib's own 413 had no body at all)
    body = json.loads(got[got.find(b"\r\n\r\n") + 4:])
    assert body["error"]["code"] == 413 and "--max-body-size 100 MiB" in body["error"]["message"], body
    _still_answers(s, url)


# --- integer parameters (patch server-integer-parameters-in-range) -------------------------------------------------
# Without the patch `"max_tokens": 1e30` was cast to -2147483648 before anything judged it: the chat route refused it
# as "but got -2147483648", a number the client never sent, and `/completion` ran it as n_predict = -2147483648 (no
# limit); 5e9 wrapped and 12.7 was truncated, both served.

@pytest.mark.parametrize("value, shown", [(1e30, "1e+30"), (5_000_000_000, "5000000000"), (12.7, "12.7"),
                                          (-3e9, "-3000000000")])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/completion"])
def test_an_integer_parameter_out_of_its_range_is_a_400_naming_it(served, value, shown, route):
    s, url = served
    body = _chat("hi", max_tokens=value) if route.startswith("/v1") else {"prompt": "hi", "n_predict": value}
    status, answer = _post(url, json.dumps(body).encode(), route)
    assert status == 400, answer
    msg = answer["error"]["message"]
    field = "max_tokens" if route.startswith("/v1") else "n_predict"
    assert f"'{field}'" in msg and "must be an integer" in msg and shown in msg, msg
    assert "-2147483648" not in msg.split("got", 1)[1], msg  # the value as sent, not its cast
    _still_answers(s, url)


def test_integer_parameters_written_as_floats_and_the_random_seed_are_served(served):
    """What clients really send keeps working: an integral float (JavaScript's numbers) and llama.cpp's seed -1."""
    s, url = served
    status, body = _post(url, json.dumps(_chat("hi", max_tokens=3.0, seed=-1)).encode())
    assert status == 200, body
    assert body["usage"]["completion_tokens"] <= 3, body

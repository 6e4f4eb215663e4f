"""End to end with the `openai` package against `ggufbridge serve` (a real process on 127.0.0.1, free port).

The model is the tiny fixture converted with the Qwen3.5 family's template (tests/_templates.py), so the
runtime's reasoning and tool-call parsers are in play. Its weights are random: the tests check the protocol
(what comes back where), never what the text says; greedy decoding keeps streamed and non-streamed answers
comparable.
"""

from __future__ import annotations

import os
from pathlib import Path

import openai
import pytest

from _runtime_models import serve_process
from _templates import converted_with_template
from _cores import THREADS

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-test-ggufbridge"
PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSu"
       "QmCC")
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


class Serving:
    """`python -m ggufbridge serve OUT ...` as a subprocess; stopped (SIGTERM to its group) at the end."""

    def __init__(self, out: Path, console: Path, *args: str):
        self.srv = serve_process(out, console, "--recipe", "cpu", "--ctx", "2048", "--threads", str(THREADS),
                                 "--api-key", KEY, *args, timeout=120,
                                 env=dict(os.environ, PYTHONPATH=str(REPO)))
        self.url = self.srv.url

    def client(self, key: str = KEY):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=60)

    def stop(self):
        self.srv.stop()


@pytest.fixture(scope="module")
def model(make_ckpt, tmp_path_factory) -> Path:
    return converted_with_template(make_ckpt, tmp_path_factory)[1]


@pytest.fixture(scope="module")
def no_think(model, tmp_path_factory):
    s = Serving(model, tmp_path_factory.mktemp("oa") / "no-think.console")  # the default: --no-think
    yield s
    s.stop()


@pytest.fixture(scope="module")
def think(model, tmp_path_factory):
    s = Serving(model, tmp_path_factory.mktemp("oa") / "think.console", "--think", "--reasoning-budget", "3")
    yield s
    s.stop()


def _reasoning(msg) -> str | None:
    # not an OpenAI field: the SDK keeps unknown fields in model_extra
    return (msg.model_extra or {}).get("reasoning_content")


def test_models_chat_and_stream(no_think):
    c = no_think.client()
    ids = [m.id for m in c.models.list().data]
    assert len(ids) == 1 and ids[0].startswith("MiniCPM-V-4_7-")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a river."}]
    r = c.chat.completions.create(model=ids[0], messages=msgs, max_tokens=8, temperature=0)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8
    assert msg.role == "assistant" and msg.content and not _reasoning(msg)  # thinking off by default

    chunks = list(c.chat.completions.create(model=ids[0], messages=msgs, max_tokens=8, temperature=0, stream=True))
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert len(chunks) > 2 and streamed == msg.content  # greedy: the same text, in pieces


def test_image_as_data_url(no_think):
    c = no_think.client()
    text = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "Describe."}], max_tokens=2,
                                     temperature=0)
    img = c.chat.completions.create(
        model="x", max_tokens=2, temperature=0,
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}},
                                               {"type": "text", "text": "Describe."}]}])
    assert img.choices[0].message.content is not None
    # the image's tokens (markers + visual tokens) are in the prompt the server evaluated
    assert img.usage.prompt_tokens > text.usage.prompt_tokens + 8


def test_thinking_on_and_off(no_think, think):
    msgs = [{"role": "user", "content": "Why is the sky blue?"}]
    # --think with --reasoning-budget 3: three tokens of thought, then the runtime closes the thought
    r = think.client().chat.completions.create(model="x", messages=msgs, max_tokens=12, temperature=0)
    msg = r.choices[0].message
    assert _reasoning(msg) and msg.content and "<think>" not in msg.content and "</think>" not in msg.content
    # a request may still turn thinking off (or on) with the template's own switch
    off = think.client().chat.completions.create(model="x", messages=msgs, max_tokens=6, temperature=0,
                                                 extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off.choices[0].message.content and not _reasoning(off.choices[0].message)
    on = no_think.client().chat.completions.create(model="x", messages=msgs, max_tokens=6, temperature=0,
                                                   extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert _reasoning(on.choices[0].message)  # no budget on this server: all six tokens are thought
    # the default server's answer is the thought-free continuation of the closed <think></think> block
    plain = no_think.client().chat.completions.create(model="x", messages=msgs, max_tokens=6, temperature=0)
    assert plain.choices[0].message.content == off.choices[0].message.content


def test_streamed_reasoning(think):
    chunks = list(think.client().chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Hmm?"}], max_tokens=12, temperature=0, stream=True))
    thought = "".join((ch.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                      for ch in chunks if ch.choices)
    whole = think.client().chat.completions.create(model="x", messages=[{"role": "user", "content": "Hmm?"}],
                                                  max_tokens=12, temperature=0)
    assert thought and thought == _reasoning(whole.choices[0].message)


def test_tools_and_a_tool_result_round_trip(no_think):
    """Tool definitions and a client-side round trip (assistant tool_calls + the `tool` result) go through the
    API and into the prompt (rendered as transformers renders them: test_chat_template.py). Parsing a *generated*
    call is not covered: random weights never write the call syntax, and on this runtime tool_choice="required"
    does not constrain decoding (observed: free text, finish_reason "length")."""
    import json

    c = no_think.client()
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    bare = c.chat.completions.create(model="x", messages=msgs, max_tokens=2, temperature=0)
    r = c.chat.completions.create(model="x", messages=msgs, tools=TOOLS, max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens > bare.usage.prompt_tokens + 100  # the tool definitions are in the prompt
    call = {"id": "call_0", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
    msgs += [{"role": "assistant", "content": "", "tool_calls": [call]},
             {"role": "tool", "tool_call_id": "call_0", "content": json.dumps({"temp_c": 21})}]
    after = c.chat.completions.create(model="x", messages=msgs, tools=TOOLS, max_tokens=2, temperature=0)
    assert after.choices[0].message.content is not None
    assert after.usage.prompt_tokens > r.usage.prompt_tokens + 10  # the call and its result are in the prompt


def test_api_key(no_think):
    with pytest.raises(openai.AuthenticationError):
        no_think.client("sk-wrong").models.list()
    with pytest.raises(openai.AuthenticationError):
        no_think.client("sk-wrong").chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}],
                                                            max_tokens=1)

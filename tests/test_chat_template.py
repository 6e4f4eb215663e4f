"""Template fidelity: llama-server's Jinja engine renders the chat template exactly as transformers does.

For each template (the fixture's, and the Qwen3.5 family's public one: tests/data/templates/README.md) a tiny
model is converted with it, served with the argv `ggufbridge serve` builds (so its --reasoning switch is under
test too), and every conversation of the corpus is rendered by the server's /apply-template and by
transformers' `apply_chat_template`; both texts are tokenised (server /tokenize with parse_special, the HF
tokenizer of the checkpoint) and the ids must be equal.

One substitution, by design of the runtime: llama-server replaces an image content part by a random media
marker (`<__media_…__>`) *before* templating, and libmtmd later writes the projector's own image markers there,
so the template's image branch is never used by the server. The comparison puts the template's placeholder
(fixture: `<unk>`; Qwen3.5: `<|vision_start|><|image_pad|><|vision_end|>`) where the marker is.
"""

from __future__ import annotations

import re

import pytest

from ggufbridge.testkit.vocab import CHAT_TEMPLATE, IMAGE_TOKEN
from ggufbridge.runtime import server as sv
from ggufbridge.runtime.session import prepare

from _templates import QWEN35_TEMPLATE, converted_with_template
from _cores import THREADS

pytestmark = pytest.mark.slow

MEDIA = re.compile(r"<__media_[A-Za-z0-9]+__>")
PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSu"
       "QmCC")
IMAGE = {"type": "image_url", "image_url": {"url": PNG}}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}


def corpus(tools: bool) -> list[tuple[str, list, dict]]:
    """(name, messages, extra) where extra holds `tools` and/or `enable_thinking`."""
    cases = [
        ("plain", [{"role": "user", "content": "Hello there"}], {}),
        ("system", [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}], {}),
        ("multi-turn", [{"role": "user", "content": "One?"}, {"role": "assistant", "content": "Two."},
                        {"role": "user", "content": "Three?"}], {}),
        ("unicode", [{"role": "user", "content": "日本語 — ça va? 😀\n\ttabs"}], {}),
        ("thinking on", [{"role": "user", "content": "Think about it"}], {"enable_thinking": True}),
        ("thinking off", [{"role": "user", "content": "Just answer"}], {"enable_thinking": False}),
        ("text parts", [{"role": "user", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]}],
         {}),
        ("one image", [{"role": "user", "content": [IMAGE, {"type": "text", "text": "What is this?"}]}], {}),
        ("two images", [{"role": "user", "content": [{"type": "text", "text": "Compare "}, IMAGE, IMAGE]}],
         {"enable_thinking": True}),
        ("image then text turn", [{"role": "user", "content": [IMAGE, {"type": "text", "text": "This?"}]},
                                  {"role": "assistant", "content": "A square."},
                                  {"role": "user", "content": "Sure?"}], {}),
    ]
    if tools:
        cases += [
            ("thought in history", [{"role": "user", "content": "Q1"},
                                    {"role": "assistant", "content": "A1", "reasoning_content": "hmm"},
                                    {"role": "user", "content": "Q2"}], {"enable_thinking": True}),
            # a chat must end with a user or tool turn: llama-server continues a final assistant turn (prefill)
            ("inline thought in history", [{"role": "user", "content": "Q"},
                                           {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nA"},
                                           {"role": "user", "content": "Q2"}], {"enable_thinking": False}),
            ("tool definitions", [{"role": "system", "content": "Use tools."},
                                  {"role": "user", "content": "Weather in Paris?"}], {"tools": TOOLS}),
            ("tool call and result", [{"role": "user", "content": "Weather in Paris?"},
                                      {"role": "assistant", "content": "", "tool_calls": [CALL]},
                                      {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"}],
             {"tools": TOOLS}),
            ("two results then answer", [{"role": "user", "content": "Paris and Rome?"},
                                         {"role": "assistant", "content": "Checking.", "tool_calls": [CALL, CALL]},
                                         {"role": "tool", "tool_call_id": "call_1", "content": "21"},
                                         {"role": "tool", "tool_call_id": "call_1", "content": "25"},
                                         {"role": "assistant", "content": "Warm."},
                                         {"role": "user", "content": "Thanks"}],
             {"tools": TOOLS, "enable_thinking": False}),
        ]
    return cases


TEMPLATES = {
    # name: (template, the placeholder it renders for one image, corpus with tools)
    "fixture": (CHAT_TEMPLATE, IMAGE_TOKEN, False),
    "qwen3.5": (QWEN35_TEMPLATE, "<|vision_start|><|image_pad|><|vision_end|>", True),
}


def _to_openai(messages: list) -> list:
    """The same chat as an OpenAI client sends it: tool-call arguments are a JSON string on the wire."""
    import json

    out = []
    for m in messages:
        m = dict(m)
        if "tool_calls" in m:
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def rendered(request, make_ckpt, tmp_path_factory):
    """(template name, HF tokenizer, {think: server url}) with two servers: --no-think (default) and --think."""
    from transformers import AutoTokenizer

    name = request.param
    ckpt, out = converted_with_template(make_ckpt, tmp_path_factory, TEMPLATES[name][0])
    tok = AutoTokenizer.from_pretrained(ckpt)
    s = prepare(out, "cpu", ctx=2048)
    servers, urls = [], {}
    try:
        for think in (False, True):
            port = sv.free_port()
            argv = sv.server_argv(s.rt.bin_dir / "llama-server", s.recipe, s.plan, s.art,
                                  sv.ServeOptions(port=port, think=think, threads=THREADS, metrics=False))
            srv = sv.Server(argv, "127.0.0.1", port, tmp_path_factory.mktemp("logs") / "server.log",
                            env=s.rt.env()).start()
            servers.append(srv)
            srv.wait_ready(120)
            urls[think] = srv.url
        yield name, tok, urls
    finally:
        for srv in servers:
            srv.stop()


def _server_ids(url: str, messages: list, extra: dict, placeholder: str) -> tuple[str, list[int]]:
    body = {"messages": _to_openai(messages)}
    if "tools" in extra:
        body["tools"] = extra["tools"]
    if "enable_thinking" in extra:
        body["chat_template_kwargs"] = {"enable_thinking": extra["enable_thinking"]}
    status, out = sv.http_json(url + "/apply-template", body)
    assert status == 200, out
    text = MEDIA.sub(placeholder, out["prompt"])
    status, toks = sv.http_json(url + "/tokenize", {"content": text, "parse_special": True})
    assert status == 200, toks
    return text, toks["tokens"]


def _hf_ids(tok, template: str, messages: list, extra: dict) -> tuple[str, list[int]]:
    text = tok.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True,
                                   **extra)
    return text, tok.encode(text, add_special_tokens=False)


def test_corpus_renders_to_the_same_ids(rendered):
    name, tok, urls = rendered
    template, placeholder, tools = TEMPLATES[name]
    total, diffs = 0, []
    for case, messages, extra in corpus(tools):
        s_text, s_ids = _server_ids(urls[False], messages, extra, placeholder)
        h_text, h_ids = _hf_ids(tok, template, messages, {"enable_thinking": False, **extra})
        total += len(h_ids)
        if s_ids != h_ids:
            diffs.append(f"{case}: server {s_text!r}\n   hf {h_text!r}")
    assert not diffs, f"{name}: {len(diffs)} case(s) differ:\n" + "\n".join(diffs)
    assert total > 200  # the corpus is not trivially empty
    print(f"{name}: {len(corpus(tools))} conversations, {total} token ids, 0 differ")


def test_serve_think_switch_sets_the_template_default(rendered):
    """With no chat_template_kwargs, `serve --no-think` renders as enable_thinking=false and `--think` as true
    (the Qwen3.5 template thinks when the variable is undefined, so the switch must always be explicit)."""
    name, tok, urls = rendered
    template, placeholder, _ = TEMPLATES[name]
    messages = [{"role": "user", "content": "Default?"}]
    for think, url in urls.items():
        s_text, s_ids = _server_ids(url, messages, {}, placeholder)
        h_text, h_ids = _hf_ids(tok, template, messages, {"enable_thinking": think})
        assert s_ids == h_ids, (think, s_text, h_text)
        assert s_text.endswith("<think>\n" if think else "<think>\n\n</think>\n\n")

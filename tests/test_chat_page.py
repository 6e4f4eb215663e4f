"""The chat page in a real browser: llama-server's own web UI (built from the pinned tree's tools/ui by
scripts/build_ui.sh and embedded by scripts/build_runtime.sh), in Debian's Chromium driven by Playwright, against
`ggufbridge serve` on the tiny fixture converted with the Qwen3.5 family's template (so the runtime's reasoning
parser is in play), with --api-key and --media-path as a user would start it.

The steps run in order in one browser profile, each leaving a screenshot in build/test-artifacts/chat-page/
(listed at the end of the pytest run): a wrong key is refused and the right one opens the page; a typed prompt is
answered; an attached PNG and an attached MP4 take the patched image and video paths (the prompt token count the
server reports for the page's request equals the count for the same file sent over the API, and differs from the
count without it); the reasoning menu's Off hides the reasoning block and Low shows it. The weights are random: the
tests check where things appear, never what the text says.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
from fractions import Fraction
from pathlib import Path

import pytest

from _runtime_models import serve_process
from _templates import converted_with_template
from ggufbridge.errors import RuntimeNotFound
from ggufbridge.runtime import locate as loc
from ggufbridge.runtime import server as sv
from _cores import THREADS

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path(os.environ.get("GGUFBRIDGE_CHROMIUM", "/usr/bin/chromium"))
KEY = "sk-page-test"
MAX_TOKENS = 24
# playwright's own browser download is not used: the system's Chromium, headless, isolated from the network
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 120_000
PLACEHOLDER = "Type a message..."


def _runtime_with_page():
    try:
        rt = loc.locate()
    except RuntimeNotFound as e:
        pytest.fail(f"no runtime: {e}")
    if not rt.has_page:
        if shutil.which("npm") is None:
            pytest.skip("npm missing: the runtime was built without its chat page (scripts/build_ui.sh)")
        pytest.fail("npm is here but llama-server has no chat page: re-run scripts/setup.sh")
    return rt


@pytest.fixture(scope="module")
def shots(artifacts_dir):
    return artifacts_dir("chat-page")


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> Path:
    """A picture big enough to be sliced (the patched slicing) and a 3-second clip, in the --media-path folder."""
    from PIL import Image, ImageDraw

    from _video_helpers import make_clip

    d = tmp_path_factory.mktemp("media")
    img = Image.new("RGB", (672, 448), (135, 190, 235))
    draw = ImageDraw.Draw(img)
    draw.ellipse((500, 40, 600, 140), fill=(255, 210, 60))
    draw.rectangle((0, 330, 672, 448), fill=(90, 160, 70))
    draw.rectangle((150, 220, 330, 340), fill=(190, 90, 60))
    draw.polygon([(130, 220), (240, 140), (350, 220)], fill=(120, 50, 40))
    img.save(d / "house.png")
    make_clip(d / "clip.mp4", n_frames=30, fps=Fraction(10), w=96, h=64)
    return d


@pytest.fixture(scope="module")
def served(make_ckpt, tmp_path_factory, media):
    _runtime_with_page()
    out = converted_with_template(make_ckpt, tmp_path_factory)[1]
    console = tmp_path_factory.mktemp("page") / "serve.console"
    srv = serve_process(out, console, "--recipe", "cpu", "--ctx", "4096", "--threads", str(THREADS), "--api-key", KEY,
                        "--media-path", str(media), timeout=180, env=dict(os.environ, PYTHONPATH=str(REPO)))
    # serve prints the page's address beside the API's (once /health answers: wait for its ready line)
    deadline = time.monotonic() + 60
    while "ready: " not in console.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert f"chat page: {srv.url}/  (it asks for the --api-key)" in console.read_text()
    yield srv, console
    srv.stop()


@pytest.fixture(scope="module")
def page(served, tmp_path_factory):
    if not CHROMIUM.is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (scripts/setup.sh installs Debian's `chromium` where it can)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # a fresh profile of our own (playwright refuses --user-data-dir in args: it is the persistent context's)
        ctx = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 860})
        # short greedy answers: the page's own settings, as a user would set them (stored where the page keeps them)
        ctx.add_init_script(
            "if (!localStorage.getItem('LlamaUi.config')) {"
            f" localStorage.setItem('LlamaUi.config', JSON.stringify({{max_tokens: {MAX_TOKENS}, temperature: 0}}));"
            " localStorage.setItem('LlamaUi.userOverrides', JSON.stringify(['max_tokens', 'temperature'])); }")
        pg = ctx.new_page()
        pg.set_default_timeout(TIMEOUT_MS)
        yield pg
        ctx.close()


def _shot(pg, shots: Path, name: str) -> None:
    pg.screenshot(path=str(shots / f"{name}.png"))


@pytest.fixture(autouse=True)
def _shot_on_failure(request, page, shots):
    """What the page showed when a step failed, beside the steps' screenshots (the call's report is logged before
    this teardown runs)."""
    failed = request.session.testsfailed
    yield
    if request.session.testsfailed > failed:
        _shot(page, shots, f"FAILED-{request.node.name}")


def _api_prompt_tokens(url: str, content, tools=None) -> int:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1, "temperature": 0}
    if tools:
        body["tools"] = tools
    status, r = sv.http_json(url + "/v1/chat/completions", body, api_key=KEY)
    assert status == 200, r
    return r["usage"]["prompt_tokens"]


def _new_chat(pg) -> None:
    """A new conversation, waited for: a file attached while the page still shows the old one is dropped with its
    form."""
    pg.get_by_role("button", name="New chat").first.click()
    pg.get_by_text("Hello there").wait_for()


def _send(pg, text: str, files: list[Path] = ()) -> tuple[dict, int, int]:
    """Type `text` (attaching `files`), send it, wait for the answer; (the page's request body, the prompt and the
    answer token counts the server reported in the streamed answer's timings)."""
    if files:
        pg.locator("input[type=file]").first.set_input_files([str(f) for f in files])
        for f in files:  # the attachment is in the form before sending (a picture as its thumbnail)
            pg.get_by_text(f.name).or_(pg.get_by_alt_text(f.name)).first.wait_for()
    box = pg.get_by_placeholder(PLACEHOLDER)
    box.fill(text)
    with pg.expect_response(lambda r: r.url.endswith("/v1/chat/completions") and r.request.method == "POST") as ri:
        box.press("Enter")
    resp = ri.value
    assert resp.status == 200, resp.text()
    events = [json.loads(ln[5:]) for ln in resp.text().splitlines() if ln.startswith("data:") and "{" in ln]
    t = [e["timings"] for e in events if e.get("timings")][-1]
    # the page shows the tokens this turn prefilled (prompt_n; the server reuses the cached prefix, cache_n) under
    # the question, and the answer's under the answer
    for shown in {t["prompt_n"], t["predicted_n"]}:
        pg.get_by_role("button", name=f"{shown} tokens", exact=True).first.wait_for()
    return resp.request.post_data_json, t["prompt_n"] + t["cache_n"], t["predicted_n"]


def _media_turn(pg, url: str, path: Path, prompt: str, page_part: str, api_part: dict):
    """A new chat with `path` attached: (the page's prompt count, the API's for `api_part` + `prompt`, the API's for
    `prompt` alone, the page's tools). The page must have sent the file's bytes unchanged as one `page_part`; the
    API requests carry the tools the page offers (its own; the template renders them into the prompt)."""
    _new_chat(pg)
    body, n_page, _ = _send(pg, prompt, [path])
    last = body["messages"][-1]["content"]
    parts = [p for p in last if p.get("type") == page_part]
    assert len(parts) == 1
    sent = parts[0][page_part]
    sent = sent["url"].split(",", 1)[1] if "url" in sent else sent["data"]
    assert base64.b64decode(sent) == path.read_bytes()
    tools = body.get("tools")
    return (n_page, _api_prompt_tokens(url, [api_part, {"type": "text", "text": prompt}], tools),
            _api_prompt_tokens(url, prompt, tools), tools)


def _data_url(path: Path, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode()


def test_wrong_key_refused_then_the_page_opens(page, served, shots):
    srv, _ = served
    page.goto(srv.url + "/")
    page.get_by_role("button", name="Enter API Key").click()
    page.locator("#api-key-input").fill("sk-wrong")
    page.get_by_role("button", name="Save & Retry").click()
    page.get_by_text("Invalid API key").wait_for()
    _shot(page, shots, "01-wrong-key-refused")
    page.locator("#api-key-input").fill(KEY)
    page.get_by_role("button", name="Save & Retry").click()
    page.get_by_placeholder(PLACEHOLDER).wait_for()
    _shot(page, shots, "02-page-loaded")


def test_typed_prompt_gets_an_answer(page, shots):
    body, n_prompt, n_answer = _send(page, "Name a river.")
    assert body["max_tokens"] == MAX_TOKENS and n_prompt > 0 and 0 < n_answer <= MAX_TOKENS
    _shot(page, shots, "03-typed-prompt-answered")


def test_attached_png_takes_the_image_path(page, served, media, shots):
    png = media / "house.png"
    n_page, n_api, n_text, _ = _media_turn(page, served[0].url, png, "What is in this picture?", "image_url",
                                           {"type": "image_url", "image_url": {"url": _data_url(png, "image/png")}})
    assert n_page == n_api > n_text
    _shot(page, shots, "04-image-answered")


def test_attached_video_takes_the_video_path(page, served, media, shots):
    clip = media / "clip.mp4"
    url = served[0].url
    as_data = {"type": "video_url", "video_url": {"url": _data_url(clip, "video/mp4")}}
    n_page, n_api, n_text, tools = _media_turn(page, url, clip, "What happens?", "input_video", as_data)
    # the same clip named under --media-path: read from disk, the same frames
    n_file = _api_prompt_tokens(url, [{"type": "video_url", "video_url": {"url": "file://clip.mp4"}},
                                      {"type": "text", "text": "What happens?"}], tools)
    assert n_page == n_api == n_file > n_text
    _shot(page, shots, "05-video-answered")


def _reasoning(pg, level: str) -> None:
    """The + menu's Reasoning entry (a submenu, opened from the keyboard: the + button's tooltip covers it)."""
    pg.get_by_role("button", name="Add files, prompts, tools or MCP Servers").click()
    pg.get_by_role("menuitem", name="Reasoning").press("ArrowRight")
    pg.get_by_role("menuitem", name=level).click()
    pg.keyboard.press("Escape")


def test_thinking_off_hides_and_on_shows_the_reasoning_block(page, shots):
    block = page.get_by_text("Reasoning", exact=True)
    _new_chat(page)
    _reasoning(page, "Off")
    body, _, _ = _send(page, "Why is the sky blue?")
    assert body["chat_template_kwargs"]["enable_thinking"] is False
    assert block.count() == 0
    _shot(page, shots, "06-thinking-off")
    _new_chat(page)
    _reasoning(page, "Low")
    body, _, _ = _send(page, "Why is the grass green?")
    assert body["chat_template_kwargs"]["enable_thinking"] is True
    block.first.click()  # the block opens on the thought (all of the answer here: the budget outlasts max_tokens)
    assert page.locator(".reasoning-content").first.inner_text().strip()
    _shot(page, shots, "07-thinking-on")

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
from fractions import Fraction
from pathlib import Path

import pytest

from _runtime_models import serve_process
from _templates import converted_with_template
from ggufbridge.runtime import locate as loc
from ggufbridge.runtime import server as sv

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
    except Exception as e:  # noqa: BLE001 (any failure to find a runtime is a reason to stop here)
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
    srv = serve_process(out, console, "--recipe", "cpu", "--ctx", "4096", "--threads", "2", "--api-key", KEY,
                        "--media-path", str(media), timeout=180, env=dict(os.environ, PYTHONPATH=str(REPO)))
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


def _api_prompt_tokens(url: str, content) -> int:
    status, r = sv.http_json(url + "/v1/chat/completions", {"messages": [{"role": "user", "content": content}],
                                                            "max_tokens": 1, "temperature": 0}, api_key=KEY)
    assert status == 200, r
    return r["usage"]["prompt_tokens"]


def _send(pg, text: str, files: list[Path] = ()) -> tuple[dict, int]:
    """Type `text` (attaching `files`), send it, wait for the answer; (the page's request body, the prompt token
    count the server reported in its streamed answer)."""
    if files:
        pg.locator("input[type=file]").first.set_input_files([str(f) for f in files])
        for f in files:  # the attachment's preview is in the form before sending
            pg.get_by_text(f.name).first.wait_for()
    box = pg.get_by_placeholder(PLACEHOLDER).first
    box.click()
    box.fill(text)
    with pg.expect_response(lambda r: r.url.endswith("/v1/chat/completions") and r.request.method == "POST") as ri:
        box.press("Enter")
    resp = ri.value
    assert resp.status == 200, resp.text()
    body = resp.request.post_data_json
    events = [json.loads(ln[5:]) for ln in resp.text().splitlines() if ln.startswith("data:") and "{" in ln]
    usage = [e["usage"] for e in events if e.get("usage")]
    assert usage, "the streamed answer carried no usage"
    return body, usage[-1]["prompt_tokens"]


def _parts(body: dict, kind: str) -> list[dict]:
    last = body["messages"][-1]["content"]
    return [p for p in last if isinstance(p, dict) and p.get("type") == kind] if isinstance(last, list) else []


def test_wrong_key_refused_then_the_page_opens(page, served, shots):
    srv, _ = served
    page.goto(srv.url + "/")
    page.get_by_role("button", name="Enter API Key").click()
    page.locator("#api-key-input").fill("sk-wrong")
    page.get_by_role("button", name="Save").click()
    page.get_by_text("Invalid API key").wait_for()
    _shot(page, shots, "01-wrong-key-refused")
    page.locator("#api-key-input").fill(KEY)
    page.get_by_role("button", name="Save").click()
    page.get_by_placeholder(PLACEHOLDER).first.wait_for()
    _shot(page, shots, "02-page-loaded")


def test_typed_prompt_gets_an_answer(page, shots):
    body, n = _send(page, "Name a river.")
    assert body["max_tokens"] == MAX_TOKENS and n > 0
    page.get_by_text("Name a river.").first.wait_for()
    _shot(page, shots, "03-typed-prompt-answered")


def test_attached_png_takes_the_image_path(page, served, media, shots):
    srv, _ = served
    png = media / "house.png"
    page.get_by_role("button", name="New chat").first.click()
    body, n_page = _send(page, "What is in this picture?", [png])
    images = _parts(body, "image_url")
    assert len(images) == 1
    sent = images[0]["image_url"]["url"]
    assert base64.b64decode(sent.split(",", 1)[1]) == png.read_bytes()  # the page sends the file as it is
    own = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
    n_api = _api_prompt_tokens(srv.url, [{"type": "image_url", "image_url": {"url": own}},
                                         {"type": "text", "text": "What is in this picture?"}])
    n_text = _api_prompt_tokens(srv.url, "What is in this picture?")
    assert n_page == n_api and n_api > n_text + 64
    _shot(page, shots, "04-image-answered")


def test_attached_video_takes_the_video_path(page, served, media, shots):
    srv, _ = served
    clip = media / "clip.mp4"
    page.get_by_role("button", name="New chat").first.click()
    body, n_page = _send(page, "What happens?", [clip])
    assert len(_parts(body, "input_video")) == 1
    own = "data:video/mp4;base64," + base64.b64encode(clip.read_bytes()).decode()
    n_api = _api_prompt_tokens(srv.url, [{"type": "video_url", "video_url": {"url": own}},
                                         {"type": "text", "text": "What happens?"}])
    # the same clip named under --media-path: the server reads it from disk, same frames, same count
    n_file = _api_prompt_tokens(srv.url, [{"type": "video_url", "video_url": {"url": "file://clip.mp4"}},
                                          {"type": "text", "text": "What happens?"}])
    n_text = _api_prompt_tokens(srv.url, "What happens?")
    assert n_page == n_api == n_file and n_api > n_text + 64
    _shot(page, shots, "05-video-answered")


def _reasoning(pg, level: str) -> None:
    pg.get_by_role("button", name="Add files, prompts, tools or MCP Servers").click()
    pg.get_by_text("Reasoning").first.click()
    pg.get_by_role("menuitem", name=level).click()
    pg.keyboard.press("Escape")


def test_thinking_off_hides_and_on_shows_the_reasoning_block(page, shots):
    page.get_by_role("button", name="New chat").first.click()
    _reasoning(page, "Off")
    body, _ = _send(page, "Why is the sky blue?")
    assert body["chat_template_kwargs"]["enable_thinking"] is False
    page.get_by_text("Why is the sky blue?").first.wait_for()
    assert page.get_by_text("Reasoning", exact=True).count() == 0
    _shot(page, shots, "06-thinking-off")
    page.get_by_role("button", name="New chat").first.click()
    _reasoning(page, "Low")
    body, _ = _send(page, "Why is the grass green?")
    assert body["chat_template_kwargs"]["enable_thinking"] is True
    page.get_by_text("Reasoning", exact=True).first.wait_for()
    _shot(page, shots, "07-thinking-on")

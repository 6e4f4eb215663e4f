"""One chat turn with images or a video through a private llama-server: the path `ggufbridge run --image/--video`
takes.

The server is the same binary and command line as `ggufbridge serve` (so the patched runtime's slicing, canvas
M-RoPE, batched image prefill and the DSpark draft all apply), bound to 127.0.0.1 on a free port, and stopped
before this returns whatever happens.
"""

from __future__ import annotations

import base64
import io
import tempfile
from pathlib import Path

import click

from ggufbridge.errors import ServerError
from ggufbridge.runtime import server as sv
from ggufbridge.runtime.session import Session


def image_part(path: str) -> dict:
    """An OpenAI image part: the file checked and decoded by our loader (bounded size, clear errors, alpha on
    white as the processor does), re-encoded losslessly as PNG."""
    from ggufbridge.vision.preprocess import load_image

    img = load_image(path)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()}}


def video_part(path: str, settings=None) -> dict:
    """An OpenAI-compatible `video_url` part (vLLM's convention; llama-server reads it as `input_video`): the file,
    checked and decoded once by our reader first with the model's video settings (clear errors before any server
    starts), as a data URL."""
    from ggufbridge.vision.video import load_video

    load_video(path, settings=settings)
    raw = Path(path).read_bytes()
    return {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(raw).decode()}}


def ask_with_images(s: Session, prompt: str, images: list[str], *, draft: bool, n_predict: int, temp: float,
                    seed: int, show_command: bool = False, timeout: float = 900.0, think: bool | None = None,
                    reasoning_budget: int | None = None, videos: list[str] = ()) -> str:
    from ggufbridge.vision import ffshim
    from ggufbridge.vision.video import VideoSettings

    settings = VideoSettings.of_mmproj(s.art.mmproj.path)
    parts = ([image_part(p) for p in images] + [video_part(p, settings) for p in videos]
             + [{"type": "text", "text": prompt}])
    host, port = "127.0.0.1", sv.free_port()
    argv = sv.server_argv(s.rt.bin_dir / "llama-server", s.recipe, s.plan, s.art,
                          sv.ServeOptions(host=host, port=port, draft=draft, metrics=False, think=think,
                                          reasoning_budget=reasoning_budget, extra=ffshim.server_args(settings)))
    if show_command:
        click.echo(f"command: {sv.printable(argv)}", err=True)
    with tempfile.TemporaryDirectory(prefix="ggufbridge-run-") as tmp:
        log = Path(tmp) / "llama-server.log"
        with sv.Server(argv, host, port, log, env=s.rt.env()) as srv:
            srv.wait_ready(timeout)
            status, body = sv.http_json(srv.url + "/v1/chat/completions",
                                        {"messages": [{"role": "user", "content": parts}], "max_tokens": n_predict,
                                         "temperature": temp, "seed": seed}, timeout=timeout)
            if status != 200 or not isinstance(body, dict):
                err = body.get("error") if isinstance(body, dict) else None
                said = err.get("message") if isinstance(err, dict) else None
                raise ServerError(f"llama-server answered {status}: {' '.join(str(said or body)[:300].split())}")
    return body["choices"][0]["message"].get("content") or ""

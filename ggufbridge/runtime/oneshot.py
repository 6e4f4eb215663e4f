"""One prompt, one answer: `run_once`, what `ggufbridge run` calls.

Text goes through llama-cli (one turn, `-st`, its transcript parsed); images and videos through a private
llama-server (llama-cli in this tree takes no image on the command line): the same binary and command line as
`ggufbridge serve`, so the patched runtime's slicing, canvas M-RoPE, batched image prefill and the DSpark draft all
apply, bound to 127.0.0.1 on a free port. Either way the tool is stopped before `run_once` returns or raises.
"""

from __future__ import annotations

import base64
import io
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path

from ggufbridge.errors import RuntimeNotFound, ServerError
from ggufbridge.runtime import server as sv
from ggufbridge.runtime.artifacts import ModelSpec
from ggufbridge.runtime.session import Session, prepare

log = logging.getLogger(__name__)


def _log_warning(text: str) -> None:
    log.warning("%s", text)


def run_once(model: "str | Path | ModelSpec", prompt: str, *, recipe: str = "cpu", draft: bool = False,
             n_predict: int = 256, temp: float = 0.0, seed: int = 0, ctx: int | None = 4096, images: list[str] = (),
             videos: list[str] = (), llama_bin: str | None = None, think: bool | None = None,
             reasoning_budget: int | None = None, timeout: float = 900.0,
             on_command: Callable[[str], None] | None = None,
             on_warning: Callable[[str], None] = _log_warning) -> str:
    """The answer to `prompt` (with `images`/`videos`, paths) from `model` (runtime.artifacts: a folder, GGUF
    files or a hub spec), with its chat template. `on_command(line)` hears the llama.cpp command before it starts;
    `on_warning(line)` what the user should know (default: the log)."""
    s = prepare(model, recipe, draft=draft, ctx=ctx, llama_bin=llama_bin, rpc_workers=0)
    if s.problems:
        raise RuntimeNotFound(" | ".join(s.problems))
    opts = sv.ServeOptions(draft=draft, think=think, reasoning_budget=reasoning_budget)
    if images or videos:
        if s.art.mmproj is None:
            flag = "--image" if images else "--video"
            raise ServerError(f"{flag}: {s.art.missing('mmproj')}; convert with the vision tower, or name one "
                              f"with --mmproj FILE")
        if s.image_loss:
            on_warning(f"warning: images: {s.image_loss}")
        return _ask_server(s, prompt, list(images), list(videos), opts, n_predict=n_predict, temp=temp, seed=seed,
                           timeout=timeout, on_command=on_command)
    return _ask_cli(s, prompt, opts, n_predict=n_predict, temp=temp, seed=seed, on_command=on_command)


def assistant_text(transcript: str) -> str:
    """The answer from llama-cli's -o transcript ("User:\\n...\\n\\nAssistant:\\n<answer>\\n\\n")."""
    marker = "Assistant:\n"
    i = transcript.rfind(marker)
    if i < 0:
        raise ServerError(f"llama-cli wrote no answer (transcript: {transcript[:200]!r})")
    return transcript[i + len(marker):].removesuffix("\n").removesuffix("\n")


def _ask_cli(s: Session, prompt: str, opts: sv.ServeOptions, *, n_predict: int, temp: float, seed: int,
             on_command: Callable[[str], None] | None) -> str:
    with tempfile.TemporaryDirectory(prefix="ggufbridge-run-") as tmp:
        out_file, log_path = Path(tmp) / "transcript.txt", Path(tmp) / "llama-cli.log"
        argv = sv.cli_argv(s.rt.tool("llama-cli"), s.recipe, s.plan, s.art, opts, prompt=prompt,
                           n_predict=n_predict, temp=temp, seed=seed, out_file=out_file)
        if on_command is not None:
            on_command(sv.printable(argv))
        proc = sv.spawn(argv, env=s.rt.env(), log_path=log_path)
        try:
            code = proc.wait()
        finally:
            sv.stop(proc)
        if code != 0 or not out_file.is_file():
            raise ServerError(f"llama-cli failed (exit {code}): {sv.log_reason(log_path)}")
        # bytes, not read_text: universal newlines would turn a generated "\r" into "\n"
        answer = assistant_text(out_file.read_bytes().decode("utf-8", errors="replace"))
        if not answer and sv.log_has_error(log_path):
            # llama-cli refuses a turn (e.g. a prompt longer than the context) in its log and still exits 0
            raise ServerError(f"llama-cli gave no answer: {sv.log_reason(log_path)}")
        return answer


def image_part(path: str) -> dict:
    """An OpenAI image part: the file checked and decoded by our loader (bounded size, clear errors, alpha on
    white as the processor does), re-encoded losslessly as PNG."""
    from ggufbridge.vision.preprocess import load_image

    img = load_image(path)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def video_part(path: str, settings=None) -> dict:
    """An OpenAI-compatible `video_url` part (vLLM's convention; llama-server reads it as `input_video`): the file,
    checked and decoded once by our reader first with the model's video settings (clear errors before any server
    starts), as a data URL."""
    from ggufbridge.vision.video import load_video

    load_video(path, settings=settings)
    raw = Path(path).read_bytes()
    return {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(raw).decode()}}


def _ask_server(s: Session, prompt: str, images: list[str], videos: list[str], opts: sv.ServeOptions, *,
                n_predict: int, temp: float, seed: int, timeout: float,
                on_command: Callable[[str], None] | None) -> str:
    from ggufbridge.vision import ffshim
    from ggufbridge.vision.video import VideoSettings

    settings = VideoSettings.of_mmproj(s.art.mmproj.path)
    parts = ([image_part(p) for p in images] + [video_part(p, settings) for p in videos]
             + [{"type": "text", "text": prompt}])
    host, port = "127.0.0.1", sv.free_port()
    opts = sv.ServeOptions(host=host, port=port, draft=opts.draft, metrics=False, think=opts.think,
                           reasoning_budget=opts.reasoning_budget, extra=ffshim.server_args(settings))
    argv = sv.server_argv(s.rt.bin_dir / "llama-server", s.recipe, s.plan, s.art, opts)
    if on_command is not None:
        on_command(sv.printable(argv))
    with tempfile.TemporaryDirectory(prefix="ggufbridge-run-") as tmp:
        with sv.Server(argv, host, port, Path(tmp) / "llama-server.log", env=s.rt.env()) as srv:
            srv.wait_ready(timeout)
            return sv.chat(srv.url, {"messages": [{"role": "user", "content": parts}], "max_tokens": n_predict,
                                     "temperature": temp, "seed": seed}, timeout=timeout)

"""`ggufbridge run`: a one-shot answer through llama-cli equals what llama-server answers for the same chat."""

from __future__ import annotations


import pytest
from click.testing import CliRunner

from ggufbridge.cli import cli
from ggufbridge.runtime.oneshot import assistant_text
from ggufbridge.errors import ServerError
from ggufbridge.runtime import locate as loc
from ggufbridge.runtime import server as sv

from _runtime_models import converted


def test_assistant_text_parsing():
    assert assistant_text("User:\nhi\n\nAssistant:\n\rline one\nline two\n\n") == "\rline one\nline two"
    with pytest.raises(ServerError, match="no answer"):
        assistant_text("User:\nhi\n\n")


@pytest.mark.slow
def test_run_matches_the_server(make_ckpt, tmp_path_factory, tmp_path):
    model = converted(make_ckpt, tmp_path_factory, with_draft=True)
    prompt = "Tell me about rivers."
    res = CliRunner().invoke(cli, ["run", str(model), "-p", prompt, "-n", "16", "--show-command"])
    assert res.exit_code == 0, res.output
    assert "llama-cli" in res.stderr and " -st " in res.stderr
    answer = res.stdout.removesuffix("\n")
    drafted = CliRunner().invoke(cli, ["run", str(model), "-p", prompt, "-n", "16", "--draft"])
    assert drafted.exit_code == 0, drafted.output
    assert drafted.stdout.removesuffix("\n") == answer  # greedy: the draft must not change the text

    # reference: the same chat, greedy, through llama-server's OpenAI endpoint
    rt = loc.locate()
    target = next(model.glob("MiniCPM-V-4_7-*.gguf"))
    port = sv.free_port()
    argv = [str(rt.tool("llama-server")), "-m", str(target), "-c", "4096", "--host", "127.0.0.1", "--port", str(port)]
    with sv.Server(argv, "127.0.0.1", port, tmp_path / "s.log", env=rt.env()) as srv:
        srv.wait_ready(120)
        status, body = sv.http_json(srv.url + "/v1/chat/completions",
                                    {"messages": [{"role": "user", "content": prompt}], "max_tokens": 16,
                                     "temperature": 0})
    assert status == 200
    assert answer and answer == body["choices"][0]["message"]["content"]


@pytest.mark.slow
def test_run_with_an_image(make_ckpt, tmp_path_factory, tmp_path):
    """`run --image` goes through the patched llama-server (the serving path): it answers what the server answers
    for the same chat, --draft keeps the greedy text, and bad input is one line with exit code 2."""
    import numpy as np
    from PIL import Image

    from ggufbridge.testkit import served_chat as sc

    model = converted(make_ckpt, tmp_path_factory, with_draft=True)
    img = tmp_path / "img.png"
    Image.fromarray((np.random.default_rng(0).random((130, 250, 3)) * 255).astype("uint8")).save(img)
    res = CliRunner().invoke(cli, ["run", str(model), "-p", "What is this?", "--image", str(img), "-n", "6",
                                   "--show-command"])
    assert res.exit_code == 0, res.output
    assert "llama-server" in res.stderr and "--mmproj" in res.stderr and "warning" not in res.stderr
    answer = res.stdout.removesuffix("\n")
    drafted = CliRunner().invoke(cli, ["run", str(model), "-p", "What is this?", "--image", str(img), "-n", "6",
                                       "--draft"])
    assert drafted.exit_code == 0, drafted.output
    assert drafted.stdout.removesuffix("\n") == answer

    rt = loc.locate()
    target = next(model.glob("MiniCPM-V-4_7-*.gguf"))
    mmproj = next(model.glob("mmproj-*.gguf"))
    port = sv.free_port()
    argv = [str(rt.tool("llama-server")), "-m", str(target), "--mmproj", str(mmproj), "-c", "4096", "--host",
            "127.0.0.1", "--port", str(port), "--jinja"]
    with sv.Server(argv, "127.0.0.1", port, tmp_path / "s.log", env=rt.env()) as srv:
        srv.wait_ready(120)
        status, body = sv.http_json(srv.url + "/v1/chat/completions",
                                    {"messages": [sc.user_turn([Image.open(img).convert("RGB")], "What is this?")],
                                     "max_tokens": 6, "temperature": 0})
    assert status == 200 and body["choices"][0]["message"]["content"] == answer

    res = CliRunner().invoke(cli, ["run", str(model), "-p", "x", "--image", str(tmp_path / "none.png")])
    assert res.exit_code == 2 and "none.png" in res.stderr and "Traceback" not in res.output
    (tmp_path / "empty.png").write_bytes(b"")
    res = CliRunner().invoke(cli, ["run", str(model), "-p", "x", "--image", str(tmp_path / "empty.png")])
    assert res.exit_code == 2 and "empty" in res.stderr and "Traceback" not in res.output

"""`ggufbridge serve` against a real llama-server on 127.0.0.1 with a converted tiny model."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufbridge.cli import cli
from ggufbridge.runtime import locate as loc
from ggufbridge.runtime import server as sv

from _lines import Lines, stderr_of
from _runtime_models import converted
from test_runtime_locate import fake_bin
from _cores import THREADS

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def model_dir(make_ckpt, tmp_path_factory) -> Path:
    return converted(make_ckpt, tmp_path_factory, with_draft=True)


# ------------------------------------------------------------------ helpers


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie has exited; only its parent's bookkeeping is left


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(x) for x in (task / "children").read_text().split()]
    return out


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Serving:
    """`python -m ggufbridge serve ...` as a real process; the test cleans up whatever is left."""

    def __init__(self, model_dir: Path, *args: str):
        self.port = sv.free_port()
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen([sys.executable, "-m", "ggufbridge", "serve", str(model_dir), "--recipe", "cpu",
                                      "--port", str(self.port), "--ctx", "2048", "--threads", str(THREADS), *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     start_new_session=True)
        self.lines = Lines(self.proc.stdout)
        self.stdout: list[str] = self.lines.seen
        self.server_pid = None

    def wait_ready(self, timeout: float = 120) -> str:
        line = self.lines.wait_for("ready: ", timeout)
        if line is None:
            raise AssertionError(f"serve did not become ready: {''.join(self.stdout)}{stderr_of(self.proc)}")
        kids = _children(self.proc.pid)
        assert len(kids) == 1, kids
        self.server_pid = kids[0]
        return line.split()[1].removesuffix("/v1")

    def cleanup(self):
        for pid in (self.proc.pid, self.server_pid):
            if pid and _alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cleanup()


def _post(url, body, key=None):
    return sv.http_json(url, body, api_key=key, timeout=120)


def _stream_chat(url, body) -> tuple[str, int]:
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(dict(body, stream=True)).encode(),
                                 headers={"Content-Type": "application/json"})
    text, chunks, done = "", 0, False
    with urllib.request.urlopen(req, timeout=120) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            delta = json.loads(line[6:])["choices"][0]["delta"]
            text += delta.get("content") or ""
            chunks += 1
    assert done, "stream did not end with [DONE]"
    return text, chunks


CHAT = {"messages": [{"role": "user", "content": "Write a short poem about rivers."}], "max_tokens": 24,
        "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}}


# ------------------------------------------------------------------ tests


def _check_endpoints(url: str, model_dir: Path, key: str | None = None) -> tuple[str, dict]:
    with urllib.request.urlopen(url + "/health", timeout=10) as r:
        assert r.status == 200 and json.loads(r.read()) == {"status": "ok"}
    status, models = sv.http_json(url + "/v1/models", api_key=key)
    assert status == 200
    target = json.loads((model_dir / "manifest.json").read_text())["files"][0]["path"]
    assert models["data"][0]["id"] == Path(target).stem
    status, plain = _post(url + "/v1/chat/completions", CHAT, key)
    assert status == 200, plain
    content = plain["choices"][0]["message"]["content"]
    assert plain["usage"]["completion_tokens"] > 0
    streamed, chunks = _stream_chat(url, CHAT) if key is None else (content, 2)
    assert chunks > 1
    assert streamed == content  # greedy: streaming must not change the text
    roles = {f["role"] for f in json.loads((model_dir / "manifest.json").read_text())["files"]}
    assert ("multimodal" in models["models"][0]["capabilities"]) == ("mmproj" in roles)
    if "mmproj" in roles:  # the projector is loaded: an image becomes prompt tokens
        status, seen = _post(url + "/v1/chat/completions", _image_chat(), key)
        assert status == 200, seen
        text_only = dict(CHAT, messages=[{"role": "user", "content": "What is in this picture?"}])
        status, unseen = _post(url + "/v1/chat/completions", text_only, key)
        assert seen["usage"]["prompt_tokens"] > unseen["usage"]["prompt_tokens"] + 4
    return content, plain


def _image_chat() -> dict:
    import base64
    import io

    import numpy as np
    from PIL import Image

    pixels = (np.random.default_rng(0).random((120, 200, 3)) * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return dict(CHAT, messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"}, {"type": "image_url", "image_url": {"url": url}}]}])


def test_serve_endpoints_and_sigterm(model_dir):
    with Serving(model_dir) as s:
        url = s.wait_ready()
        cmd = next(line for line in s.stdout if line.startswith("command: "))
        assert "llama-server" in cmd and "--mmproj " in cmd
        content, plain = _check_endpoints(url, model_dir)
        assert "draft_n" not in plain.get("timings", {})
        server_pid = s.server_pid
        os.kill(s.proc.pid, signal.SIGTERM)
        t0 = time.monotonic()
        while (_alive(server_pid) or _port_open(s.port)) and time.monotonic() - t0 < 10:
            time.sleep(0.1)
        assert not _alive(server_pid), "llama-server still running 10 s after SIGTERM to ggufbridge"
        assert not _port_open(s.port)
        assert s.proc.wait(10) == 0


def test_serve_with_draft_gives_the_same_greedy_text(model_dir):
    with Serving(model_dir) as s:
        url = s.wait_ready()
        reference, _ = _check_endpoints(url, model_dir)
        os.kill(s.proc.pid, signal.SIGINT)
        s.proc.wait(15)
    with Serving(model_dir, "--draft") as s:
        url = s.wait_ready()
        cmd = next(line for line in s.stdout if line.startswith("command: "))
        assert "--spec-type draft-dspark" in cmd and "-md " in cmd
        content, plain = _check_endpoints(url, model_dir)
        assert plain["timings"]["draft_n"] > 0  # the server really drafted
        assert content == reference


def test_serve_run_once_and_bench_from_python(model_dir, tmp_path):
    """The library functions the commands call: `serve` reports its command, plan and ready line, answers, and
    stops on SIGINT with nothing left running; `run_once` gives the text the served model gives for the same chat;
    `bench` returns its measurements without writing the report files."""
    from ggufbridge.runtime import bench, run_once, serve

    lines, seen = [], {}

    def say(line: str) -> None:
        lines.append(line)
        if line.startswith("ready: "):
            url = line.split()[1].removesuffix("/v1")
            status, body = sv.http_json(url + "/v1/chat/completions", CHAT)
            seen.update(status=status, content=body["choices"][0]["message"]["content"], url=url)
            seen["server_pids"] = [pid for pid in _children(os.getpid())
                                   if b"llama-server" in Path(f"/proc/{pid}/cmdline").read_bytes()]
            os.kill(os.getpid(), signal.SIGINT)

    port = sv.free_port()
    end = serve(model_dir, port=port, ctx=2048, log_path=tmp_path / "server.log", say=say)
    assert end.signum == signal.SIGINT and end.ready
    assert lines[0].startswith("command: ") and f"--port {port}" in lines[0]
    assert lines[1].startswith("memory plan") and lines[-1].startswith("ready: ")
    assert seen["status"] == 200 and seen["content"]
    assert not _port_open(port) and seen["server_pids"] and not any(_alive(pid) for pid in seen["server_pids"])

    answer = run_once(model_dir, CHAT["messages"][0]["content"], n_predict=CHAT["max_tokens"])
    assert answer == seen["content"]

    result = bench(model_dir, prompt_lengths=[16], n_predict=4, log_dir=tmp_path / "bench")
    assert [r["prompt_tokens"] for r in result["rows"]] == [16] and result["rows"][0]["target"]["decode_tok_s"] > 0
    assert list(result["commands"]) == ["target"] and not (tmp_path / "bench" / "bench.json").exists()


def test_killed_ggufbridge_leaves_no_server(model_dir):
    with Serving(model_dir) as s:
        s.wait_ready()
        server_pid = s.server_pid
        os.kill(s.proc.pid, signal.SIGKILL)
        s.proc.wait(10)
        t0 = time.monotonic()
        while (_alive(server_pid) or _port_open(s.port)) and time.monotonic() - t0 < 10:
            time.sleep(0.1)
        assert not _alive(server_pid), "llama-server survived its killed parent"
        assert not _port_open(s.port)


def test_api_key_is_required_and_masked(model_dir):
    with Serving(model_dir, "--api-key", "sekret-123") as s:
        url = s.wait_ready()
        assert not any("sekret-123" in line for line in s.stdout)
        assert any("--api-key '***'" in line or "--api-key ***" in line for line in s.stdout)
        status, _ = sv.http_json(url + "/v1/models")
        assert status == 401
        _check_endpoints(url, model_dir, key="sekret-123")


def test_port_in_use_is_refused(model_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = CliRunner().invoke(cli, ["serve", str(model_dir), "--port", str(port), "--ctx", "2048"])
    assert res.exit_code == 2
    assert f"port {port} on 127.0.0.1 is already in use" in res.stderr
    assert "Traceback" not in res.output


@pytest.mark.parametrize("with_image", [False, True])
def test_run_with_a_prompt_longer_than_the_context_says_so(model_dir, tmp_path, with_image):
    """Text: llama-cli logs the refusal and exits 0 with an empty answer (run printed nothing and exited 0).
    Image: the server's JSON error was shown as a Python dict repr."""
    from PIL import Image

    prompt = " ".join(f"word{i}" for i in range(600))
    extra = []
    if with_image:
        Image.new("RGB", (32, 32), "red").save(tmp_path / "i.png")
        extra = ["--image", str(tmp_path / "i.png")]
    res = CliRunner().invoke(cli, ["run", str(model_dir), "-p", prompt, "--ctx", "256", "-n", "2", *extra])
    assert res.exit_code == 2, res.output
    assert "exceeds the available context size (256 tokens)" in res.stderr, res.stderr
    assert "{'" not in res.stderr, res.stderr


@pytest.mark.parametrize("host, message", [
    ("nonsense.invalid", "--host nonsense.invalid: cannot listen there"),
    ("192.0.2.1", "--host 192.0.2.1: cannot listen there"),  # TEST-NET-1: no interface of this machine has it
])
def test_a_host_that_is_not_this_machine_is_not_called_a_busy_port(model_dir, host, message):
    """--host with an unknown name or another machine's address said "port 8080 ... is already in use"."""
    res = CliRunner().invoke(cli, ["serve", str(model_dir), "--host", host, "--port", str(sv.free_port()),
                                   "--ctx", "2048", "--api-key", "k"])
    assert res.exit_code == 2, res.output
    assert message in res.stderr and "already in use" not in res.stderr, res.stderr


def _error_lines(res) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.strip() and not ln.startswith(("command:", "memory plan", "  "))]


def test_early_death_reports_the_servers_reason(model_dir, tmp_path):
    recipe = tmp_path / "bad.toml"
    recipe.write_text('base = "cpu"\nname = "bad"\n[server]\nctx = 2048\nextra_args = ["--no-such-flag"]\n')
    res = CliRunner().invoke(cli, ["serve", str(model_dir), "--recipe", str(recipe), "--port", str(sv.free_port()),
                                   "--log", str(tmp_path / "s.log")])
    assert res.exit_code == 2
    (line,) = _error_lines(res)  # one line: the server's own complaint, and where its log is
    assert "llama-server exited with code" in line and "during start-up" in line, line
    assert "--no-such-flag" in line and str(tmp_path / "s.log") in line, line


@pytest.mark.parametrize("command", ["serve", "run"])
def test_a_model_the_runtime_refuses_is_one_line_with_its_reason(model_dir, tmp_path, command):
    """A GGUF whose header reads fine but whose shapes the runtime rejects: the error was the log's last 15 lines
    (spinner and all); the line that says why is llama.cpp's first error."""
    import shutil
    import struct

    bad = tmp_path / "bad"
    shutil.copytree(model_dir, bad, ignore=shutil.ignore_patterns("*.log"))
    target = next(p for p in bad.glob("MiniCPM-*.gguf"))
    raw = bytearray(target.read_bytes())
    name = b"token_embd.weight"
    at = raw.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    (nd,) = struct.unpack_from("<I", raw, at)
    dims = struct.unpack_from(f"<{nd}Q", raw, at + 4)
    struct.pack_into(f"<{nd}Q", raw, at + 4, *reversed(dims))  # same bytes, transposed shape
    target.write_bytes(bytes(raw))
    args = ["--port", str(sv.free_port())] if command == "serve" else ["-p", "hi", "-n", "2"]
    res = CliRunner().invoke(cli, [command, str(bad), "--ctx", "2048", *args])
    assert res.exit_code == 2, res.output
    (line,) = _error_lines(res)
    assert line.startswith("Error: ") and "token_embd.weight' has wrong shape" in line, line


def test_serve_refuses_an_incomplete_runtime(model_dir, tmp_path):
    b = fake_bin(tmp_path)
    res = CliRunner().invoke(cli, ["serve", str(model_dir), "--draft", "--llama-bin", str(b),
                                   "--port", str(sv.free_port())])
    assert res.exit_code == 2
    assert "arch dflash" in res.stderr and "draft-dspark" in res.stderr and "build_runtime.sh" in res.stderr


def test_serve_over_rpc_worker(model_dir, tmp_path):
    """spark-x2 with the second host played by ggml-rpc-server on loopback (CPU device)."""
    rt = loc.locate()
    rpc_port = sv.free_port()
    worker = sv.spawn([str(rt.tool("ggml-rpc-server")), "--host", "127.0.0.1", "--port", str(rpc_port)],
                      env=rt.env(), log_path=tmp_path / "rpc.log")
    try:
        t0 = time.monotonic()
        while not _port_open(rpc_port) and time.monotonic() - t0 < 20:
            time.sleep(0.1)
        recipe = tmp_path / "x2-cpu.toml"
        recipe.write_text('base = "spark-x2"\nname = "spark-x2-loopback"\nbackend = "cpu"\n'
                          '[memory]\nunified = false\ngpu_gib = []\nhost_gib = 8\nheadroom_gib = 0\n'
                          'compute_mib = 256\n[rpc]\nworker_gib = 4\nworker_headroom_gib = 0\n'
                          '[server]\nctx = 2048\nmin_ctx = 2048\nflash_attn = "auto"\n'
                          'extra_args = ["-v"]\n')  # -v: libllama logs where each buffer went
        dry = CliRunner().invoke(cli, ["serve", str(model_dir), "--recipe", str(recipe), "--dry-run",
                                       "--rpc", f"127.0.0.1:{rpc_port}"])
        assert dry.exit_code == 0, dry.output
        assert f"--rpc 127.0.0.1:{rpc_port}" in dry.stdout and "rpc0" in dry.stdout
        port = sv.free_port()
        env = dict(os.environ, PYTHONPATH=str(REPO))
        log = tmp_path / "server.log"
        proc = subprocess.Popen([sys.executable, "-m", "ggufbridge", "serve", str(model_dir), "--recipe", str(recipe),
                                 "--rpc", f"127.0.0.1:{rpc_port}", "--port", str(port), "--log", str(log)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            line = ""
            t0 = time.monotonic()
            while not line.startswith("ready: ") and time.monotonic() - t0 < 120:
                line = proc.stdout.readline()
                if not line and proc.poll() is not None:
                    raise AssertionError(proc.stderr.read())
            url = line.split()[1].removesuffix("/v1")
            status, plain = _post(url + "/v1/chat/completions", CHAT)
            assert status == 200 and plain["usage"]["completion_tokens"] > 0
            text = log.read_text(errors="replace")
            # the layers' weights really went to the RPC device
            rpc_buf = [ln for ln in text.splitlines() if "RPC0" in ln and "model buffer size" in ln]
            assert rpc_buf, text[-2000:]
            # and as much as the planner put on the worker
            planned = json.loads(CliRunner().invoke(cli, ["plan", str(model_dir), "--recipe", str(recipe),
                                                          "--json"]).stdout)
            rpc_pool = next(p for p in planned["pools"] if p["name"] == "rpc0")
            assert abs(float(rpc_buf[0].split("=")[1].split()[0]) - rpc_pool["use"]["weights"] / 2**20) < 0.02
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)
    finally:
        sv.stop(worker)

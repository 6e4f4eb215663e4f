"""The first hour of a user (issue 41), each point as the user meets it: through the CLI as typed (click's runner,
or a subprocess where the output of child processes and logging matter).

- the demo builds into a stable folder, drafts for real, answers about a picture, and ends with the command that
  serves what it built, which then answers a chat with an image (the acceptance test: the README's two commands,
  reusing the set-up venv, then the printed command);
- a failed request says the server's reason; bench refuses lengths the model cannot hold before starting;
- MODEL.gguf picks up the projector beside it, or says in one line that it is text-only;
- `--draft` is a flag and never eats MODEL; the old `--draft FILE` is refused naming `--model-draft`;
- progress bars for bench, imatrix and quantize, and llama.cpp's own log lines only with -v;
- plan ends with a verdict for this machine; doctor shows the machine and one patch per line; quantize --fit
  does not print its search bound as a budget;
- the smaller points: the README's setup facts, defaults written one way, help for every option, run
  --show-command, verify's exit code, serve's default answer length, plot ticks and legends.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from _cores import THREADS
from _runtime_models import converted
from ggufbridge.cli import COMMANDS, cli
from ggufbridge.errors import ServerError
from ggufbridge.runtime import server as sv

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(REPO))


def _gb(*args, cwd=None, timeout=1800) -> subprocess.CompletedProcess:
    """`ggufbridge ARGS` as a user runs it (this checkout's package), output captured."""
    return subprocess.run([sys.executable, "-m", "ggufbridge", *args], capture_output=True, text=True, env=ENV,
                          cwd=cwd, timeout=timeout, stdin=subprocess.DEVNULL)


def _runtime():
    from ggufbridge.runtime.locate import RuntimeNotFound, locate

    try:
        return locate()
    except RuntimeNotFound as e:
        pytest.skip(f"no llama.cpp runtime: {e}")


@pytest.fixture(scope="module")
def out(make_ckpt, tmp_path_factory) -> Path:
    """A converted folder: F32 target (4,096 tokens of trained context), mmproj and a random draft."""
    return converted(make_ckpt, tmp_path_factory, with_draft=True)


def _roles(folder: Path) -> dict[str, Path]:
    return {f["role"]: folder / f["path"] for f in json.loads((folder / "manifest.json").read_text())["files"]}


# --- 1. the demo leads somewhere --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_demo_builds_a_stable_folder_and_its_next_command_serves_it(tmp_path):
    """`ggufbridge demo` (after setup, whose venv this reuses) in a fresh folder: ./ggufbridge-demo, drafts accepted
    with the greedy output unchanged, an image answer, files listed with their subfolders, and the exact serve
    command, which, run as printed, answers a chat with an image through the draft."""
    _runtime()
    first = _gb("demo", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    text = first.stdout
    demo = tmp_path / "ggufbridge-demo"
    assert (demo / "model" / "manifest.json").is_file()
    roles = _roles(demo / "model")
    assert set(roles) == {"target", "mmproj", "draft"}
    for role, path in roles.items():  # each file listed with its subfolder
        assert f"model/{path.name}" in text, role
    m = re.search(r"(\d+) of (\d+) drafted tokens accepted \(\d+%\); output equal to target-only", text)
    assert m and int(m.group(1)) > 0 and int(m.group(1)) <= int(m.group(2)), text
    answer = re.search(r"^image answer \(.*?\): (.*)$", text, re.M)
    assert answer and answer.group(1) not in ("''", '""'), text
    serve_line = re.search(r"^  (\S*ggufbridge) serve (\S+) --draft$", text, re.M)
    assert serve_line, text
    assert re.search(r"chat page: http://127\.0\.0\.1:8080/", text)

    # the printed command, as printed (the program is this checkout's; a free port instead of 8080 for the test)
    words = shlex.split(serve_line.group(0))
    assert words[1:] == ["serve", "ggufbridge-demo/model", "--draft"]
    port = sv.free_port()
    argv = [sys.executable, "-m", "ggufbridge", "serve", str(tmp_path / words[2]), *words[3:], "--port", str(port),
            "--threads", str(THREADS)]  # the folder as the demo's working directory resolves it
    with sv.Server(argv, "127.0.0.1", port, tmp_path / "serve.console", env=ENV) as srv:
        srv.wait_ready(300)
        from ggufbridge.runtime.oneshot import image_part

        status, body = sv.http_json(srv.url + "/v1/chat/completions", {
            "messages": [{"role": "user", "content": [image_part(str(demo / "picture.png")),
                                                      {"type": "text", "text": "What is in this picture?"}]}],
            "max_tokens": 16, "temperature": 0, "seed": 0})
    assert status == 200, body
    got = body["choices"][0]["message"]["content"]
    assert repr(got) == answer.group(1)  # what the demo's own drafted server answered
    assert body["timings"]["draft_n_accepted"] > 0  # served with the draft, which the target accepts

    again = _gb("demo", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "reused from an earlier run" in again.stderr and "model" in again.stderr
    assert again.stdout.splitlines()[-3:] == text.splitlines()[-3:]


# --- 2. failures with reasons -----------------------------------------------------------------------------------------

class _Refusing(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.dumps({"error": {"code": 400, "type": "exceed_context_size_error",
                                     "message": "request (8209 tokens) exceeds the available context size "
                                                "(4096 tokens), try increasing it"}}).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_refused_request_says_the_server_reason():
    """What bench's and concurrency's streamed requests raised was urllib's `HTTP Error 400: Bad Request`; the
    server's reason was only in its log."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        with pytest.raises(ServerError, match=r"answered 400: request \(8209 tokens\) exceeds the available context "
                                              r"size \(4096 tokens\)"):
            sv.complete_stream(url, [1, 2, 3], 4)
        import time

        with pytest.raises(ServerError, match="exceeds the available context size"):
            sv.chat_stream(url, "hi", 4, time.perf_counter())
    finally:
        srv.shutdown()


@pytest.mark.parametrize("flag, lengths, longest", [("--prompt-lengths", "1k,2k,8k", 8192),
                                                     ("--depths", "1k,32k,128k,250k", 256000)])
def test_bench_refuses_lengths_past_the_context_before_starting(out, tmp_path, flag, lengths, longest):
    """The README's own lines on a model trained for 4,096 tokens: one Error line naming both numbers, and no server
    started (llama-server caps each slot at the trained context, whatever -c says)."""
    res = CliRunner().invoke(cli, ["bench", str(out), "--draft", flag, lengths, "-o", str(tmp_path / "b"),
                                   "--threads", str(THREADS)])
    assert res.exit_code == 2, res.output
    line = res.output.strip().splitlines()[-1]
    assert line.startswith("Error: ") and f"({longest} prompt + 128 generated tokens)" in line, res.output
    assert "trained for 4096" in line and "HTTP Error" not in res.output
    assert not list((tmp_path / "b").glob("llama-server-*.log"))


def test_a_gguf_file_uses_the_mmproj_beside_it_and_says_so(out, tmp_path):
    roles = _roles(out)
    res = _gb("serve", str(roles["target"]), "--dry-run")
    assert res.returncode == 0, res.stderr
    assert f"--mmproj {roles['mmproj']}" in res.stdout
    assert f"mmproj: {roles['mmproj'].name} (beside the model)" in res.stderr
    alone = tmp_path / "alone"
    alone.mkdir()
    os.symlink(roles["target"], alone / roles["target"].name)
    res = _gb("serve", str(alone / roles["target"].name), "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "--mmproj" not in res.stdout
    assert [ln for ln in res.stderr.splitlines() if ln.startswith("text-only: no projector (mmproj) beside")]


# --- 3. --draft never eats MODEL ------------------------------------------------------------------------------------

def test_draft_flag_before_model(out):
    res = CliRunner().invoke(cli, ["serve", "--draft", str(out), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "--spec-type draft-dspark" in res.output
    res = CliRunner().invoke(cli, ["plan", "--draft", str(out), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["figures"]["draft_weights"] > 0


@pytest.mark.parametrize("command", ["serve", "run", "plan", "bench"])
def test_old_draft_file_spelling_names_the_new_one(out, command):
    roles = _roles(out)
    args = [command, str(roles["target"]), "--draft", str(roles["draft"])] + (["-p", "hi"] if command == "run" else [])
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    assert "--model-draft FILE" in res.output and "-md FILE" in res.output


def test_model_draft_names_the_draft_and_turns_drafting_on(out):
    roles = _roles(out)
    res = CliRunner().invoke(cli, ["serve", str(roles["target"]), "-md", str(roles["draft"]), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert f"-md {roles['draft']}" in res.output and "--spec-type draft-dspark" in res.output


# --- 4. progress, and llama.cpp's log only with -v --------------------------------------------------------------------

_LLAMA_LOG = re.compile(r"^(llama_|load_tensors|print_info|llm_load|main:|system_info|common_)", re.M)


@pytest.mark.slow
def test_imatrix_and_quantize_show_progress_and_no_llama_log(out, tmp_path):
    _runtime()
    text = tmp_path / "calib.txt"
    text.write_text("The river wound through the valley past orchards and stone bridges. " * 200)
    res = _gb("imatrix", str(out), "--text", str(text), "--ctx", "64", "--chunks", "4", "-o",
              str(tmp_path / "im.gguf"), "--threads", str(THREADS))
    assert res.returncode == 0, res.stderr[-2000:]
    assert re.search(r"imatrix chunks: 100%\|.*\| 4/4", res.stderr), res.stderr[-2000:]
    assert not _LLAMA_LOG.search(res.stdout + res.stderr), (res.stdout + res.stderr)[:2000]
    target = _roles(out)["target"]
    res = _gb("quantize", str(target), "-o", str(tmp_path / "q8.gguf"), "--quant", "Q8_0", "--threads", str(THREADS))
    assert res.returncode == 0, res.stderr[-2000:]
    m = re.search(r"quantising tensors: 100%\|.*\| (\d+)/(\d+)", res.stderr)
    assert m and m.group(1) == m.group(2), res.stderr[-2000:]
    assert not _LLAMA_LOG.search(res.stdout + res.stderr), (res.stdout + res.stderr)[:2000]
    verbose = _gb("-v", "quantize", str(target), "-o", str(tmp_path / "q8b.gguf"), "--quant", "Q8_0", "--threads",
                  str(THREADS))
    assert verbose.returncode == 0 and "llama_model_quantize" in verbose.stderr


@pytest.mark.slow
def test_bench_shows_a_bar_per_request(out, tmp_path):
    _runtime()
    res = _gb("bench", str(out), "--prompt-lengths", "16,32", "-n", "4", "--threads", str(THREADS), "-o",
              str(tmp_path / "b"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert re.search(r"bench requests: 100%\|.*\| 2/2", res.stderr), res.stderr[-2000:]


# --- 5. a plan that decides -------------------------------------------------------------------------------------------

def test_plan_ends_with_a_verdict_for_this_machine(out):
    from ggufbridge.runtime.machine import meminfo

    res = _gb("plan", str(out), "--recipe", "cpu")
    assert res.returncode == 0, res.stderr
    text = res.stdout
    assert "this machine:" in text and "RAM" in text
    verdicts = re.findall(r"^  recipe (\S+): (fits here with [\d.]+ GiB spare|does not fit here|no plan|not checked)",
                          text, re.M)
    assert {"cpu", "rtx4090", "spark", "h200"} <= {name for name, _ in verdicts}, text
    assert dict(verdicts)["cpu"].startswith("fits here with")  # a tiny model on this machine's RAM
    assert re.search(r"^here with recipe cpu: the largest that fits is \S+", text, re.M), text
    total, _ = meminfo()
    if total is not None and total < 60 * 2**30:  # the cpu recipe budgets 60 GiB of host memory
        assert "warning: recipe cpu budgets 60.0 GiB of host memory; this machine has" in text


def test_verdict_and_warning_against_a_small_machine(out, tmp_path):
    """The judgement itself, against a 23 GiB machine without GPUs: the cpu recipe's 60 GiB budget is warned about;
    a GPU recipe does not fit (no CUDA0 here); the rtx4090 plan of the real model's size would not either."""
    from ggufbridge.runtime import machine as mc
    from ggufbridge.runtime.session import prepare

    small = mc.Machine(23 * 2**30, 20 * 2**30, 2, [], "test")
    s = prepare(str(out), "cpu", need_runtime=False)
    v = mc.verdict(s.plan, small)
    assert v.fits and 19 * 2**30 < v.spare < 20 * 2**30
    assert mc.budget_warnings(s.plan, small) == [
        "warning: recipe cpu budgets 60.0 GiB of host memory; this machine has 23.0 GiB (20.0 GiB available): the "
        "table above is the recipe's machine, not this one"]
    rec = tmp_path / "my4090.toml"  # F16 K/V: the tiny model's head_dim 16 is no whole q8_0 block
    rec.write_text('base = "rtx4090"\nname = "my4090"\n[server]\ncache_type_k = "f16"\ncache_type_v = "f16"\n')
    gpu = prepare(str(out), str(rec), need_runtime=False)
    v = mc.verdict(gpu.plan, small)
    assert not v.fits and v.missing == ["CUDA0"] and "not found here" in v.line()
    tight = mc.Machine(23 * 2**30, s.plan.pools[-1].total - 2**30, 2, [], "test")
    v = mc.verdict(s.plan, tight)
    assert not v.fits and v.line().startswith("recipe cpu: does not fit here by 1.0 GiB")
    with_gpu = mc.Machine(64 * 2**30, 60 * 2**30, 8, [mc.Device("CUDA0", "RTX 4090", 24 * 2**30, 23 * 2**30)], "t")
    assert mc.verdict(gpu.plan, with_gpu).fits


def test_list_devices_output_is_read():
    from ggufbridge.runtime.machine import parse_devices

    text = ("Available devices:\n  CUDA0: NVIDIA H200 (143771 MiB, 142000 MiB free)\n"
            "  CUDA1: NVIDIA H200 (143771 MiB, 1000 MiB free)\n")
    devs = parse_devices(text)
    assert [(d.name, d.total >> 20, d.free >> 20) for d in devs] == [("CUDA0", 143771, 142000), ("CUDA1", 143771, 1000)]
    assert parse_devices("Available devices:\n  (none)\n") == []


def test_doctor_shows_the_machine_and_one_patch_per_line():
    rt = _runtime()
    res = CliRunner().invoke(cli, ["doctor"])
    lines = res.output.splitlines()
    assert any(ln.startswith("machine   ") and "RAM" in ln and "CPU core" in ln for ln in lines), res.output
    assert any(ln.startswith("cuda      ") for ln in lines), res.output
    for name in rt.patches:  # each patch alone on its line
        assert f"            {name}" in lines, name


def test_quantize_fit_does_not_print_its_search_bound_as_a_budget(monkeypatch, tmp_path):
    """`quantize --fit rtx4090`: the bisection's last bound is not a budget anyone set; the line says what was
    fitted (the recipe's GPU at the context). The measurement itself is tested in test_quant_fit.py."""
    from types import SimpleNamespace

    from ggufbridge.quant import optimise

    plan = SimpleNamespace(mix=SimpleNamespace(name="fit-x"), file_bytes=1000, budget=123456789, predicted_kl=0.01)
    sens = SimpleNamespace(n_tokens=64, reference="gguf:src")
    res = SimpleNamespace(path=None, report=SimpleNamespace(path=None, file_bytes=1000, rows=[]),
                          mix="fit-x", file_type="Q8_0")

    def fake_fit(src, dst, **kw):
        Path(dst).write_bytes(b"x")
        return res, plan, sens

    monkeypatch.setattr(optimise, "fit_quantize", fake_fit)
    monkeypatch.setattr("ggufbridge.quant.report.format_quant_report", lambda r: "", raising=False)
    monkeypatch.setattr("ggufbridge.quant.format_quant_report", lambda r: "", raising=False)
    src = tmp_path / "in.gguf"
    src.write_bytes(b"GGUF")
    r = CliRunner().invoke(cli, ["quantize", str(src), "-o", str(tmp_path / "o.gguf"), "--fit", "rtx4090"])
    assert r.exit_code == 0, r.output
    fit = next(ln for ln in r.output.splitlines() if ln.startswith("fit: "))
    assert "123,456,789" not in fit and "123456789" not in fit
    assert "fits recipe rtx4090's GPU memory with one slot of 8192 tokens" in fit


# --- 7. the smaller points ----------------------------------------------------------------------------------------

def test_readme_says_what_setup_takes_and_does():
    text = (REPO / "README.md").read_text()
    assert re.search(r"about \d+ minutes", text)
    assert "downloads" in text and "Chromium through `apt-get`" in text and "as root" in text
    assert "`.venv/bin/ggufbridge` until you activate the venv" in text
    assert "`verify` exits 3" in text


def _help_texts():
    for name in sorted(COMMANDS):
        cmd = cli.get_command(None, name)
        for p in cmd.params:
            if getattr(p, "hidden", False) or p.name in ("help",):
                continue
            yield name, p


def test_every_option_has_help_and_defaults_are_written_one_way():
    bad = []
    for name, p in _help_texts():
        if not hasattr(p, "help") or p.param_type_name != "option":
            continue
        h = p.help or ""
        if not h.strip():
            bad.append(f"{name} {p.opts[0]}: no help")
        if re.search(r"\(default|Default:", h):
            bad.append(f"{name} {p.opts[0]}: {h}")
        for br in re.findall(r"\[([^\[\]]*)\]", h):
            if not br.startswith("default: ") and re.search(r"[\d ~]", br) and not re.match(r"^[,.A-Z@:]", br):
                bad.append(f"{name} {p.opts[0]}: [{br}]")
    assert not bad, "\n".join(bad)


def test_run_show_command_help_names_what_it_prints():
    show = next(p for p in cli.get_command(None, "run").params if p.name == "show_command")
    assert "llama-cli for text, llama-server for --image/--video" in show.help


def test_serve_gives_requests_without_max_tokens_a_sane_length(out):
    res = CliRunner().invoke(cli, ["serve", str(out), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert " -n 4096 " in res.output
    res = CliRunner().invoke(cli, ["serve", str(out), "--dry-run", "-n", "-1"])
    assert " -n -1 " in res.output


def test_plot_ticks_read_as_the_options_and_the_legend_covers_no_curve():
    import matplotlib.pyplot as plt

    from ggufbridge.runtime.benchmark import two_panel_figure

    xs = [1024, 32768, 131072, 256000]
    result = {"model": "m", "recipe": "cpu", "runtime": {"commit": "c"}}
    fig = two_panel_figure(result, "depth", ("decode", "prefill"),
                           [("target", "o-", xs, [9, 8, 7, 6], [5, 4, 3, 2]), ("draft", "s--", xs, [9, 9, 7, 5],
                                                                                    [5, 5, 3, 1])])
    try:
        for ax in fig.axes:
            assert [t.get_text() for t in ax.get_xticklabels()] == ["1k", "32k", "128k", "250k"]
            assert ax.get_legend() is None  # no legend inside a panel, over its curves
        assert len(fig.legends) == 1
        fig.canvas.draw()
        box = fig.legends[0].get_window_extent()
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent())
    finally:
        plt.close(fig)


def test_verify_exit_code_for_a_difference_is_documented():
    usage = (REPO / "docs" / "usage.md").read_text()
    assert "`verify` exits 3 when it checked and something differs" in usage
    from ggufbridge.cli.verify import DIFFERS

    assert DIFFERS == 3

"""`serve --rpc local`: a multi-host recipe with its two workers played by ggml-rpc-server processes on loopback.

The reference is the same model served on one host (same runtime, same settings, no RPC): greedy output must be
identical, the layers' weights must really sit on the two workers (the runtime's own buffer lines), and no worker
may outlive the command, whether it is stopped by SIGTERM, Ctrl-C (SIGINT) or killed outright.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ggufbridge.runtime import server as sv

from _lines import Lines, stderr_of
from _runtime_models import converted
from _cores import THREADS

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
# spark-x2 on a CPU-only runtime: no local GPU, two RPC workers take every layer
RECIPE = ('base = "spark-x2"\nname = "spark-x2-loopback"\nbackend = "cpu"\n'
          '[memory]\nunified = false\ngpu_gib = []\nhost_gib = 8\nheadroom_gib = 0\ncompute_mib = 256\n'
          '[rpc]\nworkers = 2\nworker_gib = 4\nworker_headroom_gib = 0\n'
          '[server]\nctx = 2048\nmin_ctx = 2048\nflash_attn = "auto"\nextra_args = ["-lv", "4"]\n')
SINGLE = ('base = "cpu"\nname = "single-host"\n[server]\nctx = 2048\nmin_ctx = 2048\nflash_attn = "auto"\n'
          'extra_args = ["-lv", "4"]\n')
PROMPT = "The river wound through the valley, past orchards and"


@pytest.fixture(scope="module")
def model_dir(make_ckpt, tmp_path_factory) -> Path:
    return converted(make_ckpt, tmp_path_factory, with_draft=False)


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                kids = [int(x) for x in (task / "children").read_text().split()]
                out += kids
                todo += kids
        except FileNotFoundError:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _exe(pid: int) -> str:
    try:
        return Path(os.readlink(f"/proc/{pid}/exe")).name
    except OSError:
        return ""


class Serve:
    """`python -m ggufbridge serve` as the user runs it; `.ready()` waits for its `ready:` line."""

    def __init__(self, model_dir: Path, recipe: Path, log: Path, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ggufbridge", "serve", str(model_dir), "--recipe", str(recipe), "--port",
             str(sv.free_port()), "--threads", str(THREADS), "--log", str(log), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
            start_new_session=True)
        self.lines = Lines(self.proc.stdout)
        self.out: list[str] = self.lines.seen

    def ready(self, timeout: float = 180) -> str:
        line = self.lines.wait_for("ready: ", timeout)
        if line is None:
            raise AssertionError("".join(self.out) + stderr_of(self.proc))
        return line.split()[1].removesuffix("/v1")

    def kill_all(self):
        for pid in [self.proc.pid, *_descendants(self.proc.pid)]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)


def _greedy(url: str) -> str:
    status, body = sv.http_json(url + "/completion", {"prompt": PROMPT, "n_predict": 12, "temperature": 0.0,
                                                      "top_k": 1, "seed": 0, "cache_prompt": False})
    assert status == 200, body
    return body["content"]


@pytest.fixture(scope="module")
def single_host(model_dir, tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("single")
    (d / "r.toml").write_text(SINGLE)
    s = Serve(model_dir, d / "r.toml", d / "server.log")
    try:
        return _greedy(s.ready())
    finally:
        s.kill_all()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_two_loopback_workers_match_single_host_and_stop_with_the_command(model_dir, single_host, tmp_path, stop):
    recipe = tmp_path / "x2.toml"
    recipe.write_text(RECIPE)
    log = tmp_path / "server.log"
    s = Serve(model_dir, recipe, log, "--rpc", "local")
    try:
        url = s.ready()
        out = "".join(s.out)
        endpoints = re.findall(r"RPC worker \d: (127\.0\.0\.1:\d+)", out)
        assert len(endpoints) == 2, out
        assert f"--rpc {','.join(endpoints)}" in out  # the server was pointed at exactly those workers
        kids = _descendants(s.proc.pid)
        workers = [p for p in kids if _exe(p) == "ggml-rpc-server"]
        servers = [p for p in kids if _exe(p) == "llama-server"]
        assert len(workers) == 2 and len(servers) == 1, [(p, _exe(p)) for p in kids]
        for p in workers:  # loopback only
            assert "127.0.0.1" in Path(f"/proc/{p}/cmdline").read_text().split("\0")

        assert _greedy(url) == single_host

        text = log.read_text(errors="replace")
        # each worker's device is named RPC0[HOST:PORT] by the runtime: the layers' weights went to both
        on_rpc = {ep: float(mib) for ep, mib in
                  re.findall(r"RPC\d\[([\d.:]+)\] model buffer size =\s*([\d.]+) MiB", text)}
        assert set(on_rpc) == set(endpoints) and min(on_rpc.values()) > 0, text[-3000:]

        os.kill(s.proc.pid, stop)
        s.proc.wait(30)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in workers + servers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in workers + servers if _alive(p)], "a worker or the server outlived the command"
        if stop != signal.SIGKILL:
            assert s.proc.returncode == 0, s.proc.stderr.read()
    finally:
        s.kill_all()


def test_rpc_local_needs_a_recipe_with_workers(model_dir):
    from click.testing import CliRunner

    from ggufbridge.cli import cli

    res = CliRunner().invoke(cli, ["serve", str(model_dir), "--recipe", "cpu", "--rpc", "local"])
    assert res.exit_code == 2
    assert "--rpc local: recipe cpu has no RPC workers" in res.stderr


@pytest.mark.parametrize("ngl", [3, 5])
def test_plan_places_each_layer_where_the_runtime_does(model_dir, tmp_path, ngl):
    """The planner's layer map against llama.cpp's own (`load_tensors: layer N assigned to device D`, logged with
    -v): -ngl counts the output layer and the split points are the runtime's float32 ones. With -ngl 3 on the
    tiny 4-block target the first two blocks stay on the host and the output goes to the second worker (the old
    planner put blocks 1-3 on the workers and the output on the host)."""
    import json

    from click.testing import CliRunner

    from ggufbridge.cli import cli

    recipe = tmp_path / "x2.toml"
    recipe.write_text(RECIPE.replace('extra_args = ["-lv", "4"]', f'n_gpu_layers = {ngl}\nextra_args = ["-v"]'))
    res = CliRunner().invoke(cli, ["plan", str(model_dir), "--recipe", str(recipe), "--json"])
    assert res.exit_code == 0, res.output
    planned = json.loads(res.stdout)["layers"]
    log = tmp_path / "server.log"
    s = Serve(model_dir, recipe, log, "--rpc", "local")
    try:
        s.ready()
    finally:
        s.kill_all()
    seen = {int(i): dev for i, dev in re.findall(r"load_tensors: layer +(\d+) assigned to device (\w+)",
                                                 log.read_text(errors="replace"))}
    names = {"host": "CPU", "rpc0": "RPC0", "rpc1": "RPC1"}
    assert [seen[i] for i in range(len(planned))] == [names[p] for p in planned]
    assert len(set(planned)) == (3 if ngl == 3 else 2)

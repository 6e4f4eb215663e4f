"""`serve --dry-run` for every packaged recipe: the command follows the recipe and the plan, the runtime's own
argument parser accepts it, and nothing is started."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggufbridge.cli import cli
from ggufbridge.runtime import locate as loc
from ggufbridge.runtime.recipes import load_recipe, packaged_names

from _runtime_models import converted

pytestmark = pytest.mark.slow  # converts a tiny checkpoint once (a few seconds)


@pytest.fixture(scope="module")
def model_dir(make_ckpt, tmp_path_factory) -> Path:
    # "ksafe": head_dim 64, so the quantised KV cache of the rtx4090 recipe is allowed
    return converted(make_ckpt, tmp_path_factory, with_draft=True, spec="ksafe")


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def _children() -> set[int]:
    out = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        out |= {int(x) for x in (task / "children").read_text().split()}
    return out


@pytest.mark.parametrize("draft", [False, True], ids=["target", "draft"])
@pytest.mark.parametrize("name", sorted(packaged_names()))
def test_dry_run(model_dir, name, draft):
    recipe = load_recipe(name)
    before = _children()
    args = ["serve", str(model_dir), "--recipe", name, "--dry-run", "--port", "8099"] + (["--draft"] if draft else [])
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert _children() == before  # nothing launched
    out = res.stdout
    cmd_line = next(line for line in out.splitlines() if line.startswith("command: "))
    argv = shlex.split(cmd_line.removeprefix("command: "))
    srv = recipe.server
    assert Path(argv[0]).name == "llama-server"
    assert f"memory plan (recipe {name}): -c {_flag(argv, '-c')}" in out
    trained = 4096  # the fixture's max_position_embeddings -> context_length
    expected_ctx = min(srv["ctx"], trained, recipe.draft["ctx_cap"] if draft else srv["ctx"])
    # the recipe's slots with --draft too: this runtime carries the rollback patch (a runtime without it: below)
    assert loc.locate().exact_multislot_drafting
    slots = srv["parallel"]
    assert "--draft serves one slot" not in out and "lacks the patch" not in out
    if slots == 1:
        assert int(_flag(argv, "-c")) == expected_ctx and "--kv-unified" not in argv
    else:  # one unified pool of every slot's context, each slot capped at its own (runtime/memory.py)
        per_slot = -(-expected_ctx // 256) * 256
        assert int(_flag(argv, "-c")) == slots * per_slot and "--kv-unified" in argv
        assert int(_flag(argv, "--kv-unified-per-slot")) == per_slot
    assert f"slots: {slots} x {expected_ctx:,} tokens of context" in out
    # -b: the recipe's, raised with several slots so that prompts arriving together prefill in one iteration
    assert int(_flag(argv, "-b")) == (srv["batch"] if slots == 1 else max(srv["batch"], min(8192, slots * 1024)))
    assert (_flag(argv, "-ctk"), _flag(argv, "-ctv"), _flag(argv, "-fa")) == \
        (srv["cache_type_k"], srv["cache_type_v"], srv["flash_attn"])
    assert (_flag(argv, "-np"), _flag(argv, "--host"), _flag(argv, "--port")) == (str(slots), "127.0.0.1", "8099")
    assert _flag(argv, "-m") == str(model_dir / next(p.name for p in model_dir.glob("MiniCPM-V-4_7-*.gguf")))
    assert int(_flag(argv, "-ngl")) == (0 if recipe.backend == "cpu" else 5)  # tiny target: 4 blocks + head
    if recipe.rpc["workers"]:
        assert _flag(argv, "--rpc") == "WORKER0:50052" and _flag(argv, "--tensor-split")
        assert _flag(argv, "--device") == "RPC0,CUDA0"  # the planned devices, the worker first
        assert "ggml-rpc-server --host WORKER0 --port 50052" in out and "never bind 0.0.0.0" in out
    else:
        assert "--rpc" not in argv
    if draft:
        assert _flag(argv, "--spec-type") == "draft-dspark"
        assert _flag(argv, "--spec-draft-n-max") == str(recipe.draft["n_max"])
        assert Path(_flag(argv, "-md")).name.startswith("dspark")
        assert _flag(argv, "-ngld") == str(recipe.draft["n_gpu_layers"])
        assert "--ctx-size-draft" not in argv and "-cd" not in argv  # not a flag of this runtime
        assert "draft:" in out
    else:
        assert "-md" not in argv and "--spec-type" not in argv
    if recipe.backend != "cpu":  # this machine's runtime is CPU-only: the dry run says serving would be refused
        assert f"needs the {recipe.backend} backend" in out

    # the pinned llama-server's own parser accepts every flag and value (--version exits after parsing them;
    # --rpc is left out because its parser connects to the worker, and the devices it would name are then
    # unknown: their flags are checked with `none`)
    rt = loc.locate()
    parse = list(argv)
    if "--rpc" in parse:
        i = parse.index("--rpc")
        del parse[i:i + 2]
        for flag in ("--device", "--mmproj-device", "--device-draft"):
            if flag in parse:
                parse[parse.index(flag) + 1] = "none"
    p = subprocess.run([str(rt.tool("llama-server")), *parse[1:], "--version"], capture_output=True, text=True,
                       env=rt.env(), timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "commit 0c1e570" in p.stdout + p.stderr


def test_draft_on_a_runtime_without_the_rollback_patch_serves_one_slot(model_dir, monkeypatch):
    """A runtime whose libllama lacks patch memory-recurrent-rollback-snapshots-follow-cell (a stock build, an older
    series) can move one drafting stream into another's state: --draft then serves one slot unless --parallel asks
    for more, and says why either way."""
    monkeypatch.setattr(loc.Runtime, "exact_multislot_drafting", property(lambda self: False))
    res = CliRunner().invoke(cli, ["serve", str(model_dir), "--recipe", "cpu", "--draft", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "--draft serves one slot (the recipe has 4)" in res.stdout and " -np 1 " in res.stdout
    res = CliRunner().invoke(cli, ["serve", str(model_dir), "--recipe", "cpu", "--draft", "--parallel", "2",
                                   "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "--draft on 2 slots: this runtime lacks the patch" in res.stdout and " -np 2 " in res.stdout


def test_the_rollback_patch_is_recognised_in_the_library(tmp_path):
    for name, patched in (("stock", False), ("patched", True)):
        d = tmp_path / name / "bin"
        d.mkdir(parents=True)
        (d / "libllama.so").write_bytes(b"\0rs_s_copy\0" + (b"rs_s_copy_src\0" if patched else b""))
        assert loc.Runtime(bin_dir=d, source="--llama-bin").exact_multislot_drafting is patched


def test_quantised_kv_refused_for_small_head_dim(make_ckpt, tmp_path_factory):
    tiny = converted(make_ckpt, tmp_path_factory, with_draft=False)  # head_dim 16
    res = CliRunner().invoke(cli, ["serve", str(tiny), "--recipe", "rtx4090", "--dry-run"])
    assert res.exit_code == 2
    assert "KV cache type q8_0 needs head_dim divisible by 32, found 16" in res.stderr


def test_dry_run_rpc_needs_matching_endpoints(model_dir):
    res = CliRunner().invoke(cli, ["serve", str(model_dir), "--recipe", "spark-x2", "--rpc", "a:1,b:2"])
    assert res.exit_code == 2 and "needs 1 worker endpoint(s)" in res.stderr
    res = CliRunner().invoke(cli, ["serve", str(model_dir), "--recipe", "spark-x2", "--rpc", "0.0.0.0:50052"])
    assert res.exit_code == 2 and "worker's own address" in res.stderr
    res = CliRunner().invoke(cli, ["serve", str(model_dir), "--recipe", "spark-x2", "--rpc", "nohostport"])
    assert res.exit_code == 2 and "expected HOST:PORT" in res.stderr


def test_missing_draft_is_explained(make_ckpt, tmp_path_factory):
    plain = converted(make_ckpt, tmp_path_factory, with_draft=False)
    res = CliRunner().invoke(cli, ["serve", str(plain), "--draft", "--dry-run"])
    assert res.exit_code == 2 and "manifest.json lists no draft (dflash)" in res.stderr


@pytest.mark.parametrize("host", ["0", "0.0.0.0", "::"])
def test_dry_run_warns_on_a_wildcard_address(model_dir, host):
    """Issue 15: the warning was missing from --dry-run, and `--host 0` (which binds every address) was not seen."""
    res = CliRunner().invoke(cli, ["serve", str(model_dir), "--dry-run", "--host", host])
    assert res.exit_code == 0, res.output
    assert f"warning: listening on {host} without --api-key" in res.stderr
    res = CliRunner().invoke(cli, ["serve", str(model_dir), "--dry-run", "--host", host, "--api-key", "k"])
    assert res.exit_code == 0 and "warning: listening" not in res.stderr


@pytest.mark.parametrize("host,wild", [("0", True), ("0.0.0.0", True), ("::", True), ("[::]", True), ("0x0", True),
                                       ("127.0.0.1", False), ("::1", False), ("localhost", False),
                                       ("192.168.1.5", False)])
def test_wildcard_addresses(host, wild):
    from ggufbridge.runtime.lifecycle import wildcard

    assert wildcard(host) is wild

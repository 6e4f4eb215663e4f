"""Slots (-np, issue 28): what each slot costs in the plan, the server arguments that give every slot its context,
and the one-line refusal of more slots than memory holds."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ggufbridge.cli import cli
from ggufbridge.errors import PlanError
from ggufbridge.runtime import memory as pl
from ggufbridge.runtime.recipes import load_recipe

from _shape_gguf import write_qwen35moe
from test_plan import REAL_DRAFT, REAL_TEXT_CONFIG, with_weights

GIB = 1024**3


@pytest.fixture(scope="module")
def real() -> pl.TargetShape:
    return pl.TargetShape.from_config(REAL_TEXT_CONFIG)


def test_each_slot_gets_its_context_state_snapshots_and_checkpoints(real):
    """Per slot, by hand from the published shapes: the KV cache of its whole context (20,480 B/token in F16), the
    gated-delta-net state once per snapshot (1 + n_max with a draft) on the device, and up to 32 state copies
    (the server's context checkpoints) in host RAM; the draft's KV grows with the pool too."""
    recipe = load_recipe("h200")
    target = with_weights(real, 20)
    draft = REAL_DRAFT
    one = pl.evaluate(target, recipe, ctx=8192, ngl=41, n_cpu_moe=0, draft=draft, slots=1)
    four = pl.evaluate(target, recipe, ctx=8192, ngl=41, n_cpu_moe=0, draft=draft, slots=4)
    state = 65_863_680  # per snapshot (test_plan: 30 recurrent layers, F32)
    snapshots = 1 + recipe.draft["n_max"]
    gpu = lambda p: next(x for x in p.pools if x.name == "gpu0")  # noqa: E731
    host = lambda p: next(x for x in p.pools if x.name == "host")  # noqa: E731
    assert four.kv_cells == 4 * 8192 and four.figures["kv_total"] == 4 * 8192 * 20_480
    assert gpu(four).use["kv"] - gpu(one).use["kv"] == 3 * 8192 * 20_480
    assert gpu(four).use["state"] - gpu(one).use["state"] == 3 * snapshots * state
    assert host(four).use["state"] - host(one).use["state"] == 3 * 32 * state
    ub = recipe.server["ubatch"]
    # the draft's KV and its own attention mask (its compute buffer) span the pool
    assert gpu(four).use["draft"] - gpu(one).use["draft"] == 3 * 8192 * (10_240 + 2 * ub)
    assert gpu(four).use["weights"] == gpu(one).use["weights"]  # weights are shared by every slot
    # the F16 attention mask spans the whole pool (n_kv can reach every cell), and the reserved graph gathers one
    # recurrent layer's state for every slot and snapshot, in and out
    layer_state = state // 30
    assert gpu(four).use["compute"] - gpu(one).use["compute"] == 2 * ub * 3 * 8192 + 2 * 4 * snapshots * layer_state


def test_server_arguments_give_every_slot_its_context(real):
    """One slot: -c as before (the runtime pads it to 256). Several: a unified pool of slots x padded context cells
    and every slot capped at the padded context (what one slot alone gets), so no slot can use another's share."""
    recipe = load_recipe("cpu")
    plan = pl.make_plan(with_weights(real, 8), recipe, ctx=5000, slots=1)
    assert plan.context_args() == ["-c", "5000", "-np", "1"]
    plan = pl.make_plan(with_weights(real, 8), recipe, ctx=5000, slots=3)
    assert plan.context_args() == ["-c", str(3 * 5120), "-np", "3", "--kv-unified", "--kv-unified-per-slot", "5120"]
    text = plan.format()
    assert "slots: 3 x 5,000 tokens of context (one unified KV pool of 15,360 cells; -b 3,072" in text
    assert "-np 3 --kv-unified" in text.splitlines()[0]
    d = plan.to_dict()
    assert d["slots"] == 3 and d["kv_cells"] == 15_360 and d["server_context_args"][:4] == ["-c", "15360", "-np", "3"]


def test_several_slots_get_a_batch_that_holds_their_prompts_together(real):
    """-b with several slots: room for pl.SLOT_BATCH prompt tokens a slot (prompts arriving together are prefilled in
    one server iteration, so their streams decode in step), capped at pl.SLOTS_BATCH_MAX; a larger recipe batch
    stays; one slot keeps the recipe's."""
    recipe = load_recipe("cpu")
    plans = {n: pl.make_plan(with_weights(real, 8), recipe, ctx=4096, slots=n) for n in (1, 2, 8, 16)}
    assert recipe.server["batch"] == 2048
    assert [plans[n].figures["server_batch"] for n in (1, 2, 8, 16)] == [2048, 2048, 8192, 8192]
    assert pl.served_batch(512, 1) == 512 and pl.served_batch(512, 2) == 2 * pl.SLOT_BATCH
    assert pl.served_batch(16384, 8) == 16384
    assert plans[8].figures["server_batch"] == 8192 and "-b 8,192: prompts arriving together" in plans[8].format()


def test_the_drafts_target_hidden_states_follow_the_slots_batch(real):
    """With a draft the target keeps the inputs of the draft's target layers for -b tokens, F32, in host memory:
    4 bytes x n_embd x -b x layers, so 8 slots (-b 8192) hold four times what one slot (-b 2048) holds."""
    import dataclasses

    recipe = load_recipe("h200")
    target = with_weights(real, 20)
    draft = dataclasses.replace(REAL_DRAFT, target_layers=5)
    host = lambda p: next(x for x in p.pools if x.name == "host")  # noqa: E731
    plans = {n: pl.evaluate(target, recipe, ctx=8192, ngl=41, n_cpu_moe=0, draft=draft, slots=n) for n in (1, 8)}
    per_batch_token = 4 * 2048 * 5  # n_embd 2048 (the published config), 5 target layers
    assert [plans[n].figures["draft_target_hidden"] for n in (1, 8)] == [2048 * per_batch_token,
                                                                          8192 * per_batch_token]
    assert host(plans[8]).use["draft"] - host(plans[1]).use["draft"] == (8192 - 2048) * per_batch_token
    none = pl.evaluate(target, recipe, ctx=8192, ngl=41, n_cpu_moe=0, draft=REAL_DRAFT, slots=8)
    assert none.figures["draft_target_hidden"] == 0  # a draft shape without its target_layers key


def test_the_recipe_context_shrinks_per_slot_before_slots_are_refused(real):
    """rtx4090 with a 17.5 GiB file holds the whole 262,144-token context for one slot; for eight slots the
    planner halves every slot's context until they fit (never below server.min_ctx)."""
    recipe = load_recipe("rtx4090")
    target = with_weights(real, 17.5)
    one = pl.make_plan(target, recipe, slots=1)
    eight = pl.make_plan(target, recipe, slots=8)
    assert one.ctx == 262_144 and one.n_cpu_moe == 0
    assert eight.slots == 8 and recipe.server["min_ctx"] <= eight.ctx < one.ctx
    assert any("context reduced" in n for n in eight.notes)
    # the largest context of the search that fits: twice as much does not
    with pytest.raises(PlanError):
        pl.make_plan(target, recipe, slots=8, ctx=eight.ctx * 2)


def test_too_many_slots_are_refused_naming_how_many_fit(real):
    recipe = load_recipe("rtx4090")
    target = with_weights(real, 17.5)
    with pytest.raises(PlanError) as e:
        pl.make_plan(target, recipe, slots=200, ctx=262_144)
    msg = str(e.value)
    assert "\n" not in msg and "200 slots (-np 200) do not fit recipe rtx4090" in msg
    n = int(msg.split("at most ")[1].split(" ")[0])
    assert f"--parallel {n})" in msg and "at 262144 tokens each" in msg
    # exactly the most that fit: n does, n + 1 does not
    assert pl.make_plan(target, recipe, slots=n, ctx=262_144).slots == n
    with pytest.raises(PlanError, match=f"at most {n} slot"):
        pl.make_plan(target, recipe, slots=n + 1, ctx=262_144)


def test_one_slot_that_does_not_fit_keeps_the_model_message(real):
    with pytest.raises(PlanError, match="the model does not fit recipe rtx4090"):
        pl.make_plan(with_weights(real, 90), load_recipe("rtx4090"), slots=4)


def _folder(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    write_qwen35moe(out / "t.gguf", n_embd=64, layer_types="LLLF", n_head=4, n_head_kv=2, head_dim=256, n_rot=64,
                    d_state=128, n_group=16, n_v_heads=32, d_conv=4)
    (out / "manifest.json").write_text(json.dumps(
        {"files": [{"role": "target", "path": "t.gguf", "bytes": (out / "t.gguf").stat().st_size}], "source": {},
         "ggufbridge": "0"}))
    return out


def test_cli_plan_shows_slots_and_refuses_too_many_in_one_line(tmp_path):
    out = _folder(tmp_path)
    ok = CliRunner().invoke(cli, ["plan", str(out), "--recipe", "cpu", "--parallel", "4", "--ctx", "4096"])
    assert ok.exit_code == 0, ok.output
    assert "slots: 4 x 4,096 tokens of context" in ok.stdout and "-c 16384 -np 4 --kv-unified" in ok.stdout
    # 3 recurrent layers x 6.3 MiB of state: 32 checkpoints per slot make a 3 GiB host budget hold a few slots
    recipe = tmp_path / "small.toml"
    recipe.write_text('base = "cpu"\nname = "small"\n[memory]\nhost_gib = 3\nhost_headroom_gib = 0\n'
                      'compute_mib = 100\n')
    res = CliRunner().invoke(cli, ["plan", str(out), "--recipe", str(recipe), "--parallel", "64", "--ctx", "4096"])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "64 slots (-np 64) do not fit recipe small" in lines[0], res.stderr
    n = int(lines[0].split("at most ")[1].split(" ")[0])
    assert 1 <= n < 64
    fits = CliRunner().invoke(cli, ["plan", str(out), "--recipe", str(recipe), "--parallel", str(n), "--ctx", "4096"])
    assert fits.exit_code == 0, fits.output
    over = CliRunner().invoke(cli, ["plan", str(out), "--recipe", str(recipe), "--parallel", "300"])
    assert over.exit_code == 2 and "--parallel" in over.stderr and "Traceback" not in over.output
    # serve refuses the same way before anything starts, and its dry run shows the slots that fit
    srv = CliRunner().invoke(cli, ["serve", str(out), "--recipe", str(recipe), "--parallel", "64", "--ctx", "4096",
                                   "--dry-run"])
    assert srv.exit_code == 2 and srv.stderr.strip().splitlines() == lines, srv.output
    dry = CliRunner().invoke(cli, ["serve", str(out), "--recipe", str(recipe), "--parallel", str(n), "--ctx", "4096",
                                   "--dry-run"])
    assert dry.exit_code == 0 and f"slots: {n} x 4,096 tokens of context" in dry.stdout, dry.output
    assert f"-np {n} --kv-unified --kv-unified-per-slot 4096" in dry.stdout


def test_backend_sampling_reaches_the_server_command_only_where_the_recipe_asks(tmp_path):
    """server.backend_sampling (the GPU recipes) adds llama-server's --backend-sampling; the cpu recipe keeps the
    host sampler (slower in the graph on a CPU, docs/benchmarks.md); a value that is not a boolean is one line."""
    out = _folder(tmp_path)
    assert [load_recipe(n).server["backend_sampling"] for n in ("h200", "spark", "rtx4090", "cpu")] == \
        [True, True, True, False]
    on = tmp_path / "on.toml"
    on.write_text('base = "cpu"\nname = "on"\n[server]\nbackend_sampling = true\n')
    cmd = lambda r: CliRunner().invoke(cli, ["serve", str(out), "--recipe", r, "--ctx", "4096", "--dry-run"])  # noqa: E731
    res = cmd(str(on))
    assert res.exit_code == 0 and " --backend-sampling" in res.stdout, res.output
    res = cmd("cpu")
    assert res.exit_code == 0 and "--backend-sampling" not in res.stdout, res.output
    bad = tmp_path / "bad.toml"
    bad.write_text('base = "cpu"\nname = "bad"\n[server]\nbackend_sampling = "yes"\n')
    res = cmd(str(bad))
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1 and "backend_sampling" in res.stderr

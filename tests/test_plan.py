"""Memory planner and recipes: the published figures of the real model, fitting, refusing, validation."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from ggufbridge.cli import cli
from ggufbridge.errors import PlanError, RecipeError
from ggufbridge.runtime import memory as pl
from ggufbridge.runtime.recipes import load_recipe, packaged_names

from _shape_gguf import write_qwen35moe

# MiniCPM-V 4.7 35B-A3B text tower as published (issue 2): 40 layers, every 4th full attention (30 gated
# delta-net + 10), head_dim 256 with 2 KV heads, 16 key / 32 value linear heads of dim 128, conv kernel 4.
REAL_TEXT_CONFIG = {
    "num_hidden_layers": 40, "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 2,
    "head_dim": 256, "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 10,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "vocab_size": 248144,
    "max_position_embeddings": 262144,
}
# the DSpark draft: 5 dense layers with 2 KV heads of 256 (issue 5)
REAL_DRAFT = pl.DraftShape(n_layer=5, n_head_kv=2, key_length=256, value_length=256)

GIB = 1024**3


@pytest.fixture(scope="module")
def real() -> pl.TargetShape:
    return pl.TargetShape.from_config(REAL_TEXT_CONFIG)


def with_weights(shape: pl.TargetShape, total_gib: float, expert_share: float = 0.93) -> pl.TargetShape:
    """The real shapes with a total weight size spread like a MoE file: mostly routed experts."""
    n = shape.n_layer
    total = total_gib * GIB
    edge = 0.02 * total
    per_layer = (total - 2 * edge) / n
    return dataclasses.replace(shape, input_bytes=int(edge), output_bytes=int(edge),
                               expert_bytes=(int(per_layer * expert_share),) * n,
                               block_bytes=(int(per_layer * (1 - expert_share)),) * n)


# ------------------------------------------------------------------ published figures (issue 5)


def test_kv_cache_published_figures(real):
    assert len(real.attention_layers) == 10 and len(real.recurrent_layers) == 30
    assert real.kv_bytes_per_token("f16", "f16") == 20_480          # 10 x 2 x 2 heads x 256 x 2 B
    assert real.kv_bytes_per_token() * 262_144 == 5 * GIB            # "5.00 GiB at 262,144 tokens"
    assert REAL_DRAFT.kv_bytes_per_token() == 10_240                 # 5 x 2 x 2 x 256 x 2


def test_gated_delta_net_state_published_figure(real):
    # issue 5: 30 x (32*128*128*4 + 8,192*3*2) = 64,389,120 B: F32 delta state, conv state counted at 2 B
    assert real.conv_state_elems() == 8_192 * 3
    assert real.delta_state_elems() * 4 == 32 * 128 * 128 * 4
    assert real.state_bytes_per_slot(conv_elem=2, delta_elem=4) == 64_389_120
    # the pinned runtime allocates the conv state in F32 too (test_plan_runtime checks its own log), so the
    # planner budgets 30 x (2,097,152 + 98,304)
    assert real.state_bytes_per_slot() == 65_863_680


def test_plan_prints_the_published_numbers(real):
    plan = pl.make_plan(with_weights(real, 65), load_recipe("spark"), slots=1)  # one slot's figures
    text = plan.format()
    assert plan.ctx == 262_144 and plan.figures["kv_total"] == 5 * GIB
    assert "20,480 B/token x 262,144 cells = 5.00 GiB" in text
    assert "65,863,680 B per slot" in text
    assert plan.fits


def test_quantised_kv_halves_and_needs_divisible_rows(real):
    q8 = real.kv_bytes_per_token("q8_0", "q8_0")
    assert q8 == 10 * 2 * (2 * 256 // 32 * 34)
    odd = dataclasses.replace(real, key_length=80, value_length=80)
    with pytest.raises(PlanError, match="divisible by 32"):
        odd.kv_bytes_per_token("q8_0", "f16")


# ------------------------------------------------------------------ fitting and refusing


def _check_budgets(plan):
    for p in plan.pools:
        assert p.total <= p.budget, (p.name, p.total, p.budget)


def test_rtx4090_offloads_the_fewest_expert_blocks(real):
    recipe = load_recipe("rtx4090")
    target = with_weights(real, 20)  # about a 4-bit file
    plan = pl.make_plan(target, recipe)
    _check_budgets(plan)
    assert plan.n_gpu_layers == real.n_layer + 1 and plan.ctx == 262_144
    assert 0 < plan.n_cpu_moe < real.n_layer
    # minimal: one block fewer in RAM overflows the GPU
    tighter = pl.evaluate(target, recipe, ctx=plan.ctx, ngl=plan.n_gpu_layers, n_cpu_moe=plan.n_cpu_moe - 1)
    assert not tighter.fits
    gpu = next(p for p in tighter.pools if p.name == "gpu0")
    assert gpu.total > gpu.budget
    # the experts kept in RAM are exactly those of blocks 0..n_cpu_moe-1
    host = next(p for p in plan.pools if p.name == "host")
    assert host.use["weights"] == target.input_bytes + sum(target.expert_bytes[:plan.n_cpu_moe])


def test_refuses_with_an_explanation_when_nothing_fits(real):
    with pytest.raises(PlanError) as e:
        pl.make_plan(with_weights(real, 90), load_recipe("rtx4090"))  # 90 GiB > 24 GB GPU + 64 GB RAM
    msg = str(e.value)
    assert "does not fit recipe rtx4090" in msg and "host needs" in msg and "smaller quant" in msg


def test_cli_plan_refuses_with_exit_2(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    write_qwen35moe(out / "t.gguf")
    (out / "manifest.json").write_text(
        '{"files": [{"role": "target", "path": "t.gguf", "bytes": %d}], "source": {}, "ggufbridge": "0"}'
        % (out / "t.gguf").stat().st_size)
    recipe = tmp_path / "tiny.toml"
    recipe.write_text('base = "cpu"\nname = "tiny"\n[memory]\nhost_gib = 1\nhost_headroom_gib = 0.5\n'
                      'compute_mib = 600\n')
    res = CliRunner().invoke(cli, ["plan", str(out), "--recipe", str(recipe)])
    assert res.exit_code == 2 and "does not fit recipe tiny" in res.stderr and "Traceback" not in res.output
    ok = CliRunner().invoke(cli, ["plan", str(out), "--recipe", "cpu", "--json"])
    assert ok.exit_code == 0, ok.output
    assert '"fits": true' in ok.stdout


def test_context_shrinks_only_when_allowed(real):
    target = with_weights(real, 8)
    recipe = load_recipe("cpu")
    # a host that holds the weights, compute, the server's context checkpoints (32 state copies) and a 16k context
    # but not the 32k context's KV (0.63 GiB)
    checkpoints = pl.CTX_CHECKPOINTS * real.state_bytes_per_slot() / GIB
    small = dataclasses.replace(recipe, memory=dict(recipe.memory, host_gib=8.5 + checkpoints, host_headroom_gib=0))
    plan = pl.make_plan(target, small, slots=1)
    assert plan.ctx < recipe.server["ctx"] and plan.ctx >= recipe.server["min_ctx"]
    assert any("context reduced" in n for n in plan.notes)
    _check_budgets(plan)
    with pytest.raises(PlanError):  # an explicit context is never changed
        pl.make_plan(target, small, ctx=recipe.server["ctx"], slots=1)


def test_draft_caps_context_and_adds_state_snapshots(real):
    recipe = load_recipe("rtx4090")  # the one GPU recipe whose draft.ctx_cap is below its context
    cap = recipe.draft["ctx_cap"]
    assert cap < recipe.server["ctx"]
    target = with_weights(real, 12)
    draft = dataclasses.replace(REAL_DRAFT, weight_bytes=GIB // 2, block_size=16)
    plan = pl.make_plan(target, recipe, draft=draft)
    assert plan.ctx == cap and any("capped" in n for n in plan.notes)
    n_max, slots = recipe.draft["n_max"], recipe.server["parallel"]
    # the target keeps n_max extra recurrent-state snapshots per slot for rollback
    assert plan.figures["state_total"] == real.state_bytes_per_slot() * (1 + n_max) * slots
    assert plan.figures["draft_kv_total"] == 10_240 * cap * slots
    assert pl.make_plan(target, recipe, draft=draft, ctx=2 * cap).ctx == 2 * cap  # --ctx overrides the cap


def test_spark_x2_splits_layers_over_rpc_worker_first(real):
    recipe = load_recipe("spark-x2")
    plan = pl.make_plan(with_weights(real, 65), recipe)
    assert [p.name for p in plan.pools] == ["rpc0", "gpu0 (unified)"]  # llama.cpp puts RPC devices first
    assert plan.tensor_split == [112.0, 112.0]
    rpc, local = plan.pools
    assert rpc.use["weights"] > 0 and local.use["weights"] > rpc.use["weights"] * 0.8
    assert rpc.use["kv"] + local.use["kv"] == 5 * GIB * recipe.server["parallel"]  # 262,144 tokens per slot


def test_rpc_devices_are_named_as_planned(real, tmp_path):
    """With RPC the server is told exactly the planned devices (RPC first, as the runtime orders them); the projector
    stays on the local GPU and the draft where the plan put it, never on a worker by default; `--rpc local` gives
    the workers the GPUs after the server's own, wrapping around on a box with fewer."""
    from ggufbridge.runtime import rpc, server as sv

    x2 = load_recipe("spark-x2")
    plan = pl.make_plan(with_weights(real, 65), x2)
    assert [(p.device, p.name, p.kind) for p in sv.plan_devices(plan)] == [
        ("RPC0", "rpc0", "rpc"), ("CUDA0", "gpu0 (unified)", "gpu")]
    # 41 layers (40 blocks + output) split 112:112 as the runtime does: 21 blocks on the worker
    assert "layers: rpc0 0-20, gpu0 (unified) 21-39; output on gpu0 (unified)" in plan.format()
    assert sv.device_args(x2, plan, mmproj=True, draft=True) == [
        "--device", "RPC0,CUDA0", "--mmproj-device", "CUDA0", "--device-draft", "CUDA0"]
    # every layer on two workers and no local GPU (one rpc-server per GPU): the projector is not offloaded
    (tmp_path / "w2.toml").write_text('base = "h200"\nname = "w2"\n[memory]\ngpu_gib = []\n'
                                      '[rpc]\nworkers = 2\nworker_gib = 139\nworker_headroom_gib = 4\n')
    w2 = load_recipe(str(tmp_path / "w2.toml"))
    plan2 = pl.make_plan(with_weights(real, 65), w2)
    assert sv.device_args(w2, plan2, mmproj=True, draft=False) == ["--device", "RPC0,RPC1", "--mmproj-device", "none"]
    assert rpc.worker_devices(1, 1, ["CUDA0", "CUDA1"]) == ["CUDA1"]  # spark-x2 on a two-GPU box
    assert rpc.worker_devices(2, 0, ["CUDA0", "CUDA1"]) == ["CUDA0", "CUDA1"]
    assert rpc.worker_devices(2, 0, ["CUDA0"]) == ["CUDA0", "CUDA0"]  # one GPU holds both
    assert rpc.worker_devices(2, 0, []) == [None, None]  # CPU: the worker's own default


def test_shape_from_gguf_matches_the_writer(tmp_path):
    path = tmp_path / "t.gguf"
    write_qwen35moe(path, layer_types="LFLLF", n_head_kv=2, head_dim=32, n_rot=8, d_state=16, n_group=2,
                    n_v_heads=6)
    s = pl.target_from_gguf(path)
    assert s.recurrent == (True, False, True, True, False)
    assert (s.key_length, s.n_head_kv, s.state_size, s.group_count, s.inner_size) == (32, (2,) * 5, 16, 2, 96)
    # per-tensor byte counts add up to the file's tensor data (F32 numpy arrays as written)
    assert 0 < path.stat().st_size - s.weight_bytes < 1 << 20
    assert all(e > 0 for e in s.expert_bytes) and s.input_bytes == 512 * 64 * 4


# ------------------------------------------------------------------ recipes


def test_packaged_recipes_load():
    assert set(packaged_names()) >= {"spark", "rtx4090", "cpu", "spark-x2"}
    for name in packaged_names():
        r = load_recipe(name)
        # drafting is opt-in; since the quantized-K/V kernel it pays at every depth measured, so the GPU recipes draft
        # at their full context, the 4090 as far as 24 GB keep every expert on the GPU with the draft, the CPU at 8k
        cap = {"rtx4090": 65536, "cpu": 8192}.get(name, r.server["ctx"])
        assert r.name == name and r.draft["ctx_cap"] == cap and r.draft["n_max"] <= 15
    assert load_recipe("spark-x2").rpc["workers"] == 1
    assert load_recipe("rtx4090").server["n_cpu_moe"] == "auto"


@pytest.mark.parametrize("body, message", [
    ('name="x"\nbackend="cpu"\n[server]\nctx=4096\nbogus=1\n', "unknown key"),
    ('name="x"\nbackend="cpu"\n[server]\nctx="big"\n', "server.ctx: expected an integer, found 'big'"),
    ('name="x"\nbackend="tpu"\n[server]\nctx=4096\n', "backend: expected one of"),
    ('name="x"\nbackend="cpu"\n[memory]\nhost_gib=8\n[server]\nctx=4096\nflash_attn="off"\ncache_type_v="q8_0"\n',
     "needs flash attention"),
    ('name="x"\nbackend="cpu"\n[memory]\nhost_gib=8\n[server]\nctx=4096\n[draft]\nn_max=16\n', "draft.n_max"),
    ('name="x"\nbackend="cpu"\n[memory]\nhost_gib=8\n[server]\nctx=4096\nmin_ctx=8192\n', "server.min_ctx"),
    ('name="x"\nbackend="cuda"\n[memory]\nhost_gib=8\n[server]\nctx=4096\n', "needs at least one GPU"),
    ('name="x"\nbackend="cpu"\n[server]\nctx=4096\n', "memory.host_gib"),
    ('base="nope"\n', "base: expected one of"),
    ('name="x"\nbackend="cpu"\n[server\n', "not valid TOML"),
    # were passed on as they were: llama-server then died in start-up on std::stoi, or never drafted (p_min > 1)
    ('name="x"\nbackend="cpu"\n[memory]\nhost_gib=8\n[server]\nctx=4096\nbatch=100000000000\n',
     r"server.batch: expected an integer in \[1, 2147483647\], found 100000000000"),
    ('name="x"\nbackend="cpu"\n[memory]\nhost_gib=8\n[server]\nctx=4096\nthreads=4294967296\n', "server.threads"),
    ('name="x"\nbackend="cpu"\n[memory]\nhost_gib=8\n[server]\nctx=4096\n[draft]\np_min=1.5\n',
     r"draft.p_min: expected a number in \[0.0, 1.0\], found 1.5"),
])
def test_bad_recipes_are_refused(tmp_path, body, message):
    f = tmp_path / "r.toml"
    f.write_text(body)
    with pytest.raises(RecipeError, match=message):
        load_recipe(str(f))


def test_a_recipe_that_is_not_utf8_is_refused(tmp_path):
    f = tmp_path / "r.toml"
    f.write_bytes('name = "caf\xe9"\n'.encode("latin-1"))  # was a UnicodeDecodeError traceback
    with pytest.raises(RecipeError, match=r"r.toml: not UTF-8 text \(invalid continuation byte at byte 11\)"):
        load_recipe(str(f))


def test_user_recipe_extends_a_packaged_one(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('base = "rtx4090"\nname = "my4090"\n[memory]\nhost_gib = 128\n[server]\nctx = 65536\n')
    r = load_recipe(str(f))
    assert (r.name, r.memory["host_gib"], r.server["ctx"]) == ("my4090", 128.0, 65536)
    assert r.server["cache_type_k"] == "q8_0" and r.memory["gpu_gib"] == [24.0]  # inherited
    with pytest.raises(RecipeError, match="unknown recipe 'nosuch'"):
        load_recipe("nosuch")


def test_wrong_files_are_refused(tmp_path):
    from _shape_gguf import write_dspark

    d = tmp_path / "d.gguf"
    write_dspark(d)
    with pytest.raises(PlanError, match="expected general.architecture qwen35moe, found 'dflash'"):
        pl.target_from_gguf(d)
    assert pl.draft_from_gguf(d).block_size == 4
    # the layers whose inputs it reads (the output buffer the planner counts per -b token)
    write_dspark(d, target_layers=(1, 2, 3))
    assert pl.draft_from_gguf(d).target_layers == 3
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(PlanError, match="not a readable GGUF"):
        pl.target_from_gguf(junk)


def test_context_never_exceeds_the_trained_context(tmp_path):
    path = tmp_path / "t.gguf"
    write_qwen35moe(path, n_ctx=4096)
    shape = pl.target_from_gguf(path)
    plan = pl.make_plan(shape, load_recipe("cpu"))  # the recipe asks for 32,768
    assert shape.n_ctx_train == 4096 and plan.ctx == 4096
    assert any("trained context (4096)" in n for n in plan.notes)
    assert pl.make_plan(shape, load_recipe("cpu"), ctx=8192).ctx == 8192  # explicit --ctx is the user's call

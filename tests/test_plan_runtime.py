"""The planner's figures against what the pinned runtime itself reports allocating for the same files.

The target carries the real model's per-layer recurrent shapes (16 key / 32 value heads of 128, conv kernel 4)
and full-attention shapes (2 KV heads of 256) on a tiny hidden size, so the runtime's own buffer sizes
(printed by libllama at load) are directly comparable with the planner's arithmetic.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ggufbridge.runtime import locate as loc
from ggufbridge.runtime import memory as pl
from ggufbridge.runtime import server as sv
from ggufbridge.runtime.recipes import load_recipe

from _shape_gguf import write_dspark, write_qwen35moe

MIB = 1024**2
SIZE_RE = re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells")
RS_RE = re.compile(r"llama_memory_recurrent: size =.*?(\d+) seqs\s+(\d+) rs_seq\), R \(f32\):\s*([\d.]+) MiB, "
                   r"S \(f32\):\s*([\d.]+) MiB")
MODEL_BUF_RE = re.compile(r"CPU_Mapped model buffer size =\s*([\d.]+) MiB")


SLOT_RE = re.compile(r"initializing, n_slots = (\d+), n_ctx_slot = (\d+), kv_unified = '(\w+)'")


@pytest.mark.slow
@pytest.mark.parametrize("slots", [1, 2, 4])
def test_planner_matches_runtime_allocations(tmp_path, slots):
    """Started with the plan's own slot arguments (runtime/memory.py: one unified pool of slots x context cells, each
    slot capped at its context), llama-server allocates exactly the planned KV cache (target and draft), recurrent
    state (slots x (1 + n_max) snapshots) and weights, and gives every slot the planned context."""
    rt = loc.locate()
    target, draft = tmp_path / "t.gguf", tmp_path / "d.gguf"
    write_qwen35moe(target, n_embd=64, layer_types="LLLF", n_head=4, n_head_kv=2, head_dim=256, n_rot=64,
                    d_state=128, n_group=16, n_v_heads=32, d_conv=4, n_ctx=16384)  # trained context > 8192
    write_dspark(draft, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, head_dim=32, block_size=4,
                 target_layers=(1, 2), tokenizer_from=target)
    recipe_file = tmp_path / "r.toml"
    recipe_file.write_text(f'base = "cpu"\nname = "probe"\n[server]\nctx = 8000\nparallel = {slots}\n'
                           '[draft]\nn_max = 3\nctx_cap = 8000\n')
    recipe = load_recipe(str(recipe_file))
    tshape, dshape = pl.target_from_gguf(target), pl.draft_from_gguf(draft)
    plan = pl.make_plan(tshape, recipe, ctx=8000, draft=dshape)
    f = plan.figures
    assert plan.slots == slots

    port = sv.free_port()
    argv = [str(rt.tool("llama-server")), "-m", str(target), "-md", str(draft), "--spec-type", "draft-dspark",
            "--spec-draft-n-max", "3", *plan.context_args(), "--fit", "off", "-v",
            "--host", "127.0.0.1", "--port", str(port)]
    log = tmp_path / "server.log"
    with sv.Server(argv, "127.0.0.1", port, log, env=rt.env()) as srv:
        srv.wait_ready(120)
    text = log.read_text(errors="replace")

    n_slots, n_ctx_slot, unified = SLOT_RE.findall(text)[0]
    # every slot the context one slot alone gets (-c 8000 padded to 256), not a share of it
    assert (int(n_slots), int(n_ctx_slot)) == (slots, 8192)
    assert unified == ("true" if slots > 1 else "false")
    rs = RS_RE.findall(text)
    assert rs, "no recurrent-state line in the server log"
    seqs, rs_seq, r_mib, s_mib = rs[0]
    assert (int(seqs), int(rs_seq)) == (slots, 3)  # one state per slot, 3 rollback snapshots (= --spec-draft-n-max)
    snapshots = int(seqs) * (1 + int(rs_seq))
    assert f["slots"] * f["state_snapshots"] == snapshots
    n_rec = len(tshape.recurrent_layers)
    # conv state: the runtime's R buffer is F32, i.e. 4 bytes per element (not 2)
    r_bytes = n_rec * tshape.conv_state_elems() * 4 * snapshots
    s_bytes = n_rec * tshape.delta_state_elems() * 4 * snapshots
    assert abs(float(r_mib) - r_bytes / MIB) < 0.006
    assert abs(float(r_mib) - r_bytes / 2 / MIB) > 0.5  # the 2-byte reading of the formula is refuted
    assert abs(float(s_mib) - s_bytes / MIB) < 0.006
    assert f["state_total"] == r_bytes + s_bytes
    assert f["state_total"] == slots * 4 * tshape.state_bytes_per_slot()  # per slot: 1 + n_max snapshots

    kv = SIZE_RE.findall(text)
    # first the target's cache, then the draft's (the draft context has n_rs_seq = 0, logged just before)
    tgt_mib, draft_mib = float(kv[0][0]), float(kv[-1][0])
    assert f["kv_cells"] == slots * 8192 == int(kv[0][1])  # -c 8000 per slot, padded to 256 (llama-context.cpp:290)
    assert abs(tgt_mib - f["kv_total"] / MIB) < 0.006
    assert abs(draft_mib - f["draft_kv_total"] / MIB) < 0.006
    assert f["kv_per_token"] == 1 * 2 * 2 * 256 * 2

    bufs = [float(m) for m in MODEL_BUF_RE.findall(text)]
    assert bufs, "no model buffer line"
    assert abs(bufs[0] - tshape.weight_bytes / MIB) < 0.02


COMPUTE_RE = re.compile(r"sched_reserve:\s+CPU compute buffer size =\s*([\d.]+) MiB")


def _cpu_compute_mib(rt, target: Path, ub: int, ctx: int, log: Path) -> float:
    port = sv.free_port()
    argv = [str(rt.tool("llama-server")), "-m", str(target), "-c", str(ctx), "-b", "2048", "-ub", str(ub),
            "-fa", "auto", "--fit", "off", "--no-warmup", "-lv", "4", "--host", "127.0.0.1", "--port", str(port)]
    with sv.Server(argv, "127.0.0.1", port, log, env=rt.env()) as srv:
        srv.wait_ready(120)
    found = COMPUTE_RE.findall(log.read_text(errors="replace"))
    assert found, f"no compute-buffer line in {log}"
    return float(found[0])


@pytest.mark.slow
def test_planner_compute_terms_match_the_runtimes_compute_buffers(tmp_path):
    """The planner's compute model against the compute buffer llama-server reserves (CPU, demo-sized target):
    what depends on the context is exactly the F16 attention mask, 2 bytes per ubatch token and KV cell, at every
    ubatch. The per-token term is the recipe's coefficient, measured at the real shape per backend, where it is
    linear in the ubatch (docs/benchmarks.md, "Compute buffers"); this tiny model also has a constant part, so
    only the context term is compared here."""
    rt = loc.locate()
    target = tmp_path / "t.gguf"
    write_qwen35moe(target, n_embd=64, layer_types="LLLF", n_head=4, n_head_kv=2, head_dim=256, n_rot=64,
                    d_state=128, n_group=16, n_v_heads=32, d_conv=4)
    tshape = pl.target_from_gguf(target)

    def planned(ub, ctx):
        recipe_file = tmp_path / f"r-{ub}-{ctx}.toml"
        recipe_file.write_text(f'base = "cpu"\nname = "probe"\n[server]\nctx = {ctx}\nubatch = {ub}\n')
        plan = pl.make_plan(tshape, load_recipe(str(recipe_file)), ctx=ctx, slots=1)  # a pool of ctx cells
        return plan.pools[-1].use["compute"] / MIB

    for ub in (256, 512):
        small, large = (_cpu_compute_mib(rt, target, ub, c, tmp_path / f"s-{ub}-{c}.log") for c in (4096, 16384))
        runtime_growth, planned_growth = large - small, planned(ub, 16384) - planned(ub, 4096)
        assert abs(runtime_growth - 2 * ub * (16384 - 4096) / MIB) < 0.02, (ub, small, large)
        assert abs(planned_growth - runtime_growth) < 0.02, (ub, planned_growth, runtime_growth)


@pytest.mark.slow
@pytest.mark.parametrize("draft", [False, True], ids=["target", "draft"])
def test_planned_compute_covers_every_slot(tmp_path, draft):
    """From one slot to 2, 4 and 8 (the plan's own arguments, CPU, the real recurrent shapes), the runtime's target
    compute buffer grows by the pool's attention mask plus some recurrent-state copies; the plan's growth covers it
    and is not more than the runtime's plus its state term. The draft's compute buffer is its mask over the pool."""
    rt = loc.locate()
    target, dr = tmp_path / "t.gguf", tmp_path / "d.gguf"
    write_qwen35moe(target, n_embd=64, layer_types="LLLF", n_head=4, n_head_kv=2, head_dim=256, n_rot=64,
                    d_state=128, n_group=16, n_v_heads=32, d_conv=4, n_ctx=16384)
    write_dspark(dr, n_embd=64, n_layer=2, n_head=4, n_head_kv=2, head_dim=32, block_size=4, target_layers=(1, 2),
                 tokenizer_from=target)
    tshape, dshape = pl.target_from_gguf(target), pl.draft_from_gguf(dr)
    runtime, planned, draft_runtime, draft_planned = {}, {}, {}, {}
    for slots in (1, 2, 4, 8):
        r = tmp_path / f"r{slots}.toml"
        r.write_text(f'base = "cpu"\nname = "probe"\n[server]\nctx = 4096\nparallel = {slots}\n[draft]\nn_max = 4\n')
        plan = pl.make_plan(tshape, load_recipe(str(r)), ctx=4096, draft=dshape if draft else None)
        host = plan.pools[-1]
        planned[slots] = host.use["compute"] / MIB
        port = sv.free_port()
        # -b as serve gives it: 2048 for one slot, up to 8192 for several (memory.SLOT_BATCH; the compute buffers
        # must not grow with it)
        argv = [str(rt.tool("llama-server")), "-m", str(target), *plan.context_args(),
                "-b", str(plan.figures["server_batch"]), "-ub", "512",
                "--fit", "off", "--no-warmup", "-lv", "4", "--host", "127.0.0.1", "--port", str(port)]
        if draft:
            argv += ["-md", str(dr), "--spec-type", "draft-dspark", "--spec-draft-n-max", "4"]
        log = tmp_path / f"s{slots}.log"
        with sv.Server(argv, "127.0.0.1", port, log, env=rt.env()) as srv:
            srv.wait_ready(120)
        found = [float(x) for x in COMPUTE_RE.findall(log.read_text(errors="replace"))]
        runtime[slots] = found[0]  # the target's context is made first
        if draft:
            draft_runtime[slots] = found[-1]
            # the draft's pool less its weights, its KV and the target's kept hidden states (not a compute buffer)
            draft_planned[slots] = (host.use["draft"] - dshape.weight_bytes
                                    - dshape.kv_bytes_per_token() * plan.kv_cells
                                    - plan.figures["draft_target_hidden"]) / MIB
    state_term = lambda n: 2 * n * (5 if draft else 1) * tshape.state_layer_bytes() / MIB  # noqa: E731
    for n in (2, 4, 8):
        grew, plan_grew = runtime[n] - runtime[1], planned[n] - planned[1]
        assert grew <= plan_grew + 0.02, (n, grew, plan_grew)
        assert plan_grew - grew <= state_term(n), (n, grew, plan_grew)
        if draft:  # the draft's compute buffer: its mask over the pool, plus a constant under 1 MiB
            assert 0 <= draft_runtime[n] - draft_planned[n] < 1, (n, draft_runtime[n], draft_planned[n])

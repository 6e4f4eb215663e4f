"""KL-guided mixes (`quantize --fit-bytes`): exact file sizes, the allocator, the budget invariant, the recipe
round trip, and per-expert imatrix coverage.

References are independent of the code under test: file sizes are the files' real sizes on disk, types are read
back with gguf-py's GGUFReader, the allocator is checked against an exhaustive search, and the imatrix is read
with gguf-py and recomputed with numpy.
"""

from __future__ import annotations

import itertools
import random
import tomllib

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGUFReader

from ggufbridge.cli import cli
from ggufbridge.errors import QuantError
from _cores import THREADS


@pytest.fixture(scope="module")
def fit_setup(tmp_path_factory):
    """A short calibration text (two rows of 256 tokens: each probe stays cheap) and one sensitivity cache for
    the module, so that the CLI and convert tests share one measurement of the same BF16 weights."""
    d = tmp_path_factory.mktemp("fit")
    rng = random.Random(3)
    cal = d / "cal.txt"
    cal.write_text(" ".join(rng.choice("the river model layer token 1 2 3 ( ) ; expert".split()) for _ in range(90)))
    return cal, d / "work"


@pytest.fixture(scope="module")
def ksafe2_bf16(make_ckpt, make_gguf):
    """(checkpoint, BF16 GGUF) of the K-quant-compatible model with one layer of each kind: a measurement runs
    llama-quantize and llama.cpp once per unit, so two layers are half the work of ksafe's four. The budgets below
    are set on its sizes: Q2_K 1.82 MB, Q3_K_M 2.26 MB, Q4_K_M 2.77 MB, Q8_0 4.65 MB, BF16 8.70 MB."""
    kw = {"dtype": "bfloat16", "vocab": "small"}
    return make_ckpt("ksafe2", **kw), make_gguf("ksafe2", "bf16", **kw)


def stored_types(path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in GGUFReader(str(path)).tensors}


# --- allocator ---------------------------------------------------------------------------------------------------

def _random_instance(rng: random.Random, n_units: int, n_opts: int):
    from ggufbridge.quant.allocate import Option

    out = {}
    for u in range(n_units):
        sizes = sorted(rng.sample(range(10, 200), n_opts))
        # larger → less KL, with a random convexity so that hulls and non-hull options both occur
        kls = sorted((rng.random() * 3 for _ in sizes), reverse=True)
        out[f"u{u}"] = [Option(f"T{i}", b, k) for i, (b, k) in enumerate(zip(sizes, kls))]
    return out


def _random_budgeted(rng):
    """A random 4-unit, 4-option instance and a budget between its smallest and largest mix."""
    opts = _random_instance(rng, 4, 4)
    lo = sum(min(o.bytes for o in v) for v in opts.values())
    hi = sum(max(o.bytes for o in v) for v in opts.values())
    return opts, rng.randint(lo, hi)


def test_allocator_stays_in_budget_and_finds_the_exhaustive_optimum():
    from ggufbridge.quant.allocate import allocate, allocate_greedy

    rng = random.Random(0)
    worst = 0.0
    misses = 0
    for trial in range(60):
        opts, budget = _random_budgeted(rng)
        got = allocate(opts, budget)
        assert sum(o.bytes for o in got.values()) <= budget
        best = min(sum(o.kl for o in combo) for combo in itertools.product(*opts.values())
                   if sum(o.bytes for o in combo) <= budget)
        mine = sum(o.kl for o in got.values())
        assert mine >= best - 1e-12
        worst = max(worst, mine - best)
        # the convex-hull walk (kept to compare against), on the same instance
        g = allocate_greedy(opts, budget)
        assert sum(o.bytes for o in g.values()) <= budget
        misses += sum(o.kl for o in g.values()) > mine + 1e-12
    # budgets under 20,000 bytes are one byte per cell: the dynamic programme is exact
    assert worst < 1e-9
    # the convex-hull walk is not: it misses the optimum on some instances
    assert misses > 0


def test_allocator_refuses_a_budget_below_the_smallest_mix():
    from ggufbridge.quant.allocate import Option, allocate

    with pytest.raises(QuantError, match="smallest mix needs 30 bytes"):
        allocate({"a": [Option("x", 10, 1.0)], "b": [Option("y", 20, 1.0)]}, 29)


# --- exact sizes and the budget, on a real quantised header ------------------------------------------------------

@pytest.fixture(scope="module")
def fake_sensitivity(ksafe2_bf16, tmp_path_factory):
    """A Sensitivity of the ksafe model with random sensitivities but real shapes, types and a header measured on
    a real llama-quantize output: what plan_fit needs to show the budget invariant on many budgets cheaply."""
    from ggufbridge.ggufio.reader import read_header
    from ggufbridge.quant.filesize import HeaderModel
    from ggufbridge.quant.quantize import quantize_file
    from ggufbridge.quant.sensitivity import CANDIDATE_TYPES, Sensitivity, exact_mix, source_types, units_of

    _, src = ksafe2_bf16
    h = read_header(src)
    units = units_of(h)
    out = tmp_path_factory.mktemp("fit-header") / "u.gguf"
    quantize_file(src, out, mix=exact_mix("fit-uniform-Q8_0", h, {n: "Q8_0" for ts in units.values()
                                                                        for n in ts}), threads=THREADS)
    rng = random.Random(1)
    err = {"Q2_K": 40, "Q3_K": 12, "IQ3_S": 10, "IQ4_XS": 4, "Q4_K": 3.5, "Q5_K": 1, "Q6_K": 0.3, "Q8_0": 0.02}
    sens = Sensitivity(
        source=str(src), key="test", reference="gguf:test", calibration="test", n_tokens=1, probe_type="Q3_K",
        types=list(CANDIDATE_TYPES), base_kl=0.0,
        units={u: {"tensors": ts, "probe_kl": rng.random(), "error": dict(err)} for u, ts in units.items()},
        shapes={t.name: list(t.shape) for t in h.tensors}, source_types=source_types(h),
        all_types={t.name: t.type for t in h.tensors}, header=vars(HeaderModel.measure(out)))
    return src, sens


def test_plans_never_exceed_the_budget(fake_sensitivity):
    from ggufbridge.quant.optimise import plan_fit

    _, sens = fake_sensitivity
    lo = plan_fit(sens, 10**9)
    assert lo.file_bytes < 10**9
    smallest = None
    for budget in range(1_500_000, 8_800_000, 19_531):  # 374 budgets from below Q2_K to above BF16
        try:
            p = plan_fit(sens, budget)
        except QuantError as e:
            assert "does not" in str(e) or "smallest mix" in str(e)
            continue
        smallest = smallest or budget
        assert p.file_bytes <= budget
        # and it uses the room: nothing left that the cheapest upgrade would fit in (one Q8_0 → BF16 step of the
        # smallest unit is ~100 KB at most; hulls may leave a little)
    assert smallest is not None and smallest < 2_000_000


@pytest.mark.slow
def test_predicted_size_is_the_written_size(fake_sensitivity, tmp_path):
    """Three mixes, quantised by llama-quantize: each file is exactly the predicted number of bytes."""
    from ggufbridge.quant.optimise import plan_fit
    from ggufbridge.quant.quantize import quantize_file

    src, sens = fake_sensitivity
    for i, budget in enumerate((2_100_000, 3_100_000, 4_900_000)):
        p = plan_fit(sens, budget)
        out = tmp_path / f"m{i}.gguf"
        quantize_file(src, out, mix=p.mix, threads=THREADS)
        assert out.stat().st_size == p.file_bytes <= budget
        assert stored_types(out) == p.tensor_types


def test_fit_hardware_without_room_names_the_recipe(fake_sensitivity, tmp_path):
    """--fit HARDWARE on a GPU that holds nothing: one line naming the recipe and the context (the bisection's
    failure path; test_fit_hardware_takes_the_largest_mix_the_planner_fits has its success path)."""
    from ggufbridge.quant.optimise import plan_for_hardware

    src, sens = fake_sensitivity
    none = tmp_path / "none.toml"
    none.write_text('base = "rtx4090"\nname = "none"\n[memory]\ngpu_gib = [0.5]\nheadroom_gib = 0.5\n')
    with pytest.raises(QuantError, match="nothing fits recipe .*none.toml at --ctx 8192"):
        plan_for_hardware(src, sens, str(none), ctx=8192)


# --- end to end on the CLI ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_fit_bytes_cli_writes_a_mix_that_fits_and_a_reusable_recipe(ksafe2_bf16, fit_setup, tmp_path):
    _, src = ksafe2_bf16
    cal, work = fit_setup
    budget = 2_600_000
    out = tmp_path / "fit.gguf"
    args = ["quantize", str(src), "-o", str(out), "--fit-bytes", str(budget), "--ctx", "0", "--calibration",
            str(cal), "--work", str(work), "--threads", str(THREADS)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    size = out.stat().st_size
    assert size <= budget and f"{size:,} bytes of {budget:,}" in res.output
    mix = out.with_suffix(".mix.toml")
    doc = tomllib.loads(mix.read_text())
    assert doc["fit"]["budget_bytes"] == budget and doc["fit"]["file_bytes"] == size
    types = stored_types(out)
    # the mix really mixes: at this budget (between Q4_K_M and Q3_K_M sizes) at least three types are used
    assert len({t for t in types.values() if t not in ("F32",)}) >= 3
    # the recipe file reproduces the same file types with --recipe
    again = tmp_path / "again.gguf"
    r2 = CliRunner().invoke(cli, ["quantize", str(src), "-o", str(again), "--recipe", str(mix), "--threads",
                                  str(THREADS)])
    assert r2.exit_code == 0, r2.output
    assert stored_types(again) == types
    # inspect names the mix
    ins = CliRunner().invoke(cli, ["inspect", str(out)])
    assert ins.exit_code == 0 and doc["description"] and "recipe fit-" in ins.output
    # a second budget reuses the measurement (no new probes): the work folder holds one sensitivity.json
    out2 = tmp_path / "fit2.gguf"
    r3 = CliRunner().invoke(cli, args[:3] + [str(out2)] + ["--fit-bytes", "3600000"] + args[6:])
    assert r3.exit_code == 0, r3.output
    assert len(list(work.glob("*/sensitivity.json"))) == 1
    assert out2.stat().st_size <= 3_600_000


@pytest.mark.parametrize("args, message", [
    (["--fit-bytes", "1000", "--ctx", "0"], "does not even hold"),
    (["--quant", "Q8_0", "--calibration", "x.txt"], "--calibration only applies with --fit"),
    (["--fit-bytes", "10MB", "--ctx", "0", "--calibration", "/nonexistent.txt"], "does not exist"),
])
def test_fit_errors_are_one_line(ksafe2_bf16, tmp_path, args, message):
    _, src = ksafe2_bf16
    res = CliRunner().invoke(cli, ["quantize", str(src), "-o", str(tmp_path / "o.gguf"), "--work",
                                   str(tmp_path / "w"), *args] if "--fit-bytes" in args else
                             ["quantize", str(src), "-o", str(tmp_path / "o.gguf"), *args])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert not (tmp_path / "o.gguf").exists()


# --- imatrix coverage --------------------------------------------------------------------------------------------

def _starve_experts(path, starved=(6, 7)):
    """Rewrite every router so that the experts in `starved` never win a top-2 slot: the others come in pairs of
    opposite rows (w, -w), so at least three logits are positive for any input, while the starved rows are 0."""
    r = GGUFReader(str(path), "r+")
    for t in r.tensors:
        if t.name.endswith("ffn_gate_inp.weight"):
            w = t.data  # [n_expert, hidden], a writable memmap
            live = [e for e in range(w.shape[0]) if e not in starved]
            for a, b in zip(live[0::2], live[1::2]):
                w[b] = -w[a]
            for e in starved:
                w[e] = 0.0
    r.data.flush()
    del r


@pytest.mark.slow
def test_imatrix_reports_experts_without_tokens_and_fills_them(ksafe2_bf16, tmp_path):
    import shutil

    from ggufbridge.quant.coverage import coverage, fill_missing, format_coverage

    _, src = ksafe2_bf16
    model = tmp_path / "starved.gguf"
    shutil.copyfile(src, model)
    _starve_experts(model)
    text = tmp_path / "cal.txt"
    rng = random.Random(0)
    text.write_text(" ".join(rng.choice("alpha beta gamma delta 1 2 3 ; ( )".split()) for _ in range(1500)))
    res = CliRunner().invoke(cli, ["imatrix", str(model), "--text", str(text), "--ctx", "128", "--chunks", "4",
                                   "--threads", str(THREADS), "-o",
                                   str(tmp_path / "im.gguf")])
    assert res.exit_code == 0, res.output
    # the report names the starved experts of every expert tensor (gate, up, down × 2 layers)
    assert "expert coverage" in res.output and "6-7" in res.output
    assert "got no tokens; filled from the mean" in res.output
    im = GGUFReader(str(tmp_path / "im.gguf"))
    t = {x.name: np.asarray(x.data, dtype=np.float32) for x in im.tensors}
    exps = [n[: -len(".counts")] for n in t if n.endswith("_exps.weight.counts")]
    assert len(exps) == 6
    for name in exps:
        counts = t[name + ".counts"].reshape(-1)
        sums = t[name + ".in_sum2"].reshape(len(counts), -1)
        assert (counts[:6] > 0).all() and (counts[6:] == 1).all()
        want = (sums[:6] / counts[:6, None]).mean(axis=0)
        np.testing.assert_allclose(sums[6], want, rtol=1e-6)
        np.testing.assert_allclose(sums[7], want, rtol=1e-6)
    # filling again finds nothing left to fill; the coverage API reports counts per expert
    assert all(not c.missing for c in coverage(tmp_path / "im.gguf"))
    assert fill_missing(tmp_path / "im.gguf") == []
    assert "every expert of every layer" in format_coverage(coverage(tmp_path / "im.gguf"))
    # llama-quantize accepts the filled matrix
    q = CliRunner().invoke(cli, ["quantize", str(model), "-o", str(tmp_path / "q.gguf"), "--quant", "IQ4_XS",
                                 "--imatrix", str(tmp_path / "im.gguf"), "--threads", str(THREADS)])
    assert q.exit_code == 0, q.output


@pytest.mark.slow
def test_imatrix_without_fill_keeps_the_tool_output_and_reports_it(ksafe2_bf16, tmp_path):
    """--no-fill-missing leaves llama-imatrix's own file (counts 0 for the starved experts), still reported."""
    import shutil

    from ggufbridge.quant.coverage import coverage

    _, src = ksafe2_bf16
    model = tmp_path / "starved.gguf"
    shutil.copyfile(src, model)
    _starve_experts(model, starved=(3,))
    text = tmp_path / "cal.txt"
    text.write_text(" ".join(["one two three four five six seven"] * 200))
    res = CliRunner().invoke(cli, ["imatrix", str(model), "--text", str(text), "--ctx", "128", "--chunks", "4",
                                   "--threads", str(THREADS), "-o",
                                   str(tmp_path / "im.gguf"), "--no-fill-missing"])
    assert res.exit_code == 0, res.output
    assert "without tokens" in res.output and "not filled" in res.output
    cov = coverage(tmp_path / "im.gguf")
    assert cov and all(c.missing == [3] for c in cov)


@pytest.mark.slow
def test_convert_fit_bytes_writes_a_target_within_budget(ksafe2_bf16, fit_setup, tmp_path, monkeypatch):
    from ggufbridge.quant import optimise

    cal, work = fit_setup
    monkeypatch.setattr(optimise, "default_work", lambda: work)  # not the user's cache
    ckpt, _ = ksafe2_bf16
    out = tmp_path / "out"
    budget = 3_100_000
    res = CliRunner().invoke(cli, ["convert", str(ckpt), "-o", str(out), "--outtype", "bf16", "--no-mmproj",
                                   "--no-progress", "--fit-bytes", str(budget), "--fit-ctx", "0", "--calibration",
                                   str(cal)])
    assert res.exit_code == 0, res.output
    target = next(out.glob("*-FIT.gguf"))
    assert target.stat().st_size <= budget
    assert target.with_name(target.stem + ".mix.toml").is_file()
    v = CliRunner().invoke(cli, ["verify", str(out), "--source", str(ckpt)])
    assert v.exit_code == 0, v.output
    # the intermediate BF16 is the CLI test's source at another path: its measurement is reused (one in the folder)
    assert len(list(work.glob("*/sensitivity.json"))) == 1


@pytest.mark.parametrize("table, message", [
    ('"blk.0.attn_norm.weight" = "Q4_K"', "expected the name of a quantisable tensor"),
    ('"nonsense" = "Q4_K"', "expected the name of a quantisable tensor"),
    ('"blk.0.ffn_down_exps.weight" = "Q9_K"', "expected a tensor type"),
])
def test_recipe_tensors_table_is_validated(tmp_path, table, message):
    from ggufbridge.quant.mix import load_mix

    p = tmp_path / "mix.toml"
    p.write_text(f'base = "hq4"\n[tensors]\n{table}\n')
    with pytest.raises(QuantError, match=message):
        load_mix(str(p))


def test_recipe_tensors_override_their_class(tmp_path):
    from ggufbridge.quant.mix import load_mix

    p = tmp_path / "mix.toml"
    p.write_text('base = "hq4"\n[tensors]\n"blk.2.ffn_down_exps.weight" = "Q6_K"\n')
    r = load_mix(str(p))
    assert r.type_for("blk.2.ffn_down_exps.weight", "experts_down") == "Q6_K"
    assert r.type_for("blk.1.ffn_down_exps.weight", "experts_down") == tomllib.loads(
        (__import__("importlib").resources.files("ggufbridge") / "recipes" / "quant" / "hq4.toml").read_text()
    )["types"]["experts_down"]


def test_fit_hardware_takes_the_largest_mix_the_planner_fits(fake_sensitivity):
    """rtx4090's 24 GB hold this 9 MB model at any precision: the bisection must end at the full-precision mix."""
    from ggufbridge.quant.optimise import plan_fit, plan_for_hardware

    src, sens = fake_sensitivity
    p = plan_for_hardware(src, sens, "rtx4090", 8192)
    full = plan_fit(sens, 10**9)
    assert p.unit_types == full.unit_types and set(p.unit_types.values()) == {"BF16"}


def test_a_mix_for_another_model_is_refused(ksafe2_bf16, tmp_path):
    _, src = ksafe2_bf16
    p = tmp_path / "mix.toml"
    p.write_text('base = "hq4"\n[tensors]\n"blk.39.ffn_down_exps.weight" = "Q6_K"\n')
    res = CliRunner().invoke(cli, ["quantize", str(src), "-o", str(tmp_path / "o.gguf"), "--recipe", str(p)])
    assert res.exit_code == 2 and "does not have" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "o.gguf").exists()

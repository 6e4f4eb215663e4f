"""Per-unit sensitivity probes (`quantize --fit-bytes`): llama.cpp's quantiser called in-process writes the bytes
llama-quantize writes, and a probe of one unit in the split layout gives the KL of the whole-model file that
llama-quantize writes for the same assignment; an interrupted measurement resumes; the time budget is kept.

References are independent of the code under test: llama-quantize's own output files (read with gguf-py), gguf-py's
dequantisers (a Python reimplementation of ggml's), and `ggufbridge compare` on whole-model files.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from click.testing import CliRunner

from ggufbridge.cli import cli
from ggufbridge.errors import QuantError
from _cores import THREADS


@pytest.fixture(scope="module")
def model(make_gguf):
    """BF16 GGUF of the K-quant-compatible model with one layer of each kind (11 units)."""
    return make_gguf("ksafe2", "bf16", dtype="bfloat16", vocab="small")


@pytest.fixture(scope="module")
def cal(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe-cal")
    rng = random.Random(5)
    p = d / "cal.txt"  # ~600 tokens: two rows of 256, or llama-imatrix's two chunks of 128
    p.write_text(" ".join(rng.choice("the river model layer token 1 2 3 ( ) ; expert".split()) for _ in range(240)))
    return p


@pytest.fixture(scope="module")
def imatrix(model, cal, tmp_path_factory):
    out = tmp_path_factory.mktemp("probe-im") / "im.gguf"
    r = CliRunner().invoke(cli, ["imatrix", str(model), "--text", str(cal), "--ctx", "128", "--chunks", "2",
                                 "-o", str(out), "--threads", str(THREADS)])
    assert r.exit_code == 0, r.output
    return out


def _uniform(model, tmp_path, t, imatrix=None):
    """llama-quantize's own file with every quantisable tensor at tensor type `t` (for a type that needs an
    importance matrix: every tensor the matrix covers; llama-imatrix does not see token_embd)."""
    from ggufbridge.ggufio.reader import read_header
    from ggufbridge.quant import types as qt
    from ggufbridge.quant.quantize import quantize_file
    from ggufbridge.quant.sensitivity import exact_mix, importance, units_of

    h = read_header(model)
    names = [n for ts in units_of(h).values() for n in ts]
    if t in qt.NEEDS_IMATRIX:
        names = [n for n in names if n in importance(imatrix)]
    out = tmp_path / f"uniform-{t}.gguf"
    quantize_file(model, out, mix=exact_mix("u", h, {n: t for n in names}), imatrix=imatrix, threads=THREADS)
    return h, read_header(out), names


@pytest.mark.parametrize("t, with_imatrix", [("Q3_K", False), ("IQ4_XS", False), ("Q4_K", True),
                                             ("IQ2_XS", True)])
def test_in_process_quantiser_writes_llama_quantize_bytes(model, imatrix, tmp_path, t, with_imatrix):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from ggufbridge.quant.ggmlq import Quantiser
    from ggufbridge.quant.sensitivity import importance, unit_errors

    im_path = imatrix if with_imatrix else None
    src, out, names = _uniform(model, tmp_path, t, im_path)
    im = importance(im_path)
    with Quantiser(THREADS) as q:
        for n in names:
            _, kept = unit_errors(q, src, [n], [t], keep=t, imatrix=im)
            final, data = kept[n]
            assert final == out.tensor(n).type
            assert np.array_equal(data, np.asarray(out.tensor_data(n))), n  # byte for byte
            # the in-process dequantiser against gguf-py's Python one (independent reimplementation)
            mine = q.to_float(final, data, out.tensor(n).n_elements)
            ref = dequantize(np.asarray(out.tensor_blocks(n)), GGMLQuantizationType[final]).reshape(-1)
            assert np.allclose(mine, ref, rtol=1e-6, atol=1e-7), n


def test_unit_error_is_the_dequantised_difference(model, tmp_path):
    """E_u(t) is the squared difference of llama-quantize's file and the source, dequantised by gguf-py."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from ggufbridge.quant.ggmlq import Quantiser
    from ggufbridge.quant.sensitivity import unit_errors, units_of

    src, out, _ = _uniform(model, tmp_path, "Q3_K")
    unit = "experts_down@0"
    names = units_of(src)[unit]
    want = 0.0
    for n in names:
        a = dequantize(np.asarray(src.tensor_blocks(n)), GGMLQuantizationType[src.tensor(n).type]).astype(np.float64)
        b = dequantize(np.asarray(out.tensor_blocks(n)), GGMLQuantizationType.Q3_K).astype(np.float64)
        want += float(((a - b) ** 2).sum())
    with Quantiser(THREADS) as q:
        got, _ = unit_errors(q, src, names, ["Q3_K"])
    assert got["Q3_K"] == pytest.approx(want, rel=1e-4)


@pytest.fixture(scope="module")
def probe_setup(model, cal, tmp_path_factory):
    """The split layout, the calibration rows, a reference dump of the source and an evaluator over them."""
    from ggufbridge.compare import evalset
    from ggufbridge.compare.run import dump_logits
    from ggufbridge.ggufio.reader import read_header
    from ggufbridge.quant.probe import Evaluator, ProbeModel
    from ggufbridge.quant.sensitivity import calibration_rows, units_of

    d = tmp_path_factory.mktemp("probe")
    rows = calibration_rows(model, cal, 256, 2)
    rows_path = d / "rows.jsonl"
    evalset.write_rows(rows, rows_path)
    ref = d / "ref.safetensors"
    dump_logits(f"gguf:{model}", ref, eval_path=rows_path, ctx=256, top_k=64, samples=32, floor=False)
    h = read_header(model)
    layout = ProbeModel(model, units_of(h), d / "layout")
    layout.build()
    with Evaluator(f"logits:{ref}", rows, 256, n_gpu_layers=0) as ev:
        yield h, layout, ev, rows_path, f"logits:{ref}"


def _whole_model_kl(model, h, unit, t, tmp_path, ref, rows_path):
    """The old probe: llama-quantize writes the whole model with only `unit` at `t`, `compare` measures it."""
    from ggufbridge.compare.run import compare
    from ggufbridge.quant.quantize import quantize_file
    from ggufbridge.quant.sensitivity import exact_mix, source_types, units_of

    types = {**source_types(h), **{n: t for n in units_of(h)[unit]}}
    out = tmp_path / f"whole-{unit}.gguf"
    quantize_file(model, out, mix=exact_mix("p", h, types), threads=THREADS)
    return compare(ref, [f"gguf:{out}"], eval_path=rows_path, ctx=256).results[0].summary["kl_mean"]


@pytest.mark.parametrize("unit", ["gdn_in@0", "experts_gate_up@1", "output"])
def test_unit_probe_equals_the_whole_model_probe(model, probe_setup, tmp_path, unit):
    from ggufbridge.quant.ggmlq import Quantiser
    from ggufbridge.quant.sensitivity import unit_errors

    h, layout, ev, rows_path, ref = probe_setup
    with Quantiser(THREADS) as q:
        _, kept = unit_errors(q, h, layout.unit_tensors[unit], ["Q3_K"], keep="Q3_K")
    with layout.swapped(unit, layout.write_probe(unit, kept)) as m:
        probe = ev.kl(m)
    whole = _whole_model_kl(model, h, unit, "Q3_K", tmp_path, ref, rows_path)
    assert whole > 1e-3  # a real perturbation, far above the source's own KL
    assert probe == pytest.approx(whole, rel=1e-5, abs=1e-9)
    # the layout with nothing swapped is the source
    assert ev.kl(layout.main) == pytest.approx(ev.kl(model), rel=1e-6, abs=1e-9)


def test_a_probe_of_the_wrong_unit_differs(model, probe_setup, tmp_path):
    """The parity above can fail: quantising another unit than the one the whole-model file quantised gives
    another KL."""
    from ggufbridge.quant.ggmlq import Quantiser
    from ggufbridge.quant.sensitivity import unit_errors

    h, layout, ev, rows_path, ref = probe_setup
    wrong = "experts_gate_up@0"
    with Quantiser(THREADS) as q:
        _, kept = unit_errors(q, h, layout.unit_tensors[wrong], ["Q3_K"], keep="Q3_K")
    with layout.swapped(wrong, layout.write_probe(wrong, kept)) as m:
        probe = ev.kl(m)
    whole = _whole_model_kl(model, h, "gdn_in@0", "Q3_K", tmp_path, ref, rows_path)
    assert abs(probe - whole) > 0.05 * whole


def _fixed_cost(monkeypatch, token_s=1.0):
    """Calibration timings replaced by fixed ones, so that the estimate is known to the test."""
    from ggufbridge.quant import sensitivity

    monkeypatch.setattr(sensitivity, "_time_pass", lambda *a, **k: (0.0, token_s, 0.0, 0.0))
    monkeypatch.setattr(sensitivity, "_time_quantisation", lambda *a, **k: dict.fromkeys(
        ("element_s", "probe_element_s", "final_element_s", "swap_element_s"), 0.0))
    monkeypatch.setattr(sensitivity, "_time_copy", lambda *a, **k: 0.0)


def test_interrupted_measurement_resumes_from_its_records(model, cal, tmp_path, monkeypatch):
    from ggufbridge.quant import probe
    from ggufbridge.quant.sensitivity import measure

    kw = dict(work=tmp_path / "work", ctx=256, max_rows=2, threads=THREADS, types=("Q3_K", "Q6_K"),
              n_gpu_layers=0)
    real = probe.Evaluator.kl
    calls = []

    def dying(self, m, rows=None):
        calls.append(m)
        if len(calls) == 4:  # the source, then three units
            raise KeyboardInterrupt
        return real(self, m, rows)

    monkeypatch.setattr(probe.Evaluator, "kl", dying)
    with pytest.raises(KeyboardInterrupt):
        measure(model, cal, **kw)
    records = list((tmp_path / "work").glob("*/measurements.jsonl"))
    assert len(records) == 1
    lines = [json.loads(x) for x in records[0].read_text().splitlines()]
    assert [x["kind"] for x in lines] == ["base", "unit", "unit"]
    calls.clear()
    monkeypatch.setattr(probe.Evaluator, "kl", lambda self, m, rows=None: (calls.append(m), real(self, m, rows))[1])
    said = []
    sens = measure(model, cal, report=said.append, **kw)
    assert len(calls) == 11 - 2  # only the units not yet measured
    assert "(2 more measured before: resumed)" in said[0]
    assert len(sens.units) == 11 and {x["unit"] for x in lines[1:]} <= set(sens.units)
    assert sens.units[lines[1]["unit"]]["probe_kl"] == lines[1]["probe_kl"]
    assert not list((tmp_path / "work").glob("*/probe"))  # the layout (a copy of the source) is gone


def test_time_budget_cuts_calibration_tokens_or_refuses(model, cal, tmp_path, monkeypatch):
    from ggufbridge.quant.sensitivity import MIN_TOKENS, calibration_rows, measure

    _fixed_cost(monkeypatch)
    rows = calibration_rows(model, cal, 64, 4)
    total = sum(len(r.ids) for r in rows)
    kw = dict(work=tmp_path / "work", ctx=64, max_rows=4, threads=THREADS, types=("Q3_K", "Q6_K"), n_gpu_layers=0)
    # 1 s per token: a reference pass and 12 probe passes (the source + 11 units) of t tokens take 13·t s
    with pytest.raises(QuantError, match=f"even on {MIN_TOKENS} calibration tokens"):
        measure(model, cal, budget_s=13.0 * MIN_TOKENS - 1, **kw)
    said = []
    sens = measure(model, cal, budget_s=13.0 * 40 + 12, report=said.append, **kw)
    # the seconds the calibration itself took come off the budget first (a few here, 13 per token less)
    n = sens.n_tokens
    assert 37 <= n <= 40 < total
    assert f"measuring on the first {n} tokens" in said[0]
    assert "estimated total" in said[-1] and f"{n} calibration tokens" in said[1]


def test_calibration_tokens_cuts_the_rows(model, cal, tmp_path):
    from ggufbridge.quant.sensitivity import first_tokens, calibration_rows

    rows = calibration_rows(model, cal, 256, 16)
    cut = first_tokens(rows, 300)
    assert [len(r.ids) for r in cut] == [256, 44] and cut[1].ids == rows[1].ids[:44]
    assert first_tokens(rows, None) == rows


def test_fit_budget_time_errors_are_one_line(model, cal, tmp_path):
    base = ["quantize", str(model), "-o", str(tmp_path / "o.gguf"), "--fit-bytes", "3MB", "--ctx", "0",
            "--calibration", str(cal), "--work", str(tmp_path / "w")]
    r = CliRunner().invoke(cli, base + ["--fit-budget-time", "5 parsecs"])
    assert r.exit_code == 2 and "expected a positive duration" in r.output
    r = CliRunner().invoke(cli, base + ["--fit-budget-time", "0.001"])
    assert r.exit_code == 2, r.output
    assert "even on 16 calibration tokens" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o.gguf").exists()
    r = CliRunner().invoke(cli, ["quantize", str(model), "-o", str(tmp_path / "o.gguf"), "--quant", "Q8_0",
                                 "--fit-budget-time", "1h"])
    assert r.exit_code == 2 and "--fit-budget-time only applies with --fit or --fit-bytes" in r.output
    r = CliRunner().invoke(cli, ["quantize", str(model), "-o", str(tmp_path / "o.gguf"), "--quant", "Q8_0",
                                 "--fit-probes", "layout"])
    assert r.exit_code == 2 and "--fit-probes only applies with --fit or --fit-bytes" in r.output


def test_a_work_folder_without_room_for_the_probe_layout_is_refused_before_any_copy(model, cal, tmp_path,
                                                                                   monkeypatch):
    """The layout probes need a copy of the source in --work (69 GB for the 35B-A3B): a disk without room is
    refused in one line before the layout writes anything, not halfway through a copy. Resident probes write no
    copy: the same disk is enough for them."""
    import shutil
    from collections import namedtuple

    from ggufbridge.quant import sensitivity

    real = shutil.disk_usage
    Usage = namedtuple("Usage", "total used free")
    size = model.stat().st_size
    monkeypatch.setattr(sensitivity.shutil, "disk_usage", lambda p: Usage(10 * size, 9 * size, size // 2))
    work = tmp_path / "w"
    r = CliRunner().invoke(cli, ["quantize", str(model), "-o", str(tmp_path / "o.gguf"), "--fit-bytes", "3MB",
                                 "--ctx", "0", "--calibration", str(cal), "--work", str(work), "--threads",
                                 str(THREADS), "--fit-probes", "layout"])
    assert r.exit_code == 2, r.output
    assert "the sensitivity pass needs" in r.output and "Traceback" not in r.output
    assert not list(work.glob("*/probe")) and not list(work.glob("*/header.gguf"))
    assert not (tmp_path / "o.gguf").exists()
    # with the room, the same command gets past that point (the check reads the real disk)
    monkeypatch.setattr(sensitivity.shutil, "disk_usage", real)
    sensitivity._check_disk(tmp_path, sensitivity.read_header(model))


@pytest.mark.parametrize("with_imatrix", [False, True])
def test_the_header_twin_gives_llama_quantize_s_header_of_the_source(model, imatrix, tmp_path, monkeypatch,
                                                                     with_imatrix):
    """The budget's header is measured on llama-quantize's output of the source's header twin (its KVs and tensor
    table, two elements per axis) instead of a whole copy of the source: the same bytes before the data, the
    same alignment and string KVs as llama-quantize's output of the source itself (read with gguf-py's reader),
    with and without an importance matrix (its provenance keys). A twin of one element per axis lists fewer dims
    for every tensor (ggml_n_dims) and misses it: the comparison can fail."""
    from gguf import GGUFReader

    from ggufbridge.ggufio.reader import read_header
    from ggufbridge.quant import probe
    from ggufbridge.quant.filesize import HeaderModel
    from ggufbridge.quant.quantize import quantize_file
    from ggufbridge.quant.sensitivity import _measure_header, exact_mix, source_types

    im = imatrix if with_imatrix else None
    h = read_header(model)
    real = tmp_path / "real.gguf"
    quantize_file(model, real, mix=exact_mix("fit-header", h, source_types(h), "Q8_0"), imatrix=im, threads=THREADS)
    r = GGUFReader(real)
    data_start = r.data_offset  # gguf-py: where the aligned tensor data begins
    align = int(r.fields["general.alignment"].parts[-1][0]) if "general.alignment" in r.fields else 32
    strings = {k: str(bytes(f.parts[-1]), "utf-8") for k, f in r.fields.items()
               if f.types and f.types[0].name == "STRING" and len(f.types) == 1}
    twin = _measure_header(h, tmp_path, im, THREADS, None)
    assert twin.alignment == align
    assert twin.unpadded <= data_start < twin.unpadded + align  # padded to the same data offset
    assert twin.bytes_for({}) == data_start
    assert twin.strings == strings
    assert twin == HeaderModel.measure(real)  # byte for byte, by our own reader
    assert not list(tmp_path.glob("header*.gguf"))  # nothing left in --work
    if with_imatrix:
        assert any(k.startswith("quantize.imatrix.") for k in strings)

    monkeypatch.setattr(probe, "_twin_shape", lambda shape: tuple(1 for _ in shape))
    assert _measure_header(h, tmp_path, im, THREADS, None).unpadded < twin.unpadded


def test_a_part_of_a_split_source_is_refused_with_how_to_join_it(model, cal, tmp_path):
    """A split GGUF's first part lists only its own tensors: measured as the model, the mix would miss the other
    parts. One line naming the way to join it, before any calibration; the join it names works (llama-quantize
    reads every part) and the joined file is one the measurement takes."""
    from ggufbridge.ggufio.reader import read_header
    from ggufbridge.quant.probe import ProbeModel
    from ggufbridge.quant.sensitivity import units_of

    layout = ProbeModel(model, units_of(read_header(model)), tmp_path / "split")
    layout.build()  # a split GGUF of the model: the rest, then one part per unit
    first = layout.main
    r = CliRunner().invoke(cli, ["quantize", str(first), "-o", str(tmp_path / "o.gguf"), "--fit-bytes", "3MB",
                                 "--ctx", "0", "--calibration", str(cal), "--work", str(tmp_path / "w"),
                                 "--threads", str(THREADS)])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert f"is one part of a {layout.n}-part split GGUF" in r.output and "--quant BF16" in r.output, r.output
    assert not (tmp_path / "w").exists() or not any((tmp_path / "w").rglob("*.gguf"))
    one = tmp_path / "one.gguf"
    r = CliRunner().invoke(cli, ["quantize", str(first), "-o", str(one), "--quant", "BF16", "--threads",
                                 str(THREADS)])
    assert r.exit_code == 0, r.output
    joined = read_header(one)
    assert "split.count" not in joined.kv
    def dims(h):  # as ggml_n_dims counts them: llama-quantize writes (256,) for a (256, 1) tensor
        return {t.name: tuple(t.shape[:max([i + 1 for i, d in enumerate(t.shape) if d > 1] or [1])])
                for t in h.tensors}

    assert dims(joined) == dims(read_header(model))


def test_sampled_errors_estimate_the_full_ones(model):
    """The error pass quantises large tensors at every type on a sample of rows only: on this model's expert
    tensors (524,288 weights, sampled at 131,072) the estimate is within 5% of the full sum for every type."""
    from ggufbridge.ggufio.reader import read_header
    from ggufbridge.quant.ggmlq import Quantiser
    from ggufbridge.quant.sensitivity import CANDIDATE_TYPES, ERROR_SAMPLE, unit_errors, units_of

    h = read_header(model)
    names = units_of(h)["experts_gate_up@0"]
    assert all(h.tensor(n).n_elements > ERROR_SAMPLE for n in names)
    with Quantiser(THREADS) as q:
        full, _ = unit_errors(q, h, names, CANDIDATE_TYPES)
        est, kept = unit_errors(q, h, names, CANDIDATE_TYPES, keep="Q3_K", sample=ERROR_SAMPLE)
    assert est["Q3_K"] == pytest.approx(full["Q3_K"], rel=1e-6)  # the probe type is measured in full
    for t in CANDIDATE_TYPES:
        assert est[t] == pytest.approx(full[t], rel=0.05), t


def test_a_passes_warm_up_is_counted_once_per_pass_not_per_token():
    """A fresh model's first chunk carries a one-off warm-up (on an H200 ~0.4 s against ~1 ms a token): the cost
    model must charge it once per pass. Counted per token over the calibration it made the estimate 1.8x the
    measured time at 4 layers on the H200 (docs/quant.md)."""
    from ggufbridge.quant.cost import CostModel
    from ggufbridge.quant.sensitivity import _pass_rates

    warm, rate, kl = 0.4, 1e-3, 0.6e-3
    parts = [(warm + 64 * (rate - kl), 64 * kl, 64)] + [(64 * (rate - kl), 64 * kl, 64)] * 5
    load_s, token_s, kl_s = _pass_rates(2.0, parts)
    assert load_s == pytest.approx(2.0 + warm) and token_s == pytest.approx(rate) and kl_s == pytest.approx(kl)
    m = CostModel(units=10, rows=16, tokens=4096, elements=0, sampled=0, types=1, source_bytes=0, load_s=load_s,
                  token_s=token_s, element_s=0, probe_element_s=0, byte_s=0, reference_passes=0)
    assert m.pass_s() == pytest.approx(2.0 + warm + 4096 * rate)
    # the old reading (everything over the tokens timed) overstates a 4,096-token pass by half
    old = sum(p[0] + p[1] for p in parts) / 384
    assert 2.0 + 4096 * old > 1.5 * m.pass_s()
    # one chunk only: nothing to tell the warm-up from, it stays in the rate
    assert _pass_rates(2.0, parts[:1])[0] == 2.0


# ------------------------------------------------------------------------------------ probes in the loaded model


@pytest.fixture(scope="module")
def resident(model, probe_setup):
    from ggufbridge.quant.probe import ResidentModel

    _, _, ev, _, _ = probe_setup
    with ResidentModel(model, ctx=256, chunk=ev.chunk, n_gpu_layers=0, threads=THREADS) as r:
        yield r


def _probe_bytes(h, unit, names):
    from ggufbridge.quant.ggmlq import Quantiser
    from ggufbridge.quant.probe import probe_values
    from ggufbridge.quant.sensitivity import unit_errors

    with Quantiser(THREADS) as q:
        _, kept = unit_errors(q, h, names, ["Q3_K"], keep="Q3_K")
        return probe_values(q, h, kept)


@pytest.mark.parametrize("unit", ["gdn_in@0", "experts_gate_up@1", "output"])
def test_a_resident_probe_is_the_file_with_the_same_values(model, probe_setup, resident, unit):
    """Written into the loaded model, a probe's values give the KL of a file that stores the same values (the split
    layout with the unit's tensors at their source type, loaded by llama.cpp as any file): the write reaches the
    tensors the names say, with the bytes given; after it, the model is the source again."""
    h, layout, ev, _, _ = probe_setup
    values = _probe_bytes(h, unit, layout.unit_tensors[unit])
    assert all(h.tensor(n).type == "BF16" and v.nbytes == h.tensor(n).nbytes for n, v in values.items())
    with resident.swapped(values) as loaded:
        got = ev.kl(loaded)
    stored = {n: (h.tensor(n).type, v) for n, v in values.items()}
    with layout.swapped(unit, layout.write_probe(unit, stored)) as m:
        want = ev.kl(m)
    assert want > 1e-3  # a real perturbation
    assert got == pytest.approx(want, rel=1e-6, abs=1e-9)
    assert ev.kl(resident.source) == pytest.approx(ev.kl(model), rel=1e-6, abs=1e-9)  # restored


def test_a_resident_probe_of_another_unit_differs(probe_setup, resident):
    """The parity above can fail: the values of experts_gate_up@0 written where gdn_in@0's file has them."""
    h, layout, ev, _, _ = probe_setup
    wrong = _probe_bytes(h, "experts_gate_up@0", layout.unit_tensors["experts_gate_up@0"])
    with resident.swapped(wrong) as loaded:
        got = ev.kl(loaded)
    values = _probe_bytes(h, "gdn_in@0", layout.unit_tensors["gdn_in@0"])
    stored = {n: (h.tensor(n).type, v) for n, v in values.items()}
    with layout.swapped("gdn_in@0", layout.write_probe("gdn_in@0", stored)) as m:
        want = ev.kl(m)
    assert abs(got - want) > 0.05 * want


@pytest.mark.parametrize("unit", ["gdn_in@0", "experts_gate_up@1", "attention@1", "token_embd", "output"])
def test_a_resident_probe_measures_what_the_quantised_file_measures(model, probe_setup, resident, tmp_path, unit):
    """Against the whole-model file llama-quantize writes with only the unit at Q3_K (the probe before the
    resident model): the values rounded to BF16 and run on BF16 kernels instead of Q3_K ones (whose activations
    are rounded to Q8_K) move the probe's KL by a few per cent at most, where the units' KLs differ 25-fold."""
    h, layout, ev, rows_path, ref = probe_setup
    values = _probe_bytes(h, unit, layout.unit_tensors[unit])
    with resident.swapped(values) as loaded:
        got = ev.kl(loaded)
    whole = _whole_model_kl(model, h, unit, "Q3_K", tmp_path, ref, rows_path)
    assert got == pytest.approx(whole, rel=0.08)  # measured: 0.4% (4 units), 4.7% (attention@1)


def test_a_loaded_weight_is_written_only_whole_and_never_into_a_mapped_file(model, probe_setup, resident):
    """The runtime's guard (patch 0029): a mapped file is mapped read-only, a write there would fault the process;
    the call refuses it, and a wrong name or size, in one line."""
    from ggufbridge.compare.sources import GGUFSource
    from ggufbridge.quant.probe import _SET_ERRORS, set_tensor_fn

    h, layout, ev, _, _ = probe_setup
    name = layout.unit_tensors["output"][0]
    data = np.asarray(h.tensor_data(name))
    with pytest.raises(QuantError, match="no such tensor"):
        resident.write("blk.99.nothing.weight", data)
    with pytest.raises(QuantError, match="size is not the tensor's"):
        resident.write(name, data[:-2])
    resident.write(name, data)  # its own bytes: accepted
    f = set_tensor_fn()
    with GGUFSource(model, n_ctx=64, chunk=64, n_threads=THREADS) as mapped:  # use_mmap: llama.cpp's default
        b = np.ascontiguousarray(data)
        rc = f(mapped.llm._model.model, name.encode(), b.ctypes.data, b.nbytes)
    assert _SET_ERRORS[rc] == "the tensor is read from a memory-mapped file"


def test_resident_and_layout_measurements_agree(model, cal, tmp_path):
    """The whole measurement both ways on the same rows: every unit's sensitivity within a few per cent and the
    same most sensitive units (what the allocator reads)."""
    from ggufbridge.quant.sensitivity import measure

    kw = dict(ctx=256, max_rows=2, threads=THREADS, types=("Q3_K", "Q6_K"), n_gpu_layers=0)
    said = []
    a = measure(model, cal, work=tmp_path / "r", probes="resident", report=said.append, **kw)
    b = measure(model, cal, work=tmp_path / "l", probes="layout", **kw)
    assert a.timings["resident"] and not b.timings["resident"]
    assert "in one resident model" in said[0]
    sa = {u: a.sensitivity(u) for u in a.units}
    sb = {u: b.sensitivity(u) for u in b.units}
    for u in sa:  # measured: within 1.3% for ten units, 4.7% for attention@1
        assert sa[u] == pytest.approx(sb[u], rel=0.08), u
    assert sorted(sa, key=sa.get)[-3:] == sorted(sb, key=sb.get)[-3:]


def test_resident_probes_are_chosen_where_the_runtime_and_the_memory_allow(model, monkeypatch):
    from ggufbridge.ggufio.reader import read_header
    from ggufbridge.quant import probe, sensitivity

    h = read_header(model)
    assert sensitivity.resident_probes("auto", h, 0)  # a small source, a runtime with the patch
    assert not sensitivity.resident_probes("layout", h, 0)
    monkeypatch.setattr(sensitivity, "_mem_available", lambda: h.file_bytes)  # the source > half of it
    assert not sensitivity.resident_probes("auto", h, 0)
    assert sensitivity.resident_probes("auto", h, -1)  # on a GPU the weights are in its memory
    assert sensitivity.resident_probes("resident", h, 0)  # insisted on: up to all of the memory
    monkeypatch.setattr(sensitivity, "_mem_available", lambda: h.file_bytes // 2)
    with pytest.raises(QuantError, match="--fit-probes resident keeps .* available: use --fit-probes layout"):
        sensitivity.resident_probes("resident", h, 0)  # more than the memory: refused, not killed by the kernel
    monkeypatch.setattr(probe, "set_tensor_fn", lambda: None)  # a runtime without the patch
    assert not sensitivity.resident_probes("auto", h, -1)
    with pytest.raises(QuantError, match="cannot write a loaded weight"):
        sensitivity.resident_probes("resident", h, 0)


def test_the_measurement_offloads_what_fits_the_gpu(model, monkeypatch):
    """On a GPU smaller than the weights (a 24 GB RTX 4090 and the 35B-A3B's 69 GB of BF16) every layer offloaded
    cannot load: as many layers as fit the free memory are offloaded, in llama.cpp's order (-ngl k: the output
    layer and the last k - 1 blocks; the token embedding never), and the probes are resident only when what stays
    in host memory fits half of it. The expected layers are restated here from names and sizes."""
    from ggufbridge.ggufio.reader import read_header
    from ggufbridge.quant import ggmlq, probe, sensitivity

    assert (ggmlq.gpu_memory() is None) == (not ggmlq.has_gpu())  # this runtime's own answer
    h = read_header(model)
    blocks: dict[int, int] = {}
    out = emb = 0
    for t in h.tensors:
        if t.name.startswith("blk."):
            i = int(t.name.split(".")[1])
            blocks[i] = blocks.get(i, 0) + t.nbytes
        elif t.name.startswith("token_embd"):
            emb += t.nbytes
        else:
            out += t.nbytes
    n = max(blocks) + 1
    weights = emb + out + sum(blocks.values())
    monkeypatch.setattr(probe, "GPU_RESERVE", 0)
    monkeypatch.setattr(probe, "GPU_RESERVE_SHARE", 0.0)

    def with_free(free):
        monkeypatch.setattr(ggmlq, "gpu_memory", lambda: (free, 10 * weights))
        return probe.gpu_layers(h)

    monkeypatch.setattr(ggmlq, "gpu_memory", lambda: None)
    assert probe.gpu_layers(h) == 0 and probe.host_bytes(h, 0) == weights
    assert with_free(weights) == -1 and probe.host_bytes(h, -1) == emb
    assert with_free(weights - emb - 1) == n  # all but the first block
    last = out + blocks[n - 1]
    assert with_free(last) == 2 and probe.host_bytes(h, 2) == weights - last
    assert with_free(last + blocks[n - 2] - 1) == 2
    assert with_free(out - 1) == 0
    monkeypatch.setattr(sensitivity, "_mem_available", lambda: 2 * (weights - last))
    assert sensitivity.resident_probes("auto", h, 2)
    monkeypatch.setattr(sensitivity, "_mem_available", lambda: 2 * (weights - last) - 2)
    assert not sensitivity.resident_probes("auto", h, 2)
    assert sensitivity.resident_probes("auto", h, -1)


def test_resident_probes_cost_the_tokens_not_a_load_each():
    """The cost model of resident probes: one load for all of them, each probe its tokens and its unit's writes."""
    from ggufbridge.quant.cost import CostModel

    kw = dict(units=10, rows=16, tokens=1000, elements=10**6, sampled=0, types=1, source_bytes=4 * 10**6,
              load_s=5.0, token_s=1e-3, element_s=0, probe_element_s=0, byte_s=1e-9, reference_passes=0,
              final_element_s=0.0)
    layout = CostModel(**kw)
    res = CostModel(**kw, resident=True, unit_bytes=2 * 10**6, set_byte_s=1e-9, swap_element_s=2e-9)
    assert layout.parts()["probes"] == pytest.approx(11 * (5.0 + 1.0))
    assert res.parts()["probes"] == pytest.approx(5.0 + 11 * 1.0 + 10**6 * 2e-9 + 2 * 2 * 10**6 * 1e-9)
    # the layout probes copy the source once; resident ones copy nothing (the header is measured on its twin)
    assert layout.parts()["probe layout"] == pytest.approx(4e-3) and "probe layout" not in res.parts()

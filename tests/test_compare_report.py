"""ggufbridge.compare.report: the table's size column, the bpw-accounting note and the size axis of the plot
(no models: fast)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from ggufbridge.cli import cli
from ggufbridge.compare import report
from ggufbridge.compare.metrics import Accumulator, Dense
from ggufbridge.compare.run import Comparison, Result


def _result(label, spec, bpw, size, noise, rng):
    acc = Accumulator()
    for row, kind in enumerate(("code", "prose")):
        ref = rng.normal(0, 2, (16, 50)).astype(np.float32)
        acc.add(row, kind, Dense(ref), Dense(ref + rng.normal(0, noise, ref.shape).astype(np.float32)),
                rng.integers(0, 50, 16))
    return Result(label, spec, acc.summary(), acc.kl_by_kind(), bpw, size)


def _comparison(specs):
    rng = np.random.default_rng(0)
    results = [_result(*s, rng) for s in specs]
    return Comparison(reference="logits:ref.safetensors", results=results, floor=results[-1].summary,
                      floor_note="test floor", n_rows=2, n_tokens=32)


MIXED = [("a-Q4_K_M.gguf", "gguf:a-Q4_K_M.gguf", 5.11, 5_387_584, 0.5),
         ("exl3-4.0", "exl3:/tmp/exl3-4.0", 4.15, 4_664_264, 0.3)]


def test_main_table_has_sizes_and_mixed_backends_get_the_accounting_note():
    md = report.to_markdown(_comparison(MIXED))
    lines = md.splitlines()
    header = next(line for line in lines if line.startswith("| Model"))
    assert header.split(" | ")[:3] == ["| Model", "bpw", "size"]
    q4 = next(line for line in lines if line.startswith("| a-Q4_K_M.gguf"))
    exl3 = next(line for line in lines if line.startswith("| exl3-4.0"))
    assert q4.split(" | ")[1:3] == ["5.11", "5.14 MiB"] and exl3.split(" | ")[1:3] == ["4.15", "4.45 MiB"]
    # the floor row has no file; the per-kind tables keep their own columns (no size)
    assert next(line for line in lines if line.startswith("| BF16 vs FP32")).split(" | ")[2] == "–"
    assert next(line for line in lines if line.startswith("| Kind")).split(" | ")[:3] == ["| Kind", "bpw", "KL mean"]
    note = next(line for line in lines if line.startswith("bpw is each backend's own accounting"))
    assert report.BPW_ACCOUNTING["gguf"] in note and report.BPW_ACCOUNTING["exl3"] in note


def test_one_backend_needs_no_accounting_note():
    md = report.to_markdown(_comparison([MIXED[0], ("b-Q8_0.gguf", "b-Q8_0.gguf", 8.5, 9_009_472, 0.1)]))
    assert "own accounting" not in md


def _plot_xs(cmp, tmp_path, monkeypatch):
    """x values of the KL-against-size lines the plot draws, per backend."""
    import matplotlib.axes

    drawn = {}
    real_plot = matplotlib.axes.Axes.plot

    def spy(self, xs, ys, *args, label=None, **kwargs):
        drawn[label] = list(xs)
        return real_plot(self, xs, ys, *args, label=label, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    report.write_plot(cmp, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0
    return drawn


def test_plot_puts_backends_on_one_size_axis(tmp_path, monkeypatch):
    drawn = _plot_xs(_comparison(MIXED), tmp_path, monkeypatch)
    assert drawn == {"EXL3": [4_664_264 / 2**20], "GGUF": [5_387_584 / 2**20]}


def test_plot_falls_back_to_bpw_without_sizes(tmp_path, monkeypatch):
    cmp = _comparison(MIXED)
    cmp.results[1].file_bytes = None
    drawn = _plot_xs(cmp, tmp_path, monkeypatch)
    assert drawn == {"EXL3": [4.15], "GGUF": [5.11]}


def test_recipe_files_get_their_own_family(tmp_path, monkeypatch):
    """gguf_facts reads the key `ggufbridge quantize --recipe` writes; the plot draws such files as their own line."""
    import gguf

    from ggufbridge.compare.sources import gguf_facts

    for name, recipe in (("plain.gguf", None), ("hq4.gguf", "hq4")):
        w = gguf.GGUFWriter(str(tmp_path / name), "qwen35moe")
        if recipe:
            w.add_string("ggufbridge.quant.recipe", recipe)
        w.add_tensor("t", np.zeros(4, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        assert gguf_facts(tmp_path / name) == (32.0, recipe)
    cmp = _comparison(MIXED + [("a-hq4.gguf", "gguf:a-hq4.gguf", 5.10, 5_386_304, 0.2)])
    cmp.results[2].family = "GGUF, ggufbridge recipes"
    drawn = _plot_xs(cmp, tmp_path, monkeypatch)
    assert set(drawn) == {"EXL3", "GGUF", "GGUF, ggufbridge recipes"}


# --- output paths are checked before the (long) run --------------------------------------------------------------

def _eval_file(tmp_path):
    ev = tmp_path / "eval.jsonl"
    ev.write_text('{"text": "The capital of France is Paris."}\n')
    return ev


@pytest.mark.parametrize("args", [["--json", "{ev}"], ["--markdown", "{ev}"], ["--plot", "{ev}"]])
def test_compare_refuses_to_write_over_its_eval_set(tmp_path, args):
    """`compare ... --eval e.jsonl --json e.jsonl` replaced the eval set with the figures."""
    ev = _eval_file(tmp_path)
    before = ev.read_bytes()
    args = [a.format(ev=ev) for a in args]
    res = CliRunner().invoke(cli, ["compare", str(tmp_path / "absent.gguf"), "-r", f"gguf:{tmp_path / 'ref.gguf'}",
                                   "--eval", str(ev), *args])
    assert res.exit_code == 2 and "is the input" in res.output, res.output
    assert ev.read_bytes() == before


def test_compare_plot_format_is_checked_before_the_run(tmp_path):
    """--plot x.gguf ran the whole comparison, then matplotlib's ValueError was a traceback."""
    ev = _eval_file(tmp_path)
    res = CliRunner().invoke(cli, ["compare", str(tmp_path / "absent.gguf"), "-r", f"gguf:{tmp_path / 'ref.gguf'}",
                                   "--eval", str(ev), "--plot", str(tmp_path / "fig.gguf")])
    assert res.exit_code == 2, res.output
    assert "--plot: expected a .png, .svg or .pdf file, found fig.gguf" in res.output, res.output


@pytest.mark.parametrize("which", ["-o", "--rows-out"])
def test_dump_logits_refuses_to_write_over_its_eval_set(tmp_path, which):
    ev = _eval_file(tmp_path)
    before = ev.read_bytes()
    out = ["-o", str(ev)] if which == "-o" else ["-o", str(tmp_path / "d.safetensors"), "--rows-out", str(ev)]
    res = CliRunner().invoke(cli, ["dump-logits", "-m", f"gguf:{tmp_path / 'absent.gguf'}", "--eval", str(ev), *out])
    assert res.exit_code == 2 and "is the input" in res.output, res.output
    assert ev.read_bytes() == before

"""benchmarks/concurrency_compare.py: the before/after table of docs/benchmarks.md ("The slots' batch") comes out of
the recorded runs it cites, each ratio against its own run's one stream (recomputed here from the JSON); a file that
is not a `bench --concurrency` result is refused in one line, exit 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import concurrency_compare as ccmp

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "concurrency"
RUNS = {"2048": RESULTS / "h200-b55a2c7d716c-b2048.json", "8192": RESULTS / "h200-b55a2c7d716c-b8192.json"}


def _doc_rows() -> dict[str, list[str]]:
    """The docs' rows `| 2048 ([json](...)) | 612.1 | 207.1 | 2.96x | 3.66x |` by their `-b`."""
    out = {}
    for line in (ROOT / "docs" / "benchmarks.md").read_text().splitlines():
        m = re.match(r"\| (\d+) \(\[json\]\(\.\./benchmarks/results/concurrency/(h200-b55a2c7d716c-b\d+\.json)\)\) \|"
                     r"(.*)\|$", line)
        if m:
            out[m.group(1)] = [c.strip() for c in m.group(3).split("|")]
    return out


def test_the_documented_table_is_what_the_runs_give(capsys):
    doc = _doc_rows()
    assert set(doc) == set(RUNS)
    assert ccmp.main([f"b{k}={p}" for k, p in RUNS.items()]) == 0
    out = capsys.readouterr().out
    for b, path in RUNS.items():
        rows = {r["streams"]: r for r in json.loads(path.read_text())["rows"] if r["mode"] == "target"}
        one, eight = rows[1], rows[8]
        agg, ratio = eight["aggregate_decode_tok_s"], eight["aggregate_decode_tok_s"] / one["aggregate_decode_tok_s"]
        steady = eight["steady_decode_tok_s"] / one["steady_decode_tok_s"]
        # the docs' columns: 8 streams tok/s, one stream, vs one stream, while all decode
        assert doc[b] == [f"{agg:.1f}", f"{one['aggregate_decode_tok_s']:.1f}", f"{ratio:.2f}x", f"{steady:.2f}x"]
        line = next(x for x in out.splitlines() if x.startswith(f"| b{b} | 8 |"))
        assert f"| {agg:.1f} | {ratio:.2f}x |" in line and f"| {steady:.2f}x |" in line, line


def test_a_plot_is_written(tmp_path):
    png = tmp_path / "c.png"
    assert ccmp.main([f"b{k}={p}" for k, p in RUNS.items()] + ["-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("*.tmp.png"))


@pytest.mark.parametrize("spec, says", [("nolabel", "expected LABEL=PATH"), ("a=/nonexistent.json", "not a bench"),
                                        ("a={bad}", "not a bench")])
def test_a_file_that_is_not_a_result_is_one_line_and_exit_2(tmp_path, capsys, spec, says):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": [{"mode": "target", "streams": 1}]}))  # no aggregate: not a result
    assert ccmp.main([spec.format(bad=bad)]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err

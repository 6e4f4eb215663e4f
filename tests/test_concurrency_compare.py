"""benchmarks/concurrency_compare.py, the before/after table of issue 28 from two bench --concurrency results: each
ratio is against the same run's one stream, rows of drafted runs are left out, and a file that is not a result is
refused with one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "concurrency_compare.py"


def result(rates: dict[int, float], steady: dict[int, float]) -> dict:
    rows = [{"mode": "target", "streams": n, "aggregate_decode_tok_s": r, "steady_decode_tok_s": steady.get(n),
             "ttft_p50_s": 0.1 * n} for n, r in rates.items()]
    rows.append({"mode": "draft", "streams": 1, "aggregate_decode_tok_s": 999.0, "ttft_p50_s": 0.1})
    return {"rows": rows}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_table_ratios_are_per_run_and_the_plot_is_written(tmp_path):
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(json.dumps(result({1: 200.0, 8: 400.0}, {1: 200.0, 8: 500.0})))
    after.write_text(json.dumps(result({1: 210.0, 8: 840.0}, {1: 205.0})))
    png = tmp_path / "cmp.png"
    res = run(f"series={before}", f"candidates={after}", "-o", str(png))
    assert res.returncode == 0, res.stderr
    rows = [line.split("|")[1:-1] for line in res.stdout.splitlines()[2:]]
    cells = {(r[0].strip(), int(r[1])): [c.strip() for c in r[2:]] for r in rows}
    assert set(cells) == {("series", 1), ("series", 8), ("candidates", 1), ("candidates", 8)}  # no draft rows
    assert cells[("series", 8)][:4] == ["400.0", f"{400 / 200:.2f}x", "500.0", f"{500 / 200:.2f}x"]
    assert cells[("candidates", 8)][:4] == ["840.0", f"{840 / 210:.2f}x", "n/a", "n/a"]  # no window figure
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not list(tmp_path.glob("*.tmp.png"))


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    for content, arg in (("{", f"a={bad}"), ('{"rows": [{"mode": "target"}]}', f"a={bad}"), (None, "no-equals"),
                         (None, f"a={tmp_path / 'missing.json'}")):
        if content is not None:
            bad.write_text(content)
        res = run(arg)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, (arg, res.stderr)
        assert res.stderr.startswith("concurrency_compare: ")

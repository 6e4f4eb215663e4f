"""`ggufbridge bench` on CPU with small prompt lengths: JSON, Markdown table and PNG plot."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ggufbridge.cli import cli
from ggufbridge.errors import GGUFBridgeError
from ggufbridge.runtime.bench import parse_lengths

from _runtime_models import converted


@pytest.mark.parametrize("text, expected", [("1k,2k,8k", [1024, 2048, 8192]), ("64, 16", [16, 64]),
                                            ("512", [512])])
def test_parse_lengths(text, expected):
    assert parse_lengths(text) == expected


@pytest.mark.parametrize("text", ["", "0", "1m", "1k,1024", "-5"])
def test_parse_lengths_refuses(text):
    with pytest.raises(GGUFBridgeError, match="--prompt-lengths"):
        parse_lengths(text)


@pytest.mark.slow
def test_bench_target_vs_draft(make_ckpt, tmp_path_factory, tmp_path):
    model = converted(make_ckpt, tmp_path_factory, with_draft=True)
    out = tmp_path / "bench"
    res = CliRunner().invoke(cli, ["bench", str(model), "--draft", "--prompt-lengths", "32,96", "-n", "12",
                                   "--threads", "2", "-o", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "bench.json").read_text())
    assert data["prompt_lengths"] == [32, 96] and data["runtime"]["commit"] == "0c1e570"
    assert set(data["commands"]) == {"target", "draft"}
    assert "--spec-type draft-dspark" in data["commands"]["draft"]
    assert "--spec-type" not in data["commands"]["target"]
    for row in data["rows"]:
        for mode in ("target", "draft"):
            m = row[mode]
            assert m["prefill_tok_s"] > 0 and m["decode_tok_s"] > 0 and m["ttft_s"] > 0
        # speculative decoding with greedy verification must reproduce the target's tokens exactly
        assert row["greedy_identical"] is True
        assert row["draft"]["draft_n"] > 0 and 0 <= row["draft"]["acceptance"] <= 1
    samples = data["samples"]
    assert {s["prompt_tokens"] for s in samples} == {32, 96}
    assert all(s["predicted"] == 12 for s in samples)  # EOS ignored: every request generates n tokens
    for n in (32, 96):
        texts = {s["mode"]: s["text"] for s in samples if s["prompt_tokens"] == n}
        assert texts["target"] and texts["target"] == texts["draft"]
    # two independent server counters agree: per-response timings vs /metrics over the run
    drafted = sum(s["draft_n"] for s in samples if s["mode"] == "draft")
    accepted = sum(s["draft_accepted"] for s in samples if s["mode"] == "draft")
    assert data["draft_counters"]["spec_decode_num_draft_tokens_total"] == drafted
    assert data["draft_counters"]["spec_decode_num_accepted_tokens_total"] == accepted

    md = (out / "bench.md").read_text()
    assert md.count("\n| 32 |") == 1 and md.count("\n| 96 |") == 1 and "commit `0c1e570`" in md
    assert "acceptance" in md and data["commands"]["draft"] in md
    png = (out / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert (out / "llama-server-target.log").exists() and (out / "llama-server-draft.log").exists()


@pytest.mark.slow
def test_bench_target_only(make_ckpt, tmp_path_factory, tmp_path):
    model = converted(make_ckpt, tmp_path_factory, with_draft=False)
    res = CliRunner().invoke(cli, ["bench", str(model), "--prompt-lengths", "16", "-n", "4", "-o", str(tmp_path)])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "bench.json").read_text())
    assert list(data["commands"]) == ["target"] and "draft" not in data["rows"][0]
    assert "greedy_identical" not in data["rows"][0]

"""`ggufbridge bench` on CPU with small prompt lengths: JSON, Markdown table and PNG plot."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ggufbridge.cli import cli
from ggufbridge.errors import GGUFBridgeError
from ggufbridge.runtime.benchmark import parse_lengths

from _runtime_models import converted
from _cores import THREADS


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
                                   "--threads", str(THREADS), "-o", str(out)])
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
    # --depths: the same measurement named for what it sweeps (context depth), one row per depth
    res = CliRunner().invoke(cli, ["bench", str(model), "--depths", "16,300", "-n", "4", "-o", str(tmp_path)])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "bench.json").read_text())
    assert list(data["commands"]) == ["target"] and "draft" not in data["rows"][0]
    assert "greedy_identical" not in data["rows"][0]
    assert [r["prompt_tokens"] for r in data["rows"]] == [16, 300] and data["ctx"] >= 300 + 4
    assert all(r["target"]["decode_tok_s"] > 0 and r["target"]["prefill_tok_s"] > 0 for r in data["rows"])


@pytest.mark.slow
def test_bench_draft_on_the_users_prompts_picks_n_max(make_ckpt, tmp_path_factory, tmp_path):
    """--prompts + --draft-n-max: acceptance on those prompts per draft length, and a verdict that follows from
    the measured numbers (the fastest n_max, and whether it beats target-only decode)."""
    model = converted(make_ckpt, tmp_path_factory, with_draft=True)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"The capital of France is"\n\n{"prompt": "def fib(n):\\n    return"}\n')
    out = tmp_path / "bench"
    res = CliRunner().invoke(cli, ["bench", str(model), "--draft", "--draft-n-max", "2,3", "--prompts", str(prompts),
                                   "-n", "12", "--threads", str(THREADS), "-o", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "bench.json").read_text())
    assert data["prompts"] == ["The capital of France is", "def fib(n):\n    return"]
    assert {s["prompt"] for s in data["samples"]} == {0, 1}
    sweep = data["draft_sweep"]
    assert [r["n_max"] for r in sweep["rows"]] == [2, 3, 8]  # the sweep and the cpu recipe's own n_max
    assert "--spec-draft-n-max 2" in data["commands"]["draft-2"]
    for r in sweep["rows"]:
        ss = [s for s in data["samples"] if s["mode"] == r["mode"]]
        drafted, accepted = sum(s["draft_n"] for s in ss), sum(s["draft_accepted"] for s in ss)
        assert drafted > 0 and r["acceptance"] == accepted / drafted
        # drafting never changes greedy output
        assert [s["text"] for s in ss] == [s["text"] for s in data["samples"] if s["mode"] == "target"]
    best = max(sweep["rows"], key=lambda r: r["speedup"])
    assert sweep["best_n_max"] == best["n_max"] and sweep["pays"] == (best["speedup"] > 1.0)
    assert sweep["verdict"] in res.output and f"n_max {best['n_max']}" in sweep["verdict"]


def test_bench_refuses_bad_prompts_file(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text('"ok"\nnot json\n')
    res = CliRunner().invoke(cli, ["bench", str(tmp_path), "--prompts", str(bad)])
    assert res.exit_code == 2 and "p.jsonl:2" in res.stderr and "Traceback" not in res.output

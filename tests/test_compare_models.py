"""`ggufbridge compare` / `dump-logits` on synthetic checkpoints converted to F32 and Q8_0 GGUFs.

Independent references: transformers' full forward pass (not compare's body-then-head-per-chunk path),
llama-cpp-python's own `Llama(logits_all=True).eval()` scores (not compare's chunked decode loop), and the
figures computed from probabilities in tests/_compare_ref.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ggufbridge.cli import cli

from _compare_ref import figures, per_position

pytestmark = pytest.mark.slow

CTX = 96
PROSE = "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs!"
CODE = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"


def invoke(*args):
    r = CliRunner().invoke(cli, [str(a) for a in args])
    out = r.output
    return r.exit_code, out, r


def ok(*args):
    code, out, r = invoke(*args)
    assert code == 0, out + repr(r.exception)
    return out


def refused(*args, match):
    code, out, _ = invoke(*args)
    assert code == 2, out
    assert "Traceback" not in out
    assert match in out, out


@pytest.fixture(scope="module")
def small_ckpt(make_ckpt):
    return make_ckpt("tiny", vocab="small")


@pytest.fixture(scope="module")
def ggufs(make_gguf):
    return {t: make_gguf("tiny", t, vocab="small") for t in ("f32", "q8_0")}


@pytest.fixture(scope="module")
def eval_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    rows = [
        {"ids": [int(x) for x in rng.integers(0, 472, 40)], "kind": "random"},
        {"text": PROSE, "kind": "prose"},
        {"text": CODE, "kind": "code"},
        {"ids": [int(x) for x in rng.integers(0, 472, CTX)], "kind": "random"},
        {"text": PROSE.upper()},
    ]
    p = tmp_path_factory.mktemp("eval") / "eval.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _rows(ckpt, eval_path):
    """(ids, kind) of each eval row, text tokenised here with transformers directly."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ckpt))
    out = []
    for line in Path(eval_path).read_text().splitlines():
        r = json.loads(line)
        ids = r["ids"] if "ids" in r else tok(r["text"], add_special_tokens=False)["input_ids"]
        out.append((list(ids), r.get("kind", "default")))
    return out


def _near_ties(ckpt, eval_path, gap):
    """Per row: positions whose reference top-2 logits differ by less than `gap` (transformers' full forward)."""
    import torch

    from ggufbridge.testkit.checkpoint import load_reference

    model = load_reference(ckpt)
    out = []
    for ids, kind in _rows(ckpt, eval_path):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float().numpy()
        top2 = -np.sort(-logits, axis=1)[:, :2]
        out.append((top2[:, 0] - top2[:, 1] < gap, kind))
    return out


@pytest.fixture(scope="module")
def q8_json(ggufs, small_ckpt, eval_file, tmp_path_factory):
    d = tmp_path_factory.mktemp("q8")
    ok("compare", ggufs["q8_0"], "--reference", f"hf:{small_ckpt}", "--eval", eval_file, "--ctx", CTX,
       "--no-floor", "--no-progress", "--json", d / "r.json")
    return json.loads((d / "r.json").read_text())


def test_f32_gguf_matches_hf(ggufs, small_ckpt, eval_file, tmp_path):
    out = ok("compare", ggufs["f32"], "--reference", f"hf:{small_ckpt}", "--eval", eval_file, "--ctx", CTX,
             "--no-progress", "--json", tmp_path / "r.json", "--markdown", tmp_path / "r.md")
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["kl_mean"] < 1e-5
    assert r["kl_max"] < 1e-4
    # top-1 is 1.0 except where the reference's two best logits are closer than float noise between the two
    # implementations (~1e-3 here): there both answers are right. Such near-ties must be rare.
    ties = _near_ties(small_ckpt, eval_file, gap=2e-3)
    n_tie = sum(int(t.sum()) for t, _ in ties)
    assert n_tie <= r["n_tokens"] // 50
    assert round(r["top1"] * r["n_tokens"]) >= r["n_tokens"] - n_tie
    clean = {k for k in r["per_kind"] if not any(t.any() for t, kk in ties if kk == k)}
    assert clean and all(r["per_kind"][k]["top1"] == 1.0 for k in clean)
    assert r["top5_overlap"] >= 1.0 - n_tie / r["n_tokens"]
    assert r["ppl_ratio"] == pytest.approx(1.0, abs=1e-4)
    assert r["n_rows"] == 5
    assert set(r["per_kind"]) == {"random", "prose", "code", "default"}
    # the numerics floor is measured and printed beside the result
    assert r["floor"] is not None and r["floor"]["kl_mean"] > r["kl_mean"]
    assert "BF16 vs FP32 (numerics floor)" in out
    assert (tmp_path / "r.md").read_text() in out


def test_q8_0_figures_equal_independent_numpy(q8_json, ggufs, small_ckpt, eval_file):
    import llama_cpp
    import torch

    from ggufbridge.testkit.checkpoint import load_reference

    rows = _rows(small_ckpt, eval_file)
    model = load_reference(small_ckpt)
    llm = llama_cpp.Llama(str(ggufs["q8_0"]), n_ctx=CTX, logits_all=True, verbose=False)
    per, kinds = [], []
    for ids, kind in rows:
        with torch.no_grad():
            ref = model(input_ids=torch.tensor([ids])).logits[0].float().numpy()
        llm.reset()
        llm.eval(ids)
        cand = np.array(llm.scores[: len(ids)])
        per.append(per_position(ref, cand, ids))
        kinds.append(kind)
    llm.close()

    def check(got, want, what):
        for k, w in want.items():
            tol = 0.01 if k.startswith("kl") else 1e-4
            if k in ("top1", "top5_overlap", "n_rows", "n_tokens"):
                assert got[k] == w, (what, k, got[k], w)
            else:
                assert got[k] == pytest.approx(w, rel=tol), (what, k, got[k], w)

    r = q8_json
    assert r["kl_mean"] > 1e-4  # Q8_0 really differs: the figures below are not trivially equal
    check(r, figures(per), "overall")
    for kind in set(kinds):
        check(r["per_kind"][kind], figures([p for p, k in zip(per, kinds) if k == kind]), kind)
    worst = int(np.argmax([p["kl"].mean() for p in per]))
    assert r["worst_row"]["row"] == worst and r["worst_row"]["kind"] == kinds[worst]
    assert r["worst_row"]["kl_mean"] == pytest.approx(per[worst]["kl"].mean(), rel=0.01)
    check(r["without_worst"], figures([p for i, p in enumerate(per) if i != worst]), "without worst")


def test_chunked_positions_give_the_same_figures(q8_json, ggufs, small_ckpt, eval_file, tmp_path):
    ok("compare", ggufs["q8_0"], "--reference", f"hf:{small_ckpt}", "--eval", eval_file, "--ctx", CTX,
       "--chunk", 7, "--no-floor", "--no-progress", "--json", tmp_path / "r.json")
    r = json.loads((tmp_path / "r.json").read_text())
    for k in ("kl_mean", "kl_p99", "kl_rev_mean", "ppl_ratio"):
        assert r[k] == pytest.approx(q8_json[k], rel=1e-3), k
    assert r["n_tokens"] == q8_json["n_tokens"]


def test_dump_then_logits_reference(q8_json, ggufs, small_ckpt, eval_file, tmp_path):
    dump = tmp_path / "ref.safetensors"
    ok("dump-logits", "--model", f"hf:{small_ckpt}", "--eval", eval_file, "--ctx", CTX, "-o", dump, "--no-progress")
    ok("compare", ggufs["q8_0"], "--reference", f"logits:{dump}", "--eval", eval_file, "--ctx", CTX,
       "--no-progress", "--json", tmp_path / "r.json")
    r = json.loads((tmp_path / "r.json").read_text())
    # documented bound (docs/compare.md): KL from the dump within 1% of the full-vocabulary KL
    assert r["kl_mean"] == pytest.approx(q8_json["kl_mean"], rel=0.01)
    assert r["kl_rev_mean"] == pytest.approx(q8_json["kl_rev_mean"], rel=0.01)
    assert r["top1"] == q8_json["top1"] and r["top5_overlap"] == q8_json["top5_overlap"]
    assert r["ppl_ratio"] == pytest.approx(q8_json["ppl_ratio"], rel=1e-5)
    assert r["floor"] is not None  # carried over from the dump

    # top-K only: the KL is a lower bound of the full one
    dump0 = tmp_path / "ref0.safetensors"
    ok("dump-logits", "--model", f"hf:{small_ckpt}", "--eval", eval_file, "--ctx", CTX, "-o", dump0,
       "--samples", 0, "--no-floor", "--no-progress")
    ok("compare", ggufs["q8_0"], "--reference", f"logits:{dump0}", "--eval", eval_file, "--ctx", CTX,
       "--no-progress", "--json", tmp_path / "r0.json")
    r0 = json.loads((tmp_path / "r0.json").read_text())
    assert r0["kl_mean"] <= q8_json["kl_mean"] * (1 + 1e-6)
    assert r0["floor"] is None


def test_gguf_dump_matches_gguf_reference(ggufs, eval_file, tmp_path):
    """dump-logits from a GGUF model, then the same comparison in-process and through the dump."""
    dump = tmp_path / "g.safetensors"
    ok("dump-logits", "--model", f"gguf:{ggufs['f32']}", "--eval", eval_file, "--ctx", CTX, "-o", dump,
       "--no-progress")
    for ref, name in ((f"gguf:{ggufs['f32']}", "a.json"), (f"logits:{dump}", "b.json")):
        ok("compare", ggufs["q8_0"], "--reference", ref, "--eval", eval_file, "--ctx", CTX, "--no-progress",
           "--json", tmp_path / name)
    a, b = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json"))
    assert b["kl_mean"] == pytest.approx(a["kl_mean"], rel=0.01)
    assert b["top1"] == a["top1"]


def test_text_file_rows(ggufs, small_ckpt, tmp_path):
    from transformers import AutoTokenizer

    text = tmp_path / "book.txt"
    text.write_text((PROSE + " " + CODE) * 3)
    n = len(AutoTokenizer.from_pretrained(str(small_ckpt))(text.read_text(), add_special_tokens=False)["input_ids"])
    ok("compare", ggufs["f32"], "--reference", f"hf:{small_ckpt}", "--text", text, "--ctx", 32, "--no-floor",
       "--no-progress", "--json", tmp_path / "r.json")
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["n_tokens"] == (n if n % 32 != 1 else n - 1)
    assert r["n_rows"] == -(-r["n_tokens"] // 32)
    assert list(r["per_kind"]) == ["book"]


def test_several_files_table_and_plot(ggufs, small_ckpt, eval_file, tmp_path):
    out = ok("compare", ggufs["f32"], ggufs["q8_0"], "--reference", f"hf:{small_ckpt}", "--eval", eval_file,
             "--ctx", CTX, "--no-progress", "--no-floor", "--json", tmp_path / "r.json", "--plot", tmp_path / "r.png")
    r = json.loads((tmp_path / "r.json").read_text())
    assert [x["label"] for x in r["results"]] == [ggufs["f32"].name, ggufs["q8_0"].name]
    f32, q8 = r["results"]
    assert f32["bits_per_weight"] == pytest.approx(32.0) and 8.0 < q8["bits_per_weight"] < 9.0
    assert f32["family"] == q8["family"] == "GGUF"  # converter output, no ggufbridge quantisation recipe
    assert q8["kl_mean"] > f32["kl_mean"]
    assert r["kl_mean"] == f32["kl_mean"]  # top level = first candidate
    assert out.count(ggufs["q8_0"].name) >= 2
    png = (tmp_path / "r.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


# ---- refusals -------------------------------------------------------------------------------------------------


def test_token_hash_mismatch_refused(ggufs, small_ckpt, tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"ids": [1, 2, 3, 4, 5, 6]}\n{"ids": [7, 8, 9]}\n')
    b.write_text('{"ids": [1, 2, 3, 4, 5, 6]}\n{"ids": [7, 8, 10]}\n')
    dump = tmp_path / "d.safetensors"
    ok("dump-logits", "--model", f"gguf:{ggufs['f32']}", "--eval", a, "--ctx", 8, "-o", dump, "--no-progress")
    refused("compare", ggufs["q8_0"], "--reference", f"logits:{dump}", "--eval", b, "--ctx", 8, "--no-progress",
            match="row 1: token hash")
    c = tmp_path / "c.jsonl"
    c.write_text('{"ids": [1, 2, 3, 4, 5, 6]}\n')
    refused("compare", ggufs["q8_0"], "--reference", f"logits:{dump}", "--eval", c, "--ctx", 8, "--no-progress",
            match="dump holds 2 rows, the eval set 1")


def test_vocabulary_mismatch_refused(ggufs, make_gguf, eval_file):
    big = make_gguf("tiny", "f16")  # the real vocabulary (tokenizer parity's conversion, made once per run)
    refused("compare", big, "--reference", f"gguf:{ggufs['f32']}", "--eval", eval_file, "--ctx", CTX,
            "--no-progress", match="vocabulary mismatch")


def test_tokenizer_mismatch_refused(ggufs, small_ckpt, eval_file, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(small_ckpt, other)
    tj = json.loads((other / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]  # same size, different ids for two letters
    (other / "tokenizer.json").write_text(json.dumps(tj))
    refused("compare", ggufs["f32"], "--reference", f"hf:{other}", "--eval", eval_file, "--ctx", CTX,
            "--no-floor", "--no-progress", match="tokenizer mismatch")


def test_bad_eval_sets_refused(ggufs, tmp_path):
    ref = f"gguf:{ggufs['f32']}"
    long = tmp_path / "long.jsonl"
    long.write_text('{"ids": [1, 2, 3]}\n{"ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}\n')
    refused("compare", ggufs["q8_0"], "--reference", ref, "--eval", long, "--ctx", 8, "--no-progress",
            match="row has 10 tokens, more than --ctx 8")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    refused("compare", ggufs["q8_0"], "--reference", ref, "--eval", empty, "--ctx", 8, "--no-progress",
            match="empty eval set")
    outside = tmp_path / "outside.jsonl"
    outside.write_text('{"ids": [1, 2, 600]}\n')
    refused("compare", ggufs["q8_0"], "--reference", ref, "--eval", outside, "--ctx", 8, "--no-progress",
            match="outside")
    refused("dump-logits", "--model", f"logits:{tmp_path / 'x.safetensors'}", "--eval", long, "-o",
            tmp_path / "y.safetensors", match="needs a model")
    fine = tmp_path / "fine.jsonl"
    fine.write_text('{"ids": [1, 2, 3]}\n')
    refused("compare", ggufs["q8_0"], "--reference", ref, "--eval", fine, "--ctx", 8, "--floor", "--no-progress",
            match="--floor needs an hf: reference")
    refused("compare", ggufs["q8_0"], "--reference", ref, "--eval", fine, "--text", fine, "--no-progress",
            match="exactly one of --eval")
    binary = tmp_path / "latin1.txt"  # were UnicodeDecodeError tracebacks
    binary.write_bytes("caf\xe9 au lait, na\xefve".encode("latin-1"))
    for flag in ("--eval", "--text"):
        refused("compare", ggufs["q8_0"], "--reference", ref, flag, binary, "--ctx", 8, "--no-progress",
                match=f"{binary}: not UTF-8 text (invalid continuation byte at byte 3)")


def test_exl3_without_cuda_says_so(ggufs, eval_file, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the no-GPU message cannot be observed")
    refused("compare", ggufs["q8_0"], "--reference", f"exl3:{tmp_path}", "--eval", eval_file, "--ctx", CTX,
            "--no-progress", match="needs a CUDA GPU")
    refused("dump-logits", "--model", f"exl3:{tmp_path}", "--eval", eval_file, "-o", tmp_path / "x.safetensors",
            match="needs a CUDA GPU")


def test_merge_results_of_an_earlier_run(q8_json, ggufs, small_ckpt, eval_file, tmp_path):
    """Results measured elsewhere (e.g. EXL3 on a GPU) join the table only for the same eval set and reference."""
    dump = tmp_path / "ref.safetensors"
    ok("dump-logits", "--model", f"gguf:{ggufs['f32']}", "--eval", eval_file, "--ctx", CTX, "-o", dump,
       "--no-progress")
    ok("compare", ggufs["q8_0"], "--reference", f"logits:{dump}", "--eval", eval_file, "--ctx", CTX,
       "--no-progress", "--json", tmp_path / "a.json")
    out = ok("compare", ggufs["f32"], "--reference", f"logits:{dump}", "--eval", eval_file, "--ctx", CTX,
             "--no-progress", "--merge", tmp_path / "a.json", "--json", tmp_path / "b.json",
             "--plot", tmp_path / "b.png")
    a, b = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json"))
    assert [r["label"] for r in b["results"]] == [ggufs["f32"].name, ggufs["q8_0"].name]
    assert b["results"][1]["kl_mean"] == a["kl_mean"]
    assert "merged 1 result(s)" in out
    other = tmp_path / "other.jsonl"
    other.write_text('{"ids": [1, 2, 3, 4]}\n')
    refused("compare", ggufs["f32"], "--reference", f"gguf:{ggufs['f32']}", "--eval", other, "--ctx", CTX,
            "--no-progress", "--merge", tmp_path / "a.json", match="eval_sha256")


def test_rows_out_carries_text_rows_to_another_run(ggufs, small_ckpt, tmp_path):
    """dump-logits --text --rows-out: the written ids are the rows the dump was made on (hashes match)."""
    from transformers import AutoTokenizer

    text = tmp_path / "prose.txt"
    text.write_text(PROSE * 4)
    dump, rows = tmp_path / "d.safetensors", tmp_path / "rows.jsonl"
    ok("dump-logits", "--model", f"hf:{small_ckpt}", "--text", text, "--ctx", 40, "-o", dump, "--rows-out", rows,
       "--no-floor", "--no-progress")
    ids = [i for line in rows.read_text().splitlines() for i in json.loads(line)["ids"]]
    tok = AutoTokenizer.from_pretrained(str(small_ckpt))(text.read_text(), add_special_tokens=False)["input_ids"]
    assert ids == tok[: len(ids)] and len(tok) - len(ids) <= 1
    ok("compare", ggufs["f32"], "--reference", f"logits:{dump}", "--eval", rows, "--ctx", 40, "--no-progress",
       "--json", tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["kl_mean"] < 1e-5


def test_the_readme_glob_over_a_convert_folder(small_ckpt, eval_file, tmp_path, caplog):
    """README: `compare OUT/*.gguf --reference ...`. A convert folder holds the mmproj too (and after `imatrix` an
    imatrix.gguf): llama.cpp cannot load those as language models; compare was a ValueError traceback. They are
    skipped with a warning; given alone they are refused in one line."""
    from ggufbridge.convert import convert

    out = tmp_path / "out"
    convert(small_ckpt, out, outtype="f32", progress=False)
    files = sorted(out.glob("*.gguf"))
    assert [p.name.startswith("mmproj-") for p in files].count(True) == 1
    ok("compare", *files, "--reference", f"gguf:{next(p for p in files if not p.name.startswith('mmproj-'))}",
              "--eval", eval_file, "--ctx", CTX, "--no-progress", "--json", tmp_path / "r.json")
    assert any("skipping" in r.getMessage() and "a mmproj GGUF" in r.getMessage() for r in caplog.records)
    r = json.loads((tmp_path / "r.json").read_text())
    assert [Path(c["candidate"].removeprefix("gguf:")).name for c in r["results"]] == \
        [p.name for p in files if not p.name.startswith("mmproj-")]
    mmproj = next(p for p in files if p.name.startswith("mmproj-"))
    refused("compare", mmproj, "--reference", f"gguf:{files[0]}", "--eval", eval_file, "--ctx", CTX,
            "--no-progress", match="not a language model")


def test_a_chunk_longer_than_the_context_is_one_context(ggufs, eval_file, tmp_path):
    """--chunk 10**8 allocated chunk × vocab floats (a MemoryError traceback at 100000 with the real vocabulary);
    no row is longer than --ctx, so a chunk never needs to be."""
    from ggufbridge.compare.run import compare

    ref = f"gguf:{ggufs['f32']}"
    base = compare(ref, [str(ggufs["q8_0"])], eval_path=eval_file, ctx=CTX)
    huge = compare(ref, [str(ggufs["q8_0"])], eval_path=eval_file, ctx=CTX, chunk=10**8)
    assert huge.results[0].summary["kl_mean"] == pytest.approx(base.results[0].summary["kl_mean"], rel=1e-6)

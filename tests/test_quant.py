"""Quantisation through llama-quantize: recipes, llama.cpp types, fallbacks, the report, --fit, convert --recipe.

References are independent of ggufbridge.quant: the recipe TOML files are parsed with tomllib, each tensor's
expected class comes from this file's own suffix table, stored types and byte counts are read back with gguf-py's
GGUFReader, and llama.cpp itself (llama_cpp bindings) must load every file and generate from it.
"""

from __future__ import annotations

import re
import tomllib
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGUFReader

from ggufbridge.cli import cli
from ggufbridge.convert import convert
from ggufbridge.errors import QuantError
from _cores import THREADS

# GGUF tensor name (suffix) → recipe class, written out here independently of ggufbridge.quant.classes
SUFFIX_CLASS = [
    (r"^token_embd\.weight$", "token_embd"), (r"^output\.weight$", "output"), (r"norm\.weight$", "norms"),
    (r"ffn_gate_inp\.weight$", "router"), (r"ffn_gate_inp_shexp\.weight$", "shared_expert_gate"),
    (r"ffn_(gate|up)_exps\.weight$", "experts_gate_up"), (r"ffn_down_exps\.weight$", "experts_down"),
    (r"_shexp\.weight$", "shared_experts"), (r"attn_(q|k|v|output)\.weight$", "attention"),
    (r"(attn_qkv|attn_gate|ssm_alpha|ssm_beta)\.weight$", "gdn_in"), (r"ssm_out\.weight$", "ssm_out"),
    (r"(ssm_conv1d\.weight|ssm_a|ssm_dt\.bias)$", "ssm_params"),
]
# ggml row length (ne0) must be a multiple of this per type (ggml block sizes)
BLOCK = {"Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "Q3_K": 256, "IQ4_XS": 256, "Q8_0": 32, "Q5_0": 32}


def class_of(name: str) -> str:
    return next(c for rx, c in SUFFIX_CLASS if re.search(rx, name))


def stored(path: Path) -> dict[str, tuple[str, tuple[int, ...], int]]:
    r = GGUFReader(str(path))
    return {t.name: (t.tensor_type.name, tuple(int(d) for d in t.shape), int(t.n_bytes)) for t in r.tensors}


def mix_toml(name: str) -> dict:
    return tomllib.loads(resources.files("ggufbridge").joinpath("recipes", "quant", f"{name}.toml").read_text())


def generates(path: Path, n: int = 4) -> list[int]:
    """llama.cpp loads the file, its logits are finite, and greedy decoding yields n tokens."""
    from _reference import gguf_greedy, gguf_logits, gguf_model

    llm = gguf_model(path, n_ctx=64)
    try:
        ids = [10, 20, 30, 40, 50]
        logits = gguf_logits(llm, ids)
        assert np.isfinite(logits).all() and logits.std() > 0
        out = gguf_greedy(llm, ids, n)
    finally:
        llm.close()
    assert len(out) == n
    return out


@pytest.fixture(scope="module")
def tiny_bf16(make_ckpt, make_gguf):
    """A model whose rows (64, 32) are not whole K-quant blocks: every K-quant must fall back."""
    kw = {"dtype": "bfloat16", "vocab": "small"}
    return make_ckpt("tiny", **kw), make_gguf("tiny", "bf16", **kw)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["hq4", "hq3"])
def test_recipe_types_are_the_recipe_s_and_llama_cpp_generates(ksafe_bf16, tmp_path, recipe):
    from ggufbridge.quant import quantize_file

    _, src = ksafe_bf16
    want = mix_toml(recipe)["types"]
    out = tmp_path / f"{recipe}.gguf"
    res = quantize_file(src, out, mix=recipe, threads=THREADS)
    got = stored(out)
    before = stored(src)
    assert set(got) == set(before)
    for name, (t, shape, _) in got.items():
        assert t == want[class_of(name)], name
    assert not res.fallbacks  # ksafe rows are whole 256-blocks
    # the report's per-class bytes add up to the tensors gguf-py reads, and its types are the stored ones
    rows = {r.cls: r for r in res.report.rows}
    assert sum(r.bytes for r in rows.values()) == sum(b for _, _, b in got.values())
    for cls, row in rows.items():
        assert set(row.types) == {want[cls]}
        assert row.count == sum(1 for n in got if class_of(n) == cls)
    generates(out)


@pytest.mark.slow
def test_hq4_is_not_larger_than_q4_k_m(ksafe_bf16, tmp_path):
    """On the benchmark model the mixed recipe costs no more bytes than llama.cpp's Q4_K_M."""
    from ggufbridge.quant import quantize_file

    _, src = ksafe_bf16
    a = quantize_file(src, tmp_path / "hq4.gguf", mix="hq4", threads=THREADS).path.stat().st_size
    b = quantize_file(src, tmp_path / "q4km.gguf", quant="Q4_K_M", threads=THREADS).path.stat().st_size
    assert a <= b


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["Q8_0", "Q6_K", "Q4_K_M"])
def test_llama_cpp_types_load_and_generate(ksafe_bf16, tmp_path, quant):
    from ggufbridge.quant import quantize_file

    _, src = ksafe_bf16
    out = tmp_path / f"{quant}.gguf"
    res = quantize_file(src, out, quant=quant.lower(), threads=THREADS)  # spelling is case-insensitive
    got = stored(out)
    kept = {"norms", "router", "shared_expert_gate", "ssm_params"}
    for name, (t, _, _) in got.items():
        if class_of(name) in kept:
            assert t == "F32", name
    if quant in ("Q8_0", "Q6_K"):  # single-type files (llama.cpp mixes only the K-quant _S/_M/_L types)
        for name, (t, _, _) in got.items():
            if class_of(name) not in kept:
                assert t in (quant, "Q8_0"), name
    assert res.report.quant_type == quant
    generates(out)


def _fallback_expectation(src: Path, recipe: dict) -> dict[str, str]:
    """Per the runtime's rule: a K-quant whose rows are not whole 256-blocks becomes its 32-block substitute."""
    substitute = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q3_K": "Q4_0"}
    exp = {}
    for name, (t, shape, _) in stored(src).items():
        want = recipe["types"][class_of(name)]
        if want in substitute and shape[0] % 256:
            exp[name] = substitute[want]
    return exp


@pytest.mark.slow
def test_rows_that_are_not_whole_blocks_fall_back_and_are_reported(tiny_bf16, tmp_path):
    from ggufbridge.quant import format_quant_report, quantize_file

    _, src = tiny_bf16
    exp = _fallback_expectation(src, mix_toml("hq4"))
    assert exp  # the tiny model has such rows
    out = tmp_path / "tiny-hq4.gguf"
    res = quantize_file(src, out, mix="hq4", threads=THREADS)
    got = stored(out)
    for name, t in exp.items():
        assert got[name][0] == t, name
    assert sorted(f.split(":")[0] for f in res.fallbacks) == sorted(exp)
    text = format_quant_report(res.report)
    assert "fallback:" in text
    generates(out)


@pytest.mark.slow
def test_llama_quantize_fallbacks_of_a_file_type_are_reported(tiny_bf16, tmp_path):
    from ggufbridge.quant import quantize_file

    _, src = tiny_bf16
    res = quantize_file(src, tmp_path / "tiny-q4km.gguf", quant="Q4_K_M", threads=THREADS)
    got = stored(res.path)
    # every tensor llama.cpp reported as fell-back is stored in a 32-block (or F16) type, and vice versa none of
    # the K-quant types ended up on a row that is not whole blocks
    named = {f.split(":")[0] for f in res.fallbacks}
    assert named
    for name, (t, shape, _) in got.items():
        if t in BLOCK:
            assert shape[0] % BLOCK[t] == 0, name
        if name in named:
            assert t in ("Q5_0", "Q5_1", "Q8_0", "Q4_0", "F16", "IQ4_NL"), name


@pytest.mark.slow
def test_imatrix_and_a_type_that_needs_it(ksafe_bf16, tmp_path):
    from ggufbridge.quant import quantize_file
    from ggufbridge.quant.imatrix import compute_imatrix

    _, src = ksafe_bf16
    with pytest.raises(QuantError, match="importance matrix"):
        quantize_file(src, tmp_path / "x.gguf", quant="IQ2_XS", threads=THREADS)
    assert not (tmp_path / "x.gguf").exists()
    text = tmp_path / "cal.txt"
    text.write_text(" ".join(f"sample {i} of calibration text, numbers {i * 7 % 13}." for i in range(400)))
    res = compute_imatrix(src, text, tmp_path / "imatrix.gguf", ctx=128, chunks=4, threads=THREADS)
    names = {t.name for t in GGUFReader(str(res.path)).tensors}
    assert "blk.0.ffn_up_exps.weight.in_sum2" in names and "blk.3.attn_q.weight.in_sum2" in names
    # IQ2_XS for one expert tensor, the rest hq4's: llama-quantize's IQ2 search takes ~10 s for the whole model on
    # one core, and one tensor needs the matrix as much as all of them
    mix = tmp_path / "iq2.toml"
    mix.write_text('base = "hq4"\n[tensors]\n"blk.1.ffn_down_exps.weight" = "IQ2_XS"\n')
    with pytest.raises(QuantError, match="importance matrix"):
        quantize_file(src, tmp_path / "x.gguf", mix=str(mix), threads=THREADS)
    out = quantize_file(src, tmp_path / "iq2.gguf", mix=str(mix), imatrix=res.path, threads=THREADS)
    assert stored(out.path)["blk.1.ffn_down_exps.weight"][0] == "IQ2_XS"
    generates(out.path)


def test_requantising_is_refused_unless_allowed(tiny_bf16, tmp_path):
    from ggufbridge.quant import quantize_file

    ckpt, _ = tiny_bf16
    q8 = convert(ckpt, tmp_path / "q8", outtype="q8_0", mmproj=False, progress=False).path("target")
    with pytest.raises(QuantError, match="already holds Q8_0"):
        quantize_file(q8, tmp_path / "x.gguf", quant="Q4_K_M")


def test_tool_output_that_is_not_utf8_is_no_crash(tiny_bf16, tmp_path):
    """llama-quantize echoes tensor names as raw bytes; one that is not UTF-8 (GGUF strings are untrusted input)
    was a UnicodeDecodeError traceback while reading the tool's output."""
    _, src = tiny_bf16
    raw = src.read_bytes()
    i = raw.index(b"output_norm.weight")
    bad = tmp_path / "bad-name.gguf"
    bad.write_bytes(raw[:i] + b"output_norm.w\x84ight" + raw[i + len(b"output_norm.weight"):])  # same length
    res = CliRunner().invoke(cli, ["quantize", str(bad), "-o", str(tmp_path / "o.gguf"), "--quant", "Q8_0"])
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output and res.exception is None, repr(res.exception)
    assert (tmp_path / "o.gguf").exists()


def test_a_full_disk_is_named_when_llama_quantize_fails(tiny_bf16, monkeypatch, tmp_path):
    """llama-quantize says only "basic_ios::clear: iostream error" when its output cannot be written (a full disk
    included); the error line adds the free space of the output's folder when it is less than the source's size.
    The write fails here by a missing folder, the disk is made full by disk_usage."""
    import shutil
    from collections import namedtuple

    from ggufbridge.quant import quantize_file

    _, src = tiny_bf16
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(2**20, 2**20 - 4096, 4096))
    dst = tmp_path / "absent" / "q.gguf"
    with pytest.raises(QuantError, match=r"llama-quantize failed .*only 4\.00 KiB free in .*absent"):
        quantize_file(src, dst, quant="Q8_0")


@pytest.mark.parametrize("how", ["same path", "symlink", "--fit-bytes"])
def test_output_that_is_the_source_is_refused(tiny_bf16, tmp_path, how):
    """`quantize F16.gguf -o F16.gguf` replaced the user's source file with the quantised one."""
    _, shared = tiny_bf16
    src = tmp_path / "src.gguf"
    src.write_bytes(shared.read_bytes())
    before = src.read_bytes()
    dst = src
    if how == "symlink":
        dst = tmp_path / "link.gguf"
        dst.symlink_to(src)
    args = ["--fit-bytes", "1GB", "--ctx", "0"] if how == "--fit-bytes" else ["--quant", "Q8_0"]
    res = CliRunner().invoke(cli, ["quantize", str(src), "-o", str(dst), *args])
    assert res.exit_code == 2, res.output
    assert "is the input" in res.output and "Traceback" not in res.output, res.output
    assert src.read_bytes() == before


def test_imatrix_output_that_is_an_input_is_refused(tiny_bf16, tmp_path):
    _, src = tiny_bf16
    text = tmp_path / "cal.txt"
    text.write_text(" ".join(f"line {i}: some words to calibrate with." for i in range(300)))
    before = {p: p.read_bytes() for p in (src, text)}
    for out in (src, text):
        res = CliRunner().invoke(cli, ["imatrix", str(src), "--text", str(text), "-o", str(out), "--ctx", "64"])
        assert res.exit_code == 2 and "is the input" in res.output, res.output
    assert {p: p.read_bytes() for p in before} == before


@pytest.mark.parametrize("types, message", [
    ({"experts_gate_up": "Q4_K"}, "missing"),
    ({"bogus": "Q4_K"}, "unknown tensor class"),
    ({"router": "Q8_0"}, "expected F32, found Q8_0"),
    ({"experts_down": "Q9_K"}, "found 'Q9_K'"),
])
def test_recipe_validation_names_expected_and_found(tmp_path, types, message):
    from ggufbridge.quant.mix import load_mix

    full = dict(mix_toml("hq4")["types"])
    if "missing" == message:
        del full["experts_down"]
    else:
        full.update(types)
    lines = ["file_type = \"Q4_K_M\"", "[types]"] + [f"{k} = \"{v}\"" for k, v in full.items()]
    p = tmp_path / "r.toml"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(QuantError, match=re.escape(message)):
        load_mix(str(p))


def test_a_mix_that_is_not_utf8_is_refused(tmp_path):
    from ggufbridge.quant.mix import load_mix

    f = tmp_path / "m.toml"
    f.write_bytes('name = "caf\xe9"\n'.encode("latin-1"))  # was a UnicodeDecodeError traceback
    with pytest.raises(QuantError, match=r"m.toml: not UTF-8 text \(invalid continuation byte at byte 11\)"):
        load_mix(str(f))


def test_user_recipe_on_top_of_a_packaged_one(tmp_path):
    from ggufbridge.quant.mix import load_mix

    p = tmp_path / "mine.toml"
    p.write_text('base = "hq4"\n[types]\nexperts_down = "Q5_K"\n')
    r = load_mix(str(p))
    assert r.types["experts_down"] == "Q5_K"
    assert r.types["experts_gate_up"] == mix_toml("hq4")["types"]["experts_gate_up"]


@pytest.mark.parametrize("args, message", [
    (["--quant", "Q9"], "unknown quantisation type 'Q9'"),
    (["--quant", "Q4_K_M", "--recipe", "hq4"], "exactly one of"),
    ([], "exactly one of"),
    (["--recipe", "nope"], "unknown quantisation recipe 'nope'"),
    (["--quant", "IQ2_XS"], "importance matrix"),
    (["--fit-bytes", "12 parsecs"], "expected a byte count"),
])
def test_cli_errors_are_one_line(tiny_bf16, tmp_path, args, message):
    _, src = tiny_bf16
    res = CliRunner().invoke(cli, ["quantize", str(src), "-o", str(tmp_path / "o.gguf"), *args])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output
    assert not (tmp_path / "o.gguf").exists()


@pytest.mark.slow
def test_convert_with_a_recipe_writes_a_verified_quantised_target(tiny_bf16, tmp_path):
    ckpt, _ = tiny_bf16
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["convert", str(ckpt), "-o", str(out), "--outtype", "bf16", "--recipe", "hq4",
                                   "--no-mmproj", "--no-progress"])
    assert res.exit_code == 0, res.output
    ggufs = sorted(out.glob("*.gguf"))
    assert [p.name for p in ggufs] == [p.name for p in ggufs if p.name.endswith("-HQ4.gguf")] and len(ggufs) == 1
    assert not list(out.glob(".*"))  # no intermediate or temporary file left behind
    types = {class_of(n): t for n, (t, _, _) in stored(ggufs[0]).items()}
    assert types["router"] == "F32" and types["token_embd"] == "Q8_0"
    v = CliRunner().invoke(cli, ["verify", str(out), "--source", str(ckpt)])
    assert v.exit_code == 0, v.output
    assert "quantised (not comparable)" in v.output and "0 differ" in v.output
    generates(ggufs[0])


def test_convert_rejects_a_quantised_intermediate(tiny_bf16, tmp_path):
    ckpt, _ = tiny_bf16
    res = CliRunner().invoke(cli, ["convert", str(ckpt), "-o", str(tmp_path / "o"), "--outtype", "q8_0",
                                   "--quant", "Q4_K_M", "--no-mmproj"])
    assert res.exit_code == 2 and "--outtype" in res.output and "found 'q8_0'" in res.output
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_inspect_shows_the_quantisation_table(ksafe_bf16, tmp_path):
    from ggufbridge.quant import quantize_file

    _, src = ksafe_bf16
    out = quantize_file(src, tmp_path / "hq3.gguf", mix="hq3", threads=THREADS).path
    res = CliRunner().invoke(cli, ["inspect", str(out)])
    assert res.exit_code == 0, res.output
    assert "what is quantised and what is not (recipe hq3" in res.output
    line = next(ln for ln in res.output.splitlines() if ln.strip().startswith("routed experts down"))
    assert "Q3_K" in line
    share = float(line.split()[-1].rstrip("%"))
    want = 100 * sum(b for n, (_, _, b) in stored(out).items() if class_of(n) == "experts_down") / out.stat().st_size
    assert abs(share - want) < 0.01


@pytest.mark.slow
def test_imatrix_cli_on_a_convert_folder(ksafe_bf16, tmp_path):
    _, src = ksafe_bf16
    text = tmp_path / "cal.txt"
    text.write_text(" ".join(f"line {i}: some words to calibrate with." for i in range(300)))
    out = tmp_path / "m.gguf"
    res = CliRunner().invoke(cli, ["imatrix", str(src.parent), "--text", str(text), "-o", str(out), "--ctx", "128",
                                   "--chunks", "2", "--threads", str(THREADS)])
    assert res.exit_code == 0, res.output
    assert out.is_file() and "2 chunks" in res.output
    short = tmp_path / "short.txt"
    short.write_text("hi")
    res = CliRunner().invoke(cli, ["imatrix", str(src), "--text", str(short), "-o", str(tmp_path / "n.gguf"),
                                   "--ctx", "128"])
    assert res.exit_code == 2 and "too short" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "n.gguf").exists()

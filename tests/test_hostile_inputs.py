"""Issue 27: what a hostile-user probe found, one regression test per class (each fails on the commit the probe
ran, 6fe2b4c). Silent corruption, concurrent runs into one folder, an image bomb through the server, tracebacks on
hostile structure, numbers that passed checks, signals in a command's first milliseconds, and the edges of promises.

User paths run through the CLI: exit code 2 and one `Error:` line, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from _slow_convert import start_slow_convert

from ggufbridge.testkit.vision import png_of_size as _png
from ggufbridge import errors
from ggufbridge.cli import cli
from ggufbridge.convert import convert
from _cores import THREADS

REPO = Path(__file__).resolve().parents[1]
DEEP = "[" * 50_000 + "]" * 50_000  # past Python's recursion limit in every parser


@pytest.fixture(scope="module")
def small_ckpt(make_ckpt):
    return make_ckpt("tiny", vocab="small", max_shard_size="200KB")  # float32


@pytest.fixture(scope="module")
def converted(small_ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile") / "out"
    convert(small_ckpt, out, outtype="f32", progress=False, mmproj=False)
    return out


def _invoke(*args) -> tuple[int, str]:
    res = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res.exit_code, res.output


def _refused(*args) -> str:
    code, text = _invoke(*args)
    lines = [line for line in text.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("Error: "), (code, text)
    return lines[0]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO))


# --- 1. silent corruption ----------------------------------------------------------------------------------------


def test_bf16_above_f16_range_is_kept_in_bf16_not_written_as_inf(make_ckpt, tmp_path, caplog):
    """A finite BF16 weight above 65,504 became +Inf in the default F16 output, with exit 0."""
    from ggufbridge.checkpoint.model_dir import ModelDir
    from ggufbridge.ggufio.reader import read_header

    ckpt = _copy(make_ckpt("tiny", vocab="small", dtype="bfloat16"), tmp_path / "ckpt")
    md = ModelDir.open(ckpt)
    ref = next(r for n, r in sorted(md.tensors.items()) if n.endswith("mlp.shared_expert.down_proj.weight"))
    big = np.array([1.0e5], dtype=np.float32).view(np.uint32) >> 16  # 99840 as BF16: finite, > 65504
    with open(ref.path, "r+b") as f:
        f.seek(ref.start)
        f.write(big.astype("<u2").tobytes())
    caplog.set_level("WARNING")
    out = tmp_path / "out"
    res = convert(ckpt, out, outtype="f16", progress=False, mmproj=False)
    kept = [r.message for r in caplog.records if "beyond the range of F16" in r.message]
    assert len(kept) == 1 and "kept as BF16" in kept[0], caplog.text
    h = read_header(res.path("target"))
    name = kept[0].split(" holds ")[0].removeprefix("warning: ")
    t = h.tensor(name)
    assert t.type == "BF16"
    values = (h.tensor_array(t).astype(np.uint32) << 16).view(np.float32)
    assert np.isfinite(values).all() and values.max() == np.float32(99840.0)
    assert all(x.type in ("F16", "F32") for x in h.tensors if x.name != name)
    assert _invoke("verify", out, "--source", ckpt)[0] == 0


def test_tokenizer_whose_ids_collide_is_refused(small_ckpt, tmp_path):
    """All tokens on id 0: converted with exit 0, 215 of 216 entries silently dropped."""
    ckpt = _copy(small_ckpt, tmp_path / "ckpt")
    tj = ckpt / "tokenizer.json"
    data = json.loads(tj.read_text())
    data["model"]["vocab"] = {t: 0 for t in data["model"]["vocab"]}
    tj.write_text(json.dumps(data))
    line = _refused("convert", ckpt, "-o", tmp_path / "out", "--no-progress")
    assert "gives id 0 to both" in line


def test_tokenizer_with_a_gap_in_its_ids_is_refused(small_ckpt, tmp_path):
    ckpt = _copy(small_ckpt, tmp_path / "ckpt")
    tj = ckpt / "tokenizer.json"
    data = json.loads(tj.read_text())
    vocab = data["model"]["vocab"]
    victim = next(t for t, i in vocab.items() if i == 5)
    vocab[victim] = max(vocab.values()) + 1000
    tj.write_text(json.dumps(data))
    assert "id 5 is missing" in _refused("convert", ckpt, "-o", tmp_path / "out", "--no-progress")


def test_special_token_outside_the_vocabulary_is_refused(small_ckpt, tmp_path):
    ckpt = _copy(small_ckpt, tmp_path / "ckpt")
    cfg = ckpt / "tokenizer_config.json"
    data = json.loads(cfg.read_text()) if cfg.is_file() else {}
    data["eos_token"] = "<|no-such-token|>"
    cfg.write_text(json.dumps(data))
    assert "is not a token" in _refused("convert", ckpt, "-o", tmp_path / "out", "--no-progress")


@pytest.mark.parametrize("template", ["", "   ", 7, ["not", "a", "dict"]])
def test_empty_or_non_string_chat_template_is_reported(small_ckpt, tmp_path, template):
    """An empty or non-string chat template was dropped without a word (the GGUF then has none)."""
    ckpt = _copy(small_ckpt, tmp_path / "ckpt")
    (ckpt / "chat_template.jinja").unlink(missing_ok=True)
    cfg = ckpt / "tokenizer_config.json"
    data = json.loads(cfg.read_text()) if cfg.is_file() else {}
    data["chat_template"] = template
    cfg.write_text(json.dumps(data))
    assert "chat template" in _refused("convert", ckpt, "-o", tmp_path / "out", "--no-progress")


def _safetensors(path: Path, header: dict, data: bytes = b"") -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


@pytest.mark.parametrize("shape", [[512.7, 64], [True, 4], ["4", 4], [4, None]])
def test_safetensors_shape_must_be_integers(tmp_path, shape):
    """`[512.7, 64]` was taken as 512 (int() truncates); the safetensors library refuses it."""
    from ggufbridge.checkpoint.safetensors import read_header

    entry = {"dtype": "F32", "shape": shape, "data_offsets": [0, 4 * 512 * 64]}
    p = _safetensors(tmp_path / "x.safetensors", {"w": entry}, b"\0" * (4 * 512 * 64))
    with pytest.raises(errors.CheckpointError, match="integer shape"):
        read_header(p)


def test_safetensors_float_offsets_are_refused(tmp_path):
    from ggufbridge.checkpoint.safetensors import read_header

    p = _safetensors(tmp_path / "x.safetensors", {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0.0, 8.5]}},
                     b"\0" * 8)
    with pytest.raises(errors.CheckpointError, match="integer"):
        read_header(p)


# --- 4. tracebacks on hostile structure: one bounded reader for every JSON/TOML file ---------------------------------


def test_deep_json_in_a_safetensors_header(tmp_path):
    from ggufbridge.checkpoint.safetensors import read_header

    p = tmp_path / "x.safetensors"
    raw = ('{"a": ' + DEEP + "}").encode()
    p.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(errors.CheckpointError, match="nested deeper"):
        read_header(p)


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "tokenizer_config.json",
                                  "model.safetensors.index.json", "preprocessor_config.json"])
def test_deep_json_in_a_checkpoint_file_is_one_error_line(small_ckpt, tmp_path, name):
    ckpt = _copy(small_ckpt, tmp_path / "ckpt")
    (ckpt / name).write_text('{"x": ' + DEEP + "}")
    assert "nested deeper" in _refused("convert", ckpt, "-o", tmp_path / "out", "--no-progress")


def test_deep_json_manifest_is_one_error_line(converted, tmp_path):
    out = _copy(converted, tmp_path / "out")
    (out / "manifest.json").write_text('{"files": ' + DEEP + "}")
    for cmd in (["verify", out], ["plan", out], ["serve", out, "--dry-run"]):
        assert "nested deeper" in _refused(*cmd)


def test_huge_integer_in_a_manifest_is_one_error_line(converted, tmp_path):
    out = _copy(converted, tmp_path / "out")
    man = json.loads((out / "manifest.json").read_text())
    text = json.dumps(man).replace('"bytes": ', '"bytes": ' + "9" * 5000, 1)
    (out / "manifest.json").write_text(text)
    _refused("verify", out)


@pytest.mark.parametrize("body", [
    "[server]\nctx = " + "[" * 5000 + "]" * 5000,  # nesting
    'name = "x"\nbackend = "cpu"\n[memory]\nhost_gib = 1e308\n[server]\nctx = 4096\n',  # OverflowError before
    'name = "x"\nbackend = "cpu"\n[memory]\nhost_gib = nan\n[server]\nctx = 4096\n',
    'name = "x"\nbackend = "cpu"\n[memory]\nhost_gib = 16\n[server]\nctx = 4096\nthreads = 99999999\n',
    'name = "x"\nbackend = "cpu"\n[memory]\nhost_gib = 16\n[server]\nctx = ' + "9" * 5000 + "\n",
])
def test_hostile_hardware_recipe_is_one_error_line(converted, tmp_path, body):
    recipe = tmp_path / "r.toml"
    recipe.write_text(body)
    _refused("plan", converted, "--recipe", recipe)


def test_hostile_quant_recipe_is_one_error_line(tmp_path, converted):
    from ggufbridge.quant.mix import load_mix as load_quant_recipe

    for body in ("types = " + "[" * 5000 + "]" * 5000, "x = inf\n", "x = " + "9" * 5000 + "\n"):
        p = tmp_path / "m.toml"
        p.write_text(body)
        with pytest.raises(errors.QuantError):
            load_quant_recipe(str(p))


def test_deep_json_eval_and_prompt_files(tmp_path):
    from ggufbridge.compare import evalset
    from ggufbridge.runtime.benchmark import load_prompts

    p = tmp_path / "eval.jsonl"
    p.write_text('{"ids": ' + DEEP + "}\n")
    with pytest.raises(errors.EvalDataError, match="nested deeper"):
        evalset._parse_jsonl(p)
    p.write_text('{"text": NaN}\n')
    with pytest.raises(errors.EvalDataError):
        evalset._parse_jsonl(p)
    p.write_text(DEEP + "\n")
    with pytest.raises(errors.GGUFBridgeError, match="nested deeper"):
        load_prompts(p)


def test_compare_merge_file_is_checked_before_anything_runs(tmp_path, monkeypatch):
    """`compare --merge` validated its file only after the whole (long) run."""
    from ggufbridge.compare import run

    def must_not_run(*a, **kw):
        raise AssertionError("a model was opened before the merge file was checked")

    monkeypatch.setattr(run, "localize", must_not_run)
    for body in (DEEP, '{"results": [{"label": 1}]}', '{"results": "x"}'):
        bad = tmp_path / "bad.json"
        bad.write_text(body)
        with pytest.raises(errors.GGUFBridgeError):
            run.compare("hf:/nowhere", ["x.gguf"], text_path=bad, merge_paths=[bad])


# --- 5. numbers that passed checks ---------------------------------------------------------------------------------


def _gguf_with_dims(path: Path, dims: tuple[int, ...], ggml_type: int = 0) -> Path:
    name = b"blk.0.w"
    info = struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
    info += struct.pack("<IQ", ggml_type, 0)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + info + b"\0" * 64)
    return path


def _folder_whose_target_has_dims(converted: Path, out: Path, dims: tuple[int, ...]) -> Path:
    """A copy of a converted folder whose target is replaced by a one-tensor GGUF of `dims` (manifest updated)."""
    _copy(converted, out)
    man = json.loads((out / "manifest.json").read_text())
    entry = next(f for f in man["files"] if f["role"] == "target")
    target = _gguf_with_dims(out / entry["path"], dims)
    entry["bytes"], entry["sha256"] = target.stat().st_size, None
    (out / "manifest.json").write_text(json.dumps(man))
    return out


def test_gguf_dimensions_whose_product_overflows_are_refused(tmp_path, converted):
    """dims whose product wraps in 64 bits passed the reader: inspect/plan/serve --dry-run reported 0 bytes."""
    from ggufbridge.ggufio.reader import read_header

    for dims in ((2**32, 2**32), (2**63, 2), (2**40, 2**40, 2**40)):
        p = _gguf_with_dims(tmp_path / "bad.gguf", dims)
        with pytest.raises(errors.GGUFFileError, match="overflows 64 bits"):
            read_header(p)
        assert "overflows 64 bits" in _refused("inspect", p)
    # and in a converted folder, in place of its target
    out = _folder_whose_target_has_dims(converted, tmp_path / "out", (2**32, 2**32))
    for cmd in (["plan", out], ["serve", out, "--dry-run"]):
        assert "overflows 64 bits" in _refused(*cmd)


@pytest.mark.parametrize("args", [
    ["run", "OUT", "-p", "hi", "--temp", "nan"],
    ["run", "OUT", "-p", "hi", "--temp", "inf"],
    ["bench", "OUT", "--timeout", "nan"],
    ["serve", "OUT", "--timeout", "inf"],
    ["serve", "OUT", "--threads", "99999999"],
    ["bench", "OUT", "--threads", "99999999"],
    ["quantize", "GGUF", "-o", "b.gguf", "--quant", "Q8_0", "--threads", "99999999"],
    ["quantize", "GGUF", "-o", "b.gguf", "--fit-bytes", "9" * 400],
])
def test_numeric_options_refuse_nan_inf_and_absurd_sizes(converted, args):
    gguf = next(converted.glob("*.gguf"))
    args = [str(converted) if a == "OUT" else str(gguf) if a == "GGUF" else a for a in args]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "Invalid value" in res.output


# --- 2. concurrent runs into one folder ----------------------------------------------------------------------------


def test_second_concurrent_convert_fails_fast_naming_the_holder(small_ckpt, tmp_path):
    """Two runs into one empty folder both exited 0: the second deleted the first's output ("replaced by --force")."""
    out = tmp_path / "out"
    first = start_slow_convert(small_ckpt, out, "--no-mmproj")
    try:
        t0 = time.monotonic()
        second = subprocess.run([sys.executable, "-m", "ggufbridge", "convert", str(small_ckpt), "-o", str(out),
                                 "--no-progress", "--no-mmproj"], capture_output=True, text=True, env=_env(),
                                timeout=120)
        waited = time.monotonic() - t0
        assert first.poll() is None, "the first run ended before the second was refused: the test proves nothing"
        assert second.returncode == 2, second.stderr
        lines = [line for line in second.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and f"process {first.pid}" in lines[0], second.stderr
        _, err = first.communicate(timeout=300)
        assert first.returncode == 0, err
        assert "replaced by --force" not in err
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert waited < 60  # failed fast: it did not wait for the first run
    assert _invoke("verify", out)[0] == 0
    assert not any(p.name.endswith(".lock") for p in out.iterdir())


def test_stale_lock_of_a_dead_process_is_taken_over(small_ckpt, tmp_path):
    from ggufbridge.outlock import FOLDER_LOCK

    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / FOLDER_LOCK).write_text(f"{dead.pid}\n")  # what a SIGKILLed run leaves: the file, not the flock
    code, text = _invoke("convert", small_ckpt, "-o", out, "--no-progress", "--no-mmproj", "--outtype", "f32")
    assert code == 0, text
    assert not (out / FOLDER_LOCK).exists()


def test_file_output_lock_across_processes(tmp_path):
    """quantize/imatrix outputs: the same lock on a single file, held by another real process."""
    from ggufbridge.outlock import exclusive

    dst = tmp_path / "q.gguf"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
                               "from ggufbridge.outlock import exclusive\n"
                               f"with exclusive(Path({str(dst)!r}), is_folder=False):\n"
                               "    print('held', flush=True); time.sleep(60)\n"],
                              stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(errors.OutputError, match=f"process {holder.pid}"):
            with exclusive(dst, is_folder=False):
                pass
    finally:
        holder.kill()
        holder.wait()
    with exclusive(dst, is_folder=False):  # its holder is dead: taken over
        pass


# --- 7. edges of promises: signals, wildcard host, extension case --------------------------------------------------


def test_program_handles_signals_before_importing_the_cli():
    """The first ~200 ms of a command (imports, option parsing) gave "Aborted!", a traceback or a silent death."""
    code = ("import signal, sys\nimport ggufbridge.__main__\n"
            "print(signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, 'ggufbridge.cli' in sys.modules, "
            "'click' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert res.stdout.split() == ["True", "False", "False"], res.stdout + res.stderr


def _sig_caught(pid: int, sig: int) -> bool:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except FileNotFoundError:
        pass
    return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_in_the_first_milliseconds_is_one_line(sig, converted):
    """Sent as soon as the program can catch it, while it is still importing: one line, exit 128 + signal."""
    for _ in range(3):
        p = subprocess.Popen([sys.executable, "-m", "ggufbridge", "verify", str(converted)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=_env())
        while p.poll() is None and not _sig_caught(p.pid, signal.SIGTERM):
            time.sleep(0.001)
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
        if p.returncode == 0:
            continue  # verify had already finished: try again
        assert p.returncode == 128 + sig, (p.returncode, err)
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines == [f"Error: interrupted by {signal.Signals(sig).name}"], err
        return
    pytest.skip("the command finished before the signal arrived, three times")


@pytest.mark.parametrize("host", ["::ffff:0.0.0.0", "[::ffff:0.0.0.0]", "0.0.0.0", "::", "0"])
def test_ipv4_mapped_wildcard_is_a_wildcard(host):
    from ggufbridge.runtime.lifecycle import wildcard

    assert wildcard(host)
    assert not wildcard("::ffff:127.0.0.1") and not wildcard("127.0.0.1")


def test_upper_case_gguf_extension_is_seen(converted, small_ckpt, tmp_path):
    """`EXTRA.GGUF` was missed by verify and by convert's "folder holds a conversion" check."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "EXTRA.GGUF").write_bytes(b"GGUF")
    assert "already holds a conversion" in _refused("convert", small_ckpt, "-o", out, "--no-progress")
    folder = _copy(converted, tmp_path / "conv")
    shutil.copy(next(folder.glob("*.gguf")), folder / "EXTRA.GGUF")
    code, text = _invoke("verify", folder)
    assert code != 0 and "EXTRA.GGUF" in text


# --- 6. memory: the non-finite scan works in bounded pieces ---------------------------------------------------------


def test_nonfinite_scan_of_bf16_needs_no_whole_tensor_temporaries():
    """The scan built bit masks and boolean arrays about 1.5x the tensor (822 MB peak vs 446 MB before it)."""
    from ggufbridge.ggufio.writer import CHUNK, nonfinite_counts

    a = np.zeros((128, 1 << 19), dtype=np.uint16)  # 128 MiB of BF16
    a[3, 7] = 0x7FC0  # NaN
    a[40, 9] = 0xFF80  # -Inf
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        counts = nonfinite_counts(a, "BF16")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert counts == (1, 1)
    assert peak < 8 * CHUNK < a.nbytes / 2, peak


def test_pieces_cover_the_tensor_in_order():
    from ggufbridge.ggufio.writer import CHUNK, pieces

    for shape in [(), (5,), (3, CHUNK + 7), (2, 3, 5), (CHUNK // 4 + 3, 8), (0, 4)]:
        a = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
        got = list(pieces(a))
        assert all(p.ndim == 1 and p.size <= CHUNK for p in got)
        joined = np.concatenate(got) if got else np.zeros(0, np.int64)
        assert np.array_equal(joined, a.reshape(-1))


# --- 3. the server path: image limits before decoding -----------------------------------------------------------




@pytest.mark.slow
def test_server_refuses_an_image_bomb_before_decoding_and_says_image(make_ckpt, tmp_path_factory):
    """A 389 KB PNG declaring 20000x20000 sent as a data URL was decoded by llama-server (2.4 GB, HTTP 200),
    where `run --image` refuses it; a truncated PNG was reported as a broken video."""
    import base64

    from _runtime_models import converted as served, serve_process
    from ggufbridge.runtime import server as sv
    from ggufbridge.vision.preprocess import load_image

    out = served(make_ckpt, tmp_path_factory, with_draft=False)
    bomb = _png(20000, 20000)
    assert len(bomb) < 1 << 20
    path = tmp_path_factory.mktemp("bomb") / "bomb.png"
    path.write_bytes(bomb)
    with pytest.raises(errors.VisionInputError, match="more than the limit"):
        load_image(path)  # run --image: the same bound
    console = tmp_path_factory.mktemp("bomb-serve") / "console.log"
    srv = serve_process(out, console, "--recipe", "cpu", "--ctx", "2048", "--threads", str(THREADS))
    try:
        for png, words in ((bomb, ("image", "more than the limit")), (_png(64, 64, truncate=True), ("image",))):
            body = {"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}},
                {"type": "text", "text": "What is this?"}]}], "max_tokens": 4}
            status, answer = sv.http_json(srv.url + "/v1/chat/completions", body, timeout=120)
            message = json.dumps(answer)
            assert status == 400, (status, message)
            assert all(w in message for w in words) and "video" not in message.lower(), message
    finally:
        srv.stop()


@pytest.mark.parametrize("tag,qt", [("F32", "F16"), ("BF16", "F16"), ("F32", "BF16"), ("F32", "Q8_0"),
                                    ("BF16", "Q8_0"), ("F16", "F32")])
def test_piecewise_encoding_equals_whole_tensor_encoding(tag, qt):
    """The writer encodes piece by piece (bounded temporaries): the bytes must be those of the whole tensor."""
    from gguf import GGMLQuantizationType

    from ggufbridge.ggufio.writer import CHUNK, encode, pieces

    rng = np.random.default_rng(0)
    values = rng.standard_normal((3, CHUNK // 2 + 96)).astype(np.float32)
    arr = {"F32": values, "F16": values.astype(np.float16),
           "BF16": (values.view(np.uint32) >> 16).astype(np.uint16)}[tag]
    q = GGMLQuantizationType[qt]
    whole = np.ascontiguousarray(encode(arr, tag, q)).reshape(-1).view(np.uint8)
    parts = np.concatenate([np.ascontiguousarray(encode(p, tag, q)).reshape(-1).view(np.uint8) for p in pieces(arr)])
    assert len(list(pieces(arr))) > 1 and np.array_equal(whole, parts)


# --- 8. issue 40: values judged where they are used, locks that cannot be turned, edges ---------------------------


def _edit_text(path: Path, fn) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    path.unlink()  # a copy of a shared fixture may be a hard link: replace, never write through
    path.write_text(json.dumps(doc, indent=2))  # Python's json writes NaN / Infinity literals as transformers does


def test_values_nobody_reads_are_no_reason_to_refuse(small_ckpt, tmp_path):
    """`"model_max_length": 1000000000000000019884624838656` (int(1e30): what transformers writes for a tokenizer
    without a length limit) made every conversion fail; so did any huge or non-finite number in a key the
    converter never reads."""
    ckpt = _copy(small_ckpt, tmp_path / "ckpt")
    _edit_text(ckpt / "tokenizer_config.json", lambda d: d.__setitem__("model_max_length", int(1e30)))
    _edit_text(ckpt / "config.json", lambda d: d.update({
        "unused_huge": 10**40, "unused_nan": float("nan"), "unused_inf": float("inf"), "unused_e400": 1e400,
        "text_config": {**d["text_config"], "router_aux_loss_coef": float("nan"), "initializer_range": 10**300}}))
    _edit_text(ckpt / "model.safetensors.index.json", lambda d: d["metadata"].__setitem__("total_size", 2**70))
    code, text = _invoke("convert", ckpt, "-o", tmp_path / "out", "--no-progress", "--no-mmproj", "--outtype", "f32")
    assert code == 0, text


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["text_config"]["rope_parameters"].__setitem__("rope_theta", float("inf")),
     "rope_theta must be a finite number, found inf"),
    (lambda c: c["text_config"]["rope_parameters"].__setitem__("partial_rotary_factor", float("nan")),
     "partial_rotary_factor must be a finite number, found nan"),
    (lambda c: c["text_config"].__setitem__("max_position_embeddings", int(1e30)),
     "max_position_embeddings must be at most 2147483647, found 1000000000000000019884624838656"),
    (lambda c: c["text_config"].__setitem__("mtp_num_hidden_layers", 10**40),
     "mtp_num_hidden_layers must be an integer of at most 64 bits"),
])
def test_a_value_that_is_read_is_judged_by_its_field(small_ckpt, tmp_path, edit, message):
    """The protection the document-wide bound gave stays where the value is used, naming the field."""
    ckpt = _copy(small_ckpt, tmp_path / "ckpt")
    _edit_text(ckpt / "config.json", edit)
    assert message in _refused("convert", ckpt, "-o", tmp_path / "out", "--no-progress", "--no-mmproj")


def test_safetensors_offsets_and_dimensions_stay_u64(tmp_path):
    from ggufbridge.checkpoint.safetensors import read_header

    for entry in ({"dtype": "F32", "shape": [2**64, 0], "data_offsets": [0, 0]},
                  {"dtype": "F32", "shape": [1], "data_offsets": [2**64, 2**64 + 4]}):
        header = json.dumps({"w": entry}).encode()
        p = tmp_path / "x.safetensors"
        p.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
        with pytest.raises(errors.CheckpointError, match="must be unsigned 64-bit integers"):
            read_header(p)


def test_manifest_sizes_and_recipe_numbers_are_judged_by_their_field(converted, tmp_path):
    out = _copy(converted, tmp_path / "out")
    man = json.loads((out / "manifest.json").read_text())
    man["files"][0]["bytes"] = 2**70
    (out / "manifest.json").write_text(json.dumps(man))
    assert "bytes expected a file size" in _refused("verify", out)
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "x"\nbackend = "cpu"\n[memory]\nhost_gib = ' + "9" * 400 + "\n[server]\nctx = 4096\n")
    assert "memory.host_gib: expected a number" in _refused("plan", converted, "--recipe", recipe)


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_lock_file_that_is_a_link_is_refused_and_its_target_untouched(small_ckpt, tmp_path, link):
    """A `.ggufbridge.lock` planted as a link to another file made `convert` truncate that file and write its pid."""
    from ggufbridge.outlock import FOLDER_LOCK

    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    if link == "symlink":
        (out / FOLDER_LOCK).symlink_to(victim)
    else:
        os.link(victim, out / FOLDER_LOCK)
    line = _refused("convert", small_ckpt, "-o", out, "--no-progress", "--no-mmproj", "--outtype", "f32")
    assert f"the lock file {out / FOLDER_LOCK} is" in line and "refused" in line
    assert victim.read_text() == "precious\n"
    assert not any(p.suffix == ".gguf" for p in out.iterdir())


def test_quantize_into_a_folder_a_convert_is_writing_is_refused(small_ckpt, converted, tmp_path):
    """`quantize -o OUT/x.gguf` while a convert wrote OUT replaced the conversion's target silently."""
    out = tmp_path / "out"
    first = start_slow_convert(small_ckpt, out, "--no-mmproj")
    try:
        src = next(converted.glob("*.gguf"))
        line = _refused("quantize", src, "-o", out / "x-Q8_0.gguf", "--quant", "Q8_0")
        assert f"process {first.pid}" in line and ".ggufbridge.lock" in line, line
        assert first.poll() is None, "the convert ended before the quantize was refused: the test proves nothing"
        assert not (out / "x-Q8_0.gguf").exists()
    finally:
        first.kill()
        first.wait()


def test_file_writers_share_a_folder_and_keep_a_convert_out(tmp_path):
    """Two quantize/imatrix runs may write into one folder at once; a convert of that folder may not start."""
    from ggufbridge.outlock import exclusive, sharing

    holder = subprocess.Popen([sys.executable, "-c", "import time\nfrom ggufbridge.outlock import sharing\n"
                               f"with sharing({str(tmp_path)!r}):\n    print('held', flush=True); time.sleep(60)\n"],
                              stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        with sharing(tmp_path):  # a second writer of another file: fine
            pass
        with pytest.raises(errors.OutputError, match="being written by another ggufbridge run"):
            with exclusive(tmp_path, is_folder=True):
                pass
        assert (tmp_path / ".ggufbridge.lock").exists()  # the other sharer still holds it: not removed
    finally:
        holder.kill()
        holder.wait()
    with exclusive(tmp_path, is_folder=True):  # its holder is gone
        pass
    assert not (tmp_path / ".ggufbridge.lock").exists()


@pytest.mark.parametrize("dims", [(2**63, 0), (0, 2**63), (2**64 - 1, 0, 7), (2**40, 2**40, 0)])
def test_gguf_dimension_past_int64_beside_a_zero_is_refused(tmp_path, converted, dims):
    """llama.cpp reads each dimension as an int64 and refuses a negative one even when the product is 0
    (ggml/src/gguf.cpp:691-718); inspect, plan and serve --dry-run passed such a file."""
    from ggufbridge.ggufio.reader import read_header

    p = _gguf_with_dims(tmp_path / "bad.gguf", dims)
    with pytest.raises(errors.GGUFFileError, match="per dimension|overflows 64 bits"):
        read_header(p)
    assert "bad.gguf: tensor blk.0.w has" in _refused("inspect", p)
    out = _folder_whose_target_has_dims(converted, tmp_path / "out", dims)
    for cmd in (["plan", out], ["serve", out, "--dry-run"]):
        assert "tensor blk.0.w has" in _refused(*cmd)


def test_a_zero_dimension_alone_is_accepted(tmp_path):
    from ggufbridge.ggufio.reader import read_header

    for dims in ((0, 2**40, 2**40), (32, 0)):  # the runtime accepts these: a zero-element tensor
        assert read_header(_gguf_with_dims(tmp_path / "zero.gguf", dims)).tensors[0].nbytes == 0


def test_a_long_thin_image_is_refused_for_its_side_not_its_pixels(tmp_path):
    """A 1×20000 PNG was refused with "20000 pixels, more than the limit of 67108864": true of its side only."""
    from ggufbridge.vision.preprocess import MAX_SIDE, check_image

    strip = tmp_path / "strip.png"
    strip.write_bytes(_png(1, 20000))
    with pytest.raises(errors.VisionInputError) as e:
        check_image(strip)
    assert f"its height of 20000 pixels is more than the limit of {MAX_SIDE} per side" in str(e.value)
    assert "67108864" not in str(e.value)
    ok = tmp_path / "ok.png"
    ok.write_bytes(_png(1, MAX_SIDE))
    assert check_image(ok) == (1, MAX_SIDE)


def _tiff_declaring(w: int, h: int) -> bytes:
    """A 4×4 TIFF whose header then claims w×h pixels (ImageWidth/ImageLength rewritten as LONG)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, "TIFF")
    b = bytearray(buf.getvalue())
    ifd = struct.unpack_from("<I", b, 4)[0]
    for i in range(struct.unpack_from("<H", b, ifd)[0]):
        off = ifd + 2 + 12 * i
        tag = struct.unpack_from("<H", b, off)[0]
        if tag in (256, 257):
            struct.pack_into("<HHII", b, off, tag, 4, 1, w if tag == 256 else h)
    return bytes(b)


def _webp_declaring(w: int, h: int) -> bytes:
    """A 4×4 lossless WebP whose VP8L header then claims w×h pixels (at most 16384 per side in that format)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, "WEBP", lossless=True)
    b = bytearray(buf.getvalue())
    assert b[12:16] == b"VP8L"
    bits = struct.unpack_from("<I", b, 21)[0]  # after the 0x2f signature: 14 bits width-1, 14 bits height-1, ...
    struct.pack_into("<I", b, 21, (bits & ~((1 << 28) - 1)) | (w - 1) | ((h - 1) << 14))
    return bytes(b)


@pytest.mark.parametrize("make, size, words", [
    (_tiff_declaring, (12000, 12000), "= 144000000 pixels, more than the limit of 67108864"),
    (_tiff_declaring, (100000, 100000), "too large, more than the limit"),
    (_tiff_declaring, (2, 20000), "its height of 20000 pixels is more than the limit of 16384 per side"),
    (_webp_declaring, (12000, 12000), "= 144000000 pixels, more than the limit of 67108864"),
    (_webp_declaring, (16384, 16384), "too large, more than the limit"),
], ids=["tiff-pixels", "tiff-huge", "tiff-side", "webp-pixels", "webp-huge"])
def test_tiff_and_webp_bombs_reach_the_server_reader_as_images(tmp_path, make, size, words):
    """llama-server hands the pictures stb_image cannot decode (WebP, TIFF) to the video reader (vision/ffshim.py),
    which refused a bomb as "video (N bytes): the video stream has no frame size"."""
    data = make(*size)
    for how in ("stdin", "path"):
        args = ["-v", "error", "-i", "pipe:0" if how == "stdin" else str(tmp_path / "in")]
        (tmp_path / "in").write_bytes(data)
        code = ("import sys\nfrom ggufbridge.vision.ffshim import main\n"
                f"sys.exit(main('ffprobe', {args!r}))\n")
        res = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, env=_env(), timeout=120)
        err = res.stderr.decode()
        assert res.returncode == 1 and res.stdout == b"", (how, err)
        assert err.startswith(f"image ({len(data)} bytes): image is ") and words in err, (how, err)
        assert "video" not in err, err


def test_a_still_webp_in_the_server_reader_is_one_frame(tmp_path):
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (6, 4), (10, 20, 30)).save(buf, "WEBP", lossless=True)
    code = "import sys\nfrom ggufbridge.vision.ffshim import main\nsys.exit(main(sys.argv[1], ['-i', 'pipe:0']))\n"
    probe = subprocess.run([sys.executable, "-c", code, "ffprobe"], input=buf.getvalue(), capture_output=True,
                           env=_env(), timeout=120)
    assert probe.returncode == 0 and b"width=6\nheight=4\n" in probe.stdout and b"nb_frames=1" in probe.stdout
    frames = subprocess.run([sys.executable, "-c", code, "ffmpeg"], input=buf.getvalue(), capture_output=True,
                            env=_env(), timeout=120)
    assert frames.returncode == 0 and frames.stdout == bytes([10, 20, 30]) * 24


def test_eval_rows_and_merge_files_judge_the_numbers_they_use(tmp_path):
    """Token ids are hashed and fed to the models as int32: 2^40 ended in an OverflowError traceback once the
    reader no longer bounded it; a compare --json file's figures are formatted and compared, so they stay finite."""
    from ggufbridge.compare import evalset
    from ggufbridge.compare.run import read_merge_file

    p = tmp_path / "eval.jsonl"
    p.write_text('{"ids": [1, 1099511627776]}\n')
    with pytest.raises(errors.EvalDataError, match="non-negative integers of at most 2147483647"):
        evalset.load_rows(eval_path=p, ctx=16, tokenize=None)
    merge = tmp_path / "m.json"
    merge.write_text('{"eval_sha256": "a", "reference_id": "b", "results": [{"label": "x", "candidate": "y", '
                     '"kl": {"mean": NaN}}]}')
    with pytest.raises(errors.GGUFBridgeError, match=r"results\[0\]\.kl\.mean: nan is not a finite number"):
        read_merge_file(merge)

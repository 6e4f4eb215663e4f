"""The hostile-user cases (issue 27) of `python -m benchmarks.fault_injection --hostile` and of
tests/test_fault_injection.py: each one a real `python -m ggufbridge` process on a prepared input, judged as a user
would judge it (ggufbridge.testkit.faults has the rules). The conversions they start from are made by the CLI as
well, so this module stays below the commands it exercises."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import ggufbridge
from ggufbridge.testkit.vision import png_of_size as png

REPO = Path(ggufbridge.__file__).resolve().parents[1]  # the checkout or site-packages folder that holds ggufbridge
DEEP = "[" * 50_000 + "]" * 50_000
MAX_RSS = 1536 << 20


@dataclass
class Outcome:
    code: int
    out: str
    err: str
    rss: int
    wall: float


@dataclass
class Case:
    name: str
    argv: list[str]
    expect: str = "refused"  # "refused": exit 2, one Error line; "ok": exit 0; or a callable judging the outcome
    judge: Callable[[Outcome], str | None] | None = None
    timeout: float = 120.0
    words: tuple[str, ...] = ()  # must appear in stderr
    setup: Callable[[], object] | None = None
    extra: dict = field(default_factory=dict)


def gb(*args) -> list[str]:
    return [sys.executable, "-m", "ggufbridge", *map(str, args)]


def env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO))


def convert_cli(ckpt: Path, out: Path, *args: str) -> None:
    """An F32 conversion the cases start from, through the command as a user runs it."""
    res = subprocess.run(gb("convert", ckpt, "-o", out, "--outtype", "f32", "--no-progress", *args),
                         capture_output=True, text=True, env=env())
    if res.returncode != 0:
        raise RuntimeError(f"convert {ckpt} failed ({res.returncode}): {res.stderr.strip()[-500:]}")


def run(argv: list[str], timeout: float) -> Outcome:
    """Run one command; its own peak RSS comes from wait4 (the children's ru_maxrss would be the largest so far)."""
    import threading

    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    got = {}
    readers = [threading.Thread(target=lambda k, f: got.__setitem__(k, f.read()), args=(k, f))
               for k, f in (("out", p.stdout), ("err", p.stderr))]
    for t in readers:
        t.start()
    status = usage = None
    while time.monotonic() - t0 < timeout:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.01)
    else:
        p.kill()
        _, status, usage = os.wait4(p.pid, 0)
        status = None
    for t in readers:
        t.join()
    code = -999 if status is None else os.waitstatus_to_exitcode(status)
    p.returncode = code  # reaped here: Popen must not wait for it again
    err = got.get("err", "") + ("" if status is not None else f"\n(timed out after {timeout} s)")
    return Outcome(code, got.get("out", ""), err, usage.ru_maxrss * 1024, time.monotonic() - t0)


def judge(case: Case, o: Outcome) -> str | None:
    if "Traceback" in o.err or "Traceback" in o.out:
        return "traceback: " + " | ".join(o.err.strip().splitlines()[-2:])
    if "Aborted!" in o.err:
        return "click's Aborted!"
    if o.code == -999:
        return "timed out"
    if o.rss > MAX_RSS:
        return f"peak RSS {o.rss >> 20} MiB > {MAX_RSS >> 20} MiB"
    if case.judge is not None:
        return case.judge(o)
    lines = [line for line in o.err.splitlines() if line.strip()]
    if case.expect == "refused":
        errors = [line for line in lines if line.startswith("Error:")]
        if o.code != 2 or len(errors) != 1:
            return f"expected exit 2 and one Error line, got exit {o.code}: {lines[-2:]}"
    elif case.expect == "ok" and o.code != 0:
        return f"expected exit 0, got {o.code}: {lines[-2:]}"
    missing = [w for w in case.words if w not in o.err]
    return f"stderr lacks {missing}: {lines[-2:]}" if missing else None


# --- inputs ----------------------------------------------------------------------------------------------------------


def variant(src: Path, dst: Path, edits: dict[str, bytes | str]) -> Path:
    """A copy of a checkpoint folder: shards hard-linked (nothing copied), edited files written fresh."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, copy_function=os.link)
    for name, content in edits.items():
        (dst / name).unlink(missing_ok=True)
        (dst / name).write_bytes(content.encode() if isinstance(content, str) else content)
    return dst


def shard_with_header(path: Path, edit) -> bytes:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    text = edit(header)
    body = (text if isinstance(text, str) else json.dumps(text)).encode()
    return struct.pack("<Q", len(body)) + body + raw[8 + n:]


def float_shape(header: dict) -> str:
    name = next(k for k, v in header.items() if k != "__metadata__" and len(v["shape"]) == 2)
    text = json.dumps(header)
    shape = header[name]["shape"]
    return text.replace(json.dumps({"dtype": header[name]["dtype"], "shape": shape})[:-1],
                        json.dumps({"dtype": header[name]["dtype"], "shape": [shape[0] + 0.7, shape[1]]})[:-1], 1)


def gguf_with_dims(path: Path, dims: tuple[int, ...]) -> Path:
    name = b"blk.0.w"
    info = struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + info + struct.pack("<IQ", 0, 0) + b"\0" * 64)
    return path




def recipe(text: str, path: Path) -> Path:
    path.write_text(text)
    return path


BASE_RECIPE = 'name = "x"\nbackend = "cpu"\n[memory]\nhost_gib = {host}\n[server]\nctx = 4096\n{extra}\n'


# --- the cases -------------------------------------------------------------------------------------------------------


def build_cases(work: Path, ckpt: Path) -> list[Case]:
    from ggufbridge.checkpoint.model_dir import ModelDir
    from ggufbridge.testkit.checkpoint import make_minicpmv47

    h = work / "hostile"
    shutil.rmtree(h, ignore_errors=True)
    h.mkdir(parents=True)
    folder = h / "converted"
    convert_cli(ckpt, folder, "--no-mmproj")
    man = json.loads((folder / "manifest.json").read_text())
    target = folder / next(f["path"] for f in man["files"] if f["role"] == "target")
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    tj = json.loads((ckpt / "tokenizer.json").read_text())
    tcfg_path = ckpt / "tokenizer_config.json"
    tcfg = json.loads(tcfg_path.read_text()) if tcfg_path.is_file() else {}
    out = lambda name: h / f"out-{name}"  # noqa: E731

    def conv(name: str, edits: dict, *args) -> list[str]:
        return gb("convert", variant(ckpt, h / f"ckpt-{name}", edits), "-o", out(name), "--no-progress", *args)

    cases = []
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json"):
        if (ckpt / f).is_file():
            cases.append(Case(f"deep JSON in {f}", conv(f"deep-{f}", {f: '{"x": ' + DEEP + "}"}), words=("nested",)))
    cases.append(Case("deep JSON in a safetensors header",
                      conv("deep-header", {shard.name: shard_with_header(shard, lambda hd: '{"x": ' + DEEP + "}")}),
                      words=("nested",)))
    cases.append(Case("safetensors shape [N.7, M]",
                      conv("float-shape", {shard.name: shard_with_header(shard, float_shape)}), words=("integer",)))
    all_zero = dict(tj, model=dict(tj["model"], vocab={t: 0 for t in tj["model"]["vocab"]}))
    cases.append(Case("tokenizer: every id 0", conv("ids", {"tokenizer.json": json.dumps(all_zero)}),
                      words=("id 0",)))
    for label, tmpl in (("empty", ""), ("non-string", 7)):
        edits = {"tokenizer_config.json": json.dumps(dict(tcfg, chat_template=tmpl))}
        if (ckpt / "chat_template.jinja").is_file():
            edits["chat_template.jinja"] = "" if label == "empty" else "x"
            if label != "empty":
                continue
        cases.append(Case(f"chat template {label}", conv(f"tmpl-{label}", edits), words=("chat template",)))

    # a finite BF16 weight above 65,504 into the default F16 output (edited in a copy of WORK/ckpt-bf16)
    if not (work / "ckpt-bf16" / "config.json").is_file():
        make_minicpmv47(work / "ckpt-bf16", "tiny", vocab="small", dtype="bfloat16")
    bf = variant(work / "ckpt-bf16", h / "ckpt-bf16", {})
    ref = next(r for n, r in sorted(ModelDir.open(bf).tensors.items()) if n.endswith("shared_expert.down_proj.weight"))
    big = ref.path.read_bytes()
    ref.path.unlink()
    bits = struct.pack("<H", struct.unpack("<I", struct.pack("<f", 1.0e5))[0] >> 16)
    ref.path.write_bytes(big[:ref.start] + bits + big[ref.start + 2:])

    def kept_not_inf(o: Outcome) -> str | None:
        if o.code != 0 or "kept as BF16" not in o.err:
            return f"expected exit 0 and 'kept as BF16', got {o.code}: {o.err.strip().splitlines()[-2:]}"
        from ggufbridge.ggufio.reader import read_header
        import numpy as np

        hd = read_header(next(p for p in out("bf16").glob("*.gguf")))
        for t in hd.tensors:
            if t.type in ("F16", "F32") and not np.isfinite(hd.tensor_array(t)).all():
                return f"{t.name} holds Inf in the output"
        return None

    cases.append(Case("BF16 99840 into F16", gb("convert", bf, "-o", out("bf16"), "--no-progress", "--no-mmproj"),
                      judge=kept_not_inf))

    # manifests and GGUF headers
    deep_man = h / "deep-manifest"
    shutil.copytree(folder, deep_man, copy_function=os.link)
    (deep_man / "manifest.json").unlink()
    (deep_man / "manifest.json").write_text('{"files": ' + DEEP + "}")
    bad_dims = h / "bad-dims"
    shutil.copytree(folder, bad_dims, copy_function=os.link)
    bman = json.loads((bad_dims / "manifest.json").read_text())
    entry = next(f for f in bman["files"] if f["role"] == "target")
    (bad_dims / entry["path"]).unlink()
    gguf_with_dims(bad_dims / entry["path"], (2**32, 2**32))
    entry["bytes"], entry["sha256"] = (bad_dims / entry["path"]).stat().st_size, None
    (bad_dims / "manifest.json").unlink()
    (bad_dims / "manifest.json").write_text(json.dumps(bman))
    for cmd in (["verify"], ["plan"], ["serve", "--dry-run"]):
        cases.append(Case(f"deep manifest: {cmd[0]}", gb(cmd[0], deep_man, *cmd[1:]), words=("nested",)))
        if cmd[0] != "verify":
            cases.append(Case(f"GGUF dims overflow: {cmd[0]}", gb(cmd[0], bad_dims, *cmd[1:]), words=("overflows",)))
    cases.append(Case("GGUF dims overflow: inspect", gb("inspect", gguf_with_dims(h / "dims.gguf", (2**63, 2))),
                      words=("overflows",)))

    # recipes and numeric options
    for label, text in (("deep TOML", "[server]\nctx = " + "[" * 5000 + "]" * 5000),
                        ("host_gib 1e308", BASE_RECIPE.format(host="1e308", extra="")),
                        ("host_gib nan", BASE_RECIPE.format(host="nan", extra="")),
                        ("threads 99999999", BASE_RECIPE.format(host="16", extra="threads = 99999999"))):
        cases.append(Case(f"recipe {label}", gb("plan", folder, "--recipe", recipe(text, h / f"r-{len(cases)}.toml"))))
    mix = recipe('file_type = "Q8_0"\n[types]\nx = ' + "[" * 5000 + "]" * 5000, h / "deep-mix.toml")
    cases.append(Case("quant mix deep TOML", gb("quantize", target, "-o", h / "q.gguf", "--mix", mix)))
    for args in (["run", folder, "-p", "hi", "--temp", "nan"], ["bench", folder, "--timeout", "nan"],
                 ["serve", folder, "--timeout", "inf", "--dry-run"], ["serve", folder, "--threads", "99999999"],
                 ["quantize", target, "-o", h / "q.gguf", "--fit-bytes", "9" * 400]):
        cases.append(Case(" ".join(map(str, args[-2:])), gb(*args), judge=lambda o: None if o.code == 2 and
                          "Invalid value" in o.err else f"exit {o.code}: {o.err.strip().splitlines()[-1:]}"))
    deep_merge = h / "merge.json"
    deep_merge.write_text(DEEP)
    (h / "eval.txt").write_text("hello world " * 50)
    cases.append(Case("compare --merge deep file (checked before the run)",
                      gb("compare", target, "--reference", f"hf:{ckpt}", "--text", h / "eval.txt", "--merge",
                         deep_merge), words=("nested",), timeout=60))

    # edges of promises
    (h / "extra-out").mkdir()
    (h / "extra-out" / "EXTRA.GGUF").write_bytes(b"GGUF")
    cases.append(Case("EXTRA.GGUF in the output folder", gb("convert", ckpt, "-o", h / "extra-out", "--no-progress"),
                      words=("already holds",)))
    extra = h / "extra-verify"
    shutil.copytree(folder, extra, copy_function=os.link)
    os.link(target, extra / "EXTRA.GGUF")
    cases.append(Case("EXTRA.GGUF beside a conversion: verify", gb("verify", extra),
                      judge=lambda o: None if o.code != 0 and "EXTRA.GGUF" in o.out + o.err else f"exit {o.code}"))
    cases.append(Case("--host ::ffff:0.0.0.0", gb("serve", folder, "--host", "::ffff:0.0.0.0", "--dry-run"),
                      expect="ok", words=("warning: listening on",)))
    bomb = h / "bomb.png"
    bomb.write_bytes(png(20000, 20000))
    cases.append(Case("run --image 20000x20000 PNG", gb("run", folder, "-p", "x", "--image", bomb),
                      words=("more than the limit",)))
    return cases


def early_signal_cases(folder: Path) -> list[tuple[str, int, float]]:
    return [(f"{signal.Signals(s).name} {d * 1000:.0f} ms after the program starts running", s, d)
            for s in (signal.SIGINT, signal.SIGTERM) for d in (0.0, 0.02, 0.05, 0.1, 0.2)]


def _catches_sigterm(pid: int) -> bool:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    except FileNotFoundError:
        pass
    return False


def run_early_signal(folder: Path, sig: int, delay: float, from_start: bool = False) -> str | None:
    """The delay counts from the moment the process catches SIGTERM: before that it is still the interpreter's own
    start-up (no code of ours has run; ~30 ms on an idle machine), where Python's defaults apply. `from_start`:
    from the process's start instead, as the probe did (on a loaded machine the interpreter's start-up alone can
    last longer than a short delay, so these cases are not in the bounded CI form)."""
    p = subprocess.Popen(gb("verify", folder), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    while not from_start and p.poll() is None and not _catches_sigterm(p.pid):
        time.sleep(0.0005)
    time.sleep(delay)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    if p.returncode == 0:
        return None  # finished first: nothing to judge
    if p.returncode == -sig and out.strip() and not err.strip():
        # verify had printed its verdict: the signal came during the interpreter's own shutdown, after CPython
        # has put the default handlers back (a race the command's code cannot see); nothing was cut short
        return None
    lines = [line for line in err.splitlines() if line.strip()]
    if p.returncode != 128 + sig or lines != [f"Error: interrupted by {signal.Signals(sig).name}"]:
        return f"exit {p.returncode}: {lines[-3:]}"
    return None


def run_concurrent(ckpt: Path, work: Path) -> str | None:
    out = work / "concurrent"
    shutil.rmtree(out, ignore_errors=True)
    slow = ("import sys, time\nfrom ggufbridge.ggufio import writer\nreal = writer.encode\n"
            "def slow(*a, **k):\n    time.sleep(0.05)\n    return real(*a, **k)\nwriter.encode = slow\n"
            "sys.argv = ['ggufbridge'] + sys.argv[1:]\nimport ggufbridge.__main__ as m\nm.main()\n")
    first = subprocess.Popen([sys.executable, "-c", slow, "convert", str(ckpt), "-o", str(out), "--no-progress",
                              "--no-mmproj"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    try:
        deadline = time.monotonic() + 120
        while not (out.is_dir() and any(x.name.endswith(".part") for x in out.iterdir())):
            if first.poll() is not None or time.monotonic() > deadline:
                return "the first conversion did not start writing"
            time.sleep(0.02)
        second = run(gb("convert", ckpt, "-o", out, "--no-progress", "--no-mmproj"), 120)
        running = first.poll() is None
        _, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    if not running:
        return None  # the first ended before the second started: nothing to judge
    if second.code != 2 or f"process {first.pid}" not in second.err:
        return f"second run: exit {second.code}: {second.err.strip().splitlines()[-1:]}"
    if first.returncode != 0 or "replaced by --force" in err:
        return f"first run: exit {first.returncode}: {err.strip().splitlines()[-1:]}"
    v = run(gb("verify", out), 120)
    return None if v.code == 0 else f"verify after both: exit {v.code}"


def run_stale_lock(ckpt: Path, work: Path) -> str | None:
    out = work / "stale-lock"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / ".ggufbridge.lock").write_text(f"{dead.pid}\n")
    o = run(gb("convert", ckpt, "-o", out, "--no-progress", "--no-mmproj"), 300)
    return None if o.code == 0 else f"exit {o.code}: {o.err.strip().splitlines()[-1:]}"


def run_server_bomb(folder_with_mmproj: Path, work: Path) -> list[tuple[str, str | None, str]]:
    """The image bomb and a truncated PNG as data URLs to a real `ggufbridge serve` (needs the built runtime)."""
    from ggufbridge.runtime import server as sv

    port = sv.free_port()
    srv = sv.Server(gb("serve", folder_with_mmproj, "--port", port, "--ctx", "2048"), "127.0.0.1", port,
                    work / "serve-console.log", env=env()).start()
    results = []
    try:
        srv.wait_ready(300)
        for label, data, words in (("server: 20000x20000 PNG data URL", png(20000, 20000), ("image", "limit")),
                                   ("server: truncated PNG", png(64, 64, truncate=True), ("image",))):
            body = {"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}},
                {"type": "text", "text": "?"}]}], "max_tokens": 2}
            status, answer = sv.http_json(srv.url + "/v1/chat/completions", body, timeout=120)
            text = json.dumps(answer)
            ok = status == 400 and all(w in text for w in words) and "video" not in text.lower()
            results.append((label, None if ok else f"HTTP {status}: {text[:200]}", f"HTTP {status}: {text[:300]}"))
    finally:
        srv.stop()
    return results


def run_cases(work: Path, ckpt: Path, server: bool = False, startup_signals: bool = False) -> dict:
    results = []

    def record(name: str, problem: str | None, wall: float = 0.0, answer: str | None = None) -> None:
        results.append({"case": name, "held": problem is None, "problem": problem, "wall_s": round(wall, 2),
                        **({"answer": answer} if answer else {})})
        print(f"{'held' if problem is None else 'FAIL'}  {name}" + ("" if problem is None else f"  — {problem}"))

    for case in build_cases(work, ckpt):
        o = run(case.argv, case.timeout)
        record(case.name, judge(case, o), o.wall)
    folder = work / "hostile" / "converted"
    for name, sig, delay in early_signal_cases(folder):
        record(f"early {name}", run_early_signal(folder, sig, delay))
    if startup_signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            for delay in (0.15, 0.2, 0.25):
                record(f"early {signal.Signals(sig).name} {delay * 1000:.0f} ms after the process starts",
                       run_early_signal(folder, sig, delay, from_start=True))
    record("two conversions into one folder at once", run_concurrent(ckpt, work / "hostile"))
    record("stale lock of a dead process", run_stale_lock(ckpt, work / "hostile"))
    if server:
        with_mmproj = work / "hostile" / "converted-mmproj"
        if not with_mmproj.is_dir():
            convert_cli(ckpt, with_mmproj)
        for name, problem, answer in run_server_bomb(with_mmproj, work / "hostile"):
            record(name, problem, answer=answer)
    held = sum(r["held"] for r in results)
    return {"cases": len(results), "held": held, "failed": len(results) - held, "results": results}

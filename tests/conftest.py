"""Shared pytest fixtures: synthetic MiniCPM-V 4.7 checkpoints, built once per session under tmp_path.

Nothing here writes outside pytest's temporary directories except the tokenizer cache of
`ggufbridge.testkit.vocab` (under ${GGUFBRIDGE_CACHE:-~/.cache/ggufbridge}/fixtures/, built once per machine)
and the artefacts tests leave for people to look at (`artifacts_dir`: build/test-artifacts/NAME, listed at the end
of the run).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from _cores import worker_share

ARTIFACTS = Path(__file__).resolve().parents[1] / "build" / "test-artifacts"
_started: list[float] = []

# scripts/test.sh runs the suite with pytest-xdist, one test file per worker at a time (--dist loadfile: a file's
# module fixtures, servers and conversions stay in one process). The workers take the files in collection order, so
# the ones that take longest go first and the workers finish together; the rest keep their order. The order is what
# `python -m benchmarks.suite_timeline` prints after a run (docs/testing.md); a file missing here only starts later.
LONGEST_FIRST = ("test_fault_injection.py", "test_quant_fit.py", "test_fixtures.py", "test_fullsize_gguf.py",
                 "test_compare_models.py", "test_served_vision_sweep.py", "test_chat_page.py", "test_hub.py",
                 "test_tokenizer_parity.py", "test_quant.py", "test_video.py", "test_served_vision.py",
                 "test_serve_gguf_files.py", "test_hostile_inputs.py", "test_convert_parity.py", "test_serve.py",
                 "test_patches.py", "test_fuzz_readers.py", "test_plan_runtime.py", "test_inspect.py",
                 "test_serve_rpc.py", "test_compare_metrics.py", "test_draft_concurrent.py", "test_bench.py",
                 "test_draft_speculative.py", "test_bench_concurrency.py")

if worker_share():
    # each worker's torch, tokenizers and the llama.cpp tools it starts get its share of the cores (tests/_cores.py)
    for _var in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS", "LLAMA_ARG_THREADS"):
        os.environ.setdefault(_var, str(worker_share()))


def pytest_xdist_auto_num_workers(config):
    # `-n auto`: one worker more than cores. Servers starting, browsers rendering and polls leave a worker idle
    # ~15% of its time; a third worker on 2 cores fills that (each worker still runs one thread: tests/_cores.py)
    return (os.cpu_count() or 1) + 1


def pytest_configure(config):
    # pytest-xdist (3.6+) hands out the files with the most tests first unless told to keep the collection order,
    # which is ours: LONGEST_FIRST (a file of 200 quick parsers first, a 35 s one last, was the default)
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: within a file, the file's order


@pytest.fixture(scope="session", autouse=True)
def _bindings_load_this_series():
    """The tests through llama_cpp (the parity references, the rollback tests) must load this checkout's runtime. A
    runtime rebuilt without `build_runtime.sh --python` leaves the bindings on the previous build's libraries, and
    those tests then pass or fail for another library: every test errors with the fix instead. Only a cached build
    of this series is checked (a runtime named by LLAMA_CPP_BIN is the user's own; none found: nothing to compare)."""
    import sys

    from ggufbridge.runtime import locate as loc

    try:
        rt = loc.locate()
    except loc.RuntimeNotFound:
        return
    if not rt.source.startswith("cache"):
        return
    bindings = loc.probe_bindings()
    stale = [] if bindings.error else bindings.outside(rt)
    if stale:
        pytest.fail(f"llama_cpp loads {stale[0]}, not this series' runtime in {rt.bin_dir}: "
                    f"scripts/build_runtime.sh --python {sys.executable}", pytrace=False)


@pytest.fixture(scope="session")
def artifacts_dir():
    """Factory: `artifacts_dir(name) -> Path`, an emptied build/test-artifacts/NAME for screenshots and the like."""

    def make(name: str) -> Path:
        d = ARTIFACTS / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        return d

    return make


def pytest_sessionstart(session):
    _started.append(time.time())


def pytest_terminal_summary(terminalreporter):
    # the folders this run wrote, read from disk: under pytest-xdist the workers made them, not this process
    if ARTIFACTS.is_dir():
        for d in sorted(x for x in ARTIFACTS.iterdir() if x.is_dir() and x.stat().st_mtime >= _started[0]):
            terminalreporter.write_line(f"test artefacts: {d} ({len(list(d.iterdir()))} files)")


@pytest.fixture(scope="session")
def built_once(tmp_path_factory):
    """Factory: `built_once(label, build) -> Path` of the folder that `build(folder)` fills, made once per test run
    for all pytest-xdist workers: they share the parent of their base temp, the first to ask builds under a file
    lock while the others wait for it, then every worker reads the same folder (read-only, like make_ckpt's)."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if worker_share() else base) / "built-once"
    root.mkdir(exist_ok=True)

    def get(label: str, build) -> Path:
        label = label.replace("/", "_")
        done = root / label
        with open(root / f"{label}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.is_dir():
                part = root / f"{label}.part"
                shutil.rmtree(part, ignore_errors=True)
                build(part)
                part.rename(done)  # whole or absent: a worker that died mid-build leaves only a .part
        return done

    return get


@pytest.fixture(scope="session")
def make_ckpt(built_once):
    """Factory: `make_ckpt(spec_name, **make_minicpmv47_kwargs) -> Path`, cached by its arguments per test run.

    Callers must treat the folder as read-only (it is shared); copy it to tmp_path before corrupting it.
    """
    import inspect

    from ggufbridge.testkit.checkpoint import make_minicpmv47

    signature = inspect.signature(make_minicpmv47)
    cache = {}

    def make(spec_name: str = "tiny", **kw):
        bound = signature.bind("-", spec_name, **kw)
        bound.apply_defaults()  # make_ckpt("tiny") and make_ckpt("tiny", dtype="float32") share one folder
        args = {k: v for k, v in bound.arguments.items() if k not in ("out_dir", "spec")}
        key = (spec_name, tuple(sorted(args.items())))
        if key not in cache:
            label = "-".join(["ckpt", spec_name] + [f"{k}={v}" for k, v in sorted(args.items())])
            cache[key] = built_once(label, lambda d: make_minicpmv47(d, spec_name, **kw))
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_ckpt(make_ckpt):
    """The "tiny" spec, float32, real Qwen3.5 vocabulary (~130 MB, a few seconds)."""
    return make_ckpt("tiny")


@pytest.fixture(scope="session")
def tiny_ckpt_bf16(make_ckpt):
    """The "tiny" spec in bfloat16 (same seed, so its weights are tiny_ckpt's rounded to bf16)."""
    return make_ckpt("tiny", dtype="bfloat16")


@pytest.fixture(scope="session")
def confident_ckpt(tiny_ckpt, built_once):
    """tiny_ckpt with its head refitted to continue _synthetic.confident.TEXT decisively."""
    from _synthetic.confident import make_confident

    return built_once("confident", lambda d: make_confident(tiny_ckpt, d))


@pytest.fixture(scope="session")
def make_gguf(make_ckpt, built_once):
    """Factory: `make_gguf(spec_name, outtype, **make_ckpt_kwargs) -> Path` of the target GGUF that `convert` writes
    for that checkpoint (no mmproj, no draft), converted once per test run and shared by every module that asks for
    the same one. Read-only, like make_ckpt's folders."""
    import json

    from ggufbridge.convert import convert

    cache = {}

    def make(spec_name: str = "tiny", outtype: str = "f32", **kw) -> Path:
        key = (spec_name, outtype, tuple(sorted(kw.items())))
        if key not in cache:
            ckpt = make_ckpt(spec_name, **kw)
            label = "-".join(["gguf", spec_name, outtype] + [f"{k}={v}" for k, v in sorted(kw.items())])
            out = built_once(label, lambda d: convert(ckpt, d, outtype=outtype, mmproj=False, progress=False))
            files = json.loads((out / "manifest.json").read_text())["files"]
            cache[key] = out / next(f["path"] for f in files if f["role"] == "target")
        return cache[key]

    return make


@pytest.fixture(scope="session")
def unreachable(built_once) -> tuple[bytes, ...]:
    """_synthetic.probes.unreachable_tokens() of the real vocabulary (~3 s of merge replays over 248k tokens),
    computed once per test run for the fixture and the tokenizer parity tests, whichever workers they run on."""
    from _synthetic.probes import unreachable_tokens

    def build(d: Path) -> None:
        d.mkdir()
        (d / "tokens.hex").write_text("\n".join(t.hex() for t in unreachable_tokens()) + "\n")

    return tuple(bytes.fromhex(x) for x in (built_once("unreachable-qwen35", build) / "tokens.hex").read_text().split())


@pytest.fixture(scope="session")
def oracle_pair(tmp_path_factory):
    """(pair, ConversionResult) of the oracle target/draft pair (fx.make_oracle_pair: t -> succ(t) by construction,
    the draft's Markov head knows it), converted once per session for the drafting tests (read-only)."""
    from ggufbridge.convert import convert
    from ggufbridge.testkit import dspark as fx

    root = tmp_path_factory.mktemp("oracle")
    pair = fx.make_oracle_pair(root)
    res = convert(pair.target_dir, root / "out", outtype="f32", draft=pair.draft_dir, draft_outtype="f16",
                  mmproj=False, progress=False)
    return pair, res


@pytest.fixture(scope="session")
def ksafe_bf16(make_ckpt, make_gguf):
    """(checkpoint, BF16 target GGUF) of the K-quant-compatible synthetic model (every row a multiple of 256),
    converted once for test_quant (read only: its outputs go to tmp_path)."""
    kw = {"dtype": "bfloat16", "vocab": "small"}
    return make_ckpt("ksafe", **kw), make_gguf("ksafe", "bf16", **kw)

"""The repository's layout rules around the package (issue 42), read from the files with `ast` and regular expressions
as tests/test_import_graph.py reads the package (nothing is imported or run):

* no test imports from benchmarks/, loads a benchmark by its path or runs one: what tests and benchmarks share lives
  in ggufbridge.testkit;
* nothing in benchmarks/ edits sys.path or imports a test's helper (tests/_*.py);
* docs/ holds prose and the figures it shows: no run output (JSON, JSONL, TXT, CSV, logs; those live in
  benchmarks/results/), and every picture there is shown by a page;
* no committed file names a machine's own path (a home folder, a checkout's absolute path, a mktemp folder).

Each check has a twin that plants a violation and sees it found.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS, BENCH, DOCS = REPO / "tests", REPO / "benchmarks", REPO / "docs"


def tracked_files() -> list[Path]:
    """The files git tracks (what a commit holds); without git (an unpacked archive), every file but the usual
    untracked folders."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
        return [REPO / p for p in out.decode().split("\0") if p and (REPO / p).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "build", ".device", ".dev", "__pycache__", ".pytest_cache"}
        return [p for p in REPO.rglob("*") if p.is_file() and not skip & set(p.relative_to(REPO).parts)]


# --- tests do not reach into benchmarks/ ------------------------------------------------------------------------------


def _docstring_nodes(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _path_parts(node: ast.AST) -> list[str]:
    """The string pieces of a `A / "x" / "y.py"` chain."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return _path_parts(node.left) + _path_parts(node.right)
    return [node.value] if isinstance(node, ast.Constant) and isinstance(node.value, str) else []


BENCH_REF = re.compile(r"(?:^|[\s'\"=])benchmarks(?:/[\w/]+\.py\b|\.\w+)")


def benchmark_uses(source: str, name: str = "<test>") -> list[str]:
    """Where a test module imports benchmarks, names a benchmark's file, or runs one (`-m benchmarks.X`); prose in
    docstrings and paths to benchmarks/ data (not .py) are allowed."""
    tree = ast.parse(source, name)
    docs = _docstring_nodes(tree)
    out = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            out += [f"{name}:{line}: import {a.name}" for a in node.names if a.name.split(".")[0] == "benchmarks"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "benchmarks":
            out.append(f"{name}:{line}: from {node.module} import ...")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            parts = _path_parts(node)
            if "benchmarks" in parts and any(p.endswith(".py") for p in parts):
                out.append(f"{name}:{line}: a path to a benchmark's file: {' / '.join(parts)}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if BENCH_REF.search(node.value):
                out.append(f"{name}:{line}: {node.value[:80]!r}")
    return sorted(set(out))


def test_no_test_reaches_into_benchmarks():
    bad = []
    for path in sorted(TESTS.rglob("*.py")):
        if path != Path(__file__).resolve():  # this file's planted cases below
            bad += benchmark_uses(path.read_text(), str(path.relative_to(REPO)))
    assert not bad, "tests that import, load or run benchmarks/ (share through ggufbridge.testkit):\n" + "\n".join(bad)


@pytest.mark.parametrize("source", [
    "import benchmarks.recipes_report\n",
    "from benchmarks.gpu import recipe_bench\n",
    "import importlib.util\nspec = importlib.util.spec_from_file_location('m', ROOT / 'benchmarks' / 'make_x.py')\n",
    "import runpy\nrunpy.run_path('benchmarks/fault_injection.py')\n",
    "import subprocess, sys\nsubprocess.run([sys.executable, '-m', 'benchmarks.fault_injection'])\n",
])
def test_the_benchmark_check_finds_each_form(source):
    assert benchmark_uses(source)


def test_the_benchmark_check_leaves_prose_and_data_alone():
    source = ('"""Checked against benchmarks/fault_injection.py\'s full runs."""\n'
              'CANDIDATES = ROOT / "benchmarks" / "gpu" / "candidates"\n')
    assert benchmark_uses(source) == []


# --- benchmarks/ is a package that keeps to itself ------------------------------------------------------------------

SYS_PATH_EDIT = re.compile(r"\bsys\.path\s*(?:\.\s*(?:insert|append|extend|remove)\s*\(|\[[^\]]*\]\s*=|=[^=]|\+=)")


def benchmark_problems(source: str, name: str, test_helpers: set[str]) -> list[str]:
    """sys.path edits (in Python, or in the Python a shell script feeds an interpreter), imports of tests' helpers."""
    out = [f"{name}:{source.count(chr(10), 0, m.start()) + 1}: edits sys.path" for m in SYS_PATH_EDIT.finditer(source)]
    if name.endswith(".py"):
        for node in ast.walk(ast.parse(source, name)):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                mods = [node.module or ""]
            out += [f"{name}:{node.lineno}: imports the tests' {m}" for m in mods
                    if m.split(".")[0] in test_helpers or m.split(".")[0] in ("tests", "conftest")]
    return out


def test_benchmarks_edit_no_sys_path_and_import_no_test_helpers():
    helpers = {p.stem for p in TESTS.glob("_*.py")} | {p.name for p in TESTS.iterdir() if p.is_dir()}
    bad = [] if (BENCH / "__init__.py").is_file() else ["benchmarks/__init__.py: missing (python -m benchmarks.X)"]
    for path in sorted(BENCH.rglob("*")):
        if path.suffix in (".py", ".sh") and "results" not in path.relative_to(BENCH).parts:
            bad += benchmark_problems(path.read_text(), str(path.relative_to(REPO)), helpers)
    assert not bad, "\n".join(bad)


def test_the_benchmark_package_check_finds_a_path_edit_and_a_helper_import():
    py = "import sys\nsys.path.insert(0, str(ROOT / 'tests'))\nfrom _draft_helpers import llama_server\n"
    assert len(benchmark_problems(py, "x.py", {"_draft_helpers"})) == 2
    sh = "python3 - <<'PY'\nimport sys\nsys.path[:0] = [sys.argv.pop(1)]\nPY\n"
    assert benchmark_problems(sh, "x.sh", set()) == ["x.sh:3: edits sys.path"]
    assert benchmark_problems("if sys.path == []:\n    pass\n", "x.py", set()) == []


# --- docs/ is prose and the figures it shows ------------------------------------------------------------------------

RUN_OUTPUT = {".json", ".jsonl", ".txt", ".csv", ".tsv", ".log", ".tgz", ".gz", ".npz", ".npy", ".bin"}
PROSE_AND_FIGURES = {".md", ".png", ".svg", ".jpg", ".jpeg", ".gif"}


def docs_problems(files: list[Path], pages: dict[Path, str]) -> list[str]:
    out = []
    for f in files:
        if f.suffix.lower() in RUN_OUTPUT or f.suffix.lower() not in PROSE_AND_FIGURES:
            out.append(f"{f.name}: run output or data in docs/ (it belongs in benchmarks/results/)")
        elif f.suffix.lower() != ".md" and not any(f.name in text for text in pages.values()):
            out.append(f"{f.name}: a picture no page shows")
    return out


def test_docs_hold_prose_and_the_figures_they_show():
    files = [f for f in tracked_files() if DOCS in f.parents]
    pages = {p: p.read_text() for p in [*DOCS.rglob("*.md"), REPO / "README.md"] if p.is_file()}
    assert not (bad := docs_problems(files, pages)), "\n".join(bad)


def test_the_docs_check_finds_run_output_and_an_unshown_figure(tmp_path):
    pages = {tmp_path / "a.md": "![plot](shown.png)"}
    files = [tmp_path / n for n in ("a.md", "shown.png", "run.json", "step.jsonl", "kernels.txt", "orphan.png")]
    assert [p.split(":")[0] for p in docs_problems(files, pages)] == ["run.json", "step.jsonl", "kernels.txt",
                                                                       "orphan.png"]


# --- no machine paths -----------------------------------------------------------------------------------------------

# A path of one machine: a home folder (root's, or one under home or Users), the folders this project's machines keep
# checkouts and scratch space in (/work, /mnt, /scratch), a mktemp or pytest folder. Generic system paths
# (/usr/bin/chromium, /dev/null, /proc, /tmp as a default in prose) are not. (Each `/` after the first is written
# `\/`, so that the pattern is not a match for itself.)
MACHINE_PATH = re.compile(
    r"(?<![\w.$~}-])(?:/root\/|/home\/[a-z_][\w.-]*\/|/Users\/\w+\/|/work\/|/mnt\/\w|/scratch\/"
    r"|/tmp\/tmp[\w-]{6,}|/tmp\/pytest-of-|/private\/var\/folders\/)")
BINARY = {".png", ".jpg", ".jpeg", ".gif", ".gz", ".tgz", ".xz", ".whl", ".gguf", ".safetensors", ".npz", ".bin"}


def machine_paths(text: str, name: str) -> list[str]:
    return [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {text[m.start():m.start() + 60].split()[0]}"
            for m in MACHINE_PATH.finditer(text)]


def test_no_committed_file_names_a_machine_path():
    bad = []
    for f in tracked_files():
        if f.suffix.lower() in BINARY:
            continue
        try:
            text = f.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        bad += machine_paths(text, str(f.relative_to(REPO)))
    assert not bad, "machine paths (use a relative path or a placeholder: $WORK, $GGUFBRIDGE_CACHE, OUT):\n" + \
        "\n".join(bad[:50])


def test_the_machine_path_check_finds_each_kind_and_spares_generic_paths():
    # written in two pieces, so that this file passes its own check
    found = [a + b for a, b in (
        ('"bin": "/ro', 'ot/.cache/ggufbridge/llama.cpp-0.3.36-cuda-p1/build/bin"'), ("cd /ho", "me/alice/src/x"),
        ("model /tmp/tm", "pukq__h4d/out/a.gguf"), ("see /wo", "rk/main/.dev/kern/harness"),
        ("/Use", "rs/bob/models/x"), ("/tmp/pytest", "-of-root/pytest-3/x"))]
    for text in found:
        assert machine_paths(text, "f"), text
    spared = ["/usr/bin/chromium", "2>/dev/null", "/proc/self/status", "--work /tmp/bench-quant", "$WORK/shm/hq3m",
              "~/.cache/ggufbridge", "${GGUFBRIDGE_CACHE:-$HOME/.cache/ggufbridge}", "benchmarks/results/h200.json"]
    for text in spared:
        assert machine_paths(text, "f") == [], text

"""The package's layering: no import circle among ggufbridge's modules, and each package imports only the packages
below it in LAYERS.

The graph is read from the source with `ast` (nothing is imported): an edge A → B for every
`from ggufbridge.X import Y` / `import ggufbridge.X` in A, at the top level *and* inside functions. Function-level
imports count: they are how the circles this test was written against (convert → quant.pipeline → quant.verify →
convert; inspect ↔ quant.report) stayed hidden, and a deferred import is still a dependency. An edge goes to the
most specific module named (`from ggufbridge.arch import qwen35moe` → ggufbridge.arch.qwen35moe); the implicit
import of a parent package's __init__ is not an edge (a package importing its own children is the normal pattern).
"""

from __future__ import annotations

import ast
from pathlib import Path

import ggufbridge

ROOT = Path(ggufbridge.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def import_graph() -> dict[str, set[str]]:
    mods = _modules()

    def resolve(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("ggufbridge"):
                targets = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("ggufbridge")]
            for t in targets:
                t = resolve(t)
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle (as a path that starts and ends at the same module), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return None


# What each part of ggufbridge may import (besides itself), lowest first. A package that is not listed is a new
# one: the test asks for its row. Leaves (errors, units, files, textfile, signals, untrusted, outlock, the package
# root for its version) hold facts and helpers everyone shares; the format (ggufio) sits on the checkpoint reader;
# converters (arch) on both; the runner (runtime: it also fetches GGUF repos through checkpoint's hub client) and
# the measurements (compare) on the format; quantisation above them (it plans memory with the runtime and measures
# KL with compare); the commands (cli) on top.
LEAVES = {"ggufbridge", "errors", "units", "files", "textfile", "signals", "untrusted", "outlock", "native"}
LAYERS: dict[str, set[str]] = {
    "ggufbridge": set(), "errors": set(), "units": set(), "files": set(), "signals": set(), "native": set(),
    "untrusted": {"errors"}, "outlock": {"errors"}, "textfile": {"errors", "untrusted"},
    "checkpoint": LEAVES,
    "ggufio": LEAVES | {"checkpoint"},
    "arch": LEAVES | {"checkpoint", "ggufio"},
    # what tests and benchmarks build with: synthetic models (the full-size one from the converters' tensor plans and
    # the quantisation mixes), hostile inputs run against a real server; never imported by the product below `demo`
    "testkit": LEAVES | {"checkpoint", "ggufio", "arch", "vision", "runtime", "compare", "quant"},
    "vision": LEAVES | {"ggufio"},
    "runtime": LEAVES | {"checkpoint", "ggufio", "vision"},  # checkpoint: hub downloads of GGUF repos
    "compare": LEAVES | {"checkpoint", "ggufio"},
    "quant": LEAVES | {"ggufio", "runtime", "compare"},
    "inspect": LEAVES | {"ggufio", "quant"},
    "convert": LEAVES | {"checkpoint", "ggufio", "arch", "quant"},
    "verify": LEAVES | {"checkpoint", "ggufio", "convert"},
    "demo": LEAVES | {"compare", "convert", "testkit", "runtime", "ggufio"},  # it serves what it built
    "cli": LEAVES | {"checkpoint", "ggufio", "arch", "runtime", "compare", "quant", "inspect", "convert", "verify",
                     "demo", "vision"},
    "__main__": {"cli", "signals"},
}


def part(module: str) -> str:
    """ggufbridge.runtime.server.argv -> runtime; ggufbridge.convert -> convert; ggufbridge -> ggufbridge."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for mod, targets in sorted(graph.items()):
        src = part(mod)
        if src not in LAYERS:
            out.append(f"{mod}: its package {src!r} has no row in LAYERS")
            continue
        out += [f"{mod} -> {t}" for t in sorted(targets) if part(t) != src and part(t) not in LAYERS[src]]
    return out


def test_every_import_follows_the_layers():
    """Function-level imports count too: a deferred import is still a dependency (they hid ggufio -> arch,
    runtime <-> vision, quant <-> compare and checkpoint -> ggufio)."""
    bad = layer_violations(import_graph())
    assert not bad, "imports against LAYERS:\n" + "\n".join(bad)


def test_the_layer_check_finds_a_back_edge():
    # the edge that ggufio.writer had before ConversionPlan moved next to it
    g = import_graph()
    g["ggufbridge.ggufio.writer"] = g["ggufbridge.ggufio.writer"] | {"ggufbridge.arch.plan"}
    assert layer_violations(g) == ["ggufbridge.ggufio.writer -> ggufbridge.arch.plan"]


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " → ".join(cycle)


def test_the_check_finds_a_cycle():
    # the detector itself: the graph as it was before issue 14 (convert → quant.pipeline → quant.verify → convert)
    g = import_graph()
    g["ggufbridge.quant.pipeline"] = g["ggufbridge.quant.pipeline"] | {"ggufbridge.verify"}
    assert "ggufbridge.convert" in g["ggufbridge.verify"]
    assert "ggufbridge.quant.pipeline" in g["ggufbridge.convert"]
    cycle = find_cycle(g)
    assert cycle is not None and cycle[0] == cycle[-1]
    assert {"ggufbridge.convert", "ggufbridge.quant.pipeline", "ggufbridge.verify"} <= set(cycle)

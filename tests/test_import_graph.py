"""No import circle among ggufbridge's modules.

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

"""The grading package reads as the stages it runs (issue 35): no module imports one that
imports it back (directly or through others, lazy imports inside functions included), and no
file is over 600 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRADING = ROOT / "grading"


def _imports() -> dict[str, set[str]]:
    """``{module: grading modules it imports}``, every import statement of the file."""
    modules = {p.stem for p in GRADING.glob("*.py")}
    out: dict[str, set[str]] = {}
    for path in GRADING.glob("*.py"):
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "grading":
                found |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("grading."):
                found.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                found |= {a.name.split(".")[1] for a in node.names
                          if a.name.startswith("grading.")}
        out[path.stem] = found - {path.stem}
    return out


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, stack = set(), [start]
    while stack:
        for nxt in graph.get(stack.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def test_no_grading_module_imports_one_that_imports_it_back():
    graph = _imports()
    cycles = sorted(f"{m} <-> {o}" for m in graph for o in graph[m] if m in _reach(graph, o))
    assert cycles == []
    assert "integrity" not in set().union(*graph.values()), "the facade is for callers only"


def test_the_check_sees_a_cycle():
    assert "a" in _reach({"a": {"b"}, "b": {"c"}, "c": {"a"}}, "a")


def test_no_grading_file_is_over_600_lines():
    long = {p.name: n for p in GRADING.glob("*.py")
            if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}

"""List every ``course_utils`` name a released notebook of any version used, from git history.

Every version of every notebook under ``notebooks/`` and ``assignments/`` that git has seen is
read (its code cells parsed, never run); what it imported from ``course_utils`` and which of
those modules' attributes it used are written to ``tests/data/old_names.json``, which
``tests/test_old_names.py`` imports name by name: a student's copy in ``workspace/`` is never
overwritten, so each of these names must keep working (issue 48).

Usage: ``python scripts/old_names.py`` (from the repository root; needs the git history).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "old_names.json"


def _uses(sources: list[str]) -> set[tuple[str, str]]:
    """``(module, attribute)`` pairs (attribute ``""``: the module itself) a notebook's code
    cells use (an import in one cell binds the name for the cells after it)."""
    from IPython.core.inputtransformer2 import TransformerManager

    plain, trees = TransformerManager(), []
    for source in sources:
        try:
            trees.append(ast.parse(plain.transform_cell(source)))
        except SyntaxError:
            continue
    bound: dict[str, str] = {}
    found: set[tuple[str, str]] = set()
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_utils"):
            module = node.module[len("course_utils."):] if "." in node.module else ""
            for a in node.names:
                if module == "":
                    found.add((a.name, ""))
                    bound[a.asname or a.name] = a.name
                elif a.name != "*":
                    found.add((module, a.name))
                    bound[a.asname or a.name] = f"{module}.{a.name}"  # a module or not
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("course_utils."):
                    module = a.name[len("course_utils."):]
                    found.add((module, ""))
                    if a.asname:
                        bound[a.asname] = module
    for node in (n for tree in trees for n in ast.walk(tree)):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in bound):
            found.add((bound[node.value.id], node.attr))
    return found


def collect() -> list[list[str]]:
    """Every ``[module, attribute]`` the notebooks' history used, sorted."""
    listing = subprocess.run(["git", "rev-list", "--all", "--objects", "--", "notebooks",
                              "assignments"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split("\n")
    blobs = sorted({line.split()[0] for line in listing if line.endswith(".ipynb")})
    found: set[tuple[str, str]] = set()
    for blob in blobs:
        text = subprocess.run(["git", "cat-file", "-p", blob], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout
        try:
            cells = json.loads(text).get("cells", [])
        except ValueError:
            continue
        sources = [c.get("source", "") for c in cells if c.get("cell_type") == "code"]
        found |= _uses(["".join(s) if isinstance(s, list) else s for s in sources])
    return sorted([m, a] for m, a in found if not m.startswith("widgets") or a)


def main() -> int:
    names = collect()
    OUT.write_text(json.dumps(names).replace("], [", "],\n[") + "\n")
    print(f"{len(names)} names from the notebooks' history -> {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""course_utils reads as the course does (issue 48): packages by concern in the lectures' order,
no module that imports one that imports it back (imports inside functions included), no import
from a lower package up to a higher one, no file over 600 lines, no private name taken from
another module, one home for the ring's cost and for recording collectives, and each package's
``__init__`` naming the lectures it serves."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from grading import names
from test_grading_layout import _reach  # the one reachability walk of the layout tests

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "course_utils"

# Lower to higher: a module may import its own package or a lower one (same row: either way).
LAYERS = [
    {"runtime"},
    {"launch", "style", "models"},
    {"memory", "collectives"},
    {"data_parallel"}, {"zero"}, {"tensor_parallel"}, {"pipeline"}, {"mesh"},
    {"sequence_parallel"}, {"measure"}, {"jax_sharding"}, {"trainer3d"}, {"scale"}, {"step_time"},
    {"checkpoint"}, {"widgets"}, {"assess"},
]
LEVEL = {package: i for i, row in enumerate(LAYERS) for package in row}
PRIVATE_TOP = {"_aliases"}  # the package's own plumbing, imported by course_utils/__init__ only


MODULES = {names.module_name(p, LIBRARY): p for p in sorted(LIBRARY.rglob("*.py"))
           if "__pycache__" not in p.parts}


def _imports(module: str, path: Path) -> list[tuple[str, str, int]]:
    """``(module imported, name taken from it or "", line)`` for every import statement of a
    file, at any depth (inside functions too), and the modules a lazy package's ``FORMER``
    names (its ``__getattr__`` imports them)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            source = names.absolute_module(module, path.name == "__init__.py", node)
            if source is None:
                continue
            for a in node.names:
                sub = f"{source}.{a.name}".strip(".")
                out.append((sub, "", node.lineno) if sub in MODULES
                           else (source, a.name, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name[len("course_utils."):], "", node.lineno) for a in node.names
                    if a.name.startswith("course_utils.")]
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1
              and getattr(node.targets[0], "id", "") == "FORMER"):  # a lazy package's imports
            out += [(c.value[len("course_utils."):], "", node.lineno) for c in ast.walk(node.value)
                    if isinstance(c, ast.Constant) and str(c.value).startswith("course_utils.")]
    return out


def _graph() -> dict[str, set[str]]:
    return {m: {t for t, _, _ in _imports(m, p) if t and t != m} for m, p in MODULES.items()}


def test_no_module_imports_one_that_imports_it_back():
    graph = _graph()
    cycles = sorted({" <-> ".join(sorted((m, o))) for m in graph for o in graph[m]
                     if m in _reach(graph, o)})
    assert cycles == []


def test_every_package_has_a_place_in_the_layers():
    tops = {m.split(".")[0] for m in MODULES if m} - PRIVATE_TOP
    assert tops == set(LEVEL)


def test_no_import_goes_up_the_layers():
    """A lecture's package builds on earlier lectures' packages, never on later ones."""
    upward = []
    for module, path in MODULES.items():
        if not module:  # course_utils/__init__: installs the aliases and the messages
            continue
        for target, _, line in _imports(module, path):
            here, there = module.split(".")[0], target.split(".")[0]
            if there in LEVEL and LEVEL[there] > LEVEL[here]:
                upward.append(f"{module}:{line} imports {target}")
    assert upward == []


def test_no_file_is_over_600_lines():
    long = {m: n for m, p in MODULES.items()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600}
    assert long == {}


def test_no_module_takes_a_private_name_from_another():
    taken = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bound = {}
        for target, name, line in _imports(module, path):
            if name.startswith("_") and not name.startswith("__") and target != module:
                taken.append(f"{module}:{line} imports {target}.{name}")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith("course_utils"):
                for a in node.names:
                    if f"{node.module[len('course_utils.'):]}.{a.name}".strip(".") in MODULES:
                        bound[a.asname or a.name] = a.name
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("course_utils.") and a.asname:
                        bound[a.asname] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in bound and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                taken.append(f"{module}:{node.lineno} uses {node.value.id}.{node.attr}")
    assert taken == []


def _ring_factors(tree: ast.AST) -> list[int]:
    """Lines computing ``(g - 1) / g`` (the ring's factor) in code, whatever the names."""
    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
                and isinstance(node.left, ast.BinOp) and isinstance(node.left.op, ast.Sub)
                and isinstance(node.left.right, ast.Constant) and node.left.right.value == 1
                and ast.dump(node.left.left) == ast.dump(node.right)):
            lines.append(node.lineno)
    return lines


def test_the_rings_cost_has_one_home():
    found = {m: lines for m, p in MODULES.items() if m != "collectives.cost"
             and (lines := _ring_factors(ast.parse(p.read_text(encoding="utf-8"))))}
    assert found == {}
    assert _ring_factors(ast.parse(MODULES["collectives.cost"].read_text()))


def test_the_ring_check_sees_a_factor_under_any_name():
    assert _ring_factors(ast.parse("x = 2 * (tp - 1) / tp * n\ny = (w.size - 1) / w.size"))


_INTERCEPTS = re.compile(r"setattr\((dist|c10d|torch\.distributed)\b|TorchDispatchMode\)|"
                         r"^\s*(dist|c10d)\.\w+\s*=", re.M)


def test_collectives_are_recorded_in_one_place():
    """Only the recorder patches torch.distributed or watches the dispatcher for collectives."""
    found = sorted(m for m, p in MODULES.items() if m != "collectives.recorder"
                   and _INTERCEPTS.search(p.read_text(encoding="utf-8")))
    assert found == []


@pytest.mark.parametrize("package", sorted(LEVEL))
def test_each_package_says_which_lectures_it_serves(package):
    path = LIBRARY / package / "__init__.py"
    if not path.exists():  # a module at the top (style, launch as a module)
        path = LIBRARY / f"{package}.py"
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    assert "TODO" not in doc and re.search(r"[Ll]ectures? \d|module \d|every lecture", doc), package


@pytest.mark.parametrize("concern, words, home", [
    ("pipeline parallel", r"pipeline|bubble|schedule|backward_split|fiw", "pipeline"),
    ("checkpointing", r"checkpoint|resume|reshard|lost_|post_validation", "checkpoint"),
])
def test_a_concern_lives_in_one_folder(concern, words, home):
    """A newcomer finds every file of a concern in its folder (an assignment's harness, named
    like its judge, lives in assess/)."""
    strays = sorted(m for m in MODULES if re.search(words, m.rpartition(".")[2])
                    and m.split(".")[0] not in (home, "assess", "widgets"))
    assert strays == [], concern


_DOTTED = re.compile(r"course_utils((?:\.[A-Za-z_]\w*)+)")
_READ = ["course_utils", "authoring", "docs", "grading", "scripts", "benchmarks", "hub",
         "README.md", "CONTRIBUTING.md"]


def _reader_files() -> list[Path]:
    out = []
    for top in _READ:
        path = ROOT / top
        out += [path] if path.is_file() else sorted(
            p for p in path.rglob("*")
            if p.suffix in (".py", ".md") and "__pycache__" not in p.parts)
    return out


def _references():
    """``(file:line, dotted path after course_utils)`` in the docs, docstrings and code a
    reader follows (placeholders such as ``course_utils.MODULE`` and dunders left out)."""
    for f in _reader_files():
        if f.name == "_aliases.py":
            continue
        for number, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            for m in _DOTTED.finditer(line):
                parts = m.group(1)[1:].split(".")
                if any(p.isupper() or p.startswith("__") for p in parts):
                    continue
                yield f"{f.relative_to(ROOT)}:{number}", parts, line


def test_every_course_utils_name_a_reader_follows_exists_under_its_new_name():
    """A dotted name in a docstring, a guide or a lecture leads somewhere (a module, or a name
    a module defines) and says where it lives now, not an old flat name (those appear only
    where a text explains the old names)."""
    index, old = names.index(), names.old_names()
    wrong = []
    for where, parts, line in _references():
        found = any(index.resolve(parts[:k]) is not None and
                    (k == len(parts) or isinstance(index.resolve(parts[:k]), tuple))
                    for k in range(len(parts), 0, -1))
        if not found:
            wrong.append(f"{where}: course_utils.{'.'.join(parts)} does not exist")
        elif parts[0] in old and not re.search(r"\bold\b|former|earlier", line.lower()):
            wrong.append(f"{where}: course_utils.{'.'.join(parts)} is an old name")
    assert wrong == []


def test_every_course_utils_file_a_reader_is_sent_to_exists():
    missing = []
    for f in _reader_files():
        for number, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            for m in re.finditer(r"course_utils/[\w/]+\.(?:py|json)", line):
                if not (ROOT / m.group(0)).exists():
                    missing.append(f"{f.relative_to(ROOT)}:{number}: {m.group(0)}")
    assert missing == []

"""The students' copy (``make student-copy``): complete, answer-free, and its tests pass there."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_assignments import ASSIGNMENTS

from grading import leaks
from scripts.student_copy import INSTRUCTOR_TESTS

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("student") / "student-course"
    out = subprocess.run([sys.executable, "scripts/student_copy.py", str(dest)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return dest


def test_the_copy_has_the_course_and_no_answers(copy):
    for needed in ("notebooks/01_training_state.ipynb", "course_utils/launch/__init__.py",
                   "Makefile", "scripts/setup.sh", "requirements.txt", "tests/conftest.py",
                   *(f"assignments/{a}/{a}.ipynb" for a in ASSIGNMENTS)):
        assert (copy / needed).exists(), needed
    for absent in ("solutions", "authoring", "grading", "nbgrader_config.py", "docs",
                   "tests/test_grading_integrity.py", ".git"):
        assert not (copy / absent).exists(), absent
    assert copy.with_name("student-course.tar.gz").stat().st_size > 10_000

    windows, checks = leaks.secrets()
    assert len(windows) > 100 and len(checks) > 50
    for path in copy.rglob("*"):
        if path.is_file():
            found = leaks.leaks(leaks.lines(path), windows, checks)
            assert not found, f"{path.relative_to(copy)} has answer code: {found[:3]}"


def _same_files(copy: Path) -> list[str]:
    """The copy's files that are byte-for-byte the repository's (all but README and Makefile)."""
    same = []
    for path in sorted(copy.rglob("*")):
        rel = path.relative_to(copy)
        if path.is_file() and not path.is_symlink() and (ROOT / rel).is_file():
            if (ROOT / rel).read_bytes() == path.read_bytes():
                same.append(str(rel))
    return same


def _names_the_layout(node: ast.AST) -> bool:
    """Does ``node`` name a path of the repository other than course_utils/ (``ROOT / "x"``,
    ``Path(__file__).parent.parent / "x"``, a glob of the root)?"""
    def is_root(n: ast.AST) -> bool:
        return (isinstance(n, ast.Name) and n.id == "ROOT") or (
            not isinstance(n, ast.BinOp) and "__file__" in ast.unparse(n))

    for n in ast.walk(node):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and is_root(n.left):
            first = n.right.value if isinstance(n.right, ast.Constant) else None
            if not (isinstance(first, str) and first.split("/")[0] == "course_utils"):
                return True
        if isinstance(n, ast.Attribute) and n.attr in ("glob", "rglob", "iterdir") and is_root(
                n.value):
            return True
    return False


def _layout_tests(path: Path) -> list[str]:
    """The tests of ``path`` that read the repository's layout: those naming a path of it, or
    using (as a fixture, a helper or a module constant, at any depth) something that does."""
    defs: dict[str, ast.AST] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                defs.update({n.id: node for n in ast.walk(target)
                             if isinstance(n, ast.Name) and n.id != "ROOT"})

    def uses(node: ast.AST) -> set[str]:
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        return names | {a.arg for a in getattr(getattr(node, "args", None), "args", [])}

    reads = {name for name, node in defs.items() if _names_the_layout(node)}
    while more := {name for name, node in defs.items()
                   if name not in reads and uses(node) & reads}:
        reads |= more
    return sorted(f"tests/{path.name}::{name}" for name in reads
                  if name.startswith(("test_", "Test")))


def test_the_copys_readme_commands_work_there(copy):
    """The copy's README starts with the two commands, and ``make test`` works there.

    The copy's tests, lectures, assignments and library are the repository's own files, byte for
    byte (asserted), and this suite runs every one of them here; what can differ in the copy is
    only what is missing (solutions/, authoring/, grading/). So the copy's ``make test`` collects
    every test (an import of something that is not there fails collection) and runs the tests
    that read the repository's layout, those naming a path of it other than course_utils/ (the
    fast tier of them, and the workspace test, which copies the lectures and assignments),
    instead of repeating ten minutes of notebooks and real-rank runs that this suite has just
    run on the same files.
    """
    text = (copy / "README.md").read_text()
    first = re.search(r"```(?:bash|sh)?\n(.*?)```", text, flags=re.S).group(1)
    assert [ln.split("#")[0].strip() for ln in first.splitlines() if ln.strip()] == [
        "make lab", "make test"]
    assert "## For instructors" not in text
    same = set(_same_files(copy))
    for path in copy.rglob("*"):
        rel = str(path.relative_to(copy))
        if path.is_file() and rel not in ("README.md", "Makefile"):
            assert rel in same, f"{rel} differs from the repository's"
    # the environment is already set up here: the copy's set-up step finds it and skips pip
    os.symlink(ROOT / ".venv", copy / ".venv")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "COURSE_DATA")) and k != "PYTHONPATH"}

    def make_test(addopts: str) -> subprocess.CompletedProcess:
        return subprocess.run(["make", "test"], cwd=copy, capture_output=True, text=True,
                              timeout=900, env=dict(env, PYTEST_ADDOPTS=addopts))

    # the repository's collection (less the instructor's tests) beside the copy's
    with subprocess.Popen([sys.executable, "-m", "pytest", "--collect-only", "-q", "tests",
                           "notebooks", *(f"--ignore=tests/{t}" for t in INSTRUCTOR_TESTS)],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          env=env) as ours:
        try:
            listed = make_test("--collect-only -q")
            ours_out = ours.communicate(timeout=300)[0]
        finally:
            ours.kill()
    assert listed.returncode == 0, listed.stdout[-3000:] + listed.stderr[-2000:]
    collected = int(re.search(r"(\d+) tests? collected", listed.stdout).group(1))
    assert collected == int(re.search(r"(\d+) tests? collected", ours_out).group(1))

    # the tests that read the repository's layout (they name a path of it other than
    # course_utils/, which the copy has byte for byte); the others see only course_utils
    layout = [t for f in sorted((copy / "tests").glob("test_*.py")) for t in _layout_tests(f)]
    assert "tests/test_workspace.py::test_running_the_course_in_the_workspace_leaves_the_" \
           "originals_alone" in layout and len(layout) >= 10, layout
    out = make_test('-m "not browser" -k "test_workspace or not slow" ' + " ".join(layout))
    tail = out.stdout[-3000:] + out.stderr[-2000:]
    assert out.returncode == 0, tail
    # (pytest's summary line; under an outer make, make adds "Leaving directory" after it)
    last = [ln for ln in out.stdout.splitlines() if re.search(r"\d+ passed", ln)][-1]
    passed = int(re.search(r"(\d+) passed", last).group(1))
    assert passed >= 10 and " failed" not in last and " error" not in last, tail

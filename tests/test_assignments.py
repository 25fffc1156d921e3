"""Every assignment: release in sync and free of solutions; the reference passes its own tests;
an autograde round trip gives the solution full marks and the blank release 0; feedback names
mistakes without showing hidden tests.

The round trip is the shared autograde of ``conftest.graded`` (the same run the integrity tests
use): its ``correct``, ``unanswered`` and ``typical_mistake`` students are the reference, the
blank release and a typical mistake (``grading.synthetic.TYPICAL_MISTAKES``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from grading.synthetic import TYPICAL_MISTAKES

ROOT = Path(__file__).resolve().parent.parent
ASSIGNMENTS = sorted(p.stem for p in (ROOT / "authoring" / "assignments").glob("*.py"))
pytestmark = pytest.mark.slow


def _normalized(path: Path) -> list:
    """What matters in a released notebook: cell types, sources, nbgrader/lock metadata."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    keep = ("nbgrader", "deletable", "editable", "tags")
    return [nb["metadata"].get("kernelspec")] + [
        (c["cell_type"], "".join(c["source"]), {k: c["metadata"].get(k) for k in keep})
        for c in nb["cells"]]


def _hidden_lines(name: str) -> list[str]:
    """Lines of the solution notebook that only its solution and hidden-test regions contain."""
    src = (ROOT / "solutions" / name / f"{name}.ipynb").read_text(encoding="utf-8")
    nb = nbformat.reads(src, as_version=4)
    hidden, visible, inside = [], set(), False
    for cell in nb.cells:
        for line in cell.source.splitlines():
            tag = line.strip()
            if tag in ("### BEGIN HIDDEN TESTS", "### BEGIN SOLUTION"):
                inside = True
            elif tag in ("### END HIDDEN TESTS", "### END SOLUTION"):
                inside = False
            elif inside and len(tag) > 12:
                hidden.append(tag)
            elif not inside:
                visible.add(tag)
    return [line for line in hidden if line not in visible]


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_release_is_in_sync_with_solutions(name, graded):
    """The committed release equals the one nbgrader generates from solutions/ now."""
    committed = ROOT / "assignments" / name / f"{name}.ipynb"
    assert _normalized(committed) == _normalized(graded(name).release / f"{name}.ipynb"), (
        f"assignments/{name} is out of date: run scripts/build_notebooks.py {name}")


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_release_has_no_solutions_or_hidden_tests(name):
    text = (ROOT / "assignments" / name / f"{name}.ipynb").read_text(encoding="utf-8")
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in text
    hidden = _hidden_lines(name)
    assert hidden, "the solution notebook should have solutions and hidden tests"
    released = {line.strip() for cell in nbformat.reads(text, as_version=4).cells
                for line in cell.source.splitlines()}
    leaked = [line for line in hidden if line in released]
    assert not leaked, f"hidden lines leaked into the release: {leaked[:3]}"


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_reference_solution_passes_every_test(name, reference):
    """The solution runs with no error output, no test cell writes to stderr, every test cell
    submits values, and the judge passes every one (``reference_run`` raises otherwise)."""
    for notebook, run in reference(name).items():
        assert not run["problems"], f"{notebook}: {run['problems'][:3]}"
        assert run["submissions"] and all(run["submissions"].values()), (
            f"{notebook}: a test cell submitted nothing")


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_autograde_round_trip(name, graded):
    """solution -> full autograded marks; blank release -> 0; a typical mistake -> partial
    marks with the mistake named in the feedback; feedback hides hidden tests."""
    from nbgrader.api import Gradebook

    g = graded(name)
    data = g.data
    mistake = TYPICAL_MISTAKES.get(name)
    with Gradebook(f"sqlite:///{data / 'gradebook.db'}") as gb:
        assignment = gb.find_assignment(name)
        auto_max = sum(c.max_score for nb in assignment.notebooks for c in nb.grade_cells
                       if not c.cell_type == "markdown")
        assert auto_max > 0
        alice = gb.find_submission(name, "correct")
        bob = gb.find_submission(name, "unanswered")
        assert alice.code_score == pytest.approx(auto_max), "reference lost autograded points"
        assert bob.code_score == 0, "a blank submission gained points"
        assert alice.needs_manual_grade  # the explanation question waits for the instructor

        if mistake:
            carol = gb.find_submission(name, "typical_mistake")
            assert 0 < carol.code_score < auto_max

    if mistake:
        carol_html = (data / "feedback" / "typical_mistake" / name / f"{name}.html").read_text(
            "utf-8")
        assert mistake[2] in carol_html, "feedback does not name the mistake"
    html = (data / "feedback" / "unanswered" / name / f"{name}.html").read_text(encoding="utf-8")
    assert "NotImplementedError" in html
    assert "BEGIN HIDDEN TESTS" not in html
    plain = re.sub(r"<[^>]+>", "", html)
    leaked = [line for line in _hidden_lines(name) if line in plain and "check_" in line]
    assert not leaked, f"feedback shows hidden test code: {leaked[:3]}"

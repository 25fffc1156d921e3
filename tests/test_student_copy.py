"""The students' copy (``make student-copy``): complete, answer-free, and its tests pass there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from test_assignments import ASSIGNMENTS

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
    for needed in ("notebooks/01_training_state.ipynb", "course_utils/launch.py", "Makefile",
                   "scripts/setup.sh", "requirements.txt", "tests/conftest.py",
                   *(f"assignments/{a}/{a}.ipynb" for a in ASSIGNMENTS)):
        assert (copy / needed).exists(), needed
    for absent in ("solutions", "authoring", "grading", "nbgrader_config.py", "docs",
                   "tests/test_grading_integrity.py", ".git"):
        assert not (copy / absent).exists(), absent
    assert copy.with_name("student-course.tar.gz").stat().st_size > 10_000

    windows, checks = _secrets()
    assert len(windows) > 100 and len(checks) > 50
    for path in copy.rglob("*"):
        if not path.is_file():
            continue
        lines = _lines(path)
        text = "\n".join(lines)
        for marker in ("BEGIN SOLUTION", "BEGIN HIDDEN TESTS"):
            assert marker not in text, f"{path.relative_to(copy)} contains {marker}"
        found = sorted(checks & set(lines)) + sorted(
            " / ".join(w) for w in windows & set(zip(lines, lines[1:], lines[2:])))
        assert not found, f"{path.relative_to(copy)} has answer code: {found[:3]}"


def _regions(assignment: str) -> list[list[str]]:
    """The stripped, non-blank lines of each solution and hidden-test region of a solution."""
    nb = nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    regions, current = [], None
    for cell in nb.cells:
        for line in cell.source.splitlines():
            tag = line.strip()
            if tag in ("### BEGIN HIDDEN TESTS", "### BEGIN SOLUTION"):
                current = []
            elif tag in ("### END HIDDEN TESTS", "### END SOLUTION"):
                regions.append(current)
                current = None
            elif current is not None and tag:
                current.append(tag)
    return regions


def _secrets() -> tuple[set, set]:
    """Every run of 3 consecutive lines of answer, hidden-test or judge code, and every judge
    line with a value or a message in it (the expected values and known mistakes)."""
    windows, checks = set(), set()
    for a in ASSIGNMENTS:
        visible = set(_lines(ROOT / "assignments" / a / f"{a}.ipynb"))
        judge = [ln.strip() for ln in (ROOT / "authoring" / "judges" / f"{a}.py").read_text(
            encoding="utf-8").splitlines() if ln.strip()]
        for region in _regions(a):
            windows |= set(zip(region, region[1:], region[2:]))
        # the judge's values and messages (its plain code may repeat the course's library)
        checks |= {ln for ln in judge if len(ln) > 20 and ln not in visible
                   and not ln.startswith(("import ", "from ", "#", '"""'))
                   and (re.search(r'"[^"]*\s[^"]*\s[^"]*"', ln)  # a message of words
                        or re.search(r"\d\.\d|\de\d", ln))}
    return windows, checks


def _lines(path: Path) -> list[str]:
    """A file's stripped non-blank lines (a notebook's: its cells' sources and text outputs)."""
    text = path.read_text(encoding="utf-8", errors="ignore")
    if path.suffix == ".ipynb":
        nb = nbformat.reads(text, as_version=4)
        text = "\n".join([text] + [c.source for c in nb.cells] + [
            str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
            for c in nb.cells for o in c.get("outputs", [])])
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def test_the_copys_readme_commands_work_there(copy):
    text = (copy / "README.md").read_text()
    first = re.search(r"```(?:bash|sh)?\n(.*?)```", text, flags=re.S).group(1)
    assert [ln.split("#")[0].strip() for ln in first.splitlines() if ln.strip()] == [
        "make lab", "make test"]
    assert "## For instructors" not in text
    # the environment is already set up here: the copy's set-up step finds it and skips pip
    os.symlink(ROOT / ".venv", copy / ".venv")
    out = subprocess.run(["make", "test"], cwd=copy, capture_output=True, text=True,
                         timeout=1200, env={k: v for k, v in os.environ.items()
                                            if not k.startswith(("PYTEST_", "COURSE_DATA"))
                                            and k != "PYTHONPATH"})
    tail = out.stdout[-3000:] + out.stderr[-2000:]
    assert out.returncode == 0, tail
    assert re.search(r"\d+ passed", out.stdout) and " failed" not in out.stdout.splitlines()[-1]

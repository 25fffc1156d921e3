"""The students' copy (``make student-copy``): complete, answer-free, and its tests pass there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_assignments import ASSIGNMENTS

from grading import leaks

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

    windows, checks = leaks.secrets()
    assert len(windows) > 100 and len(checks) > 50
    for path in copy.rglob("*"):
        if path.is_file():
            found = leaks.leaks(leaks.lines(path), windows, checks)
            assert not found, f"{path.relative_to(copy)} has answer code: {found[:3]}"


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

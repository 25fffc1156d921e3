#!/usr/bin/env python
"""Write the students' copy of the course: everything a student needs, no answer in it.

    python scripts/student_copy.py [DEST]          # default: dist/student-course (+ .tar.gz)

This repository is the instructor's: ``solutions/`` and ``authoring/assignments/`` hold every
reference answer and hidden test. Publish the folder this writes instead. It has the lectures,
the released assignments, ``course_utils``, the set-up files, the tests that need no answers
(library, launcher, lecture notebooks, the playground in a browser) and a README whose two
commands (``make lab``, ``make test``) work there. ``tests/test_student_copy.py`` builds it, fails
if any solution line or hidden test appears anywhere in it, and runs its ``make test``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What goes into the copy (files or folders, relative to the repository).
INCLUDE = ["notebooks", "assignments", "course_utils", "scripts/setup.sh", "scripts/workspace.py",
           "scripts/lab.py",
           "scripts/cluster.sbatch", "benchmarks/gpu_check.py",
           "jupyter", "requirements.txt",
           "environment.yml", "pyproject.toml", ".gitignore", "tests"]
# Tests that need solutions/, authoring/ or the grading machinery, or hold an assignment's
# answer (test_capstone.py: a10's training steps; test_pitfalls.py: a10's fixes), stay with the
# instructor.
# Every test file that imports the grading or hub package (found, not listed: a new grading
# test cannot be forgotten) is one of them.
_LISTED = ["test_assignments.py", "test_capstone.py", "test_pitfalls.py", "test_sources.py",
           "test_setup.py", "test_browser_course.py", "test_student_copy.py", "test_site.py",
           "test_slurm.py"]
_IMPORTS_GRADING = re.compile(r"^\s*(?:from|import)\s+(?:grading|solutions|authoring|hub)\b",
                              re.M)
INSTRUCTOR_TESTS = sorted(set(_LISTED) | {
    path.name for path in (ROOT / "tests").glob("test_*.py")
    if _IMPORTS_GRADING.search(path.read_text(encoding="utf-8"))})
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints", "*.egg-info")

MAKEFILE = """\
# The course's two commands (see README.md):
#   make lab    set everything up and open the course in JupyterLab
#   make test   set everything up and run every test
PY := .venv/bin/python
TEST_WORKERS ?= 2
PARALLEL := -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

.PHONY: setup lab test test-fast clean

setup:
\t@scripts/setup.sh

lab: setup
\t@$(PY) scripts/workspace.py
\t@$(PY) scripts/lab.py

test: setup
\t$(PY) -m pytest $(PARALLEL) --durations=10

test-fast: setup  ## no notebooks or browser
\t$(PY) -m pytest $(PARALLEL) -m "not slow and not browser"

clean:
\trm -rf .venv .pytest_cache
"""


def student_readme() -> str:
    """The main README up to the instructors' part, with a line on where the answers are not."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    head = text.split("\n## For instructors", 1)[0].rstrip()
    return head + """

## About this copy

This is the students' copy of the course: lectures, assignments and the helper library, with
the tests that need no answers. Reference answers and the hidden tests that grade assignments
stay with your instructor; the visible test cells in each assignment tell you what they check.
"""


def build(dest: Path, archive: bool = True) -> Path:
    """Write the copy to ``dest`` (replacing it) and, if ``archive``, ``dest``.tar.gz."""
    dest = Path(dest).resolve()
    if dest == ROOT or ROOT.is_relative_to(dest):
        raise ValueError(f"dest must be a new folder outside the repository root, got {dest}")
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for rel in INCLUDE:
        src = ROOT / rel
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, target, ignore=IGNORE)
        else:
            shutil.copy2(src, target)
    for name in INSTRUCTOR_TESTS:
        (dest / "tests" / name).unlink(missing_ok=True)
    (dest / "Makefile").write_text(MAKEFILE)
    (dest / "README.md").write_text(student_readme(), encoding="utf-8")
    if archive:
        with tarfile.open(dest.with_name(dest.name + ".tar.gz"), "w:gz") as tar:
            tar.add(dest, arcname=dest.name)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dest", nargs="?", type=Path, default=ROOT / "dist" / "student-course")
    parser.add_argument("--no-archive", action="store_true", help="write only the folder")
    args = parser.parse_args(argv)
    try:
        out = build(args.dest, archive=not args.no_archive)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out}" + ("" if args.no_archive else f" and {out.name}.tar.gz"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

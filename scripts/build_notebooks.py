"""Build the course's notebooks from their plain-text sources in ``authoring/``.

Sources are Python files in the "percent" format (``# %%`` starts a cell). Each header may carry
a tag in brackets:

    # %% [markdown]                 a markdown cell (each line's leading "# " is removed)
    # %%                            a code cell
    # %% [answer q1]                nbgrader: an autograded answer cell (solution region inside)
    # %% [test q1 points=2]         nbgrader: a read-only test cell worth 2 points
    # %% [manual explain points=2]  nbgrader: a manually graded markdown answer

A code cell's leading ``# NBVAL_IGNORE_OUTPUT`` (or another nbval marker) line becomes the
cell tag ``nbval-ignore-output``: nbval reads it, students do not see it. ``# COURSE_MEASURED``
(tag ``course-measured``) marks a cell that prints a measurement read from a cached benchmark
run: nbval still compares it, and the scan for graded answers in lectures skips it (its numbers
are one machine's timings; a match there is chance).

``authoring/lectures/NAME.py``     -> ``notebooks/NAME.ipynb``, executed so outputs are stored
                                       (nbval compares them in the tests).
``authoring/assignments/NAME.py``  -> ``solutions/NAME/NAME.ipynb`` (nbgrader source), then
                                       ``nbgrader generate_assignment`` -> ``assignments/NAME/``.

Usage (from the repository root, inside the course's environment)::

    python scripts/build_notebooks.py                 # everything
    python scripts/build_notebooks.py 01_training_state a1_training_state
    python scripts/build_notebooks.py --no-execute    # lectures without running them
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The kernels that run the notebooks import this checkout's course_utils (an editable install of
# another checkout would come first otherwise: a git worktree sharing one environment).
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
LECTURE_SRC = ROOT / "authoring" / "lectures"
ASSIGNMENT_SRC = ROOT / "authoring" / "assignments"
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
_HEADER = re.compile(r"^# %%(?:\s+\[(?P<tag>[^\]]*)\])?\s*$")


def _parse_tag(tag: str | None, path: Path, lineno: int) -> dict:
    if not tag:
        return {"kind": "code"}
    words = tag.split()
    kind, rest = words[0], words[1:]
    if kind == "markdown" and not rest:
        return {"kind": "markdown"}
    if kind in ("answer", "test", "manual") and rest:
        spec = {"kind": kind, "id": rest[0], "points": 0}
        for word in rest[1:]:
            key, _, value = word.partition("=")
            if key != "points" or not value.isdigit():
                raise ValueError(f"{path}:{lineno}: unknown option {word!r} in [{tag}]")
            spec["points"] = int(value)
        if kind in ("test", "manual") and spec["points"] <= 0:
            raise ValueError(f"{path}:{lineno}: [{tag}] needs points=N")
        return spec
    raise ValueError(f"{path}:{lineno}: unknown cell tag [{tag}]; expected markdown, answer ID, "
                     "test ID points=N or manual ID points=N")


def parse(path: Path) -> list[tuple[dict, str]]:
    """Split a percent-format source into (spec, source) pairs."""
    cells: list[tuple[dict, list[str]]] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = _HEADER.match(line)
        if m:
            cells.append((_parse_tag(m.group("tag"), path, lineno), []))
        elif cells:
            cells[-1][1].append(line)
    out = []
    for spec, lines in cells:
        if spec["kind"] in ("markdown", "manual"):
            lines = [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in lines]
        text = "\n".join(lines).strip("\n")
        if text:
            out.append((spec, text))
    return out


def _nbgrader_meta(spec: dict, index: int) -> dict:
    kind = spec["kind"]
    meta = {"schema_version": 3, "task": False, "grade": False, "solution": False,
            "locked": True, "grade_id": f"cell-{index:02d}"}
    if kind == "answer":
        meta.update(solution=True, locked=False, grade_id=spec["id"])
    elif kind == "test":
        meta.update(grade=True, grade_id=spec["id"], points=spec["points"])
    elif kind == "manual":
        meta.update(grade=True, solution=True, locked=False, grade_id=spec["id"],
                    points=spec["points"])
    return meta


_NBVAL_MARKERS = ("NBVAL_IGNORE_OUTPUT", "NBVAL_CHECK_OUTPUT", "NBVAL_RAISES_EXCEPTION",
                  "NBVAL_SKIP", "COURSE_MEASURED")


def _nbval_tags(text: str) -> tuple[str, list[str]]:
    """Leading ``# NBVAL_...`` comment lines become nbval's cell tags (``nbval-ignore-output``),
    so students do not read test markers in the notebook."""
    lines, tags = text.split("\n"), []
    while lines and lines[0].strip().lstrip("#").strip() in _NBVAL_MARKERS:
        tags.append(lines.pop(0).strip().lstrip("#").strip().lower().replace("_", "-"))
    return "\n".join(lines), tags


def build(path: Path, graded: bool) -> nbformat.NotebookNode:
    """The notebook for one source file (not executed)."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    for index, (spec, text) in enumerate(parse(path)):
        kind = spec["kind"]
        if kind in ("markdown", "manual"):
            cell = nbformat.v4.new_markdown_cell(text)
        else:
            if not graded and kind != "code":
                raise ValueError(f"{path}: [{kind}] cells belong in authoring/assignments/")
            text, tags = _nbval_tags(text)
            cell = nbformat.v4.new_code_cell(text)
            if tags:
                cell.metadata["tags"] = tags
        cell.id = spec.get("id", f"c{index:02d}")
        if graded:
            cell.metadata["nbgrader"] = _nbgrader_meta(spec, index)
        nb.cells.append(cell)
    return nb


def execute(nb: nbformat.NotebookNode, cwd: Path, timeout: int = 300) -> None:
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd)}}).execute()


def build_lecture(name: str, run: bool = True) -> Path:
    nb = build(LECTURE_SRC / f"{name}.py", graded=False)
    target = ROOT / "notebooks" / f"{name}.ipynb"
    if run:
        execute(nb, target.parent)
    nbformat.write(nb, target)
    return target


def build_assignment(name: str) -> Path:
    nb = build(ASSIGNMENT_SRC / f"{name}.py", graded=True)
    target = ROOT / "solutions" / name / f"{name}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)
    subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", name, "--force",
                    "--no-db", "--log-level=WARN"], cwd=ROOT, check=True)
    # the release's visible checks show no known mistake in the clear (grading/visible.py):
    # the reference runs once (cached) to say what each check sees
    from grading import visible

    visible.seal_release_file(name)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="source names without .py (default: all)")
    parser.add_argument("--no-execute", action="store_true", help="do not run lecture notebooks")
    args = parser.parse_args(argv)
    lectures = sorted(p.stem for p in LECTURE_SRC.glob("*.py"))
    assignments = sorted(p.stem for p in ASSIGNMENT_SRC.glob("*.py"))
    names = args.names or lectures + assignments
    for name in names:
        if name in lectures:
            print("lecture", build_lecture(name, run=not args.no_execute).relative_to(ROOT))
        elif name in assignments:
            print("assignment", build_assignment(name).relative_to(ROOT))
        else:
            sys.exit(f"no source named {name!r} in authoring/lectures or authoring/assignments")


if __name__ == "__main__":
    main()

"""Built notebooks match their sources in authoring/, and the builder rejects bad sources."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import build_notebooks as bn  # noqa: E402

LECTURES = sorted(p.stem for p in bn.LECTURE_SRC.glob("*.py"))
ASSIGNMENTS = sorted(p.stem for p in bn.ASSIGNMENT_SRC.glob("*.py"))


def _shape(nb, keep_nbgrader: bool):
    return [(c.cell_type, c.source, c.metadata.get("nbgrader") if keep_nbgrader else None)
            for c in nb.cells]


@pytest.mark.parametrize("name", LECTURES)
def test_lecture_notebook_matches_source(name):
    built = bn.build(bn.LECTURE_SRC / f"{name}.py", graded=False)
    committed = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    assert _shape(committed, False) == _shape(built, False), (
        f"notebooks/{name}.ipynb is out of date: run scripts/build_notebooks.py {name}")
    code = [c for c in committed.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), (
        f"notebooks/{name}.ipynb has unexecuted cells: nbval would not compare their output")
    assert committed.metadata["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_solution_notebook_matches_source(name):
    built = bn.build(bn.ASSIGNMENT_SRC / f"{name}.py", graded=True)
    committed = nbformat.read(ROOT / "solutions" / name / f"{name}.ipynb", as_version=4)
    assert _shape(committed, True) == _shape(built, True), (
        f"solutions/{name} is out of date: run scripts/build_notebooks.py {name}")


def test_every_notebook_has_a_source():
    built = {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert built == set(LECTURES)
    assert {p.name for p in (ROOT / "solutions").iterdir() if p.is_dir()} == set(ASSIGNMENTS)
    assert {p.name for p in (ROOT / "assignments").iterdir() if p.is_dir()} == set(ASSIGNMENTS)


@pytest.mark.parametrize("name", LECTURES + ASSIGNMENTS)
def test_no_notebook_silences_warnings_for_the_whole_kernel(name):
    """A warning filter set at a cell's top level lasts for the student's whole session; a
    course function that must silence one does it for its own call, by message."""
    folder = bn.LECTURE_SRC if name in LECTURES else bn.ASSIGNMENT_SRC
    for number, line in enumerate((folder / f"{name}.py").read_text().splitlines(), 1):
        assert not line.startswith(("warnings.filterwarnings", "warnings.simplefilter")), (
            f"{name}.py line {number}: {line}")


def test_lecture_and_assignment_numbers_line_up():
    assert LECTURES, "no lectures"
    for name in ASSIGNMENTS:
        number = name[1:].split("_")[0]
        assert any(lec.startswith(number.zfill(2)) for lec in LECTURES), name


@pytest.mark.parametrize("text, message", [
    ("# %% [answer]\nx = 1\n", "unknown cell tag"),
    ("# %% [test t1]\nx = 1\n", "needs points=N"),
    ("# %% [test t1 points=two]\nx = 1\n", "unknown option"),
    ("# %% [frobnicate]\nx = 1\n", "unknown cell tag"),
])
def test_builder_rejects_bad_tags(tmp_path, text, message):
    src = tmp_path / "bad.py"
    src.write_text(text)
    with pytest.raises(ValueError, match=message):
        bn.build(src, graded=True)


def test_builder_rejects_graded_cells_in_lectures(tmp_path):
    src = tmp_path / "lec.py"
    src.write_text("# %% [test t1 points=1]\nassert True\n")
    with pytest.raises(ValueError, match="belong in authoring/assignments"):
        bn.build(src, graded=False)


def test_builder_cell_kinds(tmp_path):
    src = tmp_path / "a.py"
    src.write_text("# %% [markdown]\n# # Title\n# text\n\n# %%\nx = 1\n\n"
                   "# %% [answer q1]\ny = 2\n# %% [test q1_t points=3]\nassert y == 2\n"
                   "# %% [manual m1 points=2]\n# answer here\n")
    nb = bn.build(src, graded=True)
    assert [c.cell_type for c in nb.cells] == ["markdown", "code", "code", "code", "markdown"]
    assert nb.cells[0].source == "# Title\ntext"
    meta = [c.metadata["nbgrader"] for c in nb.cells]
    assert meta[1]["locked"] and not meta[1]["grade"] and not meta[1]["solution"]
    assert meta[2]["solution"] and not meta[2]["grade"] and meta[2]["grade_id"] == "q1"
    assert meta[3]["grade"] and meta[3]["points"] == 3 and meta[3]["locked"]
    assert meta[4]["grade"] and meta[4]["solution"] and meta[4]["points"] == 2


def test_builder_turns_nbval_markers_into_tags(tmp_path):
    """Students do not read ``# NBVAL_IGNORE_OUTPUT``: it becomes nbval's cell tag."""
    src = tmp_path / "lec.py"
    src.write_text("# %%\n# NBVAL_IGNORE_OUTPUT\nprint(1)\n\n# %%\n# a comment\nprint(2)\n")
    nb = bn.build(src, graded=False)
    assert nb.cells[0].source == "print(1)" and nb.cells[0].metadata["tags"] == [
        "nbval-ignore-output"]
    assert nb.cells[1].source == "# a comment\nprint(2)" and "tags" not in nb.cells[1].metadata
    for path in (ROOT / "notebooks").glob("*.ipynb"):
        assert "NBVAL_" not in "".join(c.source for c in nbformat.read(path, 4).cells), path


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_every_manual_question_has_a_rubric_that_adds_up(name):
    """Each manually graded cell's solution ends with "**Rubric** (N points):" and bullets
    "* k point(s): ..." that add up to the cell's points; the release never shows it."""
    import re

    nb = nbformat.read(ROOT / "solutions" / name / f"{name}.ipynb", as_version=4)
    manual = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")
              and c.metadata["nbgrader"].get("solution") and c.cell_type == "markdown"]
    for cell in manual:
        gid, points = cell.metadata["nbgrader"]["grade_id"], cell.metadata["nbgrader"]["points"]
        head = re.search(r"\*\*Rubric\*\* \((\d+) points?\):", cell.source)
        assert head, f"{name} {gid}: no rubric"
        assert int(head.group(1)) == points, f"{name} {gid}: rubric for {head.group(1)} points"
        bullets = re.findall(r"^\* (\d+) points?:", cell.source[head.end():], flags=re.M)
        assert sum(map(int, bullets)) == points, f"{name} {gid}: bullets give {bullets}"
        assert re.search(r"^\* 0 points?:", cell.source[head.end():], flags=re.M), gid
    release = (ROOT / "assignments" / name / f"{name}.ipynb").read_text()
    assert "Rubric" not in release

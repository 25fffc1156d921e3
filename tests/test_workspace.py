"""``make lab``'s workspace (``scripts/workspace.py``): the student's own copies of every lecture
and assignment, never overwritten, ignored by git, so running the course leaves the repository
clean."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import workspace  # noqa: E402


def test_sync_copies_every_notebook_once_and_never_overwrites(tmp_path):
    made = workspace.sync(tmp_path)
    lectures = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assignments = sorted(p.name for p in (ROOT / "assignments").glob("*/*.ipynb"))
    assert sorted(p.name for p in (tmp_path / "lectures").glob("*.ipynb")) == lectures
    assert sorted(p.name for p in (tmp_path / "assignments").glob("*/*.ipynb")) == assignments
    assert len(made) == len(lectures) + len(assignments) and (tmp_path / "START_HERE.md").exists()

    mine = tmp_path / "lectures" / lectures[0]
    mine.write_text("my work")
    assert workspace.sync(tmp_path) == [] and mine.read_text() == "my work"
    (tmp_path / "assignments" / assignments[0].removesuffix(".ipynb") / assignments[0]).unlink()
    assert [p.name for p in workspace.sync(tmp_path)] == [assignments[0]]  # an update's new file

    assert workspace.sync(tmp_path, fresh=[mine.stem]) == [mine]
    assert mine.read_bytes() == (ROOT / "notebooks" / lectures[0]).read_bytes()
    assert mine.with_name(mine.name + ".bak").read_text() == "my work"
    with pytest.raises(ValueError, match="no notebook named nope.*01_training_state"):
        workspace.sync(tmp_path, fresh=["nope"])


def _course(root: Path, names: list[str]) -> Path:
    """A small course: a lecture or an assignment notebook per name (a markdown and a code cell)."""
    for name in names:
        path = (root / "notebooks" / f"{name}.ipynb" if name[0].isdigit()
                else root / "assignments" / name / f"{name}.ipynb")
        path.parent.mkdir(parents=True, exist_ok=True)
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# {name}"),
                                             nbformat.v4.new_code_cell("x = 1")])
        nbformat.write(nb, path)
    return root


def _edit(path: Path, cell: int, source: str) -> None:
    nb = nbformat.read(path, as_version=4)
    nb.cells[cell].source = source
    nbformat.write(nb, path)


def test_assignments_and_lectures_are_listed_in_natural_order(tmp_path):
    root = _course(tmp_path / "course", ["01_a", "02_b", "10_c", "a1_x", "a2_y", "a10_z"])
    assert list(workspace.sources(root)) == ["01_a", "02_b", "10_c", "a1_x", "a2_y", "a10_z"]
    assert "`a1_x`, `a2_y`, `a10_z`" in workspace.start_text(root)
    made = workspace.sync(tmp_path / "ws", root=root)
    assert [p.stem for p in made] == ["01_a", "02_b", "10_c", "a1_x", "a2_y", "a10_z"]
    course = workspace.start_text()   # the course's own: a1 first, a10 last
    assert course.index("`a1_training_state`") < course.index("`a2_data_parallel`") < \
        course.index("`a10_capstone`")


def test_make_lab_says_which_copies_the_course_has_a_newer_version_of(tmp_path):
    """A course update (git pull) that changes a notebook the student has a copy of is said on
    every sync, with how to get it; the copy is never overwritten; --fresh keeps the student's
    copy as a backup (never overwriting an older backup), --keep stops the notice."""
    root = _course(tmp_path / "course", ["01_a", "02_b", "a1_x"])
    ws = tmp_path / "ws"
    workspace.sync(ws, root=root)
    assert workspace.outdated(ws, root) == []
    mine = ws / "lectures" / "01_a.ipynb"
    _edit(mine, 1, "x = 2  # my work")
    assert workspace.outdated(ws, root) == []                 # the student's edits: not news
    _edit(root / "notebooks" / "01_a.ipynb", 1, "x = 3  # the course's fix")
    _edit(root / "assignments" / "a1_x" / "a1_x.ipynb", 0, "# a1, clearer")
    assert workspace.sync(ws, root=root) == [] and "my work" in mine.read_text()
    assert workspace.outdated(ws, root) == ["01_a", "a1_x"]
    notice = workspace.update_notice(workspace.outdated(ws, root), ws, root)
    assert "newer version of 2" in notice and "ws/lectures/01_a.ipynb" in notice
    assert "--fresh 01_a" in notice and "--keep 01_a" in notice and "kept" in notice

    assert workspace.sync(ws, fresh=["01_a"], root=root) == [mine]
    assert "the course's fix" in mine.read_text()
    assert "my work" in (ws / "lectures" / "01_a.ipynb.bak").read_text()
    _edit(mine, 1, "x = 4  # more work")
    workspace.sync(ws, fresh=["01_a"], root=root)              # a second --fresh: .bak is kept
    assert "my work" in (ws / "lectures" / "01_a.ipynb.bak").read_text()
    assert "more work" in (ws / "lectures" / "01_a.ipynb.bak2").read_text()
    assert workspace.outdated(ws, root) == ["a1_x"]
    workspace.sync(ws, keep=["a1_x"], root=root)
    assert workspace.outdated(ws, root) == [] and workspace.update_notice([], ws, root) == ""
    assert "# a1_x" in (ws / "assignments" / "a1_x" / "a1_x.ipynb").read_text()
    with pytest.raises(ValueError, match="--keep: no notebook named nope"):
        workspace.sync(ws, keep=["nope"], root=root)


def test_copies_made_before_the_record_are_compared_by_what_the_student_does_not_write(tmp_path):
    root = _course(tmp_path / "course", ["01_a", "02_b"])
    ws = tmp_path / "ws"
    workspace.sync(ws, root=root)
    (ws / workspace.RECORD).unlink()                           # a workspace from before
    _edit(ws / "lectures" / "01_a.ipynb", 1, "x = 2  # my work")
    _edit(root / "notebooks" / "02_b.ipynb", 0, "# b, rewritten")
    assert workspace.outdated(ws, root) == ["02_b"]
    workspace.sync(ws, root=root)
    assert workspace.outdated(ws, root) == ["02_b"]


def test_the_workspace_is_ignored_by_git():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "check-ignore", "-q", "workspace/lectures/01_training_state.ipynb"],
                         cwd=ROOT)
    assert out.returncode == 0, "workspace/ must be ignored: git pull would conflict with it"


def _digest(paths) -> dict:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


@pytest.mark.slow
def test_running_the_course_in_the_workspace_leaves_the_originals_alone(tmp_path):
    """A lecture and an assignment, answered and run in the workspace and saved: the copies
    change, the course's own notebooks do not."""
    from nbclient import NotebookClient

    originals = [*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("assignments/*/*.ipynb")]
    before = _digest(originals)
    workspace.sync(tmp_path)
    for rel in ("lectures/01_training_state.ipynb",
                "assignments/a1_training_state/a1_training_state.ipynb"):
        path = tmp_path / rel
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        nbformat.write(nb, path)
    assert _digest(originals) == before
    assert (tmp_path / "lectures/01_training_state.ipynb").read_bytes() != (
        ROOT / "notebooks/01_training_state.ipynb").read_bytes()

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

"""Every assignment: release in sync and free of solutions; the reference passes its own tests;
an autograde round trip gives the solution full marks and the blank release 0; feedback names
mistakes without showing hidden tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
ASSIGNMENTS = sorted(p.stem for p in (ROOT / "authoring" / "assignments").glob("*.py"))
NBGRADER = [sys.executable, "-m", "nbgrader"]
pytestmark = pytest.mark.slow

# One typical wrong answer per assignment: (answer cell id, code the student wrote, words the
# feedback must show). The autograde round trip submits it as a third student.
MISTAKES = {
    "a1_training_state": ("q1_state_gb", "q1_state_gb = 13e9 * 16 / 2**30",
                          "that is GiB (2**30 bytes)"),
    "a3_zero": ("q1", "zero2_gb = 112 / 8", "that is ZeRO-3"),
    "a4_tensor_parallel": ("q3", "b, s, h, t, L = 4, 2048, 5120, 8, 40\n"
                           "mlp_forward_bytes = 8 * h * h * 2\n"
                           "step_payload_gb = L * 4 * b * s * h * 2 / 1e9\n"
                           "ring_gb_per_rank = 2 * (t - 1) / t * step_payload_gb\n"
                           "naive_over_megatron = 4.0",
                           "TP all-reduces activations"),
    "a2_data_parallel": ("q1", "w_new_0 = 2 - 0.5 * (1 + 3 + 5)\nw_new_1 = 0 - 0.5 * (5 - 1 + 2)",
                         "you used the SUM of the gradients"),
    "a5_pipeline": ("q1", "bubble_p8_m24 = 7 / 24\nbubble_p4_m4 = 3 / 7\n"
                          "bubble_interleaved = 3 / 19",
                    "that is the ratio (P-1)/m"),
    "a6_device_mesh": ("q1", "coords_21 = (2, 1, 1)\ntp_group_21 = [20, 21, 22, 23]\n"
                             "pp_group_21 = [17, 21]\ndp_group_21 = [5, 13, 21, 29]\n"
                             "tp_group_21_tp_outer = [5, 13, 21, 29]\ntp_groups_crossing = 0",
                       "TP is not innermost here"),
    "a7_measuring": ("q2", "q2_tokens_per_s = BATCH_PER_RANK * SEQ_LEN / (RUN_A['step_ms'] / 1000)",
                     "the global batch is BATCH_PER_RANK x D sequences"),
}


def _nbgrader(*args: str, data: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, COURSE_DATA=str(data))
    out = subprocess.run([*NBGRADER, *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    if check and out.returncode != 0:
        raise AssertionError(f"nbgrader {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out


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


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    """A fresh release of every assignment, made from solutions/ without touching the repo."""
    out = tmp_path_factory.mktemp("release")
    for name in ASSIGNMENTS:
        _nbgrader("generate_assignment", name, "--force", "--no-db",
                  f"--CourseDirectory.release_directory={out}", data=out / "data")
    return out


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_release_is_in_sync_with_solutions(name, regenerated):
    committed = ROOT / "assignments" / name / f"{name}.ipynb"
    assert _normalized(committed) == _normalized(regenerated / name / f"{name}.ipynb"), (
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
def test_reference_solution_passes_every_test(name, tmp_path):
    from nbclient import NotebookClient

    nb = nbformat.read(ROOT / "solutions" / name / f"{name}.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            assert output["output_type"] != "error", f"{output['ename']}: {output['evalue']}"
            if cell.metadata.get("nbgrader", {}).get("grade"):
                # nbgrader scores a test cell 0 if it writes anything to stderr
                assert not (output["output_type"] == "stream" and output["name"] == "stderr"), (
                    f"test cell {cell.metadata['nbgrader']['grade_id']} wrote to stderr: "
                    f"{output['text'][:300]}")


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_autograde_round_trip(name, tmp_path):
    """solution -> full autograded marks; blank release -> 0; feedback hides hidden tests."""
    from nbgrader.api import Gradebook

    data = tmp_path / "data"
    _nbgrader("generate_assignment", name, "--force",
              f"--CourseDirectory.release_directory={tmp_path / 'release'}", data=data)
    submissions = {"alice": ROOT / "solutions" / name / f"{name}.ipynb",
                   "bob": tmp_path / "release" / name / f"{name}.ipynb"}
    for student, nb_path in submissions.items():
        target = data / "submitted" / student / name
        target.mkdir(parents=True)
        shutil.copy(nb_path, target / f"{name}.ipynb")
    mistake = MISTAKES.get(name)
    if mistake:  # carol: the reference answers, but one of them replaced by a typical mistake
        cell_id, code, _ = mistake
        nb = nbformat.read(submissions["alice"], as_version=4)
        [cell] = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == cell_id]
        cell.source = code
        (data / "submitted" / "carol" / name).mkdir(parents=True)
        nbformat.write(nb, data / "submitted" / "carol" / name / f"{name}.ipynb")
    _nbgrader("autograde", name, "--create", data=data)
    _nbgrader("generate_feedback", name, data=data)

    with Gradebook(f"sqlite:///{data / 'gradebook.db'}") as gb:
        assignment = gb.find_assignment(name)
        auto_max = sum(c.max_score for nb in assignment.notebooks for c in nb.grade_cells
                       if not c.cell_type == "markdown")
        assert auto_max > 0
        alice = gb.find_submission(name, "alice")
        bob = gb.find_submission(name, "bob")
        assert alice.code_score == pytest.approx(auto_max), "reference lost autograded points"
        assert bob.code_score == 0, "a blank submission gained points"
        assert alice.needs_manual_grade  # the explanation question waits for the instructor

        if mistake:
            carol = gb.find_submission(name, "carol")
            assert 0 < carol.code_score < auto_max

    if mistake:
        carol_html = (data / "feedback" / "carol" / name / f"{name}.html").read_text("utf-8")
        assert mistake[2] in carol_html, "feedback does not name the mistake"
    html = (data / "feedback" / "bob" / name / f"{name}.html").read_text(encoding="utf-8")
    assert "NotImplementedError" in html
    assert "BEGIN HIDDEN TESTS" not in html
    plain = re.sub(r"<[^>]+>", "", html)
    leaked = [line for line in _hidden_lines(name) if line in plain and "check_" in line]
    assert not leaked, f"feedback shows hidden test code: {leaked[:3]}"

"""Feedback checks: right answers pass, wrong ones name the mistake, cheats do not pass."""

from __future__ import annotations

import linecache
import re
from pathlib import Path

import numpy as np
import pytest

from course_utils.assess.checks import as_number, check_choice, check_number, check_sequence

MISTAKES = [(24.45, "that is GiB"), (14.0, "that is ZeRO-3")]


class AlwaysEqual:
    def __eq__(self, other):
        return True


class LyingFloat(float):
    def __eq__(self, other):
        return True

    def __float__(self):
        return 26.25


@pytest.mark.parametrize("value", [26.25, 26.25000001, np.float64(26.25), 26.25e0])
def test_right_answers_pass(value):
    assert check_number("x", value, 26.25, mistakes=MISTAKES) is None


@pytest.mark.parametrize("value, message", [(24.45, "that is GiB"), (14, "that is ZeRO-3"),
                                            (30.0, "is not right")])
def test_wrong_answers_name_the_mistake(value, message):
    with pytest.raises(AssertionError, match=message):
        check_number("x", value, 26.25, mistakes=MISTAKES)


@pytest.mark.parametrize("cheat", [AlwaysEqual(), LyingFloat(1.0), "26.25", None, [26.25],
                                   True, float("nan"), float("inf")])
def test_cheats_and_wrong_types_fail(cheat):
    with pytest.raises(AssertionError):
        check_number("x", cheat, 26.25)


def test_lying_float_is_read_by_its_stored_value():
    assert as_number("x", LyingFloat(1.0)) == 1.0


def test_choice_and_sequence():
    check_choice("c", "ZeRO-2", "zero-2", ["ZeRO-1", "ZeRO-2"])
    check_choice("c", True, None, [True, False])
    with pytest.raises(AssertionError, match="forgot"):
        check_choice("c", "ZeRO-1", "ZeRO-2", ["ZeRO-1", "ZeRO-2"], mistakes={"zero-1": "forgot"})
    with pytest.raises(AssertionError, match="one of"):
        check_choice("c", "ZeRO-9", "ZeRO-2", ["ZeRO-1", "ZeRO-2"])
    check_sequence("s", [0.6, 0.8], [0.6, 0.8])
    with pytest.raises(AssertionError, match=r"s\[1\]"):
        check_sequence("s", [0.6, 0.9], [0.6, 0.8])
    with pytest.raises(AssertionError, match="2 entries"):
        check_sequence("s", [0.6], [0.6, 0.8])


def test_a_named_choice_mistake_reads_as_a_numbers_does():
    """"name = value: why", as for numbers: a message that starts in lower case ("that is one of
    two faults") never follows a full stop, and the class report reads it as a named mistake."""
    from grading.class_report import misconception

    for expected in ("scale", None):
        with pytest.raises(AssertionError) as err:
            check_choice("q6", "sync", expected, ["both", "scale", "sync"],
                         mistakes={"sync": "that is one of two faults"})
        assert str(err.value) == "q6 = 'sync': that is one of two faults"
        assert misconception(str(err.value))[1:] == ("q6: that is one of two faults", True)
    with pytest.raises(AssertionError, match=r"^q6 = 'sync' is not right\. Count them\.$"):
        check_choice("q6", "sync", "scale", ["scale", "sync"], hint="Count them.")


def test_checks_bind_isclose_before_answers_can_patch_it(monkeypatch):
    import math

    monkeypatch.setattr(math, "isclose", lambda *a, **k: True)
    with pytest.raises(AssertionError):
        check_number("x", 1.0, 26.25)


def test_visible_checks_reject_known_mistakes_without_an_expected_value():
    """Practice (visible tests, no expected value): a listed wrong answer fails naming the
    misconception; any other value passes, so nothing reveals the right one."""
    mistakes = [(14.0, "that is ZeRO-3: everything divided by D")]
    check_number("zero2_gb", 26.0, mistakes=mistakes)
    check_number("zero2_gb", 1.0, mistakes=mistakes)
    with pytest.raises(AssertionError, match="zero2_gb = 14: that is ZeRO-3"):
        check_number("zero2_gb", 14.0, mistakes=mistakes)
    with pytest.raises(AssertionError, match="plain number"):
        check_number("zero2_gb", "14", mistakes=mistakes)
    check_choice("stage", 3, None, [0, 1, 2, 3], mistakes={2: "ZeRO-2 needs 37.4 GB"})
    with pytest.raises(AssertionError, match="37.4"):
        check_choice("stage", 2, None, [0, 1, 2, 3], mistakes={2: "ZeRO-2 needs 37.4 GB"})


@pytest.fixture
def notebook_shell(tmp_path, monkeypatch):
    """An IPython shell with course_utils' messages, as a notebook kernel has it, whose
    session's notebook is ``tmp_path/nb.ipynb``; ``run(code, cells)`` writes ``cells`` (code cell
    sources) as that notebook, runs ``code`` and returns the lines the student sees (None: no
    error)."""
    from IPython.core.interactiveshell import InteractiveShell

    from course_utils.assess import messages

    shell = InteractiveShell.instance()
    assert messages.install(shell)
    shown: list = []
    monkeypatch.setattr(shell, "_showtraceback", lambda etype, value, stb: shown.append(stb))
    path = tmp_path / "nb.ipynb"
    monkeypatch.setenv("JPY_SESSION_NAME", str(path))

    def run(code: str, cells: list = (), at: int = 99) -> list[str] | None:
        """(a cell: its source, (source, nbgrader grade id), or (None, markdown); ``at``: the
        running cell's index in ``cells``, 99 for one not in the notebook)"""
        import json

        path.write_text(json.dumps({"cells": [
            {"cell_type": "code", "id": f"c{i}", "source": c} if isinstance(c, str) else
            {"cell_type": "markdown", "id": f"c{i}", "source": c[1]} if c[0] is None else
            {"cell_type": "code", "id": f"c{i}", "source": c[0],
             "metadata": {"nbgrader": {"grade_id": c[1]}}} for i, c in enumerate(cells)]}))
        shown.clear()
        shell.run_cell(code, store_history=True, cell_id=f"c{at}")
        return [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in shown[-1]] if shown else None

    yield run
    shell.user_ns.pop("capstone", None)


def test_a_failed_check_is_one_line(notebook_shell):
    """A check that fails shows its message alone: checks.CheckFailed, the cell's own assert,
    and the course's own checks (capstone.diagnose, pitfalls.check: the old handler showed
    their 20-50-line tracebacks, issue 36); an assert inside the student's own function keeps
    its traceback."""
    run = notebook_shell
    short = run("from course_utils.assess.checks import check_number\n"
                "check_number('x_gb', 303.1, mistakes=[(303.1, 'that is GiB')])")
    assert short == ["Not right yet: x_gb = 303.1: that is GiB"]
    assert run("assert 1 == 2, 'the visible test says no'") == [
        "Not right yet: the visible test says no"]
    course = run("from course_utils import pitfalls\n"
                 "pitfalls.check('dp_by_hand', pitfalls.JOBS['dp_by_hand'], [], label='practice')")
    assert course == ["Not right yet: practice: expected one result per rank (2)"]
    deep = run("def f():\n    assert False, 'deep'\nf()")
    assert len(deep) > 1 and "deep" in deep[-1]
    assert run("x = 1") is None


def test_a_name_a_cell_defines_says_which_cell_after_a_restart(notebook_shell):
    """After a kernel restart, a name used in the cell or in a helper the cell defines (a10's
    test cells: `_q1_practice` uses `capstone`) names the code cell that defines it, in one
    line; a name whose cell has run, or that no cell defines, keeps IPython's traceback."""
    run = notebook_shell
    cells = ["import math\nfrom course_utils import capstone, checks",
             "def helper():\n    unrelated = 3\n    return unrelated"]
    for code in ("print(capstone)",
                 "def _practice():\n    return capstone.plan(1, 1, 2, seed=1)\n_practice()"):
        [line] = run(code, cells)
        assert "`capstone` is not defined in this kernel: cell 1" in line, line
        assert "from course_utils import capstone, checks" in line and "Run All Above" in line
    assert len(run("print(unrelated)", cells)) > 1       # (a local name of a function: no cell)
    run("import math", cells)                            # cell 1's import ran ...
    ran = run("print(math)\ndel math\nprint(math)", ["import math"])
    assert len(ran) > 1 and "Hint" not in ran[-1]        # ... so something else is wrong
    typo = run("print(capstnoe)", cells)                 # no cell defines it: a typo, or ...
    assert len(typo) > 1 and "if a cell above defines `capstnoe`" in typo[-1]


def test_a_cell_is_named_as_jupyterlab_numbers_it(notebook_shell):
    """Issue 50, finding 11: JupyterLab numbers every cell, markdown included ("Cell 3/4" in
    its status bar): the cell named is the third, not the second code cell."""
    run = notebook_shell
    cells = [(None, "# Assignment"), "from course_utils import capstone", (None, "Text"),
             "print(capstone)"]
    [line] = run("print(capstone)", cells, at=3)
    assert "`capstone` is not defined in this kernel: cell 2 (`from course_utils import" in line


def test_an_unanswered_question_says_not_answered(notebook_shell):
    """nbgrader's placeholder, raised in the answer cell, in the student's function, or a name
    its answer cell never set: "Not answered yet" naming the cell, one line (a3 Q5 said
    "KeyError: 'activation_factor'", a10 "RankError: rank 1 failed first: ...")."""
    run = notebook_shell
    stub = "# YOUR CODE HERE\nraise NotImplementedError()"
    function = "def zero_gb(n, dp, stage):\n    # YOUR CODE HERE\n    raise NotImplementedError()"
    test = "checks.check_number('q4_answer', q4_answer)"
    cells = ["from course_utils import checks", (stub, "q4"), (function, "q5"), "print(1)",
             (test, "q4_test"), test]
    [line] = run(stub, cells, at=1)
    assert line.startswith("Not answered yet: cell 2 (`# YOUR CODE HERE`) still holds the "
                           "placeholder `raise NotImplementedError()`"), line
    run(cells[0], cells, at=0)
    run(function, cells, at=2)
    [line] = run("zero_gb(1, 2, 3)", cells)
    assert "`zero_gb` raises NotImplementedError: cell 3 (`def zero_gb(n, dp, stage):`)" \
        in line, line
    for at in (4, 99):  # its question's answer cell; (not in the notebook yet: the first)
        [line] = run(test, cells, at=at)
        assert line.startswith("Not answered yet: `q4_answer` is not defined: cell 2"), line
    [line] = run(test, cells, at=5)                      # (no grade id: the nearest above)
    assert line.startswith("Not answered yet: `q4_answer` is not defined: cell 3"), line
    by_name = "for _name in ('q4_answer',):\n    checks.check_number(_name, globals()[_name])"
    [line] = run(by_name, cells, at=4)                   # a3 Q5's test: KeyError, before
    assert line.startswith("Not answered yet: `q4_answer` is not defined: cell 2"), line
    assert len(run("{}['q4_answer']", cells, at=4)) > 1  # any other KeyError: its traceback
    klass = ("class CopyToTP:\n    \"\"\"Megatron's f.\"\"\"\n\n    # YOUR CODE HERE\n"
             "    raise NotImplementedError()")                   # (a10 Q2's answer cell)
    cells = [klass, "CopyToTP.apply"]
    assert run(klass, cells, at=0)[0].startswith("Not answered yet: `CopyToTP` raises "
                                                 "NotImplementedError: cell 1")
    [line] = run(cells[1], cells, at=1)
    assert line.startswith("Not answered yet: `CopyToTP` is not defined: cell 1"), line


def test_a_rank_that_fails_shows_its_error_not_the_launcher(notebook_shell):
    """launch.RankError: an unanswered function, a name, a course check inside a rank; a crash
    of the student's code shows the rank's error and the student's frames only."""
    from course_utils import launch

    run = notebook_shell
    cells = ["from course_utils import launch, capstone", "def fixed(rank, world_size):\n"
             "    # YOUR CODE HERE\n    raise NotImplementedError()"]
    run(cells[1], cells)
    filename = [f for f in list(linecache.cache)   # (the cell's file, as the rank reports it)
                if "".join(linecache.getlines(f)).strip() == cells[1]][-1]

    def raised(failure, short="rank 1 failed first: X"):
        from IPython import get_ipython

        get_ipython().user_ns["_err"] = launch.RankError("long message", 1, "tb", ["", ""],
                                                         failure, short)
        return run("raise _err", cells)

    stub = {"type": "NotImplementedError", "message": "", "raised_in": None, "name": None,
            "frame": (filename, 3, "fixed")}
    [line] = raised(stub)
    assert line.startswith("Not answered yet: `fixed` raises NotImplementedError on rank 1: "
                           "cell 2"), line
    [line] = raised({"type": "NameError", "message": "name 'capstone' is not defined",
                     "raised_in": None, "name": "capstone", "frame": (filename, 3, "fixed")})
    assert "`capstone` is not defined in this kernel: cell 1" in line
    [line] = raised({"type": "AssertionError", "message": "rank (0, 1, 0): D times too large",
                     "raised_in": "course_utils.assess.a10_capstone", "name": None, "frame": None})
    assert line == "Not right yet: rank 1: rank (0, 1, 0): D times too large"
    crash = raised({"type": "RuntimeError", "message": "shape", "raised_in": None, "name": None,
                    "frame": (filename, 3, "fixed")},
                   "rank 1 failed first: RuntimeError: shape\n"
                   f'  File "{filename}", line 3, in fixed')
    assert crash[0] == "RankError: rank 1 failed first: RuntimeError: shape"
    assert len(crash) == 2 and "Cell In[" in crash[1] and "long message" not in crash[0]


def test_a_visible_check_says_what_it_checked_not_whether_it_is_right(notebook_shell, capsys):
    """A test cell's visible checks that pass print one line at the cell's end: what was
    checked (type, known mistakes), the same for a right value and a wrong one they do not
    know; a cell whose check failed prints no such line (before: nothing at all, so a right
    answer and an unchecked one looked alike)."""
    run = notebook_shell
    run("from course_utils.assess.checks import check_number, check_choice")
    for value in (26.0, 1.0):
        capsys.readouterr()
        assert run(f"check_number('zero2_gb', {value}, mistakes=[(14.0, 'that is ZeRO-3')])\n"
                   "check_choice('fits', True, None, [True, False])") is None
        assert capsys.readouterr().out == ("checked zero2_gb, fits: type and some known mistakes "
                                           "(grading names more); "
                                           "the values are checked when graded\n")
    assert run("check_number('zero2_gb', 14.0, mistakes=[(14.0, 'that is ZeRO-3')])")
    assert "checked" not in capsys.readouterr().out
    run("check_choice('fits', False, None, [True, False])")
    assert capsys.readouterr().out == ("checked fits: type (one of the allowed values); the value "
                                       "is checked when graded\n")
    run("check_number('x', 1.0, 1.0)")                      # a practice check: its own words
    assert capsys.readouterr().out == ""


@pytest.mark.slow
@pytest.mark.parametrize("name", ["a3_zero", "a10_capstone"])
def test_a_blank_release_says_not_answered_in_one_line_per_cell(name, tmp_path, monkeypatch):
    """The released notebook, run blank in a kernel as a student's Run All with errors allowed:
    every cell that fails says "Not answered yet" in one line naming a cell that holds the
    placeholder (a3 Q4 and Q5 and a10's test cells showed 12 to 44-line tracebacks through
    zero.py, capstone.py and launch.py). a10's demonstrations are left out (no checks)."""
    import nbformat
    from nbclient import NotebookClient

    root = Path(__file__).resolve().parent.parent
    nb = nbformat.read(root / "assignments" / name / f"{name}.ipynb", as_version=4)
    nb.cells = [c for c in nb.cells if not re.search(r"pitfalls\.(demo|show)\(|gloo_avg\(",
                                                      c.source)]
    path = tmp_path / f"{name}.ipynb"
    nbformat.write(nb, path)
    monkeypatch.setenv("JPY_SESSION_NAME", str(path))
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    # (a cell named as JupyterLab numbers it: among all cells, markdown included, issue 50)
    stubs = {n for n, c in enumerate(nb.cells, 1) if c.cell_type == "code"
             and "raise NotImplementedError" in c.source}
    failed = 0
    for cell in code:
        for out in cell.outputs:
            if out.output_type != "error":
                continue
            failed += 1
            lines = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(out.traceback)).splitlines()
            where = cell.metadata.get("nbgrader", {}).get("grade_id", cell.source[:40])
            assert len(lines) == 1 and lines[0].startswith("Not answered yet: "), (where, lines)
            named = int(re.search(r": cell (\d+) \(", lines[0]).group(1))
            assert named in stubs, (where, lines)
            if where.endswith("_test"):  # its own question's answer cell
                answer = [n for n, c in enumerate(nb.cells, 1) if c.cell_type == "code"
                          and c.metadata.get("nbgrader", {}).get("grade_id") == where[:-5]]
                assert answer == [named], (where, lines, answer)
    assert failed >= 10

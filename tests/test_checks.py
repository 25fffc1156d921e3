"""Feedback checks: right answers pass, wrong ones name the mistake, cheats do not pass."""

from __future__ import annotations

import numpy as np
import pytest

from course_utils.checks import as_number, check_choice, check_number, check_sequence

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


def test_a_failed_check_is_one_short_block_and_a_missing_name_says_which_cell(tmp_path):
    """In an IPython shell (course_utils.messages): a failed check or a visible test's assert
    shows as one line with its message; a NameError in a cell names the code cell of the
    session's notebook that defines the name; other errors keep their traceback."""
    import json
    import os
    from unittest import mock

    from IPython.core.interactiveshell import InteractiveShell

    from course_utils import messages
    from course_utils.checks import CheckFailed

    shell = InteractiveShell.instance()
    notebook = tmp_path / "lecture.ipynb"
    notebook.write_text(json.dumps({"cells": [
        {"cell_type": "markdown", "source": ["# intro"]},
        {"cell_type": "code", "source": ["import math\n", "from course_utils import overlap\n"]},
        {"cell_type": "code", "source": ["x = 1\n"]}]}))

    def lines(code):
        try:
            exec(compile(code, "<cell>", "exec"), {})
        except Exception as err:  # noqa: BLE001 - (the cell's frames, as IPython hands them)
            return messages.traceback_lines(shell, type(err), err, err.__traceback__.tb_next)

    short = lines("from course_utils.checks import check_number\n"
                  "check_number('x_gb', 303.1, mistakes=[(303.1, 'that is GiB')])")
    assert len(short) == 1 and "x_gb = 303.1: that is GiB" in short[0] and "Not right yet" in short[0]
    assert len(lines("assert 1 == 2, 'the visible test says no'")) == 1
    with mock.patch.dict(os.environ, {"JPY_SESSION_NAME": str(notebook)}):
        hint = lines("print(overlap)")[-1]
        assert "code cell 1" in hint and "from course_utils import overlap" in hint, hint
        assert "Run All Above" in lines("print(nowhere)")[-1]
    deep = lines("def f():\n    assert False, 'deep'\nf()")
    assert len(deep) > 1  # an assert inside the student's own function keeps its traceback
    assert issubclass(CheckFailed, AssertionError)

"""Grading on values alone: what the grader makes of what a submission would submit, no kernel.

A submission's kernel only computes values; the judge decides outside it (``grading.judge``).
So a synthetic student whose point is their *values* (a wrong answer, a unit mistake, an honest
student with their own numbers, a copier, an object that lies to comparisons) needs no kernel:
:func:`values_for` says what each of its test cells would submit (or the error it would
raise), :func:`grade` judges them exactly as ``RecoveringExecute`` does, and writes what a
grading run leaves for the report (the autograded notebook with the verdicts as outputs, the
judge log with the failed cells' values, the digests). ``grading.report`` then reads them as it
reads any run: scores, flags, copied-answer evidence, the class report.

What only a kernel can show (the reference solution and the blank release running, the attacks
on the grader's machinery, the limits) stays with ``grading.workflow.autograde``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_output

from course_utils.assess.checks import encode
from grading import copies, course, expected, judge
from grading.digests import record_digests

ISOLATION = "values judged without a kernel (grading.valuegrade)"
VALUE_KINDS = ("correct", "wrong", "raises", "fake_values", "uses_helper", "copies_peer",
               "typed_identity", "honest")  # (and the unit mistakes: unit_<unit>)


def _wrong(value: Any) -> Any:
    """A wrong value of the same kind (what ``snippets.WRONG`` makes in a kernel)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return type(value)(value * 3 + 7)
    if isinstance(value, str):
        return value + " (wrong)"
    if isinstance(value, list):
        return [_wrong(v) for v in value]
    if isinstance(value, dict):
        return {k: _wrong(v) for k, v in value.items()}
    if hasattr(value, "is_floating_point"):  # a tensor
        return value * 3 + 7
    return value


def right_pairs(assignment: str, givens, reference: dict[str, list]) -> dict[str, list]:
    """``{grade_id: [(name, encoded value)]}``: what a right submission for ``givens`` submits;
    for cells judged on hidden cases or real ranks, the reference's own submissions."""
    rules = judge.load(assignment)
    right = expected.right_values(rules, givens) if givens is not None else {}
    return {gid: copies._pairs(pairs, right[gid]) if gid in right else [tuple(p) for p in pairs]
            for gid, pairs in reference.items()}


def values_for(assignment: str, kind: str, givens, reference: dict[str, list],
               first_tests: list[str], peer_givens=None, unit: tuple[str, float] | None = None,
               mistake: tuple[str, list[str]] | None = None
               ) -> dict[str, tuple[list, tuple[str, str] | None]]:
    """``{grade_id: (pairs submitted, the kernel's error or None)}`` of one synthetic student.
    ``first_tests``: the test cells of the first graded answer (a raising answer fails them);
    ``peer_givens``: whose numbers a copier's values are; ``unit``: (answer name, factor) of a
    unit mistake; ``mistake``: (the answer cell's code, its test cells) of a typical mistake,
    run here with the student's givens as ``G`` (only a mistake whose code reads nothing else of
    the notebook: ``grading.synthetic.TYPICAL_IN_A_KERNEL`` lists the others)."""
    right = right_pairs(assignment, givens, reference)
    out: dict[str, tuple[list, tuple[str, str] | None]] = {g: (p, None) for g, p in right.items()}
    if kind == "typical_mistake" and mistake is not None:
        code, tests = mistake
        names: dict[str, Any] = {"G": givens}
        exec(compile(code, f"<{assignment}: typical mistake>", "exec"), names)  # noqa: S102
        if not any(n in names for gid in tests for n, _ in right[gid]):
            raise ValueError(f"{assignment}'s typical mistake sets none of the values its test "
                             f"cells submit: grade it in a kernel (TYPICAL_IN_A_KERNEL)")
        for gid in tests:
            out[gid] = ([(n, encode(names[n]) if n in names else v) for n, v in right[gid]], None)
    elif kind in ("copies_peer", "typed_identity"):
        out = {g: (p, None) for g, p in right_pairs(assignment, peer_givens, reference).items()}
    elif kind == "wrong":
        out = {g: ([(n, encode(_wrong(judge.decode(v)))) for n, v in p], None)
               for g, p in right.items()}
    elif kind == "raises":
        for gid in first_tests:
            name = right[gid][0][0] if right[gid] else "answer"
            out[gid] = ([], ("NameError", f"name {name.split('[')[0]!r} is not defined"))
    elif kind == "fake_values":
        fakes = ("_SynAlwaysEqual", "_SynLyingFloat")
        out = {g: ([(n, {"$type": fakes[i % 2]}) for n, _ in p], None)
               for i, (g, p) in enumerate(right.items())}
    elif kind.startswith("unit_") and unit is not None:
        name, factor = unit
        out = {g: ([(n, encode(float(judge.decode(v)) * factor) if n == name else v)
                    for n, v in p], None) for g, p in right.items()}
    return out


def verdicts(assignment: str, student: str,
             values: dict[str, tuple[list, tuple[str, str] | None]],
             reference: dict[str, list]) -> list[judge.Verdict]:
    """The judge's verdict on each test cell, in the release's order, as the grader gives it
    (the student's own numbers drawn from their id; the reference's hidden cases for all)."""
    rules = judge.load(assignment)
    cases = judge.hidden_cases(rules, judge.REFERENCE_KEY)
    givens = course.givens_for(assignment, student)
    out = []
    for gid in reference:
        pairs, error = values.get(gid, ([], None))
        out.append(judge.judge_cell(rules, gid, [tuple(p) for p in pairs],
                                    [tuple(p) for p in reference[gid]], error, cases.get(gid),
                                    cases.get(gid), givens))
    return out


def grade(assignment: str, data: Path, students: dict[str, tuple[nbformat.NotebookNode, dict]],
          reference: dict[str, list]) -> None:
    """Write, for each ``{student: (submitted notebook, values)}``, what a grading run leaves:
    ``submitted/`` (the notebook: the report scans it), ``autograded/`` (the release's
    metadata put back, each test cell's outputs the judge's verdict), the judge log and the
    digests."""
    [name] = course.notebook_names(assignment)
    release = course.release_notebook(assignment, name)
    for student, (nb, values) in students.items():
        found = verdicts(assignment, student, values, reference)
        by_id = {v.grade_id: v for v in found}
        sub = data / "submitted" / student / assignment
        sub.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, sub / name)
        graded = copy.deepcopy(nb)
        course.restore_metadata(graded, release)
        for cell in graded.cells:
            verdict = by_id.get(course._meta(cell).get("grade_id")) \
                if course.is_test_cell(cell) else None
            if verdict is None:
                continue
            error = values.get(verdict.grade_id, ([], None))[1]
            if verdict.passed:
                cell.outputs = [new_output("stream", name="stdout", text=(
                    f"passed: {verdict.submitted} values judged by the grader\n"))]
            else:
                ename, evalue = error if error else ("AssertionError", verdict.message)
                cell.outputs = [new_output("error", ename=ename, evalue=evalue,
                                           traceback=[f"{ename}: {evalue}"])]
        auto = data / "autograded" / student / assignment
        auto.mkdir(parents=True, exist_ok=True)
        nbformat.write(graded, auto / name)
        drawn = set(getattr(judge.load(assignment), "HIDDEN_CASES", {}))
        failed = {v.grade_id: values[v.grade_id][0] for v in found if not v.passed
                  and v.grade_id not in drawn and values.get(v.grade_id, ([], "x"))[1] is None}
        givens = course.givens_for(assignment, student)
        judge.write_log(judge.log_path(data, assignment, student, name), found, ISOLATION, [],
                        failed, getattr(givens, "variant", None), seconds=0.0)
    record_digests(assignment, list(students), data, finished=list(students))


__all__ = ["ISOLATION", "VALUE_KINDS", "grade", "right_pairs", "values_for", "verdicts"]

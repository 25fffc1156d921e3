"""Verdicts: one student's verified result, from the judge log and the autograded notebook.

The score is the judge's (``grading.judge``); nbgrader's own score (from the outputs the judge
wrote) must agree, and a disagreement, or a test cell the judge never saw, is flagged and
scored 0. "No submission", "notebook missing", "not a valid notebook" and "autograde failed"
are statuses, never a 0. Every text a student could have written into a result is one line
(:func:`_inert`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from grading import judge
from grading.course import (ROOT, _meta, data_dir, is_test_cell, notebook_names, read_notebook,
                            roster, unreadable)
from grading.digests import not_graded_reasons
from grading.files import entry_kind, read_regular
from grading.inert import one_line
from grading.scan import identity_flags, scan_files, scan_notebook

# ------------------------------------------------------------------------------ verdicts


@dataclass
class CellResult:
    """One test cell of one student: the judge's verdict and nbgrader's score."""

    grade_id: str
    max_score: float
    kernel_score: float      # what nbgrader saved (from the outputs the judge wrote)
    score: float             # the judge's
    message: str = ""        # the mistake the judge named
    problems: list[str] = field(default_factory=list)


@dataclass
class StudentResult:
    """One student's result for one assignment."""

    student: str
    status: str              # "graded" or "not graded: <reason>"
    score: float | None = None
    kernel_score: float | None = None
    max_score: float = 0.0
    manual_pending: float = 0.0
    cells: list[CellResult] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    limits: list[str] = field(default_factory=list)  # grading limits that fired (judge log)
    seconds: float | None = None  # running and judging its notebooks took (judge log)

    @property
    def graded(self) -> bool:
        return self.status == "graded"

    @property
    def failed_cells(self) -> list[CellResult]:
        return [c for c in self.cells if c.score < c.max_score]


def verify_cell(cell, verdict: judge.Verdict | None) -> CellResult:
    """One autograded test cell: the judge's verdict, checked against what nbgrader scored."""
    from nbgrader.utils import determine_grade

    kernel, max_score = determine_grade(cell)
    kernel, max_score = float(kernel or 0.0), float(max_score)
    gid = _meta(cell)["grade_id"]
    if verdict is None:
        return CellResult(gid, max_score, kernel, 0.0, "the judge never saw this cell",
                          ["the judge never saw this cell (not graded through the judge?)"])
    result = CellResult(gid, max_score, kernel, max_score if verdict.passed else 0.0,
                        verdict.message)
    if result.score != kernel:
        result.problems.append(f"nbgrader scored {kernel:g}, the judge {result.score:g}")
    return result


def _roster(assignment: str, data: Path) -> list[str]:
    """Everyone a report lists: the students with a submitted folder, the gradebook's, the
    roster's (``$COURSE_DATA/roster.csv``) and those collect found nothing of this assignment
    for (a misnamed notebook): nobody on the roster vanishes from a report or an export."""
    students = {p.name for p in (data / "submitted").glob("*") if entry_kind(p) == "dir"}
    students |= set(roster(data)) | set(collect_log(assignment, data))
    db = data / "gradebook.db"
    if db.exists():
        from nbgrader.api import Gradebook

        with Gradebook(f"sqlite:///{db}") as gb:
            students |= {s.id for s in gb.students}
    return sorted(students)


def verify_student(assignment: str, student: str, data: Path) -> StudentResult:
    """The verified result of one student (see the module doc for the rules). Whatever the
    submission holds, this returns a result: a failure of the grader itself on it is that
    student's 0, with the reason as a flag (never a crash of the report for everyone)."""
    try:
        return _inert(_verify_student(assignment, student, data))
    except Exception as err:  # noqa: BLE001 - RecursionError, MemoryError, a broken file
        release = nbformat.read(ROOT / "assignments" / assignment /
                                notebook_names(assignment)[0], as_version=4)
        points = sum(float(_meta(c).get("points", 0)) for c in release.cells if is_test_cell(c))
        return StudentResult(student, "graded", score=0.0, kernel_score=None,
                             max_score=points, flags=[
                                 f"the grader failed on this submission ({type(err).__name__}: "
                                 f"{str(err)[:200]}); scored 0: review it by hand"])


def _inert(result: StudentResult) -> StudentResult:
    """``result`` with every text a student could have written into it (an exception's name
    and message, a file or metadata name, a flagged line) as one line, control characters
    escaped: no report line can be forged or hidden (``grading.inert.one_line``)."""
    result.status = one_line(result.status)
    result.flags = [one_line(f) for f in result.flags]
    result.limits = [one_line(x) for x in result.limits]
    for cell in result.cells:
        cell.message = one_line(cell.message)
        cell.problems = [one_line(p) for p in cell.problems]
    return result


def collect_log(assignment: str, data: Path | None = None) -> dict[str, list[str]]:
    """What the last ``collect`` of ``assignment`` skipped, per student (empty if none)."""
    path = (data or data_dir()) / "logs" / f"collect-{assignment}.json"
    if entry_kind(path) != "file":
        return {}
    return json.loads(read_regular(path, 10_000_000))


def _verify_student(assignment: str, student: str, data: Path) -> StudentResult:
    names = notebook_names(assignment)
    sub = data / "submitted" / student / assignment
    auto = data / "autograded" / student / assignment
    result = StudentResult(student, "graded")
    if entry_kind(sub) != "dir":
        why = collect_log(assignment, data).get(student, [])
        result.status = "not graded: no submission" + (f" ({why[0]})" if why else "")
        return result
    result.flags += scan_files(sub, names)
    result.flags += [f"collect skipped {line}" for line in
                     collect_log(assignment, data).get(student, [])]
    rules = judge.load(assignment)
    for name in names:
        release = nbformat.read(ROOT / "assignments" / assignment / name, as_version=4)
        if entry_kind(sub / name) == "missing":
            others = sorted(p.name for p in sub.glob("*.ipynb"))
            result.status = (f"not graded: notebook {name} missing"
                             + (f" (found {', '.join(others)})" if others else ""))
            return result
        try:
            submitted = read_notebook(sub / name)
        except Exception as err:  # malformed JSON, not a notebook, not a regular file
            why = unreadable(sub / name, err)
            result.status = f"not graded: {name} is not a valid notebook ({why})"
            return result
        result.flags += scan_notebook(submitted, release,
                                      getattr(rules, "HELPERS_NOT_ALLOWED", {}))
        result.flags += identity_flags(assignment, student, submitted)
        if entry_kind(auto / name) != "file":
            why = not_graded_reasons(assignment, data).get(student)
            result.status = f"not graded: {why or 'autograde failed (see the autograde log)'}"
            return result
        graded = read_notebook(auto / name)
        log = judge.log_path(data, assignment, student, name)
        verdicts = judge.read_log(log) if entry_kind(log) == "file" else {}
        result.limits += judge.read_limits(log) if entry_kind(log) == "file" else []
        took = judge.read_seconds(log) if entry_kind(log) == "file" else None
        if took is not None:
            result.seconds = (result.seconds or 0.0) + took
        for cell in graded.cells:
            m = _meta(cell)
            if is_test_cell(cell):
                res = verify_cell(cell, verdicts.get(m["grade_id"]))
                result.cells.append(res)
                result.flags += [f"{res.grade_id}: {p}" for p in res.problems]
            elif m.get("grade") and m.get("solution"):
                result.manual_pending += float(m.get("points", 0))
    result.max_score = sum(c.max_score for c in result.cells)
    result.kernel_score = sum(c.kernel_score for c in result.cells)
    result.score = sum(c.score for c in result.cells)
    return result


def condense(flags: list[str]) -> list[str]:
    """Merge flags that differ only by cell and line: "assigns to math.isclose (cells q1,
    q2)", "nbgrader metadata edited (points) (cells q1, q1_test)"."""
    import re

    groups: dict[str, list[str]] = {}
    for flag in flags:
        m = re.match(r"cell (\S+?)(?:, line \S+)?: (.*)", flag)
        if m:
            groups.setdefault(m.group(2), [])
            if m.group(1) not in groups[m.group(2)]:
                groups[m.group(2)].append(m.group(1))
        else:
            groups.setdefault(flag, [])
    return [f"{text} (cells {', '.join(cells)})" if cells else text
            for text, cells in groups.items()]

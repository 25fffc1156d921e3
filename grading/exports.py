"""The records an instructor hands on: the grade exports.

:func:`export` writes, into ``$COURSE_DATA``, sorted by assignment and student:

* ``grades.csv``: nbgrader's export (manual points included) with a ``status`` column; a
  student who could not be graded has ``not graded: <why>`` there and empty scores, never 0;
* ``grades_verified.csv``: per assignment and student, the status, the verified autograded
  score (the judge's), nbgrader's, and the number of flags;
* ``grades_lms.csv``: one row per student, the columns a learning-management system's
  gradebook import reads (Canvas: ``Student``, ``ID``, ``SIS User ID``, ``SIS Login ID``,
  ``Section``, then one column per assignment; Moodle maps any column to a user field), each
  assignment's total (automatic and manual points) where it is final; a cell is left empty
  where the student was not graded or written answers wait for the instructor, and
  ``grades_lms_notes.csv`` says why, per student and assignment (and, where a total is there,
  which written answers were left blank and counted 0).

Every student of the roster, or that collect found a folder of, has a row in each, with their
status ("not graded: no submission (notebook a1.ipynb missing (found Untitled.ipynb))").

The students' names come from ``$COURSE_DATA/roster.csv`` where it exists
(``grading.course.roster``).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from grading.course import data_dir, roster
from grading.files import write_private


def _write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    with io.StringIO(newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
        write_private(path, f.getvalue(), mode=0o644)
    return path


def export(data: Path | None = None) -> dict[str, Path]:
    """Write the exports of every assignment with submissions (see the module doc); returns
    ``{name: path}``."""
    from nbgrader.api import Gradebook

    from grading import report, workflow

    data = data or data_dir()
    raw = data / "grades-nbgrader.csv"
    workflow.nbgrader("export", f"--to={raw}", data=data)
    results = {}
    for a in workflow.all_assignments():
        if workflow.collected(a, data):
            results[a] = {r.student: r for r in report.report(a, data)[0]}
    status = {(a, s): r.status for a, rs in results.items() for s, r in rs.items()}
    # nbgrader's export, with the status; scores empty where the student was not graded
    with raw.open(newline="") as f:
        rows = list(csv.DictReader(f))
    raw.unlink()
    header = list(rows[0]) if rows else ["assignment", "student_id", "score", "max_score"]
    out_rows = []
    for row in rows:
        st = status.get((row.get("assignment"), row.get("student_id")), "graded")
        if st != "graded":
            for key in ("raw_score", "late_submission_penalty", "score"):
                if key in row:
                    row[key] = ""
        out_rows.append([*(row[k] for k in header), st])
    # a student nbgrader never saw (on the roster, nothing collected): a row all the same
    seen = {(row.get("assignment"), row.get("student_id")) for row in rows}
    names = roster(data)
    for (a, s), st in sorted(status.items()):
        if (a, s) not in seen:
            known = {"assignment": a, "student_id": s, **names.get(s, {})}
            out_rows.append([known.get(k) or "" for k in header] + [st])
    out_rows.sort(key=lambda r: (r[header.index("assignment")], r[header.index("student_id")]))
    paths = {"grades.csv": _write_csv(data / "grades.csv", [*header, "status"], out_rows)}
    verified = [[a, s, r.status, "" if r.score is None else f"{r.score:g}",
                 f"{r.max_score:g}" if r.graded else "",
                 "" if r.kernel_score is None else f"{r.kernel_score:g}", len(r.flags)]
                for a, rs in sorted(results.items()) for s, r in sorted(rs.items())]
    paths["grades_verified.csv"] = _write_csv(
        data / "grades_verified.csv", ["assignment", "student", "status", "score", "max_score",
                                       "nbgrader_score", "flags"], verified)
    # one row per student, one column per assignment: what an LMS imports
    totals: dict[tuple[str, str], float] = {}
    pending: set[tuple[str, str]] = set()
    blank: dict[tuple[str, str], list[str]] = {}  # written answers left blank (nbgrader: 0)
    with Gradebook(f"sqlite:///{data / 'gradebook.db'}") as gb:
        maxima = {a: gb.find_assignment(a).max_score for a in results}
        for a, rs in results.items():
            for s, r in rs.items():
                if r.graded:
                    sub = gb.find_submission(a, s)
                    if sub.needs_manual_grade:
                        pending.add((a, s))
                    blank[(a, s)] = sorted(
                        g.name for nb in sub.notebooks for g in nb.grades
                        if g.cell_type == "markdown" and g.manual_score is None
                        and not g.needs_manual_grade and not g.auto_score)
                    # the judge's automatic points, and the points given by hand
                    totals[(a, s)] = (r.score or 0.0) + max(0.0, sub.score - sub.code_score)
    students = sorted({s for rs in results.values() for s in rs})
    lms, notes = [], []
    for s in students:
        who = names.get(s, {})
        name = ", ".join(x for x in (who.get("last_name"), who.get("first_name")) if x) or s
        row = [name, "", s, s, ""]
        for a in sorted(results):
            r = results[a].get(s)
            if r is None:
                row.append("")
                notes.append([s, a, "no submission"])
            elif not r.graded:
                row.append("")
                notes.append([s, a, r.status])
            elif (a, s) in pending:
                row.append("")
                notes.append([s, a, f"written answers not graded yet (the formgrader): the "
                                    f"automatic part is {r.score:g}"])
            else:
                row.append(f"{totals[(a, s)]:g}")
                if blank.get((a, s)):
                    notes.append([s, a, f"written answers left blank, counted 0 (nbgrader "
                                        f"grades a blank answer itself): "
                                        f"{', '.join(blank[(a, s)])}"])
        lms.append(row)
    paths["grades_lms.csv"] = _write_csv(
        data / "grades_lms.csv", ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
        + [f"{a} ({maxima[a]:g} points)" for a in sorted(results)], lms)
    paths["grades_lms_notes.csv"] = _write_csv(data / "grades_lms_notes.csv",
                                               ["student", "assignment", "note"], notes)
    return paths


__all__ = ["export"]

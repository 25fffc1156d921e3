"""The report: every student's verified result, the class as a whole, copied answers.

The last stage: :func:`verify_assignment` verifies every student on the roster
(``grading.verify``) and adds the copied-answer evidence (``grading.copies``, from the failed
cells' values the judge logged); :func:`report` writes ``reports/<assignment>.csv``, ``.txt``
(the class summary, then every student) and ``.html`` (``grading.class_report``), once the
digests say no result changed since grading (``grading.digests``).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from grading import class_report, copies, judge
from grading.course import data_dir, givens_for, notebook_names
from grading.digests import check_digests
from grading.files import entry_kind, write_private
from grading.inert import lines as inert_lines
from grading.reference import reference_run
from grading.verify import StudentResult, _roster, condense, verify_student


def copied_answers(assignment: str, results: list[StudentResult],
                   data: Path) -> list[list[str]]:
    """Per student (in ``results``' order): the copied-answer evidence of ``grading.copies``,
    from the values of each failed cell the judge logged and the student's own numbers."""
    if givens_for(assignment, None) is None or len(results) < 2:
        return [[] for _ in results]
    students = {}
    for r in results:
        if not r.graded:
            continue
        failed: dict[str, list] = {}
        for name in notebook_names(assignment):
            path = judge.log_path(data, assignment, r.student, name)
            if entry_kind(path) == "file":
                failed.update(judge.read_values(path)[1])
        wrong = {c.grade_id for c in r.failed_cells}
        students[r.student] = (givens_for(assignment, r.student),
                               {g: p for g, p in failed.items() if g in wrong},
                               [c.grade_id for c in r.cells if c.grade_id not in wrong])
    reference = {gid: pairs for run in reference_run(assignment, data).values()
                 for gid, pairs in run["submissions"].items()}
    try:
        found = copies.evidence(assignment, students, reference)
    except Exception as err:  # noqa: BLE001 - the evidence never stops the report
        found = {s: [f"could not compare the class's answers ({type(err).__name__}): review "
                     "by hand"] for s in students}
    return [found.get(r.student, []) for r in results]


def verify_assignment(assignment: str, data: Path | None = None,
                      students: list[str] | None = None) -> list[StudentResult]:
    """Verified results of every student on the roster (or of ``students``), with the
    copied-answer evidence (:func:`copied_answers`) among them."""
    data = data or data_dir()
    results = [verify_student(assignment, s, data) for s in (students or _roster(assignment, data))]
    for result, flags in zip(results, copied_answers(assignment, results, data), strict=True):
        result.flags += flags
    return results


def report(assignment: str, data: Path | None = None, students: list[str] | None = None,
           html: bool = True) -> tuple[list[StudentResult], Path]:
    """Write ``reports/<assignment>.csv``, ``.txt`` (the class summary, then every student) and,
    with ``html``, ``.html`` (the class report as a page with its figure:
    ``grading.class_report``; ``make check``'s class of one has no use for it); returns the
    results and the CSV path."""
    data = data or data_dir()
    book = check_digests(assignment, data)
    results = verify_assignment(assignment, data, students)
    out = data / "reports"
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / f"{assignment}.csv"
    with io.StringIO(newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "status", "score", "max_score", "nbgrader_score",
                    "manual_points_pending", "failed_cells", "mistakes", "flags", "limits"])
        for r in results:
            w.writerow([r.student, r.status,
                        "" if r.score is None else f"{r.score:g}",
                        f"{r.max_score:g}" if r.graded else "",
                        "" if r.kernel_score is None else f"{r.kernel_score:g}",
                        f"{r.manual_pending:g}" if r.graded else "",
                        " ".join(c.grade_id for c in r.failed_cells),
                        " | ".join(f"{c.grade_id}: {c.message}" for c in r.failed_cells
                                   if c.message),
                        " | ".join(condense(r.flags)), " | ".join(r.limits)])
        write_private(csv_path, f.getvalue(), mode=0o644)
    summary = class_report.summarize(assignment, results)
    write_private(out / f"{assignment}.txt",
                  render_text(assignment, results, book["isolation"],
                              class_summary=class_report.render_text(summary)), mode=0o644)
    if html:
        write_private(out / f"{assignment}.html",
                      class_report.render_html(summary, results, book["isolation"]), mode=0o644)
    return results, csv_path


def render_text(assignment: str, results: list[StudentResult], isolation: str = "",
                class_summary: str = "") -> str:
    """The report as plain text, one block per student (after ``class_summary``, the class
    report's text, when given: ``grading.class_report``)."""
    lines = [f"Assignment {assignment}: {len(results)} students", ""]
    if isolation:
        lines += [f"grading kernels: {isolation}", ""]
    graded = [r for r in results if r.graded]
    not_graded = [r for r in results if not r.graded]
    flagged = [r for r in results if r.flags]
    lines.append(f"graded {len(graded)}, NOT graded {len(not_graded)}, flagged {len(flagged)}")
    lines.append("(score = autograded points as the judge decided them outside the kernels; "
                 "manual questions are graded in the formgrader)")
    lines.append("")
    if class_summary:
        lines += [class_summary.rstrip("\n"), "", "EVERY STUDENT", ""]
    for r in results:
        if not r.graded:
            lines.append(f"{r.student}: NOT GRADED ({r.status.split(': ', 1)[-1]})")
        else:
            note = "" if r.score == r.kernel_score else f" (nbgrader said {r.kernel_score:g})"
            lines.append(f"{r.student}: {r.score:g} / {r.max_score:g}{note}"
                         + (f", {r.manual_pending:g} manual points to grade"
                            if r.manual_pending else ""))
            for c in r.failed_cells:
                lines.append(f"    failed {c.grade_id} ({c.score:g}/{c.max_score:g}): "
                             f"{c.message or 'no message'}")
        for flag in condense(r.flags):
            lines.append(f"    FLAG {flag}")
        for limit in r.limits:
            lines.append(f"    LIMIT {limit}")
        lines.append("")
    # every line is one line, whatever a student wrote into it (the class summary's own lines
    # were assembled the same way); the report's own line breaks are the only ones
    return inert_lines("\n".join(lines))

#!/usr/bin/env python
"""One command per grading step, for one assignment or ``all`` (run from anywhere).

    python scripts/grade.py release    a1_training_state|all   # regenerate assignments/
    python scripts/grade.py collect    DIR a1_training_state|all
    python scripts/grade.py autograde  a1_training_state|all [--workers 2] [--timeout 60]
    python scripts/grade.py feedback   a1_training_state|all
    python scripts/grade.py report     a1_training_state|all
    python scripts/grade.py export
    python scripts/grade.py check      a3_zero [--notebook PATH]  # self-study: grade my copy

Student data lives in $COURSE_DATA (default .course_data/ in the repository, ignored by git).
``autograde`` also writes the integrity report (``report`` rewrites it). See docs/instructor.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)

from grading import integrity, workflow  # noqa: E402


def _summary(assignment: str) -> None:
    results, csv_path = integrity.report(assignment)
    graded = [r for r in results if r.graded]
    flagged = [r for r in results if r.flags]
    print(f"{assignment}: {len(graded)} graded, {len(results) - len(graded)} NOT graded, "
          f"{len(flagged)} flagged -> {csv_path} and {csv_path.with_suffix('.txt')}")
    for r in results:
        if not r.graded:
            print(f"  {r.student}: {r.status}")
        elif r.flags or r.score != r.kernel_score:
            print(f"  {r.student}: {r.score:g}/{r.max_score:g} (nbgrader {r.kernel_score:g}), "
                  f"{len(r.flags)} flag(s)")


def _print_check(result) -> None:
    """One line per graded question: right, or wrong with the judge's message."""
    if not result.graded:
        print(f"  not graded: {result.status.split(': ', 1)[-1]}")
        return
    for cell in result.cells:
        mark = "right" if cell.score == cell.max_score else "WRONG"
        line = f"  {cell.grade_id} ({cell.score:g}/{cell.max_score:g}): {mark}"
        print(line + (f": {cell.message}" if cell.score < cell.max_score and cell.message else ""))
    print(f"  autograded: {result.score:g} / {result.max_score:g}"
          + (f"; {result.manual_pending:g} more points are written answers an instructor grades"
             if result.manual_pending else ""))
    for limit in result.limits:
        print(f"  note: {limit}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("release", help="regenerate assignments/<a>/ from solutions/<a>/")
    p.add_argument("assignment")
    p = sub.add_parser("collect", help="copy DIR/<student>/<a>.ipynb or DIR/<student>/<a>/ "
                                       "into $COURSE_DATA/submitted")
    p.add_argument("source", type=Path)
    p.add_argument("assignment")
    p = sub.add_parser("autograde", help="grade every collected submission, then report")
    p.add_argument("assignment")
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                   help="parallel nbgrader processes (default: 2)")
    p.add_argument("--timeout", type=int, default=None,
                   help="seconds per cell (default: nbgrader_config.py's 60)")
    p.add_argument("--student", action="append", help="only this student (repeatable)")
    p = sub.add_parser("feedback", help="HTML feedback per student")
    p.add_argument("assignment")
    p = sub.add_parser("report", help="re-check grades outside the kernel; CSV + text report")
    p.add_argument("assignment")
    sub.add_parser("export", help="grades.csv (nbgrader) and grades_verified.csv")
    p = sub.add_parser("check", help="self-study: grade your own copy of one assignment as the "
                                     "instructor's grading would, and say what is right")
    p.add_argument("assignment")
    p.add_argument("--notebook", type=Path, default=None,
                   help="default: workspace/assignments/<a>/<a>.ipynb")
    args = parser.parse_args(argv)

    data = integrity.data_dir()
    try:
        if args.step == "release":
            for path in workflow.release(args.assignment):
                print(f"released {path.relative_to(ROOT)}")
        elif args.step == "collect":
            got = workflow.collect(args.source, args.assignment)
            for a, students in got.items():
                print(f"{a}: collected {len(students)} submission(s) into {data / 'submitted'}")
            if not got:
                print(f"nothing found for {args.assignment} in {args.source}")
                return 1
        elif args.step == "autograde":
            for a in workflow.expand(args.assignment):
                if not workflow.submitted_students(a):
                    print(f"{a}: no submissions in {data / 'submitted'} (run collect first)")
                    continue
                run = workflow.autograde(a, workers=args.workers, timeout=args.timeout,
                                         students=args.student)
                print(f"{a}: autograded {run.students} submission(s) with {run.workers} "
                      f"worker(s) in {run.seconds:.1f} s (logs: {data / 'logs'})")
                _summary(a)
        elif args.step == "feedback":
            out = workflow.feedback(args.assignment)
            print(f"feedback in {out}/<student>/<assignment>/")
        elif args.step == "report":
            for a in workflow.expand(args.assignment):
                _summary(a)
        elif args.step == "export":
            plain, verified = workflow.export()
            print(f"wrote {plain} and {verified}")
        elif args.step == "check":
            print(f"{args.assignment}: grading your notebook as the course's grading does "
                  "(in its sandbox; about a minute)...", flush=True)
            _print_check(workflow.self_check(args.assignment, args.notebook))
    except (ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

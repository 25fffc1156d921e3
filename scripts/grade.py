#!/usr/bin/env python
"""One command per grading step, for one assignment or ``all`` (run from anywhere).

    python scripts/grade.py release    a1_training_state|all   # regenerate assignments/
    python scripts/grade.py collect    DIR a1_training_state|all
    python scripts/grade.py autograde  a1_training_state|all [--workers 2] [--timeout 60]
    python scripts/grade.py autograde  a1_training_state --executor slurm   # a Slurm job array
    python scripts/grade.py merge      a1_training_state|all   # merge finished Slurm tasks
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
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)

from grading import integrity, workflow  # noqa: E402
from grading.inert import one_line  # noqa: E402


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


def _print_check(result, questions: bool = True) -> None:
    """One line per graded question (unless they were printed as they were judged): right, or
    wrong with the judge's message; then the total and the limits that fired."""
    if not result.graded:
        print(f"  not graded: {result.status.split(': ', 1)[-1]}")
        return
    for cell in result.cells if questions else []:
        mark = "right" if cell.score == cell.max_score else "WRONG"
        line = f"  {cell.grade_id} ({cell.score:g}/{cell.max_score:g}): {mark}"
        print(line + (f": {cell.message}" if cell.score < cell.max_score and cell.message else ""))
    print(f"  autograded: {result.score:g} / {result.max_score:g}"
          + (f"; {result.manual_pending:g} more points are written answers an instructor grades"
             if result.manual_pending else ""))
    for limit in result.limits:
        print(f"  note: {limit}")


def _autograde_slurm(assignment: str, args) -> bool:
    """``autograde --executor slurm``: submit, wait, merge (or submit a merge job); prints what
    happened. False when nothing was left to grade and nothing was submitted."""
    for flag in ("max_running", "time_limit"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    try:
        sbatch_args = shlex.split(args.slurm_args)
    except ValueError as err:
        raise ValueError(f"--slurm-args must be sbatch options as a shell would split them "
                         f"({err}): {args.slurm_args!r}") from None
    from grading import slurm_executor

    run = slurm_executor.autograde(assignment, timeout=args.timeout, students=args.student,
                                   max_running=args.max_running,
                                   time_limit_min=args.time_limit, sbatch_args=sbatch_args,
                                   wait=not args.no_wait, regrade=args.regrade)
    if run.job is None:
        print(f"{assignment}: every submission is graded already (--regrade grades them again)")
        return True
    if run.merge_job is not None:
        print(f"{assignment}: submitted {run.students} submission(s) as Slurm array {run.job}; "
              f"job {run.merge_job} merges and reports when it ends (logs: {run.run_dir}/logs)")
        return False
    merged = run.merged
    print(f"{assignment}: graded {len(merged.finished)} of {run.students} submission(s) as "
          f"Slurm array {run.job} in {run.waited_s:.1f} s, merged in {merged.seconds:.1f} s "
          f"(logs: {run.run_dir}/logs)")
    return True


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
    p.add_argument("--executor", choices=workflow.EXECUTORS, default="local",
                   help="local: nbgrader workers on this machine (default); slurm: one Slurm "
                        "array task per submission, then a merge (grades only the submissions "
                        "not graded yet unless --regrade or --student)")
    p.add_argument("--regrade", action="store_true",
                   help="slurm: grade every submission again, not only the missing ones")
    p.add_argument("--max-running", type=int, default=None,
                   help="slurm: at most this many array tasks at once")
    p.add_argument("--time-limit", type=int, default=None,
                   help="slurm: minutes per task (default: the local worker's own limit + 5)")
    p.add_argument("--slurm-args", default="",
                   help='slurm: more sbatch options, e.g. "--partition=cpu --mem=8G"')
    p.add_argument("--no-wait", action="store_true",
                   help="slurm: submit the array and a dependent merge job, then return")
    p = sub.add_parser("merge", help="slurm: merge the finished array tasks into the gradebook "
                                     "and the results, then report")
    p.add_argument("assignment")
    p = sub.add_parser("feedback", help="HTML feedback per student")
    p.add_argument("assignment")
    p = sub.add_parser("report", help="re-check grades outside the kernel; CSV + text report")
    p.add_argument("assignment")
    sub.add_parser("export", help="grades.csv (nbgrader's, with the status), grades_verified.csv, "
                                  "grades_lms.csv (for Canvas or Moodle) and its notes")
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
            for a in sorted(set(got) | set(got.missing)):
                print(f"{a}: collected {len(got.get(a, []))} submission(s) into "
                      f"{data / 'submitted'}")
                for student, why in sorted(got.missing.get(a, {}).items()):
                    print(f"  {student}: {why}")
            for who, lines in sorted(got.skipped.items()):
                for line in lines:
                    print(f"  {who}: skipped {one_line(line, 200)}")
            if not got:
                print(f"nothing found for {args.assignment} in {args.source}")
                return 1
        elif args.step == "autograde":
            for a in workflow.expand(args.assignment):
                if not workflow.submitted_students(a):
                    print(f"{a}: no submissions in {data / 'submitted'} (run collect first)")
                    continue
                if args.executor == "slurm":
                    if not _autograde_slurm(a, args):
                        continue
                else:
                    run = workflow.autograde(a, workers=args.workers, timeout=args.timeout,
                                             students=args.student)
                    print(f"{a}: autograded {run.students} submission(s) with {run.workers} "
                          f"worker(s) in {run.seconds:.1f} s (logs: {data / 'logs'})")
                _summary(a)
        elif args.step == "merge":
            from grading import slurm_executor

            for a in workflow.expand(args.assignment):
                merged = slurm_executor.merge(a)
                print(f"{a}: merged {len(merged.finished)} finished Slurm task(s) from "
                      f"{len(merged.runs)} array(s)"
                      + (f"; {len(merged.active)} still pending or running"
                         if merged.active else ""))
                if merged.runs or merged.finished:
                    _summary(a)
        elif args.step == "feedback":
            out = workflow.feedback(args.assignment)
            print(f"feedback in {out}/<student>/<assignment>/")
            for a, student, name in workflow.FEEDBACK_FALLBACKS:
                print(f"  {a} {student} {name}: nbgrader could not render this page; a short "
                      f"page with the points was written instead (see "
                      f"logs/feedback-{a}.log)")
        elif args.step == "report":
            chosen = workflow.expand(args.assignment)
            for a in chosen:  # (all: only the assignments collected so far)
                if workflow.collected(a):
                    _summary(a)
                elif args.assignment != "all":
                    print(f"{a}: nothing collected yet (run collect first)")
            if args.assignment == "all" and not any(map(workflow.collected, chosen)):
                print("nothing collected yet (run collect first)")
        elif args.step == "export":
            from grading import exports

            paths = exports.export()
            print("wrote " + ", ".join(str(p) for p in paths.values()))
        elif args.step == "check":
            print(f"{args.assignment}: grading your notebook as the course's grading does, in "
                  "its sandbox; each question as it is judged:", flush=True)
            started = time.monotonic()
            shown: list[str] = []
            result = workflow.self_check(args.assignment, args.notebook, progress=lambda line: (
                shown.append(line), print(line, flush=True)))
            _print_check(result, questions=not shown)
            print(f"  ({time.monotonic() - started:.0f} s)")
    except (ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

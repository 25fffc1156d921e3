"""The instructor's steps: release, collect, autograde (in parallel), feedback, export, report.

Each function runs nbgrader from the repository root with the course's ``nbgrader_config.py``
(student data in ``$COURSE_DATA``). ``scripts/grade.py`` is the command-line face of this module.

Parallel autograde: the students are split into ``workers`` shards; each shard is one
``nbgrader autograde`` process (one start-up cost, then one kernel per notebook) limited to its
students with ``--CourseDirectory.student_id_exclude``. All shards write the one sqlite gradebook:
nbgrader opens a short session per write, and sqlite serializes the writers (measured: no
"database is locked" with 2 and 4 workers, see ``benchmarks/grading.py``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from grading import sandbox
from grading.integrity import (ROOT, data_dir, notebook_names, record_digests, reference_run,
                               report)

NBGRADER = [sys.executable, "-m", "nbgrader"]


def all_assignments() -> list[str]:
    """Every assignment that has a source folder in ``solutions/``."""
    return sorted(p.name for p in (ROOT / "solutions").iterdir()
                  if p.is_dir() and list(p.glob("*.ipynb")))


def expand(assignment: str) -> list[str]:
    """``"all"`` -> every assignment; otherwise the one name (checked)."""
    if assignment == "all":
        return all_assignments()
    if assignment not in all_assignments():
        raise ValueError(f"assignment must be 'all' or one of {all_assignments()}, "
                         f"got {assignment!r}")
    return [assignment]


def nbgrader(*args: str, data: Path | None = None, log: Path | None = None,
             check: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run one nbgrader command from the repo root (output to ``log`` if given)."""
    env = dict(os.environ, COURSE_DATA=str(data or data_dir()))
    kw = {"cwd": ROOT, "env": env, "timeout": timeout, "text": True}
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as f:
            out = subprocess.run([*NBGRADER, *args], stdout=f, stderr=subprocess.STDOUT, **kw)
    else:
        out = subprocess.run([*NBGRADER, *args], capture_output=True, **kw)
    if check and out.returncode != 0:
        text = log.read_text()[-4000:] if log else (out.stdout + out.stderr)[-4000:]
        raise RuntimeError(f"nbgrader {' '.join(args)} failed ({out.returncode}):\n{text}")
    return out


def release(assignment: str, data: Path | None = None) -> list[Path]:
    """Regenerate ``assignments/<a>/`` from ``solutions/<a>/`` and register it in the gradebook."""
    paths = []
    for a in expand(assignment):
        nbgrader("generate_assignment", a, "--force", data=data)
        paths += [ROOT / "assignments" / a / n for n in notebook_names(a)]
    return paths


def register(assignment: str, data: Path | None = None, release_dir: Path | None = None) -> None:
    """Put the assignment into the gradebook without touching ``assignments/`` (for autograde).

    The release nbgrader generates on the way goes to ``release_dir`` if given (kept), else to
    a temporary folder.
    """
    if release_dir is not None:
        nbgrader("generate_assignment", assignment, "--force",
                 f"--CourseDirectory.release_directory={Path(release_dir).resolve()}", data=data)
        return
    with tempfile.TemporaryDirectory() as tmp:
        register(assignment, data, Path(tmp))


def collect(source: Path, assignment: str, data: Path | None = None) -> dict[str, list[str]]:
    """Copy student notebooks from ``source`` into ``$COURSE_DATA/submitted``.

    Accepted layouts (student = first folder level):
    ``<source>/<student>/<assignment>.ipynb`` and ``<source>/<student>/<assignment>/...``
    (the whole folder is copied, so extra files are kept for the integrity scan).
    Returns ``{assignment: [students collected]}``.
    """
    data = data or data_dir()
    source = Path(source)
    if not source.is_dir():
        raise ValueError(f"source must be a folder of student folders, got {source}")
    got: dict[str, list[str]] = {}
    for a in expand(assignment):
        names = notebook_names(a)
        for student_dir in sorted(p for p in source.iterdir() if p.is_dir()):
            student = student_dir.name
            target = data / "submitted" / student / a
            if (student_dir / a).is_dir():
                if target.exists():
                    shutil.rmtree(target)
                shutil.copytree(student_dir / a, target,
                                ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
                # nbgrader trusts timestamp.txt for late penalties: a student's own is discarded
                (target / "timestamp.txt").unlink(missing_ok=True)
            elif (student_dir / f"{a}.ipynb").exists() and len(names) == 1:
                if target.exists():
                    shutil.rmtree(target)
                target.mkdir(parents=True)
                shutil.copy2(student_dir / f"{a}.ipynb", target / names[0])
            else:
                continue
            got.setdefault(a, []).append(student)
    return got


def submitted_students(assignment: str, data: Path | None = None) -> list[str]:
    """Students with a folder ``$COURSE_DATA/submitted/<student>/<assignment>``."""
    data = data or data_dir()
    return sorted(p.parent.name for p in (data / "submitted").glob(f"*/{assignment}")
                  if p.is_dir())


@dataclass
class AutogradeRun:
    """What one parallel autograde did."""

    assignment: str
    students: int
    workers: int
    seconds: float
    returncodes: list[int]
    logs: list[Path]


def autograde(assignment: str, workers: int = 2, data: Path | None = None,
              students: list[str] | None = None, timeout: int | None = None,
              register_first: bool = True, reference_cache: Path | None = None) -> AutogradeRun:
    """Autograde every submission of one assignment with ``workers`` nbgrader processes.

    ``timeout`` overrides ``Execute.timeout`` (seconds per cell). Students are dealt to the
    workers in turn, in the order of ``students`` if given (put slow ones first to spread them),
    else alphabetically. Students that nbgrader cannot grade are left without an autograded
    notebook: :func:`grading.integrity.report` lists them as "not graded", never as 0.

    The reference solution runs first (or comes from its cache, ``reference_cache``, default
    ``$COURSE_DATA/reference``): the judge inside each nbgrader process compares with it.
    """
    data = data or data_dir()
    sandbox.require()  # refuse to grade unisolated unless the instructor said so
    everyone = submitted_students(assignment, data)
    chosen = list(dict.fromkeys(students)) if students is not None else everyone
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if register_first:
        register(assignment, data)
    cache = Path(reference_cache or data / "reference").resolve()
    reference_run(assignment, data, cache=cache)
    start = time.perf_counter()
    shards = [chosen[i::workers] for i in range(workers)]
    shards = [s for s in shards if s]
    procs, logs = [], []
    env = dict(os.environ, COURSE_DATA=str(data), COURSE_REFERENCE_CACHE=str(cache))
    for k, shard in enumerate(shards):
        exclude = sorted(set(everyone) - set(shard))
        args = [*NBGRADER, "autograde", assignment, "--create", "--force"]
        if exclude:
            args.append(f"--CourseDirectory.student_id_exclude={','.join(exclude)}")
        if timeout is not None:
            args.append(f"--Execute.timeout={int(timeout)}")
        log = data / "logs" / f"autograde-{assignment}-{k}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        f = log.open("w")
        procs.append((subprocess.Popen(args, cwd=ROOT, env=env, stdout=f,
                                       stderr=subprocess.STDOUT), f))
        logs.append(log)
    codes = []
    for proc, f in procs:
        codes.append(proc.wait())
        f.close()
    record_digests(assignment, chosen, data)
    return AutogradeRun(assignment, len(chosen), len(shards), time.perf_counter() - start,
                        codes, logs)


def feedback(assignment: str, data: Path | None = None) -> Path:
    """HTML feedback per student in ``$COURSE_DATA/feedback/<student>/<assignment>/``.

    Raises RuntimeError naming every autograded student who got no feedback page (nbgrader
    can fail for one notebook and still carry on, or fail entirely and say little).
    """
    data = data or data_dir()
    for a in expand(assignment):
        log = data / "logs" / f"feedback-{a}.log"
        out = nbgrader("generate_feedback", a, "--force", data=data, log=log, check=False)
        graded = sorted(p.parent.name for p in (data / "autograded").glob(f"*/{a}") if p.is_dir())
        missing = [s for s in graded for n in notebook_names(a)
                   if not (data / "feedback" / s / a / n.replace(".ipynb", ".html")).exists()]
        if missing:
            raise RuntimeError(
                f"nbgrader generate_feedback {a} (exit {out.returncode}) wrote no feedback for "
                f"{', '.join(sorted(set(missing)))}:\n{log.read_text()[-3000:]}")
    return data / "feedback"


def export(data: Path | None = None) -> tuple[Path, Path]:
    """``grades.csv`` (nbgrader's export) and ``grades_verified.csv`` (from the reports)."""
    import csv

    data = data or data_dir()
    out = data / "grades.csv"
    nbgrader("export", f"--to={out}", data=data)
    verified = data / "grades_verified.csv"
    with verified.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["assignment", "student", "status", "score", "max_score", "nbgrader_score",
                    "flags"])
        for a in all_assignments():
            if not submitted_students(a, data):
                continue
            results, _ = report(a, data)
            for r in results:
                w.writerow([a, r.student, r.status, "" if r.score is None else f"{r.score:g}",
                            f"{r.max_score:g}" if r.graded else "",
                            "" if r.kernel_score is None else f"{r.kernel_score:g}",
                            len(r.flags)])
    return out, verified

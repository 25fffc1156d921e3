"""Autograde as a Slurm job array: one array task per submission, then one merge.

    scripts/grade.py autograde a1_training_state --executor slurm     # submit, wait, merge, report
    scripts/grade.py autograde a1_training_state --executor slurm --no-wait   # + a merge job
    scripts/grade.py merge a1_training_state                          # merge what has finished

**Each task grades exactly as the local executor does**, because it *is* the local executor:
:func:`task` calls :func:`grading.workflow.autograde` with one worker and its one student, on a
course data folder of its own (``$COURSE_DATA/slurm/<assignment>/<run>/tasks/<i>/``) that holds
the course's secret (so the hidden cases drawn are the same), the gradebook as it was when the
array was submitted, and a copy of the student's submission (regular files only). The sandbox,
the judge, every limit and the reference run (read from the shared cache) are the local path's.

**The merge** (:func:`merge`: the command itself after waiting, or ``scripts/grade.py merge``, or
the dependent job that ``--no-wait`` submits) moves each finished task's results into the course
data: the autograded folder and the judge logs (regular files only, no link followed, the old
result replaced), the student's rows of the gradebook (the values nbgrader's own autograde wrote
in the task's copy), then the digests. One merge at a time (a lock); the gradebook has one
writer. ``report``, ``feedback`` and ``export`` then read the course data as after a local run.

**A task that fails** (Slurm's TIMEOUT, CANCELLED, NODE_FAIL, OUT_OF_MEMORY, ...) leaves no result:
its student is "not graded" in the report with Slurm's account of it and its log's last words
(:func:`grading.slurm.TaskState.describe`), never lost. **A re-run grades only the missing
ones**: each finished grading records the digest of the submission it graded
(:func:`grading.digests.record_digests`), and the Slurm executor grades only the submissions
without one (new, collected again, failed, or whose results were deleted), unless told
``regrade=True`` or given ``students``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shlex
import shutil
import socket
import sqlite3
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from grading import digests, judge, slurm
from grading.files import entry_kind, read_regular, write_private
from grading.course import MAX_NOTEBOOK_BYTES, ROOT, data_dir, name_students

TASK_SLACK_S = 300  # a task's Slurm time limit beyond the local worker's own (start-up, copies)
MAX_RESULT_FILE = MAX_NOTEBOOK_BYTES


@dataclass
class Submitted:
    """A job array submitted for one assignment: its run folder, its job, its students."""

    assignment: str
    run_dir: Path
    job: str
    students: list[str]
    time_limit_min: int
    merge_job: str | None = None


@dataclass
class Merged:
    """What one :func:`merge` did: per student of the runs merged, the latest outcome."""

    assignment: str
    finished: list[str] = field(default_factory=list)  # graded to the end: results installed
    not_graded: dict[str, str] = field(default_factory=dict)  # student -> why
    active: list[str] = field(default_factory=list)    # still pending or running in Slurm
    runs: list[Path] = field(default_factory=list)
    seconds: float = 0.0


def _runs_dir(assignment: str, data: Path) -> Path:
    return data / "slurm" / assignment


def task_time_limit_min() -> int:
    """Minutes of Slurm time limit per task: the local worker's own limit for one submission
    (:func:`grading.workflow.worker_time_limit`) plus :data:`TASK_SLACK_S`."""
    from grading import workflow

    return math.ceil((workflow.worker_time_limit(1) + TASK_SLACK_S) / 60)


def missing_students(assignment: str, data: Path | None = None) -> list[str]:
    """The submitted students whose current submission has not been graded to its end (never
    graded, collected again since, a task that failed, or results deleted)."""
    from grading import workflow

    data = data or data_dir()
    done = digests.graded_submissions(assignment, data)
    return [s for s in workflow.submitted_students(assignment, data)
            if done.get(s) is None or done[s] != digests.submission_digest(assignment, s, data)]


def _check_positive(name: str, value, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")


def submit(assignment: str, data: Path | None = None, students: list[str] | None = None,
           timeout: int | None = None, register_first: bool = True,
           reference_cache: Path | None = None, extra_args: list[str] | None = None,
           time_limit_min: int | None = None, max_running: int | None = None,
           sbatch_args: list[str] | None = None, hold: bool = False,
           regrade: bool = False) -> Submitted | None:
    """Submit one array task per submission to grade; returns the :class:`Submitted`, or None
    when nothing is missing. ``students``: exactly these (each must have a submission);
    otherwise every submission when ``regrade``, else the missing ones
    (:func:`missing_students`), leaving out those an earlier array is still grading.
    ``time_limit_min``: Slurm's limit per task (default :func:`task_time_limit_min`);
    ``max_running``: at most that many tasks at once (``--array=...%N``); ``sbatch_args``: more
    sbatch options (``["--partition=cpu", "--mem=8G"]``), after the executor's own; ``hold``:
    submitted held (``scontrol release``)."""
    from grading import workflow

    data = data or data_dir()
    [assignment] = workflow.expand(assignment)
    _check_positive("time_limit_min", time_limit_min)
    _check_positive("max_running", max_running)
    if timeout is not None:
        _check_positive("timeout", timeout)
    if sbatch_args is not None and (not isinstance(sbatch_args, list)
                                    or not all(isinstance(a, str) for a in sbatch_args)):
        raise ValueError(f"sbatch_args must be a list of strings, got {sbatch_args!r}")
    why = slurm.unavailable()
    if why is not None:
        raise RuntimeError(f"the Slurm executor cannot run: {why} (scripts/slurm_local.sh "
                           "start brings up a one-node Slurm on this machine)")
    everyone = workflow.submitted_students(assignment, data)
    if students is not None:
        chosen = list(dict.fromkeys(students))
        unknown = [s for s in chosen if s not in everyone]
        if unknown:
            raise ValueError(f"students must have a submission in {data / 'submitted'}: "
                             f"{', '.join(unknown[:10])} ha(s) none")
    earlier = merge(assignment, data)  # settle earlier arrays first (their results count)
    if students is None:
        chosen = everyone if regrade else missing_students(assignment, data)
        chosen = [s for s in chosen if s not in earlier.active]
    busy = [s for s in chosen if s in earlier.active]
    if busy:
        raise RuntimeError(f"an earlier Slurm array of {assignment} is still grading "
                           f"{', '.join(busy[:5])}: wait for it to end (then scripts/grade.py "
                           f"merge {assignment}) or scancel it")
    if not chosen:
        return None
    cache = workflow.prepare(assignment, data, register_first, reference_cache)
    limit = time_limit_min or task_time_limit_min()
    array = f"0-{len(chosen) - 1}" + (f"%{max_running}" if max_running else "")
    with _lock(assignment, data):  # (a merge never sees a run half submitted)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        run_dir = _runs_dir(assignment, data) / f"{stamp}-{uuid.uuid4().hex[:6]}"
        (run_dir / "logs").mkdir(parents=True)
        (run_dir / "tasks").mkdir()
        _snapshot_gradebook(data / "gradebook.db", run_dir / "gradebook.db")
        run = {"assignment": assignment, "students": chosen, "data": str(data),
               "reference_cache": str(cache), "timeout": timeout,
               "extra_args": list(extra_args or []), "time_limit_min": limit,
               "submitted_at": time.time()}
        write_private(run_dir / "run.json", json.dumps(run, indent=1))
        command = (f"exec {shlex.quote(sys.executable)} -m grading.launcher task "
                   f"{shlex.quote(str(run_dir))}")
        args = [f"--array={array}", f"--job-name=dtp-grade-{assignment}", f"--time={limit}",
                f"--output={run_dir}/logs/task-%a.out", f"--chdir={ROOT}", "--ntasks=1",
                "--cpus-per-task=1", *(["--hold"] if hold else []), *(sbatch_args or []),
                "--wrap", command]
        try:
            job = slurm.sbatch(args, env=dict(os.environ, COURSE_DATA=str(data)))
        except BaseException:
            shutil.rmtree(run_dir)  # never submitted: no run to merge
            raise
        run["job"] = job
        write_private(run_dir / "run.json", json.dumps(run, indent=1))
    return Submitted(assignment, run_dir, job, chosen, limit)


def _snapshot_gradebook(src: Path, dst: Path) -> None:
    """A consistent copy of the gradebook (sqlite's backup: no half-written page)."""
    with contextlib.closing(sqlite3.connect(src)) as a, \
            contextlib.closing(sqlite3.connect(dst)) as b:
        a.backup(b)


def submit_merge(sub: Submitted, data: Path, sbatch_args: list[str] | None = None) -> str:
    """A job that runs ``scripts/grade.py merge`` once every task of ``sub`` has ended
    (``--dependency=afterany``): the merge, the digests and the report without anyone waiting."""
    grade = ROOT / "scripts" / "grade.py"
    command = (f"exec {shlex.quote(sys.executable)} {shlex.quote(str(grade))} merge "
               f"{shlex.quote(sub.assignment)}")
    args = [f"--dependency=afterany:{sub.job}", f"--job-name=dtp-merge-{sub.assignment}",
            "--time=60", f"--output={sub.run_dir}/logs/merge.out", f"--chdir={ROOT}",
            "--ntasks=1", "--cpus-per-task=1", *(sbatch_args or []), "--wrap", command]
    sub.merge_job = slurm.sbatch(args, env=dict(os.environ, COURSE_DATA=str(data)))
    return sub.merge_job


# ------------------------------------------------------------------------------ one task


def task(run_dir: Path, index: int | None = None) -> int:
    """Grade the submission of array task ``index`` (default ``$SLURM_ARRAY_TASK_ID``) of the
    run in ``run_dir``, with the local executor, into the task's own folder; writes its
    ``result.json`` last (the merge trusts a task with one). Returns the exit status."""
    from grading import workflow

    run_dir = Path(run_dir).resolve()
    if index is None:
        index = int(os.environ["SLURM_ARRAY_TASK_ID"])
    run = json.loads(read_regular(run_dir / "run.json", 100_000_000))
    students = run["students"]
    if not 0 <= index < len(students):
        raise ValueError(f"index must be a task of this run (0 to {len(students) - 1}), "
                         f"got {index}")
    assignment, student, main = run["assignment"], students[index], Path(run["data"])
    folder = run_dir / "tasks" / str(index)
    if entry_kind(folder) != "missing":  # a requeued task starts over
        shutil.rmtree(folder)
    (folder / "submitted" / student).mkdir(parents=True)
    started = time.time()
    # its own course data: the course's secret (the same hidden cases), the gradebook as it was
    # when the array was submitted, and this student's submission
    write_private(folder / judge.SECRET_FILE, read_regular(main / judge.SECRET_FILE, 1024))
    shutil.copyfile(run_dir / "gradebook.db", folder / "gradebook.db")
    src = main / "submitted" / student / assignment
    skipped = workflow._copy_folder(src, folder / "submitted" / student / assignment,
                                    [workflow.MAX_SUBMISSION_BYTES, workflow.MAX_FILES])
    digest = digests.submission_digest(assignment, student, folder)
    print(f"grading {student}'s {assignment} (task {index} of {len(students)}) on "
          f"{socket.gethostname()}", flush=True)
    done = workflow.autograde(assignment, workers=1, data=folder, students=[student],
                              timeout=run["timeout"], register_first=False,
                              reference_cache=Path(run["reference_cache"]),
                              extra_args=run["extra_args"])
    job = os.environ.get("SLURM_ARRAY_JOB_ID", "")
    result = {"student": student, "index": index, "job": f"{job}_{index}" if job else "",
              "host": socket.gethostname(), "returncode": done.returncodes[0],
              "timed_out": bool(done.timed_out), "submission": digest,
              "copy_skipped": skipped, "started": started, "seconds": time.time() - started,
              "log": str(done.logs[0])}
    write_private(folder / "result.json", json.dumps(result, indent=1))
    print(f"{student}: graded in {result['seconds']:.1f} s (nbgrader exit "
          f"{result['returncode']})", flush=True)
    return 0


# ------------------------------------------------------------------------------ the merge


@contextlib.contextmanager
def _lock(assignment: str, data: Path):
    folder = _runs_dir(assignment, data)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".merge.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _unmerged_runs(assignment: str, data: Path) -> list[Path]:
    folder = _runs_dir(assignment, data)
    if entry_kind(folder) != "dir":
        return []
    return sorted(p for p in folder.iterdir() if entry_kind(p) == "dir"
                  and entry_kind(p / "run.json") == "file"
                  and entry_kind(p / "merged.json") == "missing")


def merge(assignment: str, data: Path | None = None) -> Merged:
    """Install every finished task's results of every run of ``assignment`` not yet merged
    (see the module doc), record why each other student was not graded, then the digests.
    A run whose tasks have all ended is marked merged (its copies of the secret, the gradebook
    and the submissions are removed; its logs stay)."""
    from grading import workflow

    data = data or data_dir()
    [assignment] = workflow.expand(assignment)
    start = time.perf_counter()
    out = Merged(assignment)
    outcome: dict[str, tuple[str, str | None]] = {}  # student -> (finished|failed|active, why)
    with _lock(assignment, data), _gradebook(data / "gradebook.db") as book:
        for run_dir in _unmerged_runs(assignment, data):
            _merge_run(assignment, data, run_dir, outcome, book)  # (a later run's outcome wins)
            out.runs.append(run_dir)
        out.finished = sorted(s for s, (kind, _) in outcome.items() if kind == "finished")
        out.active = sorted(s for s, (kind, _) in outcome.items() if kind == "active")
        out.not_graded = {s: why for s, (_, why) in sorted(outcome.items()) if why}
        digests.record_not_graded(assignment, data,
                                    {s: why for s, (_, why) in outcome.items()})
        settled = sorted(s for s, (kind, _) in outcome.items() if kind != "active")
        if settled:
            digests.record_digests(assignment, settled, data, finished=out.finished)
    name_students(data, out.finished)  # (after the merge's gradebook is closed)
    out.seconds = time.perf_counter() - start
    return out


@contextlib.contextmanager
def _gradebook(path: Path):
    """The course's gradebook, opened once for a whole merge (its one writer), or None when
    there is none yet (nothing was submitted)."""
    import warnings

    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SAWarning

    if entry_kind(path) != "file":
        yield None
        return
    with Gradebook(f"sqlite:///{path}") as book, warnings.catch_warnings():
        # (nbgrader's update_or_create_submission makes SQLAlchemy warn about its autoflush,
        # as it does in nbgrader's own autograde: harmless)
        warnings.simplefilter("ignore", SAWarning)
        yield book


def _merge_run(assignment: str, data: Path, run_dir: Path,
               outcome: dict[str, tuple[str, str | None]], book) -> None:
    run = json.loads(read_regular(run_dir / "run.json", 100_000_000))
    job = run.get("job")
    known: dict | None = None
    active = False
    for index, student in enumerate(run["students"]):
        folder = run_dir / "tasks" / str(index)
        log = run_dir / "logs" / f"task-{index}.out"
        result = _result(folder)
        if result is None or result.get("student") != student:
            if known is None:
                known = slurm.states(job) if job else {}
            st = known.get(index)
            if st is not None:
                st.log = log
            if st is not None and st.active:
                active = True
                outcome[student] = ("active", f"still being graded: Slurm {st.describe()}")
                continue
            if st is None:
                why = (f"its Slurm task {job}_{index} left no result, and Slurm no longer knows "
                       f"it (cancelled before it started, or ended longer ago than the "
                       f"controller keeps jobs)" + (f"; log: {log}" if entry_kind(log) == "file"
                                                   else ""))
            else:
                why = f"its Slurm task: {st.describe()}"
            _drop_results(assignment, student, data)
            outcome[student] = ("failed", why + " (autograde again to grade it)")
        elif result.get("timed_out"):
            _drop_results(assignment, student, data)
            outcome[student] = ("failed", f"its grading worker ran past its time limit in "
                                          f"Slurm task {result.get('job')}; see "
                                          f"{result.get('log')}")
        elif result.get("submission") != digests.submission_digest(assignment, student, data):
            _drop_results(assignment, student, data)
            outcome[student] = ("failed", "the submission was collected again while it was "
                                          "being graded (autograde again to grade the new one)")
        else:
            _install(assignment, student, folder, data, book)
            made = entry_kind(data / "autograded" / student / assignment) == "dir"
            outcome[student] = ("finished", None if made else
                                f"autograde failed (nbgrader's log: {result.get('log')})")
    if not active:
        write_private(run_dir / "merged.json", json.dumps({"merged_at": time.time()}))
        for index in range(len(run["students"])):
            folder = run_dir / "tasks" / str(index)
            for name in (judge.SECRET_FILE, "gradebook.db"):
                with contextlib.suppress(FileNotFoundError):
                    (folder / name).unlink()
            for name in ("submitted", "autograded", "judge", "feedback", "exchange"):
                if entry_kind(folder / name) == "dir":
                    shutil.rmtree(folder / name)
        with contextlib.suppress(FileNotFoundError):
            (run_dir / "gradebook.db").unlink()


def _result(folder: Path) -> dict | None:
    path = folder / "result.json"
    if entry_kind(path) != "file":
        return None
    try:
        return json.loads(read_regular(path, 10_000_000))
    except (OSError, ValueError):
        return None


def _drop_results(assignment: str, student: str, data: Path) -> None:
    """Remove a student's earlier results (as nbgrader does when it fails to grade one)."""
    for path in (data / "autograded" / student / assignment,
                 judge.log_path(data, assignment, student, "x").parent):
        kind = entry_kind(path)
        if kind == "dir":
            shutil.rmtree(path)
        elif kind != "missing":
            path.unlink()


def _replace_folder(src: Path, dst: Path) -> None:
    """``dst`` becomes a copy of ``src``'s regular files (no link followed; nothing left of the
    old ``dst``); no ``src``: no ``dst``."""
    kind = entry_kind(dst)
    if kind == "dir":
        shutil.rmtree(dst)
    elif kind != "missing":
        dst.unlink()
    if entry_kind(src) != "dir":
        return
    for folder, dirs, files in os.walk(src):
        rel = Path(folder).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            path = Path(folder) / name
            if entry_kind(path) == "file":
                mode = os.lstat(path).st_mode & 0o777
                write_private(dst / rel / name, read_regular(path, MAX_RESULT_FILE), mode=mode)


def _install(assignment: str, student: str, folder: Path, data: Path, book) -> None:
    """A finished task's results into the course data: autograded folder, judge logs, and the
    student's gradebook rows."""
    _replace_folder(folder / "autograded" / student / assignment,
                    data / "autograded" / student / assignment)
    _replace_folder(judge.log_path(folder, assignment, student, "x").parent,
                    judge.log_path(data, assignment, student, "x").parent)
    _merge_gradebook(assignment, student, folder / "gradebook.db", book)


def _merge_gradebook(assignment: str, student: str, task_db: Path, dst) -> None:
    """Copy into the course's gradebook (``dst``, open) what nbgrader's autograde wrote for
    ``student`` in the task's copy: the submission and its timestamp, each grade's automatic
    score and whether it needs a manual look, each comment's automatic text, each notebook's
    late penalty. A manual score given in the course's gradebook since the array was submitted
    is kept, and its grade marked for review (as nbgrader does when it grades again)."""
    from nbgrader.api import Gradebook, MissingEntry

    if entry_kind(task_db) != "file" or dst is None:
        return
    with Gradebook(f"sqlite:///{task_db}") as src:
        try:
            got = src.find_submission(assignment, student)
        except MissingEntry:
            return  # nbgrader stopped before it made the submission
        dst.update_or_create_student(student)
        if got.timestamp is not None:
            dst.update_or_create_submission(assignment, student, timestamp=got.timestamp)
        else:
            dst.update_or_create_submission(assignment, student)
        for nb in got.notebooks:
            mine = dst.find_submission_notebook(nb.name, assignment, student)
            mine.late_submission_penalty = nb.late_submission_penalty
            for grade in nb.grades:
                g = dst.find_grade(grade.name, nb.name, assignment, student)
                g.auto_score = grade.auto_score
                g.needs_manual_grade = grade.needs_manual_grade or (
                    g.manual_score is not None and g.manual_score != grade.manual_score)
            for comment in nb.comments:
                c = dst.find_comment(comment.name, nb.name, assignment, student)
                c.auto_comment = comment.auto_comment
        dst.db.commit()


# ------------------------------------------------------------------------------ the command


@dataclass
class SlurmRun:
    """What ``autograde --executor slurm`` did (the fields of ``workflow.AutogradeRun`` that
    ``scripts/grade.py`` prints, and the Slurm side)."""

    assignment: str
    students: int
    seconds: float
    job: str | None = None
    run_dir: Path | None = None
    merge_job: str | None = None
    merged: Merged | None = None
    waited_s: float = 0.0
    workers: int = 0
    returncodes: list[int] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    timed_out: list[int] = field(default_factory=list)


def default_wait_s(n_tasks: int, time_limit_min: int, max_running: int | None = None) -> float:
    """How long the command waits for an array before it gives up: every task at its time
    limit, one after another, or ``max_running`` at a time (the worst case), plus 10 minutes."""
    waves = math.ceil(n_tasks / (max_running or 1))
    return waves * time_limit_min * 60 + 600


def autograde(assignment: str, data: Path | None = None, students: list[str] | None = None,
              timeout: int | None = None, register_first: bool = True,
              reference_cache: Path | None = None, extra_args: list[str] | None = None,
              time_limit_min: int | None = None, max_running: int | None = None,
              sbatch_args: list[str] | None = None, wait: bool = True,
              wait_timeout_s: float | None = None, regrade: bool = False,
              poll_s: float = 2.0) -> SlurmRun:
    """Submit the array (:func:`submit`), wait for it and merge (:func:`merge`); with
    ``wait=False``, submit a dependent merge job instead and return at once. Waiting is
    bounded (``wait_timeout_s``, default :func:`default_wait_s`): past it, or on Ctrl-C, the
    tasks still pending or running are cancelled, and their students are "not graded" saying
    so (autograde again to grade only them)."""
    data = data or data_dir()
    start = time.perf_counter()
    sub = submit(assignment, data, students, timeout, register_first, reference_cache,
                 extra_args, time_limit_min, max_running, sbatch_args, regrade=regrade)
    if sub is None:
        return SlurmRun(assignment, 0, time.perf_counter() - start)
    out = SlurmRun(assignment, len(sub.students), 0.0, sub.job, sub.run_dir,
                   workers=len(sub.students))
    if not wait:
        out.merge_job = submit_merge(sub, data)
        out.seconds = time.perf_counter() - start
        return out
    limit = wait_timeout_s or default_wait_s(len(sub.students), sub.time_limit_min, max_running)
    try:
        slurm.wait(sub.job, timeout_s=limit, poll_s=poll_s)
    except slurm.SlurmError as err:
        print(f"{assignment}: {err}; cancelling what is left", file=sys.stderr)
        _cancel_and_wait(sub.job)
    except KeyboardInterrupt:
        _cancel_and_wait(sub.job)
        raise
    out.waited_s = time.perf_counter() - start
    out.merged = merge(assignment, data)
    out.seconds = time.perf_counter() - start
    return out


def _cancel_and_wait(job: str) -> None:
    slurm.cancel(job)
    with contextlib.suppress(slurm.SlurmError):
        slurm.wait(job, timeout_s=120, poll_s=1.0)


def main(argv: list[str] | None = None) -> int:
    """``python -m grading.slurm_executor task RUN_DIR``: what each array task runs (through
    ``python -m grading.launcher task RUN_DIR``, which starts it faster)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "task":
        print("usage: python -m grading.slurm_executor task RUN_DIR", file=sys.stderr)
        return 2
    return task(Path(args[1]))


if __name__ == "__main__":
    sys.exit(main())

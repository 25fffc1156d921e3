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

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from grading import judge, sandbox
from grading.files import NotRegular, entry_kind, read_regular, write_private
from grading.course import (ROOT, VARIANTS_ENV, NotebookTooComplex, check_items, data_dir,
                            name_students, notebook_names, roster, submitted_notebook)
from grading.digests import record_digests, record_not_graded
from grading.reference import _environ, check_committed, launch_preload, reference_run
from grading.report import report

# nbgrader's command line, started without an import that costs seconds (grading/launcher.py)
NBGRADER = [sys.executable, "-m", "grading.launcher", "nbgrader"]


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
    """Regenerate ``assignments/<a>/`` from ``solutions/<a>/`` (its visible checks sealed:
    ``grading.visible``) and register it in the gradebook."""
    from grading import visible

    paths = []
    for a in expand(assignment):
        nbgrader("generate_assignment", a, "--force", data=data)
        visible.seal_release_file(a, cache=(data or data_dir()) / "reference")
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


MAX_FILE_BYTES = 20_000_000        # one file a student sends (a notebook is ~100 kB)
MAX_SUBMISSION_BYTES = 50_000_000  # all files of one student for one assignment
MAX_FILES = 200                    # files of one student for one assignment
MAX_DEPTH = 6                      # folders inside a student's assignment folder
_STUDENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,99}")


class Collected(dict):
    """``{assignment: [students collected]}``; ``skipped``: ``{student or entry: [why]}``;
    ``missing``: ``{assignment: {student: why}}`` for each student of the inbox or the roster
    with nothing collected for it (a misnamed notebook: "notebook a1.ipynb missing (found
    Untitled.ipynb)"; a roster student with no folder: "no submission")."""

    def __init__(self):
        super().__init__()
        self.skipped: dict[str, list[str]] = {}
        self.missing: dict[str, dict[str, str]] = {}


def _plain_name(name: str) -> bool:
    """A file name the grader will copy: printable, no leading dot, no path separator."""
    return (0 < len(name) <= 255 and not name.startswith(".") and name.isprintable()
            and "/" not in name and "\\" not in name)


def _copy_regular(src: Path, dst: Path, budget: list[int]) -> str | None:
    """Copy one regular file (read with ``O_NOFOLLOW``, at most ``MAX_FILE_BYTES``); returns
    why it was skipped, or None."""
    try:
        data = read_regular(src, min(MAX_FILE_BYTES, budget[0]))
        if src.suffix == ".ipynb":
            data = submitted_notebook(data)
    except (NotRegular, NotebookTooComplex) as err:
        return str(err)
    budget[0] -= len(data)
    budget[1] -= 1
    dst.parent.mkdir(parents=True, exist_ok=True)
    write_private(dst, data, mode=0o644)
    return None


def _copy_folder(src: Path, dst: Path, budget: list[int], depth: int = 0) -> list[str]:
    """Copy the regular files of a student's folder (no link followed, no special file, no
    oversized file, no hidden entry); returns one line per entry skipped."""
    skipped = []
    with os.scandir(src) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        rel = os.path.relpath(entry.path, src) if depth == 0 else entry.name
        where = Path(entry.path)
        if entry.name in (".ipynb_checkpoints", "timestamp.txt"):
            continue  # (nbgrader trusts timestamp.txt for late penalties: the student's is not)
        if not _plain_name(entry.name):
            skipped.append(f"{ascii(entry.name)}: not a plain file name")
        elif entry.is_symlink():
            skipped.append(f"{entry.name}: a symbolic link (not followed)")
        elif entry.is_dir(follow_symlinks=False):
            if depth + 1 >= MAX_DEPTH:
                skipped.append(f"{entry.name}/: folders nested more than {MAX_DEPTH} deep")
            else:
                skipped += [f"{entry.name}/{line}" for line in
                            _copy_folder(where, dst / entry.name, budget, depth + 1)]
        elif not entry.is_file(follow_symlinks=False):
            skipped.append(f"{entry.name}: a {entry_kind(where)}, not a regular file")
        elif budget[1] <= 0:
            skipped.append(f"{entry.name}: more than {MAX_FILES} files")
        else:
            why = _copy_regular(where, dst / entry.name, budget)
            if why is not None:
                skipped.append(f"{rel}: {why}")
    return skipped


def collect(source: Path, assignment: str, data: Path | None = None) -> Collected:
    """Copy student notebooks from ``source`` into ``$COURSE_DATA/submitted``.

    Accepted layouts (student = first folder level, a plain id):
    ``<source>/<student>/<assignment>.ipynb`` and ``<source>/<student>/<assignment>/...``
    (the folder's files are kept for the integrity scan). Only regular files are copied:
    no link is followed, named pipes, devices and sockets are skipped, and so is every file
    over ``MAX_FILE_BYTES`` (a sparse file counts its whole size) or past ``MAX_FILES`` /
    ``MAX_SUBMISSION_BYTES`` per student. Each skipped entry is named for its student in the
    result's ``skipped`` and in ``$COURSE_DATA/logs/collect-<assignment>.json`` (the report
    shows it); one student's odd folder never stops the others.
    """
    data = data or data_dir()
    source = Path(source)
    if entry_kind(source) != "dir":
        raise ValueError(f"source must be a folder of student folders, got {source}")
    got = Collected()
    for a in expand(assignment):
        names = notebook_names(a)
        log: dict[str, list[str]] = {}
        with os.scandir(source) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            student = entry.name
            if not entry.is_dir(follow_symlinks=False):
                if entry.is_symlink():
                    got.skipped.setdefault(student, []).append(
                        "a symbolic link, not a student folder (not followed)")
                continue
            if not _STUDENT_ID.fullmatch(student):
                got.skipped.setdefault(ascii(student), []).append(
                    "not a student id (letters, digits and . _ @ + - only)")
                continue
            folder, single = Path(entry.path) / a, Path(entry.path) / f"{a}.ipynb"
            target = data / "submitted" / student / a
            try:
                if entry_kind(folder) == "dir":
                    if entry_kind(target) != "missing":
                        shutil.rmtree(target)
                    target.mkdir(parents=True)
                    skipped = _copy_folder(folder, target, [MAX_SUBMISSION_BYTES, MAX_FILES])
                elif entry_kind(single) != "missing" and len(names) == 1:
                    if entry_kind(target) != "missing":
                        shutil.rmtree(target)
                    target.mkdir(parents=True)
                    why = _copy_regular(single, target / names[0],
                                        [MAX_SUBMISSION_BYTES, MAX_FILES])
                    skipped = [] if why is None else [f"{single.name}: {why}"]
                else:
                    others = _other_notebooks(Path(entry.path))
                    if others:  # (a student's folder with only other notebooks in it)
                        why = (f"notebook {' or '.join(names)} missing (found "
                               f"{', '.join(others)})")
                        log[student] = [why]
                        got.missing.setdefault(a, {})[student] = why
                    continue
            except OSError as err:  # a folder that cannot be read: this student only
                skipped = [f"could not be collected ({err})"]
            got.setdefault(a, []).append(student)
            if skipped:
                log[student] = skipped
                got.skipped.setdefault(student, []).extend(skipped)
        for student in sorted(roster(data)):
            if student not in got.get(a, []) and student not in got.missing.get(a, {}):
                got.missing.setdefault(a, {})[student] = "no submission"
        (data / "logs").mkdir(parents=True, exist_ok=True)
        write_private(data / "logs" / f"collect-{a}.json", json.dumps(log, indent=1),
                      mode=0o644)
    return got


def _other_notebooks(folder: Path, most: int = 5) -> list[str]:
    """The plain-named notebooks in a student's folder (at most ``most``, then "..."), as the
    folder holds them (a misnamed submission: ``Untitled.ipynb``)."""
    try:
        with os.scandir(folder) as it:
            found = sorted(e.name for e in it if e.name.endswith(".ipynb")
                           and _plain_name(e.name))
    except OSError:
        return []
    return [ascii(n)[1:-1] for n in found[:most]] + (["..."] if len(found) > most else [])


def collected(assignment: str, data: Path | None = None) -> bool:
    """Has ``assignment`` been collected (a collect log, or a submitted folder)?"""
    data = data or data_dir()
    return (entry_kind(data / "logs" / f"collect-{assignment}.json") == "file"
            or bool(submitted_students(assignment, data)))


def submitted_students(assignment: str, data: Path | None = None) -> list[str]:
    """Students with a folder ``$COURSE_DATA/submitted/<student>/<assignment>``."""
    data = data or data_dir()
    return sorted(p.parent.name for p in (data / "submitted").glob(f"*/{assignment}")
                  if entry_kind(p) == "dir")


@dataclass
class AutogradeRun:
    """What one parallel autograde did."""

    assignment: str
    students: int
    workers: int
    seconds: float
    returncodes: list[int]
    logs: list[Path]
    timed_out: list[int]  # the workers stopped at their time limit (their rest: not graded)


def worker_time_limit(n_students: int) -> float:
    """Seconds one nbgrader worker may take for ``n_students``: each submission's own limit
    (``RecoveringExecute.max_submission_s``) plus kernel start-ups and nbgrader's own work."""
    from grading.preprocessors import RecoveringExecute

    return n_students * (RecoveringExecute.max_submission_s.default_value + 180) + 120


EXECUTORS = ("local", "slurm")  # scripts/grade.py's --executor: this module, or slurm_executor


def prepare(assignment: str, data: Path, register_first: bool = True,
            reference_cache: Path | None = None) -> Path:
    """What every autograde does first, whatever the executor: refuse to grade unisolated or
    with an uncommitted reference, make the course's secret, register the assignment, run (or
    find in its cache) the reference solution; returns the reference cache folder."""
    sandbox.require()  # refuse to grade unisolated unless the instructor said so
    check_committed(assignment)
    judge.course_secret(data)  # made once, before the workers race to make it
    if register_first:
        register(assignment, data)
    cache = Path(reference_cache or data / "reference").resolve()
    reference_run(assignment, data, cache=cache)
    return cache


def autograde(assignment: str, workers: int = 2, data: Path | None = None,
              students: list[str] | None = None, timeout: int | None = None,
              register_first: bool = True, reference_cache: Path | None = None,
              extra_args: list[str] | None = None) -> AutogradeRun:
    """Autograde every submission of one assignment with ``workers`` nbgrader processes.

    ``timeout`` overrides ``Execute.timeout`` (seconds per cell); ``extra_args`` go to each
    ``nbgrader autograde`` (``--SandboxedKernelManager.memory_gb=2``). Students are dealt to the
    workers in turn, in the order of ``students`` if given (put slow ones first to spread them),
    else alphabetically. Students that nbgrader cannot grade are left without an autograded
    notebook: :func:`grading.report.report` lists them as "not graded", never as 0.

    The reference solution runs first (or comes from its cache, ``reference_cache``, default
    ``$COURSE_DATA/reference``): the judge inside each nbgrader process compares with it. It
    must be the committed one (:func:`grading.reference.check_committed`). Each worker has a
    time limit (:func:`worker_time_limit`); one past it is stopped, with every kernel it
    started, and its students left without results ("not graded", saying so).

    (To grade as a Slurm job array instead, one task per submission each running this same
    function for its one student: ``grading.slurm_executor.autograde``.)
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    data = data or data_dir()
    cache = prepare(assignment, data, register_first, reference_cache)
    everyone = submitted_students(assignment, data)
    chosen = list(dict.fromkeys(students)) if students is not None else everyone
    refused = _too_complex(assignment, data, chosen)
    start = time.perf_counter()
    graded = [s for s in chosen if s not in refused]
    shards = [graded[i::workers] for i in range(workers)]
    shards = [s for s in shards if s]
    procs, logs = [], []
    env = dict(os.environ, COURSE_DATA=str(data), COURSE_REFERENCE_CACHE=str(cache),
               COURSE_LAUNCH_PRELOAD=launch_preload(assignment))
    for k, shard in enumerate(shards):
        exclude = sorted(set(everyone) - set(shard))
        args = [*NBGRADER, "autograde", assignment, "--create", "--force"]
        if exclude:
            args.append(f"--CourseDirectory.student_id_exclude={','.join(exclude)}")
        if timeout is not None:
            args.append(f"--Execute.timeout={int(timeout)}")
        args += list(extra_args or [])
        log = data / "logs" / f"autograde-{assignment}-{k}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        f = log.open("w")
        procs.append((subprocess.Popen(args, cwd=ROOT, env=env, stdout=f, start_new_session=True,
                                       stderr=subprocess.STDOUT), f, len(shard)))
        logs.append(log)
    codes, timed_out = [], []
    deadline = {id(p): time.monotonic() + worker_time_limit(n) for p, _, n in procs}
    for k, (proc, f, _) in enumerate(procs):
        try:
            codes.append(proc.wait(timeout=max(1.0, deadline[id(proc)] - time.monotonic())))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # nbgrader and its kernels (bwrap dies with it)
            codes.append(proc.wait())
            timed_out.append(k)
        f.close()
    stopped = {s for k in timed_out for s in shards[k]}
    why = {s: (f"its grading worker ran past its time limit "
               f"({worker_time_limit(len(shards[k])):.0f} s for {len(shards[k])} "
               f"submission(s)) and was stopped; see {logs[k]}")
           for k in timed_out for s in shards[k]} | refused
    record_not_graded(assignment, data, {s: why.get(s) for s in chosen})
    name_students(data, chosen)  # the formgrader lists them by name, not "None, None"
    record_digests(assignment, chosen, data,
                   finished=[s for s in chosen if s not in stopped and s not in refused])
    return AutogradeRun(assignment, len(chosen), len(shards), time.perf_counter() - start,
                        codes, logs, timed_out)


def _too_complex(assignment: str, data: Path, students: list[str]) -> dict[str, str]:
    """``{student: why}`` for each submission no grading process should parse: a notebook
    past ``grading.course.MAX_NOTEBOOK_ITEMS`` JSON items (collect refuses one; this stops one
    put into the submitted folder by other means), counted on its bytes."""
    out = {}
    for student in students:
        for name in notebook_names(assignment):
            path = data / "submitted" / student / assignment / name
            try:
                check_items(read_regular(path, MAX_FILE_BYTES))
            except NotebookTooComplex as err:
                out[student] = f"not graded: {err}"
            except OSError:
                pass  # (missing or not a file: nbgrader says so)
    return out


CHECK_CACHE = ROOT / ".cache" / "check"  # make check's registered gradebooks, per release
PROGRESS_ENV = "COURSE_PROGRESS_FILE"  # where RecoveringExecute writes each verdict as it goes


def _registered(assignment: str, data: Path) -> None:
    """Register ``assignment`` in ``data``'s new gradebook, from a copy made the first time for
    the same release and solution (registering runs nbgrader's generate_assignment: 5-8 s)."""
    import hashlib

    h = hashlib.sha256()
    for top in ("assignments", "solutions"):
        for name in notebook_names(assignment):
            h.update((ROOT / top / assignment / name).read_bytes())
    cached = CHECK_CACHE / f"{assignment}-{h.hexdigest()[:16]}.db"
    if entry_kind(cached) == "file":
        shutil.copyfile(cached, data / "gradebook.db")
        return
    register(assignment, data)
    CHECK_CACHE.mkdir(parents=True, exist_ok=True)
    for old in CHECK_CACHE.glob(f"{assignment}-*.db"):
        old.unlink()
    shutil.copyfile(data / "gradebook.db", cached)


def self_check(assignment: str, notebook: Path | None = None, progress=None):
    """Grade one notebook (default: the student's workspace copy) exactly as the instructor's
    grading does, in a temporary course data folder; returns its ``StudentResult``. For
    self-learners with the full repository (``make check A=<assignment>``). ``progress``: a
    function called with a line as each question is judged (the kernel's run, live)."""
    import threading

    [assignment] = expand(assignment)
    notebook = Path(notebook or ROOT / "workspace" / "assignments" / assignment /
                    f"{assignment}.ipynb")
    if entry_kind(notebook) != "file":
        raise ValueError(f"no notebook to check at {notebook} (run make lab once to get your "
                         f"copy, or give the path with --notebook)")
    from course_utils.assess import variants

    # graded on the numbers the notebook was worked with: the identity make lab recorded (or
    # the hub's user), else the base numbers
    who = variants.identity()
    with tempfile.TemporaryDirectory(prefix="course-check-") as tmp:
        inbox, data = Path(tmp) / "inbox", Path(tmp) / "data"
        (inbox / (who or "me")).mkdir(parents=True)
        shutil.copyfile(notebook, inbox / (who or "me") / f"{assignment}.ipynb")
        collect(inbox, assignment, data)
        _registered(assignment, data)
        lines = Path(tmp) / "progress"
        lines.touch()
        done = threading.Event()

        def follow() -> None:  # print each verdict as the grader writes it
            with lines.open() as f:
                while not done.is_set() or f.tell() < lines.stat().st_size:
                    line = f.readline()
                    if line and progress is not None:
                        progress(line.rstrip("\n"))
                    elif not line:
                        done.wait(0.2)

        watcher = threading.Thread(target=follow, daemon=True)
        watcher.start()
        # the report needs the judge (and the torch it imports): imported meanwhile, on the
        # other core, while the grading worker runs the notebook
        threading.Thread(target=judge.load, args=(assignment,), daemon=True).start()
        try:
            with _environ({**({} if who else {VARIANTS_ENV: "off"}),
                           PROGRESS_ENV: str(lines)}):
                autograde(assignment, workers=1, data=data, register_first=False,
                          reference_cache=ROOT / ".cache" / "reference")
        finally:
            done.set()
            watcher.join(timeout=5)
        [result], _ = report(assignment, data, html=False)
        return result


def feedback(assignment: str, data: Path | None = None) -> Path:
    """HTML feedback per student in ``$COURSE_DATA/feedback/<student>/<assignment>/``.

    Every autograded student gets a page: one that nbgrader could not render (nbgrader goes on
    with the others) gets a short page of the course's own instead, with the scores from the
    gradebook and a line saying the full page could not be made; :data:`FEEDBACK_FALLBACKS`
    names them, and so does the step's output. Feedback holds the HTML pages only: nbgrader
    copies no other file (``nbgrader_config.py`` ignores every other file for this step), and
    anything else found there is removed. Raises RuntimeError only if nbgrader ran past its time.
    """
    data = data or data_dir()
    FEEDBACK_FALLBACKS.clear()
    for a in expand(assignment):
        log = data / "logs" / f"feedback-{a}.log"
        graded = sorted(p.parent.name for p in (data / "autograded").glob(f"*/{a}")
                        if entry_kind(p) == "dir")
        limit = 120 + 30 * len(graded)  # a page renders in seconds (BoundPageText)
        try:
            nbgrader("generate_feedback", a, "--force", data=data, log=log, check=False,
                     timeout=limit)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"nbgrader generate_feedback {a} ran past {limit} s; see "
                               f"{log}") from None
        pages = {n.replace(".ipynb", ".html") for n in notebook_names(a)}
        for folder in (data / "feedback").glob(f"*/{a}"):
            for entry in os.scandir(folder):
                if entry.name not in pages or not entry.is_file(follow_symlinks=False):
                    path = Path(entry.path)
                    shutil.rmtree(path) if entry_kind(path) == "dir" else path.unlink()
        for student in graded:
            for name in notebook_names(a):
                page = data / "feedback" / student / a / name.replace(".ipynb", ".html")
                if entry_kind(page) != "file":
                    _fallback_page(a, student, name, data, page)
                    FEEDBACK_FALLBACKS.append((a, student, name))
    return data / "feedback"


FEEDBACK_FALLBACKS: list[tuple[str, str, str]] = []  # (assignment, student, notebook) of the
# last feedback run whose page nbgrader could not render (the course's short page instead)


def _fallback_page(assignment: str, student: str, notebook: str, data: Path, page: Path) -> None:
    """A feedback page of the course's own for one notebook nbgrader could not render: the
    automatic points per question from the gradebook, escaped, nothing of the submission."""
    import html

    from nbgrader.api import Gradebook

    rows = []
    try:
        with Gradebook(f"sqlite:///{data / 'gradebook.db'}") as gb:
            nb = gb.find_submission_notebook(Path(notebook).stem, assignment, student)
            for grade in sorted(nb.grades, key=lambda g: g.name):
                score = "not graded yet" if grade.score is None else f"{grade.score:g}"
                rows.append(f"<tr><td>{html.escape(grade.name)}</td><td>{score} / "
                            f"{grade.max_score:g}</td></tr>")
    except Exception:  # noqa: BLE001 - no gradebook entry: the page says so
        rows.append("<tr><td colspan=2>no grades recorded</td></tr>")
    title = html.escape(f"{assignment}: {Path(notebook).stem}")
    page.parent.mkdir(parents=True, exist_ok=True)
    write_private(page, (
        f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}"
        f"</title></head><body><h1>{title}</h1><p>Your full feedback page could not be made; "
        f"your instructor has been told. Your points so far:</p><table><thead><tr>"
        f"<th>question</th><th>points</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        f"</body></html>\n"), mode=0o644)

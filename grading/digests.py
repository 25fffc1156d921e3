"""Results fixed when grading ends: digests of what was graded, and why anyone was not.

:func:`record_digests` keeps the SHA-256 of every autograded notebook and judge log (and of the
submission graded); :func:`check_digests` refuses (:class:`ResultsChanged`, naming the
students) once one changed; :func:`record_not_graded` keeps why a student has no result.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from grading import judge
from grading.course import MAX_NOTEBOOK_BYTES, notebook_names
from grading.files import entry_kind, read_regular, write_private

# ------------------------------------------------------------------------------ digests


class ResultsChanged(RuntimeError):
    """An autograded notebook changed after grading ended: the report refuses to go on."""


def _digests_path(assignment: str, data: Path) -> Path:
    return data / "digests" / f"{assignment}.json"


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(read_regular(path, MAX_NOTEBOOK_BYTES)).hexdigest()
    except OSError as err:
        return f"unreadable ({err})"


def record_digests(assignment: str, students: list[str], data: Path,
                   finished: list[str] | None = None) -> Path:
    """When grading ends: the SHA-256 of each graded student's autograded notebooks, and how
    the kernels were isolated. :func:`report` refuses to run if any of them changes later.
    ``finished``: the students whose grading ran to its end (whatever nbgrader made of their
    notebook): the digest of the submission graded is kept for them (:func:`graded_submissions`),
    so a re-run can grade only the submissions not yet graded."""
    from grading import sandbox

    path = _digests_path(assignment, data)
    book = (json.loads(read_regular(path, MAX_NOTEBOOK_BYTES)) if entry_kind(path) == "file"
            else {"students": {}})
    book["isolation"] = sandbox.description()
    submitted = book.setdefault("submitted", {})
    for student in students:
        auto = data / "autograded" / student / assignment
        files = {n: auto / n for n in notebook_names(assignment)}
        files.update({f"judge log {n}": judge.log_path(data, assignment, student, n)
                      for n in notebook_names(assignment)})
        book["students"][student] = {n: _sha256(f) for n, f in files.items()
                                     if entry_kind(f) == "file"}
        submitted.pop(student, None)
    for student in finished or []:
        submitted[student] = submission_digest(assignment, student, data)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, json.dumps(book, indent=1, sort_keys=True))
    return path


def submission_digest(assignment: str, student: str, data: Path) -> str | None:
    """SHA-256 over the names and contents of the regular files of
    ``submitted/<student>/<assignment>/`` (None: no such folder). The folder is the grader's own
    copy (``collect``); no link is followed."""
    top = data / "submitted" / student / assignment
    if entry_kind(top) != "dir":
        return None
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(top):  # (os.walk follows no link to a folder)
        dirs.sort()
        for name in sorted(files):
            path = Path(folder) / name
            if entry_kind(path) == "file":
                h.update(path.relative_to(top).as_posix().encode() + b"\0")
                h.update(_sha256(path).encode() + b"\0")
    return h.hexdigest()


def graded_submissions(assignment: str, data: Path) -> dict[str, str]:
    """``{student: digest of the submission graded}`` for every student whose grading ran to
    its end and whose recorded results are all still there (see :func:`record_digests`)."""
    path = _digests_path(assignment, data)
    if entry_kind(path) != "file":
        return {}
    book = json.loads(read_regular(path, MAX_NOTEBOOK_BYTES))
    out = {}
    for student, digest in book.get("submitted", {}).items():
        files = book["students"].get(student, {})
        present = all(entry_kind(
            judge.log_path(data, assignment, student, name.removeprefix("judge log "))
            if name.startswith("judge log ") else data / "autograded" / student / assignment / name)
            == "file" for name in files)
        if present and digest:
            out[student] = digest
    return out


def _not_graded_path(assignment: str, data: Path) -> Path:
    return data / "logs" / f"not-graded-{assignment}.json"


def record_not_graded(assignment: str, data: Path, reasons: dict[str, str | None]) -> None:
    """Keep why each student's grading did not finish (a worker or a Slurm task stopped), for
    the report's "not graded (why)"; a None reason forgets the student's earlier one."""
    path = _not_graded_path(assignment, data)
    book = not_graded_reasons(assignment, data)
    for student, why in reasons.items():
        if why is None:
            book.pop(student, None)
        else:
            book[student] = why
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, json.dumps(book, indent=1, sort_keys=True), mode=0o644)


def not_graded_reasons(assignment: str, data: Path) -> dict[str, str]:
    """``{student: why their grading did not finish}`` (see :func:`record_not_graded`)."""
    path = _not_graded_path(assignment, data)
    if entry_kind(path) != "file":
        return {}
    return {str(k): str(v) for k, v in json.loads(read_regular(path, 50_000_000)).items()}


def check_digests(assignment: str, data: Path) -> dict:
    """The recorded digests (see :func:`record_digests`); raises :class:`ResultsChanged`
    naming each student whose autograded notebook is no longer what grading wrote."""
    path = _digests_path(assignment, data)
    if entry_kind(path) != "file":
        return {"students": {}, "isolation": "unknown (no record of the autograde run)"}
    book = json.loads(read_regular(path, MAX_NOTEBOOK_BYTES))
    changed = []
    for student, files in sorted(book["students"].items()):
        for name, digest in files.items():
            f = (judge.log_path(data, assignment, student, name.removeprefix("judge log "))
                 if name.startswith("judge log ") else data / "autograded" / student / assignment / name)
            if _sha256(f) != digest:
                changed.append(f"{student} ({name})")
    if changed:
        raise ResultsChanged(
            f"report refused: the autograded results of {', '.join(changed)} changed after "
            f"grading ended (digests in {path}); autograde them again")
    return book

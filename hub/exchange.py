"""nbgrader's exchange for the class hub: release, collect (each submission checked against who
wrote it) and feedback, with the folder modes a shared machine needs.

nbgrader's exchange is a folder every student's server writes to. nbgrader's own modes leave
three doors open, closed here:

* the root is made 0777 by ``release_assignment``: any student could rename the course's folder
  and put a folder of their own, with notebooks of their own, where classmates fetch from. The
  root is set to 1777 (sticky: writable, as nbgrader's client checks, but no one renames what
  is not theirs) after every release;
* ``inbound/`` (2733: write, no listing) gets the sticky bit too: no one renames or deletes a
  classmate's submission;
* ``nbgrader submit --student alice`` lets anyone hand in under a classmate's id (the name of
  the inbound folder is all nbgrader's ``collect`` reads). :func:`collect` takes a submission
  only if the Unix user who owns its folder is the student it names, and says so otherwise.

Collect moves each submission out of ``inbound/`` into the hub's private folder, gives it to
root (no student process, not even one holding an open descriptor, can change it after that),
and then copies it with :func:`grading.workflow.collect`, with that step's limits.
Feedback is released under nbgrader's own name for it (md5 of the submission's secret and the
notebook's name), which only the student who submitted knows how to find.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from grading import workflow
from grading.course import notebook_names
from grading.files import entry_kind, read_regular, write_private

COURSE_ID = "dtp"
# nbgrader's inbound name: <student>+<assignment>+<timestamp>[+<random>]
_INBOUND = re.compile(r"(?P<student>[^+/]+)\+(?P<assignment>[^+/]+)\+(?P<timestamp>[^+/]+)"
                      r"(?:\+[^+/]*)?")

__all__ = ["COURSE_ID", "prepare", "release", "HubCollected", "collect", "release_feedback"]


def _course(exchange: Path) -> Path:
    return Path(exchange) / COURSE_ID


def prepare(exchange: Path) -> None:
    """Make the exchange's folders with the course's modes (see the module doc)."""
    course = _course(exchange)
    for folder, mode in ((Path(exchange), 0o1777), (course, 0o755), (course / "outbound", 0o755),
                         (course / "inbound", 0o3733), (course / "feedback", 0o711)):
        folder.mkdir(exist_ok=True)
        os.chown(folder, 0, 0)
        os.chmod(folder, mode)


def release(assignment: str, exchange: Path, data: Path) -> None:
    """``nbgrader release_assignment`` of the course's released ``assignments/<assignment>``
    into the exchange (students see it in JupyterLab's Assignments tab)."""
    for a in workflow.expand(assignment):
        workflow.nbgrader("release_assignment", a, "--force", f"--Exchange.root={exchange}",
                          f"--CourseDirectory.course_id={COURSE_ID}", data=data)
    prepare(exchange)  # (release_assignment sets the root back to 0777)


@dataclass
class HubCollected:
    """What :func:`collect` took (``collected``: grading's own result) and what it refused:
    ``refused``: ``{inbound entry: why}``."""

    collected: workflow.Collected
    refused: dict[str, str] = field(default_factory=dict)


def _give_to_root(path: Path) -> None:
    """Own ``path`` and everything under it as root, closed to others (no link followed)."""
    for top, dirs, files in os.walk(path, followlinks=False):
        for name in [*dirs, *files]:
            p = os.path.join(top, name)
            os.lchown(p, 0, 0)
            if not os.path.islink(p):
                os.chmod(p, stat.S_IMODE(os.lstat(p).st_mode) & 0o700)
    os.lchown(path, 0, 0)
    os.chmod(path, 0o700)


def _owner_is(path: Path, student: str) -> bool:
    try:
        return os.lstat(path).st_uid == pwd.getpwnam(student).pw_uid
    except KeyError:
        return False


def collect(assignment: str, exchange: Path, private: Path, data: Path,
            students: list[str]) -> HubCollected:
    """Take every student's latest submission of ``assignment`` from the exchange into
    ``$COURSE_DATA/submitted`` (see the module doc). ``private``: a folder of the hub's that
    only root can enter (submissions are kept there, by their inbound names)."""
    inbound = _course(exchange) / "inbound"
    kept = Path(private) / "inbound" / assignment
    kept.mkdir(parents=True, exist_ok=True)
    os.chmod(private, 0o700)
    refused: dict[str, str] = {}
    with os.scandir(inbound) as it:
        entries = sorted(e.name for e in it)
    for name in entries:
        m = _INBOUND.fullmatch(name)
        if m is None or m["assignment"] != assignment:
            if m is None:
                refused[ascii(name)] = "not a submission's name (left in place)"
            continue
        src = inbound / name
        if entry_kind(src) != "dir":
            refused[name] = f"a {entry_kind(src)}, not a submitted folder (left in place)"
            continue
        if m["student"] not in students or not _owner_is(src, m["student"]):
            owner = os.lstat(src).st_uid
            try:
                who = pwd.getpwuid(owner).pw_name
            except KeyError:
                who = f"uid {owner}"
            refused[name] = (f"handed in as {m['student']!r} by {who!r}: not taken "
                             f"(a submission counts for the student who wrote it)")
            continue
        os.rename(src, kept / name)
        _give_to_root(kept / name)
    mine: dict[str, list[str]] = {}
    for name in os.listdir(kept):
        m = _INBOUND.fullmatch(name)
        if m and m["student"] in students:
            mine.setdefault(m["student"], []).append(name)
    latest = {student: max(names, key=lambda n: (_stamp(kept / n), n))
              for student, names in mine.items()}
    inbox = Path(private) / "inbox"
    if inbox.exists():
        shutil.rmtree(inbox)
    inbox.mkdir()  # (empty when no one handed in: collect then names every student missing)
    moved = []
    try:
        for student, name in latest.items():
            (inbox / student).mkdir()
            os.rename(kept / name, inbox / student / assignment)
            moved.append((inbox / student / assignment, kept / name))
        got = workflow.collect(inbox, assignment, data)
    finally:
        for now, back in moved:
            os.rename(now, back)
    for student in students:  # (the hub's roster: each one with nothing taken is named)
        if student not in got.get(assignment, []):
            got.missing.setdefault(assignment, {}).setdefault(student, "no submission")
    secrets = Path(private) / "secrets" / assignment
    secrets.mkdir(parents=True, exist_ok=True)
    for student, name in latest.items():
        secret = kept / name / "submission_secret.txt"
        if entry_kind(secret) == "file":
            write_private(secrets / student, read_regular(secret, 1024))
    return HubCollected(got, refused)


def _stamp(folder: Path) -> str:
    """The submission's time as nbgrader wrote it (``timestamp.txt``), else its name's."""
    path = folder / "timestamp.txt"
    if entry_kind(path) == "file":
        return read_regular(path, 200).decode("utf-8", "replace").strip()
    m = _INBOUND.fullmatch(folder.name)
    return m["timestamp"] if m else ""


def release_feedback(assignment: str, exchange: Path, private: Path, data: Path) -> list[str]:
    """Put each collected student's feedback pages where ``nbgrader fetch_feedback`` finds them
    (``feedback/<md5(secret + notebook)>.html``, 0644); returns the students served."""
    out = _course(exchange) / "feedback"
    served = []
    for student in sorted(p.name for p in (Path(private) / "secrets" / assignment).glob("*")):
        secret = read_regular(Path(private) / "secrets" / assignment / student, 1024)
        pages = []
        for nb in notebook_names(assignment):
            page = data / "feedback" / student / assignment / nb.replace(".ipynb", ".html")
            if entry_kind(page) != "file":
                continue
            digest = hashlib.md5(secret + Path(nb).stem.encode()).hexdigest()
            tmp = out / f"{digest}-tmp.html"
            write_private(tmp, page.read_bytes(), mode=0o644)
            os.replace(tmp, out / f"{digest}.html")
            pages.append(nb)
        if pages:
            served.append(student)
    return served

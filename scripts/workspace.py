#!/usr/bin/env python
"""The student's own working copies of the course's notebooks, in ``workspace/`` (git ignores it).

    python scripts/workspace.py                          # create what is missing (make lab does)
    python scripts/workspace.py --fresh 03_zero_fsdp     # a fresh copy of one notebook
    python scripts/workspace.py --fresh a3_zero          # (the old one is kept as .bak)
    python scripts/workspace.py --keep a3_zero           # keep mine, stop saying it is older

``make lab`` runs it, then opens JupyterLab on ``workspace/``: the lectures under ``lectures/``
and the assignments under ``assignments/`` are one click away. The originals in ``notebooks/``
and ``assignments/`` are never touched, so ``git pull`` of course updates never conflicts with a
student's work. A notebook that an update adds appears in the workspace on the next
``make lab``; one the student already has is never overwritten (``--fresh`` replaces it, keeping
the old copy as ``NAME.ipynb.bak``, then ``.bak2``, ...). An update that changes a notebook the
student has a copy of is said on every ``make lab`` (:func:`outdated`), with how to get it,
until the student takes it (``--fresh``) or keeps their own (``--keep``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (COURSE_WORKSPACE: elsewhere, as the class hub keeps each student's in their home)
WORKSPACE = Path(os.environ.get("COURSE_WORKSPACE") or ROOT / "workspace")
# which version of the course's notebook each copy was made from: {copy's path: sha256}
RECORD = Path(".course") / "copies.json"

# Every kernel of `make lab` (IPYTHONDIR=workspace/.ipython) runs this first: course_utils' notebook
# messages (a failed check in one short block, a hint for a name an earlier cell defines) hold
# from the first cell on, after a kernel restart too.
STARTUP = """\
try:
    from course_utils.assess import messages as _course_messages
    _course_messages.install()
    del _course_messages
except Exception:  # a kernel without the course's environment: nothing to install
    pass
"""


def natural(name: str) -> list:
    """Sort key that reads numbers as numbers: a1, a2, ..., a10 (not a1, a10, a2)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def start_text(root: Path = ROOT) -> str:
    """The workspace's START_HERE.md: the modules and assignments there are, how to check your
    answers, how to submit."""
    lectures = sorted((p.stem for p in (root / "notebooks").glob("*.ipynb")), key=natural)
    assignments = sorted((p.parent.name for p in (root / "assignments").glob("*/*.ipynb")),
                         key=natural)
    self_check = (root / "solutions").is_dir()
    lines = [
        "# Your workspace", "",
        "Your own copies of the course's notebooks: edit and run them freely; course updates",
        "(`git pull`) never touch them. `make lab` adds notebooks that updates bring, and says",
        "which of your copies the course has a newer version of, and how to get it.", "",
        f"- `lectures/`: the {len(lectures)} modules, in order. Run each top to bottom, then its "
        "assignment:",
        *[f"  - `{name}`" for name in lectures],
        "- `assignments/`: one folder per assignment: "
        + ", ".join(f"`{a}`" for a in assignments) + ".",
        "  The cells under *Practice (not graded)* check your answers to twin questions as you",
        "  go; each test cell checks your graded answer's type and rejects the known wrong",
        "  values, saying which misconception they reveal. Whether it is right is decided when",
        "  it is graded.", "",
        "## Are my answers right?", "",
    ]
    if self_check:
        lines += [
            "Learning on your own with the full repository: from the repository's folder, run",
            "",
            "    make check A=a3_zero",
            "",
            "It grades your copy (`workspace/assignments/a3_zero/a3_zero.ipynb`) exactly as an",
            "instructor's grading would (the same sandbox, the same judge) and prints, for each",
            "question, right or wrong with the message that names the mistake; never the",
            "expected value.",
        ]
    else:
        lines += ["Your instructor grades your submission and sends you feedback: each question's",
                  "points and, for each one you missed, the message that names the mistake."]
    lines += [
        "", "## Submitting an assignment", "",
        "Send your instructor the notebook file itself, with its name unchanged:",
        "`workspace/assignments/<assignment>/<assignment>.ipynb` (for example",
        "`a3_zero.ipynb`). Outputs may be cleared (*Edit > Clear Outputs of All Cells*): the",
        "instructor runs the whole notebook again when grading it, in a fresh kernel, from top to",
        "bottom, so save it after your last change and make sure it runs top to bottom.", "",
        "A fresh copy of one notebook (the old one is kept as `NAME.ipynb.bak`):", "",
        "    python scripts/workspace.py --fresh 03_zero_fsdp", ""]
    return "\n".join(lines)


def sources(root: Path = ROOT) -> dict[str, tuple[Path, Path]]:
    """``{name: (original, copy in the workspace)}`` for every lecture and assignment notebook."""
    out = {}
    for nb in sorted((root / "notebooks").glob("*.ipynb"), key=lambda p: natural(p.name)):
        out[nb.stem] = (nb, Path("lectures") / nb.name)
    for nb in sorted((root / "assignments").glob("*/*.ipynb"), key=lambda p: natural(p.name)):
        out[nb.stem] = (nb, Path("assignments") / nb.parent.name / nb.name)
    return out


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _course_part(path: Path) -> str | None:
    """A digest of what a student does not write in a notebook: its markdown cells and the
    cells nbgrader locks (None if it cannot be read). Copies made before :data:`RECORD` kept
    track are compared by it."""
    try:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        kept = ["".join(c.get("source", [])) for c in cells
                if c.get("cell_type") == "markdown"
                or c.get("metadata", {}).get("nbgrader", {}).get("locked")]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return hashlib.sha256(json.dumps(kept).encode()).hexdigest()


def _read_record(workspace: Path) -> dict[str, str]:
    try:
        record = json.loads((workspace / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in record.items()} if isinstance(record, dict) else {}


def _backup(target: Path) -> Path:
    """A name for the student's old copy that no earlier backup has: NAME.ipynb.bak, .bak2, ..."""
    n, backup = 1, target.with_name(target.name + ".bak")
    while backup.exists():
        n += 1
        backup = target.with_name(f"{target.name}.bak{n}")
    return backup


def outdated(workspace: Path = WORKSPACE, root: Path = ROOT) -> list[str]:
    """The notebooks whose copy in ``workspace`` was made from an older version of the course's
    (the names ``--fresh`` and ``--keep`` take), in course order."""
    record = _read_record(workspace)
    out = []
    for name, (original, rel) in sources(root).items():
        copy = workspace / rel
        if not copy.exists():
            continue
        made_from = record.get(rel.as_posix())
        if made_from is None:  # (a copy made before the record: compare what it did not write)
            if _course_part(copy) != _course_part(original):
                out.append(name)
        elif made_from != _digest(original):
            out.append(name)
    return out


def sync(workspace: Path = WORKSPACE, fresh: list[str] = (), root: Path = ROOT,
         keep: list[str] = ()) -> list[Path]:
    """Copy every notebook the workspace lacks (and those named in ``fresh``, the old copy kept
    as a backup); returns the copies made. Existing copies are never overwritten. ``keep``: the
    student keeps these copies as they are, though the course has a newer version."""
    known = sources(root)
    for flag, names in (("--fresh", fresh), ("--keep", keep)):
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"{flag}: no notebook named {', '.join(unknown)}; choose from "
                             f"{', '.join(known)}")
    record = _read_record(workspace)
    made = []
    for name, (original, rel) in known.items():
        target = workspace / rel
        if target.exists() and name not in fresh:
            if name in keep or (rel.as_posix() not in record
                                and _course_part(target) == _course_part(original)):
                record[rel.as_posix()] = _digest(original)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            shutil.copy2(target, _backup(target))
        shutil.copyfile(original, target)
        record[rel.as_posix()] = _digest(original)
        made.append(target)
    (workspace / RECORD).parent.mkdir(parents=True, exist_ok=True)
    (workspace / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n",
                                    encoding="utf-8")
    startup = workspace / ".ipython" / "profile_default" / "startup" / "00-course.py"
    startup.parent.mkdir(parents=True, exist_ok=True)
    startup.write_text(STARTUP)
    start = workspace / "START_HERE.md"
    text = start_text(root)
    if not start.exists() or start.read_text() != text:  # (ours, not the student's: kept current)
        start.write_text(text)
    return made


def update_notice(names: list[str], workspace: Path = WORKSPACE, root: Path = ROOT) -> str:
    """What ``make lab`` says about copies the course has a newer version of ("" if none)."""
    if not names:
        return ""
    known = sources(root)
    copies = "\n".join(f"  {(workspace / known[n][1]).relative_to(workspace.parent)}"
                       for n in names)
    one = names[0]
    return (f"workspace: the course has a newer version of {len(names)} of your notebooks "
            f"(your copies are kept as they are):\n{copies}\n"
            f"workspace: to get one, `python scripts/workspace.py --fresh {one}` (your copy is "
            f"kept beside it as {one}.ipynb.bak: copy your work across); to keep yours and stop "
            f"this notice, `python scripts/workspace.py --keep {one}`")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fresh", nargs="+", default=[], metavar="NAME",
                        help="replace these notebooks' copies with the originals (yours are "
                             "kept as NAME.ipynb.bak)")
    parser.add_argument("--keep", nargs="+", default=[], metavar="NAME",
                        help="keep your copies of these notebooks though the course has a "
                             "newer version (stops the notice)")
    args = parser.parse_args(argv)
    try:
        made = sync(fresh=args.fresh, keep=args.keep)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    for path in made:
        print(f"workspace: {path.relative_to(WORKSPACE.parent)}")
    notice = update_notice(outdated())
    if notice:
        print(notice)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""The student's own working copies of the course's notebooks, in ``workspace/`` (git ignores it).

    python scripts/workspace.py                          # create what is missing (make lab does)
    python scripts/workspace.py --fresh 03_zero_fsdp     # a fresh copy of one notebook
    python scripts/workspace.py --fresh a3_zero          # (the old one is kept as .bak)

``make lab`` runs it, then opens JupyterLab on ``workspace/``: the lectures under ``lectures/``
and the assignments under ``assignments/`` are one click away. The originals in ``notebooks/``
and ``assignments/`` are never touched, so ``git pull`` of course updates never conflicts with a
student's work. A notebook that an update adds appears in the workspace on the next
``make lab``; one the student already has is never overwritten (``--fresh`` replaces it, keeping
the old copy as ``NAME.ipynb.bak``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKSPACE = ROOT / "workspace"

# Every kernel of `make lab` (IPYTHONDIR=workspace/.ipython) runs this first: course_utils' notebook
# messages (a failed check in one short block, a hint for a name an earlier cell defines) hold
# from the first cell on, after a kernel restart too.
STARTUP = """\
try:
    from course_utils import messages as _course_messages
    _course_messages.install()
    del _course_messages
except Exception:  # a kernel without the course's environment: nothing to install
    pass
"""


def start_text(root: Path = ROOT) -> str:
    """The workspace's START_HERE.md: the modules and assignments there are, how to check your
    answers, how to submit."""
    lectures = sorted(p.stem for p in (root / "notebooks").glob("*.ipynb"))
    assignments = sorted(p.parent.name for p in (root / "assignments").glob("*/*.ipynb"))
    self_check = (root / "solutions").is_dir()
    lines = [
        "# Your workspace", "",
        "Your own copies of the course's notebooks: edit and run them freely; course updates",
        "(`git pull`) never touch them. `make lab` adds notebooks that updates bring.", "",
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
    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        out[nb.stem] = (nb, Path("lectures") / nb.name)
    for nb in sorted((root / "assignments").glob("*/*.ipynb")):
        out[nb.stem] = (nb, Path("assignments") / nb.parent.name / nb.name)
    return out


def sync(workspace: Path = WORKSPACE, fresh: list[str] = (), root: Path = ROOT) -> list[Path]:
    """Copy every notebook the workspace lacks (and those named in ``fresh``); returns the
    copies made. Existing copies are left as they are."""
    known = sources(root)
    unknown = [n for n in fresh if n not in known]
    if unknown:
        raise ValueError(f"--fresh: no notebook named {', '.join(unknown)}; choose from "
                         f"{', '.join(known)}")
    made = []
    for name, (original, rel) in known.items():
        target = workspace / rel
        if target.exists() and name not in fresh:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            shutil.copy2(target, target.with_name(target.name + ".bak"))
        shutil.copyfile(original, target)
        made.append(target)
    startup = workspace / ".ipython" / "profile_default" / "startup" / "00-course.py"
    startup.parent.mkdir(parents=True, exist_ok=True)
    startup.write_text(STARTUP)
    start = workspace / "START_HERE.md"
    text = start_text(root)
    if not start.exists() or start.read_text() != text:  # (ours, not the student's: kept current)
        start.write_text(text)
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fresh", nargs="+", default=[], metavar="NAME",
                        help="replace these notebooks' copies with the originals")
    args = parser.parse_args(argv)
    try:
        made = sync(fresh=args.fresh)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    for path in made:
        print(f"workspace: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

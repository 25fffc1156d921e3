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

START = """\
# Your workspace

Your own copies of the course's notebooks: edit and run them freely; course updates
(`git pull`) never touch them. `make lab` adds notebooks that updates bring.

- `lectures/`: the modules, in order (01 ... 07). Run each top to bottom.
- `assignments/`: one folder per assignment. The cells under "Practice (not graded)" check your
  answers as you go; the **Validate** button runs every visible test. Submit the `.ipynb` file
  your instructor asks for.

A fresh copy of one notebook (the old one is kept as `NAME.ipynb.bak`):

    python scripts/workspace.py --fresh 03_zero_fsdp
"""


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
    start = workspace / "START_HERE.md"
    if not start.exists():
        start.write_text(START)
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

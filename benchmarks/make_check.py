"""``make check`` against the notebook's own run: how much grading one's own copy adds.

    .venv/bin/python benchmarks/make_check.py                       # a3_zero and a10_capstone
    .venv/bin/python benchmarks/make_check.py a1_training_state

For each assignment: the reference solution run top to bottom in a fresh kernel, as a student
runs their notebook (nbclient, the course's kernel, not sandboxed); then ``scripts/grade.py
check`` on the same notebook twice (the first run registers the assignment in a gradebook kept
in ``.cache/check``; the reference run is cached as in grading), timed from the command's start
to its end, and the second run's ratio to the notebook's. Results also go to
``benchmarks/results/make_check.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def notebook_seconds(assignment: str) -> float:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(ROOT / "solutions" / assignment / f"{assignment}.ipynb", as_version=4)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": tmp}}).execute()
        return time.perf_counter() - started


def check_seconds(assignment: str, notebook: Path) -> float:
    started = time.perf_counter()
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "grade.py"), "check",
                          assignment, "--notebook", str(notebook)], capture_output=True,
                         text=True, timeout=1800, cwd=ROOT,
                         env=dict(os.environ, COURSE_SOLUTIONS_CHECK="off"))
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("assignments", nargs="*", default=["a3_zero", "a10_capstone"])
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    rows = []
    for a in args.assignments:
        own = notebook_seconds(a)
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / f"{a}.ipynb"
            copy.write_bytes((ROOT / "solutions" / a / f"{a}.ipynb").read_bytes())
            first, second = check_seconds(a, copy), check_seconds(a, copy)
        rows.append({"assignment": a, "notebook_s": round(own, 1), "check_first_s":
                     round(first, 1), "check_s": round(second, 1),
                     "ratio": round(second / own, 2)})
        print(f"{a}: notebook {own:.1f} s; make check {first:.1f} s the first time, then "
              f"{second:.1f} s ({second / own:.2f} x the notebook)", flush=True)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "make_check.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

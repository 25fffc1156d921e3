"""Wall time of each lecture notebook run top to bottom in a fresh kernel (as a student would).

Run: .venv/bin/python benchmarks/notebook_times.py [NAME ...]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
# the kernels import this checkout's course_utils (not an editable install of another checkout)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def main() -> None:
    names = sys.argv[1:] or sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    total = 0.0
    for name in names:
        nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
        t0 = time.perf_counter()
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
        elapsed = time.perf_counter() - t0
        total += elapsed
        print(f"{name:24s} {elapsed:6.1f} s", flush=True)
    print(f"{'all notebooks':24s} {total:6.1f} s")


if __name__ == "__main__":
    main()

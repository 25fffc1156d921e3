"""Wall time of each lecture notebook run top to bottom in a fresh kernel (as a student would),
and the CPU seconds it took: the kernel's, its ranks' and every other process it started (on
Linux this process becomes their subreaper, so processes orphaned on the way, such as a
kernel's forkserver, are counted too). CPU seconds hardly change with the machine's load;
wall seconds do.

Run: .venv/bin/python benchmarks/notebook_times.py [NAME ...]
"""

from __future__ import annotations

import ctypes
import os
import resource
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
# the kernels import this checkout's course_utils (not an editable install of another checkout)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


PR_SET_CHILD_SUBREAPER = 36   # linux/prctl.h


def _children_cpu_s(settle_s: float = 10.0) -> float:
    """CPU seconds of every descendant that has ended, after reaping the orphans handed to this
    process (waiting up to ``settle_s`` for them to end)."""
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:       # no child left
            break
        if pid == 0:
            time.sleep(0.05)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    names = sys.argv[1:] or sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    total = total_cpu = 0.0
    for name in names:
        nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
        cpu0, t0 = _children_cpu_s(0), time.perf_counter()
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
        elapsed = time.perf_counter() - t0
        cpu = _children_cpu_s() - cpu0
        total, total_cpu = total + elapsed, total_cpu + cpu
        print(f"{name:24s} {elapsed:6.1f} s wall {cpu:6.1f} s CPU  (load {os.getloadavg()[0]:.1f})",
              flush=True)
    print(f"{'all notebooks':24s} {total:6.1f} s wall {total_cpu:6.1f} s CPU")


if __name__ == "__main__":
    main()

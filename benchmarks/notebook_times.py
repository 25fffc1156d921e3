"""Wall time of each lecture notebook run top to bottom in a fresh kernel (as a student would),
and the CPU seconds it took: the kernel's, its ranks' and every other process it started (on
Linux this process becomes their subreaper, so processes orphaned on the way, such as a
kernel's forkserver, are counted too). CPU seconds hardly change with the machine's load;
wall seconds do.

Run: .venv/bin/python benchmarks/notebook_times.py [NAME ...] [--cells N] [--file PATH]

``--cells N`` also prints each notebook's N slowest cells (the kernel's own timing of each
cell, from its execute_input to its execute_reply: start-up and the kernel's launch are the
difference to the total). ``--file`` times another copy of a notebook (an older version, say)
under the same conditions. The machine's load average is printed before and after: on a
shared machine, compare runs made back to back.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
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


def _seconds(cell: nbformat.NotebookNode) -> float | None:
    timing = cell.metadata.get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not (start and end):
        return None
    parse = datetime.datetime.fromisoformat
    return (parse(end.replace("Z", "+00:00")) - parse(start.replace("Z", "+00:00"))).total_seconds()


def run(path: Path, cells: int) -> tuple[float, float]:
    """Execute the notebook at ``path`` (in ``notebooks/``); print its wall and CPU seconds and
    its slowest cells; return (wall, CPU)."""
    nb = nbformat.read(path, as_version=4)
    cpu0, t0 = _children_cpu_s(0), time.perf_counter()
    NotebookClient(nb, timeout=300, kernel_name="python3", record_timing=True,
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    elapsed = time.perf_counter() - t0
    cpu = _children_cpu_s() - cpu0
    print(f"{path.stem:24s} {elapsed:6.1f} s wall {cpu:6.1f} s CPU  (load "
          f"{os.getloadavg()[0]:.1f})", flush=True)
    if cells:
        timed = [(s, k, c.source.splitlines()[0][:60]) for k, c in enumerate(nb.cells)
                 if c.cell_type == "code" and (s := _seconds(c)) is not None]
        print(f"    cells together {sum(s for s, _, _ in timed):5.1f} s; the slowest:")
        for s, k, first in sorted(timed, reverse=True)[:cells]:
            print(f"    {s:5.1f} s  cell {k:2d}  {first}")
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="lecture names (default: all)")
    parser.add_argument("--cells", type=int, default=0, help="print the N slowest cells")
    parser.add_argument("--file", type=Path, action="append", default=[],
                        help="time this notebook file too")
    args = parser.parse_args()
    names = args.names or ([] if args.file else
                           sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb")))
    paths = [ROOT / "notebooks" / f"{name}.ipynb" for name in names] + args.file
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    times = [run(path, args.cells) for path in paths]
    print(f"{'all notebooks':24s} {sum(w for w, _ in times):6.1f} s wall "
          f"{sum(c for _, c in times):6.1f} s CPU")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

"""Memory a lecture's kernel holds once it has run (issue 36): the kernel and what it started
(the rank forkserver ``course_utils.launch`` keeps for fast launches, its resource tracker).

Each lecture runs top to bottom in a fresh kernel, as a student runs it; then, with the kernel
idle (a tab left open), every process of it is measured: RSS (what ``top`` shows: shared
libraries counted in full in each process), USS (pages no other process shares: what ending
the kernel gives back) and PSS (shared pages split among the processes sharing them: the fair
share, and the sum over kernels of what they hold). The student configuration shuts a kernel
down after 30 idle minutes (``jupyter/student/jupyter_server_config.json``).

Run: .venv/bin/python benchmarks/kernel_footprint.py [NAME ...]   (default: every lecture)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
import psutil
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
MB = 1e6


def footprint(pid: int) -> dict[str, dict[str, float]]:
    """``{"kernel": {...}, "forkserver": {...}, "other": {...}}``: summed rss/uss/pss (MB) of
    the kernel ``pid`` and of its descendants, by kind."""
    kernel = psutil.Process(pid)
    out: dict[str, dict[str, float]] = {}
    for proc in [kernel] + kernel.children(recursive=True):
        try:
            info, cmd = proc.memory_full_info(), " ".join(proc.cmdline())
        except psutil.Error:
            continue
        kind = ("kernel" if proc.pid == pid else "forkserver" if "forkserver" in cmd
                else "other")
        row = out.setdefault(kind, {"n": 0, "rss": 0.0, "uss": 0.0, "pss": 0.0})
        row["n"] += 1
        for key in ("rss", "uss", "pss"):
            row[key] += getattr(info, key) / MB
    return out


def measure(name: str) -> dict[str, dict[str, float]]:
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT / "notebooks")}})
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        time.sleep(1.0)  # (ranks of the last launch exit; the kernel is idle)
        return footprint(client.km.provisioner.process.pid)


def main() -> None:
    names = sys.argv[1:] or sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    print(f"{'lecture':24s} {'kernel PSS':>10s} {'forkserver PSS':>14s} {'other PSS':>9s} "
          f"{'total PSS':>9s} {'total USS':>9s} {'total RSS':>9s}  (MB)")
    totals = []
    for name in names:
        f = measure(name)
        total = {k: sum(row[k] for row in f.values()) for k in ("rss", "uss", "pss")}
        totals.append(total)
        get = lambda kind: f.get(kind, {}).get("pss", 0.0)  # noqa: E731
        print(f"{name:24s} {get('kernel'):10.0f} {get('forkserver'):14.0f} {get('other'):9.0f} "
              f"{total['pss']:9.0f} {total['uss']:9.0f} {total['rss']:9.0f}", flush=True)
    if len(totals) > 1:
        pss = [t["pss"] for t in totals]
        print(f"{'mean of ' + str(len(pss)):24s} {'':10s} {'':14s} {'':9s} "
              f"{sum(pss) / len(pss):9.0f}   min {min(pss):.0f}, max {max(pss):.0f}")


if __name__ == "__main__":
    main()

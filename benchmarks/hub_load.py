#!/usr/bin/env python
"""The class hub under load (issue 47): N students log in and run lecture 1 at the same time.

    .venv/bin/python benchmarks/hub_load.py [--students 1 2 4 6]     # as root

For each N, a fresh hub (``hub.client.RunningHub``, every part real: proxy, authenticator,
sandboxed servers in cgroups) with N students. Each student, in a thread of their own, logs in
through the login form, starts a server (spawn: from the login to JupyterLab's page), and runs
lecture 1 top to bottom in a kernel of it (``nbconvert --execute``, as the hub's test does).
Meanwhile the instructor's session asks the hub for a page (``/hub/home``) every 0.5 s: its
latency, median and 95th percentile, is what every other user of the hub waits. After the run:
each student's peak memory (their memory cgroup's ``max_usage_in_bytes``: server, kernel and
lecture 1's ranks together).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hub import accounts  # noqa: E402
from hub.client import RunningHub, login, open_lab, run_lecture  # noqa: E402

def _peak_bytes(student: str) -> int | None:
    """The student's memory cgroup's peak (any process of theirs still in it names it)."""
    import pwd

    uid = pwd.getpwnam(student).pw_uid
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and p.stat().st_uid == uid:
                for line in (p / "cgroup").read_text().split():
                    _, names, path = line.split(":", 2)
                    if "memory" in names.split(","):
                        group = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
                        return int((group / "memory.max_usage_in_bytes").read_text())
        except (OSError, ValueError):
            continue
    return None


def one_class(n: int) -> dict:
    students = tuple(f"dtpl-{i:03d}" for i in range(n))
    for s in students:
        accounts.remove_account(s)
    with tempfile.TemporaryDirectory(prefix="hub-load-") as tmp:
        hub = RunningHub(Path(tmp), students)
        latencies: list[float] = []
        done = threading.Event()

        def watch() -> None:
            staff = login(hub, "instructor")
            while not done.is_set():
                t0 = time.monotonic()
                staff.get(f"{hub.url}/hub/home")
                latencies.append(time.monotonic() - t0)
                time.sleep(0.5)

        def student(name: str) -> dict:
            t0 = time.monotonic()
            s = login(hub, name)
            open_lab(hub, s)
            spawn = time.monotonic() - t0
            finished, lecture_s, why = run_lecture(hub, s)
            return {"student": name, "spawn_s": spawn, "lecture_ok": finished,
                    "lecture_s": lecture_s, "peak_bytes": _peak_bytes(name), "why": why}

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            with ThreadPoolExecutor(n) as pool:
                rows = list(pool.map(student, students))
        finally:
            done.set()
            watcher.join(10)
            hub.stop()
            for s in students:
                accounts.remove_account(s)
    lat = sorted(latencies)
    peaks = [r["peak_bytes"] for r in rows if r["peak_bytes"]]
    return {"students": n, "page_p50_s": statistics.median(lat),
            "page_p95_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))],
            "spawn_max_s": max(r["spawn_s"] for r in rows),
            "spawn_mean_s": statistics.mean(r["spawn_s"] for r in rows),
            "lecture_max_s": max(r["lecture_s"] for r in rows),
            "lectures_failed": sum(not r["lecture_ok"] for r in rows),
            "peak_mib_max": max(peaks) / 2**20 if peaks else float("nan"),
            "peak_mib_mean": statistics.mean(peaks) / 2**20 if peaks else float("nan"),
            "why_failed": sorted({r["why"] for r in rows if not r["lecture_ok"]})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, nargs="+", default=[1, 2, 4, 6])
    args = parser.parse_args()
    print("students  page p50  page p95  spawn mean/max  lecture 1 max  failed  peak MiB mean/max")
    for n in args.students:
        r = one_class(n)
        print(f"{r['students']:>8}  {r['page_p50_s']:7.3f}s  {r['page_p95_s']:7.3f}s  "
              f"{r['spawn_mean_s']:6.1f}/{r['spawn_max_s']:5.1f}s  {r['lecture_max_s']:12.1f}s  "
              f"{r['lectures_failed']:>6}  {r['peak_mib_mean']:8.0f}/{r['peak_mib_max']:.0f}",
              flush=True)
        for why in r["why_failed"]:
            print(f"          failed: {why}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

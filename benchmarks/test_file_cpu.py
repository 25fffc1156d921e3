"""CPU and wall seconds of test files, each run alone (pytest, no xdist), ranks included.

Run: .venv/bin/python benchmarks/test_file_cpu.py tests/test_launch.py tests/test_zero.py ...

``/usr/bin/time`` undercounts a file that starts ranks: launch.run forks them from a forkserver
that the test process never waits for, so neither the forkserver nor its ranks reach the test
process's children's CPU time (test_train3d: 16.6 CPU-s by /usr/bin/time, 73.2 by its
cgroup). Here each file runs in a cgroup-v1 ``cpuacct`` group of its own (needs root and a
writable ``/sys/fs/cgroup/cpuacct``), whose usage counts every process it started; elsewhere
the script falls back to the children's rusage and says so. A file alone also pays pytest's
start and the forkserver's (about 9 CPU-s together here), which ``make test`` pays once per
worker. Timings of a shared machine vary: compare CPU seconds, and wall times of one run.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def run_alone(test_file: str, index: int) -> tuple[float, float, str, str]:
    """(wall s, CPU s, how the CPU was counted, pytest's last line) of one file."""
    cmd = [sys.executable, "-m", "pytest", test_file, "-q", "-p", "no:xdist",
           "-p", "no:cacheprovider"]
    group = CPUACCT / f"test-file-cpu-{os.getpid()}-{index}"
    try:
        group.mkdir()
    except OSError:
        group = None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    join = (lambda: (group / "cgroup.procs").write_text(str(os.getpid()))) if group else None
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, preexec_fn=join)
    wall = time.monotonic() - t0
    last = (out.stdout.strip().splitlines() or [""])[-1]
    if group is None:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        return wall, cpu, "rusage (ranks missed)", last
    deadline = time.monotonic() + 30  # the forkserver exits once the test process has gone
    while (group / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.2)
    cpu = int((group / "cpuacct.usage").read_text()) / 1e9
    left = (group / "cgroup.procs").read_text().split()
    if not left:
        group.rmdir()
    return wall, cpu, "cgroup" + (f" ({len(left)} process(es) left in {group})" if left else ""), \
        last


def main() -> None:
    files = sys.argv[1:]
    if not files:
        sys.exit(__doc__)
    print(f"{'file':34s} {'CPU s':>8s} {'wall s':>8s}  counted by / pytest")
    for i, f in enumerate(files):
        wall, cpu, how, last = run_alone(f, i)
        print(f"{Path(f).name:34s} {cpu:8.1f} {wall:8.1f}  {how}: {last}", flush=True)


if __name__ == "__main__":
    main()

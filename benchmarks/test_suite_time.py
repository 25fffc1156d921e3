"""Where the test suite's time goes: wall time, and test time by area.

Run: .venv/bin/python benchmarks/test_suite_time.py [pytest args]   (e.g. ``-m "not slow"``)
     .venv/bin/python benchmarks/test_suite_time.py --from results.xml   (only summarize)
     .venv/bin/python benchmarks/test_suite_time.py --timeline FOLDER    (idle CPUs: see
         benchmarks/suite_timeline.py, the plugin that records when each test ran)

Runs pytest with a JUnit XML report (``benchmarks/results/suite.xml``), then prints the wall
time, the summed test time per area (unit, launcher, notebooks, assignment grading, browser) and the 15 slowest tests. With ``-n 2`` the areas' sums add up to
more than the wall time: that is the parallelism. A test's time includes its share of fixture
set-up (a module-scoped fixture is charged to the first test that needs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "suite.xml"

AREAS = [  # (area, predicate on the test's file path relative to the repo)
    ("notebooks", lambda f: f.startswith("notebooks/")),
    ("browser", lambda f: "test_browser_" in f),
    # round trips and the integrity suite share one autograde per assignment (tests/conftest.py):
    # its time is charged to whichever test of the assignment ran first, so they are one area
    ("grading (round trips + integrity)", lambda f: f.endswith(("test_assignments.py",
                                                                "test_grading_integrity.py"))),
    ("launcher", lambda f: f.endswith("test_launch.py")),
    ("unit and real-rank modules", lambda f: True),
]


def area_of(path: str) -> str:
    """The area a test file belongs to (first matching entry of :data:`AREAS`)."""
    return next(name for name, match in AREAS if match(path))


def _file_of(case: ET.Element) -> str:
    """The repository-relative file of a JUnit ``testcase`` (pytest puts it in classname)."""
    name = case.get("file")
    if name:
        return name
    cls = case.get("classname", "")
    if cls.startswith("notebooks.") or ".ipynb" in cls or cls.endswith("ipynb"):
        return "notebooks/" + cls.split(".", 1)[-1]
    return cls.replace(".", "/") + ".py"


def summarize(xml_path: Path, wall: float | None = None) -> str:
    """A text table: tests, failures and summed seconds per area, then the slowest tests."""
    root = ET.parse(xml_path).getroot()
    by_area: dict[str, list[float]] = defaultdict(list)
    failed: dict[str, int] = defaultdict(int)
    slow = []
    for case in root.iter("testcase"):
        f = _file_of(case)
        area = area_of(f)
        t = float(case.get("time", 0))
        by_area[area].append(t)
        if case.find("failure") is not None or case.find("error") is not None:
            failed[area] += 1
        slow.append((t, f"{case.get('classname')}::{case.get('name')}"))
    lines = [f"{'area':34s} {'tests':>6s} {'failed':>6s} {'seconds':>8s}"]
    total = 0.0
    for name, _ in AREAS:
        if name in by_area:
            s = sum(by_area[name])
            total += s
            lines.append(f"{name:34s} {len(by_area[name]):6d} {failed[name]:6d} {s:8.0f}")
    lines.append(f"{'sum of test times':34s} {sum(map(len, by_area.values())):6d} "
                 f"{sum(failed.values()):6d} {total:8.0f}")
    if wall is not None:
        lines.append(f"{'wall time':34s} {'':6s} {'':6s} {wall:8.0f}")
    lines.append("\nslowest 15 tests (s):")
    lines += [f"{t:8.1f}  {name}" for t, name in sorted(slow, reverse=True)[:15]]
    return "\n".join(lines)


def timeline(folder: Path, window_s: float = 60.0, top: int = 15) -> str:
    """Where a parallel run left CPUs idle, from ``benchmarks/suite_timeline.py``'s records:
    each worker's test time and gaps; the CPUs' idle core-seconds, each second's shared among
    the tests running then (the tests that wait: sleeps, timeouts, a Slurm time limit); the
    windows of ``window_s`` seconds under 75 % busy, with what ran in them."""
    runs = {p.stem: [json.loads(line) for line in p.open()]
            for p in sorted(folder.glob("*.jsonl")) if p.stem != "cpu"}
    tests = [(r["start"], r["end"], w, r["test"]) for w, rs in runs.items() for r in rs]
    if not tests:
        raise ValueError(f"no test records in {folder} (run pytest with -p suite_timeline)")
    t0, t1 = min(t[0] for t in tests), max(t[1] for t in tests)
    lines = [f"span of the tests: {t1 - t0:.0f} s"]
    for w, rs in runs.items():
        busy = sum(r["end"] - r["start"] for r in rs)
        lines.append(f"  {w}: {len(rs)} tests, {busy:.0f} s in tests, {t1 - t0 - busy:.0f} s "
                     f"between or after them")
    cpu_file = folder / "cpu.jsonl"
    samples = [json.loads(line) for line in cpu_file.open()] if cpu_file.exists() else []
    if not samples:
        return "\n".join(lines + ["(no CPU samples: not Linux, or the controller's lost)"])
    cpus = samples[0]["cpus"]
    idle_by: dict[str, float] = defaultdict(float)
    windows: dict[int, list] = defaultdict(list)
    prev = samples[0]["t"] - 1.0
    for s in samples:
        dt, idle = s["t"] - prev, (1 - s["busy"]) * cpus * (s["t"] - prev)
        prev = s["t"]
        running = [name for a, b, _, name in tests if a <= s["t"] < b] or ["(no test)"]
        for name in running:
            idle_by[name] += idle / len(running)
        windows[int((s["t"] - t0) // window_s)].append((s["busy"], dt, running))
    total_idle = sum(idle_by.values())
    span = samples[-1]["t"] - samples[0]["t"] + 1
    lines.append(f"CPUs ({cpus}) busy {100 - 100 * total_idle / (cpus * span):.1f} % of "
                 f"{span:.0f} s; idle {total_idle:.0f} core-seconds")
    lines.append(f"\nthe {top} tests beside the most idle CPU (core-seconds, shared):")
    lines += [f"{v:8.1f}  {k}" for k, v in sorted(idle_by.items(), key=lambda kv: -kv[1])[:top]]
    lines.append(f"\nwindows of {window_s:g} s under 75 % busy:")
    for n, rows in sorted(windows.items()):
        busy = sum(b * dt for b, dt, _ in rows) / max(1e-9, sum(dt for _, dt, _ in rows))
        if busy < 0.75:
            names = sorted({name for _, _, running in rows for name in running})
            lines.append(f"  {n * window_s:5.0f}-{(n + 1) * window_s:5.0f} s: {100 * busy:3.0f} % "
                         f"busy: " + "; ".join(names[:6]) + (" ..." if len(names) > 6 else ""))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--from"]:
        print(summarize(Path(argv[1])))
        return 0
    if argv[:1] == ["--timeline"]:
        print(timeline(Path(argv[1])))
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    import suite_timeline  # (this folder: the plugin the run loads, and where it writes)

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).parent)] + [p for p in os.environ.get("PYTHONPATH", "").split(
            os.pathsep) if p]))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", f"--junitxml={OUT}",
                           "-o", "junit_family=xunit1", "-p", "suite_timeline", *argv], cwd=ROOT,
                          env=env)
    wall = time.perf_counter() - t0
    print(summarize(OUT, wall))
    print("\n" + timeline(suite_timeline.OUT))
    print(f"pytest exit code {proc.returncode}; reports: {OUT.relative_to(ROOT)}, "
          f"{suite_timeline.OUT.relative_to(ROOT)}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

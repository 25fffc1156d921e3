"""Where the test suite's time goes: wall time, and test time by area.

Run: .venv/bin/python benchmarks/test_suite_time.py [pytest args]   (e.g. ``-m "not slow"``)
     .venv/bin/python benchmarks/test_suite_time.py --from results.xml   (only summarize)

Runs pytest with a JUnit XML report (``benchmarks/results/suite.xml``), then prints the wall
time, the summed test time per area (unit, launcher, notebooks, assignment grading, browser) and the 15 slowest tests. With ``-n 2`` the areas' sums add up to
more than the wall time: that is the parallelism. A test's time includes its share of fixture
set-up (a module-scoped fixture is charged to the first test that needs it).
"""

from __future__ import annotations

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


def main(argv: list[str]) -> int:
    if argv[:1] == ["--from"]:
        print(summarize(Path(argv[1])))
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", f"--junitxml={OUT}",
                           "-o", "junit_family=xunit1", *argv], cwd=ROOT)
    wall = time.perf_counter() - t0
    print(summarize(OUT, wall))
    print(f"pytest exit code {proc.returncode}; report: {OUT.relative_to(ROOT)}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

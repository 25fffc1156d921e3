"""Wall time of the whole test suite, and of its slowest tests.

Run: .venv/bin/python benchmarks/test_suite_time.py [extra pytest args]
Prints the total wall time and pytest's 15 slowest tests.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "--durations=15",
                           *sys.argv[1:]], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    tail = proc.stdout.split("slowest 15 durations", 1)[-1]
    print("slowest 15 durations" + tail)
    print(f"whole suite: {wall:.0f} s wall, exit code {proc.returncode}")


if __name__ == "__main__":
    main()

"""Launcher start-up: wall time of a trivial job (all-reduce of the rank numbers).

First launch (forkserver start + imports) and warm launches, for 2 and 4 ranks.
Run: .venv/bin/python benchmarks/launch_startup.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from course_utils import launch  # noqa: E402


def timed(world_size: int) -> float:
    t0 = time.perf_counter()
    assert launch.run(launch.ping, world_size) == [sum(range(world_size))] * world_size
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    first = timed(2)
    print(f"first launch (2 ranks, forkserver start): {first:.2f} s")
    for ws in (2, 4):
        times = [timed(ws) for _ in range(args.repeats)]
        print(f"warm launch, {ws} ranks: median {statistics.median(times):.3f} s, "
              f"max {max(times):.3f} s over {args.repeats}")


if __name__ == "__main__":
    main()

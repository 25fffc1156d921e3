"""Module 12's lost node: the time from node b's death to node a's first step alone, with the
course's rendezvous settings and with torchrun's defaults (the heartbeat rule and the last call).

Run: .venv/bin/python benchmarks/lost_node.py [--repeats R]
"""

from __future__ import annotations

import argparse
import statistics

from course_utils.checkpoint import lost_node

SETTINGS = {"course (heartbeat 1 s x 2, last call 1 s)": lost_node.Plan(),
            "torchrun's defaults (5 s x 3, last call 30 s)": lost_node.Plan(
                keep_alive_s=5, keep_alive_attempts=3, last_call_s=30)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    for label, plan in SETTINGS.items():
        runs = [lost_node.run(plan, timeout_s=300) for _ in range(args.repeats)]
        restart = [r["restart_s"] for r in runs]
        print(f"{label}: kill -> first step on one rank {statistics.median(restart):.1f} s "
              f"(runs: {', '.join(f'{x:.1f}' for x in restart)}); whole run "
              f"{statistics.median(r['wall_s'] for r in runs):.1f} s; largest loss difference "
              f"{max(r['largest_difference'] for r in runs):.1e}")


if __name__ == "__main__":
    main()

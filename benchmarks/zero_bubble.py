"""Zero-bubble schedules on real gloo ranks: issue 40's closing table.

For each schedule (1F1B and ZB-H1 from send/recv, torch's ZBV and DualPipeV), P ranks and m
microbatches, F = I = W = --op-ms per rank (a V's chunk half of it, B twice it): the bubble from
the paper's formula, simulated and measured (median over --steps steps after a warm-up; with the
optimizer's global check, and without it, "no check"), the measured makespan's excess per op
over the simulated one (messages, waking up), and the activations each rank holds at its peak,
predicted by the simulator and measured (bytes kept for a later I or W, over one microbatch's).

    .venv/bin/python benchmarks/zero_bubble.py                  # P=4, m=8, 10 ms, 5 steps
    .venv/bin/python benchmarks/zero_bubble.py -p 2 -m 4 8 16 --op-ms 20

On a loaded machine every op pays more for waking up: compare the rows of one run, and repeat a
run before believing one figure (the load average is printed).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from course_utils.pipeline import schedule as ps  # noqa: E402
from course_utils.pipeline import zero_bubble as zb  # noqa: E402
from course_utils.pipeline import zero_bubble_runtime as zbp  # noqa: E402

SCHEDULES = ("1f1b", "zb-h1", "zbv", "dualpipev")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", type=int, default=4, help="pipeline ranks")
    parser.add_argument("-m", type=int, nargs="+", default=[8], help="microbatches (>= 2P)")
    parser.add_argument("--op-ms", type=float, default=10.0, help="F = I = W per rank, in ms")
    parser.add_argument("--steps", type=int, default=5, help="timed steps, after a warm-up")
    args = parser.parse_args(argv)
    print(f"P={args.p} F=I=W={args.op_ms:g} ms (B {2 * args.op_ms:g} ms) steps={args.steps}; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    for m in args.m:
        rows = zbp.measure_schedules(args.p, m, SCHEDULES, op_time_s=args.op_ms / 1000,
                                     steps=args.steps, timeout_s=600)
        print(f"\nm={m}: {'formula':>8s}{'simulated':>10s}{'measured':>9s}{'min..max':>13s}"
              f"{'no check':>9s}{'excess/op':>10s}   peak per rank: predicted | measured")
        for name, row in rows.items():
            sim = ps.simulate(name, args.p, m, backward_ratio=2.0)
            tl = row["timeline"]
            excess = (tl.makespan * 1e3 - sim.makespan * args.op_ms) / (len(tl.ops) / args.p)
            spread = f"{min(row['per_step']):.3f}..{max(row['per_step']):.3f}"
            predicted = ", ".join(f"{x:g}" for x in sim.peak_activations())
            measured = ", ".join(f"{x:g}" for x in row["peak"])
            print(f"{name:10s}{zb.paper_bubble_fraction(name, args.p, m, 1, 1, 1):7.1%}"
                  f"{sim.idle_fraction():10.1%}{row['idle']:9.1%}{spread:>13s}"
                  f"{row['idle_nosync']:9.1%}{excess:8.2f}ms   {predicted} | {measured}")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

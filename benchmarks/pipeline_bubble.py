"""Pipeline bubble on real gloo ranks: measured idle fraction vs (P - 1)/(m + P - 1).

For each P (default 2 and 4) and m (default 1, 2, 4, 8, 16), runs a GPipe step on P ranks
(course_utils.pipeline.runtime), timestamps every forward and backward on every rank, and
prints the formula, the measured idle fraction (median over steps), its spread over steps, the
measured and ideal makespans, and the excess time per op on the critical path (communication,
waking up in recv, sleep overshoot on a loaded machine: what the formula leaves out). Implementations:
``scratch`` (send/recv written out) and ``torch`` (torch.distributed.pipelining; needs m >= P).

Each forward is stretched to --op-ms milliseconds and each backward to twice that, by sleeping
(a host waiting for its accelerator), so the figures measure the schedule and its
communication rather than CPU contention. With --op-ms 0 the stages do real CPU matmuls of
--width x --width on --microbatch rows instead (P ranks then share the machine's cores).

    .venv/bin/python benchmarks/pipeline_bubble.py                     # P=2,4; m=1..16; scratch
    .venv/bin/python benchmarks/pipeline_bubble.py --impl torch --schedule 1f1b
    .venv/bin/python benchmarks/pipeline_bubble.py --op-ms 0 --width 512 --microbatch 128 -p 2

On a loaded machine the per-op overhead (waking up in recv, scheduling) grows and the
measured bubble rises above the formula; repeat a run before believing one figure.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from course_utils.pipeline import runtime as pp  # noqa: E402


def excess_per_op_ms(p: int, m: int, makespan_s: float, op_ms: float) -> float:
    """(measured - ideal makespan) / ops on the critical path, in ms; ideal = (m+P-1)(1+2) op."""
    ideal_ms = (m + p - 1) * 3 * op_ms
    return (makespan_s * 1e3 - ideal_ms) / (2 * (m + p - 1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", type=int, nargs="+", default=[2, 4], help="pipeline degrees")
    parser.add_argument("-m", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="microbatches")
    parser.add_argument("--impl", choices=["scratch", "torch"], default="scratch")
    parser.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe")
    parser.add_argument("--op-ms", type=float, default=10.0,
                        help="forward time per stage and microbatch (backward: 2x); 0 = real matmuls")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per (P, m), after a warm-up")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--microbatch", type=int, default=8)
    args = parser.parse_args(argv)

    print(f"impl={args.impl} schedule={args.schedule} op={args.op_ms:g} ms "
          f"(backward 2x) steps={args.steps} width={args.width} microbatch={args.microbatch}")
    print(f"{'P':>2s} {'m':>3s} {'formula':>8s} {'measured':>9s} {'min..max':>13s} "
          f"{'makespan':>9s} {'ideal':>8s} {'excess/op':>10s}")
    for p in args.p:
        ms = [m for m in args.m if args.impl == "scratch" or m >= p]
        rows = pp.measure_bubble(p, ms, schedule=args.schedule, impl=args.impl,
                                 op_time_s=args.op_ms / 1000, microbatch=args.microbatch,
                                 width=args.width, steps=args.steps, timeout_s=300)
        for row in rows:
            spread = f"{min(row['per_step']):.3f}..{max(row['per_step']):.3f}"
            span = row["timeline"].makespan
            if args.op_ms:
                ideal = f"{(row['m'] + p - 1) * 3 * args.op_ms:6.1f}ms"
                excess = f"{excess_per_op_ms(p, row['m'], span, args.op_ms):7.2f}ms"
            else:
                ideal = excess = "-"
            print(f"{p:2d} {row['m']:3d} {row['formula']:8.3f} {row['measured']:9.3f} "
                  f"{spread:>13s} {span * 1e3:7.1f}ms {ideal:>8s} {excess:>10s}")


if __name__ == "__main__":
    main()

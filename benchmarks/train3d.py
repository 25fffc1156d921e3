"""Module 10's trainer: step time, throughput and MFU per layout, and ZeRO-1's bytes per rank.

For the lecture's mesh (DP 2 x PP 2 x TP 2, 8 gloo ranks) and each layout (embedding and head
whole; the vocabulary split; the vocabulary split and sequence parallelism; the same in bf16):
the median step of the slowest rank, its parts, tokens per second and MFU against the cores the
8 one-thread ranks ran on (``check.peak_units``: min(8, the cores this process may use)) times
one core's measured matmul rate. Then the bytes one rank writes to its sockets for one ZeRO-1 step of a
2**18-element parameter, reduce-scatter + all-gather against all-reduce + all-gather, on 2 and
4 ranks (``tests/test_zero1.py`` asserts them). On a shared machine the times vary 2x or more.

Run: .venv/bin/python benchmarks/train3d.py [--steps N]
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    import torch

    from course_utils import launch
    from course_utils.trainer3d import train as train3d
    from course_utils.trainer3d import check

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} logical CPUs")
    peak = check.peak_flops()
    print(f"one core: {peak / 1e9:.1f} GFLOP/s (512 x 512 fp32 matmul); MFU against "
          f"{check.peak_units(8)} cores")
    layouts = {"embedding and head whole": dict(vocab_parallel=False, sp=False),
               "vocabulary split": dict(sp=False), "vocabulary split + SP": {},
               "vocabulary split + SP, bf16": dict(dtype="bf16")}
    plans = [train3d.Plan(steps=args.steps, **kw) for kw in layouts.values()]
    t0 = time.perf_counter()
    results = train3d.run(plans, timeout_s=600)
    print(f"one launch, {len(plans)} plans x {args.steps} steps: "
          f"{time.perf_counter() - t0:.1f} s")
    print(f"{'layout':30s} {'step ms':>8} {'TP':>6} {'PP':>6} {'DP':>6} {'tok/s':>7} {'MFU':>7}")
    for name, plan, res in zip(layouts, plans, results):
        rows = check.breakdown(res)
        slow = max(rows, key=lambda b: b["step"])
        speed = check.throughput(plan, res, peak)
        print(f"{name:30s} {slow['step']:8.1f} {slow['tp']:6.1f} {slow['pp_wait']:6.1f} "
              f"{slow['dp']:6.1f} {speed['tokens_per_s']:7.0f} {speed['mfu']:7.2%}")
    from course_utils.zero.zero1 import bytes_sent_worker   # tests/test_zero1.py asserts the same

    for world in (2, 4):
        r = launch.run(bytes_sent_worker, world, timeout_s=120, show_output=False)[0]
        share = (world - 1) / world
        print(f"ZeRO-1 bytes per rank, D = {world}, as a fraction of the weights' bytes: "
              + ", ".join(f"{k} {v:.3f}" for k, v in r.items())
              + f" (2(D-1)/D = {2 * share:.3f}, 3(D-1)/D = {3 * share:.3f})")


if __name__ == "__main__":
    main()

"""Tensor parallelism on this machine: one rank's MLP matmuls vs the all-reduce that follows.

For each hidden size h (ffn = 4h, fp32, ``--tokens`` = b * s), every rank of a ``--tp`` group
times its share of the forward MLP matmuls and the all-reduce of the (tokens, h) result
(medians over ``--repeats``), as ``course_utils.tensor_parallel.comm_timing.time_comm_vs_matmul`` does.
It prints the measured ratio beside the bytes-over-bandwidth model (``mlp_comm_to_compute``)
fed with each size's matmul rate and the link bandwidth of the largest all-reduce, so the gap
shows what the model leaves out (latency, mostly, for small layers).

    .venv/bin/python benchmarks/tp_comm_vs_matmul.py                # tp 2, h 128..1024
    .venv/bin/python benchmarks/tp_comm_vs_matmul.py --tp 2 4 --hidden 256 512
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from course_utils import launch  # noqa: E402
from course_utils import tensor_parallel as tp  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, nargs="+", default=[2], help="TP degrees (ranks)")
    parser.add_argument("--hidden", type=int, nargs="+", default=[128, 256, 512, 1024])
    parser.add_argument("--tokens", type=int, default=256, help="b * s")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"cpu cores: {os.cpu_count()}, tokens = b*s = {args.tokens}, ffn = 4h, fp32")
    print(f"{'tp':>3} {'h':>5} {'matmul ms':>10} {'GFLOP/s':>8} {'all-reduce ms':>14} "
          f"{'GB/s':>6} {'measured':>9} {'model':>7}")
    for t in args.tp:
        for h in args.hidden:
            if (4 * h) % t:
                sys.exit(f"ffn = 4h = {4 * h} must be divisible by tp = {t}")
        sizes = [(args.tokens, h, 4 * h) for h in args.hidden]
        rows = launch.run(tp.time_comm_vs_matmul, t, sizes, args.repeats, timeout_s=600)
        # the slowest rank sets the pace of a synchronous step
        matmul_s = [max(r[i]["matmul_s"] for r in rows) for i in range(len(sizes))]
        reduce_s = [max(r[i]["all_reduce_s"] for r in rows) for i in range(len(sizes))]
        # link bandwidth seen by the largest message, where latency matters least
        link = tp.ring_all_reduce_bytes_per_rank(rows[0][-1]["all_reduce_bytes"], t) / reduce_s[-1]
        for i, row in enumerate(rows[0]):
            flops = row["matmul_flops"] / matmul_s[i]
            model = tp.mlp_comm_to_compute(row["h"], t, "fp32", flops, link)
            print(f"{t:>3} {row['h']:>5} {matmul_s[i] * 1e3:>10.2f} {flops / 1e9:>8.1f} "
                  f"{reduce_s[i] * 1e3:>14.2f} {row['all_reduce_bytes'] / reduce_s[i] / 1e9:>6.2f} "
                  f"{reduce_s[i] / matmul_s[i]:>9.3f} {model:>7.3f}")
    print("GB/s: all-reduce payload / time. model: bytes-over-bandwidth ratio with the link "
          "bandwidth of the largest all-reduce; it misses the latency of small ones.")

if __name__ == "__main__":
    main()

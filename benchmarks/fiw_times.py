"""F, I and W of one transformer layer on this CPU, and what their ratio does to each schedule.

Measures the forward (F), the input gradient (I) and the weight gradient (W) of one pre-norm
layer (course_utils.pipeline.fiw_times.Layer) with torch's own split backward (stage_backward_input,
stage_backward_weight), median over --repeats after a warm-up, one thread; prints them in ms,
their ratios beside the matmul FLOP ratios, and each schedule's idle share at P, m simulated
with F = I = W and with the measured times (and the papers' formulas where they apply).

    .venv/bin/python benchmarks/fiw_times.py                       # hidden 256, seq 512
    .venv/bin/python benchmarks/fiw_times.py --seq 2048 --hidden 128 -p 8 -m 16
    .venv/bin/python benchmarks/fiw_times.py --no-attention        # the MLP half: F = I = W

Other work on the machine slows each part unevenly: repeat a run before believing a ratio
(the load average is printed).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from course_utils.pipeline import fiw_times as ft  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats, after a warm-up")
    parser.add_argument("--no-attention", action="store_true", help="the MLP half only")
    parser.add_argument("-p", type=int, default=4, help="pipeline ranks")
    parser.add_argument("-m", type=int, default=8, help="microbatches")
    parser.add_argument("--sync", action="store_true",
                        help="idle share with the optimizer's global check")
    args = parser.parse_args(argv)
    res = ft.measure_fiw(args.hidden, args.seq, args.heads, args.batch, args.repeats,
                         attention=not args.no_attention)
    print(f"layer hidden={res['hidden']} ffn={res['ffn']} heads={res['heads']} "
          f"seq={res['seq']} batch={res['batch']} attention={res['attention']}; "
          f"torch {torch.__version__}, 1 thread, median of {res['repeats']}; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    flops = res["flops"]
    print(f"{'':4s}{'ms':>8s}{'/ W':>7s}{'GFLOP':>8s}{'/ W':>7s}{'GFLOP/s':>9s}")
    for k in "FIW":
        print(f"{k:4s}{res[k] * 1e3:8.2f}{res[k] / res['W']:7.2f}{flops[k] / 1e9:8.3f}"
              f"{flops[k] / flops['W']:7.2f}{flops[k] / res[k] / 1e9:9.1f}")
    print()
    print(ft.compare_table(res, args.p, args.m, args.sync))
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

"""Ring all-reduce (send/recv, course_utils.collectives.ring) vs gloo's dist.all_reduce, 2 ranks.

For float32 tensors of 1, 16 and 64 MiB, prints the median time of each, the bus bandwidth
(2(D-1)/D x bytes / time, what each rank's link carried; at D = 2 it equals bytes / time) and
the ratio ring/gloo of bandwidths (> 1: the ring is faster). Ring and gloo runs are interleaved
so a change in machine load hits both; every ring result is checked against gloo's.

    .venv/bin/python benchmarks/ring_allreduce.py                 # 1, 16, 64 MiB, 2 ranks
    .venv/bin/python benchmarks/ring_allreduce.py --sizes-mib 1 4 --repeats 5
    .venv/bin/python benchmarks/ring_allreduce.py --configs 1x1 4x1 8x2 --simple   # tune

On a shared 2-core machine times vary about 2x from run to run: repeat it before believing a
ratio, and read the spread of ratios rather than one number.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from course_utils import launch  # noqa: E402
from course_utils.collectives import ring  # noqa: E402

MiB = 2**20


def _config(text: str) -> tuple[int | None, int]:
    """'8x2' -> (8 pieces, 2 channels); 'auto' -> default pieces, 1 channel."""
    if text == "auto":
        return None, 1
    pieces, _, channels = text.partition("x")
    return int(pieces), int(channels or 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 16, 64])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9, help="timed runs per size (median)")
    parser.add_argument("--configs", nargs="+", default=["auto", "8x4"],
                        help="ring settings to time, PIECESxCHANNELS (e.g. 8x2) or auto "
                             "(default pieces, one channel); each runs beside gloo. Default: auto, "
                             "then 8 pieces over 4 channels (the fastest on a 16-core host)")
    parser.add_argument("--simple", action="store_true", help="also time the textbook ring")
    parser.add_argument("--threads-per-rank", type=int, default=None)
    args = parser.parse_args(argv)

    sizes = [int(s * MiB) for s in args.sizes_mib]
    ws = args.world_size
    print(f"world size {ws}, float32, median of {args.repeats}, {os.cpu_count()} CPUs")
    print(f"{'size':>8} {'impl':>12} {'ms':>9} {'busbw GB/s':>11} {'ring/gloo':>10}")
    for text in args.configs:
        pieces, channels = _config(text)
        times = launch.run(ring.bandwidth_worker, ws, sizes, args.repeats, pieces, args.simple,
                           channels, timeout_s=600, show_output=False,
                           threads_per_rank=args.threads_per_rank)[0]
        for i, nbytes in enumerate(sizes):
            bus = ring.ring_bytes_per_rank(nbytes // 4, ws)  # bytes each rank sends
            gloo = times["gloo"][i]
            rows = [("gloo", gloo), (f"ring {text}", times["ring"][i])]
            if args.simple:
                rows.append(("textbook", times["simple"][i]))
            for name, seconds in rows:
                ratio = "" if name == "gloo" else f"{gloo / seconds:.2f}x"
                print(f"{nbytes / MiB:>6g}Mi {name:>12} {seconds * 1e3:>9.2f} "
                      f"{bus / seconds / 1e9:>11.2f} {ratio:>10}")
        summary = ", ".join(f"{nbytes / MiB:g} MiB {times['gloo'][i] / times['ring'][i]:.2f}x"
                            for i, nbytes in enumerate(sizes))
        print(f"ring {text}: bandwidth ring / gloo: {summary}", flush=True)


if __name__ == "__main__":
    main()

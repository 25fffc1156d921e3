"""Overlap of the gradient all-reduce with backward, by bucket size, on real ranks (lecture 9, §5).

For each bucket size (and one all-reduce after backward), the slowest rank's median over
``--steps`` steps after ``--warmup``: the step (forward, backward with bucket all-reduces
started from hooks, wait, averaged gradients in place), compute alone (forward + backward, no
communication), communication alone (the same buckets, nothing else running) and the time
blocked in ``work.wait()`` after backward (the exposed communication). ``hidden`` is
compute + comm - step: how much communication the overlap hid (negative: the overlap cost more
than it hid, e.g. gloo's thread taking cycles from backward on a machine with few cores).
Timings vary from run to run; run it a few times. Uses gloo on CPU; with one GPU per rank it
runs on NCCL (there ``wait`` reads near 0: see ``course_utils.data_parallel.overlap``).

    .venv/bin/python benchmarks/overlap_buckets.py
    .venv/bin/python benchmarks/overlap_buckets.py --ranks 4 --width 512 --depth 16 --steps 9
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from course_utils import launch  # noqa: E402
from course_utils.data_parallel import overlap  # noqa: E402


def _size(text: str) -> float | None:
    return None if text == "after" else float(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=32)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--sizes", nargs="+", type=_size, default=list(overlap.BUCKET_SIZES),
                        help="bucket sizes in MiB; 'after' for one all-reduce after backward")
    args = parser.parse_args(argv)
    backend = launch.resolve_backend("auto", args.ranks)
    model = overlap.make_mlp(args.width, args.depth)
    grad_mib = sum(b for _, b in overlap.param_sizes(model)) / overlap.MIB
    print(f"MLP {args.depth} x Linear({args.width}, {args.width}), {grad_mib:.2f} MiB of fp32 "
          f"gradients, batch {args.batch} per rank, {args.ranks} ranks on {backend}, "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs; median of {args.steps} steps (ms)")
    rows = overlap.measure_overlap(bucket_mbs=args.sizes, world_size=args.ranks,
                                   steps=args.steps, warmup=args.warmup, width=args.width,
                                   depth=args.depth, batch=args.batch, timeout_s=600)
    lines = overlap.format_table(rows).splitlines()
    print(lines[0] + f"{'hidden':>9}")
    for line, r in zip(lines[1:], rows):
        print(line + f"{r['compute_ms'] + r['comm_ms'] - r['step_ms']:>9.1f}")
    best = min(rows, key=lambda r: r["step_ms"])
    print(f"fastest step on this run: {overlap.bucket_name(best['bucket_mb'])}")


if __name__ == "__main__":
    main()

"""PyTorch DDP vs JAX ``jit`` on one pinned workload: step time, compile time, the loss curve.

Runs ``course_utils.jax_sharding.framework_compare.compare`` (the protocol lecture 8 uses): the same MLP,
float32, initial weights, batches, SGD steps and thread settings on both sides; PyTorch as DDP
on gloo ranks through the course launcher, JAX as one process with that many CPU devices.
The losses must agree (else it stops); the table names the machine and the versions. It ranks
the two programs on this workload and this machine only.

    .venv/bin/python benchmarks/framework_compare.py
    .venv/bin/python benchmarks/framework_compare.py --workers 4 --sizes 256 1024 256 --steps 30
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from course_utils.jax_sharding import framework_compare as fc  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    default = fc.Workload()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(default.sizes),
                        help="layer widths, input first")
    parser.add_argument("--batch", type=int, default=default.global_batch, help="global batch")
    parser.add_argument("--steps", type=int, default=default.steps)
    parser.add_argument("--warmup", type=int, default=default.warmup)
    parser.add_argument("--workers", type=int, default=default.workers,
                        help="gloo ranks / JAX CPU devices")
    parser.add_argument("--threads", type=int, default=default.threads_per_worker,
                        help="threads per worker")
    parser.add_argument("--seed", type=int, default=default.seed)
    args = parser.parse_args(argv)
    try:
        w = fc.Workload(sizes=tuple(args.sizes), global_batch=args.batch, steps=args.steps,
                        warmup=args.warmup, workers=args.workers,
                        threads_per_worker=args.threads, seed=args.seed)
    except ValueError as e:
        sys.exit(str(e))
    print(fc.table(fc.compare(w, timeout_s=600)))


if __name__ == "__main__":
    main()

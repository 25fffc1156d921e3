"""Activation checkpointing on TinyLM: saved bytes (predicted == measured) and step time for each
recomputation mode and attention kernel (lecture 9's table, at any size).

Step time is the median of ``--repeats`` forward + backward passes on one thread, after a
warm-up; the bytes are counted with saved-tensor hooks (``course_utils.memory.activations``).

    .venv/bin/python benchmarks/recomputation.py
    .venv/bin/python benchmarks/recomputation.py --batch 8 --seq 512 --layers 4 --repeats 9
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from course_utils.memory import activations  # noqa: E402
from course_utils.models import tiny_lm  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cfg = tiny_lm.TinyLMConfig(seq_len=args.seq, n_layers=args.layers)
    print(f"TinyLM D={cfg.d_model} H={cfg.n_heads} F={cfg.d_ff} layers={cfg.n_layers}, "
          f"B={args.batch} T={args.seq}, torch {torch.__version__}, 1 thread")
    print(f"{'attention':<10}{'recompute':<11}{'block MB':>10}{'model MB':>10}{'match':>7}"
          f"{'step ms':>10}{'vs none':>9}")
    for attention in activations.ATTENTIONS:
        base = None
        for mode in activations.RECOMPUTES:
            block = activations.measured_block_bytes(cfg, args.batch, args.seq, mode, attention)
            model = activations.measured_model_bytes(cfg, args.batch, args.seq, mode, attention)
            match = (block == activations.predicted_block_bytes(cfg, args.batch, args.seq, mode,
                                                                 attention)
                     and model == activations.predicted_model_bytes(cfg, args.batch, args.seq,
                                                                    mode, attention))
            seconds = activations.step_time(cfg, args.batch, args.seq, mode, attention,
                                            repeats=args.repeats)
            base = base or seconds
            print(f"{attention:<10}{mode:<11}{block / 1e6:>10.3f}{model / 1e6:>10.3f}"
                  f"{'yes' if match else 'NO':>7}{1e3 * seconds:>10.1f}{seconds / base:>8.2f}x")


if __name__ == "__main__":
    main()

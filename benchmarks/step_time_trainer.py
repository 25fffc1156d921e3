"""Lecture 13's check of the step-time model on this machine: calibrate, then predict module 10's
trainer on held-out meshes and measure it.

1. Calibration (``course_utils.step_time.calibrate.calibration_worker``): on 1, 2 and 4 gloo
   ranks at once, each matmul shape's sustained FLOP/s, all-reduces over groups of 2 and 4
   fitted to alpha and beta, a send's alpha and beta, Adam's seconds per element.
2. Module 10's trainer (TinyLM 4 x 256, 16 sequences of 64 tokens, 4 microbatches, 1F1B, TP
   with SP and a split vocabulary, ZeRO-1) on the one-rank calibration mesh and on the 9
   held-out meshes of ``calibrate.MESHES`` (2 and 4 ranks): the slowest rank's median step.
   Each job size is one launch that calibrates, trains and calibrates again
   (``calibrate.run_benchmark``): this machine's speed drifts between minutes.
3. The model's prediction for each held-out mesh beside its measurement: the error and the
   part furthest off. ``--save`` writes it all to ``course_utils/data/step_time_trainer.json``,
   which lecture 13 prints (run it on an idle machine: others' work changes the rates).

Run: .venv/bin/python benchmarks/step_time_trainer.py [--save] [--steps N]
"""

from __future__ import annotations

import argparse
import os
import platform
import time


def main() -> None:
    from course_utils.step_time import calibrate

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} logical CPUs")
    t0 = time.perf_counter()
    cal, measured = calibrate.run_benchmark(steps=args.steps)
    print(f"calibrated and trained {1 + len(calibrate.MESHES)} meshes in "
          f"{time.perf_counter() - t0:.0f} s")
    for w, c in cal["by_world"].items():
        links = ", ".join(f"{k}: alpha {1e6 * v['alpha_s']:.0f} us, beta "
                          f"{v['bytes_per_s'] / 1e9:.2f} GB/s" for k, v in c["links"].items())
        print(f"  {w} rank(s): matmuls {min(c['rates'].values()) / 1e9:.0f}-"
              f"{max(c['rates'].values()) / 1e9:.0f} GFLOP/s each; {links or 'no links'}")
    rows = calibrate.compare(cal, measured)
    print(calibrate.format_comparison(rows))
    worst = max(abs(r["error"]) for r in rows)
    print(f"largest error {100 * worst:.0f} % over {len(rows)} held-out meshes")
    if args.save:
        calibrate.save({"calibration": cal, "measured": measured, "steps": args.steps,
                        "machine": {"cpus": os.cpu_count(), "load_average": round(load, 2),
                                    "processor": platform.processor() or platform.machine()}})
        print(f"saved {calibrate.CACHE}")


if __name__ == "__main__":
    main()

"""Module 12's figures: save and load times (dcp.save vs dcp.async_save), what async_save's
return means, a resume on another DP size, the resharding bytes, and the lost-rank run's
timeline.

Run: .venv/bin/python benchmarks/checkpointing.py [--numel N] [--repeats R]
"""

from __future__ import annotations

import argparse
import functools
import shutil
import tempfile
import time

from course_utils import launch
from course_utils.checkpoint import dcp as checkpoint
from course_utils.checkpoint import interval as checkpoint_interval
from course_utils.checkpoint import lost_rank
from course_utils.checkpoint import reshard
from course_utils.checkpoint import resume_demo
from course_utils.checkpoint import resume_job


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=1_000_000, help="weights saved (float32)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    launch.preload(*checkpoint.PRELOAD)
    folder = tempfile.mkdtemp(prefix="bench-ckpt-")
    try:
        for world in (2, 4):
            costs = launch.run(functools.partial(
                checkpoint_interval.save_cost_worker, path=f"{folder}/costs{world}",
                numel=args.numel, repeats=args.repeats), world, timeout_s=300,
                threads_per_rank=1)
            c = costs[0]
            print(f"{world} ranks, {c['bytes'] / 1e6:.1f} MB per rank: dcp.save "
                  f"{c['sync'] * 1e3:.0f} ms; dcp.async_save blocks "
                  f"{c['async_blocked'] * 1e3:.0f} ms, written after "
                  f"{c['async_total'] * 1e3:.0f} ms; dcp.load {c['load'] * 1e3:.0f} ms "
                  f"(medians of {args.repeats})")
        job = resume_job.Job()
        path = f"{folder}/step_6"
        launch.run(functools.partial(resume_demo.omission_worker, job=job, path=path, save_at=6),
                   2, timeout_s=300, threads_per_rank=1)
        t0 = time.perf_counter()
        launch.run(functools.partial(resume_demo.resume_worker, job=job, path=path), 2,
                   timeout_s=300, threads_per_rank=1)
        print(f"a new 2-rank job that loads the step-6 checkpoint and trains 6 steps: "
              f"{time.perf_counter() - t0:.2f} s (launch included)")
        facts = launch.run(functools.partial(checkpoint_interval.async_save_worker,
                                             path=f"{folder}/async"), 2, timeout_s=300,
                           threads_per_rank=1)[0]
        print(f"async_save, {facts['state_bytes'] / 1e6:.0f} MB a rank, storage 0.3 s slow: "
              f"stalled {facts['stalled_s'] * 1e3:.0f} ms; durable at return "
              f"{facts['durable_at_return']}; the next save waited "
              f"{facts['next_save_waits_s']:.2f} s; staged {facts['staged_bytes'] / 1e6:.0f} MB,"
              f" resident memory +{facts['resident_growth'] / 1e6:.1f} MB")
        print(resume_demo.resized_table(resume_demo.resized_runs(folder)))
        out = launch.run(functools.partial(reshard.reshard_worker, path=f"{folder}/mlp"), 4,
                         timeout_s=300, threads_per_rank=1)
        print(reshard.table(out))
        plan = lost_rank.Plan()
        lost = lost_rank.run(plan, timeout_s=300)
        kill = lost["kill"]
        for name in ("uninterrupted", "killed"):
            marks = [f"{e['t']:.2f} {e['event']}" + (f" {e['step']}" if "step" in e else "")
                     for e in lost[name]["events"] if e["rank"] == 1 and e["event"] != "step"]
            print(f"{name} ({lost[name]['total_s']:.2f} s), rank 1: " + "; ".join(marks))
        print(f"lost rank: killed in step {kill['step']}, resumed from {kill['resumed_from']}, "
              f"restart {kill['restart_s']:.2f} s, time lost {kill['lost_s']:.2f} s measured, "
              f"{lost_rank.predicted_lost_s(plan, kill['restart_s']):.2f} s predicted")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Several runs on the same ranks in one launch, for the tests of distributed code.

    results = run_jobs([job(worker_a, 2, seed=0), job(worker_b, "x")], world_size=4)

calls ``worker_a(rank, world_size, 2, seed=0)`` then ``worker_b(rank, world_size, "x")`` on each
of 4 ranks, in one ``launch.run``, and returns one list of per-rank results per job. A launch
forks the ranks, imports what the workers need and joins a gloo group (a second or more of CPU
per launch with 4 or 8 ranks on a loaded machine); the jobs run one after another as they would
in launches of their own. Use it only for jobs that end on every rank: a job that raises or
hangs stops the ones after it (test those in a launch of their own).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from course_utils import launch


def job(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple:
    """One run: ``fn(rank, world_size, *args, **kwargs)`` on every rank."""
    return fn, args, kwargs


def each(rank: int, world_size: int, jobs: list[tuple]) -> list[Any]:
    """The worker: this rank's result of each job, in order."""
    return [fn(rank, world_size, *args, **kwargs) for fn, args, kwargs in jobs]


def run_jobs(jobs: list[tuple], world_size: int, timeout_s: float = 300.0,
             threads_per_rank: int | None = 1) -> list[list[Any]]:
    """Every job on ``world_size`` ranks in one launch; per job, each rank's result."""
    per_rank = launch.run(functools.partial(each, jobs=jobs), world_size, timeout_s=timeout_s,
                          threads_per_rank=threads_per_rank, show_output=False)
    return [[r[i] for r in per_rank] for i in range(len(jobs))]

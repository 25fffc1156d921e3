"""Lecture 12's resume experiments on real ranks: what each piece of a checkpoint is worth, and a
bit-exact resume in a new job.

:func:`omission_worker` trains a :class:`course_utils.checkpoint.resume_job.Job` without
interruption, saving a checkpoint on the way (``course_utils.checkpoint.dcp.save``); then, for each
piece of :data:`course_utils.checkpoint.dcp.PIECES` in turn, starts a new trainer as a new job would
(``resume_job.fresh``: generators seeded, model built and sharded), loads the checkpoint *without
that piece* and trains to the end. :func:`departures` says where each resumed loss curve leaves the
uninterrupted one. :func:`resume_worker` is the resume done right, in new processes (a second
``launch.run``): its losses and final weights equal the uninterrupted run's bit for bit on CPU.

Run under torchrun (2 ranks: the run, saved at step 6, resumed in the same job)::

    torchrun --standalone --nproc-per-node 2 -m course_utils.checkpoint.resume_demo
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from course_utils.runtime import backend
from course_utils.checkpoint import dcp as checkpoint
from course_utils.checkpoint import resume_job

__all__ = ["omission_worker", "resume_worker", "resized_worker", "before_wrapping_worker",
           "killed_while_saving_worker", "departures", "departure_table", "resized_runs",
           "resized_table", "same_bits"]


def _quiet() -> None:
    """DCP and DTensor warn on stderr about things that do not matter here."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("torch.distributed").setLevel(logging.ERROR)


def omission_worker(rank: int, world_size: int, job: resume_job.Job, path: str, save_at: int,
                    omits: Sequence[tuple[str, ...]] = ()) -> dict[str, Any]:
    """The uninterrupted run (saving at ``save_at`` into ``path``), then one resume per entry of
    ``omits`` (the pieces it leaves out): ``{"uninterrupted": losses, "weights": final,
    "resumed": [losses of each resume, from step save_at on], "steps": [steps each trained]}``."""
    _quiet()
    trainer = resume_job.fresh(job, rank, world_size)
    losses = resume_job.train(trainer, save_at)
    checkpoint.save(trainer, path)
    losses += resume_job.train(trainer, job.steps)
    out: dict[str, Any] = {"uninterrupted": losses, "resumed": [], "steps": [],
                           "weights": resume_job.snapshot(trainer)["weights"]}
    for omit in omits:
        again = resume_job.fresh(job, rank, world_size)          # a new job, in this process
        checkpoint.load(again, path, omit=omit)
        resumed = resume_job.train(again, job.steps)     # (a job that lost its step: 0 on)
        out["resumed"].append(resumed)
        out["steps"].append(save_at + len(resumed))
    return out


def resume_worker(rank: int, world_size: int, job: resume_job.Job, path: str) -> dict[str, Any]:
    """A new job resumed from ``path``: the state it loaded and the losses and weights it ends
    with (``snapshot`` after loading, ``losses``, ``final``)."""
    _quiet()
    trainer = resume_job.fresh(job, rank, world_size)
    checkpoint.load(trainer, path)
    loaded = resume_job.snapshot(trainer)
    losses = resume_job.train(trainer, job.steps)
    return {"loaded": loaded, "losses": losses, "final": resume_job.snapshot(trainer)}


def resized_worker(rank: int, world_size: int, job: resume_job.Job, path: str) -> dict[str, Any]:
    """A new job on ``world_size`` ranks resumed from ``path``, which a job of ``job``'s size
    saved: the same global batch (``job.resized``), the per-rank generators left out
    (``checkpoint.PER_RANK``: the saving ranks' are not this job's); its losses and final
    weights."""
    _quiet()
    new = job.resized(world_size)
    trainer = resume_job.fresh(new, rank, world_size)
    checkpoint.load(trainer, path, omit=checkpoint.PER_RANK)
    losses = resume_job.train(trainer, new.steps)
    return {"losses": losses, "weights": resume_job.snapshot(trainer)["weights"]}


def before_wrapping_worker(rank: int, world_size: int, job: resume_job.Job,
                           path: str) -> dict[str, Any]:
    """Two ways to resume before ``fully_shard``, measured: the bytes this rank reads loading
    the weights of ``path`` into the whole model (before wrapping) and into its shard (after),
    and whether a model whose optimizer was made *before* wrapping moves at all in 2 steps."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from course_utils.checkpoint.reshard import counting_reader

    _quiet()
    model = resume_job.build_model(job)
    early = torch.optim.AdamW(model.parameters(), lr=job.lr)      # made before wrapping
    whole = counting_reader(path)
    dcp.load({"model": model.state_dict()}, storage_reader=whole)   # every rank: everything
    fully_shard(model, mesh=init_device_mesh(backend.device().type, (world_size,)))
    shard = counting_reader(path)
    dcp.load({"model": model.state_dict()}, storage_reader=shard)   # every rank: its shard
    before = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
    x, y = resume_job.dataset(job)
    for _ in range(2):
        torch.nn.functional.cross_entropy(model(x[:job.rows]), y[:job.rows]).backward()
        early.step()
        early.zero_grad()
    moved = any(not torch.equal(before[n], p.full_tensor()) for n, p in model.named_parameters())
    return {"read_before": whole.bytes_read, "read_after": shard.bytes_read, "moved": moved}


def killed_while_saving_worker(rank: int, world_size: int, job: resume_job.Job,
                               path: str) -> str:
    """Save ``job``'s trainer to ``path``, but the last rank is killed (SIGKILL) as it starts
    writing its file: the job dies in the middle of a save. The other ranks' saves fail when
    they next need the dead rank; they say so (so the launcher reports the killed rank)."""
    import signal

    from torch.distributed.checkpoint import FileSystemWriter

    import torch.distributed.checkpoint as dcp

    _quiet()
    trainer = resume_job.fresh(job, rank, world_size)
    resume_job.train(trainer, 1)

    class Writer(FileSystemWriter):
        def write_data(self, plan, planner):
            if rank == world_size - 1:
                os.kill(os.getpid(), signal.SIGKILL)
            return super().write_data(plan, planner)

    try:
        dcp.save(checkpoint.state_to_save(trainer), storage_writer=Writer(path))
    except RuntimeError as error:                      # gloo: the peer's connection is gone
        return f"rank {rank}'s save failed: {str(error)[:60]}"
    return f"rank {rank} saved"


def departures(reference: Sequence[float], resumed: Sequence[float], save_at: int,
               steps: int) -> dict[str, Any]:
    """Where a resumed loss curve (steps ``save_at`` on) leaves the uninterrupted one: the first
    step whose loss differs (None: none of the steps both ran), the largest difference, and how
    many steps the job trained in all (a job that trained longer differs there, not in a loss)."""
    ref = list(reference[save_at:])
    first = next((save_at + i for i, (a, b) in enumerate(zip(ref, resumed)) if a != b), None)
    gap = max((abs(a - b) for a, b in zip(ref, resumed)), default=0.0)
    return {"first": first, "largest": gap, "steps": steps}


def departure_table(result: dict[str, Any], omits: Sequence[tuple[str, ...]],
                    save_at: int) -> str:
    """Rank 0's resumes of :func:`omission_worker` as a table: what was left out, the first
    step whose loss differs from the uninterrupted run's, the largest difference, steps run."""
    last = f"steps in all (uninterrupted: {len(result['uninterrupted'])})"
    lines = [f"resumed from step {save_at}, left out   first differing step   largest |loss "
             f"difference|   {last}"]
    for omit, losses, steps in zip(omits, result["resumed"], result["steps"]):
        d = departures(result["uninterrupted"], losses, save_at, steps)
        first = "none" if d["first"] is None else str(d["first"])
        lines.append(f"{', '.join(omit) or 'nothing':>31}   {first:>20}   {d['largest']:>25.2e}"
                     f"   {steps:>{len(last)}}")
    return "\n".join(lines)


def resized_runs(folder: str, save_at: int = 6, saved_by: int = 4,
                 resumed_by: Sequence[int] = (2, 1), seed: int = 0,
                 timeout_s: float = 180.0) -> list[dict[str, Any]]:
    """For each of ``resume_job.SAMPLERS``: a run of ``saved_by`` ranks (global batch 8, no
    dropout) saved at ``save_at`` into ``folder``, then resumed by each of ``resumed_by`` ranks
    (:func:`resized_worker`); per resume, the largest relative loss difference from the
    uninterrupted run and the largest weight difference at the end. One launch per world size
    (``pipeline_parallel.jobs_worker``), the samplers one after the other in it."""
    import functools

    from course_utils import launch
    from course_utils.pipeline.runtime import jobs_worker

    jobs = {sampler: resume_job.Job(world_size=saved_by, rows=8 // saved_by, dropout=0.0,
                                    sampler=sampler, seed=seed)
            for sampler in resume_job.SAMPLERS}
    paths = {sampler: os.path.join(folder, f"{sampler}_step_{save_at}") for sampler in jobs}
    [saved, *_] = launch.run(functools.partial(jobs_worker, jobs=[
        (omission_worker, dict(job=job, path=paths[s], save_at=save_at))
        for s, job in jobs.items()]), saved_by, timeout_s=timeout_s, threads_per_rank=1)
    resumed = {world: launch.run(functools.partial(jobs_worker, jobs=[
        (resized_worker, dict(job=job, path=paths[s])) for s, job in jobs.items()]),
        world, timeout_s=timeout_s, threads_per_rank=1)[0] for world in resumed_by}
    rows = []
    for k, sampler in enumerate(jobs):
        want = np.array(saved[k]["uninterrupted"][save_at:])
        for world in resumed_by:
            again = resumed[world][k]
            rows.append({"sampler": sampler, "from": saved_by, "to": world,
                         "loss": float(np.max(np.abs(np.array(again["losses"]) - want) / want)),
                         "weights": max(float(np.max(np.abs(again["weights"][name] - w)))
                                        for name, w in saved[k]["weights"].items())})
    return rows


def resized_table(rows: list[dict[str, Any]]) -> str:
    """:func:`resized_runs` as text."""
    lines = [f"{'sampler':<12}{'ranks':>9}{'largest loss difference':>26}"
             f"{'largest weight difference':>28}"]
    lines += [f"{r['sampler']:<12}{r['from']:>4} -> {r['to']:<2}{r['loss']:>25.1e}"
              f"{r['weights']:>28.1e}" for r in rows]
    return "\n".join(lines)


def same_bits(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    """Every array of ``a`` equals ``b``'s bit for bit (same keys, shapes and bytes)."""
    return a.keys() == b.keys() and all(
        a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes() for k in a)


def _torchrun_demo(rank: int, world_size: int) -> bool:
    """Save at step 6, resume in the same job, compare: True when the two runs' bits agree."""
    import torch.distributed as dist

    job = resume_job.Job(world_size=world_size)
    with checkpoint.job_folder() as folder:
        out = omission_worker(rank, world_size, job, os.path.join(folder, "step_6"), 6,
                              omits=[()])
        dist.barrier()
        return out["resumed"][0] == out["uninterrupted"][6:]


if __name__ == "__main__":
    from course_utils import launch

    launch.torchrun_main(_torchrun_demo)

"""Module 10's DP x PP x TP trainer, saved with DCP and resumed on 8 ranks.

Built only on module 10's public pieces (``train3d.Plan``, ``build_groups``, ``train_step``;
``stage_model.build_stage``; ``zero1.ShardedAdam``'s ``state`` and ``steps``;
``overlap.BucketAllReduce``; ``tiny_lm.MarkovCorpus`` and ``shard_batch``), so that the trainer
can change without this file knowing more than those names.

What each rank saves: its stage's weights under ``pp{p}.tp{t}.<name>`` (the DP replicas hold the
same bits, so DCP writes one copy of each: it takes equal keys for a replicated value), its
ZeRO-1 shard of Adam's moments under ``pp{p}.tp{t}.dp{d}.exp_avg``/``exp_avg_sq`` (every DP rank
owns a different shard), Adam's step count and the training step. The data need no state: step
``s`` reads ``MarkovCorpus.batch(s, ...)``, a pure function of the step. Nothing in the run draws
random numbers after the model is built, so no generator state either.

Run under torchrun (8 ranks: 4 steps, saved at 2 and resumed in the same job, compared)::

    torchrun --standalone --nproc-per-node 8 -m course_utils.checkpoint3d
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from course_utils import backend
from course_utils.overlap import BucketAllReduce
from course_utils.stage_model import build_stage
from course_utils.tiny_lm import MarkovCorpus, shard_batch
from course_utils.train3d import Plan, build_groups, train_step
from course_utils.zero1 import ShardedAdam

__all__ = ["state_of", "train_worker", "run", "same_run"]


def state_of(stage: torch.nn.Module, optimizer: ShardedAdam, g, step: int) -> dict[str, Any]:
    """The state dict this rank saves (and loads into, in place)."""
    where = f"pp{g.pp_rank}.tp{g.tp_rank}"
    state: dict[str, Any] = {f"{where}.{name}": p for name, p in stage.named_parameters()}
    for key in ("exp_avg", "exp_avg_sq"):
        state[f"{where}.dp{g.dp_rank}.{key}"] = optimizer.state[0][key]
    state["adam_steps"] = optimizer.steps
    state["step"] = step
    return state


def train_worker(rank: int, world_size: int, plan: Plan, path: str, start: int = 0,
                 save_at: int | None = None) -> dict[str, Any]:
    """One rank of ``plan``: resume from ``path`` at step ``start`` (0: a fresh run), train to
    ``plan.steps``, saving into ``path`` after ``save_at`` steps. Returns this rank's
    coordinates, the losses of the steps it trained and its final weights."""
    import torch.distributed.checkpoint as dcp

    if world_size != plan.world_size:
        raise ValueError(f"the plan needs {plan.world_size} ranks; got world_size={world_size}")
    g = build_groups(plan.mesh, rank)
    stage = build_stage(plan.cfg, plan.seed, g.pp_rank, g.pp_size, g.tp_rank, g.tp_size,
                        g.tp_group).to(backend.device())
    optimizer = ShardedAdam(stage.parameters(), g.dp_group, lr=plan.lr, eps=plan.eps)
    dp_sync = BucketAllReduce(stage, plan.bucket_mb, group=g.dp_group)
    if start:
        state = state_of(stage, optimizer, g, 0)
        with torch.no_grad():
            dcp.load(state, checkpoint_id=path)
        if state["step"] != start:
            raise ValueError(f"the checkpoint at {path} is of step {state['step']}, not {start}")
        optimizer.steps = state["adam_steps"]
    corpus = MarkovCorpus(plan.cfg.vocab_size, seed=plan.seed)
    losses = []
    for step in range(start, plan.steps):
        x, y = corpus.batch(step, plan.batch, plan.cfg.seq_len)                # (B, T) each
        x, y = (backend.to_device(shard_batch(t, g.dp_rank, g.dp_size)) for t in (x, y))
        losses.append(train_step(stage, g, x, y, plan.m, optimizer, dp_sync))
        optimizer.zero_grad()
        if step + 1 == save_at:
            dcp.save(state_of(stage, optimizer, g, step + 1), checkpoint_id=path)
    return {"coords": (g.dp_rank, g.pp_rank, g.tp_rank), "losses": losses,
            "weights": {n: backend.to_cpu(p.detach()).numpy().copy()
                        for n, p in stage.named_parameters()}}


def run(plan: Plan, path: str, save_at: int, timeout_s: float = 180.0) -> dict[str, Any]:
    """The uninterrupted run (saving after ``save_at`` steps into ``path``), then a new job
    resumed from it: ``{"uninterrupted": [...], "resumed": [...]}``, each rank's result."""
    from course_utils import launch

    if not isinstance(plan, Plan):
        raise ValueError(f"plan must be a train3d.Plan; got {type(plan).__name__}")
    if not (isinstance(save_at, int) and 0 < save_at < plan.steps):
        raise ValueError(f"save_at must be a step from 1 to {plan.steps - 1}; got {save_at!r}")
    first = launch.run(functools.partial(train_worker, plan=plan, path=path, save_at=save_at),
                       plan.world_size, timeout_s=timeout_s, threads_per_rank=1)
    again = launch.run(functools.partial(train_worker, plan=plan, path=path, start=save_at),
                       plan.world_size, timeout_s=timeout_s, threads_per_rank=1)
    return {"uninterrupted": first, "resumed": again}


def same_run(first: list[dict[str, Any]], again: list[dict[str, Any]], save_at: int) -> bool:
    """Every rank's losses after ``save_at`` and final weights, bit for bit."""
    for a, b in zip(first, again):
        if a["losses"][save_at:] != b["losses"] or a["weights"].keys() != b["weights"].keys():
            return False
        if any(a["weights"][k].tobytes() != b["weights"][k].tobytes() for k in a["weights"]):
            return False
    return len(first) == len(again)


def _torchrun_demo(rank: int, world_size: int) -> bool:
    """Train 4 steps saving at 2, resume in the same processes, compare the bits."""
    import os
    import shutil
    import tempfile

    import torch.distributed as dist

    from course_utils.train3d_check import MESH_FOR_WORLD

    dp, pp, tp = MESH_FOR_WORLD[world_size]
    plan = dataclasses.replace(Plan(dp=dp, pp=pp, tp=tp), steps=4, batch=4 * dp)
    folder = [tempfile.mkdtemp(prefix="course-ckpt3d-") if rank == 0 else None]
    dist.broadcast_object_list(folder)
    path = os.path.join(folder[0], "step_2")
    try:
        first = train_worker(rank, world_size, plan, path, save_at=2)
        again = train_worker(rank, world_size, plan, path, start=2)
        return same_run([first], [again], 2)
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(folder[0], ignore_errors=True)


if __name__ == "__main__":
    from course_utils import launch

    launch.torchrun_main(_torchrun_demo)

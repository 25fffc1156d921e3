"""Module 10's DP x PP x TP trainer, saved with DCP and resumed on 8 ranks.

Built on module 10's public pieces (``train3d.Plan``, ``build_groups``, ``setup_rank``,
``train_step``; ``zero1.ShardedOptimizer``'s ``state``, ``param_groups`` and
``master_params``; ``tiny_lm.MarkovCorpus`` and ``shard_batch``), so that the trainer can
change without this file knowing more than those names.

What each rank saves: its stage's weights under ``pp{p}.tp{t}.<name>`` (the DP replicas hold the
same bits, so DCP writes one copy of each: it takes equal keys for a replicated value); for each
*piece* of its ZeRO-1 slices (one per parameter the slices touch), Adam's moments and step count
under ``pp{p}.tp{t}.dp{d}.{k}.exp_avg``/``exp_avg_sq``/``step`` (every DP rank owns different
pieces), and the fp32 master copy of the piece when the weights are bf16; and the training
step. The gradient buffer is zeroed after every step and holds nothing to save. The data need
no state: step ``s`` reads ``MarkovCorpus.batch(s, ...)``, a pure function of the step. Nothing
in the run draws random numbers after the model is built, so no generator state either.

Run under torchrun (8 ranks: 4 steps, saved at 2 and resumed in the same job, compared)::

    torchrun --standalone --nproc-per-node 8 -m course_utils.checkpoint.trainer3d
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import torch

from course_utils.runtime import backend
from course_utils.models.tiny_lm import MarkovCorpus, shard_batch
from course_utils.trainer3d.train import Groups, Plan, build_groups, setup_rank, train_step
from course_utils.zero.zero1 import ShardedOptimizer

__all__ = ["state_of", "train_worker", "run", "same_run"]

ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")   # torch.optim.Adam's per-parameter state


def state_of(stage: torch.nn.Module, optimizer: ShardedOptimizer, g: Groups, step: int,
             fresh: bool = False) -> dict[str, Any]:
    """The state dict this rank saves (and loads into, in place).

    ``fresh``: the optimizer has not stepped yet, so Adam has no state; create it as Adam's
    first step would (step 0, zero moments), to be overwritten by the load.
    """
    where = f"pp{g.pp_rank}.tp{g.tp_rank}"
    state: dict[str, Any] = {f"{where}.{name}": p for name, p in stage.named_parameters()}
    pieces = [p for group in optimizer.param_groups for p in group["params"]]
    for k, piece in enumerate(pieces):
        if fresh:
            optimizer.state[piece] = {"step": torch.tensor(0.0),
                                      "exp_avg": torch.zeros_like(piece),
                                      "exp_avg_sq": torch.zeros_like(piece)}
        for key in ADAM_STATE:
            state[f"{where}.dp{g.dp_rank}.{k}.{key}"] = optimizer.state[piece][key]
    for k, master in enumerate(optimizer.master_params):       # bf16 weights only
        state[f"{where}.dp{g.dp_rank}.{k}.master"] = master
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
    stage, optimizer, grads = setup_rank(plan, g)
    if start:
        state = state_of(stage, optimizer, g, 0, fresh=True)
        with torch.no_grad():
            dcp.load(state, checkpoint_id=path)
        if state["step"] != start:
            raise ValueError(f"the checkpoint at {path} is of step {state['step']}, not {start}")
    corpus = MarkovCorpus(plan.cfg.vocab_size, seed=plan.seed)
    losses = []
    for step in range(start, plan.steps):
        x, y = corpus.batch(step, plan.batch, plan.cfg.seq_len)                # (B, T) each
        x, y = (backend.to_device(shard_batch(t, g.dp_rank, g.dp_size)) for t in (x, y))
        losses.append(train_step(stage, g, x, y, plan.m, optimizer, grads))
        optimizer.zero_grad()
        grads.zero()
        if step + 1 == save_at:
            dcp.save(state_of(stage, optimizer, g, step + 1), checkpoint_id=path)
    return {"coords": (g.dp_rank, g.pp_rank, g.tp_rank), "losses": losses,
            "weights": {n: backend.to_cpu(p.detach().float()).numpy().copy()
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
    from course_utils.checkpoint.dcp import job_folder
    from course_utils.trainer3d.check import MESH_FOR_WORLD

    dp, pp, tp = MESH_FOR_WORLD[world_size]
    plan = dataclasses.replace(Plan(dp=dp, pp=pp, tp=tp), steps=4, batch=4 * dp)
    with job_folder("course-ckpt3d-") as folder:
        path = os.path.join(folder, "step_2")
        first = train_worker(rank, world_size, plan, path, save_at=2)
        again = train_worker(rank, world_size, plan, path, start=2)
        return same_run([first], [again], 2)


if __name__ == "__main__":
    from course_utils import launch

    launch.torchrun_main(_torchrun_demo)

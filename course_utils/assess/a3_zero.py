"""Assignment a3's harness: a student's sharded Adam step, run on real data-parallel ranks.

The student writes ``sharded_adam_step(local_grad, master, exp_avg, exp_avg_sq, step, lr, betas,
eps, dp_group)``: ZeRO-1's update of one rank's slice of a flat buffer. :func:`run_shard_step`
launches :func:`shard_step_harness` on as many ranks as the gradients have, and returns each
rank's slices after the last step, what the function returned and which ``torch.distributed``
collectives it called (recorded by :class:`course_utils.zero.recording.SpyCollectives`). The
visible test runs it in the kernel; the judge (``authoring/judges/a3_zero.py``) grades what the
hidden cases submitted. Lecture 3 (ZeRO and FSDP).
"""

from __future__ import annotations

from typing import Any

import torch

from course_utils.runtime import backend
from course_utils.zero.recording import SpyCollectives

__all__ = ["shard_step_harness", "run_shard_step"]


def shard_step_harness(rank: int, world_size: int, fn: Any, full_master: torch.Tensor,
                       local_grads: torch.Tensor, lr: float, betas: tuple[float, float],
                       eps: float) -> bytes:
    """Worker running a student's sharded Adam step on this dp rank, once per step.

    ``fn(local_grad, master, exp_avg, exp_avg_sq, step, lr, betas, eps, dp_group)``:
    local_grad (P,) fp32 is this rank's gradient of the whole flat buffer; master, exp_avg,
    exp_avg_sq (S,) fp32 are this rank's slices (S = P / world_size), to update in place; step
    counts from 1. ``full_master`` (P,) fp32; ``local_grads`` (n_steps, world_size, P).
    Returns, pickled, the slices after the last step, fn's return values and the collectives called.
    """
    import pickle

    padded = full_master.numel()
    if padded % world_size:
        raise ValueError(f"full_master has {padded} elements, not divisible by {world_size} ranks")
    s = padded // world_size
    full_master, local_grads = backend.to_device((full_master, local_grads))
    master = full_master[rank * s:(rank + 1) * s].clone()       # (S,) fp32
    exp_avg, exp_avg_sq = torch.zeros_like(master), torch.zeros_like(master)  # (S,) fp32
    returned = []
    with SpyCollectives() as calls:
        for step in range(1, local_grads.shape[0] + 1):
            out = fn(local_grads[step - 1, rank].clone(), master, exp_avg, exp_avg_sq, step,
                     lr, betas, eps, None)
            if isinstance(out, torch.Tensor):
                out = out.detach().clone()
            returned.append(out)
    return pickle.dumps(backend.to_cpu({"master": master, "exp_avg": exp_avg,
                                        "exp_avg_sq": exp_avg_sq, "returned": returned,
                                        "calls": list(calls)}))


def run_shard_step(fn: Any, full_master: torch.Tensor, local_grads: torch.Tensor,
                   lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                   eps: float = 1e-8, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Run :func:`shard_step_harness` on ``local_grads.shape[1]`` ranks; results in rank order."""
    import pickle

    from course_utils import launch

    if not callable(fn):
        raise ValueError(f"fn must be a function; got {type(fn).__name__}")
    if not isinstance(full_master, torch.Tensor) or full_master.dim() != 1:
        raise ValueError("full_master must be a 1-D fp32 tensor (the padded flat buffer)")
    if not isinstance(local_grads, torch.Tensor) or local_grads.dim() != 3 \
            or local_grads.shape[2] != full_master.numel():
        raise ValueError("local_grads must have shape (n_steps, world_size, full_master.numel())")
    world_size = local_grads.shape[1]
    # the spy is the recorder's dispatch mode, whose first use imports torch._dynamo (1.9 s a
    # rank here): have the forkserver import it once (grading kernels preload light)
    launch.preload("torch._dynamo")
    blobs = launch.run(shard_step_harness, world_size, fn, full_master, local_grads, lr,
                       tuple(betas), eps, timeout_s=timeout_s, show_output=False)
    return [pickle.loads(b) for b in blobs]

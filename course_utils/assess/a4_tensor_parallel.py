"""Assignment a4's harness: a student's row-parallel linear layer run on real ranks, spied on.

The student writes ``fn(x_local, w_local, bias, tp_group)``, a row-parallel ``Y = X @ W + b``.
:func:`run_row_parallel` starts ``len(xs) * tp_size`` ranks in tensor-parallel groups of
``tp_size`` (``course_utils.launch.run``); each runs :func:`row_parallel_harness`, which hands
the function its input features and rows of ``W`` and records, with
:func:`course_utils.tensor_parallel.recording.spy_collectives`, every ``torch.distributed``
collective it calls and the size of the group it ran on. The test cell and the judge
(``authoring/judges/a4_tensor_parallel.py``) read the results; no answers here.
:func:`~course_utils.tensor_parallel.sharding.shard_range` is here too: the test cell slices
each rank's rows as the harness does. Serves assignment a4 (lecture 4).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from course_utils.runtime import backend
from course_utils.runtime.validate import check_int
from course_utils.tensor_parallel.comparison import pack, unpack
from course_utils.tensor_parallel.recording import spy_collectives
from course_utils.tensor_parallel.sharding import check_matrix, shard_range

__all__ = ["row_parallel_harness", "run_row_parallel", "shard_range"]


def row_parallel_harness(rank: int, world_size: int, fn: Callable, tp_size: int,
                         xs: Sequence[torch.Tensor], w: torch.Tensor,
                         bias: torch.Tensor) -> bytes:
    """Worker that runs a student's ``fn(x_local, w_local, bias, tp_group)`` on real ranks.

    Ranks form world_size / tp_size data-parallel replicas of tp_size ranks each
    (tp groups {0..t-1}, {t..2t-1}, ...); replica ``dp_rank`` gets input ``xs[dp_rank]``
    (b, s, h_in). Each rank passes its input features x[..., rows] (b, s, h_in/t) and rows of
    W (h_in/t, h_out). Returns, pickled, {"y": fn's result, "calls": [(collective, group size)]}.
    """
    check_int("tp_size", tp_size)
    if world_size % tp_size or len(xs) != world_size // tp_size:
        raise ValueError(f"need world_size ({world_size}) divisible by tp_size ({tp_size}) and "
                         f"one input per replica; got {len(xs)} inputs")
    dp_rank, tp_rank = divmod(rank, tp_size)
    tp_group = None
    for replica in range(world_size // tp_size):  # every rank must create every group
        ranks = list(range(replica * tp_size, (replica + 1) * tp_size))
        group = backend.new_group(ranks, timeout_s=60)
        if replica == dp_rank:
            tp_group = group
    x, w, bias = backend.to_device((xs[dp_rank], w, bias))
    rows = slice(*shard_range(x.shape[-1], tp_size, tp_rank))
    x_local = x[..., rows].clone()                        # (b, s, h_in/t)
    w_local = w[rows, :].clone()                          # (h_in/t, h_out)
    with spy_collectives() as calls:
        y = fn(x_local, w_local, bias.clone(), tp_group)
    if isinstance(y, torch.Tensor):
        y = y.detach().clone()
        if hasattr(y, "wait"):
            y = y.wait()
    return pack({"y": y, "calls": calls})


def run_row_parallel(fn: Callable, tp_size: int, xs: Sequence[torch.Tensor], w: torch.Tensor,
                     bias: torch.Tensor, timeout_s: float = 60.0) -> list[dict]:
    """Launch :func:`row_parallel_harness` on len(xs) * tp_size ranks; results in rank order."""
    from course_utils import launch

    check_int("tp_size", tp_size)
    check_matrix("w", w)
    if not xs:
        raise ValueError("xs must hold one input (b, s, h_in) per data-parallel replica")
    world_size = len(xs) * tp_size
    # the spy is the recorder's dispatch mode, whose first use imports torch._dynamo (1.9 s a
    # rank here): have the forkserver import it once (grading kernels preload light)
    launch.preload("torch._dynamo")
    return unpack(launch.run(row_parallel_harness, world_size, fn, tp_size, list(xs), w, bias,
                             timeout_s=timeout_s))

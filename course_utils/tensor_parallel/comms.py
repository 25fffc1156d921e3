"""Tensor parallelism's wire-level collectives, each logged as a CommEvent of its phase.

What the conjugate operators (:mod:`course_utils.tensor_parallel.conjugates`), the vocabulary-
parallel loss and the sequence-parallel block send, as picotron keeps its TP communication in
one module: :func:`all_reduce` (a sum, into a copy), :func:`all_gather_cat` (every rank's tensor
concatenated along a dim), :func:`reduce_scatter_chunk` (this rank's chunk of the sum, built
from ``all_to_all_single``) and :func:`own_slice_last` (this rank's slice, no communication).
Each records a :class:`~course_utils.tensor_parallel.recording.CommEvent` (op, phase, result
shape and bytes, seconds) for :func:`~course_utils.tensor_parallel.recording.record_comms`.
Serves lecture 4 (tensor parallelism) and lecture 6 (sequence parallelism).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from course_utils.runtime.clock import clock
from course_utils.tensor_parallel.recording import log_comm
from course_utils.tensor_parallel.sharding import shard_range

__all__ = ["all_reduce", "all_gather_cat", "reduce_scatter_chunk", "own_slice_last"]


def all_reduce(x: torch.Tensor, group: dist.ProcessGroup | None, phase: str,
               op: Any = dist.ReduceOp.SUM) -> torch.Tensor:
    """The sum (``op``) of every rank's ``x`` over ``group``, in a copy of ``x`` (logged)."""
    out = x.contiguous().clone()  # never reduce into a tensor autograd may still need
    if dist.get_world_size(group) > 1:
        t0 = clock(out)
        dist.all_reduce(out, op=op, group=group)
        log_comm("all_reduce", phase, out, clock(out) - t0, group=group)
    return out


def all_gather_cat(x: torch.Tensor, group: dist.ProcessGroup | None, phase: str,
                   dim: int = -1) -> torch.Tensor:
    """Every rank's ``x`` concatenated along ``dim`` in rank order (logged): the last dim for
    TP's features, the sequence dim for sequence parallelism."""
    t = dist.get_world_size(group)
    if t == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(t)]
    t0 = clock(x)
    dist.all_gather(parts, x, group=group)
    seconds = clock(x) - t0
    out = torch.cat(parts, dim=dim)  # t times x's size along dim
    log_comm("all_gather", phase, out, seconds, group=group)
    return out


def reduce_scatter_chunk(x: torch.Tensor, group: dist.ProcessGroup | None, phase: str,
                         dim: int) -> torch.Tensor:
    """Every rank's ``x`` (partial sums) -> this rank's chunk of their sum along ``dim``, in
    rank order: (B, T, ...) -> (B, T/t, ...) for the sequence dim (logged).

    Built from ``all_to_all_single``: rank j is sent every rank's j-th chunk and adds them, so
    each rank sends (t-1)/t of the tensor, as in a ring reduce-scatter.
    """
    t = dist.get_world_size(group)
    if t == 1:
        return x
    if x.shape[dim] % t:
        raise ValueError(f"the length {x.shape[dim]} of dim {dim} (the sequence) must be "
                         f"divisible by the tp size {t}")
    send = torch.stack(x.chunk(t, dim=dim)).contiguous()  # (t, B, T/t, ...): chunk j to rank j
    recv = torch.empty_like(send)
    t0 = clock(send)
    dist.all_to_all_single(recv, send, group=group)      # recv[r]: rank r's chunk for me
    out = recv.sum(0)                                    # (B, T/t, ...)
    log_comm("reduce_scatter", phase, out, clock(out) - t0, group=group)
    return out


def own_slice_last(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """This rank's contiguous slice of ``x``'s last dim (no communication)."""
    t, r = dist.get_world_size(group), dist.get_rank(group)
    start, stop = shard_range(x.shape[-1], t, r)
    return x[..., start:stop].contiguous()

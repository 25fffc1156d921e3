"""The conjugate operators: autograd functions whose forward and backward are each other's dual.

Megatron's pair around a tensor-parallel region (Shoeybi et al. 2019, section 3): **f**
(:func:`copy_to_tp`: identity forward, all-reduce backward) before the column-parallel matmul
and **g** (:func:`reduce_from_tp`: all-reduce forward, identity backward) after the row-parallel
one; :func:`gather_from_tp` and :func:`scatter_to_tp` gather or keep a slice of the last dim.
With sequence parallelism (Korthikanti et al. 2022) g becomes :func:`gather_from_sp`
(all-gather along the sequence forward, reduce-scatter backward) and g-bar
:func:`reduce_scatter_to_sp` (reduce-scatter forward, all-gather backward), kept here beside
TP's, as Megatron-LM's ``tensor_parallel/mappings.py`` keeps them, because the vocabulary-
parallel embedding uses g-bar too. Every collective goes through
:mod:`course_utils.tensor_parallel.comms` and is recorded. Serves lectures 4 and 6.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_utils.tensor_parallel.comms import all_gather_cat, own_slice_last, reduce_scatter_chunk
# lecture 4 prints the line f's backward and g's forward return: it reads "_all_reduce(...)"
from course_utils.tensor_parallel.comms import all_reduce as _all_reduce

__all__ = ["CopyToTensorParallel", "ReduceFromTensorParallel", "GatherFromTensorParallel",
           "ScatterToTensorParallel", "copy_to_tp", "reduce_from_tp", "gather_from_tp",
           "scatter_to_tp", "SEQ_DIM", "all_gather_seq", "reduce_scatter_seq",
           "GatherFromSequenceParallel", "ReduceScatterToSequenceParallel", "gather_from_sp",
           "reduce_scatter_to_sp"]

SEQ_DIM = 1            # activations are (B, T, C): the sequence is dim 1


# ------------------------------------------------------------------ tensor parallelism's f, g


class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's f: identity forward; all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # Each rank's dL/dX covers only its own output features: the full gradient is the sum.
        return _all_reduce(grad, ctx.group, "backward"), None


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's g: all-reduce forward (sum the partial results); identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        return _all_reduce(x, group, "forward")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # Y = sum_r P_r, so dL/dP_r = dL/dY on every rank: nothing to communicate.
        return grad, None


class GatherFromTensorParallel(torch.autograd.Function):
    """All-gather along the last dim forward; keep this rank's slice of the gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return all_gather_cat(x, group, "forward")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return own_slice_last(grad, ctx.group), None


class ScatterToTensorParallel(torch.autograd.Function):
    """Keep this rank's slice of the last dim forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return own_slice_last(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return all_gather_cat(grad, ctx.group, "backward"), None


def copy_to_tp(x: torch.Tensor, tp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """f: returns ``x`` unchanged; its gradient is all-reduced over ``tp_group`` in backward."""
    return CopyToTensorParallel.apply(x, tp_group)


def reduce_from_tp(x: torch.Tensor, tp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """g: sum of ``x`` over ``tp_group`` (all-reduce); the gradient passes through unchanged."""
    return ReduceFromTensorParallel.apply(x, tp_group)


def gather_from_tp(x: torch.Tensor, tp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """(..., n/t) per rank -> (..., n) on every rank, concatenated in tp-rank order."""
    return GatherFromTensorParallel.apply(x, tp_group)


def scatter_to_tp(x: torch.Tensor, tp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """(..., n) -> (..., n/t): this rank's contiguous slice of the last dim."""
    return ScatterToTensorParallel.apply(x, tp_group)


# --------------------------------------------------------------- sequence parallelism's g, g-bar


def all_gather_seq(x: torch.Tensor, group: dist.ProcessGroup | None,
                   phase: str) -> torch.Tensor:
    """(B, T/t, ...) per rank -> (B, T, ...) on every rank, slices in rank order (logged)."""
    return all_gather_cat(x, group, phase, dim=SEQ_DIM)


def reduce_scatter_seq(x: torch.Tensor, group: dist.ProcessGroup | None,
                       phase: str) -> torch.Tensor:
    """(B, T, ...) partial sums per rank -> this rank's (B, T/t, ...) slice of their sum (logged;
    :func:`~course_utils.tensor_parallel.comms.reduce_scatter_chunk` along the sequence)."""
    return reduce_scatter_chunk(x, group, phase, dim=SEQ_DIM)


class GatherFromSequenceParallel(torch.autograd.Function):
    """Megatron-SP's g: all-gather along the sequence forward; reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return all_gather_seq(x, group, "forward")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # Every rank used all T tokens for its own heads/features: dL/dx sums over the ranks,
        # and each rank needs only its tokens' slice of that sum.
        return reduce_scatter_seq(grad, ctx.group, "backward"), None


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    """Megatron-SP's g-bar: reduce-scatter along the sequence forward; all-gather backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return reduce_scatter_seq(x, group, "forward")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # y_r = (sum_j P_j)[tokens_r], so dL/dP_j is the whole gathered gradient on every rank.
        return all_gather_seq(grad, ctx.group, "backward"), None


def gather_from_sp(x: torch.Tensor, tp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """g: (B, T/t, C) this rank's tokens -> (B, T, C) every token; reduce-scatter backward."""
    return GatherFromSequenceParallel.apply(x, tp_group)


def reduce_scatter_to_sp(x: torch.Tensor,
                         tp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """g-bar: (B, T, C) partial sums -> (B, T/t, C) this rank's tokens of the sum."""
    return ReduceScatterToSequenceParallel.apply(x, tp_group)

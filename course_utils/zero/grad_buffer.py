"""Contiguous fp32 gradients, reduce-scattered over DP by bucket while backward still runs.

Each parameter ``p`` gets ``p.main_grad``, a view of one flat fp32 buffer laid out by a
:class:`FlatLayout` (the same layout as the :class:`~course_utils.zero.zero1.ShardedOptimizer`
that reads it). A post-accumulate-grad hook adds each microbatch's ``p.grad`` into
``p.main_grad`` and frees ``p.grad``: gradients accumulate in fp32 whatever the compute dtype
(picotron's ``main_grad``, ``picotron/data_parallel/data_parallel.py``; Megatron-LM's
"bf16 param, fp32 grads"), and a bucket is already one contiguous slice of memory, so nothing
is concatenated or copied before it is sent (module 9's :class:`~course_utils.data_parallel.overlap.
BucketAllReduce` flattens each bucket into a new tensor every step).

While ``active`` (the last microbatch's backward, as DDP's ``no_sync`` leaves it), a bucket
whose every parameter has its gradient is reduce-scattered over ``dp_group`` at once
(``async_op``, :func:`course_utils.runtime.backend.reduce_scatter_in_place`), so the communication of
the later layers runs while backward computes the earlier ones; :meth:`GradBuffer.finish`
waits for what is still in flight and divides this rank's slices by D: the global mean, in the
slices this rank's optimizer updates. The other slices of the buffer then hold partial sums and
are not read.

With sequence parallelism, a few parameters (the LayerNorms, the row-parallel biases, the
position embedding) see only this TP rank's tokens, so their gradients are partial sums over
the TP group: ``tp_partial`` lists them. Both reductions are sums, so their order does not
matter: :meth:`GradBuffer.finish`, after the DP reduce-scatters, all-reduces over ``tp_group``
just the elements of those parameters that this rank's slices hold, in one call (Megatron
all-reduces them whole, coalesced, in ``finalize_model_grads``). It is declared to
:mod:`course_utils.collectives.recorder` (phase "grad sync"; seen by ``record_comms``).

:class:`FlatLayout` is the arithmetic both share (offsets, buckets and each rank's slices, no
tensors). Lecture 10's 3-D trainer (:mod:`course_utils.trainer3d.train`) uses the buffer with
lecture 3's ZeRO-1 wrapper, :class:`course_utils.zero.zero1.ShardedOptimizer`.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

from course_utils.runtime import backend
from course_utils.collectives import recorder
from course_utils.runtime.clock import clock
from course_utils.runtime.validate import check_int

__all__ = ["FlatLayout", "GradBuffer"]


class FlatLayout:
    """Where each of a list of parameters sits in one flat buffer, and which slice each of
    ``dp_size`` ranks owns (counts of elements; pure arithmetic, no tensors).

    ``numels``: the parameters' sizes in buffer order; ``bucket_numel``: a bucket closes once it
    holds at least this many elements (the parameter that crosses it stays in it, as in DDP);
    None: one bucket. Each bucket is padded with zeros to a multiple of ``dp_size``.
    """

    def __init__(self, numels: Sequence[int], dp_size: int, bucket_numel: int | None = None):
        if not numels or not all(isinstance(n, int) and n >= 0 for n in numels):
            raise ValueError(f"numels must be a non-empty list of sizes >= 0; got {numels!r}")
        self.dp_size = check_int("dp_size", dp_size)
        if bucket_numel is not None:
            check_int("bucket_numel", bucket_numel)
        self.numels = list(numels)
        self.offsets: list[int] = []
        self.buckets: list[tuple[int, int]] = []        # [start, stop) incl. padding
        self.bucket_of: list[int] = []                  # each parameter's bucket
        start = filled = 0
        for n in self.numels:
            if bucket_numel is not None and filled >= bucket_numel:
                self._close(start, filled)
                start, filled = start + self._padded(filled), 0
            self.offsets.append(start + filled)
            self.bucket_of.append(len(self.buckets))
            filled += n
        self._close(start, filled)

    def _padded(self, n: int) -> int:
        return -(-n // self.dp_size) * self.dp_size

    def _close(self, start: int, filled: int) -> None:
        self.buckets.append((start, start + self._padded(filled)))

    @property
    def total(self) -> int:
        """Elements of the buffer, padding included."""
        return self.buckets[-1][1]

    def shard(self, bucket: int, dp_rank: int) -> tuple[int, int]:
        """[start, stop) of ``dp_rank``'s slice of bucket ``bucket`` in the buffer."""
        lo, hi = self.buckets[bucket]
        size = (hi - lo) // self.dp_size
        return lo + dp_rank * size, lo + (dp_rank + 1) * size

    def pieces(self, dp_rank: int) -> list[tuple[int, int, int]]:
        """(parameter index, start inside the parameter, length) of every run of elements that
        ``dp_rank`` owns, in buffer order."""
        out = []
        for i, (off, n) in enumerate(zip(self.offsets, self.numels)):
            lo, hi = self.shard(self.bucket_of[i], dp_rank)
            a, b = max(lo, off), min(hi, off + n)
            if a < b:
                out.append((i, a - off, b - a))
        return out

    def owned(self, dp_rank: int) -> int:
        """Parameter elements (padding excluded) that ``dp_rank`` updates."""
        return sum(n for _, _, n in self.pieces(dp_rank))


class GradBuffer:
    """fp32 ``main_grad`` views of one buffer for ``params`` (in ``layout``'s order), with
    bucketed reduce-scatters over ``dp_group`` during the backward passes run while
    ``active``."""

    def __init__(self, params: Sequence[torch.nn.Parameter], layout: FlatLayout,
                 dp_group: Any = None, tp_group: Any = None,
                 tp_partial: Sequence[torch.nn.Parameter] = (), dtype: torch.dtype = torch.float32):
        if len(params) != len(layout.numels) or any(
                p.numel() != n for p, n in zip(params, layout.numels)):
            raise ValueError("params must match the layout's sizes, in its order")
        self.params, self.layout = list(params), layout
        self.dp_group, self.tp_group = dp_group, tp_group
        self.dp_size, self.dp_rank = dist.get_world_size(dp_group), dist.get_rank(dp_group)
        self.flat = torch.zeros(layout.total, dtype=dtype, device=params[0].device)
        partial = {id(p) for p in tp_partial}
        self.active = True
        self._hooks = []
        for i, (p, off) in enumerate(zip(self.params, layout.offsets)):
            p.main_grad = self.flat[off:off + p.numel()].view_as(p)
            self._hooks.append(p.register_post_accumulate_grad_hook(
                lambda p, i=i: self._grad_ready(p, i)))
        self.partial_runs = [(layout.offsets[i] + lo, n) for i, lo, n in
                             layout.pieces(self.dp_rank) if id(self.params[i]) in partial]
        """(start, length) in the buffer of the TP-partial elements of this rank's slices."""
        self.n_buckets = len(layout.buckets)
        self.reset()

    def reset(self) -> None:
        """Forget the step's progress (no bucket ready, nothing in flight)."""
        self._missing = [0] * self.n_buckets
        for b in self.layout.bucket_of:
            self._missing[b] += 1
        self._next, self._pending = 0, []

    def _grad_ready(self, p: torch.nn.Parameter, i: int) -> None:
        p.main_grad.add_(p.grad)             # fp32 accumulation of this microbatch's gradient
        p.grad = None
        if not self.active:
            return
        self._missing[self.layout.bucket_of[i]] -= 1
        while self._next < self.n_buckets and self._missing[self._next] == 0:
            self._launch(self._next)

    def _launch(self, b: int) -> None:
        lo, hi = self.layout.buckets[b]
        self._pending.append(backend.reduce_scatter_in_place(self.flat[lo:hi], self.dp_group,
                                                             async_op=True))
        self._next = b + 1

    def finish(self) -> None:
        """Launch what is left, wait, and divide this rank's slices by D (the mean)."""
        if self._next < self.n_buckets and any(self._missing[self._next:]):
            raise RuntimeError("finish() before every gradient arrived: run backward with "
                               "active = True on the last microbatch")
        while self._next < self.n_buckets:
            self._launch(self._next)
        for pending in self._pending:
            pending.wait()
        if self.partial_runs and self.tp_group is not None and \
                dist.get_world_size(self.tp_group) > 1:     # the other tokens' share, once
            part = torch.cat([self.flat[a:a + n] for a, n in self.partial_runs])
            t0 = clock(part)
            dist.all_reduce(part, group=self.tp_group)
            recorder.declare("all_reduce", part, phase="grad sync", seconds=clock(part) - t0,
                             group=self.tp_group)
            for (a, n), piece in zip(self.partial_runs, part.split([n for _, n in
                                                                    self.partial_runs])):
                self.flat[a:a + n].copy_(piece)
        for b in range(self.n_buckets):
            lo, hi = self.layout.shard(b, self.dp_rank)
            self.flat[lo:hi].div_(self.dp_size)
        self.reset()

    def full_grads(self) -> list[torch.Tensor]:
        """Collective over DP, for checking: each parameter's reduced gradient, gathered from
        the ranks' slices into a new buffer (call after :meth:`finish`)."""
        full = torch.empty_like(self.flat)
        for b in range(self.n_buckets):
            lo, hi = self.layout.buckets[b]
            mine = self.flat[slice(*self.layout.shard(b, self.dp_rank))].clone()
            dist.all_gather_single(full[lo:hi], mine, group=self.dp_group)
        return [full[off:off + p.numel()].view_as(p)
                for p, off in zip(self.params, self.layout.offsets)]

    def zero(self) -> None:
        """Zero every gradient (the buffer is kept: no allocation per step)."""
        self.flat.zero_()

    def remove(self) -> None:
        """Remove the hooks."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

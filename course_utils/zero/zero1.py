"""ZeRO-1 as a wrapper of any ``torch.optim`` optimizer: each DP rank updates one shard.

The parameters (one rank's pipeline stage, already split by TP; or any model's) are moved
into one flat buffer, cut into buckets (:class:`~course_utils.zero.grad_buffer.FlatLayout`, also
bound here as ``zero1.FlatLayout``: in the order given, a bucket closes once it holds at least
``bucket_numel`` elements, and is padded with zeros to a multiple of D, the size of
``dp_group``). DP rank r owns the r-th of the D equal slices of
every bucket, as Megatron-LM's distributed optimizer does, so that a bucket's gradients can be
reduce-scattered (:class:`course_utils.zero.grad_buffer.GradBuffer`) the moment backward has filled
it and each rank receives exactly the slice it updates. Per step and per rank, that is
(D-1)/D of the gradient bytes reduce-scattered plus (D-1)/D of the weight bytes all-gathered:
2(D-1)/D in all, what an all-reduce alone costs (module 3).

:class:`ShardedOptimizer` cuts this rank's slices into *pieces*, one per parameter they
touch, and hands the pieces to ``optimizer_cls`` (``torch.optim.AdamW``, ``SGD``, ...), which
keeps its state for them alone. A piece whose parameter has no gradient gets none, so the inner
optimizer skips it, as ``torch.optim`` skips such a parameter. Element-wise optimizers (SGD,
Adam, AdamW, ...) then compute exactly what they compute on whole tensors; one that reads a
whole tensor at once (LAMB's trust ratio, Muon's orthogonalisation, Adafactor's factored
moments) would not, and is not supported. After the update, each bucket's slices are
all-gathered in place into the flat buffer, which the parameters are views of: no
concatenation and no copy back. With ``master_dtype`` wider than the parameters (bf16
weights), the pieces are an fp32 master copy of this rank's slices (Megatron's "bf16 param,
fp32 grads" layout: 2 + 4 bytes per parameter, plus 4 + 8 per owned element).

This is not what PyTorch's ``ZeroRedundancyOptimizer`` does. Its docstring
(``torch/distributed/optim/zero_redundancy_optimizer.py``, lines 305-307 in torch 2.13):
"``ZeroRedundancyOptimizer`` uses a sorted-greedy algorithm to pack a number of parameters at
each rank. Each parameter belongs to a single rank and is not divided among ranks."
(``_partition_parameters``, lines 689-697: sorted by size, each to the rank with the fewest
elements so far), and its ``_sync_params`` (line 813) sends every rank's updated parameters to
the others with ``dist.broadcast``. It sits after DDP's all-reduce of the whole gradient.

Standalone (a model trained with DDP, or CS336's sharded-optimizer test): the caller
averages the gradients over DP first, as DDP does, and :meth:`ShardedOptimizer.step` reads each
parameter's ``.grad``. In the 3-D trainer, a ``GradBuffer`` hands over the reduce-scattered
slices instead (``grads=``). ``max_norm`` clips the gradient by its norm over every rank of
``norm_group`` (the whole job: DP slices, PP stages and TP shards each hold a part of the
model's gradient), as ``torch.nn.utils.clip_grad_norm_`` does for one process.

Lecture 3 (ZeRO and FSDP) builds ZeRO-1; lecture 10's 3-D trainer
(:mod:`course_utils.trainer3d.train`) and its checkpoints use this wrapper.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch
import torch.distributed as dist

from course_utils.runtime import clock as timing
from course_utils.runtime.clock import clock
from course_utils.runtime.validate import check_real
from course_utils.zero.grad_buffer import FlatLayout, GradBuffer

__all__ = ["FlatLayout", "ShardedOptimizer", "bytes_sent_worker"]


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1 over ``dp_group``: ``optimizer_cls(**kwargs)`` on this rank's slices only.

    A ``torch.optim.Optimizer`` whose ``param_groups`` and ``state`` are the inner optimizer's
    (its parameters are this rank's slices), so a ``torch.optim.lr_scheduler`` drives it and
    ``state_dict`` holds this rank's shard.

    ``params``: tensors of one dtype and device (repeats are dropped, as for tied weights); they
    become views of one flat buffer. ``grads``: a :class:`~course_utils.zero.grad_buffer.GradBuffer`
    whose slices hold the reduced gradients (default: read each ``param.grad``, already
    averaged over DP). ``max_norm``: clip by the norm over ``norm_group`` (default: every rank),
    each element counted on one rank only: ``counted[i]`` False leaves parameter i out on this
    rank (a TP-replicated copy). ``allow_step=False``: :meth:`step` refuses, so the caller writes
    the all-gather (assignment a10): :meth:`update_shard`, then :meth:`load_gathered`.
    """

    def __init__(self, params: Iterable[torch.Tensor], optimizer_cls: type = torch.optim.Adam,
                 dp_group: Any = None, *, bucket_numel: int | None = None,
                 master_dtype: torch.dtype | None = None, grads: Any = None,
                 max_norm: float | None = None, norm_group: Any = None,
                 counted: Sequence[bool] | None = None, allow_step: bool = True, **kwargs: Any):
        self.params: list[torch.Tensor] = []
        for p in params:
            if not isinstance(p, torch.Tensor):
                raise ValueError(f"params must be tensors; got {type(p).__name__}")
            if all(p is not q for q in self.params):
                self.params.append(p)
        if not self.params:
            raise ValueError("params must be a non-empty iterable of tensors")
        ref = self.params[0]
        if any(p.dtype != ref.dtype or p.device != ref.device for p in self.params):
            raise ValueError("params must share one dtype and one device (one flat buffer)")
        if not (isinstance(optimizer_cls, type)
                and issubclass(optimizer_cls, torch.optim.Optimizer)):
            raise ValueError(f"optimizer_cls must be a torch.optim.Optimizer class; got "
                             f"{optimizer_cls!r}")
        self.max_norm = None if max_norm is None else check_real("max_norm", max_norm)
        self.dp_group, self.norm_group, self.grads = dp_group, norm_group, grads
        self.dp_size, self.dp_rank = dist.get_world_size(dp_group), dist.get_rank(dp_group)
        self.layout = FlatLayout([p.numel() for p in self.params], self.dp_size, bucket_numel)
        self.counted = list(counted) if counted is not None else [True] * len(self.params)
        if len(self.counted) != len(self.params):
            raise ValueError(f"counted must have one flag per parameter ({len(self.params)})")
        self.flat = torch.zeros(self.layout.total, dtype=ref.dtype, device=ref.device)
        with torch.no_grad():
            for p, off in zip(self.params, self.layout.offsets):
                view = self.flat[off:off + p.numel()]
                view.copy_(p.reshape(-1))
                p.data = view.view_as(p)                     # the parameter lives in the buffer
        self.master_dtype = master_dtype or ref.dtype
        self._pieces = self.layout.pieces(self.dp_rank)      # (param, start, length)
        owned = sum(n for _, _, n in self._pieces)
        self.master_params: list[torch.Tensor] = []
        if self.master_dtype != ref.dtype:                   # an fp32 copy of my slices
            self._master_flat = torch.empty(owned, dtype=self.master_dtype, device=ref.device)
        masters, at = [], 0
        for i, lo, n in self._pieces:
            if self.master_dtype == ref.dtype:               # update the buffer in place
                start = self.layout.offsets[i] + lo
                piece = torch.nn.Parameter(self.flat[start:start + n])
            else:
                view = self._master_flat[at:at + n]
                view.copy_(self.params[i].detach().reshape(-1)[lo:lo + n])
                piece = torch.nn.Parameter(view)
                self.master_params.append(piece)
            masters.append(piece)
            at += n
        self._masters = masters
        self.inner = optimizer_cls(masters, **kwargs) if masters else None
        # an Optimizer (its hooks and state_dict) whose groups and state are the inner one's
        super().__init__([{"params": masters}], dict(kwargs))
        if self.inner is not None:
            self.param_groups, self.state = self.inner.param_groups, self.inner.state
        else:                                              # (this rank owns no slice)
            self.param_groups = []
        self.allow_step = allow_step
        self.comm_s = 0.0           # seconds in the all-gathers, summed over steps
        self.grad_norm: float | None = None   # the last step's norm (before clipping)

    # ------------------------------------------------------------------ one step, in parts

    def _load_grads(self) -> None:
        for piece, (i, lo, n) in zip(self._masters, self._pieces):
            if self.grads is not None:
                start = self.layout.offsets[i] + lo
                g = self.grads.flat[start:start + n]
            else:
                full = self.params[i].grad
                g = None if full is None else full.reshape(-1)[lo:lo + n]
            piece.grad = None if g is None else g.to(self.master_dtype)

    def _clip(self) -> None:
        sq = torch.zeros((), dtype=torch.float32, device=self.flat.device)
        for piece, (i, _, _) in zip(self._masters, self._pieces):
            if piece.grad is not None and self.counted[i]:
                sq += piece.grad.float().pow(2).sum()
        t0 = clock(sq)
        dist.all_reduce(sq, group=self.norm_group)        # every part of the model's gradient
        self.comm_s += clock(sq) - t0
        self.grad_norm = float(sq.sqrt())
        # clip_grad_norm_'s rule (torch/nn/utils/clip_grad.py, lines 164-168):
        # multiply by min(max_norm / (norm + 1e-6), 1)
        coef = min(self.max_norm / (self.grad_norm + 1e-6), 1.0)
        for piece in self._masters:
            if piece.grad is not None:
                piece.grad.mul_(coef)

    @torch.no_grad()
    def _update(self) -> None:
        """Clip, run the inner optimizer on this rank's slices, write them into the buffer."""
        self._load_grads()
        if self.max_norm is not None:
            self._clip()
        if self.inner is not None:
            self.inner.step()
        if self.master_dtype != self.flat.dtype:
            for piece, (i, lo, n) in zip(self._masters, self._pieces):
                start = self.layout.offsets[i] + lo
                self.flat[start:start + n].copy_(piece)

    @torch.no_grad()
    def update_shard(self) -> torch.Tensor:
        """Run the inner optimizer on this rank's slices; return them, concatenated in bucket
        order ((sum of S_b,) elements, the same length on every DP rank, in the parameters'
        dtype). The other ranks' slices of the weights are unchanged until gathered."""
        self._update()
        return torch.cat([self.flat[slice(*self.layout.shard(b, self.dp_rank))]
                          for b in range(len(self.layout.buckets))])

    @torch.no_grad()
    def load_gathered(self, flat: torch.Tensor) -> None:
        """Copy the D ranks' :meth:`update_shard` results, concatenated in DP-rank order, into
        the weights."""
        mine = sum(hi - lo for lo, hi in (self.layout.shard(b, 0)
                                          for b in range(len(self.layout.buckets))))
        if not isinstance(flat, torch.Tensor) or flat.shape != (mine * self.dp_size,):
            raise ValueError(f"flat must be a tensor of shape ({mine * self.dp_size},) (D = "
                             f"{self.dp_size} slices of {mine}); got "
                             f"{getattr(flat, 'shape', type(flat).__name__)}")
        per_rank = flat.view(self.dp_size, mine)
        at = 0
        for b in range(len(self.layout.buckets)):
            size = self.layout.shard(b, 0)[1] - self.layout.shard(b, 0)[0]
            lo, hi = self.layout.buckets[b]
            self.flat[lo:hi].view(self.dp_size, size).copy_(per_rank[:, at:at + size])
            at += size

    @torch.no_grad()
    def step(self) -> None:
        """ZeRO-1's whole update: :meth:`update_shard`, then each bucket all-gathered in place."""
        if not self.allow_step:
            raise RuntimeError("this optimizer leaves the all-gather to you: call "
                               "update_shard(), all-gather the shards over the DP group and "
                               "pass them to load_gathered()")
        self._update()
        t0 = clock(self.flat)
        for b in range(len(self.layout.buckets)):
            lo, hi = self.layout.buckets[b]
            mine = self.flat[slice(*self.layout.shard(b, self.dp_rank))].clone()
            dist.all_gather_single(self.flat[lo:hi], mine, group=self.dp_group)
        self.comm_s += clock(self.flat) - t0

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients: the parameters' ``.grad`` and the pieces' (a ``GradBuffer``
        is zeroed by its owner)."""
        for p in self.params:
            p.grad = None
        for piece in self._masters:
            piece.grad = None


def bytes_sent_worker(rank: int, world_size: int, numel: int = 2 ** 18) -> dict[str, float]:
    """Worker: the bytes this rank writes to its sockets (``timing.bytes_written``) for one
    ZeRO-1 step of a ``numel``-element fp32 parameter, as a fraction of its bytes: the gradient
    buffer's reduce-scatter and the optimizer's all-gather, against an all-reduce of the
    gradient followed by the same all-gather. The second of two trials (the first opens the
    connections)."""
    w = torch.nn.Parameter(torch.randn(numel))
    opt = ShardedOptimizer([w], torch.optim.SGD, lr=0.1)
    grads = GradBuffer(opt.params, opt.layout)
    opt.grads = grads
    out: dict[str, float] = {}
    for _ in range(2):
        dist.barrier()
        before = timing.bytes_written()
        w.sum().backward()                 # the bucket's reduce-scatter starts in backward
        grads.finish()
        opt.step()
        out["reduce-scatter + all-gather"] = (timing.bytes_written() - before) / (4 * numel)
        opt.zero_grad()
        grads.zero()
        g = torch.ones(numel)
        dist.barrier()
        before = timing.bytes_written()
        dist.all_reduce(g)
        size = numel // world_size
        dist.all_gather_single(torch.empty(numel), g[rank * size:(rank + 1) * size])
        out["all-reduce + all-gather"] = (timing.bytes_written() - before) / (4 * numel)
    return out

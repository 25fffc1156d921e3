"""ZeRO-1 as an optimizer: each DP rank keeps Adam's moments for one shard, then all-gathers.

The parameters of a model replica (here: one rank's pipeline stage, already split by TP) are
read as one flat vector, padded with zeros to a multiple of D (the size of ``dp_group``), and
DP rank r owns elements ``[r*S, (r+1)*S)`` with ``S = ceil(n / D)`` (module 3's flat-buffer
layout). :meth:`ShardedAdam.step` expects gradients already averaged over DP (a bucketed
all-reduce, as DDP does: the same pairing as DDP + ``ZeroRedundancyOptimizer``), updates its
own shard with exactly ``torch.optim.Adam``'s arithmetic, and all-gathers the updated shards so
every replica holds the same weights again. Persistent bytes per rank in fp32: 4n weights +
4n gradients + 8S moments (``memory.zero_state_bytes(n, D, stage=1, layout_name="fp32_adam")``
plus at most D - 1 padding elements).

The optimizer's own all-gather is timed (:attr:`ShardedAdam.comm_s`) for the step breakdown.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
import torch.distributed as dist

from course_utils.measure import clock
from course_utils.validate import check_real
from course_utils.zero import shard_numel

__all__ = ["ShardedAdam"]


class ShardedAdam:
    """Adam over ``params`` with the moments sharded over ``dp_group`` (ZeRO stage 1).

    ``lr``, ``betas`` and ``eps`` as in ``torch.optim.Adam`` (no weight decay). ``state`` has
    the moments in the layout ``memory.count_state_bytes`` reads (``{0: {"exp_avg": ...}}``).
    ``allow_step=False`` makes :meth:`step` refuse, so that the caller writes the all-gather
    (assignment a10).
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], dp_group=None, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 allow_step: bool = True):
        self.params = [p for p in params]
        if not self.params or not all(isinstance(p, torch.Tensor) for p in self.params):
            raise ValueError("params must be a non-empty iterable of tensors")
        self.lr = check_real("lr", lr)
        if (not isinstance(betas, tuple) or len(betas) != 2
                or not all(0 <= check_real("betas", b, 0, strict=False) < 1 for b in betas)):
            raise ValueError(f"betas must be a pair of numbers in [0, 1); got {betas!r}")
        self.betas, self.eps = betas, check_real("eps", eps, 0, strict=False)
        self.dp_group = dp_group
        self.dp_size = dist.get_world_size(dp_group)
        self.dp_rank = dist.get_rank(dp_group)
        self.numel = sum(p.numel() for p in self.params)
        self.shard = shard_numel(self.numel, self.dp_size)        # S elements per DP rank
        self.start = self.dp_rank * self.shard
        ref = self.params[0]
        self.state = {0: {"exp_avg": torch.zeros(self.shard, dtype=ref.dtype, device=ref.device),
                          "exp_avg_sq": torch.zeros(self.shard, dtype=ref.dtype,
                                                    device=ref.device)}}
        self.steps = 0
        self.comm_s = 0.0   # seconds in the all-gather, summed over steps
        self.allow_step = allow_step

    def _flat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.cat([t.reshape(-1) for t in tensors])                  # (n,)
        return torch.nn.functional.pad(flat, (0, self.shard * self.dp_size - self.numel))

    @torch.no_grad()
    def update_shard(self) -> torch.Tensor:
        """Adam on this rank's shard of the weights; returns the updated shard, (S,).

        The weights themselves are unchanged until :meth:`load_gathered` copies every rank's
        updated shard back into them.
        """
        missing = [i for i, p in enumerate(self.params) if p.grad is None]
        if missing:
            raise ValueError(f"parameter {missing[0]} has no gradient: run backward first")
        self.steps += 1
        beta1, beta2 = self.betas
        lo, hi = self.start, self.start + self.shard
        p = self._flat(self.params)[lo:hi]                                    # (S,) mine
        g = self._flat([q.grad for q in self.params])[lo:hi]                  # (S,)
        m, v = self.state[0]["exp_avg"], self.state[0]["exp_avg_sq"]
        # torch.optim.Adam's single-tensor update, step for step (torch/optim/adam.py)
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        step_size = self.lr / (1 - beta1 ** self.steps)
        denom = (v.sqrt() / math.sqrt(1 - beta2 ** self.steps)).add_(self.eps)
        return p.addcdiv_(m, denom, value=-step_size)

    @torch.no_grad()
    def load_gathered(self, flat: torch.Tensor) -> None:
        """Copy the D shards, concatenated in DP-rank order ((D*S,) elements), into the weights."""
        if not isinstance(flat, torch.Tensor) or flat.shape != (self.shard * self.dp_size,):
            raise ValueError(f"flat must be a tensor of shape ({self.shard * self.dp_size},) "
                             f"(D = {self.dp_size} shards of {self.shard}); got "
                             f"{getattr(flat, 'shape', type(flat).__name__)}")
        offset = 0
        for q in self.params:
            q.copy_(flat[offset:offset + q.numel()].view_as(q))
            offset += q.numel()

    @torch.no_grad()
    def step(self) -> None:
        """ZeRO-1's whole update: :meth:`update_shard`, all-gather over DP,
        :meth:`load_gathered`."""
        if not self.allow_step:
            raise RuntimeError("this optimizer leaves the all-gather to you: call "
                               "update_shard(), all-gather the shards over the DP group and "
                               "pass them to load_gathered()")
        shard = self.update_shard()
        parts = [torch.empty_like(shard) for _ in range(self.dp_size)]
        t0 = clock(shard)
        dist.all_gather(parts, shard, group=self.dp_group)                    # D x (S,)
        self.comm_s += clock(shard) - t0
        self.load_gathered(torch.cat(parts))                                  # (D*S,)

    def zero_grad(self) -> None:
        """Set every gradient to None."""
        for p in self.params:
            p.grad = None

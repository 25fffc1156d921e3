"""One Linear layer's flat buffers on a ZeRO rank, and the bytes of the storages a rank holds.

:class:`FlatUnit` is a *unit* of :class:`course_utils.zero.engine.ZeroDP` (like an FSDP unit):
an ``nn.Linear``'s weight and bias as one flat buffer of ``n`` elements, padded to a multiple of
D, of which this rank owns ``shard`` elements, and the buffers the stage keeps for it.
:func:`storage_bytes` adds up the distinct storages behind tensors, each once: how the engine
(and :mod:`course_utils.zero.fsdp`) *measure* a rank's persistent bytes. Lecture 3 (ZeRO and
FSDP).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn

from course_utils.zero.sizes import shard_numel

__all__ = ["FlatUnit", "storage_bytes"]


def storage_bytes(tensors: Sequence[torch.Tensor | None], seen: set) -> int:
    """Bytes of the distinct, non-empty storages behind ``tensors`` (each counted once)."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if storage.nbytes() == 0 or key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


class FlatUnit:
    """One Linear layer's flat buffers on this rank: its weight and bias flattened into ``n``
    elements, this rank's shard of ``shard`` elements and the ``padded`` length of the whole."""

    def __init__(self, index: int, module: nn.Linear, dp: int):
        self.index = index
        self.module = module
        self.params = [module.weight, module.bias]
        self.shapes = [p.shape for p in self.params]
        self.numels = [p.numel() for p in self.params]
        self.n = sum(self.numels)
        self.shard = shard_numel(self.n, dp)
        self.padded = self.shard * dp
        self.flat_param: torch.Tensor | None = None   # (n,) bf16, stages 0-2
        self.flat_grad: torch.Tensor | None = None    # (n,) bf16, stages 0-1
        self.param_shard: torch.Tensor | None = None  # (S,) bf16, stage 3 (its .grad: (S,))
        self.grad_shard: torch.Tensor | None = None   # (S,) bf16, stage 2
        self.ready = 0                                # stage 2: params whose grad is ready
        self.master: torch.Tensor | None = None       # (S,) fp32 (stage 0: (n,))

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Weight (out, in) and bias (out,) as views of a flat buffer of >= n elements."""
        out, start = [], 0
        for shape, numel in zip(self.shapes, self.numels):
            out.append(flat[start:start + numel].view(shape))
            start += numel
        return out

"""The model and data every ZeRO stage trains: a small bf16 MLP, random batches, the loss.

:func:`make_mlp` builds the same weights for a seed on every rank and in the one-process
reference; :func:`make_batches` draws every rank's micro-batch of every step at once;
:func:`mse_loss` is the fp32 loss of the bf16 outputs. Lecture 3 (ZeRO and FSDP).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_utils.models.toy import toy_mlp
from course_utils.runtime import validate
from course_utils.zero.sizes import check_sizes

__all__ = ["make_mlp", "make_batches", "mse_loss"]


def make_mlp(sizes: Sequence[int], seed: int = 0) -> nn.Sequential:
    """bf16 MLP ``Linear(sizes[0], sizes[1]), Tanh, ..., Linear(sizes[-2], sizes[-1])``; same weights per seed."""
    return toy_mlp(check_sizes(sizes), seed=seed, activation="tanh", dtype=torch.bfloat16)


def make_batches(sizes: Sequence[int], seed: int, n_steps: int, dp: int,
                 micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random regression data: x (n_steps, dp, micro_batch, sizes[0]) bf16, y (..., sizes[-1]) fp32."""
    sizes = check_sizes(sizes)
    for name, value in (("n_steps", n_steps), ("dp", dp), ("micro_batch", micro_batch)):
        validate.check_int(name, value, 1)
    g = torch.Generator().manual_seed(10_000 + seed)
    x = torch.randn(n_steps, dp, micro_batch, sizes[0], generator=g).bfloat16()
    y = torch.randn(n_steps, dp, micro_batch, sizes[-1], generator=g)
    return x, y


def mse_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The training loss: mean squared error of the bf16 outputs against ``y``, in fp32."""
    return F.mse_loss(out.float(), y)  # scalar fp32

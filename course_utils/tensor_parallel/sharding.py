"""Sharding a weight for tensor parallelism: each rank's equal slice of W's rows or columns.

``W`` is (h_in, h_out) (the lesson's ``Y = X @ W``). :func:`shard_range` gives tp rank r's
``[start, stop)`` of ``n`` items; :func:`column_shard` keeps rank r's columns (its output
features), :func:`row_shard` its rows (its input features); :func:`check_matrix` is the check
every layer makes of a weight. Pure tensor slicing, no process group. Serves lecture 4.
"""

from __future__ import annotations

from typing import Any

import torch

from course_utils.runtime.validate import check_int

__all__ = ["shard_range", "column_shard", "row_shard", "check_matrix"]


def _check_tp(tp_rank: Any, tp_size: Any) -> None:
    check_int("tp_size", tp_size)
    if isinstance(tp_rank, bool) or not isinstance(tp_rank, int) or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank must be an int from 0 to tp_size-1 = {tp_size - 1}; "
                         f"got {tp_rank!r}")


def check_matrix(name: str, w: Any) -> None:
    """ValueError naming ``name`` unless ``w`` is a 2-D tensor (h_in, h_out)."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        got = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
        raise ValueError(f"{name} must be a 2-D tensor (h_in, h_out); got {got}")


def shard_range(n: int, tp_size: int, tp_rank: int) -> tuple[int, int]:
    """[start, stop) of tp_rank's equal slice of n items; n must divide evenly by tp_size."""
    check_int("n", n)
    _check_tp(tp_rank, tp_size)
    if n % tp_size:
        raise ValueError(f"n = {n} must be divisible by tp_size = {tp_size} (equal shards)")
    size = n // tp_size
    return tp_rank * size, (tp_rank + 1) * size


def column_shard(w: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """W (h_in, h_out) -> tp_rank's columns W[:, cols] (h_in, h_out/tp_size), a copy."""
    check_matrix("w", w)
    start, stop = shard_range(w.shape[1], tp_size, tp_rank)
    return w[:, start:stop].clone()


def row_shard(w: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """W (h_in, h_out) -> tp_rank's rows W[rows, :] (h_in/tp_size, h_out), a copy."""
    check_matrix("w", w)
    start, stop = shard_range(w.shape[0], tp_size, tp_rank)
    return w[start:stop, :].clone()

"""Tensor parallelism's communication timed: one rank's MLP matmuls against its all-reduce.

:func:`time_comm_vs_matmul` is a worker (run it with ``course_utils.launch.run``): for each
(tokens, h, ffn) it times, with :func:`course_utils.runtime.clock.clock`, the median of this
rank's share of the forward MLP's matmuls and of the all-reduce of their (tokens, h) fp32
result, the two costs :func:`course_utils.tensor_parallel.comm_cost.mlp_comm_to_compute`
models. Lecture 4 draws them (``tensor_parallel.pictures.draw_comm_vs_matmul``).
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_utils.runtime import backend
from course_utils.runtime.clock import clock
from course_utils.runtime.validate import check_int

__all__ = ["time_comm_vs_matmul"]


def _median_time(fn: Callable[[], Any], repeats: int, group: dist.ProcessGroup | None) -> float:
    times, dev = [], backend.device()
    for _ in range(repeats):
        dist.barrier(group=group)
        start = clock(dev)  # on CUDA: wait for queued kernels, then read the clock
        fn()
        times.append(clock(dev) - start)
    return statistics.median(times)


def time_comm_vs_matmul(rank: int, world_size: int, sizes: Sequence[tuple[int, int, int]],
                        repeats: int = 5) -> list[dict]:
    """Worker: per (tokens, h, ffn), median seconds of this rank's MLP matmuls vs its all-reduce.

    ``tokens`` = b * s. The matmuls are this rank's share of the forward MLP,
    (tokens, h) @ (h, ffn/t) then (tokens, ffn/t) @ (ffn/t, h); the all-reduce is of the
    (tokens, h) fp32 result, as in the forward pass of
    :class:`~course_utils.tensor_parallel.layers.TensorParallelMLP`.
    ``threads`` is the number of intra-op threads this rank's matmuls ran with.
    """
    check_int("repeats", repeats)
    if not sizes:
        raise ValueError("sizes must be a non-empty list of (tokens, h, ffn)")
    for size in sizes:
        if len(size) != 3 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                                 for v in size) or size[2] % world_size:
            raise ValueError(f"sizes must hold (tokens, h, ffn) positive ints with ffn divisible "
                             f"by the world size {world_size}; got {size!r}")
    out = []
    for tokens, h, ffn in sizes:
        local_ffn = ffn // world_size
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(tokens, h, generator=gen)            # (tokens, h)
        w_up = torch.randn(h, local_ffn, generator=gen)      # (h, ffn/t)
        w_down = torch.randn(local_ffn, h, generator=gen)    # (ffn/t, h)
        x, w_up, w_down = backend.to_device((x, w_up, w_down))
        partial = torch.empty(tokens, h, device=x.device)    # (tokens, h)

        def matmuls() -> None:
            torch.matmul(F.gelu(x @ w_up), w_down, out=partial)

        def all_reduce() -> None:
            dist.all_reduce(partial)

        matmuls(), all_reduce()  # warm up both
        out.append({"tokens": tokens, "h": h, "ffn": ffn, "tp": world_size,
                    "matmul_s": _median_time(matmuls, repeats, None),
                    "all_reduce_s": _median_time(all_reduce, repeats, None),
                    "matmul_flops": 2 * 2 * tokens * h * local_ffn,
                    "all_reduce_bytes": tokens * h * 4, "threads": torch.get_num_threads()})
    return out

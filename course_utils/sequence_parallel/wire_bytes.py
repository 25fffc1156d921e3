"""Sequence parallelism's bytes on the wire: what a ring sends, and what gloo's sockets carried.

TP's all-reduce becomes a reduce-scatter plus an all-gather, which is how a ring all-reduce
works anyway: the same bytes on the wire. :func:`ring_bytes_sent` gives the bytes one rank
sends for a recorded :class:`~course_utils.tensor_parallel.recording.CommEvent`
(:func:`course_utils.collectives.cost.ring_bytes`) and :func:`comm_summary` sums a run's per
phase. gloo's own reduce-scatter (``reduce_scatter_single``) works, but sends what an all-reduce
of the whole tensor sends (2(t-1)/t of it, twice a ring reduce-scatter's (t-1)/t), which is why
the course builds it from ``all_to_all_single``; :func:`reduce_scatter_bytes` measures both on
real gloo ranks. Serves lecture 9 (for the package of lecture 6).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
import torch.distributed as dist

from course_utils.collectives.cost import ring_bytes
from course_utils.runtime import backend
from course_utils.runtime import clock as timing
from course_utils.runtime.validate import check_int, one_of
from course_utils.tensor_parallel.conjugates import reduce_scatter_seq
from course_utils.tensor_parallel.recording import CommEvent

__all__ = ["ring_bytes_sent", "comm_summary", "reduce_scatter_bytes_worker",
           "reduce_scatter_bytes"]


def ring_bytes_sent(event: CommEvent, tp_size: int) -> float:
    """Bytes one rank sends for ``event`` in a ring: all-reduce 2 (t-1)/t N (N: the tensor);
    all-gather (t-1)/t N (N: the gathered result); reduce-scatter (t-1)/t N (N: the input,
    t times the result)."""
    if not isinstance(event, CommEvent):
        raise ValueError(f"event must be a tensor_parallel.CommEvent; got {type(event).__name__}")
    check_int("tp_size", tp_size)
    # the ring's buffer, in the event's bytes: a reduce-scatter's input is t times its result
    buffer = one_of("event.op", event.op, {"all_reduce": 1, "all_gather": 1,
                                           "reduce_scatter": tp_size})
    return ring_bytes(event.op, buffer * event.nbytes, tp_size)


def comm_summary(events: Sequence[CommEvent], tp_size: int) -> dict[str, dict[str, Any]]:
    """Per phase: {"ops": {op: count}, "ring_bytes": bytes one rank sends in a ring}."""
    check_int("tp_size", tp_size)
    if isinstance(events, (str, bytes)) or not hasattr(events, "__iter__"):
        raise ValueError(f"events must be a list of CommEvent; got {type(events).__name__}")
    events = list(events)
    wrong = sorted({type(e).__name__ for e in events if not isinstance(e, CommEvent)})
    if wrong:
        raise ValueError(f"events must hold only CommEvent (from a run's log); "
                         f"got {', '.join(wrong)}")
    out: dict[str, dict[str, Any]] = {}
    for e in events:
        entry = out.setdefault(e.phase, {"ops": {}, "ring_bytes": 0.0})
        entry["ops"][e.op] = entry["ops"].get(e.op, 0) + 1
        entry["ring_bytes"] += ring_bytes_sent(e, tp_size)
    return out


def _check_numel(numel: Any, world_size: int) -> int:
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 1 or numel % world_size:
        raise ValueError(f"numel must be a positive int divisible by world_size={world_size}; "
                         f"got {numel!r}")
    return numel


def reduce_scatter_bytes_worker(rank: int, world_size: int,
                                numel: int = 2**20) -> dict[str, float]:
    """Worker: bytes this rank sends (``timing.bytes_written``) reducing a (1, numel) fp32
    tensor to its 1/t slice: with gloo's own reduce-scatter (``dist.reduce_scatter_single``,
    torch 2.13's name for ``reduce_scatter_tensor``) and with the course's ``all_to_all_single``
    form; each after a warm-up, as a fraction of the tensor's bytes."""

    _check_numel(numel, world_size)
    x = torch.ones(1, numel, device=backend.device())                      # (1, n)
    out = {}
    for name, fn in (("gloo reduce-scatter", lambda: dist.reduce_scatter_single(
                         torch.empty(numel // world_size, device=x.device), x.flatten())),
                     ("course (all_to_all_single)", lambda: reduce_scatter_seq(x, None, "x"))):
        fn()  # warm-up: connections and buffers
        dist.barrier()
        before = timing.bytes_written()
        fn()
        after = timing.bytes_written()
        out[name] = (math.nan if before is None or after is None
                     else (after - before) / (4 * numel))
    return out


def reduce_scatter_bytes(world_size: int = 2, numel: int = 2**20,
                         timeout_s: float = 60.0) -> dict[str, float]:
    """:func:`reduce_scatter_bytes_worker` on ``world_size`` gloo ranks: the most any rank sent,
    per form, as a fraction of the tensor's bytes (NaN where the host cannot see the bytes)."""
    from course_utils import launch

    check_int("world_size", world_size, 2)
    _check_numel(numel, world_size)
    runs = launch.run(reduce_scatter_bytes_worker, world_size, numel, timeout_s=timeout_s,
                      show_output=False, backend="gloo")
    return {name: max(r[name] for r in runs) for name in runs[0]}

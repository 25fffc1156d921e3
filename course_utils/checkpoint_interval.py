"""How often to checkpoint: the work a failure throws away against the time saving costs.

A job that saves every ``tau`` seconds of work, pays ``delta`` seconds of stalled training per
save, fails on average every ``mtbf`` seconds and needs ``restart`` seconds to come back loses,
to first order, for each second of useful training

    waste(tau) = delta / tau + (tau / 2 + restart) / mtbf

seconds: the saves, plus half an interval of redone work and a restart per failure. It is
smallest at Young's interval ``tau* = sqrt(2 delta mtbf)`` (J. W. Young, "A first order
approximation to the optimum checkpoint interval", CACM 17(9), 1974), where the waste is about
``sqrt(2 delta / mtbf) + restart / mtbf``. Daly (2006) refines it to ``sqrt(2 delta mtbf) -
delta`` for ``delta < mtbf / 2``. The assumptions: failures arrive at random at a constant rate
(a Poisson process: exponential times between failures, so the time since the last checkpoint is
uniform when one strikes); ``delta`` and ``restart`` are fixed; no failure strikes during a save
or a restart; and ``delta`` is much smaller than ``mtbf``. :func:`simulate` checks the formula
against failures drawn at random.

``delta`` is the time training is *stalled*: a synchronous ``dcp.save`` for the whole write, an
``async_save`` only while it copies the state (staging); the write then overlaps training.
:func:`save_cost_worker` measures both on real ranks.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import numpy as np

from course_utils.validate import check_int, check_real

__all__ = ["waste", "young_interval", "daly_interval", "simulate", "save_cost_worker"]


def waste(tau: float, delta: float, mtbf: float, restart: float = 0.0) -> float:
    """First-order time lost per unit of useful training: ``delta / tau + (tau / 2 + restart) /
    mtbf`` (all in the same unit of time)."""
    for name, value in (("tau", tau), ("delta", delta), ("mtbf", mtbf)):
        check_real(name, value)
    check_real("restart", restart, 0, strict=False)
    return delta / tau + (tau / 2 + restart) / mtbf


def young_interval(delta: float, mtbf: float) -> float:
    """Young's optimum interval ``sqrt(2 delta mtbf)``: where :func:`waste` is smallest."""
    return math.sqrt(2 * check_real("delta", delta) * check_real("mtbf", mtbf))


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly's first correction, ``sqrt(2 delta mtbf) - delta`` (for ``delta < mtbf / 2``)."""
    if not check_real("delta", delta) < check_real("mtbf", mtbf) / 2:
        raise ValueError(f"Daly's estimate needs delta < mtbf / 2; got delta={delta}, "
                         f"mtbf={mtbf}")
    return young_interval(delta, mtbf) - delta


def simulate(tau: float, delta: float, mtbf: float, restart: float = 0.0,
             work: float = 2e6, seed: int = 0) -> float:
    """The time lost per unit of useful training (wall time / ``work`` - 1) when ``work`` seconds
    of training run with a save every ``tau`` seconds of work, failures drawn from an
    exponential distribution of mean ``mtbf`` (they may strike during a save or a restart too);
    each failure rolls back to the last completed save and costs ``restart``."""
    for name, value in (("tau", tau), ("delta", delta), ("mtbf", mtbf), ("work", work)):
        check_real(name, value)
    check_real("restart", restart, 0, strict=False)
    check_int("seed", seed, 0)
    rng = np.random.default_rng(seed)
    done = wall = 0.0
    next_failure = rng.exponential(mtbf)
    while done < work:
        segment = min(tau, work - done) + (delta if done + tau < work else 0.0)
        if wall + segment <= next_failure:          # the interval and its save complete
            wall += segment
            done += min(tau, work - done)
            continue
        wall = next_failure + restart               # lost: back to the last save
        next_failure = wall + rng.exponential(mtbf)
    return wall / work - 1.0


def save_cost_worker(rank: int, world_size: int, path: str, numel: int = 1_000_000,
                     repeats: int = 3) -> dict[str, Any]:
    """Collective: time saving a sharded state of ``numel`` float32 weights + Adam's two moments
    (each rank holds 1/D) with ``dcp.save`` and with ``dcp.async_save`` (on a gloo group of its
    own). Medians in seconds: ``sync`` (training stalled for the whole save), ``async_blocked``
    (stalled until async_save returns: the copy), ``async_total`` (until the write is done) and
    ``load`` (``dcp.load`` of a synchronous save into the same sharded tensors)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from course_utils import backend
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh(backend.device().type, (world_size,))
    gen = torch.Generator().manual_seed(rank)
    state = {name: distribute_tensor(torch.randn(numel, generator=gen), mesh, [Shard(0)])
             for name in ("weights", "exp_avg", "exp_avg_sq")}
    ckpt_group = backend.new_group()      # (on NCCL, async_save needs a gloo group: see DCP)
    sync, blocked, total = [], [], []
    for i in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        dcp.save(state, checkpoint_id=f"{path}/sync_{i}")
        sync.append(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter()
        future = dcp.async_save(state, checkpoint_id=f"{path}/async_{i}",
                                process_group=ckpt_group)
        blocked.append(time.perf_counter() - t0)
        future.result()
        total.append(time.perf_counter() - t0)
    loads = []
    for i in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        dcp.load(state, checkpoint_id=f"{path}/sync_{i}")
        loads.append(time.perf_counter() - t0)
    dist.destroy_process_group(ckpt_group)
    return {"bytes": sum(t.to_local().numel() * 4 for t in state.values()),
            "sync": statistics.median(sync), "async_blocked": statistics.median(blocked),
            "async_total": statistics.median(total), "load": statistics.median(loads)}

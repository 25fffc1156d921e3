"""How often to checkpoint: the work a failure throws away against the time saving costs.

A job that saves every ``tau`` seconds of work, pays ``delta`` seconds of stalled training per
save, fails on average every ``mtbf`` seconds and needs ``restart`` seconds to come back loses,
to first order, for each second of useful training

    waste(tau) = delta / tau + (tau / 2 + restart) / mtbf

seconds: the saves, plus half an interval of redone work and a restart per failure. It is
smallest at Young's interval ``tau* = sqrt(2 delta mtbf)`` (J. W. Young, "A first order
approximation to the optimum checkpoint interval", CACM 17(9), 1974), where the waste is about
``sqrt(2 delta / mtbf) + restart / mtbf``. First order means: failures arrive at random at a
constant rate (a Poisson process, so the time since the last save is uniform when one strikes),
no failure strikes during a save or a restart, and ``delta``, ``restart`` << ``mtbf``.

J. T. Daly ("A higher order estimate of the optimum checkpoint interval for restart dumps",
Future Generation Computer Systems 22(3), 2006) lets failures strike at any time, saves and
restarts included. A segment of ``tau + delta`` seconds then takes ``mtbf e^(restart/mtbf)
(e^((tau+delta)/mtbf) - 1)`` seconds on average (:func:`expected_waste`), and his estimate of
the best interval is :func:`daly_interval`. :func:`simulate` replays a job under that model
with failures drawn at random, and the tests check it against :func:`expected_waste`.

``delta`` is the time training is *stalled*: a synchronous ``dcp.save`` for the whole write, an
``async_save`` only while it copies the state (staging); the write then overlaps training (and
the checkpoint is durable only when the write ends: the models here count it when the stall
ends). :func:`save_cost_worker` measures both on real ranks.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Any

import numpy as np

from course_utils.runtime.validate import check_int, check_real

__all__ = ["waste", "expected_waste", "young_interval", "daly_interval", "simulate",
           "save_cost_worker", "async_save_worker"]


def waste(tau: float, delta: float, mtbf: float, restart: float = 0.0,
          write: float = 0.0) -> float:
    """First-order time lost per unit of useful training: ``delta / tau + (tau / 2 + write +
    restart) / mtbf`` (all in the same unit of time). ``write``: how long a save stays not yet
    durable after the stall ends (an ``async_save``'s background write): a failure then rolls
    back to the save before, so the redone work is ``tau / 2 + write`` on average."""
    for name, value in (("tau", tau), ("delta", delta), ("mtbf", mtbf)):
        check_real(name, value)
    check_real("restart", restart, 0, strict=False)
    check_real("write", write, 0, strict=False)
    return delta / tau + (tau / 2 + write + restart) / mtbf


def young_interval(delta: float, mtbf: float) -> float:
    """Young's optimum interval ``sqrt(2 delta mtbf)``: where :func:`waste` is smallest."""
    return math.sqrt(2 * check_real("delta", delta) * check_real("mtbf", mtbf))


def expected_waste(tau: float, delta: float, mtbf: float, restart: float = 0.0) -> float:
    """Daly's model of the time lost per unit of useful training, failures striking saves and
    restarts too: ``mtbf e^(restart/mtbf) (e^((tau+delta)/mtbf) - 1) / tau - 1`` (Daly 2006;
    all in the same unit of time). :func:`waste` is its first-order expansion."""
    for name, value in (("tau", tau), ("mtbf", mtbf)):
        check_real(name, value)
    check_real("delta", delta, 0, strict=False)
    check_real("restart", restart, 0, strict=False)
    return (mtbf * math.exp(restart / mtbf) * math.expm1((tau + delta) / mtbf) / tau) - 1.0


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly's higher-order estimate of the best interval (Daly 2006):
    ``sqrt(2 delta M) [1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9] - delta`` for
    ``delta < 2M``, and ``M`` past it. His example: delta = 5 min, M = 24 h gives 116.7 min."""
    check_real("delta", delta)
    check_real("mtbf", mtbf)
    if delta >= 2 * mtbf:
        return float(mtbf)
    x = delta / (2 * mtbf)
    return young_interval(delta, mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - delta


def simulate(tau: float, delta: float, mtbf: float, restart: float = 0.0,
             work: float = 2e6, seed: int = 0) -> float:
    """The time lost per unit of useful training (wall time / work done - 1) of a job that runs
    ``ceil(work / tau)`` intervals of ``tau`` seconds of work, each ended by a save of ``delta``
    seconds, with failures a Poisson process of mean gap ``mtbf`` in wall time: they strike
    during work, saves and restarts alike (Daly's model). A failure rolls back to the last
    completed save and costs ``restart`` seconds, which a failure can interrupt too.

    Replayed gap by gap: after a failure the restart takes ``restart`` and then whole intervals
    of ``tau + delta`` complete until the next failure. The failure times depend only on
    ``seed``, so curves over ``tau`` share them (common random numbers)."""
    for name, value in (("tau", tau), ("mtbf", mtbf), ("work", work)):
        check_real(name, value)
    check_real("delta", delta, 0, strict=False)
    check_real("restart", restart, 0, strict=False)
    check_int("seed", seed, 0)
    rng = np.random.default_rng(seed)
    segment = tau + delta
    needed = math.ceil(work / tau)
    done, wall, first = 0, 0.0, True
    while True:
        gaps = rng.exponential(mtbf, size=4096)
        lead = np.full(gaps.size, float(restart))
        if first:                                   # the job starts with no restart to make
            lead[0], first = 0.0, False
        fits = np.floor(np.maximum(gaps - lead, 0.0) / segment).astype(np.int64)
        total = done + np.cumsum(fits)
        j = int(np.searchsorted(total, needed))     # the gap in which the last interval ends
        if j < gaps.size:
            before = int(total[j - 1]) if j else done
            wall += float(gaps[:j].sum()) + lead[j] + (needed - before) * segment
            return float(wall / (needed * tau) - 1.0)
        done, wall = int(total[-1]), wall + float(gaps.sum())


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

    from course_utils.runtime import backend
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


def async_save_worker(rank: int, world_size: int, path: str, numel: int = 2_000_000,
                      write_s: float = 0.3) -> dict[str, Any]:
    """Collective: what ``dcp.async_save``'s return means, measured on a sharded state of
    ``numel`` float32 weights + Adam's two moments, written to storage that takes ``write_s``
    seconds more per rank (a ``FileSystemWriter`` that waits before writing: slow storage).

    Returns ``state_bytes`` (this rank's), ``staged_bytes`` (the tensors of the copy that
    DCP's ``DefaultStager`` hands the writer, none sharing memory with the state),
    ``resident_growth`` (how much this process's resident memory grew meanwhile),
    ``stalled_s`` (until it returns), ``durable_at_return``
    (whether ``checkpoint.verify`` accepts the folder then: a failure now would lose it),
    ``next_save_waits_s`` (a next save waits for this one first, as torchtitan's
    ``CheckpointManager._async_wait`` does: the rest of the write), ``durable_after`` and
    ``holds_values_at_save`` (the weights changed in place after the return; the checkpoint
    has the values at the save)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from course_utils.runtime import backend
    from course_utils.checkpoint import dcp as checkpoint

    check_int("numel", numel)
    check_real("write_s", write_s, 0, strict=False)

    class SlowStorage(FileSystemWriter):
        def write_data(self, plan, planner):
            time.sleep(write_s)
            return super().write_data(plan, planner)

    class CountingStager(DefaultStager):       # async_save's own default, counted
        copied = 0

        def stage(self, state_dict):
            out = super().stage(state_dict)
            mine = {v.to_local().untyped_storage().data_ptr() for v in state.values()}
            for v in out.values():
                local = v.to_local() if hasattr(v, "to_local") else v
                if local.untyped_storage().data_ptr() not in mine:
                    self.copied += local.numel() * local.element_size()
            return out

    def durable() -> bool:
        try:
            checkpoint.verify(path)
        except checkpoint.CheckpointError:
            return False
        return True

    def resident() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    mesh = init_device_mesh(backend.device().type, (world_size,))
    gen = torch.Generator().manual_seed(rank)
    state = {name: distribute_tensor(torch.randn(numel, generator=gen), mesh, [Shard(0)])
             for name in ("weights", "exp_avg", "exp_avg_sq")}
    group = backend.new_group()
    before = resident()
    t0 = time.perf_counter()
    stager = CountingStager(StagingOptions(False, False, False, False))
    future = dcp.async_save(state, storage_writer=SlowStorage(path), process_group=group,
                            async_stager=stager)
    stalled = time.perf_counter() - t0
    growth = resident() - before
    at_return = durable()
    for t in state.values():            # training goes on, changing the weights in place
        t.to_local().add_(1.0)
    t1 = time.perf_counter()
    future.result()                     # the next save waits for this one first
    waited = time.perf_counter() - t1
    torch.distributed.barrier()
    back = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(back, checkpoint_id=path)
    same = all(torch.equal(back[k].to_local() + 1.0, state[k].to_local()) for k in state)
    stager.close()
    torch.distributed.destroy_process_group(group)
    return {"state_bytes": sum(t.to_local().numel() * 4 for t in state.values()),
            "staged_bytes": stager.copied, "resident_growth": growth, "stalled_s": stalled,
            "durable_at_return": at_return,
            "next_save_waits_s": waited, "durable_after": durable(),
            "holds_values_at_save": same}

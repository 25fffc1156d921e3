"""A small sharded training run whose every piece of state is visible: what a checkpoint must hold.

One rank of a :class:`Job` holds a :class:`Trainer`: an MLP classifier sharded by FSDP2
(``fully_shard`` over a 1-D mesh of all ranks: ZeRO-3, weights and Adam's moments split by rows),
``torch.optim.AdamW``, a ``LambdaLR`` schedule (warm-up, then linear decay), a
``DistributedSampler`` that shuffles every epoch, and three random number generators that the
step reads: torch's (dropout), NumPy's (noise added to the inputs) and Python's (which input
feature is masked). :func:`train` runs steps until ``trainer.step`` reaches a count; each step's
loss is the global batch's mean (all-reduced), the same number on every rank.

So the state that decides the rest of the run is: the weights and the optimizer's moments and
step counts (sharded), the schedule's position, the sampler's epoch and the position in the
epoch, each rank's three generators, and the step. :func:`snapshot` gathers all of it (whole
tensors, RNG digests), and :func:`reference_run` computes the same run in one process, rank by
rank, so that a distributed run can be checked against it (assignment a12's judge does).

The run is bit-for-bit deterministic on CPU: the same mesh, seed and step count give the same
bits. Workers run on ``launch.run`` ranks; nothing here writes files
(``course_utils.checkpoint.dcp`` saves and loads).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_utils.models.toy import toy_mlp
from course_utils.runtime import backend
from course_utils.runtime.validate import check_int, check_real, one_of

__all__ = ["SAMPLERS", "Job", "GlobalSampler", "Trainer", "Schedule", "fresh", "train",
           "snapshot", "reference_run", "digest", "dataset", "build_model"]

SAMPLERS = ("distributed", "global")
"""``Job.sampler``: torch's ``DistributedSampler`` (rows dealt out by rank) or
:class:`GlobalSampler` (each rank its slice of the global batch: resumable on other DP sizes)."""


@dataclass(frozen=True)
class Job:
    """A run's settings: ranks, data (``samples`` rows, ``rows`` per rank per step), model sizes,
    ``steps`` optimizer steps, AdamW's ``lr`` with ``warmup`` steps, dropout, input noise and
    the ``sampler`` (one of :data:`SAMPLERS`; ``"global"`` needs ``dropout=0.0``)."""

    world_size: int = 2
    seed: int = 0
    steps: int = 12
    samples: int = 32
    rows: int = 4
    features: int = 8
    hidden: int = 32
    classes: int = 4
    lr: float = 0.05
    warmup: int = 3
    dropout: float = 0.25
    noise: float = 0.3
    sampler: str = "distributed"

    def __post_init__(self) -> None:
        for name in ("world_size", "steps", "samples", "rows", "features", "hidden", "classes",
                     "warmup"):
            check_int(name, getattr(self, name))
        check_int("seed", self.seed, 0)
        check_real("lr", self.lr)
        if not (isinstance(self.dropout, float) and 0 <= self.dropout < 1):
            raise ValueError(f"dropout must be a float in [0, 1); got {self.dropout!r}")
        check_real("noise", self.noise, 0, strict=False)
        if self.samples // self.world_size < self.rows:
            raise ValueError(f"samples={self.samples} gives each of world_size={self.world_size} "
                             f"ranks fewer than rows={self.rows} rows per epoch")
        one_of("sampler", self.sampler, SAMPLERS)
        if self.sampler == "global" and self.dropout:
            raise ValueError(f"dropout must be 0.0 with sampler='global'; got {self.dropout!r} "
                             "(dropout draws from each rank's torch generator, which depends "
                             "on the number of ranks and cannot be resharded)")

    def resized(self, world_size: int) -> "Job":
        """The same run on ``world_size`` ranks: the same global batch (``rows x
        world_size``), each rank taking its share."""
        check_int("world_size", world_size)
        if self.rows * self.world_size % world_size:
            raise ValueError(f"world_size must divide the global batch of "
                             f"{self.rows * self.world_size} rows; got {world_size}")
        return dataclasses.replace(self, world_size=world_size,
                                   rows=self.rows * self.world_size // world_size)

    @property
    def steps_per_epoch(self) -> int:
        """Steps in one pass over the data (the sampler drops the rows that do not divide)."""
        return (self.samples // self.world_size) // self.rows


class Schedule:
    """LambdaLR's factor at step s: (s + 1) / warmup while warming up, then a linear decay to 0.1
    of the peak at ``steps``. A callable object (not a function), so ``LambdaLR.state_dict``
    saves its settings with the step count."""

    def __init__(self, warmup: int, steps: int) -> None:
        self.warmup, self.steps = warmup, steps

    def __call__(self, s: int) -> float:
        if s < self.warmup:
            return (s + 1) / self.warmup
        return max(0.1, 1.0 - 0.9 * (s - self.warmup) / max(1, self.steps - self.warmup))


class GlobalSampler:
    """A sampler whose position is the job's, not the rank's: one permutation of all samples
    per epoch (seeded by the job's seed and the epoch), cut into global batches of
    ``global_batch`` rows; rank ``r`` of ``world_size`` takes rows ``[r b, (r + 1) b)`` of
    each (``b = global_batch / world_size``). The same epoch and step give the same global
    batch on any number of ranks, so a run resumed on another DP size sees the same samples
    in the same order. (torch's ``DistributedSampler`` deals the permutation out rank by
    rank, ``indices[rank::num_replicas]``: which rows a rank sees depends on the world size.)"""

    def __init__(self, samples: int, global_batch: int, rank: int, world_size: int,
                 seed: int) -> None:
        if global_batch % world_size:
            raise ValueError(f"world_size={world_size} must divide global_batch={global_batch}")
        self.samples, self.global_batch, self.seed = samples, global_batch, seed
        self.rank, self.world_size, self.epoch = rank, world_size, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(self.samples, generator=torch.Generator().manual_seed(
            self.seed * 1_000_003 + self.epoch)).tolist()
        b = self.global_batch // self.world_size
        for start in range(0, self.samples // self.global_batch * self.global_batch,
                           self.global_batch):
            yield from order[start + self.rank * b:start + (self.rank + 1) * b]


def _sampler(job: Job, rank: int, world_size: int) -> Any:
    """The job's sampler for ``rank``: torch's ``DistributedSampler`` or :class:`GlobalSampler`."""
    if job.sampler == "global":
        return GlobalSampler(job.samples, job.rows * world_size, rank, world_size, job.seed)
    from torch.utils.data import DistributedSampler

    return DistributedSampler(range(job.samples), num_replicas=world_size, rank=rank,
                              shuffle=True, seed=job.seed, drop_last=True)


def dataset(job: Job) -> tuple[torch.Tensor, torch.Tensor]:
    """The job's data: ``samples`` inputs (samples, features) and the class a fixed random
    teacher gives each (samples,)."""
    gen = torch.Generator().manual_seed(10_000 + job.seed)
    x = torch.randn(job.samples, job.features, generator=gen)
    teacher = torch.randn(job.features, job.classes, generator=gen)
    return x, (x @ teacher).argmax(dim=1)


def build_model(job: Job) -> nn.Sequential:
    """The whole model, the same weights on every rank (seeded by ``job.seed``): Linear, ReLU,
    Dropout, Linear (:func:`course_utils.models.toy.toy_mlp`)."""
    return toy_mlp((job.features, job.hidden, job.classes), seed=job.seed, activation="relu",
                   dropout=job.dropout)


def _seed_generators(job: Job, rank: int) -> None:
    """What a new job does first: each rank's torch, NumPy and Python generators from the seed."""
    base = 1_000 * (job.seed + 1) + rank
    torch.manual_seed(base)
    np.random.seed(base)
    random.seed(base)


@dataclass
class Trainer:
    """One rank's training state. ``step``: optimizer steps done; ``position``: steps done in
    the sampler's current epoch (``sampler.epoch``)."""

    job: Job
    rank: int
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    sampler: Any
    step: int = 0
    position: int = 0


def fresh(job: Job, rank: int, world_size: int) -> Trainer:
    """Collective: a new job's trainer on this rank, as at step 0: generators seeded, the model
    built, sharded by ``fully_shard``, then the optimizer made over the sharded parameters."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if world_size != job.world_size:
        raise ValueError(f"the job has {job.world_size} ranks; got world_size={world_size}")
    _seed_generators(job, rank)
    model = build_model(job)
    fully_shard(model, mesh=init_device_mesh(backend.device().type, (world_size,)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=job.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, Schedule(job.warmup, job.steps))
    return Trainer(job, rank, model, optimizer, scheduler, _sampler(job, rank, world_size))


def _batch(job: Job, data: tuple, order: list[int], position: int,
           epoch: int = 0) -> tuple[torch.Tensor, ...]:
    """The rows of one step and their augmentation: NumPy's noise and Python's masked feature
    from the rank's generators; under ``sampler="global"`` from a generator of each sample's
    own (seeded by the job's seed, the epoch and the sample), so that no rank's draws decide
    another sample's."""
    idx = order[position * job.rows:(position + 1) * job.rows]
    x, y = data[0][idx].clone(), data[1][idx]                              # (rows, F), (rows,)
    if job.sampler == "global":
        for row, i in enumerate(idx):
            gen = np.random.default_rng((job.seed, epoch, i))
            x[row] += job.noise * torch.from_numpy(gen.standard_normal(job.features)).float()
            x[row, int(gen.integers(job.features))] = 0.0
    else:
        x += job.noise * torch.from_numpy(np.random.standard_normal(x.shape)).float()
        x[:, random.randrange(job.features)] = 0.0
    return backend.to_device(x), backend.to_device(y)


def train(trainer: Trainer, until: int) -> list[float]:
    """Collective: train until ``trainer.step == until``; the global batch's loss of each step."""
    job, data = trainer.job, dataset(trainer.job)
    losses = []
    while trainer.step < until:
        x, y = _batch(job, data, list(trainer.sampler), trainer.position, trainer.sampler.epoch)
        loss = F.cross_entropy(trainer.model(x), y)        # dropout draws from torch's generator
        loss.backward()
        trainer.optimizer.step()
        trainer.scheduler.step()
        trainer.optimizer.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / dist.get_world_size())
        trainer.step += 1
        trainer.position += 1
        if trainer.position == job.steps_per_epoch:          # the epoch is over: the next order
            trainer.position = 0
            trainer.sampler.set_epoch(trainer.sampler.epoch + 1)
    return losses


def digest(obj: Any) -> str:
    """A short fingerprint of a generator's state (a tensor, NumPy's tuple or Python's tuple)."""
    if isinstance(obj, torch.Tensor):
        data = obj.numpy().tobytes()
    elif isinstance(obj, tuple) and obj and obj[0] == "MT19937":        # NumPy's legacy state
        data = repr((obj[0], obj[1].tobytes(), *obj[2:])).encode()
    else:
        data = repr(obj).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def _rng_digests() -> dict[str, str]:
    return {"torch": digest(torch.get_rng_state()), "numpy": digest(np.random.get_state()),
            "python": digest(random.getstate())}


def snapshot(trainer: Trainer) -> dict[str, Any]:
    """Collective: everything that decides the rest of the run, as plain data: whole weights and
    Adam's moments (gathered), the optimizer's step count, lr, the schedule's step, the sampler's
    epoch, the position, the step and this rank's generators (digests)."""
    weights, moments = {}, {}
    for name, p in trainer.model.named_parameters():
        weights[name] = backend.to_cpu(p.full_tensor().detach()).numpy().copy()
        state = trainer.optimizer.state.get(p, {})
        for key in ("exp_avg", "exp_avg_sq"):
            value = state.get(key)
            moments[f"{name}.{key}"] = (None if value is None
                                        else backend.to_cpu(value.full_tensor()).numpy().copy())
    first = trainer.optimizer.state.get(next(trainer.model.parameters()), {})
    return {"rank": trainer.rank, "weights": weights, "moments": moments,
            "adam_steps": float(first["step"]) if "step" in first else 0.0,
            "lr": float(trainer.optimizer.param_groups[0]["lr"]),
            "schedule_step": int(trainer.scheduler.last_epoch),
            "epoch": int(trainer.sampler.epoch), "position": int(trainer.position),
            "step": int(trainer.step), "rng": _rng_digests()}


# ------------------------------------------------------------------------ one process, rank by rank


class _RankStreams:
    """Rank r's three generators in one process: swapped in around the work rank r does."""

    def __init__(self, job: Job, rank: int) -> None:
        saved = (torch.get_rng_state(), np.random.get_state(), random.getstate())
        _seed_generators(job, rank)
        self.state = (torch.get_rng_state(), np.random.get_state(), random.getstate())
        torch.set_rng_state(saved[0]), np.random.set_state(saved[1]), random.setstate(saved[2])

    def __enter__(self):
        self.outer = (torch.get_rng_state(), np.random.get_state(), random.getstate())
        torch.set_rng_state(self.state[0]), np.random.set_state(self.state[1])
        random.setstate(self.state[2])

    def __exit__(self, *exc):
        self.state = (torch.get_rng_state(), np.random.get_state(), random.getstate())
        torch.set_rng_state(self.outer[0]), np.random.set_state(self.outer[1])
        random.setstate(self.outer[2])


def reference_run(job: Job, at: int | None = None) -> dict[str, Any]:
    """The whole run in one process, emulating each rank's data and generators: the global loss
    of every step (``losses``), the final weights, and the state after ``at`` steps (``at``:
    what a right resume from a checkpoint of step ``at`` starts from: weights, moments, adam
    steps, lr, schedule step, epoch, position, step, and each rank's generator digests).
    Computed once per (job, at) in a process; treat the result as read-only."""
    if not isinstance(job, Job):
        raise ValueError(f"job must be a resume_job.Job; got {type(job).__name__}")
    return _reference_run(job, at)


@functools.lru_cache(maxsize=16)
def _reference_run(job: Job, at: int | None) -> dict[str, Any]:
    model = build_model(job)
    optimizer = torch.optim.AdamW(model.parameters(), lr=job.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, Schedule(job.warmup, job.steps))
    d, data = job.world_size, dataset(job)
    streams = [_RankStreams(job, r) for r in range(d)]
    samplers = [_sampler(job, r, d) for r in range(d)]
    losses, epoch, position, state_at = [], 0, 0, None
    for step in range(job.steps + 1):
        if step == at:
            state_at = _reference_state(model, optimizer, scheduler, streams, epoch, position,
                                        step)
        if step == job.steps:
            break
        total = 0.0
        for r in range(d):                       # each rank's rows, noise, mask and dropout
            samplers[r].set_epoch(epoch)
            with streams[r]:
                x, y = _batch(job, data, list(samplers[r]), position, epoch)
                loss_r = F.cross_entropy(model(x), y)
            (loss_r / d).backward()                   # FSDP2 averages the ranks' gradients
            total += loss_r.item()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(total / d)
        position += 1
        if position == job.steps_per_epoch:
            position, epoch = 0, epoch + 1
    return {"losses": losses, "state_at": state_at,
            "weights": {n: p.detach().numpy().copy() for n, p in model.named_parameters()}}


def _reference_state(model, optimizer, scheduler, streams, epoch, position, step) -> dict:
    moments, weights = {}, {}
    for name, p in model.named_parameters():
        weights[name] = p.detach().numpy().copy()
        state = optimizer.state.get(p, {})
        for key in ("exp_avg", "exp_avg_sq"):
            moments[f"{name}.{key}"] = state[key].numpy().copy() if key in state else None
    first = optimizer.state.get(next(model.parameters()), {})
    rng = []
    for s in streams:
        rng.append({"torch": digest(s.state[0]), "numpy": digest(s.state[1]),
                    "python": digest(s.state[2])})
    return {"weights": weights, "moments": moments,
            "adam_steps": float(first["step"]) if "step" in first else 0.0,
            "lr": float(optimizer.param_groups[0]["lr"]), "schedule_step": scheduler.last_epoch,
            "epoch": epoch, "position": position, "step": step, "rng": rng}


def shard_rows(rows: int, world_size: int) -> list[tuple[int, int]]:
    """FSDP2's split of a tensor's ``rows`` over the ranks: [start, stop) of each rank's rows
    (chunks of ceil(rows / D), the last ones shorter or empty)."""
    size = math.ceil(rows / world_size)
    return [(min(r * size, rows), min((r + 1) * size, rows)) for r in range(world_size)]

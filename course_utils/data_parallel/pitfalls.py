"""Five broken data-parallel programs, each a pitfall of real training (assignment a10, part 2).

Every program is a worker ``fn(rank, world_size, job)`` that trains :meth:`Job.model` with SGD on
its rank's share of the data and returns what it saw (:meth:`Job.result`: its weights, and what
the program records). :func:`run` starts one on ``job.world_size`` real ranks; :func:`one_device`
trains the same model on the whole global batch in one process. A right data-parallel program
ends with one process's weights on every rank, and :func:`check` says how a run differs.

======================  ==================================================================
``dp_by_hand``          data parallelism written by hand: all-reduce the gradients, step
``padded_sequences``    the same with padded sequences of different lengths
``accumulation``        gradient accumulation under DDP
``epochs``              several epochs, each rank reading through a ``DistributedSampler``
``loss_logging``        data parallelism that logs the mean loss over a group of its own
======================  ==================================================================

Each has a fault that real training runs have had; which one is for the student to find
(assignment a10, Q4-Q8), so this module describes symptoms only (:func:`check`).

(The data is token-level, like a language model's: a sequence of ``tokens`` positions, each a
feature vector and a class; :meth:`Job.loss` is the mean cross-entropy over the real tokens.)

Run a program under torchrun (the same worker, the default :class:`Job` of that program)::

    torchrun --standalone --nproc-per-node 2 -m course_utils.data_parallel.pitfalls dp_by_hand
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_utils.collectives import recorder
from course_utils.data_parallel.overlap import recording_hook
from course_utils.models.toy import toy_mlp
from course_utils.runtime import backend
from course_utils.runtime.validate import check_bool, check_int, check_real, one_of

__all__ = ["Job", "PROGRAMS", "JOBS", "RECORDS", "TOLERANCE", "run", "one_device", "check",
           "weights_match", "steps_of", "sampler_order", "show", "demo", "gloo_avg", "log_mean",
           "dp_by_hand", "padded_sequences", "accumulation", "epochs", "loss_logging"]

TOLERANCE = (1e-4, 1e-6)
"""(rtol, atol) of a rank's weights against one process's: SGD's update is linear in the
gradient, so only rounding separates them (about 1e-7 here)."""


@dataclass(frozen=True)
class Job:
    """A tiny training run, all of it decided by ``seed``: model, data, optimizer.

    Per step each rank gets ``rows`` sequences of ``tokens`` positions (``features`` inputs and
    one of ``classes`` targets each); ``ragged``: sequences end early (their tail is padding,
    ``mask`` 0), so ranks hold different numbers of real tokens. ``accumulation``: microbatches
    per optimizer step. ``epochs``: passes over :meth:`dataset` (the ``epochs`` program).
    """

    seed: int = 0
    world_size: int = 2
    steps: int = 3
    rows: int = 4
    tokens: int = 6
    features: int = 4
    classes: int = 3
    hidden: int = 8
    lr: float = 0.5
    ragged: bool = False
    accumulation: int = 1
    epochs: int = 1

    def __post_init__(self) -> None:
        check_int("seed", self.seed, 0)
        for name in ("world_size", "steps", "rows", "tokens", "features", "classes", "hidden",
                     "accumulation", "epochs"):
            check_int(name, getattr(self, name))
        check_real("lr", self.lr)
        check_bool("ragged", self.ragged)
        if self.rows % self.accumulation:
            raise ValueError(f"rows={self.rows} must split into accumulation="
                             f"{self.accumulation} equal microbatches")

    def model(self) -> torch.nn.Module:
        """The model, the same on every rank (seeded): token-wise Linear, Tanh, Linear
        (:func:`course_utils.models.toy.toy_mlp`)."""
        model = toy_mlp((self.features, self.hidden, self.classes), seed=self.seed,
                        activation="tanh")
        return model.to(backend.device())

    def optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        """Plain SGD with ``lr`` (its update is linear in the gradient)."""
        return torch.optim.SGD(model.parameters(), lr=self.lr)

    def _data(self, n: int, offset: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(10_000 + 97 * self.seed + offset)
        x = torch.randn(n, self.tokens, self.features, generator=gen)              # (n, T, F)
        y = torch.randint(self.classes, (n, self.tokens), generator=gen)            # (n, T)
        mask = torch.ones(n, self.tokens)                                           # (n, T)
        if self.ragged:   # each sequence has 1 to T real tokens, then padding
            lengths = torch.randint(1, self.tokens + 1, (n,), generator=gen)
            mask = (torch.arange(self.tokens) < lengths[:, None]).float()
        return x, y, mask

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The global batch of ``step``: ``x`` (R, T, F), ``y`` (R, T), ``mask`` (R, T), with
        R = rows * world_size; rank r's rows are :meth:`shard`."""
        return self._data(self.rows * self.world_size, 1 + step)

    def shard(self, batch: Sequence[torch.Tensor], rank: int) -> list[torch.Tensor]:
        """Rank ``rank``'s rows of a global batch, on this rank's device."""
        lo = rank * self.rows
        return [backend.to_device(t[lo:lo + self.rows]) for t in batch]

    def dataset(self) -> torch.utils.data.TensorDataset:
        """``2 * rows * world_size`` sequences as (index, x, y) rows: two steps per epoch."""
        x, y, _ = self._data(2 * self.rows * self.world_size, 0)
        return torch.utils.data.TensorDataset(torch.arange(len(x)), x, y)

    def token_losses(self, model: torch.nn.Module, x: torch.Tensor,
                     y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of every position, (b, T)."""
        logits = model(x)                                                           # (b, T, C)
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view_as(y)

    def loss(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy over every position of ``x`` (no padding)."""
        return self.token_losses(model, x, y).mean()

    def ddp(self, model: torch.nn.Module) -> torch.nn.parallel.DistributedDataParallel:
        """``model`` wrapped in DDP, with a comm hook that counts DDP's all-reduces
        (:meth:`all_reduces`) and averages each bucket as DDP's default hook does."""
        dev = backend.device()
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[dev] if dev.type == "cuda" else None)
        ddp.all_reduce_log = []           # the bytes of each bucket all-reduced
        ddp.register_comm_hook(ddp.all_reduce_log, recording_hook)
        return ddp

    @staticmethod
    def all_reduces(model: torch.nn.Module) -> int:
        """How many buckets a :meth:`ddp` model has all-reduced so far."""
        return len(getattr(model, "all_reduce_log", []))

    def result(self, model: torch.nn.Module, **extra: Any) -> dict[str, Any]:
        """What a program returns: its final weights (numpy) and whatever it recorded."""
        model = getattr(model, "module", model)
        weights = {n: backend.to_cpu(p.detach()).numpy().copy()
                   for n, p in model.named_parameters()}
        return {"weights": weights, **extra}


def log_mean(loss: torch.Tensor, group: Any) -> float:
    """The mean of every rank's ``loss`` over ``group``, as a float to log (a collective)."""
    t = loss.detach().clone()
    dist.all_reduce(t, group=group)
    return t.item() / dist.get_world_size(group)


# --------------------------------------------------------------------------- the five programs


def dp_by_hand(rank: int, world_size: int, job: Job) -> dict[str, Any]:
    """Data parallelism by hand: each rank's gradients, all-reduced, then SGD."""
    model = job.model()
    opt = job.optimizer(model)
    for step in range(job.steps):
        x, y, _ = job.shard(job.batch(step), rank)                   # (b, T, F), (b, T)
        job.loss(model, x, y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
    return job.result(model)


def padded_sequences(rank: int, world_size: int, job: Job) -> dict[str, Any]:
    """Data parallelism by hand, on padded sequences of different lengths (``mask``)."""
    model = job.model()
    opt = job.optimizer(model)
    for step in range(job.steps):
        x, y, mask = job.shard(job.batch(step), rank)                # (b, T, F), (b, T), (b, T)
        per_token = job.token_losses(model, x, y)                    # (b, T)
        loss = (per_token * mask).sum() / mask.sum()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        opt.step()
        opt.zero_grad()
    return job.result(model)


def accumulation(rank: int, world_size: int, job: Job) -> dict[str, Any]:
    """Gradient accumulation under DDP: ``job.accumulation`` microbatches per optimizer step."""
    model = job.ddp(job.model())
    opt = job.optimizer(model)
    all_reduces = []
    for step in range(job.steps):
        x, y, _ = job.shard(job.batch(step), rank)                   # (b, T, F), (b, T)
        before = job.all_reduces(model)
        for x_mb, y_mb in zip(x.chunk(job.accumulation), y.chunk(job.accumulation)):
            loss = job.loss(model, x_mb, y_mb)
            loss.backward()
        opt.step()
        opt.zero_grad()
        all_reduces.append(job.all_reduces(model) - before)
    return job.result(model, all_reduces=all_reduces)


def epochs(rank: int, world_size: int, job: Job) -> dict[str, Any]:
    """Epochs over a dataset, each rank reading its share through a ``DistributedSampler``."""
    from torch.utils.data import DataLoader, DistributedSampler

    data = job.dataset()                                             # (index, x, y) rows
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=job.seed)
    loader = DataLoader(data, batch_size=job.rows, sampler=sampler)
    model = job.model()
    opt = job.optimizer(model)
    seen = []
    for epoch in range(job.epochs):
        for index, x, y in loader:
            seen.append(index.tolist())
            x, y = backend.to_device(x), backend.to_device(y)
            job.loss(model, x, y).backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world_size
            opt.step()
            opt.zero_grad()
    return job.result(model, seen=seen)


def loss_logging(rank: int, world_size: int, job: Job) -> dict[str, Any]:
    """Data parallelism with the mean loss logged over a group of its own."""
    metrics = backend.new_group(list(range(world_size)))             # for loss_logging only
    model = job.model()
    opt = job.optimizer(model)
    logged = []
    for step in range(job.steps):
        x, y, _ = job.shard(job.batch(step), rank)                   # (b, T, F), (b, T)
        loss = job.loss(model, x, y)
        loss.backward()
        if rank == 0:
            logged.append(log_mean(loss, metrics))
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        if rank != 0:
            logged.append(log_mean(loss, metrics))
        opt.step()
        opt.zero_grad()
    return job.result(model, logged=logged)


PROGRAMS: dict[str, Callable[..., dict[str, Any]]] = {
    f.__name__: f for f in (dp_by_hand, padded_sequences, accumulation, epochs,
                            loss_logging)}
JOBS: dict[str, Job] = {
    "dp_by_hand": Job(seed=1),
    "padded_sequences": Job(seed=2, ragged=True),
    "accumulation": Job(seed=3, rows=6, accumulation=3),
    "epochs": Job(seed=4, epochs=3, steps=6),
    "loss_logging": Job(seed=5),
}
"""Each program's job in the assignment's demonstration."""


def _program(name: str) -> Callable[..., dict[str, Any]]:
    return one_of("name", name, PROGRAMS)


def show(name: str) -> None:
    """Print a program's source."""
    print(inspect.getsource(_program(name)))


def run(fn: Callable[..., dict[str, Any]], job: Job, timeout_s: float = 90.0) -> list[dict]:
    """``fn(rank, world_size, job)`` on ``job.world_size`` real ranks; each rank's result, with
    ``all_reduce_calls``: how many times the rank called ``dist.all_reduce`` (DDP's included,
    through :meth:`Job.ddp`'s hook)."""
    from course_utils import launch

    if not callable(fn):
        raise ValueError(f"fn must be a worker function; got {type(fn).__name__}")
    if not isinstance(job, Job):
        raise ValueError(f"job must be a pitfalls.Job; got {type(job).__name__}")
    return launch.run(functools.partial(_counted, fn=fn), job.world_size, job,
                      timeout_s=timeout_s, threads_per_rank=1)


def _counted(rank: int, world_size: int, job: Job, fn: Callable[..., Any]) -> Any:
    """Run ``fn`` on this rank, counting its calls of ``dist.all_reduce`` (the recorder's)."""
    calls = [0]

    def count(call: recorder.Call) -> None:
        calls[0] += call.api == "all_reduce"

    with recorder.listen(recorder.once_per_api_call(count)):
        result = fn(rank, world_size, job)
    if isinstance(result, dict):
        result = {**result, "all_reduce_calls": calls[0]}
    return result


# ------------------------------------------------------------------- one process, and variants


def sampler_order(job: Job) -> list[list[list[int]]]:
    """The rows each rank reads per step from :meth:`Job.dataset` through a
    ``DistributedSampler(seed=job.seed)`` told each epoch (``[rank][step] -> indices``), from
    the sampler's own rule: epoch e's permutation is ``randperm(n)`` seeded with ``seed + e``,
    and rank r takes every D-th entry from the r-th."""
    n, d = len(job.dataset()), job.world_size
    out: list[list[list[int]]] = [[] for _ in range(d)]
    for rank in range(d):
        for epoch in range(job.epochs):
            seed = job.seed + epoch
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
            mine = perm[rank:n:d]
            out[rank] += [mine[i:i + job.rows] for i in range(0, len(mine), job.rows)]
    return out


def one_device(job: Job, normalise: str = "tokens",
               order: Sequence[Sequence[Sequence[int]]] | None = None) -> dict[str, Any]:
    """One process, every rank's rows at once, SGD: the run a data-parallel program must equal.

    ``normalise``: ``"tokens"`` (the mean over every real token of the global batch) or
    ``"ranks"`` (the mean of each rank's own mean: what averaging the ranks' gradients gives
    when their token counts differ). ``order`` (``[rank][step] -> indices`` of
    :meth:`Job.dataset`, as :func:`sampler_order` gives): the steps read those rows instead of
    :meth:`Job.batch`. Returns the final ``weights`` and the global ``losses`` per step.
    """
    one_of("normalise", normalise, ("tokens", "ranks"))
    model = job.model()                     # one process: the CPU (no process group here)
    opt = torch.optim.SGD(model.parameters(), lr=job.lr)
    data = job.dataset() if order is not None else None
    steps = len(order[0]) if order is not None else job.steps
    losses = []
    for step in range(steps):
        if order is not None:
            parts = [data[torch.tensor(order[r][step])] for r in range(job.world_size)]
            parts = [(x, y, torch.ones_like(y, dtype=torch.float)) for _, x, y in parts]
        else:
            x, y, mask = job.batch(step)
            parts = [(x[r * job.rows:(r + 1) * job.rows], y[r * job.rows:(r + 1) * job.rows],
                      mask[r * job.rows:(r + 1) * job.rows]) for r in range(job.world_size)]
        per_rank = [((job.token_losses(model, x, y) * m).sum(), m.sum()) for x, y, m in parts]
        if normalise == "tokens":
            loss = sum(s for s, _ in per_rank) / sum(n for _, n in per_rank)
        else:
            loss = sum(s / n for s, n in per_rank) / len(per_rank)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"weights": {n: p.detach().clone() for n, p in model.named_parameters()},
            "losses": losses}


# ------------------------------------------------------------------------------- diagnosis


def weights_match(result: Any, want: dict[str, torch.Tensor]) -> bool:
    """Whether a rank's result holds ``want``'s weights, within :data:`TOLERANCE`."""
    got = result.get("weights") if isinstance(result, dict) else None
    if not isinstance(got, dict) or set(got) != set(want):
        return False
    rtol, atol = TOLERANCE
    for n, w in want.items():
        g = torch.as_tensor(np.asarray(got[n])).double()
        if g.shape != w.shape or not torch.allclose(g, w.double(), rtol, atol):
            return False
    return True


RECORDS = {"accumulation": "all_reduces", "epochs": "seen", "loss_logging": "logged"}
"""What each program records beside its weights (the key of :meth:`Job.result`)."""


def steps_of(name: str, job: Job) -> int:
    """Optimizer steps of program ``name`` on ``job`` (``epochs``: two per epoch)."""
    return 2 * job.epochs if name == "epochs" else job.steps


def _check_shape(name: str, job: Job, results: Any, where: str) -> None:
    """A run's results are read as untrusted data: one dict per rank, with weights."""
    assert isinstance(results, (list, tuple)) and len(results) == job.world_size, (
        f"{where}expected one result per rank ({job.world_size})")
    steps, key = steps_of(name, job), RECORDS.get(name)
    for rank, r in enumerate(results):
        assert isinstance(r, dict) and isinstance(r.get("weights"), dict), (
            f"{where}rank {rank} returned no weights (return job.result(model, ...))")
        assert all(isinstance(v, (np.ndarray, torch.Tensor)) for v in r["weights"].values()), (
            f"{where}rank {rank}: its weights are not arrays")
        calls = r.get("all_reduce_calls")
        assert type(calls) is int and calls >= steps, (
            f"{where}rank {rank} called dist.all_reduce {calls} times in {steps} steps: a rank "
            "that trains with the others all-reduces its gradients every step")
        assert key is None or isinstance(r.get(key), list), (
            f"{where}rank {rank} did not return its {key!r} (keep the program's "
            f"job.result(model, {key}=...))")


def check(name: str, job: Job, results: Any, label: str = "") -> None:
    """Raise AssertionError saying how a run of program ``name`` (or a fix of it) differs from
    one process: its weights, and what the program records (DDP's all-reduces per step, the
    rows each rank read, the losses it logged). It describes the symptom, not its cause: saying
    what is wrong is the exercise (the grader's feedback names the cause)."""
    _program(name)
    where = f"{label}: " if label else ""
    _check_shape(name, job, results, where)
    order = sampler_order(job) if name == "epochs" else None
    want = one_device(job, order=order)
    steps = steps_of(name, job)
    for rank, r in enumerate(results if name == "epochs" else []):   # the rows decide the rest
        bad = next((i for i, (a, b) in enumerate(zip(r["seen"], order[rank])) if a != b),
                   None if len(r["seen"]) == len(order[rank]) else 0)
        assert bad is None, (
            f"{where}rank {rank} read rows {r['seen'][bad:bad + 1]} at step {bad + 1}; a "
            f"DistributedSampler over {job.world_size} ranks gives it {order[rank][bad]} there "
            f"(epoch {bad // 2 + 1} of {job.epochs})")
    for rank, r in enumerate(results):
        if not weights_match(r, want["weights"]):
            diff = max(float((torch.as_tensor(np.asarray(r["weights"].get(n, np.nan))) - w)
                             .abs().max()) if n in r["weights"] else float("inf")
                       for n, w in want["weights"].items())
            raise AssertionError(f"{where}rank {rank}'s weights after {steps} steps differ from "
                                 f"one process's, trained on the whole global batch, by up to "
                                 f"{diff:.2e}")
        if name == "accumulation":
            assert r["all_reduces"] == [1] * steps, (
                f"{where}rank {rank}: DDP all-reduced {r['all_reduces']} times in its {steps} "
                "steps; one per step is all one process's result needs")
        if name == "loss_logging":
            got = r["logged"]
            ok = len(got) == steps and all(
                type(v) in (int, float) and abs(v - w) <= 1e-5 + 1e-5 * abs(w)
                for v, w in zip(got, want["losses"]))
            assert ok, (f"{where}rank {rank} logged {got!r}; the global batch's mean loss per "
                        f"step is {[round(v, 6) for v in want['losses']]}")


# ------------------------------------------------------------------------------ demonstration


def demo(name: str, job: Job | None = None, timeout_s: float | None = None) -> list[dict] | None:
    """Run the broken program ``name`` on real ranks and print how it differs from one process;
    a hang is stopped after ``timeout_s`` (default: 3 s for ``loss_logging``, which hangs, 60 s
    for the others) and the ranks' stacks printed. Returns the ranks' results (or None)."""
    from course_utils import launch

    fn = _program(name)
    job = JOBS[name] if job is None else job
    hangs = name == "loss_logging"
    timeout_s = (3.0 if hangs else 60.0) if timeout_s is None else timeout_s
    if hangs:  # the ranks' first start in a kernel imports torch: not the program's time
        launch.run(launch.ping, job.world_size, timeout_s=60, show_output=False)
    order = sampler_order(job) if name == "epochs" else None
    want = one_device(job, order=order)
    try:
        results = run(fn, job, timeout_s=timeout_s)
    except launch.LaunchTimeout as hung:
        print(f"{name} on {job.world_size} ranks: no result after {timeout_s:g} s.\n{hung}")
        return None
    for rank, r in enumerate(results):
        diff = max(float((torch.as_tensor(r["weights"][n]) - w).abs().max())
                   for n, w in want["weights"].items())
        extra = {k: v for k, v in r.items() if k != "weights"}
        print(f"rank {rank}: weights after {len(want['losses'])} steps differ from one "
              f"process's by up to {diff:.2e}" + "".join(f"; {k} = {v}" for k, v in extra.items()))
    return results


def gloo_avg(world_size: int = 3, timeout_s: float = 30.0) -> dict[str, Any]:
    """What ``ReduceOp.AVG`` does on this backend, next to SUM: ``world_size`` ranks each give
    ``rank + 1`` and a random float32 vector; rank 0's view (see :func:`_avg_worker`)."""
    from course_utils import launch

    check_int("world_size", world_size, 2)
    return launch.run(_avg_worker, world_size, timeout_s=timeout_s, show_output=False)[0]


def _avg_worker(rank: int, world_size: int) -> dict[str, Any]:
    """AVG against SUM / D: float32 (equal to the bit?), float16 near its largest value (does
    AVG divide before or after it adds?), int64 (is it allowed?)."""
    dev = backend.device()
    out: dict[str, Any] = {}
    v = torch.randn(1000, generator=torch.Generator().manual_seed(rank)).to(dev)
    avg, total = v.clone(), v.clone()
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)
    dist.all_reduce(total)
    out["float32 AVG == SUM / D, bit for bit"] = bool(torch.equal(avg, total / world_size))
    half = torch.full((1,), 40000.0, dtype=torch.float16, device=dev)   # fp16's max: 65504
    dist.all_reduce(half, op=dist.ReduceOp.AVG)
    out["float16 AVG of 40000 on every rank"] = half.item()
    ints = torch.full((1,), rank + 1, device=dev)
    try:
        dist.all_reduce(ints, op=dist.ReduceOp.AVG)
        out["int64 AVG"] = ints.item()
    except RuntimeError as error:
        out["int64 AVG"] = f"RuntimeError: {str(error).splitlines()[0]}"
    return out


if __name__ == "__main__":
    # torchrun --standalone --nproc-per-node 2 -m course_utils.data_parallel.pitfalls dp_by_hand
    import sys

    from course_utils import launch

    program = sys.argv[1] if len(sys.argv) > 1 else "dp_by_hand"
    world = int(os.environ.get("WORLD_SIZE", "2"))
    launch.torchrun_main(_program(program), dataclasses.replace(JOBS[program], world_size=world))

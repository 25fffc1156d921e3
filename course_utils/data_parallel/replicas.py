"""Data parallelism on real ranks: one update across replicas, where averaging goes, scaling.

Each rank holds a full copy of the model, computes gradients on its own examples, and an
all-reduce combines the gradients so every replica takes the same step. This module has the
workers the Module 2 lecture runs through :func:`course_utils.launch.run`, each beside the
single-process computation it must equal:

* :func:`two_replica_update_worker` / :func:`sgd_reference`: the lesson's update (local mean
  gradients [2, 4] and [6, 0], mean [4, 2], SGD lr 0.1 from [1, 1] -> [0.6, 0.8]).
* :func:`normalization_worker`: a SUM all-reduce needs a division by D somewhere
  (``sum_then_divide``, ``avg_op``) and the two bugs (``forgot_divide``: D times too large;
  ``avg_then_divide``: D times too small).
* :func:`unequal_batch_worker` / :func:`full_batch_train` / :func:`weighted_train`: with unequal
  local batches, averaging the ranks' mean gradients optimizes a re-weighted objective; weighting
  by example counts equals full-batch training.
* :func:`dp_train_worker` (``scratch`` or ``ddp``) / :func:`train_single`: a from-scratch
  data-parallel loop equals torch DDP equals one process on the full batch.
* :func:`accumulation_worker`: gradient accumulation with DDP's ``no_sync`` (one all-reduce per
  step instead of one per micro-batch), equal to the full-batch step.
* :func:`throughput_worker` and :func:`straggler_worker`: what limits scaling. Both read the
  clock through :func:`course_utils.runtime.clock.clock`, which waits for a CUDA device first (on
  CUDA a collective returns once it is enqueued, so ``perf_counter`` alone would miss its time).

Workers return plain Python lists and numbers, never tensors: a tensor returned through the
launcher travels through shared memory and can race its rank's exit.

Run the lesson's update under torchrun::

    torchrun --standalone --nproc-per-node 2 -m course_utils.data_parallel.replicas
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from course_utils import launch
from course_utils.models.toy import toy_mlp
from course_utils.runtime import backend
from course_utils.runtime import clock as timing
from course_utils.runtime.validate import check_index, check_int, check_real

__all__ = ["LESSON_GRADS", "LESSON_W0", "LESSON_LR", "NORMALIZATIONS", "WEIGHTINGS",
           "sgd_reference", "two_replica_update_worker", "normalization_worker",
           "all_normalizations_worker", "dp_compare_worker",
           "make_regression", "split_by_counts", "full_batch_train", "weighted_train",
           "least_squares_minimizer", "unequal_batch_worker", "make_mlp", "make_batch",
           "flat_params", "train_single", "dp_train_worker", "accumulation_worker",
           "throughput_worker", "straggler_worker"]

LESSON_GRADS = [[2.0, 4.0], [6.0, 0.0]]
LESSON_W0 = [1.0, 1.0]
LESSON_LR = 0.1
NORMALIZATIONS = ("sum_then_divide", "avg_op", "forgot_divide", "avg_then_divide")
WEIGHTINGS = ("mean_of_means", "example_weighted")


def _fmt(values: Any) -> str:
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"


def _check_grads(local_grads: Any, world_size: int | None = None) -> list[list[float]]:
    if not isinstance(local_grads, (list, tuple)) or not local_grads:
        raise ValueError("local_grads must be a non-empty list with one gradient per rank")
    lengths = {len(g) for g in local_grads}
    if len(lengths) != 1:
        raise ValueError(f"local_grads must all have the same length; got lengths "
                         f"{sorted(lengths)}")
    if world_size is not None and len(local_grads) != world_size:
        raise ValueError(f"local_grads must hold world_size={world_size} gradients; "
                         f"got {len(local_grads)}")
    return [[float(v) for v in g] for g in local_grads]


# ----------------------------------------------------------------------- one update, two ranks


def sgd_reference(local_grads: Sequence[Sequence[float]], w0: Sequence[float],
                  lr: float) -> tuple[list[float], list[float]]:
    """One process: the mean of the ranks' gradients and the SGD step ``w0 - lr * mean``."""
    grads = torch.tensor(_check_grads(local_grads))  # (D, P)
    w = torch.tensor([float(v) for v in w0])  # (P,)
    if w.shape[0] != grads.shape[1]:
        raise ValueError(f"w0 must have {grads.shape[1]} entries, like each gradient; "
                         f"got {len(w0)}")
    mean = grads.mean(0)  # (P,)
    return mean.tolist(), (w - lr * mean).tolist()


def two_replica_update_worker(rank: int, world_size: int,
                              local_grads: Sequence[Sequence[float]] = LESSON_GRADS,
                              w0: Sequence[float] = LESSON_W0,
                              lr: float = LESSON_LR) -> list[float]:
    """Rank ``rank`` all-reduces its gradient ``local_grads[rank]`` (sum, then / D) and takes an
    SGD step from ``w0``; prints each stage and returns the new weights."""
    grads = _check_grads(local_grads, world_size)
    dev = backend.device()  # this rank's GPU under NCCL, else the CPU
    g = torch.tensor(grads[rank], device=dev)  # (P,) this rank's mean gradient over its batch
    w = torch.tensor([float(v) for v in w0], device=dev)  # (P,) same start on every replica
    print(f"local mean gradient {_fmt(g)}")
    dist.all_reduce(g, op=dist.ReduceOp.SUM)  # every rank now holds the sum
    print(f"after all_reduce(SUM): {_fmt(g)}")
    g /= world_size  # the normalization: mean over replicas
    w -= lr * g
    print(f"divided by D={world_size}: {_fmt(g)}; SGD lr={lr:g}: weights {_fmt(w)}")
    return w.tolist()


def normalization_worker(rank: int, world_size: int, local_grads: Sequence[Sequence[float]],
                         mode: str) -> list[float]:
    """The gradient every rank uses after synchronising, for one normalization ``mode``.

    ``sum_then_divide`` and ``avg_op`` give the mean; ``forgot_divide`` gives D x the mean;
    ``avg_then_divide`` (AVG op, then divided again) gives the mean / D.
    """
    if mode not in NORMALIZATIONS:
        raise ValueError(f"mode must be one of {list(NORMALIZATIONS)}; got {mode!r}")
    g = torch.tensor(_check_grads(local_grads, world_size)[rank], device=backend.device())  # (P,)
    if mode == "avg_op" or mode == "avg_then_divide":
        dist.all_reduce(g, op=dist.ReduceOp.AVG)
        if mode == "avg_then_divide":
            g /= world_size  # bug: AVG already divided
    else:
        dist.all_reduce(g, op=dist.ReduceOp.SUM)
        if mode == "sum_then_divide":
            g /= world_size
    return g.tolist()


def all_normalizations_worker(rank: int, world_size: int,
                              local_grads: Sequence[Sequence[float]]) -> dict[str, list[float]]:
    """:func:`normalization_worker` for every mode in :data:`NORMALIZATIONS`, in one launch."""
    return {mode: normalization_worker(rank, world_size, local_grads, mode)
            for mode in NORMALIZATIONS}


# --------------------------------------------------------------------------- unequal batches


def make_regression(seed: int, n: int, dim: int = 2,
                    noise: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """A linear-regression data set: X (n, dim), y (n,) = X @ w_true + noise (float64)."""
    check_int("n", n)
    check_int("dim", dim)
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(n, dim, generator=gen, dtype=torch.float64)  # (n, dim)
    w_true = torch.arange(1, dim + 1, dtype=torch.float64)  # (dim,)
    y = X @ w_true + noise * torch.randn(n, generator=gen, dtype=torch.float64)  # (n,)
    return X, y


def split_by_counts(X: torch.Tensor, y: torch.Tensor,
                    counts: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Give rank r the next ``counts[r]`` examples: [(X_r (n_r, dim), y_r (n_r,)), ...]."""
    counts = [int(c) for c in counts]
    if not counts or any(c < 1 for c in counts):
        raise ValueError(f"counts must list at least one example per rank; got {counts}")
    if sum(counts) != X.shape[0] or X.shape[0] != y.shape[0]:
        raise ValueError(f"counts must sum to the number of examples {X.shape[0]}; got {counts}")
    return list(zip(torch.split(X, counts), torch.split(y, counts)))


def _mse_grad(w: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Gradient of the mean squared error mean_i (x_i . w - y_i)^2 at w, by autograd: (dim,)."""
    w = w.detach().requires_grad_(True)
    loss = ((X @ w - y) ** 2).mean()
    (grad,) = torch.autograd.grad(loss, w)
    return grad


def full_batch_train(X: torch.Tensor, y: torch.Tensor, w0: torch.Tensor, lr: float,
                     steps: int) -> torch.Tensor:
    """One process, gradient descent on the mean over all examples: trajectory (steps + 1, dim)."""
    w, path = w0.clone(), [w0.clone()]
    for _ in range(steps):
        w = w - lr * _mse_grad(w, X, y)
        path.append(w.clone())
    return torch.stack(path)


def weighted_train(shards: Sequence[tuple[torch.Tensor, torch.Tensor]], w0: torch.Tensor,
                   lr: float, steps: int) -> torch.Tensor:
    """One process, gradient descent on the mean of the shards' mean losses: (steps + 1, dim).

    This is the objective that averaging per-rank mean gradients actually optimizes: an example
    on a rank with n_r examples weighs 1 / (D n_r) instead of 1 / N.
    """
    w, path = w0.clone(), [w0.clone()]
    for _ in range(steps):
        grad = torch.stack([_mse_grad(w, Xr, yr) for Xr, yr in shards]).mean(0)  # (dim,)
        w = w - lr * grad
        path.append(w.clone())
    return torch.stack(path)


def least_squares_minimizer(shards: Sequence[tuple[torch.Tensor, torch.Tensor]],
                            weighting: str) -> torch.Tensor:
    """Where each objective's minimum is: weighted least squares, shape (dim,).

    ``example_weighted``: every example weighs 1/N (the full-batch objective);
    ``mean_of_means``: an example on rank r weighs 1/(D n_r).
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {list(WEIGHTINGS)}; got {weighting!r}")
    X = torch.cat([Xr for Xr, _ in shards])  # (N, dim)
    y = torch.cat([yr for _, yr in shards])  # (N,)
    if weighting == "example_weighted":
        weights = torch.ones(X.shape[0], dtype=X.dtype)
    else:
        weights = torch.cat([torch.full((Xr.shape[0],), 1.0 / Xr.shape[0], dtype=X.dtype)
                             for Xr, _ in shards])  # (N,)
    A = X.T @ (weights[:, None] * X)  # (dim, dim)
    b = X.T @ (weights * y)  # (dim,)
    return torch.linalg.solve(A, b)


def unequal_batch_worker(rank: int, world_size: int,
                         shards: Sequence[tuple[torch.Tensor, torch.Tensor]], w0: torch.Tensor,
                         lr: float, steps: int, weighting: str) -> list[list[float]]:
    """Data-parallel gradient descent where rank r holds ``shards[r]`` (unequal sizes allowed).

    ``mean_of_means``: all-reduce the local mean gradients and divide by D (the common bug).
    ``example_weighted``: all-reduce (n_r x local mean gradient) and n_r, divide sum by sum.
    Returns the trajectory as a (steps + 1) x dim nested list, identical on every rank.
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {list(WEIGHTINGS)}; got {weighting!r}")
    if len(shards) != world_size:
        raise ValueError(f"shards must hold world_size={world_size} (X, y) pairs; "
                         f"got {len(shards)}")
    X, y, w = backend.to_device((*shards[rank], w0))
    n_local = torch.tensor(float(X.shape[0]), dtype=X.dtype, device=X.device)  # scalar
    path = [w.clone()]
    for step in range(steps):
        g = _mse_grad(w, X, y)  # (dim,) mean over this rank's examples
        if weighting == "mean_of_means":
            dist.all_reduce(g, op=dist.ReduceOp.SUM)
            g /= world_size
        else:
            packed = torch.cat([g * n_local, n_local.view(1)])  # (dim + 1,): sum of grads, count
            dist.all_reduce(packed, op=dist.ReduceOp.SUM)
            g = packed[:-1] / packed[-1]  # (dim,) mean over all N examples
        w = w - lr * g
        path.append(w.clone())
        if step == 0:
            print(f"{X.shape[0]} local example(s); step-1 gradient used: {_fmt(g)}")
    return torch.stack(path).tolist()


# ------------------------------------------------------------- DP from scratch vs DDP vs single


def make_mlp(seed: int, sizes: Sequence[int] = (4, 16, 1)) -> nn.Sequential:
    """A small tanh MLP with seeded weights: Linear(sizes[0], sizes[1]) ... (float32);
    :func:`course_utils.models.toy.toy_mlp`."""
    return toy_mlp(sizes, seed=seed, activation="tanh")


def make_batch(seed: int, n: int, dim: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded regression batch: x (n, dim), target (n, 1)."""
    gen = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(n, dim, generator=gen)  # (n, dim)
    target = torch.sin(x.sum(1, keepdim=True)) + 0.1 * torch.randn(n, 1, generator=gen)  # (n, 1)
    return x, target


def flat_params(model: nn.Module) -> torch.Tensor:
    """All parameters concatenated: (total parameter count,)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _step_batches(seed: int, steps: int,
                  global_batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [make_batch(seed * 100 + s, global_batch) for s in range(steps)]


def train_single(seed: int, steps: int = 3, global_batch: int = 8,
                 lr: float = 0.1) -> tuple[torch.Tensor, list[float]]:
    """One process, SGD on the whole global batch each step: (final flat params, losses)."""
    model = make_mlp(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, target in _step_batches(seed, steps, global_batch):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return flat_params(model), losses


def _check_divisible(global_batch: int, parts: int, what: str) -> None:
    if global_batch % parts:
        raise ValueError(f"global_batch={global_batch} must be divisible by {what}={parts}")


def dp_train_worker(rank: int, world_size: int, seed: int, mode: str, steps: int = 3,
                    global_batch: int = 8, lr: float = 0.1) -> tuple[list[float], list[float]]:
    """Data-parallel SGD: rank r trains on its 1/D slice of each global batch.

    ``mode="scratch"``: broadcast rank 0's weights, then after each backward all-reduce every
    gradient (SUM) and divide by D. ``mode="ddp"``: torch's DistributedDataParallel.
    Returns (final flat params as a list, global mean losses), the same on every rank.
    """
    if mode not in ("scratch", "ddp"):
        raise ValueError(f"mode must be 'scratch' or 'ddp'; got {mode!r}")
    _check_divisible(global_batch, world_size, "world_size")
    local = global_batch // world_size
    model = make_mlp(seed).to(backend.device())
    if mode == "ddp":
        net: nn.Module = nn.parallel.DistributedDataParallel(model)
    else:
        net = model
        for p in model.parameters():  # same start on every replica (DDP does this too)
            dist.broadcast(p.data, src=0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, target in backend.to_device(_step_batches(seed, steps, global_batch)):
        x_local = x[rank * local:(rank + 1) * local]  # (local, dim)
        t_local = target[rank * local:(rank + 1) * local]  # (local, 1)
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x_local), t_local)
        loss.backward()  # DDP all-reduces (averages) the gradients inside backward
        if mode == "scratch":
            for p in model.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad /= world_size
        opt.step()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss, op=dist.ReduceOp.AVG)  # equal slices: mean of means is right
        losses.append(global_loss.item())
    return flat_params(model).tolist(), losses


def dp_compare_worker(rank: int, world_size: int, seeds: Sequence[int],
                      modes: Sequence[str] = ("scratch", "ddp"), steps: int = 3,
                      global_batch: int = 8, lr: float = 0.1) -> dict[tuple[int, str], Any]:
    """:func:`dp_train_worker` for every seed and mode in one launch: {(seed, mode): result}."""
    return {(seed, mode): dp_train_worker(rank, world_size, seed, mode, steps, global_batch, lr)
            for seed in seeds for mode in modes}


def accumulation_worker(rank: int, world_size: int, seed: int, micro_batches: int,
                        use_no_sync: bool, steps: int = 2, global_batch: int = 16,
                        lr: float = 0.1) -> dict[str, Any]:
    """DDP with gradient accumulation over ``micro_batches`` per step.

    Each rank splits its slice of the global batch into micro-batches, scales each loss by
    1/micro_batches and calls backward once per micro-batch; with ``use_no_sync`` all but the
    last micro-batch (forward and backward) run inside ``ddp.no_sync()``. A comm hook counts
    DDP's all-reduces.
    Returns {"params": final flat params (list), "allreduces": all-reduce calls per step}.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    _check_divisible(global_batch, world_size * micro_batches, "world_size * micro_batches")
    local = global_batch // world_size
    micro = local // micro_batches
    model = make_mlp(seed).to(backend.device())
    ddp = nn.parallel.DistributedDataParallel(model)
    calls = [0]

    def counting_hook(state, bucket):  # no annotations: DDP checks them against dist.GradBucket
        calls[0] += 1
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, counting_hook)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for x, target in backend.to_device(_step_batches(seed, steps, global_batch)):
        x_local = x[rank * local:(rank + 1) * local]  # (local, dim)
        t_local = target[rank * local:(rank + 1) * local]  # (local, 1)
        opt.zero_grad()
        for m in range(micro_batches):
            xm = x_local[m * micro:(m + 1) * micro]  # (micro, dim)
            tm = t_local[m * micro:(m + 1) * micro]  # (micro, 1)
            skip_sync = use_no_sync and m < micro_batches - 1
            # no_sync must wrap the forward too: DDP decides in forward whether backward syncs
            with ddp.no_sync() if skip_sync else contextlib.nullcontext():
                loss = nn.functional.mse_loss(ddp(xm), tm) / micro_batches
                loss.backward()  # inside no_sync: gradients accumulate locally, no all-reduce
        opt.step()
    return {"params": flat_params(model).tolist(), "allreduces": calls[0] / steps}


# ------------------------------------------------------------------------ what limits scaling


def throughput_worker(rank: int, world_size: int, per_rank_batch: int = 256, steps: int = 8,
                      width: int = 512) -> float:
    """Examples per second of DDP training (MLP of ``width``), fixed batch per rank (weak scaling).

    Returns the global throughput: D x per_rank_batch x steps / the slowest rank's time.
    """
    model = make_mlp(0, (width, width, width, 1)).to(backend.device())
    ddp = nn.parallel.DistributedDataParallel(model) if world_size > 1 else model
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(per_rank_batch, width, generator=gen)  # (B, width)
    target = torch.randn(per_rank_batch, 1, generator=gen)  # (B, 1)
    x, target = backend.to_device((x, target))

    def step() -> None:
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), target).backward()
        opt.step()

    step()  # warm-up
    if world_size > 1:
        dist.barrier()
    start = timing.clock(x)
    for _ in range(steps):
        step()
    elapsed = torch.tensor(timing.clock(x) - start, dtype=torch.float64)
    if world_size > 1:
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return world_size * per_rank_batch * steps / float(elapsed)


def straggler_worker(rank: int, world_size: int, slow_rank: int, delay_s: float,
                     steps: int = 4, numel: int = 1 << 16) -> dict[str, float]:
    """Each step: "compute" (rank ``slow_rank`` sleeps ``delay_s`` more), then an all-reduce.

    Returns this rank's median seconds per step in compute, waiting inside the all-reduce, and
    the whole step: fast ranks spend the straggler's extra time waiting. The clock is read with
    :func:`course_utils.runtime.clock.clock`, which synchronizes first if ``grad`` is on CUDA.
    """
    check_index("slow_rank", slow_rank, world_size)
    check_real("delay_s", delay_s, 0, strict=False)  # seconds
    grad = torch.ones(numel, device=backend.device())  # (numel,) a stand-in gradient
    compute, wait, total = [], [], []
    dist.barrier()
    for _ in range(steps):
        t0 = timing.clock(grad)
        grad.mul_(1.0)  # the (tiny) backward pass
        if rank == slow_rank:
            # e.g. a slow input pipeline, a busier host, a thermally throttled chip
            time.sleep(delay_s)
        t1 = timing.clock(grad)  # on CUDA: after the backward's kernels have finished
        dist.all_reduce(grad)
        t2 = timing.clock(grad)  # on CUDA: after the all-reduce, not merely its launch
        compute.append(t1 - t0)
        wait.append(t2 - t1)
        total.append(t2 - t0)

    def median(v: list[float]) -> float:
        return float(torch.tensor(v).median())

    return {"compute_s": median(compute), "wait_s": median(wait), "step_s": median(total)}


if __name__ == "__main__":
    # the lesson's update:
    # torchrun --standalone --nproc-per-node 2 -m course_utils.data_parallel.replicas
    launch.torchrun_main(two_replica_update_worker)

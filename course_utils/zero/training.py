"""Training with the ZeRO engine on real ranks, and the one-process reference it must match.

:func:`train_worker` trains :func:`~course_utils.zero.mlp.make_mlp` under one ZeRO stage on one
data-parallel rank (:class:`~course_utils.zero.engine.ZeroDP`) and returns its losses, final
weights, measured bytes, logged communication and, if asked, its memory timeline;
:func:`all_stages_worker` runs every stage in one process group and :func:`run_all_stages`
launches it. :func:`reference_train` is the unsharded single-process run on the same data
(data parallelism's mean gradient), :func:`max_abs_diff` compares the two, and
:func:`sum_rounding_error` measures what summing gradients in bf16 costs. Lecture 3 (ZeRO and
FSDP).

Run every stage under torchrun (prints each rank's measured bytes)::

    torchrun --standalone --nproc-per-node 2 -m course_utils.zero.training
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist

from course_utils.memory import sizing as memory
from course_utils.runtime import backend, validate
from course_utils.zero.engine import ZeroDP
from course_utils.zero.mlp import make_batches, make_mlp, mse_loss
from course_utils.zero.recording import CommLog
from course_utils.zero.sizes import REDUCE_DTYPES, STAGE_NAMES, STAGES, check_sizes

__all__ = ["train_worker", "all_stages_worker", "run_all_stages", "reference_train",
           "sum_rounding_error", "max_abs_diff"]


def train_worker(rank: int, world_size: int, stage: int, sizes: Sequence[int], seed: int = 0,
                 n_steps: int = 3, micro_batch: int = 4, lr: float = 1e-2,
                 reduce_dtype: str = "bf16", prefetch: bool = False,
                 record_timeline: bool = False) -> dict[str, Any]:
    """Train :func:`make_mlp` for ``n_steps`` under ZeRO ``stage`` on this dp rank.

    Returns losses (mean over ranks, per step), params (full, as fp32 numpy arrays: exact for
    bf16, and safe to return through a pipe), bytes (measured after the
    last step), comm (ring bytes and call counts of the last step), shards (elements per unit on
    this rank) and padding (zero elements per unit), timeline (last step, if recorded).
    """
    x, y = backend.to_device(make_batches(sizes, seed, n_steps, world_size, micro_batch))
    log = CommLog(world_size)
    engine = ZeroDP(make_mlp(sizes, seed).to(backend.device()), stage, lr=lr,
                    reduce_dtype=reduce_dtype, prefetch=prefetch, log=log)
    losses = []
    for step in range(n_steps):
        log.clear()
        if record_timeline and step == n_steps - 1:
            engine.timeline = []
        local = torch.tensor([engine.step(x[step, rank], y[step, rank])], dtype=torch.float64,
                             device=x.device)
        dist.all_reduce(local)  # for reporting only: not part of the algorithm, not logged
        losses.append(local.item() / world_size)
    params = [backend.to_cpu(p.float()).numpy() for p in engine.full_parameters()]
    return {"losses": losses, "params": params, "bytes": engine.state_bytes(),
            "comm": log.ring_bytes(), "comm_counts": log.counts(),
            "shards": [u.shard if stage else u.n for u in engine.units],
            "padding": [u.padded - u.n if stage else 0 for u in engine.units],
            "timeline": engine.timeline}


def all_stages_worker(rank: int, world_size: int, sizes: Sequence[int], seed: int = 0,
                      n_steps: int = 3, micro_batch: int = 4, lr: float = 1e-2,
                      reduce_dtype: str = "bf16") -> dict[Any, dict[str, Any]]:
    """:func:`train_worker` for stages 0-3 (2 and 3 with their memory timelines) and for ZeRO-3
    with prefetch (key ``"3+prefetch"``), one after another in the same process group."""
    out: dict[Any, dict[str, Any]] = {}
    for stage in STAGES:
        out[stage] = train_worker(rank, world_size, stage, sizes, seed, n_steps, micro_batch, lr,
                                  reduce_dtype, record_timeline=stage >= 2)
    out["3+prefetch"] = train_worker(rank, world_size, 3, sizes, seed, n_steps, micro_batch, lr,
                                     reduce_dtype, prefetch=True, record_timeline=True)
    return out


def run_all_stages(dp: int, sizes: Sequence[int], seed: int = 0, n_steps: int = 3,
                   micro_batch: int = 4, lr: float = 1e-2, reduce_dtype: str = "bf16",
                   timeout_s: float = 180.0) -> dict[Any, list[dict[str, Any]]]:
    """Launch :func:`all_stages_worker` on ``dp`` ranks; results as ``{stage: [rank 0, rank 1, ...]}``."""
    from course_utils import launch

    validate.check_int("dp", dp, 1)
    check_sizes(sizes)
    validate.one_of("reduce_dtype", reduce_dtype, REDUCE_DTYPES)
    by_rank = launch.run(all_stages_worker, dp, list(sizes), seed, n_steps, micro_batch, lr,
                         reduce_dtype, timeout_s=timeout_s)
    return {key: [r[key] for r in by_rank] for key in by_rank[0]}


def reference_train(sizes: Sequence[int], seed: int = 0, n_steps: int = 3, dp: int = 2,
                    micro_batch: int = 4, lr: float = 1e-2,
                    reduce_dtype: str = "bf16") -> dict[str, Any]:
    """The unsharded single-process reference: one bf16 model, MixedPrecisionAdam, same data.

    Each step runs the ``dp`` micro-batches one after another, sums their bf16 gradients in
    ``reduce_dtype`` in rank order, divides by ``dp`` and rounds to bf16: data parallelism's
    mean gradient. Returns losses (per step, mean over micro-batches) and params.
    """
    reduce = validate.one_of("reduce_dtype", reduce_dtype, REDUCE_DTYPES)
    x, y = make_batches(sizes, seed, n_steps, dp, micro_batch)
    model = make_mlp(sizes, seed)
    opt = memory.MixedPrecisionAdam(model, lr=lr)
    params = list(model.parameters())
    losses = []
    for step in range(n_steps):
        total = [torch.zeros(p.shape, dtype=reduce) for p in params]
        step_losses = []
        for r in range(dp):
            opt.zero_grad()
            loss = mse_loss(model(x[step, r]), y[step, r])
            loss.backward()
            step_losses.append(loss.item())
            for acc, p in zip(total, params):
                acc += p.grad.to(reduce)
        for acc, p in zip(total, params):
            p.grad = (acc / dp).to(torch.bfloat16)
        opt.step()
        losses.append(sum(step_losses) / dp)
    return {"losses": losses, "params": [p.detach().clone() for p in params]}


def sum_rounding_error(n_ranks: int, reduce_dtype: str, numel: int = 4096,
                       seed: int = 0) -> float:
    """Relative error of a data-parallel mean gradient whose sum is taken in ``reduce_dtype``.

    ``n_ranks`` bf16 gradients (``numel`` standard-normal elements each, from ``seed``) are added
    one rank at a time in ``reduce_dtype``, as a ring adds partial sums (each addition rounds to
    that dtype), divided by ``n_ranks`` and rounded to bf16, the dtype the gradient is stored in.
    Returns mean |result - exact mean| / mean |exact mean|, the exact mean computed in float64.
    """
    validate.check_int("n_ranks", n_ranks, 1)
    validate.check_int("numel", numel, 1)
    reduce = validate.one_of("reduce_dtype", reduce_dtype, REDUCE_DTYPES)
    g = torch.randn(n_ranks, numel, generator=torch.Generator().manual_seed(seed)).bfloat16()
    total = torch.zeros(numel, dtype=reduce)                  # (numel,) the running partial sum
    exact = torch.zeros(numel, dtype=torch.float64)
    for row in g:                                             # rank by rank, in order
        total = total + row.to(reduce)
        exact = exact + row.double()
    mean = (total / n_ranks).to(torch.bfloat16).double()
    exact = exact / n_ranks
    return ((mean - exact).abs().mean() / exact.abs().mean()).item()


def max_abs_diff(params: Sequence[Any], reference: Sequence[torch.Tensor]) -> float:
    """Largest |a - b| over two lists of same-shaped parameters (tensors or numpy arrays)."""
    if len(params) != len(reference):
        raise ValueError(f"params and reference must have the same length; got "
                         f"{len(params)} and {len(reference)}")
    worst = 0.0
    for a, b in zip(params, reference):
        a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
        if a.shape != b.shape:
            raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
        worst = max(worst, (a - b).abs().max().item())
    return worst


def _torchrun_worker(rank: int, world_size: int) -> dict[str, int]:
    out = {}
    for stage in STAGES:
        result = train_worker(rank, world_size, stage, [16, 32, 32, 8], n_steps=2)
        out[STAGE_NAMES[stage]] = result["bytes"]["total"]
    return out


if __name__ == "__main__":
    # torchrun --standalone --nproc-per-node N -m course_utils.zero.training
    from course_utils import launch

    launch.torchrun_main(_torchrun_worker)

"""The real sharding APIs beside the from-scratch ZeRO of :mod:`course_utils.zero.engine`.

* ``torch.distributed.optim.ZeroRedundancyOptimizer`` (ZeRO-1): each rank keeps optimizer state
  only for the parameters assigned to it. It assigns *whole parameters* (greedily, largest
  first), so the shards are uneven, unlike a flat buffer cut into equal slices.
* FSDP2 ``torch.distributed.fsdp.fully_shard`` (ZeRO-3): every parameter is a DTensor split by
  rows (``Shard(0)``) over the ranks. ``reshard_after_forward=True`` frees the gathered weights
  after forward and all-gathers them again for backward (ZeRO-3's schedule);
  ``reshard_after_forward=False`` keeps them from forward to backward (one all-gather fewer, the
  full weights held through the step, as ZeRO-2 holds them).

Each worker trains :func:`course_utils.zero.mlp.make_mlp` (cast to fp32, or with FSDP2's bf16
``MixedPrecisionPolicy``) on the same data as the from-scratch engine and reports measured
bytes, so the two can be compared. Lecture 3 (ZeRO and FSDP).

Run under torchrun::

    torchrun --standalone --nproc-per-node 2 -m course_utils.zero.fsdp
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from course_utils.collectives import recorder
from course_utils.runtime import backend
from course_utils.memory import sizing as memory
from course_utils.zero.mlp import make_batches, make_mlp
from course_utils.zero.units import storage_bytes

__all__ = ["zero_redundancy_worker", "fsdp2_worker", "reference_adam", "reduce_dtype_worker"]


def _quiet() -> None:
    """Silence the user warnings FSDP2/DDP print on CPU toy models (they are not errors here)."""
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


def _data(sizes: Sequence[int], seed: int, n_steps: int, dp: int,
          micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = make_batches(sizes, seed, n_steps, dp, micro_batch)
    return x.float(), y  # (n_steps, dp, micro_batch, in) fp32, (..., out) fp32


def reference_adam(sizes: Sequence[int], seed: int = 0, n_steps: int = 3, dp: int = 2,
                   micro_batch: int = 4, lr: float = 1e-2) -> dict[str, Any]:
    """Single-process fp32 reference: :func:`make_mlp` in fp32, Adam, mean of micro-batch losses."""
    x, y = _data(sizes, seed, n_steps, dp, micro_batch)
    model = make_mlp(sizes, seed).float()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for step in range(n_steps):
        opt.zero_grad()
        per_rank = [F.mse_loss(model(x[step, r]), y[step, r]) for r in range(dp)]
        loss = torch.stack(per_rank).mean()  # equal micro-batches: the global mean loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "params": [p.detach().clone() for p in model.parameters()]}


def _mean_loss(loss: torch.Tensor, world_size: int) -> float:
    t = loss.detach().double().reshape(1)
    dist.all_reduce(t)
    return t.item() / world_size


def zero_redundancy_worker(rank: int, world_size: int, sizes: Sequence[int], seed: int = 0,
                           n_steps: int = 3, micro_batch: int = 4,
                           lr: float = 1e-2) -> dict[str, Any]:
    """DDP + ZeroRedundancyOptimizer(Adam) on an fp32 MLP; this dp rank's measured shard.

    Returns losses, params (fp32 numpy), owned (names of the parameters whose Adam state this
    rank keeps), owned_numel, adam_bytes (moments this rank holds, measured) and
    counter_bytes (Adam's step counters).
    """
    _quiet()
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    x, y = backend.to_device(_data(sizes, seed, n_steps, world_size, micro_batch))
    model = make_mlp(sizes, seed).float().to(backend.device())
    names = {id(p): n for n, p in model.named_parameters()}
    ddp = DDP(model)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=lr)
    losses = []
    for step in range(n_steps):
        opt.zero_grad()
        loss = F.mse_loss(ddp(x[step, rank]), y[step, rank])
        loss.backward()
        opt.step()
        losses.append(_mean_loss(loss, world_size))
    local = opt.optim  # the Adam that runs on this rank's parameters only
    owned = [p for group in local.param_groups for p in group["params"]]
    moments, counters = [], []
    for state in local.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                (moments if value.dim() > 0 else counters).append(value)
    return {"losses": losses,
            "params": [backend.to_cpu(p.detach().float()).numpy().copy()
                       for p in model.parameters()],
            "owned": [names[id(p)] for p in owned],
            "owned_numel": sum(p.numel() for p in owned),
            "adam_bytes": storage_bytes(moments, set()),
            "counter_bytes": storage_bytes(counters, set())}


def _param_bytes(module: nn.Module) -> int:
    """Bytes of the weights a module holds now: the local shard of a DTensor, else the full tensor."""
    tensors = [p.to_local() if hasattr(p, "to_local") else p
               for p in (module.weight, module.bias)]
    return storage_bytes(tensors, set())


def fsdp2_worker(rank: int, world_size: int, sizes: Sequence[int], seed: int = 0,
                 reshard_after_forward: bool = True, n_steps: int = 3, micro_batch: int = 4,
                 lr: float = 1e-2, mixed_precision: bool = False) -> dict[str, Any]:
    """FSDP2 ``fully_shard`` per Linear, then the root; Adam; this dp rank's measurements.

    ``mixed_precision``: bf16 compute with fp32 gradient reduction (``MixedPrecisionPolicy``).
    Returns losses, params (full fp32 numpy), local_shapes (shard shape per parameter), bytes
    (``memory.count_state_bytes`` after the last step: sharded weights, grads, Adam state),
    held_after_forward (weight bytes held between forward and backward, last step) and
    comm_counts (all-gathers and reduce-scatters in the last step, from ``CommDebugMode``).
    """
    _quiet()
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor.debug import CommDebugMode

    if reshard_after_forward not in (True, False):
        raise ValueError(f"reshard_after_forward must be True or False; got {reshard_after_forward!r}")
    x, y = backend.to_device(_data(sizes, seed, n_steps, world_size, micro_batch))
    model = make_mlp(sizes, seed).float().to(backend.device())
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if mixed_precision else MixedPrecisionPolicy())
    linears = [m for m in model if isinstance(m, nn.Linear)]
    for layer in linears:
        fully_shard(layer, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    fully_shard(model, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses, held, counts = [], 0, {}
    for step in range(n_steps):
        opt.zero_grad()
        comm = CommDebugMode()
        with comm:
            out = model(x[step, rank])
            held = sum(_param_bytes(layer) for layer in linears)
            loss = F.mse_loss(out.float(), y[step, rank])
            loss.backward()
        opt.step()
        counts = {str(k).split(".")[-1]: v for k, v in comm.get_comm_counts().items()}
        losses.append(_mean_loss(loss, world_size))
    local_shapes = {n: tuple(p.to_local().shape) for n, p in model.named_parameters()}
    params = [backend.to_cpu(p.full_tensor().detach().float()).numpy().copy()
              for p in model.parameters()]
    return {"losses": losses, "params": params, "local_shapes": local_shapes,
            "bytes": memory.count_state_bytes(model, opt), "held_after_forward": held,
            "comm_counts": {"all_gather": counts.get("_allgather_base_", 0),
                            "reduce_scatter": counts.get("_reduce_scatter_base_", 0)}}


def reduce_dtype_worker(rank: int, world_size: int) -> dict[str, list[str]]:
    """The dtype FSDP2's gradient reduce-scatter runs in, for an fp32 ``nn.Linear`` under three
    ``MixedPrecisionPolicy`` settings: the default, ``param_dtype=bf16`` alone, and
    ``param_dtype=bf16, reduce_dtype=fp32``. Returns {setting: [dtype of each reduce-scatter]}."""
    _quiet()
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    settings = {"default": MixedPrecisionPolicy(),
                "param_dtype=bf16": MixedPrecisionPolicy(param_dtype=torch.bfloat16),
                "param_dtype=bf16, reduce_dtype=fp32": MixedPrecisionPolicy(
                    param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}
    out: dict[str, list[str]] = {}
    for name, policy in settings.items():
        torch.manual_seed(0)
        model = nn.Linear(4, 4).to(backend.device())
        fully_shard(model, mp_policy=policy)
        with recorder.record() as calls:
            model(torch.randn(2, 4, device=backend.device())).float().sum().backward()
        out[name] = [str(c.dtype).removeprefix("torch.") for c in calls
                     if c.api == "reduce_scatter_single"]
    return out


def _torchrun_worker(rank: int, world_size: int) -> dict[str, Any]:
    result = fsdp2_worker(rank, world_size, [16, 32, 32, 8], n_steps=2)
    return {"bytes": result["bytes"], "comm_counts": result["comm_counts"]}


if __name__ == "__main__":
    # torchrun --standalone --nproc-per-node N -m course_utils.zero.fsdp
    from course_utils import launch

    launch.torchrun_main(_torchrun_worker)

"""The simulation checked against real ranks (module 11).

:func:`real_rank_worker` runs on real gloo (or NCCL) ranks through ``launch.run``: it shards a
small Llama-shaped model exactly as ``scale_memory.shard_stage`` does, runs a step's forwards
and backwards (one microbatch, or several with gradients accumulated) while
:class:`scale_comms.CollectiveLog` records every collective, and returns the bytes its sharded
tensors hold (the gradients measured after the backward, as distinct storages) and its
collectives by mesh axis. :func:`simulated` computes the same for a rank
from the fake process group; :func:`compare` lists every difference (none expected).

Run it on any number of ranks (DP over all of them) with::

    torchrun --standalone --nproc-per-node 2 -m course_utils.scale.check
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from course_utils import launch
from course_utils.scale import comms as scale_comms
from course_utils.scale import memory as scale_memory

__all__ = ["real_rank_worker", "tp_plan_worker", "simulated", "compare", "check"]


def _grad_bytes(module: torch.nn.Module) -> int:
    seen, total = set(), 0
    for p in module.parameters():
        g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        storage = g.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def real_rank_worker(rank: int, world_size: int, model: str = "tiny", tp: int = 1, pp: int = 1,
                     dp: int | None = None, batch: int = 2, seq: int = 8, microbatches: int = 1,
                     reshard_after_forward: bool = True) -> dict[str, Any]:
    """One rank's measured bytes and collectives (fp32) after a step of ``microbatches``
    forwards and backwards (``scale_comms.accumulate``)."""
    dp = dp or world_size // (tp * pp)
    torch.manual_seed(rank)
    module, mesh = scale_memory.shard_stage(model, tp, pp, dp,
                                            reshard_after_forward=reshard_after_forward)
    log = scale_comms.CollectiveLog()
    with log:
        for i in range(microbatches):
            scale_comms.accumulate(module, i, microbatches)
            scale_comms.one_step(module, model, batch, seq, mixed=False)
    grads = _grad_bytes(module)
    state = scale_memory.state_bytes(module)
    rows = scale_comms.summarize(log.calls, scale_comms.axis_names(mesh))
    return {"weights": state["weights"], "grads": grads, "optimizer": state["optimizer"],
            "rows": {f"{a} {k}": (int(v[0]), int(v[1])) for (a, k), v in sorted(rows.items())}}


def tp_plan_worker(rank: int, world_size: int, tp_plan: str, seed: int = 0,
                   model: str = "tiny", batch: int = 2, seq: int = 8) -> dict[str, Any]:
    """Collective: the whole model (one stage) tensor-parallel over every rank under
    ``tp_plan``, against the same model in this process unsharded: the loss and each
    parameter's gradient (gathered whole), and the TP collectives of the step by kind."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh

    from course_utils.models import llama_shapes
    from course_utils.models.toy import seeded
    from course_utils.runtime import backend

    on = backend.device()
    with seeded(seed):
        reference = llama_shapes.build(model, device=on)
    module = copy.deepcopy(reference)
    llama_shapes.apply_tp(module, init_device_mesh(on.type, (world_size,)), tp_plan)
    vocab = llama_shapes.shape(model).vocab
    ids = torch.randint(0, vocab, (batch, seq),
                        generator=torch.Generator().manual_seed(100 + seed)).to(on)
    ref_loss = reference(ids).float().pow(2).mean()
    ref_loss.backward()
    log = scale_comms.CollectiveLog()
    with log:      # the logits stay split by vocabulary: the loss adds up over the slices
        local = module(ids).float().pow(2).sum() / (ids.numel() * vocab)
        local.backward()
    loss = local.detach().clone()
    torch.distributed.all_reduce(loss)
    ref_grads = dict(reference.named_parameters())
    grads = {name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad,
                    ref_grads[name].grad) for name, p in module.named_parameters()}
    return {"loss": (float(loss), float(ref_loss.detach())), "grads": grads,
            "collectives": dict(Counter(kind for kind, *_ in log.calls))}


def simulated(rank: int, model: str = "tiny", tp: int = 1, pp: int = 1, dp: int = 1,
              batch: int = 2, seq: int = 8, microbatches: int = 1,
              reshard_after_forward: bool = True) -> dict[str, Any]:
    """The same rank's figures from the fake process group (every layer traced, fp32)."""
    state = scale_memory.rank_state(model, tp, pp, dp, rank)
    trace = scale_comms.trace_step(model, tp, pp, dp, rank, batch, seq, full=True, mixed=False,
                                   microbatches=microbatches,
                                   reshard_after_forward=reshard_after_forward)
    rows = {f"{a} {k}": (v["calls"], int(v["buffer"]))
            for (a, k), v in sorted(trace["rows"].items())}
    return {"weights": state["weights"], "grads": state["grads"],
            "optimizer": state["optimizer"], "rows": rows}


def compare(real: list[dict], sims: list[dict]) -> list[str]:
    """Every (rank, quantity) where the measured and the simulated figures differ."""
    out = []
    for rank, (r, s) in enumerate(zip(real, sims)):
        for key in ("weights", "grads", "optimizer", "rows"):
            if r[key] != s[key]:
                out.append(f"rank {rank} {key}: measured {r[key]}, simulated {s[key]}")
    return out


def check(tp: int, pp: int, dp: int, model: str = "tiny", timeout_s: float = 120.0,
          microbatches: int = 1, reshard_after_forward: bool = True
          ) -> tuple[list[dict], list[dict], list[str]]:
    """Run :func:`real_rank_worker` on ``tp * pp * dp`` real ranks and :func:`simulated` for
    each; return (measured, simulated, differences)."""
    import functools

    world = tp * pp * dp
    step = dict(microbatches=microbatches, reshard_after_forward=reshard_after_forward)
    real = launch.run(functools.partial(real_rank_worker, model=model, tp=tp, pp=pp, dp=dp,
                                        **step),
                      world, timeout_s=timeout_s, threads_per_rank=1, show_output=False)
    sims = [simulated(r, model, tp, pp, dp, **step) for r in range(world)]
    return real, sims, compare(real, sims)


def _torchrun_worker(rank: int, world_size: int) -> str:
    real = real_rank_worker(rank, world_size)
    return f"{real['weights'] + real['grads'] + real['optimizer']} bytes, {real['rows']}"


if __name__ == "__main__":
    launch.torchrun_main(_torchrun_worker)

"""The DP x PP x TP plan of :mod:`course_utils.trainer3d.train`, built from PyTorch's own parts.

* the groups: ``init_device_mesh(device, (dp, pp, tp), mesh_dim_names=("dp", "pp", "tp"))``,
  whose groups each rank returns, to be checked against the hand-built rank grid;
* TP: DTensor's ``parallelize_module`` with ``ColwiseParallel`` on q/k/v and the MLP's first
  linear, ``RowwiseParallel`` on the attention output and the MLP's second linear (module 4);
* PP: ``torch.distributed.pipelining``'s ``PipelineStage`` and ``Schedule1F1B`` (module 5);
* DP: FSDP2's ``fully_shard`` over the "dp" sub-mesh. FSDP2 shards the weights too (ZeRO-3,
  module 3), where the hand-built trainer reduce-scatters the gradients in buckets and shards
  only the optimizer's state (ZeRO-1). The update is the same Adam on the same averaged and
  clipped gradients (:func:`_clip`, torchtitan's recipe), so the numbers must agree.

Two parts of the hand-built plan are left out here: the vocabulary split and sequence
parallelism (torchtitan's DTensor plan for both is ``set_decoder_sharding_config`` in
``torchtitan/models/common/decoder_sharding.py``: the embedding and the head ``Shard(0)``, the
norms on ``Shard(1)`` of the sequence). Their arithmetic is the same one process's, which is
what both versions are compared with.

``ColwiseParallel`` gives TP rank r a contiguous block of the fused q/k/v projection's output
features. TinyLM orders them [q | k | v]; with 2 ranks the first half of that is all of q and
the first half of k, not "rank 0's heads of q, k and v". So :func:`qkv_for_tp` reorders the
rows once, [q_0 k_0 v_0 | q_1 k_1 v_1 | ...] (rank r's heads of each), and the block reads its
local head count from the tensor it gets (``heads = width // head_dim``), as torchtitan's
attention does ("Use -1 instead of n_heads (or n_kv_heads) to infer the actual local heads from
sizes as TP may have sharded them": ``QKVLinear.forward`` in
``torchtitan/models/common/attention.py``, line 698 at commit b5bcd76, August 2026).
:func:`full_weights` undoes the reordering, so weights are compared in TinyLM's own names and
layout; each rank also returns its groups under ``init_device_mesh`` and the rows
``ColwiseParallel`` leaves it of a fused q/k/v weight.
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_utils.models.tiny_lm import MarkovCorpus, TinyLMConfig, build, shard_batch
from course_utils.runtime import backend
from course_utils.trainer3d.check import TOLERANCES, reference_train, replica_losses
from course_utils.trainer3d.plan import Plan
from course_utils.trainer3d.stage_model import Stage, logits_loss
from course_utils.trainer3d.train import train_worker

__all__ = ["qkv_for_tp", "torch_stage", "torch_train_worker", "run", "both_worker", "run_both",
           "full_weights", "check_against_reference"]


def qkv_for_tp(w: torch.Tensor, d: int, tp: int) -> torch.Tensor:
    """Rows (or entries) of a fused [q | k | v] projection reordered to [q_r k_r v_r] per rank.

    ``w``: (3d, d) weight or (3d,) bias. :func:`_qkv_from_tp` undoes it.
    """
    q, k, v = w.split(d)                                           # 3 x (d, ...)
    parts = [z.chunk(tp) for z in (q, k, v)]                       # 3 x tp x (d/tp, ...)
    return torch.cat([torch.cat([q_r, k_r, v_r]) for q_r, k_r, v_r in zip(*parts)])


def _qkv_from_tp(w: torch.Tensor, d: int, tp: int) -> torch.Tensor:
    per_rank = w.chunk(tp)                                         # tp x (3d/tp, ...)
    q, k, v = zip(*(r.chunk(3) for r in per_rank))
    return torch.cat([torch.cat(q), torch.cat(k), torch.cat(v)])


class _Block(nn.Module):
    """TinyLM's block, whose attention takes its head count from the (local) q/k/v width."""

    def __init__(self, cfg: TinyLMConfig):
        super().__init__()
        d = cfg.d_model
        self.head_dim = d // cfg.n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, cfg.d_ff), nn.Linear(cfg.d_ff, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape                                               # (B, T, D)
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)                # 3 x (B, T, D/tp)
        heads = q.shape[-1] // self.head_dim                            # this rank's heads
        q, k, v = (z.reshape(b, t, heads, self.head_dim).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)      # (B, heads, T, hd)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, heads * self.head_dim))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))             # (B, T, D)


def torch_stage(cfg: TinyLMConfig, pp_rank: int, pp_size: int) -> Stage:
    """Stage ``pp_rank`` of TinyLM with plain layers (DTensor splits them afterwards)."""
    return Stage(cfg, pp_rank, pp_size, block=_Block)


def _load(stage: Stage, cfg: TinyLMConfig, seed: int, tp: int) -> None:
    full = build(cfg, seed).state_dict()
    mine = {}
    for name in stage.state_dict():
        value = full[name]
        if name.endswith("qkv.weight") or name.endswith("qkv.bias"):
            value = qkv_for_tp(value, cfg.d_model, tp)
        mine[name] = value
    stage.load_state_dict(mine)


def full_weights(stage: nn.Module, cfg: TinyLMConfig, tp: int) -> dict[str, Any]:
    """Collective (over the stage's DP x TP ranks): the stage's whole weights, TinyLM layout."""
    out = {}
    for name, p in stage.named_parameters():
        value = p.full_tensor() if hasattr(p, "full_tensor") else p
        value = value.detach()
        if name.endswith("qkv.weight") or name.endswith("qkv.bias"):
            value = _qkv_from_tp(value, cfg.d_model, tp)
        out[name] = backend.to_cpu(value).numpy().copy()
    return out


def torch_train_worker(rank: int, world_size: int, plan: Plan) -> dict[str, Any]:
    """One rank of ``plan`` on DeviceMesh + DTensor TP + pipelining 1F1B + FSDP2 + Adam."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    # FSDP2 warns that the last stage returns a view (nothing here modifies it in place), and
    # DTensor that gathering a 2-D-sharded weight takes two all-gathers (done once, at the end).
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module", category=UserWarning)
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    dev = backend.device()
    mesh = init_device_mesh(dev.type, (plan.dp, plan.pp, plan.tp),
                            mesh_dim_names=("dp", "pp", "tp"))
    dp_rank, pp_rank = mesh["dp"].get_local_rank(), mesh["pp"].get_local_rank()
    stage = torch_stage(plan.cfg, pp_rank, plan.pp)
    _load(stage, plan.cfg, plan.seed, plan.tp)
    stage.to(dev)
    for block in stage.blocks.values():
        parallelize_module(block, mesh["tp"], {"qkv": ColwiseParallel(),
                                               "proj": RowwiseParallel(),
                                               "fc1": ColwiseParallel(),
                                               "fc2": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(stage, mesh=mesh["dp"])
    pipe_stage = PipelineStage(stage, pp_rank, plan.pp, dev, group=mesh["pp"].get_group())
    schedule = Schedule1F1B(pipe_stage, n_microbatches=plan.m, loss_fn=logits_loss)
    opt = torch.optim.Adam(stage.parameters(), lr=plan.lr, eps=plan.eps)
    corpus = MarkovCorpus(plan.cfg.vocab_size, seed=plan.seed)
    losses = []
    for step in range(plan.steps):
        x, y = corpus.batch(step, plan.batch, plan.cfg.seq_len)                # (B, T) each
        x, y = (backend.to_device(shard_batch(t, dp_rank, plan.dp)) for t in (x, y))
        mb_losses: list[torch.Tensor] = []
        if stage.first and stage.last:
            schedule.step(x, target=y, losses=mb_losses)
        elif stage.first:
            schedule.step(x)
        elif stage.last:
            schedule.step(target=y, losses=mb_losses)
        else:
            schedule.step()
        if plan.clip is not None:
            _clip(stage, plan.clip, mesh["pp"].get_group())
        opt.step()
        opt.zero_grad()
        losses.append(torch.stack(mb_losses).mean().item() if stage.last else None)
    return {"coords": (dp_rank, pp_rank, mesh["tp"].get_local_rank()), "losses": losses,
            "weights": full_weights(stage, plan.cfg, plan.tp),
            "groups": {axis: dist.get_process_group_ranks(mesh[axis].get_group())
                       for axis in ("dp", "pp", "tp")},
            "colwise_rows": _colwise_rows(mesh["tp"])}


def _clip(stage: nn.Module, max_norm: float, pp_group: Any) -> float:
    """Clip the stage's gradients by the whole model's norm, as torchtitan's
    ``clip_grad_norm_`` does (``torchtitan/distributed/utils.py``: ``get_total_norm`` of the
    stage's DTensor gradients, one per mesh here, then its square summed over the PP group),
    with torch's rule
    (``torch/nn/utils/clip_grad.py``): multiply by min(max_norm / (norm + 1e-6), 1)."""
    by_mesh: dict[Any, list[torch.Tensor]] = {}   # FSDP2 x TP gradients: (dp, tp) or (dp,)
    for p in stage.parameters():
        by_mesh.setdefault(getattr(p.grad, "device_mesh", None), []).append(p.grad)
    sq = torch.zeros((), device=backend.device())
    for grads in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(grads)       # a DTensor: partial over its mesh
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        sq += norm.float() ** 2
    dist.all_reduce(sq, group=pp_group)
    norm = float(sq.sqrt())
    coef = min(max_norm / (norm + 1e-6), 1.0)
    for p in stage.parameters():
        p.grad.mul_(coef)
    return norm


def both_worker(rank: int, world_size: int, plans: Sequence[Plan],
                torch_plan: Plan) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One rank: the hand-built trainer on each of ``plans`` (:func:`course_utils.trainer3d.train.
    train_worker`), then ``torch_plan`` with PyTorch's parts, in one launch."""
    return train_worker(rank, world_size, list(plans)), torch_train_worker(rank, world_size,
                                                                           torch_plan)


def run_both(plans: Sequence[Plan], torch_plan: Plan, timeout_s: float = 300.0
             ) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """:func:`both_worker` on real ranks (every plan on the same number of ranks): per plan, each
    rank's hand-built result; then each rank's PyTorch-parts result."""
    from course_utils import launch

    plans = list(plans)
    if not plans or not all(isinstance(p, Plan) for p in plans + [torch_plan]):
        raise ValueError("plans must be a non-empty list of train3d.Plan, torch_plan a Plan")
    if len({p.world_size for p in plans + [torch_plan]}) > 1:
        raise ValueError("every plan of one launch must need the same number of ranks")
    per_rank = launch.run(functools.partial(both_worker, plans=plans, torch_plan=torch_plan),
                          torch_plan.world_size, timeout_s=timeout_s, threads_per_rank=1)
    return [[r[0][i] for r in per_rank] for i in range(len(plans))], [r[1] for r in per_rank]


def run(plan: Plan, timeout_s: float = 180.0) -> list[dict[str, Any]]:
    """Train ``plan`` with PyTorch's parts on real ranks; each rank's result."""
    from course_utils import launch

    if not isinstance(plan, Plan):
        raise ValueError(f"plan must be a train3d.Plan; got {type(plan).__name__}")
    return launch.run(functools.partial(torch_train_worker, plan=plan), plan.world_size,
                      timeout_s=timeout_s, threads_per_rank=1)


def check_against_reference(plan: Plan, results: Sequence[dict[str, Any]],
                            ref: dict[str, Any] | None = None) -> dict[str, float]:
    """Assert the losses and every rank's (gathered) final weights equal the one-process run's,
    within ``train3d_check.TOLERANCES``; returns the largest absolute differences."""
    ref = ref or reference_train(plan)
    losses = replica_losses(plan, results)
    rtol, atol = TOLERANCES["losses"]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref["losses"]), rtol=rtol,
                               atol=atol, msg=lambda s: f"losses: {s}")
    worst = {"loss": max(abs(a - b) for a, b in zip(losses, ref["losses"])), "weights": 0.0}
    rtol, atol = TOLERANCES["weights"]
    for r in results:
        for name, value in r["weights"].items():
            got, want = torch.as_tensor(value), ref["weights"][name]
            torch.testing.assert_close(got, want, rtol=rtol, atol=atol,
                                       msg=lambda s, n=name: f"rank {r['coords']}, {n}: {s}")
            worst["weights"] = max(worst["weights"], float((got - want).abs().max()))
    return worst


def _colwise_rows(mesh: Any, d: int = 4) -> list[int]:
    """The rows of a fused (3d, d) q/k/v weight that ``ColwiseParallel`` over ``mesh`` leaves on
    this rank (each row filled with its own index, then read back from the local shard)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    qkv = nn.Linear(d, 3 * d)
    with torch.no_grad():
        qkv.weight.copy_(torch.arange(3 * d, dtype=torch.float32)[:, None].expand(3 * d, d))
    parallelize_module(qkv, mesh, ColwiseParallel())
    return [int(v) for v in qkv.weight.to_local()[:, 0].tolist()]

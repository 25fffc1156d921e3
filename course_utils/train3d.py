"""Putting it together: TinyLM trained on a DP x PP x TP mesh, checked against one process.

Every rank of a ``dp * pp * tp`` job finds its coordinates on one rank grid
(:class:`course_utils.mesh.Mesh`, TP innermost) and builds its groups from it
(:func:`build_groups`). Rank (dp_rank, pp_rank, tp_rank) then holds
:func:`course_utils.stage_model.build_stage`'s piece of the model, and one training step
(:func:`train_step`) is:

1. **PP, 1F1B** (module 5): the DP replica's rows are cut into ``m`` microbatches; the rank runs
   :func:`course_utils.pipeline_schedule.schedule_order`'s 1F1B order, receiving activations from
   ``pp_prev_rank`` and gradients from ``pp_next_rank`` (``dist.recv``; sends are ``isend``).
   The last stage's loss is each microbatch's mean cross-entropy divided by ``m``.
2. **TP inside every block** (module 4): the stage's layers issue their own all-reduces over
   ``tp_group`` (one forward, one backward, per attention and per MLP).
3. **DP, bucketed and overlapped** (module 9): :class:`course_utils.overlap.BucketAllReduce`
   over ``dp_group`` stays off for the first ``m - 1`` backward passes (gradients accumulate
   locally, as under DDP's ``no_sync``) and starts each bucket's all-reduce during the last
   one; ``finish`` waits and averages.
4. **ZeRO-1** (module 3): :class:`course_utils.zero1.ShardedAdam` updates this DP rank's shard
   and all-gathers the weights over ``dp_group``.

:mod:`course_utils.train3d_check` holds the one-process reference and the checks: each rank's
loss, first-step gradients and final weights against the slices
:func:`course_utils.stage_model.shard_state` cuts from the reference, and the persistent bytes
predicted from the sizes.

Run the same worker under torchrun (8 ranks: DP 2 x PP 2 x TP 2)::

    torchrun --standalone --nproc-per-node 8 -m course_utils.train3d
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_utils import backend, memory, tensor_parallel
from course_utils.measure import clock
from course_utils.mesh import Mesh, axis_group
from course_utils.overlap import BucketAllReduce
from course_utils.pipeline_schedule import schedule_order
from course_utils.stage_model import build_stage, check_coords
from course_utils.tiny_lm import MarkovCorpus, TinyLMConfig, shard_batch
from course_utils.validate import check_int, check_real
from course_utils.zero1 import ShardedAdam

__all__ = ["Plan", "Groups", "build_groups", "Timer", "train_step", "count_comms", "train_worker",
           "run"]


@dataclass(frozen=True)
class Plan:
    """A training run: mesh degrees, data and optimizer settings (counts; ``lr`` per step)."""

    dp: int = 2
    pp: int = 2
    tp: int = 2
    steps: int = 20
    batch: int = 16           # global batch (rows), split over DP, then into m microbatches
    m: int = 4                # microbatches per DP replica per step
    lr: float = 3e-3
    eps: float = 1e-8         # Adam's epsilon (torch.optim.Adam's default)
    seed: int = 0
    bucket_mb: float = 0.05   # DP gradient buckets (MiB): a few per stage at this size
    cfg: TinyLMConfig = TinyLMConfig()

    def __post_init__(self) -> None:
        for name in ("dp", "pp", "tp", "steps", "batch", "m"):
            check_int(name, getattr(self, name))
        check_int("seed", self.seed, 0)
        check_real("lr", self.lr)
        check_real("eps", self.eps)
        check_real("bucket_mb", self.bucket_mb)
        check_coords(self.cfg, 0, self.pp, 0, self.tp)
        if self.batch % (self.dp * self.m):
            raise ValueError(f"batch={self.batch} must divide into dp={self.dp} replicas of "
                             f"m={self.m} equal microbatches")

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def mesh(self) -> Mesh:
        return Mesh.from_degrees(dp=self.dp, pp=self.pp, tp=self.tp)

    @property
    def microbatch(self) -> int:
        return self.batch // (self.dp * self.m)


@dataclass
class Groups:
    """One rank's place in the mesh: coordinates, the DP and TP groups, its PP neighbours."""

    rank: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    dp_size: int
    pp_size: int
    tp_size: int
    dp_group: Any
    tp_group: Any
    pp_prev_rank: int | None   # global rank of the previous stage (same dp, tp), None on stage 0
    pp_next_rank: int | None   # ... of the next stage, None on the last

    @property
    def first(self) -> bool:
        return self.pp_rank == 0

    @property
    def last(self) -> bool:
        return self.pp_rank == self.pp_size - 1


def build_groups(mesh: Mesh, rank: int) -> Groups:
    """Collective: every rank creates every DP and TP group of ``mesh``; returns its own."""
    c = mesh.coords(rank)
    dp_group, _ = axis_group(mesh, rank, "dp")
    tp_group, _ = axis_group(mesh, rank, "tp")
    pp = mesh.size("pp")

    def neighbour(step: int) -> int | None:
        p = c["pp"] + step
        return mesh.rank_of(dp=c["dp"], pp=p, tp=c["tp"]) if 0 <= p < pp else None

    return Groups(rank, c["dp"], c["pp"], c["tp"], mesh.size("dp"), pp, mesh.size("tp"),
                  dp_group, tp_group, neighbour(-1), neighbour(+1))


class Timer:
    """Seconds one rank spends waiting on each kind of communication in a step."""

    def __init__(self) -> None:
        self.pp_wait = self.dp_wait = 0.0

    def recv(self, shape: tuple[int, ...], src: int, dev: torch.device) -> torch.Tensor:
        buf = torch.empty(shape, device=dev)
        t0 = clock(dev)
        dist.recv(buf, src=src)
        self.pp_wait += clock(dev) - t0
        return buf


def train_step(stage: torch.nn.Module, g: Groups, inputs: torch.Tensor, targets: torch.Tensor,
               m: int, optimizer: ShardedAdam, dp_sync: BucketAllReduce | None = None,
               timer: Timer | None = None) -> float | None:
    """One 1F1B step on this rank; returns the replica's mean loss on the last stage, else None.

    ``inputs``/``targets``: this DP replica's rows (b, T), cut here into ``m`` microbatches.
    ``dp_sync``: buckets all-reduced during the last backward; None: one all-reduce per
    gradient after it (no overlap).
    """
    timer = timer or Timer()
    dev = inputs.device
    x_mbs, y_mbs = inputs.chunk(m), targets.chunk(m)                   # m x (b/m, T)
    boundary = (x_mbs[0].shape[0], inputs.shape[1], stage.cfg.d_model)  # (b/m, T, D)
    saved_in: dict[int, torch.Tensor] = {}
    saved_out: dict[int, torch.Tensor] = {}
    sends = []
    loss = 0.0
    for kind, i, _chunk in schedule_order("1f1b", g.pp_size, m)[g.pp_rank]:
        if kind == "F":
            if g.first:
                x = x_mbs[i]
            else:
                x = timer.recv(boundary, g.pp_prev_rank, dev).requires_grad_(True)
            out = stage(x)                                              # (b/m, T, D) or (.., V)
            if g.last:
                out = F.cross_entropy(out.reshape(-1, out.shape[-1]), y_mbs[i].reshape(-1)) / m
                loss += out.item()
            else:
                act = out.detach()
                sends.append((dist.isend(act, dst=g.pp_next_rank), act))
            saved_in[i], saved_out[i] = x, out
        else:
            grad = None if g.last else timer.recv(boundary, g.pp_next_rank, dev)
            if dp_sync is not None:
                dp_sync.active = i == m - 1   # DP all-reduces start in the last backward only
            torch.autograd.backward(saved_out.pop(i), grad_tensors=grad)
            x = saved_in.pop(i)
            if not g.first:
                sends.append((dist.isend(x.grad, dst=g.pp_prev_rank), x.grad))
    for work, _ in sends:
        work.wait()
    t0 = clock(dev)
    if dp_sync is not None:
        dp_sync.finish()                  # wait for the buckets still in flight, average
    else:
        for p in stage.parameters():      # sum over the replicas, then the mean
            dist.all_reduce(p.grad, group=g.dp_group)
            p.grad.div_(g.dp_size)
    timer.dp_wait += clock(dev) - t0
    optimizer.step()                      # ZeRO-1: my shard, then all-gather over DP
    return loss if g.last else None


@contextlib.contextmanager
def count_comms(g: Groups) -> Iterator[dict[str, int]]:
    """Count this process's calls while the block runs: point-to-point (``send``, ``recv``,
    ``isend``, ``irecv``) and ``all_reduce`` / ``all_gather`` by group ("tp", "dp" or "other"),
    with the bytes of the TP all-reduces (``tp_bytes``). Read by wrapping ``torch.distributed``'s
    functions, so it sees every caller: the layers, the step, the optimizer."""
    counts = dict.fromkeys(("send", "recv", "isend", "irecv", "tp_bytes"), 0)
    names = {id(g.tp_group): "tp", id(g.dp_group): "dp"}
    real = {name: getattr(dist, name) for name in
            ("send", "recv", "isend", "irecv", "all_reduce", "all_gather")}

    def counted(name):
        def call(*args, **kwargs):
            if name in ("all_reduce", "all_gather"):
                group = kwargs.get("group", args[2] if len(args) > 2 else None)
                key = f"{name}_{names.get(id(group), 'other')}"
                counts[key] = counts.get(key, 0) + 1
                if key == "all_reduce_tp":
                    counts["tp_bytes"] += args[0].numel() * args[0].element_size()
            else:
                counts[name] += 1
            return real[name](*args, **kwargs)
        return call
    for name in real:
        setattr(dist, name, counted(name))
    try:
        yield counts
    finally:
        for name, fn in real.items():
            setattr(dist, name, fn)


def _numpy(tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {k: backend.to_cpu(v.detach()).numpy().copy() for k, v in tensors.items()}


def train_worker(rank: int, world_size: int, plan: Plan, step_fn=None, f=None) -> dict[str, Any]:
    """One rank of ``plan``: trains, returns losses, first-step grads, final weights, bytes, times.

    ``step_fn(stage, g, inputs, targets, m, optimizer)`` replaces :func:`train_step` (how a
    student's step runs: no buckets, and the optimizer leaves the all-gather to it); ``f``
    replaces the blocks' TP operator "f" (:class:`~course_utils.stage_model.TensorParallelBlock`).
    """
    if world_size != plan.world_size:
        raise ValueError(f"the plan needs {plan.world_size} ranks; got world_size={world_size}")
    g = build_groups(plan.mesh, rank)
    dev = backend.device()
    stage = build_stage(plan.cfg, plan.seed, g.pp_rank, g.pp_size, g.tp_rank, g.tp_size,
                        g.tp_group, f).to(dev)
    optimizer = ShardedAdam(stage.parameters(), g.dp_group, lr=plan.lr, eps=plan.eps,
                            allow_step=step_fn is None)
    dp_sync = BucketAllReduce(stage, plan.bucket_mb, group=g.dp_group) if step_fn is None \
        else None
    corpus = MarkovCorpus(plan.cfg.vocab_size, seed=plan.seed)
    out: dict[str, Any] = {"coords": (g.dp_rank, g.pp_rank, g.tp_rank), "losses": [],
                           "times": []}
    for step in range(plan.steps):
        x, y = corpus.batch(step, plan.batch, plan.cfg.seq_len)                # (B, T) each
        x, y = (backend.to_device(shard_batch(t, g.dp_rank, g.dp_size)) for t in (x, y))
        timer, opt_comm_before = Timer(), optimizer.comm_s
        dist.barrier()
        with tensor_parallel.record_comms() as tp_events, count_comms(g) as calls:
            t0 = clock(dev)
            if step_fn is None:
                loss = train_step(stage, g, x, y, plan.m, optimizer, dp_sync, timer)
            else:
                loss = step_fn(stage, g, x, y, plan.m, optimizer)
            total = clock(dev) - t0
        tp_s = sum(e.seconds for e in tp_events)
        dp_s = timer.dp_wait + optimizer.comm_s - opt_comm_before
        out["times"].append({"step": total, "tp": tp_s, "pp_wait": timer.pp_wait, "dp": dp_s,
                             "compute": total - tp_s - timer.pp_wait - dp_s})
        out["losses"].append(loss)
        if step == 0:
            out["grads"] = _numpy({n: p.grad for n, p in stage.named_parameters()
                                   if p.grad is not None})
            out["state_bytes"] = memory.count_state_bytes(stage, optimizer)
            out["comms"] = {"tp_all_reduces": calls.get("all_reduce_tp", 0),
                            "tp_bytes": calls["tp_bytes"],
                            "dp_buckets": dp_sync.n_buckets if dp_sync else 0,
                            "calls": dict(calls)}
        optimizer.zero_grad()
    out["weights"] = _numpy(dict(stage.named_parameters()))
    return out


def run(plan: Plan, timeout_s: float = 120.0, step_fn=None, f=None) -> list[dict[str, Any]]:
    """Train ``plan`` on ``plan.world_size`` real ranks; each rank's :func:`train_worker` result."""
    from course_utils import launch

    if not isinstance(plan, Plan):
        raise ValueError(f"plan must be a train3d.Plan; got {type(plan).__name__}")
    for name, fn in (("step_fn", step_fn), ("f", f)):
        if fn is not None and not callable(fn):
            raise ValueError(f"{name} must be a function or None; got {type(fn).__name__}")
    return launch.run(functools.partial(train_worker, plan=plan, step_fn=step_fn, f=f),
                      plan.world_size, timeout_s=timeout_s, threads_per_rank=1)


if __name__ == "__main__":
    # one node:  torchrun --standalone --nproc-per-node 8 -m course_utils.train3d
    # two nodes: torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \
    #                --rdzv-endpoint HOST:29500 -m course_utils.train3d      (on each node)
    from course_utils import launch
    from course_utils.train3d_check import torchrun_worker

    launch.torchrun_main(torchrun_worker)

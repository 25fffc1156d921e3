"""Putting it together: TinyLM trained on a DP x PP x TP mesh, checked against one process.

Every rank of a ``dp * pp * tp`` job finds its coordinates on one rank grid
(:class:`course_utils.mesh.grid.Mesh`, TP innermost) and builds its groups from it
(:func:`build_groups`). Rank (dp_rank, pp_rank, tp_rank) then builds only its own piece of the
model (:func:`course_utils.trainer3d.stage_model.build_stage`: on the meta device, then
materialised with its slices), and one training step (:func:`train_step`) is:

1. **PP, 1F1B** (module 5): the DP replica's rows are cut into ``m`` microbatches; the rank runs
   :func:`course_utils.pipeline.schedule.schedule_order`'s 1F1B order, posting before each
   operation one ``batch_isend_irecv`` with the send the last operation produced and the
   receive this one needs (:func:`course_utils.trainer3d.comms.exchange_plan`).
   The last stage's loss is the sum of its tokens' cross-entropies divided by the replica's
   number of tokens, so the m backward passes add up to the replica's mean.
2. **TP inside every block** (module 4), with the vocabulary split over TP too (the embedding,
   the head and a parallel cross-entropy, :mod:`course_utils.tensor_parallel.vocab`) and **sequence
   parallelism** (module 9) between the TP regions: ``Plan.vocab_parallel``, ``Plan.sp``.
3. **DP, bucketed and overlapped** (module 9): gradients accumulate in fp32 in one contiguous
   buffer (:class:`course_utils.zero.grad_buffer.GradBuffer`); during the last microbatch's backward
   each full bucket is reduce-scattered over ``dp_group``.
4. **ZeRO-1** (module 3): :class:`course_utils.zero.zero1.ShardedOptimizer` clips the gradient by
   its norm over every rank, runs ``torch.optim.Adam`` on this DP rank's slices and all-gathers
   the updated buckets in place. ``Plan.dtype = "bf16"``: weights and compute in bf16, fp32
   gradients and an fp32 master copy of the slices.

The run's :class:`Plan` is :mod:`course_utils.trainer3d.plan`'s (bound here too);
:mod:`course_utils.trainer3d.check` holds the one-process reference and the checks, and
:func:`torchrun_worker` compares each rank with that reference.

Run the same worker under torchrun (8 ranks: DP 2 x PP 2 x TP 2)::

    torchrun --standalone --nproc-per-node 8 -m course_utils.trainer3d.train
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist

from course_utils.runtime import backend
from course_utils.memory import sizing as memory
from course_utils.tensor_parallel.recording import record_comms
from course_utils.zero.grad_buffer import GradBuffer
from course_utils.runtime.clock import clock
from course_utils.mesh.grid import Mesh, axis_group
from course_utils.trainer3d.stage_model import Stage, build_stage, shard_state
from course_utils.models.tiny_lm import MarkovCorpus, shard_batch
from course_utils.trainer3d.comms import count_comms, exchange_plan
from course_utils.trainer3d.check import MESH_FOR_WORLD, reference_train
from course_utils.trainer3d.plan import DTYPES, Plan  # noqa: F401 - bound here too
from course_utils.zero.zero1 import ShardedOptimizer

__all__ = ["DTYPES", "Plan", "Groups", "build_groups", "Timer", "setup_rank", "train_step",
           "train_worker", "run", "torchrun_worker"]


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
    """Seconds one rank spends waiting on the pipeline and on DP in a step, and its exchanges."""

    def __init__(self, dev: torch.device | None = None) -> None:
        self.dev = dev or backend.device()
        self.pp_wait = self.dp_wait = 0.0
        self._sends: list[Any] = []

    def exchange(self, ops: Sequence[tuple[str, torch.Tensor, int]]) -> None:
        """Post ``("send" | "recv", tensor, peer)`` as one ``batch_isend_irecv``; wait for the
        receives (timed as pipeline wait) and keep the sends for :meth:`finish_sends`."""
        if not ops:
            return
        works = dist.batch_isend_irecv(
            [dist.P2POp(dist.isend if kind == "send" else dist.irecv, t, peer)
             for kind, t, peer in ops])
        t0 = clock(self.dev)
        if len(works) == len(ops):        # one request per op (gloo): sends finish later
            for (kind, _, _), work in zip(ops, works):
                if kind == "send":
                    self._sends.append(work)
                else:
                    work.wait()
        else:                             # NCCL coalesces the batch into one request
            for work in works:
                work.wait()
        self.pp_wait += clock(self.dev) - t0

    def finish_sends(self) -> None:
        """Wait for every send still in flight (pipeline wait too)."""
        if not self._sends:
            return
        t0 = clock(self.dev)
        for work in self._sends:
            work.wait()
        self._sends = []
        self.pp_wait += clock(self.dev) - t0


def train_step(stage: Stage, g: Groups, inputs: torch.Tensor, targets: torch.Tensor, m: int,
               optimizer: ShardedOptimizer, grads: GradBuffer,
               timer: Timer | None = None) -> float | None:
    """One 1F1B step on this rank; returns the replica's mean loss on the last stage, else None.

    ``inputs``/``targets``: this DP replica's rows (b, T), cut here into ``m`` microbatches.
    ``grads``: the stage's gradient buffer, whose buckets go out during the last backward.
    """
    timer = timer or Timer(inputs.device)
    x_mbs, y_mbs = inputs.chunk(m), targets.chunk(m)                   # m x (b/m, T)
    tokens = targets.numel()                  # the replica's tokens: its loss is their mean
    seq = inputs.shape[1] // (g.tp_size if stage.sp else 1)            # T, or T/t with SP
    boundary = (x_mbs[0].shape[0], seq, stage.cfg.d_model)             # (b/m, T', D)
    dtype = next(stage.parameters()).dtype
    peer = {"prev": g.pp_prev_rank, "next": g.pp_next_rank}
    order, batches = exchange_plan(g.pp_rank, g.pp_size, m)
    saved_in: dict[int, torch.Tensor] = {}
    saved_out: dict[int, torch.Tensor] = {}
    to_send: dict[tuple[str, int], torch.Tensor] = {}
    loss = 0.0
    for k, (sends, recvs) in enumerate(batches):
        got = {(what, i): torch.empty(boundary, dtype=dtype, device=inputs.device)
               for what, i, _ in recvs}
        timer.exchange([("send", to_send.pop((what, i)), peer[to]) for what, i, to in sends]
                       + [("recv", got[(what, i)], peer[src]) for what, i, src in recvs])
        if k == len(order):
            break
        kind, i, _ = order[k]
        if kind == "F":
            x = x_mbs[i] if g.first else got[("act", i)].requires_grad_(True)
            out = stage(x)                                        # (b/m, T', D) or logits
            if g.last:
                out = stage.token_losses(out, y_mbs[i]).sum() / tokens
                loss += out.item()
            else:
                to_send[("act", i)] = out.detach()
            saved_in[i], saved_out[i] = x, out
        else:
            grads.active = i == m - 1        # DP reduce-scatters start in the last backward
            torch.autograd.backward(saved_out.pop(i),
                                    grad_tensors=None if g.last else got[("grad", i)])
            x = saved_in.pop(i)
            if not g.first:
                to_send[("grad", i)] = x.grad
    timer.finish_sends()
    t0 = clock(inputs.device)
    grads.finish()                       # wait for the buckets still in flight; my slices / D
    timer.dp_wait += clock(inputs.device) - t0
    optimizer.step()                     # clip, Adam on my slices, all-gather the buckets
    return loss if g.last else None


def _numpy(tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {k: backend.to_cpu(v.detach().float()).numpy().copy() for k, v in tensors.items()}


def setup_rank(plan: Plan, g: Groups, f=None, student: bool = False
               ) -> tuple[Stage, ShardedOptimizer, GradBuffer | None]:
    """This rank's stage, ZeRO-1 optimizer and gradient buffer (None for a student's step),
    as :func:`train_worker` builds them (module 12 checkpoints them)."""
    dev = backend.device()
    stage = build_stage(plan.cfg, plan.seed, g.pp_rank, g.pp_size, g.tp_rank, g.tp_size,
                        g.tp_group, f, vocab_parallel=plan.vocab_parallel, sp=plan.sp,
                        dtype=plan.torch_dtype, device=dev)
    adam = dict(lr=plan.lr, eps=plan.eps, foreach=True)   # one call over all of its pieces
    if student:   # one bucket in parameter order; the student writes the all-gather
        return stage, ShardedOptimizer(stage.parameters(), torch.optim.Adam, g.dp_group,
                                       allow_step=False, **adam), None
    params = list(stage.parameters())[::-1]             # backward's order: buckets fill in turn
    replicated = {id(p) for p in stage.tp_replicated()}
    optimizer = ShardedOptimizer(params, torch.optim.Adam, g.dp_group,
                                 bucket_numel=plan.bucket_numel, master_dtype=torch.float32,
                                 max_norm=plan.clip, counted=[
                                     id(p) not in replicated or g.tp_rank == 0 for p in params],
                                 **adam)
    grads = GradBuffer(optimizer.params, optimizer.layout, g.dp_group, g.tp_group,
                       stage.tp_partial())
    optimizer.grads = grads
    return stage, optimizer, grads


def _train(plan: Plan, g: Groups, step_fn=None, f=None) -> dict[str, Any]:
    stage, optimizer, grads = setup_rank(plan, g, f, step_fn is not None)
    corpus = MarkovCorpus(plan.cfg.vocab_size, seed=plan.seed)
    out: dict[str, Any] = {"coords": (g.dp_rank, g.pp_rank, g.tp_rank), "losses": [],
                           "times": [], "grad_norms": [], "device": backend.device().type}
    for step in range(plan.steps):
        x, y = corpus.batch(step, plan.batch, plan.cfg.seq_len)                # (B, T) each
        x, y = (backend.to_device(shard_batch(t, g.dp_rank, g.dp_size)) for t in (x, y))
        timer, comm_before = Timer(), optimizer.comm_s
        dist.barrier()
        # the calls are counted in the first step only: the recorder watches every op, which
        # would slow the steps it times
        counted = count_comms({"tp": g.tp_group, "dp": g.dp_group}) if step == 0 \
            else contextlib.nullcontext({})
        with record_comms() as tp_events, counted as calls:
            t0 = clock(x.device)
            if step_fn is None:
                loss = train_step(stage, g, x, y, plan.m, optimizer, grads, timer)
            else:
                loss = step_fn(stage, g, x, y, plan.m, optimizer)
            total = clock(x.device) - t0
        tp_s = sum(e.seconds for e in tp_events)
        synced = sum(e.seconds for e in tp_events if e.phase == "grad sync")  # inside finish()
        dp_s = timer.dp_wait - synced + optimizer.comm_s - comm_before
        out["times"].append({"step": total, "tp": tp_s, "pp_wait": timer.pp_wait, "dp": dp_s,
                             "compute": total - tp_s - timer.pp_wait - dp_s})
        out["losses"].append(loss)
        out["grad_norms"].append(optimizer.grad_norm)
        if step == 0:
            named = dict(stage.named_parameters())
            full = grads.full_grads() if grads is not None else [p.grad for p in optimizer.params]
            by_id = {id(p): gr for p, gr in zip(optimizer.params, full)}
            out["grads"] = _numpy({n: by_id[id(p)] for n, p in named.items()
                                   if by_id.get(id(p)) is not None})
            out["state_bytes"] = memory.count_state_bytes(stage, optimizer)
            tp_kinds = {}
            for e in tp_events:
                tp_kinds[e.op] = tp_kinds.get(e.op, 0) + 1
                tp_kinds["bytes"] = tp_kinds.get("bytes", 0) + e.nbytes
            out["comms"] = {"tp": tp_kinds, "tp_all_reduces": calls.get("all_reduce_tp", 0),
                            "dp_buckets": grads.n_buckets if grads else 0, "calls": dict(calls)}
        optimizer.zero_grad()
        if grads is not None:
            grads.zero()
    out["weights"] = _numpy(dict(stage.named_parameters()))
    return out


def train_worker(rank: int, world_size: int, plan: Plan | Sequence[Plan], step_fn=None,
                 f=None) -> dict[str, Any] | list[dict[str, Any]]:
    """One rank of ``plan`` (or of each plan of a list, in turn, in one launch): trains, returns
    losses, first-step grads and norms, final weights, bytes, calls, times and its device type.

    ``step_fn(stage, g, inputs, targets, m, optimizer)`` replaces :func:`train_step` (how a
    student's step runs: one plain stage, no buffer, and the optimizer leaves the all-gather to
    it); ``f`` replaces the blocks' TP operator "f"
    (:class:`~course_utils.trainer3d.stage_model.TensorParallelBlock`).
    """
    plans = [plan] if isinstance(plan, Plan) else list(plan)
    groups: dict[tuple[int, int, int], Groups] = {}
    results = []
    for p in plans:
        if world_size != p.world_size:
            raise ValueError(f"the plan needs {p.world_size} ranks; got world_size={world_size}")
        if step_fn is not None and (p.vocab_parallel or p.sp or p.clip is not None):
            raise ValueError("a student's step runs the plain stage: give it a Plan with "
                             "vocab_parallel=False, sp=False, clip=None")
        key = (p.dp, p.pp, p.tp)
        if key not in groups:
            groups[key] = build_groups(p.mesh, rank)
        results.append(_train(p, groups[key], step_fn, f))
    return results[0] if isinstance(plan, Plan) else results


def run(plan: Plan | Sequence[Plan], timeout_s: float = 120.0, step_fn=None,
        f=None) -> list[dict[str, Any]] | list[list[dict[str, Any]]]:
    """Train ``plan`` on ``plan.world_size`` real ranks; each rank's :func:`train_worker`
    result. A list of plans (one world size) trains each in turn in one launch; the result is
    then one list of per-rank results per plan."""
    from course_utils import launch

    plans = [plan] if isinstance(plan, Plan) else list(plan) if isinstance(plan, (list, tuple)) \
        else None
    if not plans or not all(isinstance(p, Plan) for p in plans):
        raise ValueError(f"plan must be a train3d.Plan or a list of them; got "
                         f"{type(plan).__name__}")
    if len({p.world_size for p in plans}) > 1:
        raise ValueError("the plans of one launch must need the same number of ranks")
    for name, fn in (("step_fn", step_fn), ("f", f)):
        if fn is not None and not callable(fn):
            raise ValueError(f"{name} must be a function or None; got {type(fn).__name__}")
    per_rank = launch.run(functools.partial(train_worker, plan=plan, step_fn=step_fn, f=f),
                          plans[0].world_size, timeout_s=timeout_s, threads_per_rank=1)
    if isinstance(plan, Plan):
        return per_rank
    return [[r[i] for r in per_rank] for i in range(len(plans))]


def torchrun_worker(rank: int, world_size: int, steps: int = 5) -> float:
    """Worker for torchrun: trains ``steps`` steps on the mesh
    :data:`course_utils.trainer3d.check.MESH_FOR_WORLD` gives this job size (8 ranks: DP 2 x
    PP 2 x TP 2) and returns this rank's largest weight difference from its slice of the
    one-process run (which every rank computes itself)."""
    if world_size not in MESH_FOR_WORLD:
        raise ValueError(f"run with {sorted(MESH_FOR_WORLD)} ranks; got world_size={world_size}")
    dp, pp, tp = MESH_FOR_WORLD[world_size]
    plan = Plan(dp=dp, pp=pp, tp=tp, steps=steps)
    got = train_worker(rank, world_size, plan)
    _dp_rank, pp_rank, tp_rank = got["coords"]
    want = shard_state(reference_train(plan)["weights"], plan.cfg, pp_rank, plan.pp, tp_rank,
                       plan.tp, plan.vocab_parallel)
    return max(float((torch.as_tensor(got["weights"][k]) - v).abs().max())
               for k, v in want.items())


if __name__ == "__main__":
    # one node:  torchrun --standalone --nproc-per-node 8 -m course_utils.trainer3d.train
    # two nodes: torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \
    #                --rdzv-endpoint HOST:29500 -m course_utils.trainer3d.train      (on each node)
    from course_utils import launch

    launch.torchrun_main(torchrun_worker)

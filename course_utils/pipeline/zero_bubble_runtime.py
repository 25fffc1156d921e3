"""Zero-bubble pipelines on real ranks: the backward split in two, timed, its memory counted.

Two implementations, checked against one process (loss and every gradient) and the simulator
(:mod:`course_utils.pipeline.schedule`):

* :func:`split_pipeline_worker`: the course's own, from ``dist.recv`` / ``dist.isend``, on a
  :class:`course_utils.pipeline.backward_split.SplitStage` (forward, I and W by hand).
  ``"zb-h1"`` runs I and W apart in ZB-H1's order; ``"1f1b"`` runs each backward as I then W
  at once (1F1B).
* :func:`torch_split_worker`: ``torch.distributed.pipelining``'s ``ScheduleZBVZeroBubble`` and
  ``ScheduleDualPipeV``, two stages per rank in a V (rank r holds stages r and 2P - 1 - r),
  each ``PipelineStage`` timestamping its F, I, W and B and counting the bytes autograd saves
  for them (``saved_tensors_hooks``).

As in :mod:`course_utils.pipeline.runtime`, ``op_time_s`` stretches every op (sleeping, as a
host waits for its accelerator) so the timings do not depend on how busy the CPU is: F, I and W
each take ``op_time_s`` per rank (a chunk of a V half of it), a whole backward B twice that:
Qi et al.'s T_F = T_B = T_W. :func:`measure_schedules` measures the bubble and the activations
held per rank beside the simulation; :func:`post_validation_worker` shows the optimizer step's
global check (the gradient norm for clipping) done in order, and by Qi et al.'s post-validation.

Run a demo under torchrun (4 ranks, ZB-H1 from send/recv, 8 microbatches)::

    torchrun --standalone --nproc-per-node 4 -m course_utils.pipeline.zero_bubble_runtime
"""

from __future__ import annotations

import contextlib
import statistics
import weakref
from collections import defaultdict
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

from course_utils.runtime import backend
from course_utils.pipeline.backward_split import SplitStage
from course_utils.runtime.clock import clock
from course_utils.pipeline.runtime import (MAX_OP_TIME_S, hold_until, jobs_worker, make_batch,
                                           make_model, records_to_timeline, split_stages,
                                           to_numpy)
from course_utils.pipeline.schedule import Timeline, schedule_order
from course_utils.runtime.validate import check_int, check_real

__all__ = ["split_pipeline_worker", "torch_split_worker", "measure_schedules",
           "post_validation_worker", "post_validation_reference", "SCRATCH", "TORCH"]

SCRATCH = ("1f1b", "zb-h1")    # the course's own, from send/recv
TORCH = ("zbv", "dualpipev")   # torch.distributed.pipelining's classes


# ----------------------------------------------------------------------------------- from scratch


def _split_step(stage: SplitStage, pp_rank: int, pp_size: int, order: Sequence[tuple],
                x_mbs: Sequence[torch.Tensor], y_mbs: Sequence[torch.Tensor],
                op_time_s: float) -> tuple[float | None, list[tuple]]:
    """One pipeline step of this rank's ops (F, B = I then W, I, W): (loss on the last rank,
    records (kind, microbatch, chunk, start, end))."""
    m = len(x_mbs)
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    pp_prev_rank, pp_next_rank = pp_rank - 1, pp_rank + 1
    pending, records, loss_sum, grads = [], [], 0.0, {}
    for kind, i, _chunk in order:
        send = None  # (tensor, peer) to send once the op is done
        if kind == "F":
            x = x_mbs[i]
            if not first:
                x = torch.empty_like(x_mbs[i])  # (microbatch, width) from pp_prev_rank
                dist.recv(x, src=pp_prev_rank)
            t0 = clock(x)
            out = stage.forward(i, x)
            if last:  # the loss and its gradient, by hand: mean over the batch = sum of means / m
                diff = out - y_mbs[i]
                loss_sum += (diff.pow(2).mean() / m).item()
                grads[i] = 2 * diff / diff.numel() / m
            else:
                send = (out, pp_next_rank)
        elif kind in ("B", "I"):
            g = grads.pop(i) if last else torch.empty_like(x_mbs[i])
            if not last:  # dLoss/d(output) from pp_next_rank
                dist.recv(g, src=pp_next_rank)
            t0 = clock(g)
            dx = stage.backward_input(i, g)
            if kind == "B":  # the whole backward: W at once, the input gradient sent after it
                stage.backward_weight(i)
            if not first:
                send = (dx.contiguous(), pp_prev_rank)
        else:
            t0 = clock()
            stage.backward_weight(i)
        hold_until(t0 + (2 if kind == "B" else 1) * op_time_s)
        records.append((kind, i, 0, t0, clock()))
        if send is not None:
            pending.append(dist.isend(*send))
    for work in pending:
        work.wait()
    return (loss_sum if last else None), records


def split_pipeline_worker(pp_rank: int, pp_size: int, schedule: str = "zb-h1", m: int = 8,
                          seed: int = 0, microbatch: int = 3, width: int = 16, depth: int = 4,
                          steps: int = 1, op_time_s: float = 0.0) -> dict:
    """One rank of the course's own pipeline with the backward split (send/recv); ``steps``
    steps on the same batch. ``schedule``: "zb-h1" (I and W apart) or "1f1b" (B = I, W at once).

    Returns {"loss": the step's loss on the last rank else None, "grads": this stage's
    parameter grads (numpy, last step), "records": per step [(kind, microbatch, chunk, start,
    end)], "peak_bytes": per step, the most bytes the stage kept for later I and W,
    "microbatch_bytes": what one microbatch keeps after its F}.
    """
    if schedule not in SCRATCH:
        raise ValueError(f"schedule must be one of {list(SCRATCH)}, got {schedule!r}")
    for name, value in (("m", m), ("microbatch", microbatch), ("steps", steps)):
        check_int(name, value)
    check_real("op_time_s", op_time_s, 0, strict=False, maximum=MAX_OP_TIME_S)
    model = make_model(seed, width, depth).to(backend.device())
    stage_module = split_stages(model, pp_size)[pp_rank]
    x, y = backend.to_device(make_batch(seed, m * microbatch, width))
    x_mbs, y_mbs = x.chunk(m), y.chunk(m)  # m microbatches of (microbatch, width)
    order = schedule_order(schedule, pp_size, m)[pp_rank]
    probe = SplitStage(stage_module)
    probe.forward(-1, x_mbs[0])
    out = {"microbatch_bytes": probe.held_bytes(), "records": [], "peak_bytes": []}
    for _ in range(steps):
        stage_module.zero_grad(set_to_none=True)
        stage = SplitStage(stage_module)
        dist.barrier()
        out["loss"], records = _split_step(stage, pp_rank, pp_size, order, x_mbs, y_mbs,
                                           op_time_s)
        out["records"].append(records)
        out["peak_bytes"].append(stage.peak_bytes)
    out["grads"] = [to_numpy(q.grad) for q in stage_module.parameters()]
    return out


# ----------------------------------------------------------------------------------- torch


class _SavedBytes:
    """Bytes of the tensors autograd keeps for backward, while :meth:`watch` is on: counted when
    saved, released when autograd lets them go (a tensor saved twice counts once; parameters
    are not activations and do not count)."""

    def __init__(self, params: Sequence[torch.Tensor]):
        self.skip = {q.untyped_storage().data_ptr() for q in params}
        self.count: dict[tuple, int] = defaultdict(int)
        self.size: dict[tuple, int] = {}
        self.held = self.peak = 0

    def _release(self, key: tuple) -> None:
        self.count[key] -= 1
        if self.count[key] == 0:
            self.held -= self.size.pop(key)

    def _pack(self, t: torch.Tensor) -> Any:
        if t.untyped_storage().data_ptr() in self.skip:
            return t
        key = (t.data_ptr(), t.numel(), t.dtype)
        if self.count[key] == 0:
            self.size[key] = t.numel() * t.element_size()
            self.held += self.size[key]
            self.peak = max(self.peak, self.held)
        self.count[key] += 1
        box = _Box(t.detach())  # t itself would tie an output to its own grad_fn: a cycle
        weakref.finalize(box, self._release, key)
        return box

    @staticmethod
    def _unpack(box: Any) -> torch.Tensor:
        return box.tensor if isinstance(box, _Box) else box

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield


class _Box:
    """A saved tensor, in a box whose death tells :class:`_SavedBytes` it was released."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


def _timed_stage_class() -> type:
    """A PipelineStage that timestamps its F, B, I and W (stretched to ``hold_s`` per op, twice
    that for B) into ``log`` and counts the bytes its forwards save (``saved``)."""
    from torch.distributed.pipelining import PipelineStage

    class TimedStage(PipelineStage):
        def setup(self, log: list, chunk: int, hold_s: float, saved: _SavedBytes) -> None:
            self.log, self.chunk, self.hold_s, self.saved = log, chunk, hold_s, saved

        def _timed(self, kind: str, mb: int, fn: Callable[[], Any]) -> Any:
            t0 = clock()
            result = fn()
            hold_until(t0 + (2 if kind == "B" else 1) * self.hold_s)
            self.log.append((kind, mb, self.chunk, t0, clock()))
            return result

        def forward_one_chunk(self, fwd_chunk_id, args, kwargs=None, save_forward_output=True):
            def run():
                with self.saved.watch():
                    return super(TimedStage, self).forward_one_chunk(
                        fwd_chunk_id, args, kwargs, save_forward_output)
            return self._timed("F", fwd_chunk_id, run)

        def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True,
                               last_backward=False):
            return self._timed("B" if full_backward else "I", bwd_chunk_id,
                               lambda: super(TimedStage, self).backward_one_chunk(
                                   bwd_chunk_id, loss, full_backward, last_backward))

        def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):
            return self._timed("W", bwd_chunk_id,
                               lambda: super(TimedStage, self).backward_weight_one_chunk(
                                   bwd_chunk_id, last_backward))

    return TimedStage


def torch_split_worker(pp_rank: int, pp_size: int, schedule: str = "zbv", m: int = 8,
                       seed: int = 0, microbatch: int = 3, width: int = 16, depth: int = 8,
                       steps: int = 1, op_time_s: float = 0.0) -> dict:
    """One rank of torch's ScheduleZBVZeroBubble ("zbv") or ScheduleDualPipeV ("dualpipev"):
    the model cut into 2P stages, this rank holding stages pp_rank (chunk 0) and
    2P - 1 - pp_rank (chunk 1). Returns what :func:`split_pipeline_worker` returns, with
    "grads" {stage index: grads} and the loss on rank 0 (which holds the last stage)."""
    from torch.distributed.pipelining import ScheduleDualPipeV, ScheduleZBVZeroBubble

    classes = {"zbv": ScheduleZBVZeroBubble, "dualpipev": ScheduleDualPipeV}
    if schedule not in classes:
        raise ValueError(f"schedule must be one of {list(TORCH)}, got {schedule!r}")
    for name, value in (("m", m), ("microbatch", microbatch), ("steps", steps)):
        check_int(name, value)
    check_real("op_time_s", op_time_s, 0, strict=False, maximum=MAX_OP_TIME_S)
    dev = backend.device()
    n_stages = 2 * pp_size
    modules = split_stages(make_model(seed, width, depth).to(dev), n_stages)
    mine = [pp_rank, n_stages - 1 - pp_rank]  # chunk 0 going down the V, chunk 1 coming back
    log: list[tuple] = []
    saved = _SavedBytes([q for s in mine for q in modules[s].parameters()])
    timed = _timed_stage_class()
    stages = []
    for chunk, s in enumerate(mine):
        # static boundary shapes, (microbatch, width) in and out, as in pipeline_parallel
        stage = timed(modules[s], s, n_stages, dev,
                      input_args=torch.empty(microbatch, width, device=dev, requires_grad=s > 0),
                      output_args=torch.empty(microbatch, width, device=dev, requires_grad=True))
        stage.setup(log, chunk, op_time_s / 2, saved)
        stages.append(stage)
    # scale_grads=True (the default): grads divided by m, the mean of the microbatch means
    pipe = classes[schedule](stages, n_microbatches=m, loss_fn=nn.functional.mse_loss)
    x, y = backend.to_device(make_batch(seed, m * microbatch, width), dev)
    with saved.watch():
        modules[mine[0]](x.chunk(m)[0])  # one microbatch's saved bytes on one chunk, released
    out = {"microbatch_bytes": 2 * saved.peak, "records": [], "peak_bytes": []}
    for _ in range(steps):
        for s in mine:
            modules[s].zero_grad(set_to_none=True)
        log.clear()
        saved.peak = saved.held
        dist.barrier()
        losses: list[torch.Tensor] = []
        if pp_rank == 0:
            pipe.step(x, target=y, losses=losses)
        else:
            pipe.step()
        out["loss"] = torch.stack(losses).mean().item() if pp_rank == 0 else None
        out["records"].append(list(log))
        out["peak_bytes"].append(saved.peak)
    out["grads"] = {s: [to_numpy(q.grad) for q in modules[s].parameters()] for s in mine}
    return out


# ----------------------------------------------------------------------------------- measuring


def _worker_for(schedule: str) -> tuple[Callable, int]:
    if schedule in SCRATCH:
        return split_pipeline_worker, 1
    if schedule in TORCH:
        return torch_split_worker, 2
    raise ValueError(f"schedule must be one of {list(SCRATCH + TORCH)}, got {schedule!r}")


def measure_schedules(p: int, m: int, schedules: Sequence[str] = SCRATCH + TORCH, *,
                      op_time_s: float = 0.01, steps: int = 2, microbatch: int = 4,
                      width: int = 16, timeout_s: float = 120.0) -> dict[str, dict]:
    """Run each schedule on p real ranks (one launch), ``steps`` + 1 steps (the first dropped);
    per schedule {"timeline": the median step's, "idle": its bubble with the optimizer's global
    check, "idle_nosync": without it (post-validation), "rank_idle": per rank, "peak": the
    microbatches of activations each rank held at its peak, "per_step": every step's idle}.

    One block per stage: P stages of the model for 1F1B and ZB-H1, 2P for the V schedules, so
    a microbatch keeps the same bytes after F and after I and bytes count microbatches.
    """
    from course_utils import launch

    check_int("p", p)
    check_int("m", m)
    check_int("steps", steps)
    check_real("op_time_s", op_time_s, 0, strict=False, maximum=MAX_OP_TIME_S)
    jobs = []
    for schedule in schedules:
        fn, v = _worker_for(schedule)
        jobs.append((fn, dict(schedule=schedule, m=m, microbatch=microbatch, width=width,
                              depth=v * p, steps=steps + 1, op_time_s=op_time_s)))
    results = launch.run(jobs_worker, p, jobs, timeout_s=timeout_s, threads_per_rank=1,
                         show_output=False)
    rows = {}
    for k, schedule in enumerate(schedules):
        v = _worker_for(schedule)[1]
        per_rank = [results[r][k] for r in range(p)]
        timelines = [records_to_timeline([res["records"][s] for res in per_rank], schedule, m, v)
                     for s in range(1, steps + 1)]
        fractions = [t.idle_fraction() for t in timelines]
        median = statistics.median(fractions)
        best: Timeline = timelines[min(range(steps), key=lambda s: abs(fractions[s] - median))]
        rows[schedule] = {
            "timeline": best, "idle": median, "per_step": fractions,
            "idle_nosync": statistics.median(t.idle_fraction(sync=False) for t in timelines),
            "rank_idle": best.rank_idle_fractions(),
            "peak": [max(res["peak_bytes"][1:]) / res["microbatch_bytes"] for res in per_rank]}
    return rows


# ----------------------------------------------------------------------------------- optimizer


def _clip_coef(sq_norm: float, max_norm: float) -> float:
    """torch.nn.utils.clip_grad_norm_'s factor: max_norm / (norm + 1e-6), at most 1."""
    return min(1.0, max_norm / (sq_norm ** 0.5 + 1e-6))


def post_validation_worker(pp_rank: int, pp_size: int, seed: int = 0, max_norm: float = 1.0,
                           lr: float = 0.1, m: int = 4, microbatch: int = 3, width: int = 16,
                           depth: int = 4) -> dict:
    """A ZB-H1 step, then SGD with gradient-norm clipping, two ways.

    * In order (``"sync"``): all-reduce the squared norms, then every stage steps with the
      global factor. No stage can step before the slowest has finished its last W.
    * Post-validation (Qi et al. section 4): the squared norm so far travels forward stage to
      stage; each stage steps at once with the factor its partial norm gives, keeping its old
      weights; the last stage has the whole norm and sends it back; a stage whose factor was
      wrong rolls back and steps again.

    Returns {"sync", "validated": this stage's weights after each (numpy), "rolled_back",
    "partial_norm", "norm"}.
    """
    res = split_pipeline_worker(pp_rank, pp_size, "zb-h1", m, seed, microbatch, width, depth)
    model = make_model(seed, width, depth)
    params = list(split_stages(model, pp_size)[pp_rank].parameters())
    grads = [torch.as_tensor(g) for g in res["grads"]]
    local = float(sum((g.double() ** 2).sum() for g in grads))

    total = torch.tensor([local], dtype=torch.float64)
    dist.all_reduce(total)  # the global check, in order: everyone waits for everyone
    coef = _clip_coef(total.item(), max_norm)
    sync = [to_numpy(q.detach() - lr * coef * g) for q, g in zip(params, grads)]

    partial = torch.tensor([local], dtype=torch.float64)
    if pp_rank > 0:  # what the stages before this one summed
        so_far = torch.empty(1, dtype=torch.float64)
        dist.recv(so_far, src=pp_rank - 1)
        partial += so_far
    if pp_rank < pp_size - 1:
        dist.send(partial, dst=pp_rank + 1)
    used = _clip_coef(partial.item(), max_norm)
    old = [q.detach().clone() for q in params]
    new = [q - lr * used * g for q, g in zip(old, grads)]  # the optimistic step
    whole = partial.clone()  # the last stage's partial is the whole norm: back it goes
    if pp_rank < pp_size - 1:
        dist.recv(whole, src=pp_rank + 1)
    if pp_rank > 0:
        dist.send(whole, dst=pp_rank - 1)
    right = _clip_coef(whole.item(), max_norm)
    rolled_back = right != used
    if rolled_back:  # validation failed: back to the kept weights, step again
        new = [q - lr * right * g for q, g in zip(old, grads)]
    return {"sync": sync, "validated": [to_numpy(t) for t in new], "rolled_back": rolled_back,
            "partial_norm": partial.item() ** 0.5, "norm": whole.item() ** 0.5}


def post_validation_reference(seed: int = 0, max_norm: float = 1.0, lr: float = 0.1, m: int = 4,
                              microbatch: int = 3, width: int = 16, depth: int = 4,
                              p: int = 1) -> list[list]:
    """One process: the step, ``clip_grad_norm_`` and an SGD step (w -= lr * grad, written
    out: ``torch.optim`` would import torch._dynamo, seconds in a notebook); the weights
    grouped by p stages."""
    model = make_model(seed, width, depth)
    x, y = make_batch(seed, m * microbatch, width)
    nn.functional.mse_loss(model(x), y).backward()
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    with torch.no_grad():
        for q in model.parameters():
            q -= lr * q.grad
    return [[to_numpy(q) for q in st.parameters()] for st in split_stages(model, p)]


def _demo(pp_rank: int, pp_size: int) -> str:
    """Torchrun demo: a ZB-H1 step with 8 microbatches; the last rank reports the loss."""
    res = split_pipeline_worker(pp_rank, pp_size, "zb-h1", 8, depth=pp_size)
    return f"loss={res['loss']:.6f}" if res["loss"] is not None else "sent activations/grads"


if __name__ == "__main__":
    from course_utils import launch

    launch.torchrun_main(_demo)

"""Pipeline parallelism on real ranks: stages, boundary send/recv, and the bubble measured.

A model (a stack of ``Linear -> Tanh`` blocks) is cut into P consecutive stages, one per rank
(``pp_rank``). A microbatch's activation at a stage boundary is sent to ``pp_next_rank``; in the
backward pass the gradient of that activation comes back from ``pp_next_rank`` and the gradient
of this stage's input goes to ``pp_prev_rank``. Two implementations, checked against each other
and against the unpipelined model:

* :func:`pipeline_worker`: written out with ``dist.recv`` / ``dist.isend``, running the per-rank
  op order of :func:`course_utils.pipeline.schedule.schedule_order` ("gpipe" or "1f1b"), and
  timestamping every forward/backward so the bubble can be measured (:func:`measure_bubble`).
* :func:`torch_pipeline_worker`: the same with ``torch.distributed.pipelining`` (``PipelineStage``
  with ``ScheduleGPipe`` or ``Schedule1F1B``), its stage wrapped so it is timestamped too.

:func:`matmul_throughput` measures why microbatches cannot be made arbitrarily small.

Run a demo under torchrun (2 ranks, GPipe, 4 microbatches)::

    torchrun --standalone --nproc-per-node 2 -m course_utils.pipeline.runtime
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from course_utils.models.toy import toy_mlp
from course_utils.runtime import backend
from course_utils.runtime.clock import clock
from course_utils.pipeline.schedule import Op, Timeline, bubble_fraction, schedule_order
from course_utils.runtime.validate import check_int, check_ints, check_real

__all__ = ["MAX_OP_TIME_S", "to_numpy", "hold_until", "make_model", "make_batch",
           "split_stages", "stage_bounds", "reference_step",
           "pipeline_worker", "torch_pipeline_worker", "records_to_timeline", "jobs_worker",
           "schedule_classes", "measure_bubble",
           "matmul_throughput", "run_student_pipeline", "microbatch_reference"]

# runtime.clock.clock: perf_counter (CLOCK_MONOTONIC on Linux: one clock shared by all processes),
# read after the device has finished its queued work (on CUDA; at once on CPU)

MAX_OP_TIME_S = 10.0
"""``op_time_s`` (seconds an op is stretched to) must be below this: a typo, not a pipeline."""


def to_numpy(t: torch.Tensor) -> Any:
    """A tensor as a numpy array: results travel back from ranks by value, not shared memory."""
    return backend.to_cpu(t.detach()).numpy().copy()


# ----------------------------------------------------------------------------------- the model


def make_model(seed: int, width: int = 16, depth: int = 4) -> nn.Sequential:
    """``depth`` blocks of Linear(width, width) -> Tanh, initialised from ``seed``
    (:func:`course_utils.models.toy.toy_mlp`'s weights, one block per Linear)."""
    check_int("width", width)
    check_int("depth", depth)
    layers = list(toy_mlp([width] * (depth + 1), seed=seed, activation="tanh",
                          final_activation=True))
    return nn.Sequential(*(nn.Sequential(*layers[2 * k:2 * k + 2]) for k in range(depth)))


def make_batch(seed: int, batch: int, width: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs x and regression targets y, both (batch, width), from ``seed``."""
    check_int("batch", batch)
    check_int("width", width)
    gen = torch.Generator().manual_seed(10_000 + seed)
    x = torch.randn(batch, width, generator=gen)  # (batch, width)
    y = torch.randn(batch, width, generator=gen)  # (batch, width)
    return x, y


def stage_bounds(depth: int, p: int) -> list[tuple[int, int]]:
    """[start, end) block indices of each of p contiguous stages (sizes differ by at most 1)."""
    check_int("depth", depth)
    check_int("p", p)
    if p > depth:
        raise ValueError(f"p must be at most depth={depth} (one block per stage at least), got {p}")
    base, extra = divmod(depth, p)
    bounds, start = [], 0
    for s in range(p):
        end = start + base + (1 if s < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def split_stages(model: nn.Sequential, p: int) -> list[nn.Sequential]:
    """Cut a Sequential into p consecutive stages (they share the model's parameters)."""
    if not isinstance(model, nn.Sequential):
        raise ValueError(f"model must be an nn.Sequential, got {type(model).__name__}")
    return [model[a:b] for a, b in stage_bounds(len(model), p)]


def reference_step(seed: int, batch: int, width: int = 16, depth: int = 4,
                   p: int = 1) -> tuple[float, list[list[torch.Tensor]]]:
    """Unpipelined loss (MSE, mean over the batch) and gradients, grouped by the p stages."""
    model = make_model(seed, width, depth)
    x, y = make_batch(seed, batch, width)
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss.item(), [[q.grad.clone() for q in st.parameters()] for st in split_stages(model, p)]


# ----------------------------------------------------------------------------------- from scratch


def hold_until(t_end: float) -> None:
    """Sleep until clock() reaches t_end: an emulated device kernel (the CPU stays free)."""
    left = t_end - clock()
    if left > 0:
        time.sleep(left)


def _run_schedule(stage: nn.Module, pp_rank: int, pp_size: int, order: Sequence[tuple],
                  x_mbs: Sequence[torch.Tensor], y_mbs: Sequence[torch.Tensor],
                  boundary_shape: tuple[int, ...],
                  op_time_s: float = 0.0) -> tuple[float | None, list[tuple]]:
    """Run one pipeline step on this rank: returns (loss on the last rank, op records)."""
    m = len(x_mbs)
    dev = x_mbs[0].device
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    pp_prev_rank, pp_next_rank = pp_rank - 1, pp_rank + 1
    inputs: dict[int, torch.Tensor] = {}   # microbatch -> this stage's input (kept for its grad)
    outputs: dict[int, torch.Tensor] = {}  # microbatch -> this stage's output (or scaled loss)
    pending = []                           # (work, tensor): isends still in flight
    records = []
    loss_sum = 0.0
    for kind, i, _chunk in order:
        if kind == "F":
            if first:
                x = x_mbs[i]
            else:
                x = torch.empty(boundary_shape, device=dev)  # (microbatch, width) from pp_prev_rank
                dist.recv(x, src=pp_prev_rank)
                x.requires_grad_(True)
            t0 = clock(dev)
            out = stage(x)  # (microbatch, width)
            if last:
                # mean over the whole batch = sum over microbatches of (microbatch mean) / m
                out = nn.functional.mse_loss(out, y_mbs[i]) / m
                loss_sum += out.item()
            hold_until(t0 + op_time_s)
            t1 = clock(dev)
            inputs[i], outputs[i] = x, out
            if not last:
                act = out.detach()
                pending.append((dist.isend(act, dst=pp_next_rank), act))
        else:
            grad = None
            if not last:
                grad = torch.empty(boundary_shape, device=dev)  # dLoss/d(output), from pp_next_rank
                dist.recv(grad, src=pp_next_rank)
            t0 = clock(dev)
            torch.autograd.backward(outputs.pop(i), grad_tensors=grad)
            hold_until(t0 + 2 * op_time_s)  # backward = 2 x forward
            t1 = clock(dev)
            x = inputs.pop(i)
            if not first:
                pending.append((dist.isend(x.grad, dst=pp_prev_rank), x.grad))
        records.append((kind, i, t0, t1))
    for work, _ in pending:
        work.wait()
    return (loss_sum if last else None), records


def pipeline_worker(pp_rank: int, pp_size: int, schedule: str = "gpipe", m: int = 4,
                    seed: int = 0, microbatch: int = 4, width: int = 16, depth: int = 4,
                    steps: int = 1, op_time_s: float = 0.0) -> dict:
    """One rank of a hand-written pipeline (send/recv); ``steps`` timed steps on the same batch.

    ``op_time_s`` > 0 stretches each forward to at least that long and each backward to twice
    that (sleeping, as a host waits for an accelerator), so timings do not depend on how busy
    the CPU is; the math is unchanged.

    Returns {"loss": float on the last rank else None, "grads": this stage's parameter grads
    (from the last step, as numpy arrays), "records": per step, a list of (kind, microbatch,
    start_s, end_s)}.
    """
    if schedule not in ("gpipe", "1f1b"):
        raise ValueError(f"schedule must be 'gpipe' or '1f1b', got {schedule!r}")
    check_int("m", m)
    check_int("steps", steps)
    check_int("microbatch", microbatch)
    check_real("op_time_s", op_time_s, 0, strict=False, maximum=MAX_OP_TIME_S)
    model = make_model(seed, width, depth).to(backend.device())  # same model everywhere
    stage = split_stages(model, pp_size)[pp_rank]  # ... and each rank keeps its stage
    x, y = backend.to_device(make_batch(seed, m * microbatch, width))
    x_mbs, y_mbs = x.chunk(m), y.chunk(m)  # m microbatches of (microbatch, width)
    order = schedule_order(schedule, pp_size, m)[pp_rank]
    all_records = []
    loss = None
    for _ in range(steps):
        stage.zero_grad(set_to_none=True)
        dist.barrier()
        loss, records = _run_schedule(stage, pp_rank, pp_size, order, x_mbs, y_mbs,
                                      (microbatch, width), op_time_s)
        all_records.append(records)
    return {"loss": loss, "grads": [to_numpy(q.grad) for q in stage.parameters()],
            "records": all_records}


# ----------------------------------------------------------------------------------- torch API


class _Stamp(torch.autograd.Function):
    """Identity whose backward appends (label, time) to a list: timestamps autograd's backward."""

    @staticmethod
    def forward(ctx, x, log, label, hold_s):  # noqa: D102
        ctx.log, ctx.label, ctx.hold_s = log, label, hold_s
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        if ctx.hold_s:  # the backward ends here: hold until it has lasted hold_s
            hold_until(ctx.log[-1][1] + ctx.hold_s)
        ctx.log.append((ctx.label, clock(grad)))
        return grad, None, None, None


class _TimedStage(nn.Module):
    """Wraps a stage so each forward and backward records its start and end time."""

    def __init__(self, inner: nn.Module, op_time_s: float = 0.0):
        super().__init__()
        self.inner = inner
        self.op_time_s = op_time_s
        self.log: list[tuple[str, float]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.requires_grad:  # first stage: a leaf, so the input stamp's backward still runs
            x = x.detach().requires_grad_(True)
        t0 = clock(x)
        self.log.append(("F0", t0))
        x = _Stamp.apply(x, self.log, "B1", 2 * self.op_time_s)  # reaching the input: B ends
        out = self.inner(x)
        out = _Stamp.apply(out, self.log, "B0", 0.0)  # grad arriving at the output: B starts
        hold_until(t0 + self.op_time_s)
        self.log.append(("F1", clock(out)))
        return out


def _log_to_records(log: Sequence[tuple[str, float]]) -> list[tuple]:
    """Turn stamps into (kind, microbatch, start, end); microbatches counted in call order."""
    records, f_start, b_start = [], {}, {}
    nf = nb = nbe = 0
    for label, t in log:
        if label == "F0":
            f_start[nf] = t
        elif label == "F1":
            records.append(("F", nf, f_start[nf], t))
            nf += 1
        elif label == "B0":
            b_start[nb] = t
            nb += 1
        else:
            records.append(("B", nbe, b_start[nbe], t))
            nbe += 1
    return records


def torch_pipeline_worker(pp_rank: int, pp_size: int, schedule: str = "gpipe", m: int = 4,
                          seed: int = 0, microbatch: int = 4, width: int = 16,
                          depth: int = 4, steps: int = 1, op_time_s: float = 0.0) -> dict:
    """One rank of the same pipeline built with torch.distributed.pipelining.

    ``schedule``: "gpipe" (ScheduleGPipe) or "1f1b" (Schedule1F1B). Same return value as
    :func:`pipeline_worker` (``op_time_s`` too); the loss is the mean of the microbatch losses
    (last rank).
    """
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    classes = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
    if schedule not in classes:
        raise ValueError(f"schedule must be 'gpipe' or '1f1b', got {schedule!r}")
    check_int("m", m)
    check_int("steps", steps)
    check_real("op_time_s", op_time_s, 0, strict=False, maximum=MAX_OP_TIME_S)
    dev = backend.device()
    model = make_model(seed, width, depth).to(dev)
    timed = _TimedStage(split_stages(model, pp_size)[pp_rank], op_time_s)
    # Static shapes, like the recv buffers of pipeline_worker: (microbatch, width) in and out.
    # requires_grad on a received input: this stage must send its gradient back to pp_prev_rank.
    example_in = torch.empty(microbatch, width, requires_grad=pp_rank > 0, device=dev)
    example_out = torch.empty(microbatch, width, requires_grad=True, device=dev)
    stage = PipelineStage(timed, pp_rank, pp_size, dev,
                          input_args=example_in, output_args=example_out)
    # scale_grads=True (the default) divides grads by m: sum of per-microbatch means / m.
    pipe = classes[schedule](stage, n_microbatches=m, loss_fn=nn.functional.mse_loss)
    x, y = backend.to_device(make_batch(seed, m * microbatch, width), dev)
    last = pp_rank == pp_size - 1
    all_records, loss = [], None
    for _ in range(steps):
        timed.zero_grad(set_to_none=True)
        timed.log.clear()
        dist.barrier()
        losses: list[torch.Tensor] = []
        if pp_rank == 0:
            pipe.step(x)
        elif last:
            pipe.step(target=y, losses=losses)
        else:
            pipe.step()
        loss = torch.stack(losses).mean().item() if last else None
        all_records.append(_log_to_records(timed.log))
    return {"loss": loss, "grads": [to_numpy(q.grad) for q in timed.inner.parameters()],
            "records": all_records}


# ----------------------------------------------------------------------------------- measuring


def records_to_timeline(per_rank_records: Sequence[Sequence[tuple]], schedule: str,
                        m: int, v: int = 1) -> Timeline:
    """Build a Timeline (seconds, from the earliest start) from each rank's op records:
    (kind, microbatch, start, end), or (kind, microbatch, chunk, start, end) with v chunks."""
    p = len(per_rank_records)
    rows = [(rank, rec if len(rec) == 5 else (rec[0], rec[1], 0, rec[2], rec[3]))
            for rank, recs in enumerate(per_rank_records) for rec in recs]
    t0 = min(rec[3] for _, rec in rows)
    ops = [Op(rank, kind, mb, chunk, start - t0, end - t0)
           for rank, (kind, mb, chunk, start, end) in rows]
    return Timeline(schedule, p, m, v, sorted(ops, key=lambda o: (o.rank, o.start)))


def schedule_classes(pp_rank: int, pp_size: int) -> list[str]:
    """The schedule classes this rank's ``torch.distributed.pipelining`` offers (its
    ``Schedule*`` names): a job for :func:`jobs_worker`, where the package is loaded already."""
    from torch.distributed import pipelining

    return sorted(name for name in dir(pipelining) if name.startswith("Schedule"))


def jobs_worker(pp_rank: int, pp_size: int, jobs: Sequence[tuple[Callable, dict]]) -> list:
    """Several pipelines in one launch (one start-up, not one per job), one after the other:
    ``[fn(pp_rank, pp_size, **kwargs) for fn, kwargs in jobs]``, each job starting together
    on every rank."""
    results = []
    for fn, kwargs in jobs:
        dist.barrier()
        results.append(fn(pp_rank, pp_size, **kwargs))
    return results


def measure_bubble(p: int, ms: Sequence[int], *, schedule: str = "gpipe", impl: str = "scratch",
                   op_time_s: float = 0.005, microbatch: int = 8, width: int = 32,
                   depth: int | None = None, steps: int = 3,
                   timeout_s: float = 120.0) -> list[dict]:
    """Measure the idle fraction on p real ranks for each m in ``ms``, beside the formula.

    One launch runs every m, ``steps`` pipeline steps each, after a warm-up step that is
    dropped (one before the first m; before every m for ``impl="torch"``, which builds new
    stages for each). ``measured`` is the median over steps of 1 - busy / (p x makespan), busy
    time being the ranks' forward/backward spans (waiting in recv counts as idle).
    ``op_time_s``: see :func:`pipeline_worker` (0 = pure CPU compute, which shares the
    machine's cores). Returns [{"p", "m", "formula", "measured", "per_step", "timeline"}]
    (timeline: the step closest to the median, in seconds).
    """
    from course_utils import launch

    check_int("p", p)
    check_int("steps", steps)
    check_real("op_time_s", op_time_s, 0, strict=False, maximum=MAX_OP_TIME_S)
    if impl not in ("scratch", "torch"):
        raise ValueError(f"impl must be 'scratch' or 'torch', got {impl!r}")
    if schedule not in ("gpipe", "1f1b"):
        raise ValueError(f"schedule must be 'gpipe' or '1f1b', got {schedule!r}")
    check_ints("ms", ms)
    depth = depth or 2 * p
    worker = pipeline_worker if impl == "scratch" else torch_pipeline_worker
    jobs = [(worker, dict(schedule=schedule, m=m, seed=0, microbatch=microbatch, width=width,
                          depth=depth, steps=steps + (impl == "torch" or k == 0),
                          op_time_s=op_time_s)) for k, m in enumerate(ms)]
    results = launch.run(jobs_worker, p, jobs, timeout_s=timeout_s, threads_per_rank=1)
    rows = []
    for k, m in enumerate(ms):
        records = [res[k]["records"][-steps:] for res in results]  # the warm-up dropped
        timelines = [records_to_timeline([recs[s] for recs in records], schedule, m)
                     for s in range(steps)]
        fractions = [t.idle_fraction() for t in timelines]
        median = statistics.median(fractions)
        closest = min(range(len(fractions)), key=lambda s: abs(fractions[s] - median))
        rows.append({"p": p, "m": m, "formula": bubble_fraction(p, m), "measured": median,
                     "per_step": fractions, "timeline": timelines[closest]})
    return rows


def matmul_throughput(sizes: Sequence[int], width: int = 512, min_time_s: float = 0.05,
                      threads: int = 1) -> list[float]:
    """GFLOP/s of (size, width) @ (width, width) for each microbatch size, on ``threads``
    threads."""
    check_int("width", width)
    check_int("threads", threads)
    check_ints("sizes", sizes)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        w = torch.randn(width, width)  # (width, width)
        out = []
        for size in sizes:
            a = torch.randn(size, width)  # (size, width)
            for _ in range(3):
                a @ w  # warm-up
            reps, elapsed = 1, 0.0
            while True:
                t0 = clock()
                for _ in range(reps):
                    a @ w
                elapsed = clock() - t0
                if elapsed >= min_time_s:
                    break
                reps *= 2
            out.append(2.0 * size * width * width * reps / elapsed / 1e9)
        return out
    finally:
        torch.set_num_threads(saved)


# ----------------------------------------------------------------------------------- assignment


def _student_worker(pp_rank: int, pp_size: int, fn: Callable[..., Any], seed: int,
                    sizes: Sequence[int], width: int, depth: int) -> dict:
    """Rank body for :func:`run_student_pipeline`: build this stage, call fn, return plain data."""
    model = make_model(seed, width, depth).to(backend.device())
    stage = split_stages(model, pp_size)[pp_rank]
    x, y = backend.to_device(make_batch(seed, sum(sizes), width))
    x_mbs, y_mbs = list(x.split(list(sizes))), list(y.split(list(sizes)))  # (n_i, width) each
    loss = fn(stage, pp_rank, pp_size, x_mbs, y_mbs)
    if isinstance(loss, torch.Tensor):
        loss = to_numpy(loss)
    return {"loss": loss, "grads": [None if q.grad is None else to_numpy(q.grad)
                                    for q in stage.parameters()]}


def run_student_pipeline(fn: Callable[..., Any], pp_size: int, seed: int, sizes: Sequence[int],
                         width: int = 8, depth: int = 4, timeout_s: float = 50.0) -> list[dict]:
    """Run ``fn(stage, pp_rank, pp_size, x_mbs, y_mbs)`` on pp_size ranks; per rank {loss, grads}.

    Every rank builds ``make_model(seed, width, depth)``, keeps stage pp_rank of
    ``split_stages``, and gets the same microbatches of sizes ``sizes`` (each (n_i, width)).
    """
    from course_utils import launch

    check_int("pp_size", pp_size)
    check_ints("sizes", sizes)
    return launch.run(_student_worker, pp_size, fn, seed, list(sizes), width, depth,
                      timeout_s=timeout_s, show_output=False)


def microbatch_reference(seed: int, sizes: Sequence[int], width: int = 8, depth: int = 4,
                         p: int = 1, weighting: str = "examples") -> tuple[float, list[list]]:
    """One-process loss and stage-grouped grads (numpy) over microbatches of ``sizes``.

    ``weighting="examples"``: the mean over every example (what the full batch gives);
    ``"microbatches"``: each microbatch's mean counted equally (a different objective when the
    sizes differ).
    """
    if weighting not in ("examples", "microbatches"):
        raise ValueError(f"weighting must be 'examples' or 'microbatches', got {weighting!r}")
    model = make_model(seed, width, depth)
    x, y = make_batch(seed, sum(sizes), width)
    total = torch.zeros(())
    for x_mb, y_mb in zip(x.split(list(sizes)), y.split(list(sizes))):
        weight = len(x_mb) / len(x) if weighting == "examples" else 1 / len(sizes)
        total = total + nn.functional.mse_loss(model(x_mb), y_mb) * weight
    total.backward()
    return total.item(), [[to_numpy(q.grad) for q in st.parameters()]
                          for st in split_stages(model, p)]


def _demo(pp_rank: int, pp_size: int) -> str:
    """Torchrun demo: a GPipe step with 4 microbatches; the last rank reports the loss."""
    res = pipeline_worker(pp_rank, pp_size, "gpipe", 4)
    return f"loss={res['loss']:.6f}" if res["loss"] is not None else "sent activations/grads"


if __name__ == "__main__":
    from course_utils import launch

    launch.torchrun_main(_demo)

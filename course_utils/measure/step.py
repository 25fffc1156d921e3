"""The data-parallel step, timed by phase: the workers each rank runs.

Lecture 7, step 2 (measure).

:func:`dp_train` trains ``spec.steps`` steps and records, per step, the time in each phase
(``data``, ``forward``, ``backward``, ``wait`` = inside the gradient all-reduce, ``optimizer``),
the bytes this process sent (``/proc/self/io``, Linux), persistent state bytes
(:func:`course_utils.memory.sizing.count_state_bytes`) and, on request, the peak by category
from torch's ``MemTracker`` (a private torch API that works on CPU; pinned torch) or a
``torch.profiler`` summary. Every timer reads :func:`course_utils.runtime.clock.clock` (which
waits for a CUDA device first). A straggler (``RunSpec(straggler_rank=1,
straggler_delay_s=...)``) sleeps inside its forward pass: the *fast* ranks then show the extra
time, as waiting inside the collective.

:func:`dp_gradients` runs one step's forward and backward and returns the reduced gradient, for
the checks of :mod:`course_utils.measure.checks`; :func:`allreduce_gradients` is the manual
engine's reduction (one flat all-reduce, with an injectable scaling bug);
:func:`allreduce_bytes_sent` measures the bytes of one all-reduce. All are workers for
:func:`course_utils.launch.run`.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist

from course_utils.measure.profile import profile_rows
from course_utils.measure.spec import (GRAD_SCALINGS, RunSpec, check_world, corpus, flat_grad,
                                       make_optimizer)
from course_utils.memory import sizing as memory
from course_utils.models import tiny_lm
from course_utils.runtime import backend, validate
from course_utils.runtime.clock import bytes_written, clock

__all__ = ["allreduce_gradients", "dp_gradients", "dp_train", "dp_gradients_each",
           "dp_train_each", "allreduce_bytes_sent"]


def _scale_after_sum(scaling: str, world_size: int) -> float:
    """Factor applied to the all-reduced SUM of per-rank gradients.

    ``"double_mean"`` averages correctly here; its second division by D happens in the loss.
    """
    return 1.0 if scaling == "sum" else 1.0 / world_size


def allreduce_gradients(model: torch.nn.Module, world_size: int, scaling: str = "mean",
                        group: dist.ProcessGroup | None = None) -> dict[str, float]:
    """Average the gradients of ``model`` over ``group`` in one flat all-reduce.

    ``scaling="sum"`` injects the bug of never dividing by ``world_size`` (``"double_mean"``
    divides here like ``"mean"``: its bug is in the loss, see :func:`dp_gradients`). Returns
    ``{"wait_s": seconds inside the collective, "bytes_sent": bytes this rank wrote, or nan}``.
    """
    if scaling not in GRAD_SCALINGS:
        raise ValueError(f"scaling must be one of {GRAD_SCALINGS}; got {scaling!r}")
    validate.check_int("world_size", world_size)
    params = [p for p in model.parameters() if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params])                     # (N,)
    sent0, t0 = bytes_written(), clock(flat)  # clock: on CUDA, wait for backward's kernels first
    dist.all_reduce(flat, group=group)                                         # sum over ranks
    wait_s = clock(flat) - t0  # on CUDA, all_reduce returns once enqueued: wait for it
    sent1 = bytes_written()
    flat.mul_(_scale_after_sum(scaling, world_size))
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n
    sent = float(sent1 - sent0) if sent0 is not None and sent1 is not None else math.nan
    return {"wait_s": wait_s, "bytes_sent": sent}


class _TimedHookState:
    """What the DDP communication hook records: seconds waited and bytes sent, summed."""

    def __init__(self, world_size: int, scaling: str):
        self.world_size, self.scaling = world_size, scaling
        self.wait_s, self.bytes_sent = 0.0, 0.0

    def reset(self) -> None:
        self.wait_s, self.bytes_sent = 0.0, 0.0


def _timed_allreduce_hook(state: _TimedHookState, bucket: dist.GradBucket) -> torch.futures.Future:
    """DDP comm hook: a blocking, timed all-reduce of one gradient bucket, then the scaling."""
    buf = bucket.buffer()                                                      # (bucket numel,)
    sent0, t0 = bytes_written(), clock(buf)
    dist.all_reduce(buf)
    state.wait_s += clock(buf) - t0
    sent1 = bytes_written()
    state.bytes_sent += (sent1 - sent0) if sent0 is not None and sent1 is not None else math.nan
    buf.mul_(_scale_after_sum(state.scaling, state.world_size))
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(buf)
    return fut


# DDP inspects the hook's annotations and wants real objects, not the strings that
# ``from __future__ import annotations`` leaves behind.
_timed_allreduce_hook.__annotations__.update(
    state=_TimedHookState, bucket=dist.GradBucket, **{"return": torch.futures.Future[torch.Tensor]})


# ------------------------------------------------------------------------------ rank workers


def dp_gradients(rank: int, world_size: int, spec: RunSpec) -> dict[str, Any]:
    """Worker: one forward/backward of step 0 on this rank's shard, then the gradient reduction.

    Returns ``{"loss": mean of the ranks' local losses, "grad": (N,) numpy array}``; with
    ``spec.scaling="double_mean"`` the loss is divided by ``world_size`` before backward.
    """
    check_world(spec, world_size)
    model = tiny_lm.build(spec.cfg, spec.seed).to(backend.device())
    hook_state = _TimedHookState(world_size, spec.scaling)
    if spec.engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model)
        if spec.scaling != "mean":  # correct averaging: DDP's own built-in all-reduce
            model.register_comm_hook(hook_state, _timed_allreduce_hook)
    x, y = corpus(spec).batch(0, spec.global_batch, spec.cfg.seq_len)          # (B, T) each
    x, y = (tiny_lm.shard_batch(t, rank, world_size).to(backend.device())
            for t in (x, y))                                                   # (B/D, T)
    loss = tiny_lm.lm_loss(model, x, y)
    # the bug: scale the loss by 1/D by hand, although the reduction already averages
    (loss / world_size if spec.scaling == "double_mean" else loss).backward()
    if spec.engine == "manual":
        allreduce_gradients(model, world_size, spec.scaling)
    logged = loss.detach().clone()
    dist.all_reduce(logged)
    # numpy, not a tensor: a tensor travels back through torch's shared-memory pickler,
    # which needs this process alive after it has sent the result (a race at exit)
    return {"loss": logged.item() / world_size,
            "grad": backend.to_cpu(flat_grad(model).detach()).numpy()}


@contextlib.contextmanager
def _phase(times: dict[str, float], name: str, prof_labels: bool,
           device: torch.device) -> Iterator[None]:
    ctx = torch.profiler.record_function(f"phase:{name}") if prof_labels else \
        contextlib.nullcontext()
    t0 = clock(device)
    with ctx:
        yield
    times[name] = times.get(name, 0.0) + clock(device) - t0


def dp_train(rank: int, world_size: int, spec: RunSpec) -> dict[str, Any]:
    """Worker: train ``spec.steps`` data-parallel steps, timing every phase of every step.

    Returns a picklable dict: ``rank``, ``spec`` (as a dict), ``steps`` (one dict per step:
    seconds per phase, ``step_s``, ``bytes_sent``, ``local_tokens``), ``losses`` (global mean
    loss per step), ``state_bytes`` (after the first step), ``peak_bytes`` (MemTracker peak by
    category, when ``spec.track_memory``), ``profile`` (rows, when ``spec.profile``).
    """
    check_world(spec, world_size)
    device = backend.device()  # this rank's GPU under NCCL, else the CPU; clock() waits for it
    model = tiny_lm.build(spec.cfg, spec.seed).to(device)
    hook_state = _TimedHookState(world_size, spec.scaling)
    module = model
    if spec.engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model)
        model.register_comm_hook(hook_state, _timed_allreduce_hook)
    opt = make_optimizer(spec, model)
    data = corpus(spec)
    local_batch = spec.global_batch // world_size
    records, local_losses, state_bytes, peak = [], [], None, None
    prof, prof_ctx, prof_rows = None, contextlib.nullcontext(), []
    if spec.profile:  # started before the warm-up steps, which absorb its start-up cost
        from torch.profiler import ProfilerActivity, profile, schedule

        n_active = spec.steps - spec.warmup_steps
        prof_ctx = profile(
            activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                                 if device.type == "cuda" else []),
            schedule=schedule(wait=0, warmup=spec.warmup_steps, active=n_active, repeat=1),
            on_trace_ready=lambda p: prof_rows.extend(profile_rows(p, n_active)))
        prof = prof_ctx.__enter__()
    for step in range(spec.steps):
        tracker = None
        if spec.track_memory and step == spec.steps - 1:
            from torch.distributed._tools.mem_tracker import MemTracker

            tracker = MemTracker()
            tracker.track_external(module, opt)
            tracker.__enter__()
            backend.reset_peak_memory(device)
        times: dict[str, float] = {}
        hook_state.reset()
        t_step = clock(device)
        with _phase(times, "data", spec.profile, device):
            x, y = data.batch(step, spec.global_batch, spec.cfg.seq_len)         # (B, T)
            x, y = (tiny_lm.shard_batch(t, rank, world_size).to(device)
                    for t in (x, y))                                            # (B/D, T)
        with _phase(times, "forward", spec.profile, device):
            if rank == spec.straggler_rank and spec.straggler_delay_s > 0:
                time.sleep(spec.straggler_delay_s)  # the injected straggler: slow compute
            loss = tiny_lm.lm_loss(model, x, y)
        with _phase(times, "backward", spec.profile, device):
            (loss / world_size if spec.scaling == "double_mean" else loss).backward()
        with _phase(times, "wait", spec.profile, device):
            if spec.engine == "manual":
                comm = allreduce_gradients(model, world_size, spec.scaling)
            else:  # DDP already all-reduced inside backward, in the hook: move that time here
                comm = {"wait_s": hook_state.wait_s, "bytes_sent": hook_state.bytes_sent}
        if spec.engine == "ddp":
            times["backward"] -= comm["wait_s"]
            times["wait"] += comm["wait_s"]
        else:
            times["wait"] = comm["wait_s"]
        with _phase(times, "optimizer", spec.profile, device):
            opt.step()
            if step == 0:  # persistent state, counted while the gradients still exist
                state_opt = opt.optim if spec.optimizer == "zero1_adamw" else opt
                state_bytes = memory.count_state_bytes(module, state_opt)
            opt.zero_grad()
        times["step_s"] = clock(device) - t_step
        if tracker is not None:
            tracker.__exit__(None, None, None)
            snap = tracker.get_tracker_snapshot("peak")
            peak = {str(getattr(k, "value", k)).lower(): int(v) for k, v in snap[device].items()}
            cuda_peak = backend.peak_memory_bytes(device)  # the allocator's own peak (CUDA only)
            if cuda_peak is not None:
                peak["cuda_max_memory_allocated"] = cuda_peak
        times["bytes_sent"] = comm["bytes_sent"]
        times["local_tokens"] = local_batch * spec.cfg.seq_len
        records.append(times)
        local_losses.append(loss.item())
        if prof is not None:
            prof.step()
    if prof is not None:
        prof_ctx.__exit__(None, None, None)
    losses = torch.tensor(local_losses, dtype=torch.float64)                   # (steps,)
    dist.all_reduce(losses)
    losses = (losses / world_size).tolist()
    if spec.log_every and rank == 0:
        for step, value in enumerate(losses):
            if (step + 1) % spec.log_every == 0 or step == 0:
                print(f"step {step + 1:>3}/{spec.steps}  loss {value:.3f}")
    return {"rank": rank, "world_size": world_size, "spec": asdict(spec), "steps": records,
            "losses": losses, "state_bytes": state_bytes, "peak_bytes": peak,
            "profile": prof_rows if spec.profile else None}


def dp_gradients_each(rank: int, world_size: int, specs: Sequence[RunSpec]) -> list[dict[str, Any]]:
    """Worker: :func:`dp_gradients` for each spec in turn (one launch for several checks)."""
    return [dp_gradients(rank, world_size, spec) for spec in specs]


def dp_train_each(rank: int, world_size: int, specs: Sequence[RunSpec]) -> list[dict[str, Any]]:
    """Worker: :func:`dp_train` for each spec in turn (one launch for several runs)."""
    return [dp_train(rank, world_size, spec) for spec in specs]


def allreduce_bytes_sent(rank: int, world_size: int, n_elements: int) -> dict[str, float]:
    """Worker: bytes this rank sends in one fp32 all-reduce of ``n_elements`` (after a warm-up)."""
    validate.check_int("n_elements", n_elements)
    t = torch.ones(n_elements, device=backend.device())                        # (n,) fp32
    dist.all_reduce(t)  # warm-up: connections and buffers
    dist.barrier()
    before = bytes_written()
    dist.all_reduce(t)
    after = bytes_written()
    sent = float(after - before) if before is not None and after is not None else math.nan
    return {"payload_bytes": 4.0 * n_elements, "bytes_sent": sent}

"""Measuring a data-parallel run: verify the scaling first, then time, memory and collective waits.

The order matters. A run with a gradient-scaling bug can look healthy (its loss curve may even
match, see below) and will benchmark as fast as a correct one, so:

1. **Verify** (:func:`dp_gradients`, :func:`check_gradient_scaling`, :func:`check_losses`):
   gradients and losses from ``D`` ranks equal a single-process run on the same global batch
   (:func:`reference_gradients`, :func:`reference_losses`). An injected bug (``scaling="sum"``:
   gradients summed but never divided by ``D``; ``scaling="double_mean"``: loss divided by ``D``
   *and* gradients averaged) changes the gradient norm by ``D`` or ``1/D``, and the check names
   it. With Adam the *loss curve* barely notices such a bug (Adam divides the gradient by its
   own running RMS, so a constant factor cancels): check gradients, not only losses.
2. **Measure** (:func:`dp_train` on every rank, :func:`summarize` after): per rank and per step,
   the time in each phase (``data``, ``forward``, ``backward``, ``wait`` = inside the gradient
   all-reduce, ``optimizer``; read with :func:`clock`, which waits for a CUDA device first),
   tokens/s, the bytes this process sent (``/proc/self/io``, Linux), persistent state bytes
   (:func:`course_utils.memory.sizing.count_state_bytes`) and the peak by category from torch's
   ``MemTracker`` (a private torch API that works on CPU; pinned torch).
   A straggler (``RunSpec(straggler_rank=1, straggler_delay_s=...)``) sleeps inside its forward
   pass: the *fast* ranks then show the extra time, as waiting inside the collective.
3. **Profile** (``RunSpec(profile=True)``): ``torch.profiler`` on every rank, summarised by
   :func:`profile_rows` into phase totals and the top operators. The wait for a gloo collective
   shows up as *self time* of the enclosing ``wait`` region, not under an operator.

Predictions to set beside the measurements: :func:`predicted_allreduce_bytes` (a ring
all-reduce sends ``2 (D-1)/D x bytes`` per rank) and :mod:`course_utils.memory.sizing`
(``state_bytes``, ``zero_state_bytes``).

Under torchrun (the same worker on real launchers)::

    torchrun --standalone --nproc-per-node 2 -m course_utils.measure.run
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist

from course_utils import style
from course_utils.runtime import backend
from course_utils.memory import sizing as memory
from course_utils.models import tiny_lm
from course_utils.runtime.backend import synchronize  # noqa: F401 - the measure API
from course_utils.runtime.clock import busy_reason, bytes_written, clock, warn_if_busy  # noqa: F401
from course_utils.runtime.validate import check_int as _check_int

__all__ = ["GRAD_SCALINGS", "ENGINES", "OPTIMIZERS", "PHASES", "RunSpec", "ScalingReport",
           "reference_gradients", "reference_losses", "dp_gradients", "dp_train",
           "dp_gradients_each", "dp_train_each",
           "allreduce_gradients", "check_gradient_scaling", "check_losses",
           "predicted_allreduce_bytes", "bytes_written", "allreduce_bytes_sent", "summarize",
           "profile_rows", "profile_table", "format_table", "plot_step_breakdown",
           "plot_loss_curves", "throughput", "wait_fraction", "synchronize", "clock"]

GRAD_SCALINGS = ("mean", "sum", "double_mean")
ENGINES = ("manual", "ddp")
OPTIMIZERS = ("adamw", "sgd", "zero1_adamw")
PHASES = ("data", "forward", "backward", "wait", "optimizer")
_N_SUCCESSORS = 4  # Markov corpus: likely successors per token


@dataclass(frozen=True)
class RunSpec:
    """One data-parallel training run of :class:`course_utils.models.tiny_lm.TinyLM`.

    ``global_batch`` sequences of ``cfg.seq_len`` tokens per step, split evenly over the ranks.
    ``scaling`` injects a gradient-scaling bug (``"mean"`` is correct). ``engine="ddp"`` uses
    ``DistributedDataParallel`` with a timing communication hook; ``"manual"`` all-reduces one
    flat buffer after backward. ``warmup_steps`` are run but left out of :func:`summarize`.
    """

    cfg: tiny_lm.TinyLMConfig = field(default_factory=tiny_lm.TinyLMConfig)
    global_batch: int = 16
    steps: int = 8
    lr: float = 3e-3
    seed: int = 0
    data_seed: int = 0
    optimizer: str = "adamw"
    scaling: str = "mean"
    engine: str = "manual"
    straggler_rank: int | None = None
    straggler_delay_s: float = 0.0
    warmup_steps: int = 1
    log_every: int = 0
    profile: bool = False
    track_memory: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.cfg, tiny_lm.TinyLMConfig):
            raise ValueError(f"cfg must be a TinyLMConfig; got {type(self.cfg).__name__}")
        for name, low in (("global_batch", 1), ("steps", 1), ("seed", 0), ("data_seed", 0),
                          ("warmup_steps", 0), ("log_every", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}; got {value!r}")
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps must be smaller than steps={self.steps}; "
                             f"got {self.warmup_steps}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not self.lr > 0:
            raise ValueError(f"lr must be a positive number; got {self.lr!r}")
        for name, allowed in (("optimizer", OPTIMIZERS), ("scaling", GRAD_SCALINGS),
                              ("engine", ENGINES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}; got {getattr(self, name)!r}")
        if self.straggler_rank is not None and (isinstance(self.straggler_rank, bool) or not
                                                isinstance(self.straggler_rank, int)
                                                or self.straggler_rank < 0):
            raise ValueError(f"straggler_rank must be None or an int >= 0; "
                             f"got {self.straggler_rank!r}")
        if self.profile and self.track_memory:
            raise ValueError("profile and track_memory cannot both be True: each tool slows and "
                             "distorts what the other measures; run them separately")
        delay = self.straggler_delay_s
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= 10:
            raise ValueError(f"straggler_delay_s must be a number of seconds from 0 to 10; "
                             f"got {delay!r}")

    def tokens_per_step(self) -> int:
        """Tokens in one global batch: global_batch x seq_len."""
        return self.global_batch * self.cfg.seq_len


def _check_world(spec: RunSpec, world_size: int) -> None:
    if spec.global_batch % world_size:
        raise ValueError(f"global_batch={spec.global_batch} must divide evenly over "
                         f"world_size={world_size} ranks")
    if spec.straggler_rank is not None and spec.straggler_rank >= world_size:
        raise ValueError(f"straggler_rank must be below world_size={world_size}; "
                         f"got {spec.straggler_rank}")


def _corpus(spec: RunSpec) -> tiny_lm.MarkovCorpus:
    return tiny_lm.MarkovCorpus(spec.cfg.vocab_size, _N_SUCCESSORS, spec.data_seed)


def _optimizer(spec: RunSpec, model: torch.nn.Module) -> torch.optim.Optimizer:
    params = list(model.parameters())
    if spec.optimizer == "sgd":
        return torch.optim.SGD(params, lr=spec.lr)
    if spec.optimizer == "zero1_adamw":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=spec.lr)
    return torch.optim.AdamW(params, lr=spec.lr)


def _flat_grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])          # (N,)


# ------------------------------------------------------------------------- single-process truth


def reference_gradients(spec: RunSpec) -> dict[str, Any]:
    """Single process, whole global batch of step 0: ``{"loss": float, "grad": (N,) tensor}``."""
    if not isinstance(spec, RunSpec):
        raise ValueError(f"spec must be a RunSpec; got {type(spec).__name__}")
    model = tiny_lm.build(spec.cfg, spec.seed)
    x, y = _corpus(spec).batch(0, spec.global_batch, spec.cfg.seq_len)          # (B, T) each
    loss = tiny_lm.lm_loss(model, x, y)
    loss.backward()
    return {"loss": loss.item(), "grad": _flat_grad(model).detach()}


def reference_losses(spec: RunSpec) -> list[float]:
    """Single process: the loss at each of ``spec.steps`` steps, same data and optimizer."""
    if not isinstance(spec, RunSpec):
        raise ValueError(f"spec must be a RunSpec; got {type(spec).__name__}")
    model = tiny_lm.build(spec.cfg, spec.seed)
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr) if spec.optimizer == "sgd" else \
        torch.optim.AdamW(model.parameters(), lr=spec.lr)  # ZeRO-1 must match plain AdamW
    corpus, losses = _corpus(spec), []
    for step in range(spec.steps):
        x, y = corpus.batch(step, spec.global_batch, spec.cfg.seq_len)
        loss = tiny_lm.lm_loss(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


# ---------------------------------------------------------------------------- the collectives


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
    _check_int("world_size", world_size)
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
    _check_world(spec, world_size)
    model = tiny_lm.build(spec.cfg, spec.seed).to(backend.device())
    hook_state = _TimedHookState(world_size, spec.scaling)
    if spec.engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model)
        if spec.scaling != "mean":  # correct averaging: DDP's own built-in all-reduce
            model.register_comm_hook(hook_state, _timed_allreduce_hook)
    x, y = _corpus(spec).batch(0, spec.global_batch, spec.cfg.seq_len)          # (B, T) each
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
            "grad": backend.to_cpu(_flat_grad(model).detach()).numpy()}


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
    _check_world(spec, world_size)
    device = backend.device()  # this rank's GPU under NCCL, else the CPU; clock() waits for it
    model = tiny_lm.build(spec.cfg, spec.seed).to(device)
    hook_state = _TimedHookState(world_size, spec.scaling)
    module = model
    if spec.engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model)
        model.register_comm_hook(hook_state, _timed_allreduce_hook)
    opt = _optimizer(spec, model)
    corpus = _corpus(spec)
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
            x, y = corpus.batch(step, spec.global_batch, spec.cfg.seq_len)       # (B, T)
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
    _check_int("n_elements", n_elements)
    t = torch.ones(n_elements, device=backend.device())                        # (n,) fp32
    dist.all_reduce(t)  # warm-up: connections and buffers
    dist.barrier()
    before = bytes_written()
    dist.all_reduce(t)
    after = bytes_written()
    sent = float(after - before) if before is not None and after is not None else math.nan
    return {"payload_bytes": 4.0 * n_elements, "bytes_sent": sent}


# ---------------------------------------------------------------------------------- checking


@dataclass(frozen=True)
class ScalingReport:
    """Distributed vs single-process gradients: ``ok`` and, when not, the likely bug."""

    ok: bool
    norm_ratio: float        # ||g_dp|| / ||g_ref||
    cosine: float            # direction agreement, 1.0 = same direction
    max_abs_diff: float
    diagnosis: str


def check_gradient_scaling(dp_grad: torch.Tensor, ref_grad: torch.Tensor, world_size: int, *,
                           rtol: float = 1e-4, atol: float = 1e-6) -> ScalingReport:
    """Compare a reduced gradient (N,) with the single-process one (N,) and name the bug, if any.

    Both may be torch tensors or numpy arrays.
    """
    tensors = []
    for name, t in (("dp_grad", dp_grad), ("ref_grad", ref_grad)):
        if type(t).__module__ == "numpy":
            t = torch.from_numpy(t)
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or not t.is_floating_point():
            raise ValueError(f"{name} must be a 1-D floating-point tensor or array (flat gradient)")
        tensors.append(t)
    dp_grad, ref_grad = tensors
    if dp_grad.shape != ref_grad.shape:
        raise ValueError(f"dp_grad and ref_grad must have the same shape; got "
                         f"{tuple(dp_grad.shape)} and {tuple(ref_grad.shape)}")
    _check_int("world_size", world_size)
    a, b = dp_grad.double(), ref_grad.double()
    ref_norm = b.norm().item()
    if ref_norm == 0:
        raise ValueError("ref_grad is all zeros: nothing to compare against")
    ratio = a.norm().item() / ref_norm
    cosine = (a @ b).item() / max(a.norm().item() * ref_norm, 1e-300)
    max_diff = (a - b).abs().max().item()
    ok = bool(torch.allclose(a, b, rtol=rtol, atol=atol))
    d = world_size
    if ok:
        diagnosis = "gradients match the single-process run"
    elif cosine < 0.999:
        diagnosis = (f"gradients point elsewhere (cosine {cosine:.4f}): ranks saw different or "
                     "overlapping data, started from different weights, or the reduction mixed "
                     "up parameters")
    elif d > 1 and math.isclose(ratio, d, rel_tol=0.02):
        diagnosis = (f"gradient norm is {ratio:.3g}x the reference = world size {d}: gradients "
                     f"were summed over ranks but never divided by {d}")
    elif d > 1 and math.isclose(ratio, 1 / d, rel_tol=0.02):
        diagnosis = (f"gradient norm is 1/{d} of the reference: divided by the world size twice "
                     "(loss scaled by 1/D by hand, and the reduction averages as well)")
    else:
        diagnosis = (f"same direction but norm ratio {ratio:.4g}: a normalization factor is "
                     "wrong (world size, accumulation steps, or token count)")
    return ScalingReport(ok, ratio, cosine, max_diff, diagnosis)


def check_losses(dp_losses: Sequence[float], ref_losses: Sequence[float], *,
                 atol: float = 1e-4) -> float:
    """Largest |dp - ref| over steps; raises AssertionError naming the first step beyond ``atol``."""
    if len(dp_losses) != len(ref_losses) or not len(ref_losses):
        raise ValueError(f"dp_losses and ref_losses must be non-empty and equally long; got "
                         f"{len(dp_losses)} and {len(ref_losses)}")
    diffs = [abs(float(a) - float(b)) for a, b in zip(dp_losses, ref_losses)]
    for step, (diff, a, b) in enumerate(zip(diffs, dp_losses, ref_losses)):
        if diff > atol:
            raise AssertionError(f"loss differs from the single-process run at step {step + 1}: "
                                 f"{a:.6f} vs {b:.6f} (|diff| {diff:.2e} > {atol:g})")
    return max(diffs)


# --------------------------------------------------------------------------------- summaries


def predicted_allreduce_bytes(n_bytes: float, world_size: int) -> float:
    """Bytes each rank sends in a ring all-reduce of ``n_bytes``: 2 (D-1)/D x n_bytes."""
    if isinstance(n_bytes, bool) or not isinstance(n_bytes, (int, float)) or not n_bytes >= 0:
        raise ValueError(f"n_bytes must be a non-negative number; got {n_bytes!r}")
    _check_int("world_size", world_size)
    return 2 * (world_size - 1) / world_size * n_bytes


def throughput(tokens: float, seconds: float) -> float:
    """Tokens per second: tokens / seconds."""
    for name, value in (("tokens", tokens), ("seconds", seconds)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a positive number; got {value!r}")
    return tokens / seconds


def wait_fraction(wait_s: float, step_s: float) -> float:
    """Fraction of a step spent inside collectives: wait_s / step_s, from 0 to 1."""
    for name, value in (("wait_s", wait_s), ("step_s", step_s)):
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value < 0):
            raise ValueError(f"{name} must be a finite non-negative number; got {value!r}")
    if step_s == 0 or wait_s > step_s:
        raise ValueError(f"need 0 <= wait_s <= step_s and step_s > 0; got wait_s={wait_s}, "
                         f"step_s={step_s}")
    return wait_s / step_s


def summarize(results: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
    """One row per rank from :func:`dp_train` results (warm-up steps left out).

    Columns: ``rank``, mean milliseconds per phase and per step (``step_ms``), ``tokens_per_s``
    (this rank's tokens / its mean step time), ``global_tokens_per_s`` (global batch tokens /
    the slowest rank's mean step time), ``wait_fraction``, ``idle_ms`` (wait beyond the
    fastest rank's wait in the same step: time spent waiting for a peer rather than moving
    bytes), ``bytes_sent`` per step.
    """
    if not results or not all(isinstance(r, dict) and "steps" in r for r in results):
        raise ValueError("results must be the list dp_train returns from launch.run (one per rank)")
    skip = results[0]["spec"]["warmup_steps"]
    steps = [r["steps"][skip:] for r in results]
    n = len(steps[0])
    min_wait = [min(s[i]["wait"] for s in steps) for i in range(n)]
    mean_step = [sum(rec["step_s"] for rec in s) / n for s in steps]
    global_tokens = results[0]["spec"]["global_batch"] * results[0]["spec"]["cfg"]["seq_len"]
    rows = []
    for r, s in zip(results, steps):
        row: dict[str, float] = {"rank": r["rank"]}
        for phase in PHASES:
            row[f"{phase}_ms"] = 1e3 * sum(rec[phase] for rec in s) / n
        row["step_ms"] = 1e3 * sum(rec["step_s"] for rec in s) / n
        row["tokens_per_s"] = s[0]["local_tokens"] / (row["step_ms"] / 1e3)
        row["global_tokens_per_s"] = global_tokens / max(mean_step)
        row["wait_fraction"] = row["wait_ms"] / row["step_ms"]
        row["idle_ms"] = 1e3 * sum(rec["wait"] - m for rec, m in zip(s, min_wait)) / n
        row["bytes_sent"] = sum(rec["bytes_sent"] for rec in s) / n
        rows.append(row)
    return rows


def profile_rows(prof: Any, n_steps: int = 1, top: int = 6) -> list[dict[str, Any]]:
    """``torch.profiler`` results as rows ``{"name", "kind", "calls", "ms_per_step"}``.

    Phase regions (``kind="phase"``, total time, self time inside ``wait`` is the blocking wait)
    come first, then the ``top`` operators by self CPU time (``kind="op"``).
    """
    _check_int("n_steps", n_steps)
    events = list(prof.key_averages())
    rows = []
    for phase in PHASES:
        for e in events:
            if e.key == f"phase:{phase}":
                rows.append({"name": phase, "kind": "phase", "calls": e.count // n_steps,
                             "ms_per_step": e.cpu_time_total / 1e3 / n_steps})
    ops = sorted((e for e in events if not e.key.startswith(("phase:", "ProfilerStep"))),
                 key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    for e in ops:
        rows.append({"name": e.key, "kind": "op", "calls": e.count // n_steps,
                     "ms_per_step": e.self_cpu_time_total / 1e3 / n_steps})
    return rows


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None,
                 digits: int = 2, headers: dict[str, str] | None = None) -> str:
    """Rows of dicts as an aligned text table (floats with ``digits`` decimals).

    ``headers`` maps a column to the words shown above it (``{"forward_ms": "forward"}``), to
    keep a table narrow; a column it leaves out shows its own name.
    """
    if not rows:
        raise ValueError("rows must be a non-empty list of dicts")
    columns = list(columns or rows[0].keys())
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise ValueError(f"columns not in rows: {missing}; available: {list(rows[0])}")
    headers = headers or {}

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "nan" if v != v else f"{v:,.{digits}f}"
        return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)

    names = [str(headers.get(c, c)) for c in columns]
    body = [[cell(r[c]) for c in columns] for r in rows]
    widths = [max(len(n), *(len(b[i]) for b in body)) for i, n in enumerate(names)]
    lines = ["  ".join(n.rjust(w) for n, w in zip(names, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def profile_table(results: Sequence[dict[str, Any]], top: int = 3, digits: int = 2) -> str:
    """The profiles of all ranks side by side: milliseconds per step, one column per rank.

    ``results`` is what :func:`dp_train` with ``RunSpec(profile=True)`` returns (one per rank).
    The phase rows come first (total time of each phase), then the operators among the ``top``
    by self time on any rank; ``-`` where that operator is not among a rank's recorded ones.
    """
    if not results or not all(isinstance(r, dict) and r.get("profile") for r in results):
        raise ValueError("results must be the list dp_train returns with RunSpec(profile=True)")
    _check_int("top", top, 0)
    by_rank = [{(row["kind"], row["name"]): row["ms_per_step"] for row in r["profile"]}
               for r in results]
    ops: list[str] = []
    for r in results:
        for row in [row for row in r["profile"] if row["kind"] == "op"][:top]:
            if row["name"] not in ops:
                ops.append(row["name"])
    ops.sort(key=lambda name: -max(t.get(("op", name), 0.0) for t in by_rank))
    keys = [("phase", p) for p in PHASES if any(("phase", p) in t for t in by_rank)]
    keys += [("op", name) for name in ops]
    first = "ms per step"
    names = [first] + [f"rank {r['rank']}" for r in results]
    body = [[name] + [f"{t[(kind, name)]:,.{digits}f}" if (kind, name) in t else "-"
                      for t in by_rank] for kind, name in keys]
    widths = [max(len(names[0]), len("operators (self time)"), *(len(b[0]) for b in body))]
    widths += [max(len(n), *(len(b[i]) for b in body)) for i, n in enumerate(names) if i]
    lines = ["  ".join([names[0].ljust(widths[0])] + [n.rjust(w) for n, w in
                                                      zip(names[1:], widths[1:])])]
    for i, b in enumerate(body):
        if ops and i == len(keys) - len(ops):
            lines.append("operators (self time)")
        lines.append("  ".join([b[0].ljust(widths[0])] + [v.rjust(w) for v, w in
                                                          zip(b[1:], widths[1:])]))
    return "\n".join(lines)


_PHASE_COLORS = {"data": style.PHASE_COLORS["data"], "forward": style.PHASE_COLORS["forward"],
                 "backward": style.PHASE_COLORS["backward"], "wait": style.PHASE_COLORS["wait"],
                 "optimizer": style.STATE_COLORS["master"]}  # style has no optimizer phase


def plot_step_breakdown(rows: Sequence[dict[str, float]], title: str = "", ax: Any = None,
                        legend: bool = True) -> Any:
    """Horizontal stacked bars, one per rank: mean ms per phase of a step, the measured step
    time (phases plus the little between them) at the end of each bar. ``legend=False`` leaves
    the phase legend out (for a second panel under a first one). Returns the axes."""
    import matplotlib.pyplot as plt

    if not rows:
        raise ValueError("rows must be the non-empty list summarize() returns")
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 1.2 + 0.5 * len(rows)))
    for i, row in enumerate(rows):
        left = 0.0
        for phase in PHASES:
            width = row[f"{phase}_ms"]
            ax.barh(i, width, left=left, color=_PHASE_COLORS[phase],
                    label=phase if i == 0 else None)
            left += width
        ax.annotate(f"{row['step_ms']:.0f} ms", (max(left, row["step_ms"]), i), xytext=(4, 0),
                    textcoords="offset points", va="center")
    ax.set_yticks(range(len(rows)), [f"rank {int(r['rank'])}" for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, max(ax.get_xlim()[1], 1.15 * max(r["step_ms"] for r in rows)))
    ax.set_xlabel("mean time per step (ms)")
    if legend:
        ax.legend(ncols=len(PHASES), loc="lower center", bbox_to_anchor=(0.5, 1.0),
                  frameon=False)
    if title:
        ax.set_title(title, pad=22 if legend else 6)
    return ax


def plot_loss_curves(reference: Sequence[float], runs: dict[str, Sequence[float]],
                     title: str = "", ax: Any = None, ylabel: bool = True) -> Any:
    """Loss per step: the single-process ``reference`` as a wide grey band, each run in ``runs``
    (label -> losses) as markers on top, so runs that equal the reference sit inside the band.
    ``ylabel=False`` for a panel beside another that shares its y axis. Returns the axes."""
    import matplotlib.pyplot as plt

    if not runs or any(len(v) != len(reference) for v in runs.values()) or not len(reference):
        raise ValueError("reference and every run must be non-empty loss lists of equal length")
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.4))
    steps = range(1, len(reference) + 1)
    ax.plot(steps, reference, color="0.75", lw=7, solid_capstyle="round", label="one process")
    looks = [dict(marker="o", ms=8, mfc="none", ls="none"), dict(marker="x", ms=8, ls="--")]
    for k, (name, losses) in enumerate(runs.items()):
        ax.plot(steps, losses, color=style.AXIS_COLORS["dp"], mew=1.5, label=name,
                **looks[k % len(looks)])
    ax.set_xticks(list(steps))
    ax.set_xlabel("step")
    if ylabel:
        ax.set_ylabel("loss (nats/token)")
    if title:
        ax.set_title(title)
    return ax


def demo(rank: int, world_size: int, steps: int = 8) -> dict[str, float]:
    """torchrun entry: train ``steps`` steps and return this rank's mean step time and wait (ms)."""
    spec = replace(RunSpec(), steps=steps, log_every=max(1, steps // 4))
    out = dp_train(rank, world_size, spec)
    n = len(out["steps"]) - spec.warmup_steps
    return {"step_ms": round(1e3 * sum(s["step_s"] for s in out["steps"][1:]) / n, 2),
            "wait_ms": round(1e3 * sum(s["wait"] for s in out["steps"][1:]) / n, 2)}


if __name__ == "__main__":
    from course_utils.launch import torchrun_main

    torchrun_main(demo)

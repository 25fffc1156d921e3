"""Overlap: all-reduce the gradients by buckets while backward is still running.

Backward produces gradients from the last layer to the first. A data-parallel step that waits
for the whole backward and then all-reduces every gradient leaves the network idle during
backward and the processor idle during the all-reduce. Cut the gradients into **buckets** of
about ``bucket_mb`` MiB, in the order backward produces them (reverse parameter order), and
start each bucket's all-reduce (``dist.all_reduce(..., async_op=True)``) as soon as its last
gradient is ready: the communication of the later layers runs while backward computes the
earlier ones, and only what is left when backward ends is *exposed* (waited for).

* :class:`BucketAllReduce`: the course's own version, hooks
  (``register_post_accumulate_grad_hook``) filling buckets of :func:`bucket_assignment`; with
  ``bucket_mb=None``, one all-reduce of everything after backward (no overlap), to compare.
* :func:`grads_worker` / :func:`reference_grads`: its gradients equal
  ``DistributedDataParallel(model, bucket_cap_mb=...)``'s and one process's on the full batch.
* :func:`timing_worker` / :func:`measure_overlap`: per bucket size, on real ranks, the median
  step time, compute alone (backward with no communication), communication alone, and the time
  blocked in ``work.wait()`` after backward (the exposed communication).
* :func:`simulate` / :func:`plot_timeline`: the timeline of a step, from a per-bucket cost model
  (latency + bytes / bandwidth), which shows when overlap cannot help: the last bucket has no
  backward left to hide behind, small buckets pay the latency many times, one large bucket
  starts only when backward ends; and every bucket in flight holds a flat copy of its
  gradients (memory headroom, :func:`bucket_copy_bytes`).

Timing: on gloo (CPU) a collective runs on gloo's worker threads and ``work.wait()`` blocks
until the result is in place, so ``time.perf_counter`` around it is right. On CUDA, NCCL runs on its
own stream and the call (even ``wait()``) returns once the work is enqueued: every clock here is
:func:`course_utils.runtime.clock.clock`, which synchronizes the device first. That synchronization
also drains NCCL's stream before the wait is timed, so on CUDA ``wait_ms`` reads near 0 and the
exposed communication is ``step_ms - compute_ms`` (or read it from CUDA events / the profiler).

Run the equality check under torchrun (each rank prints its largest difference from one
process)::

    torchrun --standalone --nproc-per-node 2 -m course_utils.data_parallel.overlap
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from course_utils import launch
from course_utils.models.toy import toy_mlp
from course_utils.runtime import backend
from course_utils.runtime import clock as timing
from course_utils.runtime.validate import check_int, check_ints, check_real

__all__ = ["MIB", "BUCKET_SIZES", "make_mlp", "make_batch", "param_sizes", "bucket_assignment",
           "bucket_copy_bytes", "bucket_name", "BucketAllReduce", "reference_grads", "grads_worker",
           "check_grads", "recording_hook", "ddp_buckets_worker", "ddp_buckets", "timing_worker",
           "measure_overlap", "format_table", "simulate",
           "plot_timeline", "torchrun_worker"]

MIB = 2 ** 20                                  # DDP's bucket_cap_mb counts MiB
BUCKET_SIZES: tuple[float | None, ...] = (0.25, 1.0, 4.0, 25.0, None)  # None: after backward


def _check_bucket_mb(bucket_mb: Any) -> float | None:
    if bucket_mb is None:
        return None
    if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, (int, float)) \
            or not math.isfinite(bucket_mb) or bucket_mb <= 0:
        raise ValueError(f"bucket_mb must be a number > 0 (MiB) or None (one all-reduce after "
                         f"backward); got {bucket_mb!r}")
    return float(bucket_mb)


def _check_bucket_list(bucket_mbs: Any) -> list[float | None]:
    if isinstance(bucket_mbs, (str, bytes)) or not isinstance(bucket_mbs, Sequence) \
            or not bucket_mbs:
        raise ValueError(f"bucket_mbs must be a non-empty sequence of sizes in MiB (or None); "
                         f"got {bucket_mbs!r}")
    return [_check_bucket_mb(b) for b in bucket_mbs]


def bucket_name(bucket_mb: float | None) -> str:
    """Words for a bucket size: ``"1 MiB"``, or ``"after backward"`` for None."""
    bucket_mb = _check_bucket_mb(bucket_mb)
    return "after backward" if bucket_mb is None else f"{bucket_mb:g} MiB"


# ----------------------------------------------------------------------------- model and data


def make_mlp(width: int = 256, depth: int = 32, seed: int = 0) -> nn.Sequential:
    """``depth`` Linear(width, width) layers with ReLU between them, seeded (fp32):
    :func:`course_utils.models.toy.toy_mlp`."""
    check_int("width", width)
    check_int("depth", depth)
    check_int("seed", seed, 0)
    return toy_mlp([width] * (depth + 1), seed=seed, activation="relu")


def make_batch(n: int, width: int = 256, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded regression batch: inputs (n, width) and targets (n, width)."""
    check_int("n", n)
    check_int("width", width)
    check_int("seed", seed, 0)
    gen = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(n, width, generator=gen)                                   # (n, width)
    return x, torch.tanh(x.roll(1, dims=1))                                    # (n, width)


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(model(x), y)  # mean over this rank's examples


def _check_module(model: Any) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    return model


def param_sizes(model: nn.Module) -> list[tuple[str, int]]:
    """``(name, bytes)`` of each parameter that needs a gradient, in parameter order."""
    _check_module(model)
    return [(n, p.numel() * p.element_size()) for n, p in model.named_parameters()
            if p.requires_grad]


def bucket_assignment(sizes: Sequence[tuple[str, int]], bucket_mb: float | None) -> list[list[str]]:
    """Parameter names per bucket, in the order backward fills them (reverse parameter order).

    A bucket closes once it holds at least ``bucket_mb`` MiB (the parameter that crosses the
    cap stays in it, as in DDP); ``None`` puts everything in one bucket.
    """
    cap = _check_bucket_mb(bucket_mb)
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence) or not sizes or not all(
            isinstance(e, (tuple, list)) and len(e) == 2 and isinstance(e[0], str)
            and isinstance(e[1], int) and not isinstance(e[1], bool) and e[1] >= 0
            for e in sizes):
        raise ValueError(f"sizes must be a non-empty list of (name, bytes >= 0); got {sizes!r}")
    buckets: list[list[str]] = [[]]
    filled = 0
    for name, nbytes in reversed(list(sizes)):
        if cap is not None and filled >= cap * MIB:
            buckets.append([])
            filled = 0
        buckets[-1].append(name)
        filled += nbytes
    return buckets


def bucket_copy_bytes(sizes: Sequence[tuple[str, int]], bucket_mb: float | None) -> list[int]:
    """Bytes of each bucket's flat copy: extra memory while its all-reduce is in flight."""
    nbytes = dict(sizes)
    return [sum(nbytes[n] for n in b) for b in bucket_assignment(sizes, bucket_mb)]


# -------------------------------------------------------------------------- the bucketed hooks


class BucketAllReduce:
    """Average ``model``'s gradients over the group, one async all-reduce per bucket.

    ``bucket_mb`` MiB buckets start during backward from post-accumulate-grad hooks, in bucket
    order (the same on every rank); ``None``: one all-reduce after backward. Call
    :meth:`finish` after ``backward()``: it waits, divides by the group size and copies back.
    ``active = False`` turns the hooks off (a step with no communication).
    """

    def __init__(self, model: nn.Module, bucket_mb: float | None,
                 group: dist.ProcessGroup | None = None):
        self.bucket_mb = _check_bucket_mb(bucket_mb)
        _check_module(model)
        self.group = group
        self.params = dict((n, p) for n, p in model.named_parameters() if p.requires_grad)
        self.buckets = bucket_assignment(param_sizes(model), self.bucket_mb)
        self.bucket_of = {n: i for i, b in enumerate(self.buckets) for n in b}
        self.active = True
        self._handles: list[Any] = []
        self._hooks = []
        self.reset()
        if self.bucket_mb is not None:
            for name, p in self.params.items():
                self._hooks.append(p.register_post_accumulate_grad_hook(
                    lambda p, name=name: self._grad_ready(name)))

    @property
    def n_buckets(self) -> int:
        """Number of buckets (all-reduce calls per step)."""
        return len(self.buckets)

    def reset(self) -> None:
        """Forget the current step (no bucket ready, nothing in flight)."""
        self._missing = [len(b) for b in self.buckets]
        self._next = 0                          # the next bucket to launch, in bucket order
        self._handles = []

    def _launch(self, i: int) -> None:
        grads = [self.params[n].grad for n in self.buckets[i]]
        flat = torch.cat([g.reshape(-1) for g in grads])                       # (bucket numel,)
        work = dist.all_reduce(flat, group=self.group, async_op=True)         # sum, in flight
        self._handles.append((work, flat, self.buckets[i]))

    def _grad_ready(self, name: str) -> None:
        if not self.active:
            return
        self._missing[self.bucket_of[name]] -= 1
        while self._next < len(self.buckets) and self._missing[self._next] == 0:
            self._launch(self._next)
            self._next += 1

    def finish(self) -> None:
        """Launch what is left (everything, with ``bucket_mb=None``), wait, average, copy back."""
        while self._next < len(self.buckets):
            self._launch(self._next)
            self._next += 1
        world = dist.get_world_size(self.group)
        for work, flat, names in self._handles:
            work.wait()   # gloo: blocks until summed; NCCL: the current stream waits for it
            flat.div_(world)
            offset = 0
            for n in names:
                g = self.params[n].grad
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        self.reset()

    def remove(self) -> None:
        """Remove the hooks."""
        for h in self._hooks:
            h.remove()
        self._hooks = []


# ------------------------------------------------------------------------------- correctness


def _grads_dict(model: nn.Module) -> dict[str, Any]:
    # numpy, not tensors: a tensor returned through the launcher can race its rank's exit
    return {n: backend.to_cpu(p.grad.detach()).numpy().copy() for n, p in model.named_parameters()}


def reference_grads(seed: int = 0, width: int = 64, depth: int = 3,
                    global_batch: int = 8) -> dict[str, torch.Tensor]:
    """One process, the whole batch: the gradients every data-parallel rank must end with."""
    check_int("global_batch", global_batch)
    model = make_mlp(width, depth, seed)
    x, y = make_batch(global_batch, width, seed)
    _loss(model, x, y).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def grads_worker(rank: int, world_size: int, seed: int = 0,
                 bucket_mbs: Sequence[Any] = (0.01, None), width: int = 64, depth: int = 3,
                 global_batch: int = 8) -> dict[str, Any]:
    """Worker: gradients after one step on this rank's shard, averaged by :class:`BucketAllReduce`
    for each bucket size and by DDP with ``bucket_cap_mb`` (``None``: DDP's default).

    Returns ``{"hand": [grads per size], "ddp": [grads per size], "buckets": [bucket names per
    size]}``, each grads a ``{name: numpy array}``.
    """
    sizes = _check_bucket_list(bucket_mbs)
    check_int("global_batch", global_batch)
    if global_batch % world_size:
        raise ValueError(f"global_batch must be divisible by world_size={world_size}; "
                         f"got {global_batch}")
    dev = backend.device()
    x, y = make_batch(global_batch, width, seed)
    local = slice(rank * global_batch // world_size, (rank + 1) * global_batch // world_size)
    x, y = x[local].to(dev), y[local].to(dev)                                  # (B/D, width)
    out: dict[str, list] = {"hand": [], "ddp": [], "buckets": []}
    for bucket_mb in sizes:
        model = make_mlp(width, depth, seed).to(dev)
        reducer = BucketAllReduce(model, bucket_mb)
        _loss(model, x, y).backward()
        reducer.finish()
        out["hand"].append(_grads_dict(model))
        out["buckets"].append(reducer.buckets)
        ddp_model = make_mlp(width, depth, seed).to(dev)
        kwargs = {} if bucket_mb is None else {"bucket_cap_mb": bucket_mb}
        ddp = nn.parallel.DistributedDataParallel(
            ddp_model, device_ids=[dev] if dev.type == "cuda" else None, **kwargs)
        _loss(ddp, x, y).backward()
        out["ddp"].append(_grads_dict(ddp_model))
    return out


def check_grads(seeds: Sequence[int] = (0, 1), bucket_mbs: Sequence[Any] = (0.01, None),
                world_size: int = 2, width: int = 64, depth: int = 3,
                timeout_s: float = 60.0) -> list[str]:
    """Launch :func:`grads_worker` for each seed; assert every rank's hand-made and DDP gradients
    equal one process's (``torch.testing.assert_close``); one line per seed and bucket size."""
    sizes = _check_bucket_list(bucket_mbs)
    seeds = check_ints("seeds", seeds, 0)
    for name, value in (("world_size", world_size), ("width", width), ("depth", depth)):
        check_int(name, value)
    lines = []
    for seed in seeds:
        runs = launch.run(grads_worker, world_size, seed, sizes, width, depth, 4 * world_size,
                          timeout_s=timeout_s, show_output=False, backend="gloo")
        ref = reference_grads(seed, width, depth, 4 * world_size)
        for i, bucket_mb in enumerate(sizes):
            for run in runs:
                for kind in ("hand", "ddp"):
                    for n, g in ref.items():
                        torch.testing.assert_close(torch.from_numpy(run[kind][i][n]), g)
            n = len(runs[0]["buckets"][i])
            lines.append(f"seed {seed}, {bucket_name(bucket_mb)} ({n} bucket{'s' * (n != 1)}): "
                         "by hand == DDP == one process on every rank")
    return lines


def recording_hook(log, bucket):  # (no annotations: DDP checks them, and this module's are strings)
    """A DDP comm hook (``bucket``: a ``dist.GradBucket``) that notes the bucket's bytes, then
    averages it as DDP's default hook does; returns the future DDP waits on."""
    buffer = bucket.buffer()
    log.append(buffer.numel() * buffer.element_size())
    world = dist.get_world_size()
    work = dist.all_reduce(buffer, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0].div_(world))


def _ddp_name(bucket_mb: float | None, static_graph: bool = False) -> str:
    name = "DDP default" if bucket_mb is None else f"bucket_cap_mb={bucket_mb:g}"
    return name + ", static_graph" if static_graph else name


def _check_static(static_graph: Any) -> list[bool]:
    if (isinstance(static_graph, (str, bytes)) or not hasattr(static_graph, "__iter__")
            or not list(static_graph) or not all(isinstance(v, bool) for v in static_graph)):
        raise ValueError(f"static_graph must be a non-empty sequence of bools, e.g. (False, True); "
                         f"got {static_graph!r}")
    return list(static_graph)


def ddp_buckets_worker(rank: int, world_size: int, bucket_mbs: Sequence[Any] = (None, 1.0),
                       steps: int = 3, width: int = 256, depth: int = 32,
                       static_graph: Sequence[bool] = (False,)) -> dict[str, list]:
    """Worker: the buckets real ``DistributedDataParallel`` all-reduces at each of ``steps``
    steps, read by a comm hook (``register_comm_hook``), for each of ``bucket_mbs`` (``None``:
    DDP's defaults, ``bucket_cap_mb`` unset) and each ``static_graph`` flag: ``{"DDP default"
    or "bucket_cap_mb=1" (+ ", static_graph"): [[bytes of each bucket, in the order the hook was
    called] per step]}``."""
    sizes = _check_bucket_list(bucket_mbs)
    statics = _check_static(static_graph)
    check_int("steps", steps)
    dev = backend.device()
    x, y = make_batch(4, width, seed=rank)
    out = {}
    for static in statics:
        for bucket_mb in sizes:
            model = make_mlp(width, depth, seed=0).to(dev)
            kwargs = {} if bucket_mb is None else {"bucket_cap_mb": bucket_mb}
            ddp = nn.parallel.DistributedDataParallel(
                model, device_ids=[dev] if dev.type == "cuda" else None, static_graph=static,
                **kwargs)
            log: list[int] = []
            ddp.register_comm_hook(log, recording_hook)
            name = _ddp_name(bucket_mb, static)
            out[name] = []
            for _ in range(steps):
                log.clear()
                _loss(ddp, x.to(dev), y.to(dev)).backward()
                out[name].append(list(log))
    return out


def ddp_buckets(bucket_mbs: Sequence[Any] = (None, 1.0), steps: int = 3, width: int = 256,
                depth: int = 32, timeout_s: float = 90.0,
                static_graph: Sequence[bool] = (False,)) -> dict[str, list[list[int]]]:
    """:func:`ddp_buckets_worker` on 2 gloo ranks: their result, which must be the same on both
    (DDP's buckets are the same on every rank, or its all-reduces would not match)."""
    sizes = _check_bucket_list(bucket_mbs)
    statics = _check_static(static_graph)
    check_int("steps", steps)
    check_int("width", width)
    check_int("depth", depth)
    first, second = launch.run(ddp_buckets_worker, 2, sizes, steps, width, depth, statics,
                               timeout_s=timeout_s, show_output=False, backend="gloo")
    if first != second:
        raise RuntimeError(f"the two ranks saw different DDP buckets: {first} vs {second}")
    return first


# ------------------------------------------------------------------------------------ timing


def timing_worker(rank: int, world_size: int, bucket_mbs: Sequence[Any] = BUCKET_SIZES,
                  steps: int = 5, warmup: int = 2, width: int = 256, depth: int = 32,
                  batch: int = 128) -> list[dict[str, Any]]:
    """Worker: per bucket size, this rank's median (over ``steps`` after ``warmup``) of

    ``step_ms`` (forward + backward with bucket all-reduces + wait: averaged gradients in place),
    ``compute_ms`` (forward + backward, hooks off), ``comm_ms`` (the same buckets all-reduced
    with nothing else running) and ``wait_ms`` (blocked in ``work.wait()`` after backward).
    The sizes take turns within each step, so a slow spell of the machine hits all of them.
    """
    sizes = _check_bucket_list(bucket_mbs)
    check_int("steps", steps)
    check_int("warmup", warmup, minimum=0)
    check_int("batch", batch)
    dev = backend.device()
    model = make_mlp(width, depth, seed=0).to(dev)
    x, y = (t.to(dev) for t in make_batch(batch, width, seed=rank))           # (batch, width)
    reducers = [BucketAllReduce(model, b) for b in sizes]
    for r in reducers:
        r.active = False
    samples: list[dict[str, list[float]]] = [
        {"step_ms": [], "compute_ms": [], "comm_ms": [], "wait_ms": []} for _ in sizes]
    for step in range(warmup + steps):
        for i, reducer in enumerate(reducers):
            t = {}
            # compute alone: no hooks
            model.zero_grad(set_to_none=True)
            dist.barrier()
            t0 = timing.clock(dev)
            _loss(model, x, y).backward()
            t["compute_ms"] = timing.clock(dev) - t0
            # communication alone: the same buckets, nothing else running
            dist.barrier()
            t0 = timing.clock(dev)
            reducer.finish()
            t["comm_ms"] = timing.clock(dev) - t0
            # the real step: buckets start during backward
            model.zero_grad(set_to_none=True)
            reducer.active = True
            dist.barrier()
            t0 = timing.clock(dev)
            _loss(model, x, y).backward()
            t1 = timing.clock(dev)
            reducer.finish()
            t2 = timing.clock(dev)
            reducer.active = False
            t["step_ms"], t["wait_ms"] = t2 - t0, t2 - t1
            if step >= warmup:
                for k, v in t.items():
                    samples[i][k].append(1e3 * v)
    n_params = sum(p.numel() for p in model.parameters())
    rows = [{"bucket_mb": b, "n_buckets": r.n_buckets, "grad_mb": 4 * n_params / MIB,
             **{k: statistics.median(v) for k, v in s.items()}}
            for b, r, s in zip(sizes, reducers, samples)]
    # a step holds its backward: compute alone longer than a whole step means the machine
    # took the time, not the model
    reason = timing.busy_reason()
    slow = [row for row in rows if row["compute_ms"] > 1.1 * row["step_ms"]]
    if reason is None and slow:
        reason = (f"compute alone ({slow[0]['compute_ms']:.1f} ms) took longer than the whole "
                  f"step ({slow[0]['step_ms']:.1f} ms), which holds it")
    if reason is not None:
        print(f"note: these bucket timings are unreliable: {reason}; run it again on an idle "
              "machine", flush=True)
    return rows


def measure_overlap(bucket_mbs: Sequence[Any] = BUCKET_SIZES, world_size: int = 2, steps: int = 5,
            warmup: int = 2, width: int = 256, depth: int = 32, batch: int = 128,
            timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Run :func:`timing_worker` on ``world_size`` real ranks; one row per bucket size, each time
    the slowest rank's median (a step ends when every rank has its gradients)."""
    sizes = _check_bucket_list(bucket_mbs)
    for name, value in (("world_size", world_size), ("steps", steps), ("width", width),
                        ("depth", depth), ("batch", batch)):
        check_int(name, value)
    check_int("warmup", warmup, 0)
    runs = launch.run(timing_worker, world_size, sizes, steps, warmup, width, depth, batch,
                      timeout_s=timeout_s, show_output=False)
    rows = []
    for i, _ in enumerate(sizes):
        row = dict(runs[0][i])
        for k in ("step_ms", "compute_ms", "comm_ms", "wait_ms"):
            row[k] = max(run[i][k] for run in runs)
        rows.append(row)
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows of :func:`measure_overlap` as a text table (milliseconds)."""
    keys = ("bucket_mb", "n_buckets", "step_ms", "compute_ms", "comm_ms", "wait_ms")
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or not all(
            isinstance(r, dict) and all(k in r for k in keys) for r in rows):
        raise ValueError(f"rows must be measure_overlap's list of dicts, each with the keys "
                         f"{list(keys)}; got {rows!r:.80}")
    lines = [f"{'bucket':>15}{'buckets':>9}{'step':>9}{'compute':>9}{'comm':>9}{'wait':>9}"]
    for r in rows:
        lines.append(f"{bucket_name(r['bucket_mb']):>15}{r['n_buckets']:>9}{r['step_ms']:>9.1f}"
                     f"{r['compute_ms']:>9.1f}{r['comm_ms']:>9.1f}{r['wait_ms']:>9.1f}")
    return "\n".join(lines)


# --------------------------------------------------------------------- a model of the timeline


def simulate(grad_bytes: Sequence[int], backward_s: float, bucket_mb: float | None,
             latency_s: float, bytes_per_s: float) -> dict[str, Any]:
    """Timeline of one backward with bucketed all-reduces, from a cost model.

    ``grad_bytes``: the parameters' gradient sizes in parameter order; backward produces them in
    reverse order, each after a share of ``backward_s`` proportional to its bytes. A bucket's
    all-reduce starts when its last gradient is ready and the previous all-reduce is done, and
    takes ``latency_s + bytes / bytes_per_s``. Returns ``{"backward": (start, end),
    "comm": [(start, end) per bucket], "step_s", "exposed_s"}`` (seconds).
    """
    backward_s, bytes_per_s = check_real("backward_s", backward_s), check_real("bytes_per_s",
                                                                                bytes_per_s)
    latency_s = check_real("latency_s", latency_s, strict=False)
    if not any(check_ints("grad_bytes", grad_bytes, 0)):
        raise ValueError(f"grad_bytes must hold a size > 0 (not all 0); got {grad_bytes!r}")
    sizes = [(str(i), b) for i, b in enumerate(grad_bytes)]
    buckets = bucket_assignment(sizes, bucket_mb)
    total = sum(b for _, b in sizes)
    ready, t = {}, 0.0
    for name, nbytes in reversed(sizes):
        t += backward_s * nbytes / total
        ready[name] = t
    comm, free = [], 0.0
    for bucket in buckets:
        start = backward_s if bucket_mb is None else max(free, max(ready[n] for n in bucket))
        end = start + latency_s + sum(dict(sizes)[n] for n in bucket) / bytes_per_s
        comm.append((start, end))
        free = end
    step = max(backward_s, free)
    return {"backward": (0.0, backward_s), "comm": comm, "step_s": step,
            "exposed_s": step - backward_s}


def plot_timeline(schedules: dict[str, dict[str, Any]], ax: Any = None) -> Any:
    """One pair of rows per schedule of :func:`simulate` (backward, all-reduces), in ms."""
    import matplotlib.pyplot as plt

    from course_utils import style

    if not isinstance(schedules, dict) or not schedules or not all(
            isinstance(v, dict) and {"step_s", "backward", "comm"} <= v.keys()
            for v in schedules.values()):
        raise ValueError("schedules must be a non-empty dict {name: simulate(...)'s result} "
                         "(each with 'step_s', 'backward' and 'comm')")
    if ax is None:
        _, ax = plt.subplots(figsize=(8.5, 0.9 + 0.8 * len(schedules)))
    colors = style.PHASE_COLORS
    yticks, ylabels = [], []
    end = max(s["step_s"] for s in schedules.values()) * 1e3
    for row, (name, s) in enumerate(schedules.items()):
        y = 2.2 * (len(schedules) - 1 - row)
        b0, b1 = s["backward"]
        ax.broken_barh([(1e3 * b0, 1e3 * (b1 - b0))], (y + 0.9, 0.8),
                       color=colors["backward"])
        ax.broken_barh([(1e3 * a, 1e3 * (b - a)) for a, b in s["comm"]], (y, 0.8),
                       color=colors["communication"], edgecolor="white", linewidth=0.8)
        if s["exposed_s"] > 0:
            ax.broken_barh([(1e3 * b1, 1e3 * s["exposed_s"])], (y + 0.9, 0.8),
                           color=colors["wait"], alpha=0.5)
        yticks += [y + 0.4, y + 1.3]
        ylabels += [f"{name}: all-reduce", f"{name}: backward"]
    ax.set_yticks(yticks)
    ax.set_yticklabels(ylabels)
    ax.set_ylim(-0.3, 2.2 * len(schedules) - 0.2)
    ax.set_xlim(0, end * 1.05)
    ax.set_xlabel("time in the step (ms)")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=colors["backward"], label="backward"),
                       Patch(color=colors["communication"], label="all-reduce of a bucket"),
                       Patch(color=colors["wait"], alpha=0.5, label="waiting (exposed)")],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


# ---------------------------------------------------------------------------------- torchrun


def torchrun_worker(rank: int, world_size: int, seed: int = 0) -> float:
    """Worker for torchrun: gradients by hand (buckets of 0.01 MiB) and by DDP against one
    process; returns this rank's largest difference."""
    got = grads_worker(rank, world_size, seed, (0.01,), 64, 3, 4 * world_size)
    ref = reference_grads(seed, 64, 3, 4 * world_size)
    return max(float((torch.from_numpy(got[k][0][n]) - g).abs().max())
               for k in ("hand", "ddp") for n, g in ref.items())


if __name__ == "__main__":
    launch.torchrun_main(torchrun_worker)

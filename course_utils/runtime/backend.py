"""What changes between gloo on CPUs and NCCL on GPUs, in one place.

The course's workers run unchanged on a laptop (gloo, CPU tensors) and on GPU machines (NCCL,
one CUDA device per rank). Everything that differs between the two is decided here, and the
workers only call these functions:

* **Which backend** (:func:`resolve_backend`): NCCL when there is one CUDA device per rank,
  gloo otherwise; :func:`init_process_group` binds an NCCL rank to its device first.
* **Where tensors live** (:func:`device`, :func:`to_device`): NCCL only moves CUDA tensors,
  gloo only CPU tensors (for the collectives the course uses). Results leave a rank on the CPU
  (:func:`to_cpu`, which the launcher applies to every worker's return value).
* **When a call is finished** (:func:`synchronize`): a gloo collective on CPU returns when its
  result is in place; CUDA kernels and NCCL collectives are queued on a stream and return at
  once, so a timer synchronizes before reading the clock (``runtime.clock.clock`` does).
* **Which reductions exist** (:func:`scaled_sum`): NCCL has ``PREMUL_SUM`` (scale, then sum, in
  one kernel: FSDP uses it to average in low precision); gloo does not, and scales separately.
* **Peak memory** (:func:`peak_memory_bytes`): the CUDA caching allocator records its peak;
  on CPU there is no allocator peak to read, and the course counts tensor storages instead.
* **Side channels** (:func:`new_group`): extra groups use the default group's backend, with a
  timeout, so a demo that opens several channels works on both.
* **Bytes on the wire** (:func:`host_sees_collective_bytes`): gloo sends over TCP, so the
  host's write counter measures a collective's bytes; NCCL's go over NVLink or InfiniBand.
* **Reduce-scatter** (:func:`reduce_scatter_in_place`): NCCL's is a ring, in place; gloo's own
  sends what an all-reduce sends (module 9 measures it), so on gloo it is built from
  ``all_to_all_single``, which sends a ring's (D-1)/D.

:data:`DIFFERENCES` lists these in a table (lecture 7 and the README's GPU section show it).
"""

from __future__ import annotations

import datetime
from typing import Any, Sequence

import torch
import torch.distributed as dist

__all__ = ["BACKENDS", "DIFFERENCES", "resolve_backend", "init_process_group", "device",
           "to_device", "to_cpu", "synchronize", "scaled_sum", "peak_memory_bytes",
           "reset_peak_memory", "new_group", "host_sees_collective_bytes", "reduce_scatter_in_place",
           "differences_table", "fake_job", "SIMULATED_DEVICE"]

BACKENDS = ("auto", "gloo", "nccl")

# (what, gloo on CPU, NCCL on GPU, the function here that handles it)
DIFFERENCES = (
    ("device", "CPU tensors", "one CUDA device per rank", "device, to_device"),
    ("results", "on the CPU", "copied to the CPU", "to_cpu"),
    ("timing", "call returns when done", "returns when queued", "synchronize"),
    ("scale, then sum", "scale first, then SUM", "PREMUL_SUM", "scaled_sum"),
    ("peak memory", "count storages", "max_memory_allocated", "peak_memory_bytes"),
    ("extra groups", "gloo", "NCCL", "new_group"),
    ("bytes sent", "TCP writes, counted", "NVLink/IB, not seen", "host_sees_collective_bytes"),
)


def _cuda_devices() -> int:
    """CUDA devices this process can see (0 without CUDA; never initialises CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_backend(backend: str, world_size: int) -> str:
    """The process-group backend for ``world_size`` ranks on this machine.

    ``"auto"``: ``"nccl"`` when NCCL is built in and there is one CUDA device per rank,
    ``"gloo"`` (CPU) otherwise. ``"nccl"`` or ``"gloo"``: that one, or ValueError saying why
    this machine cannot give it.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    gpus = _cuda_devices()
    nccl_ok = dist.is_nccl_available() and gpus >= world_size
    if backend == "auto":
        return "nccl" if nccl_ok else "gloo"
    if backend == "nccl" and not nccl_ok:
        raise ValueError(f"backend='nccl' needs NCCL and one CUDA device per rank: "
                         f"{world_size} rank(s), {gpus} CUDA device(s) here"
                         + ("" if dist.is_nccl_available() else ", and this torch has no NCCL")
                         + "; use backend='gloo' (CPU) or fewer ranks")
    return backend


def init_process_group(backend: str, local_rank: int, **kwargs: Any) -> None:
    """Join the default process group; under NCCL bind this rank to its CUDA device first."""
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        kwargs["device_id"] = torch.device("cuda", local_rank)
    dist.init_process_group(backend, **kwargs)


def device() -> torch.device:
    """This rank's device: its CUDA device under NCCL, the CPU under gloo (or outside a group).

    Workers create their tensors and models on it, so one worker serves both backends.
    """
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _map_tensors(obj: Any, fn: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_map_tensors(v, fn) for v in obj)
    return obj


def _as_device(dev: Any) -> torch.device:
    """``dev`` as a torch.device (a tensor gives its own), or ValueError naming it."""
    if isinstance(dev, torch.Tensor):
        return dev.device
    try:
        return torch.device(dev)
    except (TypeError, RuntimeError):
        raise ValueError(f"device must be a torch.device, a device string or a tensor; "
                         f"got {dev!r}") from None


def to_device(obj: Any, dev: torch.device | None = None) -> Any:
    """``obj`` with every tensor in it (nested dicts, lists, tuples) moved to ``dev``
    (default :func:`device`); other values unchanged. Inputs sent to a rank arrive on the CPU."""
    dev = device() if dev is None else _as_device(dev)
    return _map_tensors(obj, lambda t: t.to(dev))


def to_cpu(obj: Any) -> Any:
    """``obj`` with every CUDA tensor in it copied to the CPU (what a rank sends back)."""
    return _map_tensors(obj, lambda t: t.cpu() if t.device.type != "cpu" else t)


def synchronize(dev: torch.device | str | torch.Tensor) -> None:
    """Wait until ``dev`` has finished the work queued on it; on CPU, return at once.

    A host clock read before and after a call measures the call's work only if that work is done
    when the call returns. On CPU it is: torch computes on the calling thread, and a gloo
    collective on CPU tensors returns once the result is in place. On CUDA it is not: kernels and
    NCCL collectives are queued on a stream and the call returns as soon as they are enqueued, so
    a timer must wait for the device (``torch.cuda.synchronize``) before each clock read, or use
    CUDA events or the profiler. ``dev`` may be a tensor (its device is used). Other
    accelerators go through ``torch.accelerator.synchronize``.
    """
    dev = _as_device(dev)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type not in ("cpu", "meta"):
        torch.accelerator.synchronize(dev)


def scaled_sum(t: torch.Tensor, factor: float, group: dist.ProcessGroup | None = None) -> None:
    """In place: ``t`` becomes the sum over ranks of ``factor * t`` (factor = 1/N: the mean).

    NCCL does it in one reduction (``PREMUL_SUM``), scaling each input in its own precision
    before adding, which is how FSDP averages bf16 gradients without an overflow; gloo has no
    ``PREMUL_SUM``, so each rank scales first and the group sums. Same result either way.
    """
    if not isinstance(factor, (int, float)) or isinstance(factor, bool):
        raise ValueError(f"factor must be a number; got {factor!r}")
    if dist.get_backend(group) == "nccl":
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(float(factor)), group=group)
    else:
        t.mul_(factor)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)


def peak_memory_bytes(dev: torch.device | str | None = None) -> int | None:
    """The CUDA allocator's peak bytes on ``dev`` since the last :func:`reset_peak_memory`
    (``torch.cuda.max_memory_allocated``); ``None`` on CPU, which has no allocator peak."""
    dev = device() if dev is None else _as_device(dev)
    if dev.type != "cuda":
        return None
    return int(torch.cuda.max_memory_allocated(dev))


def reset_peak_memory(dev: torch.device | str | None = None) -> None:
    """Start a new peak for :func:`peak_memory_bytes` (nothing to do on CPU)."""
    dev = device() if dev is None else _as_device(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)


def new_group(ranks: Sequence[int] | None = None, timeout_s: float = 60.0) -> dist.ProcessGroup:
    """A new process group over ``ranks`` (all ranks if None) with the default group's backend
    and a timeout, so a hung peer becomes an error on either backend."""
    if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or timeout_s <= 0:
        raise ValueError(f"timeout_s must be a positive number of seconds; got {timeout_s!r}")
    return dist.new_group(None if ranks is None else list(ranks),
                          timeout=datetime.timedelta(seconds=timeout_s))


def host_sees_collective_bytes() -> bool | None:
    """Whether this rank's collectives pass through the host's write calls (gloo over TCP:
    ``runtime.clock.bytes_written`` counts them), False under NCCL, None outside a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_backend() == "gloo"


class _Pending:
    """A collective in flight; ``wait()`` blocks until it is done and runs what finishes it."""

    def __init__(self, work: Any, finish: Any = None):
        self.work, self.finish = work, finish

    def wait(self) -> None:
        if self.work is not None:
            self.work.wait()
        if self.finish is not None:
            self.finish()
        self.work = self.finish = None


def reduce_scatter_in_place(flat: torch.Tensor, group: dist.ProcessGroup | None = None,
                            async_op: bool = False) -> _Pending:
    """Sum the 1-D ``flat`` (D * S elements) over ``group`` and leave rank r's slice of the sum
    in ``flat[r*S:(r+1)*S]`` (the other slices keep what they held); returns a handle whose
    ``wait()`` finishes it (already finished unless ``async_op``).

    NCCL reduce-scatters in place (its in-place rule: the output is the rank's slice of the
    input). gloo's ``reduce_scatter_single`` sends 2(D-1)/D of the tensor, as an all-reduce does,
    so on gloo each rank sends slice j to rank j (``all_to_all_single``, (D-1)/D of the tensor,
    a ring's share) and adds what it receives.
    """
    d, r = dist.get_world_size(group), dist.get_rank(group)
    if flat.dim() != 1 or flat.numel() % d:
        raise ValueError(f"flat must be 1-D with a multiple of the group size ({d}) elements; "
                         f"got shape {tuple(flat.shape)}")
    size = flat.numel() // d
    mine = flat[r * size:(r + 1) * size]
    if dist.get_backend(group) == "nccl":
        return _Pending(dist.reduce_scatter_single(mine, flat, group=group, async_op=async_op))
    recv = torch.empty_like(flat).view(d, size)                 # recv[j]: rank j's slice r
    work = dist.all_to_all_single(recv, flat, group=group, async_op=async_op)
    pending = _Pending(work, lambda: torch.sum(recv, dim=0, out=mine))
    if not async_op:
        pending.wait()
    return pending


# A fake process group (module 11) simulates ranks in one process: its tensors live on the meta
# device (shapes only) or under FakeTensorMode, and its meshes are of this device type.
SIMULATED_DEVICE = "cpu"


def fake_job(rank: int, world_size: int, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` as rank ``rank`` of ``world_size`` in PyTorch's fake process group
    (collectives return at once and move nothing); returns its value.

    It builds meshes, shards models and traces collectives exactly as that rank of a job of
    any size would, on one CPU. It runs in a thread of its own: DTensor caches its plans by
    mesh, and meshes compare equal by shape and names, not by their groups, so two ranks' equal
    meshes would share one rank's groups; a new thread has new caches (the shared ones are
    cleared too).
    """
    import threading

    from torch.distributed.tensor import _collective_utils, _redistribute
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1; got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int from 0 to {world_size - 1}; got {rank!r}")
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized in this process")
    out: dict[str, Any] = {}

    def body() -> None:
        _redistribute._planner_cache.clear()
        _redistribute._gen_transform_infos.cache_clear()
        _collective_utils.MeshTopoInfo.build_from_mesh.cache_clear()
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # re-raised in the caller's thread
            out["error"] = exc
        finally:
            dist.destroy_process_group()

    thread = threading.Thread(target=body, name=f"fake-rank-{rank}")
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def differences_table() -> str:
    """:data:`DIFFERENCES` as a fixed-width text table."""
    rows = (("", "gloo (CPU)", "NCCL (GPU)", "handled by"),) + DIFFERENCES
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)

"""How rank processes start: a forkserver that has already imported torch, or spawn.

The forkserver preloads torch and the modules ranks need, so a small job starts in a fraction of
a second (every lecture that starts ranks, 2 to 12).

:func:`get_context` gives the multiprocessing context of a start method, set up once per
process; :func:`preload` adds modules to the forkserver's imports before it starts;
:func:`start_forkserver` starts it ahead of the first launch.
"""

from __future__ import annotations

import multiprocessing as mp
import os

__all__ = ["PRELOAD", "PRELOAD_LIGHT", "preload", "get_context", "start_forkserver"]

# Modules the forkserver imports once, so each rank starts with them already loaded.
# torch._dynamo is imported lazily by DDP/FSDP/DTensor and costs ~1.4 s per fresh process.
PRELOAD = ["torch", "torch.distributed", "torch.nn", "torch._dynamo", "torch.distributed.tensor",
           "torch.distributed.tensor.parallel", "torch.distributed.fsdp",
           "torch.distributed.pipelining", "cloudpickle", "course_utils.launch"]
# With COURSE_LAUNCH_PRELOAD=light (set for grading kernels, whose tests use plain collectives)
# the forkserver starts ~1 s sooner; a rank that needs DDP/FSDP/DTensor imports it itself.
PRELOAD_LIGHT = ["torch", "torch.distributed", "torch.nn", "cloudpickle", "course_utils.launch"]

_contexts: dict[str, mp.context.BaseContext] = {}
_EXTRA_PRELOAD: list[str] = []


def preload(*modules: str) -> bool:
    """Have the ranks' forkserver import ``modules`` too (``torch.distributed.checkpoint``, for
    example, costs each rank ~0.7 s otherwise). Works before this process's first launch, and
    returns whether it did (after it, the forkserver has started and nothing changes)."""
    bad = [m for m in modules if not isinstance(m, str) or not m]
    if bad:
        raise ValueError(f"modules must be module names (str); got {bad[0]!r}")
    if "forkserver" in _contexts:
        return False
    _EXTRA_PRELOAD.extend(m for m in modules if m not in _EXTRA_PRELOAD)
    return True


def get_context(method: str | None) -> mp.context.BaseContext:
    """The multiprocessing context that starts ranks by ``method`` ("forkserver", "spawn", or
    None: forkserver where available), made once per process (the forkserver preloads
    :data:`PRELOAD`, or :data:`PRELOAD_LIGHT` under ``COURSE_LAUNCH_PRELOAD=light``)."""
    available = mp.get_all_start_methods()
    if method is None:
        method = "forkserver" if "forkserver" in available else "spawn"
    if method not in ("forkserver", "spawn") or method not in available:
        allowed = [m for m in ("forkserver", "spawn") if m in available]
        raise ValueError(f"start_method must be one of {allowed} or None; got {method!r}")
    if method not in _contexts:
        ctx = mp.get_context(method)
        if method == "forkserver":
            light = os.environ.get("COURSE_LAUNCH_PRELOAD", "full") == "light"
            ctx.set_forkserver_preload((PRELOAD_LIGHT if light else PRELOAD) + _EXTRA_PRELOAD)
        _contexts[method] = ctx
    return _contexts[method]


def start_forkserver() -> bool:
    """Start the ranks' forkserver now and return at once: it imports :data:`PRELOAD` (torch,
    DDP's and FSDP's modules: seconds) in its own process while the caller goes on, and the
    first :func:`~course_utils.launch.run` finds it ready instead of waiting for it. A notebook
    whose first launch comes late (lecture 8) calls it in its setup cell. False where ranks
    start by spawn."""
    ctx = get_context(None)
    if ctx.get_start_method() != "forkserver":
        return False
    import multiprocessing.forkserver

    multiprocessing.forkserver.ensure_running()
    return True

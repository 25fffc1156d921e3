"""Timing on a shared machine: one clock for every timer in the course, the check that says
when timings cannot be trusted, and the bytes this process has written (what gloo sent).

Every lecture that times something (2, 4, 5, 7, 9, 10) reads :func:`clock`; module 7
(:mod:`course_utils.measure`) builds its step timers on it.
"""

from __future__ import annotations

import os
import time

import torch

from course_utils.runtime import backend
from course_utils.runtime.backend import synchronize


def clock(device: torch.device | str | torch.Tensor = "cpu") -> float:
    """``time.perf_counter()`` read after :func:`synchronize` of ``device``, in seconds.

    Only differences of two readings mean something. Every timer in this module reads it, so the
    times it reports are right on CUDA too (on CPU it is ``perf_counter`` itself).
    """
    synchronize(device)
    return time.perf_counter()


def busy_reason(wall_s: float | None = None, cpu_s: float | None = None,
                threads: int = 1) -> str | None:
    """Why timings taken now cannot be trusted, or None: the machine's load average above its
    cores, or (given the wall and CPU seconds of a compute-bound measurement on ``threads``
    threads) this process running well under the time it was timed."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    if load > (cores or 1) + 0.5:
        return f"the machine is busy (load average {load:.1f} on {cores} cores)"
    if wall_s and cpu_s is not None and cpu_s < 0.6 * wall_s * threads:
        return (f"this process ran {100 * cpu_s / (wall_s * threads):.0f}% of the time it was "
                "timed (other processes had the cores)")
    return None


def warn_if_busy(what: str, wall_s: float | None = None, cpu_s: float | None = None,
                 threads: int = 1) -> str | None:
    """Print one line if :func:`busy_reason` finds a reason (returns it, or None)."""
    reason = busy_reason(wall_s, cpu_s, threads)
    if reason is not None:
        print(f"note: the {what} timings are unreliable: {reason}; run it again on an idle "
              "machine to compare them", flush=True)
    return reason


def bytes_written() -> int | None:
    """Bytes this process has passed to write-type system calls so far (sockets included).

    Reads ``wchar`` from ``/proc/self/io`` (Linux); ``None`` where that file does not exist.
    gloo sends over TCP with write calls, so the difference across a collective is the bytes
    this rank sent (plus a few dozen bytes of headers per message). ``None`` under NCCL, whose
    bytes go over NVLink or InfiniBand without a write call (``backend.DIFFERENCES``).
    """
    if backend.host_sees_collective_bytes() is False:
        return None
    try:
        with open("/proc/self/io", encoding="ascii") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None

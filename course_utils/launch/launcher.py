"""The launcher side: :func:`run` starts ``fn`` on several ranks and waits for every result.

It waits within a deadline and leaves no rank process behind (every lecture that starts ranks,
2 to 12).

The ranks start by :mod:`course_utils.launch.forkserver` and run
:mod:`course_utils.launch.rank`'s body; a failure, a hang or a death becomes one of
:mod:`course_utils.launch.reports`' errors, with the student's traceback
(:mod:`course_utils.launch.tracebacks`).
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import tempfile
import time
from typing import Any, Callable, Sequence

from course_utils.launch import rank as rank_side
from course_utils.launch.forkserver import get_context
from course_utils.launch.reports import (LaunchTimeout, LiveTail, RankError, format_outputs,
                                         rank_error, read_logs)
from course_utils.launch.tracebacks import code_origins, trim_stack
from course_utils.runtime import validate
from course_utils.runtime.backend import resolve_backend

__all__ = ["MAX_WORLD_SIZE", "run"]

MAX_WORLD_SIZE = 16
"""The most ranks :func:`run` starts on one machine."""


def _check_args(fn: Any, world_size: Any, timeout_s: Any, threads_per_rank: Any) -> None:
    if not callable(fn):
        raise TypeError("fn must be callable as fn(rank, world_size, *args); "
                        f"got {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int from 1 to {MAX_WORLD_SIZE}; got {world_size!r}")
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ValueError(f"world_size must be from 1 to {MAX_WORLD_SIZE}; got {world_size}")
    validate.check_real("timeout_s", timeout_s, 0)
    if threads_per_rank is not None:
        validate.check_int("threads_per_rank", threads_per_rank, 1)


def _kill(procs: Sequence[mp.process.BaseProcess], dump_stacks: bool = False) -> None:
    """Kill the ranks still alive (first, with ``dump_stacks``, have each print its stack)."""
    alive = [p for p in procs if p.is_alive()]
    if dump_stacks:
        for p in alive:
            try:
                os.kill(p.pid, signal.SIGUSR1)
            except OSError:
                pass
        time.sleep(0.3)
    for p in alive:
        p.kill()
    for p in alive:
        p.join(5)


def run(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 60.0,
        threads_per_rank: int | None = None, show_output: bool = True,
        start_method: str | None = None, live_rank: int | None = None,
        backend: str = "auto", _fault: dict | None = None) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return results by rank.

    ``timeout_s`` bounds the whole job (start-up included). ``threads_per_rank`` sets torch's
    intra-op threads in each rank (default: the CPU count shared out, at least 1).
    ``show_output=False`` keeps the ranks' printed output out of the cell (errors still show it).
    ``start_method``: "forkserver" (default where available: fast) or "spawn".
    ``live_rank``: print that rank's output as it happens (progress of a long job); the other
    ranks' output still follows the join, in rank order.
    ``backend``: "auto" (NCCL with one GPU per rank where there are enough, else gloo), "gloo"
    or "nccl" (:func:`~course_utils.runtime.backend.resolve_backend`); ``fn`` finds its device
    with :func:`~course_utils.runtime.backend.device`.
    Raises :class:`RankError` (a rank failed) or :class:`LaunchTimeout` (time ran out); in both
    cases, and on KeyboardInterrupt, every rank has been killed before ``run`` returns.
    """
    __tracebackhide__ = True  # IPython: the error is the rank's, not this function's
    _check_args(fn, world_size, timeout_s, threads_per_rank)
    if live_rank is not None and (isinstance(live_rank, bool) or not isinstance(live_rank, int)
                                  or not 0 <= live_rank < world_size):
        raise ValueError(f"live_rank must be None or a rank from 0 to {world_size - 1}; "
                         f"got {live_rank!r}")
    import cloudpickle

    backend = resolve_backend(backend, world_size)
    threads = threads_per_rank or max(1, (os.cpu_count() or 1) // world_size)
    payload = cloudpickle.dumps((fn, args, _fault, code_origins(fn, args)))
    ctx = get_context(start_method)
    deadline = time.monotonic() + timeout_s
    for attempt in range(1, _RENDEZVOUS_ATTEMPTS + 1):
        try:
            results, logs = _launch_once(ctx, payload, world_size, timeout_s, deadline, threads,
                                         live_rank if show_output else None, backend)
        except _RendezvousFailed as failed:
            # Joining the group can fail spuriously on a loaded machine (gloo's
            # "connectFullMesh failed"): fn has not run anywhere yet, so start again once.
            if attempt == _RENDEZVOUS_ATTEMPTS or time.monotonic() > deadline - 1:
                raise failed.error from None
            continue
        except RankError as error:
            # The same transport failure inside fn, where it makes a subgroup (new_group,
            # init_device_mesh): every rank is a fresh process, so running the whole job again
            # once is safe; a second failure is reported as it is.
            if (_GLOO_CONNECT not in str(error) or attempt == _RENDEZVOUS_ATTEMPTS
                    or time.monotonic() > deadline - 1):
                raise
            continue
        if show_output and any(logs):
            print(format_outputs(logs))
        return results
    raise AssertionError("unreachable")  # pragma: no cover


_RENDEZVOUS_ATTEMPTS = 2
_GLOO_CONNECT = "Gloo connectFullMesh failed"


class _RendezvousFailed(Exception):
    def __init__(self, error: RankError):
        super().__init__(str(error))
        self.error = error


def _launch_once(ctx: mp.context.BaseContext, payload: bytes, world_size: int, timeout_s: float,
                 deadline: float, threads: int, live_rank: int | None,
                 backend: str = "gloo") -> tuple[list[Any], list[str]]:
    """Start the ranks, wait for every result; return (results, logs not yet printed) or raise."""
    __tracebackhide__ = True
    import torch.distributed as dist

    # Collectives time out a little after the launcher does, so a hang is reported by the
    # launcher (with every rank's stack), not by whichever peer gave up waiting first.
    pg_timeout_s = timeout_s + 5.0
    hard_deadline = time.time() + (deadline - time.monotonic()) + 30.0
    store = dist.TCPStore(rank_side.HOST, 0, world_size, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=pg_timeout_s))
    logdir = tempfile.mkdtemp(prefix="course-launch-")
    log_paths = [os.path.join(logdir, f"rank{r}.log") for r in range(world_size)]
    procs: list[mp.process.BaseProcess] = []
    conns: dict[int, mp.connection.Connection] = {}
    lifelines = []
    results: dict[int, Any] = {}
    live = LiveTail(log_paths[live_rank], live_rank) if live_rank is not None else None
    try:
        for rank in range(world_size):
            p, recv_end, life_send = rank_side.start_rank(
                ctx, rank, world_size, store.port, payload, log_paths[rank], pg_timeout_s,
                hard_deadline, threads, backend)
            procs.append(p)
            conns[rank] = recv_end
            lifelines.append(life_send)

        pending = set(range(world_size))
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _kill(procs, dump_stacks=True)
                logs = read_logs(log_paths)
                late = sorted(pending)
                stacks = "\n".join(f"--- rank {r} ---\n{trim_stack(logs[r], rank_side.RANK_BODY)}"
                                    for r in late)
                raise LaunchTimeout(
                    f"run() timed out after {timeout_s:g} s: rank(s) {late} had not finished "
                    f"and were killed. Where they were:\n{stacks}", late, stacks, logs)
            waitables = [conns[r] for r in pending] + [procs[r].sentinel for r in pending]
            ready = mp.connection.wait(waitables, timeout=min(remaining, 0.2 if live else 1.0))
            if live:
                live.print_new_lines()
            for rank in sorted(pending):
                conn, proc = conns[rank], procs[rank]
                if conn in ready or (proc.sentinel in ready and conn.poll()):
                    try:
                        status, value = conn.recv()
                    except EOFError:
                        status, value = "died", None
                elif proc.sentinel in ready:
                    status, value = "died", None
                else:
                    continue
                if status == "ok":
                    results[rank] = pickle.loads(value)
                    pending.discard(rank)
                    continue
                _kill(procs)
                logs = read_logs(log_paths)
                if status == "died":
                    proc.join(1)
                error = rank_error(rank, status, value, proc.exitcode, logs)
                raise _RendezvousFailed(error) if status == "init_error" else error

        for p in procs:  # ranks exit right after reporting; give them a moment to tear down
            p.join(max(0.5, min(5.0, deadline - time.monotonic())))
        logs = read_logs(log_paths)
        if live:
            live.print_new_lines(final=True)
            logs[live_rank] = ""
        return [results[r] for r in range(world_size)], logs
    except KeyboardInterrupt:
        running = [r for r, proc in enumerate(procs) if proc.is_alive()]
        _kill(procs)
        raise KeyboardInterrupt(
            f"run() was interrupted: rank(s) {running} were still running and have been "
            f"stopped; no process of this job is left") from None
    finally:
        _kill(procs)
        for c in list(conns.values()) + lifelines:
            c.close()
        for path in log_paths:
            try:
                os.remove(path)
            except OSError:
                pass
        try:
            os.rmdir(logdir)
        except OSError:
            pass
        del store

"""The rank side: one rank process, from its start to its exit.

Every lecture that starts ranks (2 to 12) runs its workers under this body.

:func:`start_rank` starts a rank process whose body captures its output in a log file, joins
the process group, calls the student's ``fn`` and sends back its result or what it raised (as
:mod:`course_utils.launch.tracebacks` describes it), then exits. A rank dumps every thread's
stack on SIGUSR1 (the launcher's timeout) and kills itself if the launching process goes away
or a hard deadline passes, so no rank is ever left behind.
"""

from __future__ import annotations

import datetime
import faulthandler
import io
import linecache
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
import traceback

from course_utils.launch.tracebacks import failure_info, student_traceback
from course_utils.runtime.backend import init_process_group, to_cpu

__all__ = ["HOST", "RANK_BODY", "start_rank"]

HOST = "127.0.0.1"
"""Where the rendezvous store listens (on a port the OS picks): this machine only."""


def _watch_parent(lifeline: mp.connection.Connection, deadline: float) -> None:
    """Exit this rank if the launching process goes away or the hard deadline passes."""
    while True:
        try:
            if lifeline.poll(0.2):
                lifeline.recv()  # the parent never sends; EOF means it is gone
        except (EOFError, OSError):
            os._exit(3)
        if time.time() > deadline:
            os._exit(4)


def _rank_main(rank: int, world_size: int, port: int, payload: bytes, result_conn,
               lifeline, log_path: str, pg_timeout_s: float, hard_deadline: float,
               threads: int, backend: str = "gloo") -> None:
    """Body of one rank process: capture output, join the group, call fn, report, exit."""
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", buffering=0, closefd=False),
                                  write_through=True, line_buffering=True)
    sys.stderr = sys.stdout
    # every thread: the signal lands on whichever thread the kernel picks (often one of gloo's,
    # with no Python frames), and tracebacks.trim_stack keeps the one running fn
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    threading.Thread(target=_watch_parent, args=(lifeline, hard_deadline), daemon=True).start()

    status, value, origins = "error", None, {}
    try:
        import cloudpickle
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        fn, args, fault, (origins, sources) = cloudpickle.loads(payload)
        linecache.cache.update(sources)  # notebook cells' text, for the traceback
        if fault and fault.get("rank") == rank and fault.get("stage") == "before_init":
            time.sleep(10**6)  # test hook: a rank that never joins the group
        timeout = datetime.timedelta(seconds=pg_timeout_s)
        status = "init_error"  # a failure while joining the group is worth one retry
        store = dist.TCPStore(HOST, port, world_size, is_master=False, timeout=timeout)
        init_process_group(backend, rank, store=store, rank=rank, world_size=world_size,
                           timeout=timeout)
        if fault and fault.get("rank") == rank and fault.get("stage") == "init_error":
            if not os.path.exists(fault["marker"]):  # test hook: fail the first rendezvous
                open(fault["marker"], "w").close()
                raise ConnectionError("simulated rendezvous failure")
        status = "error"  # from here on a failure belongs to fn, not to the rendezvous
        # Plain pickle, not the connection's own pickler: torch registers reducers that pass
        # tensor storage as a file descriptor, which dies with this process once it exits.
        value = pickle.dumps(to_cpu(fn(rank, world_size, *args)))  # CUDA results too
        status = "ok"
    except BaseException as exc:  # report everything, SystemExit and KeyboardInterrupt included
        value = (student_traceback(exc, origins), traceback.format_exc(),
                 failure_info(exc, origins))
    try:
        sys.stdout.flush()
        result_conn.send((status, value))
    except Exception:
        os._exit(5)
    if status == "ok":
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    # os._exit skips interpreter teardown, which can abort ("terminate called without an
    # active exception") once torch._dynamo is loaded.
    os._exit(0 if status == "ok" else 1)


RANK_BODY = _rank_main.__name__
"""The name of the function each rank calls ``fn`` from (what a hung rank's stack is cut at)."""


def start_rank(ctx: mp.context.BaseContext, rank: int, world_size: int, port: int,
               payload: bytes, log_path: str, pg_timeout_s: float, hard_deadline: float,
               threads: int, backend: str = "gloo"
               ) -> tuple[mp.process.BaseProcess, mp.connection.Connection,
                          mp.connection.Connection]:
    """Start rank ``rank`` of ``world_size`` by ``ctx``: it joins the store at ``port``, runs
    the ``payload`` (fn, args, a test fault, the code origins; cloudpickled) with ``threads``
    torch threads, its output going to ``log_path``. Returns (the process, the end its result
    arrives on, its lifeline: the rank exits when that end closes)."""
    recv_end, send_end = ctx.Pipe(duplex=False)
    life_recv, life_send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_rank_main, name=f"rank{rank}", daemon=True, args=(
        rank, world_size, port, payload, send_end, life_recv, log_path,
        pg_timeout_s, hard_deadline, threads, backend))
    p.start()
    send_end.close()
    life_recv.close()
    return p, recv_end, life_send

"""Start a function on several ranks on this machine: the one launcher the course uses.

``run(fn, world_size, *args)`` calls ``fn(rank, world_size, *args)`` in ``world_size`` fresh
processes joined into one process group, and returns the ranks' return values in rank order.
The group is NCCL with one CUDA device per rank when the machine has enough GPUs, gloo on CPU
otherwise (:func:`resolve_backend`; ``backend=`` overrides). A worker puts its tensors on
:func:`device`, so the same worker code runs on a laptop and on a GPU box.

Guarantees (each one has a test in ``tests/test_launch.py``):

* **Fast.** Ranks are forked from a forkserver that has already imported torch, so after the
  first launch in a kernel a small job starts in a fraction of a second.
* **Bounded.** A rank that raises makes ``run`` raise :class:`RankError` naming the rank that
  failed first, with its traceback. A rank that hangs (in Python or in a collective), never joins,
  or dies makes ``run`` raise within ``timeout_s``; a hung rank's stack is shown. An interrupt
  (Ctrl-C, a notebook cell timeout) kills every rank. Ranks also kill themselves if the process
  that launched them dies, so no process is ever left behind.
* **Readable.** Each rank's printed output is captured and printed after the join, in rank
  order, with a ``[rank r]`` prefix, so a notebook shows the same text on every run. A rank's
  error shows the student's own frames with their source lines (notebook cells included: the
  cells' text travels with ``fn``), library frames folded to one line each run; the launcher's
  own frames are hidden from IPython's traceback. An interrupt says which ranks it stopped.
* **Concurrent.** The rendezvous store listens on a port the OS picks, so launches in two
  notebooks or test processes at once never collide.
* **Student code.** ``fn`` may be defined in a notebook cell: it is sent to the ranks by value
  (cloudpickle), which works with the forkserver and spawn start methods (Linux and macOS).

The same worker runs under torchrun (the real launcher used on clusters)::

    torchrun --standalone --nproc-per-node 2 -m course_utils.launch course_utils.launch:ping

which calls :func:`torchrun_main`; demo modules also call it from their ``__main__`` block.
Across nodes, start the same command on every node with a shared rendezvous instead of
``--standalone``::

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --rdzv-backend c10d \
        --rdzv-endpoint HOST:29500 -m course_utils.launch course_utils.launch:ping

(``scripts/cluster.sbatch`` does this under Slurm.)
"""

from __future__ import annotations

import datetime
import faulthandler
import importlib
import io
import linecache
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable, Sequence

from course_utils.runtime.backend import BACKENDS, device, init_process_group, resolve_backend, to_cpu

__all__ = ["run", "RankError", "LaunchTimeout", "torchrun_main", "ping", "MAX_WORLD_SIZE",
           "BACKENDS", "resolve_backend", "device", "start_forkserver", "preload"]

MAX_WORLD_SIZE = 16
# Modules the forkserver imports once, so each rank starts with them already loaded.
# torch._dynamo is imported lazily by DDP/FSDP/DTensor and costs ~1.4 s per fresh process.
PRELOAD = ["torch", "torch.distributed", "torch.nn", "torch._dynamo", "torch.distributed.tensor",
           "torch.distributed.tensor.parallel", "torch.distributed.fsdp",
           "torch.distributed.pipelining", "cloudpickle", "course_utils.launch"]
# With COURSE_LAUNCH_PRELOAD=light (set for grading kernels, whose tests use plain collectives)
# the forkserver starts ~1 s sooner; a rank that needs DDP/FSDP/DTensor imports it itself.
PRELOAD_LIGHT = ["torch", "torch.distributed", "torch.nn", "cloudpickle", "course_utils.launch"]

_HOST = "127.0.0.1"
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


class RankError(RuntimeError):
    """A rank failed: raised, died, or did not finish in time.

    Attributes: ``rank`` (the rank reported first), ``rank_traceback`` (its traceback text),
    ``outputs`` (each rank's captured stdout+stderr, rank order), ``failure`` (what the rank
    raised, as data: ``type``, ``message``, ``name`` (a NameError's), ``raised_in`` (the library
    whose code raised it, None for the student's own code) and ``frame`` (the student's innermost
    frame: file, line, function), or None); ``short`` (the head line and the student's frames:
    what a notebook shows, ``course_utils.assess.messages``).
    """

    def __init__(self, message: str, rank: int | None, rank_traceback: str, outputs: list[str],
                 failure: dict | None = None, short: str = ""):
        super().__init__(message)
        self.rank = rank
        self.rank_traceback = rank_traceback
        self.outputs = outputs
        self.failure = failure
        self.short = short or message


class LaunchTimeout(RankError, TimeoutError):
    """Some ranks were still running when ``timeout_s`` ran out; they have been killed."""

    def __init__(self, message: str, ranks: list[int], stacks: str, outputs: list[str]):
        super().__init__(message, ranks[0] if ranks else None, stacks, outputs)
        self.ranks = ranks


# ----------------------------------------------------------------------------------- rank side


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
    # with no Python frames), and _trim_stack keeps the one running fn
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
        store = dist.TCPStore(_HOST, port, world_size, is_master=False, timeout=timeout)
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
        value = (_student_traceback(exc, origins), traceback.format_exc(), _failure(exc, origins))
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


# ---------------------------------------------------------------------------------- launcher side


_LIBRARY_ROOTS = tuple({os.path.dirname(os.__file__), sys.prefix, sys.base_prefix,
                        os.path.dirname(os.path.abspath(__file__))})


# Course modules whose functions are programs a student reads and debugs (assignment a10's
# broken programs): their frames are shown with their lines, like the student's own.
_DEBUGGED_MODULES = (os.path.join("data_parallel", "pitfalls.py"),)


def _library_name(filename: str) -> str | None:
    """``torch.distributed`` for a file of an installed or standard library (or the course's
    own helpers), None for the student's code (notebook cells, their own files, and the course's
    programs to debug)."""
    path = os.path.abspath(filename)
    if not path.startswith(_LIBRARY_ROOTS) or not os.path.exists(path):
        return None
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.relpath(path, here) in _DEBUGGED_MODULES:
        return None
    parts = path.split(os.sep)
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts:
            rest = parts[parts.index(anchor) + 1:]
            return ".".join(p.removesuffix(".py") for p in rest[:2])
    if path.startswith(here + os.sep):
        return "course_utils." + os.path.relpath(path, here).removesuffix(".py").replace(
            os.sep, ".").removesuffix(".__init__")
    return os.path.basename(path).removesuffix(".py")


def _student_traceback(exc: BaseException, origins: dict) -> str:
    """The traceback of ``exc`` as a student needs it: their frames with source lines, each run
    of library frames folded to one line, the launcher's own frame left out.

    ``origins`` maps (qualname, first line) of code sent by value to the file (notebook cell) it
    came from: cloudpickle renames such code ``<dynamic-code>``.
    """
    lines = ["Traceback (most recent call last):"]
    folded: list[str] = []

    def fold() -> None:
        if folded:
            names = ", ".join(dict.fromkeys(folded))
            lines.append(f"  ... {len(folded)} frame(s) in {names}")
            folded.clear()

    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        code = frame.f_code
        if code is _rank_main.__code__ or code.co_filename == __file__:
            continue  # the launcher's own frames, whatever calls fn
        filename = origins.get((code.co_qualname, code.co_firstlineno), code.co_filename)
        library = _library_name(filename)
        if library is not None:
            folded.append(library)
            continue
        fold()
        lines.append(f'  File "{filename}", line {lineno}, in {code.co_name}')
        source = linecache.getline(filename, lineno).strip()
        if source:
            lines.append(f"    {source}")
    fold()
    only = traceback.TracebackException.from_exception(exc).format_exception_only()
    return "\n".join(lines + [line.rstrip("\n") for line in only])


def _failure(exc: BaseException, origins: dict) -> dict:
    """What a rank raised, as plain data (see :class:`RankError`'s ``failure``)."""
    raised_in, frame = None, None
    for tb_frame, lineno in traceback.walk_tb(exc.__traceback__):
        code = tb_frame.f_code
        if code is _rank_main.__code__ or code.co_filename == __file__:
            continue
        filename = origins.get((code.co_qualname, code.co_firstlineno), code.co_filename)
        raised_in = _library_name(filename)
        if raised_in is None:
            frame = (filename, lineno, code.co_name)
    name = getattr(exc, "name", None) if isinstance(exc, NameError) else None
    return {"type": type(exc).__name__, "message": str(exc)[:2000], "raised_in": raised_in,
            "name": name if isinstance(name, str) else None, "frame": frame}


def _code_origins(*objects: Any) -> tuple[dict, dict]:
    """For functions sent by value (defined in a notebook): ``{(qualname, first line): file}``
    of their code and of the notebook functions they call, and those files' text from
    ``linecache`` (a cell is not a file the ranks could read)."""
    import functools
    import types

    origins: dict = {}
    seen: set[int] = set()

    def visit_code(code: types.CodeType) -> None:
        if id(code) in seen:
            return
        seen.add(id(code))
        origins[(code.co_qualname, code.co_firstlineno)] = code.co_filename
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                visit_code(const)

    def visit(obj: Any, depth: int) -> None:
        if depth > 3:
            return
        if isinstance(obj, (list, tuple)):
            for item in obj[:50]:
                visit(item, depth + 1)
        elif isinstance(obj, functools.partial):
            visit([obj.func, *obj.args, *obj.keywords.values()], depth + 1)
        elif isinstance(obj, types.FunctionType) and id(obj.__code__) not in seen:
            visit_code(obj.__code__)
            for name in obj.__code__.co_names:  # the notebook functions it calls
                other = obj.__globals__.get(name)
                if isinstance(other, types.FunctionType) and other.__module__ == obj.__module__:
                    visit(other, depth + 1)

    visit(objects, 0)
    sources = {}
    for filename in set(origins.values()):
        entry = linecache.cache.get(filename)
        if entry is not None and len(entry) == 4 and not os.path.exists(filename):
            sources[filename] = (entry[0], None, entry[2], entry[3])  # mtime None: kept
    origins = {k: f for k, f in origins.items() if f in sources}
    return origins, sources


def _get_context(method: str | None) -> mp.context.BaseContext:
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
    first :func:`run` finds it ready instead of waiting for it. A notebook whose first launch
    comes late (lecture 8) calls it in its setup cell. False where ranks start by spawn."""
    ctx = _get_context(None)
    if ctx.get_start_method() != "forkserver":
        return False
    import multiprocessing.forkserver

    multiprocessing.forkserver.ensure_running()
    return True


def _check_args(fn: Any, world_size: Any, timeout_s: Any, threads_per_rank: Any) -> None:
    if not callable(fn):
        raise TypeError(f"fn must be callable as fn(rank, world_size, *args); got {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int from 1 to {MAX_WORLD_SIZE}; got {world_size!r}")
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ValueError(f"world_size must be from 1 to {MAX_WORLD_SIZE}; got {world_size}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s must be a positive number of seconds; got {timeout_s!r}")
    if threads_per_rank is not None and (
            isinstance(threads_per_rank, bool) or not isinstance(threads_per_rank, int)
            or threads_per_rank < 1):
        raise ValueError(f"threads_per_rank must be None or an int >= 1; got {threads_per_rank!r}")


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "was still running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code} without reporting a result"


def _read_logs(paths: Sequence[str]) -> list[str]:
    logs = []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                logs.append(f.read())
        except OSError:
            logs.append("")
    return logs


def _trim_stack(text: str) -> str:
    """Where a rank was, from its faulthandler dump (all threads): the thread that runs ``fn``
    (the one under ``_rank_main``), the launcher's own frames dropped, each run of library
    frames folded to one line, as in :func:`_student_traceback`."""
    import re

    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x|Stack \(most recent)", text)
    mine = ([b for b in blocks if "in _rank_main" in b]
            or sorted(blocks, key=lambda b: b.count('File "'))[-1:])  # (fn not called yet)
    lines: list[str] = []
    folded: list[tuple[str, str]] = []

    def fold() -> None:  # (most recent first: the last folded frames are the calls fn made)
        if folded:
            names = ", ".join(dict.fromkeys(lib for lib, _ in folded))
            calls = " > ".join(name for _, name in reversed(folded[-2:]))
            lines.append(f"  ... {len(folded)} frame(s) in {names} ({calls})")
            folded.clear()

    for line in "\n".join(mine).splitlines():
        m = re.match(r'\s*File "(.+)", line (\d+) in (.+)', line)
        if m is None:
            if line.strip():
                fold()
                lines.append("Stack (most recent call first):" if "thread 0x" in line.lower()
                             else line)
            continue
        filename, name = m.group(1), m.group(3)
        if "multiprocessing/" in filename or filename == "<string>" or name == "_rank_main":
            continue
        library = "importlib" if filename.startswith("<frozen ") else _library_name(filename)
        if library is not None:
            folded.append((library, name.strip()))
            continue
        fold()
        lines.append(line.rstrip())
        source = linecache.getline(filename, int(m.group(2))).strip()
        if source:
            lines.append(f"    {source}")
    fold()
    return "\n".join(lines)


def _format_outputs(logs: Sequence[str]) -> str:
    lines = []
    for rank, text in enumerate(logs):
        for line in text.splitlines():
            lines.append(f"[rank {rank}] {line}")
    return "\n".join(lines)


class _LiveTail:
    """Print the complete lines a rank has written to its log since the last call."""

    def __init__(self, path: str, rank: int):
        self.path, self.rank, self.offset = path, rank, 0

    def print_new_lines(self, final: bool = False) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return
        end = len(chunk) if final else chunk.rfind(b"\n") + 1
        if end <= 0:
            return
        self.offset += end
        text = chunk[:end].decode("utf-8", errors="replace")
        print("\n".join(f"[rank {self.rank}] {line}" for line in text.splitlines()), flush=True)


def _kill(procs: Sequence[mp.process.BaseProcess], dump_stacks: bool = False) -> None:
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
    or "nccl" (:func:`resolve_backend`); ``fn`` finds its device with :func:`device`.
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
    payload = cloudpickle.dumps((fn, args, _fault, _code_origins(fn, args)))
    ctx = _get_context(start_method)
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
            print(_format_outputs(logs))
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
    store = dist.TCPStore(_HOST, 0, world_size, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=pg_timeout_s))
    logdir = tempfile.mkdtemp(prefix="course-launch-")
    log_paths = [os.path.join(logdir, f"rank{r}.log") for r in range(world_size)]
    procs: list[mp.process.BaseProcess] = []
    conns: dict[int, mp.connection.Connection] = {}
    lifelines = []
    results: dict[int, Any] = {}
    live = _LiveTail(log_paths[live_rank], live_rank) if live_rank is not None else None
    try:
        for rank in range(world_size):
            recv_end, send_end = ctx.Pipe(duplex=False)
            life_recv, life_send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_rank_main, name=f"rank{rank}", daemon=True, args=(
                rank, world_size, store.port, payload, send_end, life_recv, log_paths[rank],
                pg_timeout_s, hard_deadline, threads, backend))
            p.start()
            send_end.close()
            life_recv.close()
            procs.append(p)
            conns[rank] = recv_end
            lifelines.append(life_send)

        pending = set(range(world_size))
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _kill(procs, dump_stacks=True)
                logs = _read_logs(log_paths)
                late = sorted(pending)
                stacks = "\n".join(f"--- rank {r} ---\n{_trim_stack(logs[r])}" for r in late)
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
                logs = _read_logs(log_paths)
                failure = None
                if status == "died":
                    proc.join(1)
                    short = full = f"rank {rank} {_describe_exit(proc.exitcode)}."
                    head = short
                else:
                    short, full, failure = value
                    head = f"rank {rank} failed first: {short.strip().splitlines()[-1]}"
                outputs = _format_outputs(logs)
                mine = []  # the student's frames (a frame's line and its source line)
                for line in short.splitlines()[1:]:
                    if not line.startswith("  "):
                        break  # (the exception's own lines)
                    if not line.startswith("  ... "):
                        mine.append(line)
                error = RankError(
                    f"{head}\n--- rank {rank} traceback (library frames folded; the whole one "
                    f"is in .rank_traceback) ---\n{short}"
                    + (f"\n--- output of all ranks ---\n{outputs}" if outputs else ""),
                    rank, full, logs, failure,
                    "\n".join([head, *mine] + ([outputs] if outputs else [])))
                raise _RendezvousFailed(error) if status == "init_error" else error

        for p in procs:  # ranks exit right after reporting; give them a moment to tear down
            p.join(max(0.5, min(5.0, deadline - time.monotonic())))
        logs = _read_logs(log_paths)
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


# ---------------------------------------------------------------------------------- torchrun


def torchrun_main(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(rank, world_size, *args)`` as one rank of a torchrun job (env:// rendezvous).

    The backend is ``$COURSE_BACKEND`` (default "auto": NCCL when every local rank has its own
    CUDA device, gloo otherwise), so the same command runs on a laptop, a GPU box and, with
    ``--nnodes``, a cluster. Prints ``rank r returned: <value>`` and returns the value.
    """
    import torch
    import torch.distributed as dist

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    init_process_group(resolve_backend(os.environ.get("COURSE_BACKEND", "auto"), local_world),
                       local_rank)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    try:
        value = to_cpu(fn(rank, world_size, *args))
        # One write per line: the ranks share torchrun's stdout, and print() writes the text
        # and its newline separately, so two ranks' lines could interleave.
        sys.stdout.write(f"rank {rank} returned: {value}\n")
        sys.stdout.flush()
        return value
    finally:
        dist.destroy_process_group()


def ping(rank: int, world_size: int) -> int:
    """A trivial job: all-reduce each rank's number; every rank returns 0 + 1 + ... + (ws - 1)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([rank], device=device())
    dist.all_reduce(t)
    return int(t.item())


def _resolve(spec: str) -> Callable[..., Any]:
    if ":" not in spec:
        raise ValueError(f"expected 'package.module:function', got {spec!r}")
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr)


if __name__ == "__main__":
    # torchrun --standalone --nproc-per-node N -m course_utils.launch package.module:function [int args...]
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    cli_args = [int(a) if a.lstrip("-").isdigit() else a for a in sys.argv[2:]]
    torchrun_main(_resolve(sys.argv[1]), *cli_args)

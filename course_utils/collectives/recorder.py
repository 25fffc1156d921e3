"""The collective recorder: every collective a block of code issues, as one kind of record.

:func:`record` yields the list of :class:`Call` a ``with`` block fills: one per collective, with
its kind (``op``), process group, buffer, shape and dtype, the :func:`phase` it ran in and the
``torch.distributed`` function (``api``) that issued it. The calls are *traced*: the block runs
under a ``TorchDispatchMode`` that sees each c10d operation as the dispatcher runs it, whoever
issued it, on any process group (gloo, NCCL, PyTorch's fake group). A course operator that
builds a logical collective out of another (lecture 6's reduce-scatter is an all-to-all and a
sum) also declares it (:func:`declare`), with its phase and wall time; ``record(declared=True)``
sees those. :func:`listen` hands each call to a function instead (the views below keep their
own records).
A call's bytes sent under ring algorithms (:attr:`Call.sent_bytes`) come from
:mod:`course_utils.collectives.cost`.

Why the dispatcher and not wrappers around ``torch.distributed``'s functions (checked on gloo in
``tests/test_recorder.py``): a dispatch mode sees every collective function, ``send``/``recv``,
``isend``/``irecv`` and each operation of ``batch_isend_irecv``, a collective called inside a
backward, DTensor's and FSDP2's functional collectives, and the fake process group, including
functions imported before the block began. What it cannot see is which Python function made the
call; :attr:`Call.api` reads that from the stack (the outermost function of
``torch.distributed.distributed_c10d`` in the frames above the operation), and :attr:`Call.api_call`
numbers those calls, so the sends and receives of one ``batch_isend_irecv`` share one number.

Every recorder of the course is a view of this one: ``tensor_parallel.recording`` (lecture 4's
``record_comms`` and ``spy_collectives``), ``zero.recording`` (lecture 3), ``trainer3d.comms``'s
``count_comms`` (module 10), ``scale.comms``'s ``CollectiveLog`` (module 11), and the counts of
``zero.fsdp.reduce_dtype_worker`` and ``data_parallel.pitfalls`` (a10). Lectures 2-11.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import typing_extensions
from torch.utils._python_dispatch import TorchDispatchMode

from course_utils.collectives import cost
from course_utils.runtime import validate

__all__ = ["OPS", "Call", "record", "listen", "once_per_api_call", "declare", "phase",
           "current_phase"]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
       "gather", "scatter", "send", "recv", "barrier")
"""The kinds of :attr:`Call.op`: the ring collectives of :data:`cost.RING_OPS`, the rooted ones,
point-to-point (one call per message) and the barrier."""


@dataclass(frozen=True)
class Call:
    """One collective on this rank: ``op`` (one of :data:`OPS`) over the group ``group_name`` of
    ``group_size`` ranks, on ``buffer_bytes`` (the all-reduce's tensor, the all-gather's output,
    the reduce-scatter's and the all-to-all's input, as :mod:`~course_utils.collectives.cost`
    counts them; the tensor of the others, each message of a send or receive; 0 for a barrier).

    ``shape`` and ``dtype``: this rank's result (a list of tensors stacked: ``(n, *shape)``).
    ``phase``: the :func:`phase` it ran in, or the one its operator declared. ``seconds``: the
    wall time its operator measured (0 when traced). ``api``: the ``torch.distributed`` function
    that issued it ("" when none did: DTensor's functional collectives, DDP's reducer, a
    declared call); ``api_call``: which call of a function it came from, counted from 1 in its
    recording (the messages of one ``batch_isend_irecv`` share it). ``dispatched``: the c10d
    operation the dispatcher ran (``"c10d._allgather_base_"``); "" for a declared call.
    """

    op: str
    group_name: str
    group_size: int
    buffer_bytes: int
    phase: str = ""
    seconds: float = field(default=0.0, compare=False)
    shape: tuple = ()
    dtype: torch.dtype | None = None
    api: str = ""
    api_call: int = 0
    dispatched: str = ""

    @property
    def declared(self) -> bool:
        """Whether an operator declared this call (:func:`declare`) rather than it was traced."""
        return not self.dispatched

    @property
    def result_bytes(self) -> int:
        """Bytes of this rank's result (``shape`` times the size of ``dtype``)."""
        if self.dtype is None:
            raise ValueError("this call has no dtype: its result's bytes are unknown")
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def sent_bytes(self) -> float | None:
        """Bytes this rank sends: a ring's share of the buffer for the collectives of
        :data:`cost.RING_OPS` (:func:`cost.ring_bytes`), the message for a send, 0 for a
        receive or a barrier; None for the rooted collectives (no ring model)."""
        if self.op in cost.RING_OPS:
            return cost.ring_bytes(self.op, self.buffer_bytes, self.group_size)
        return {"send": float(self.buffer_bytes), "recv": 0.0, "barrier": 0.0}.get(self.op)


# ------------------------------------------------------------------------- phase and declare

_phases: list[str] = []
_declared_sinks: list[Callable[[Call], None]] = []


@contextlib.contextmanager
def phase(label: str) -> Iterator[str]:
    """Label the calls traced (and declared without a phase) inside the block ``label``."""
    if not isinstance(label, str):
        raise ValueError(f"label must be a str; got {type(label).__name__}")
    _phases.append(label)
    try:
        yield label
    finally:
        _phases.pop()


def current_phase() -> str:
    """The label of the innermost open :func:`phase` block ("" outside every one)."""
    return _phases[-1] if _phases else ""


def _group_of(group: Any) -> tuple[str, int]:
    if not (dist.is_available() and dist.is_initialized()):
        return "", 1
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    return pg.group_name, dist.get_world_size(group)


def declare(op: str, result: torch.Tensor, *, phase: str | None = None, seconds: float = 0.0,
            group: Any = None) -> Call:
    """Record that this rank's operator just ran the collective ``op`` over ``group`` (None:
    the default group, as in ``torch.distributed``), leaving ``result`` on this rank, in
    ``seconds``, in ``phase`` (None: the current :func:`phase`). Every open ``record(declared=
    True)`` gets the :class:`Call`, which is returned. The buffer is the result, times the
    group's size for a reduce-scatter (its input)."""
    validate.one_of("op", op, OPS)
    if not isinstance(result, torch.Tensor):
        raise ValueError(f"result must be a tensor; got {type(result).__name__}")
    name, size = _group_of(group)
    nbytes = result.numel() * result.element_size()
    call = Call(op, name, size, nbytes * size if op == "reduce_scatter" else nbytes,
                current_phase() if phase is None else phase, seconds, tuple(result.shape),
                result.dtype)
    for sink in list(_declared_sinks):
        sink(call)
    return call


# ------------------------------------------------------------------------------- the tracer

_C10D_OPS = {
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce",
    "allgather_": "all_gather", "_allgather_base_": "all_gather",
    "allgather_coalesced_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all", "broadcast_": "broadcast",
    "reduce_": "reduce", "gather_": "gather", "scatter_": "scatter", "send": "send",
    "recv_": "recv", "recv_any_source_": "recv", "barrier": "barrier",
    "monitored_barrier_": "barrier"}
"""c10d's operations (``torch.distributed``'s functions on a ``ProcessGroup``) -> op."""

_FUNCTIONAL_OPS = {
    "all_reduce": "all_reduce", "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce", "all_reduce_coalesced_": "all_reduce",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_out": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_out": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "all_to_all_single": "all_to_all",
    "broadcast": "broadcast", "broadcast_": "broadcast", "isend": "send", "irecv": "recv",
    "batch_p2p_ops": "send"}
"""Functional collectives (DTensor, FSDP2, ``torch.compile``) -> op (``batch_p2p_ops``: one
call per message, each a send or a receive)."""

_NAMESPACES = {"c10d": _C10D_OPS, "_c10d_functional": _FUNCTIONAL_OPS,
               "_c10d_functional_autograd": _FUNCTIONAL_OPS, "c10d_functional": _FUNCTIONAL_OPS}

# the arguments (by schema name) that hold an op's buffer, and its result on this rank
_BUFFER = {"all_gather": ("output_tensors", "output_tensor", "output_lists", "outputs", "out"),
           "scatter": ("output_tensors",), "barrier": ()}
_INPUTS = ("input_tensors", "input_tensor", "inputs", "input", "input_list", "shard", "tensors",
           "tensor", "self")
_RESULT = ("output_tensors", "output_tensor", "output_lists", "outputs", "output", "out",
           "tensors", "tensor")

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_C10D_FILE = dist.distributed_c10d.__file__
_DECORATORS = typing_extensions.__file__   # @deprecated wraps some of torch.distributed's
_kinds: dict[Any, str | None] = {}


def _kind(func: Any) -> str | None:
    """The op of a dispatched operation, None when it is no collective (cached)."""
    if func not in _kinds:
        table = _NAMESPACES.get(func.namespace, {})
        _kinds[func] = table.get(func._overloadpacket.__name__)
    return _kinds[func]


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _shape(tensors: list[torch.Tensor]) -> tuple:
    if len(tensors) == 1:
        return tuple(tensors[0].shape)
    if tensors and all(t.shape == tensors[0].shape for t in tensors):
        return (len(tensors), *tensors[0].shape)
    return (sum(t.numel() for t in tensors),) if tensors else ()


def _first(bound: dict[str, Any], names: tuple[str, ...]) -> list[torch.Tensor]:
    for name in names:
        if name in bound:
            return _tensors(bound[name])
    return []


def _process_group(bound: dict[str, Any]) -> tuple[str, int]:
    pg = bound.get("process_group", bound.get("group_name"))
    if isinstance(pg, str):
        pg = dist.distributed_c10d._resolve_process_group(pg)
    elif isinstance(pg, torch.ScriptObject):
        pg = dist.ProcessGroup.unbox(pg)
    if pg is None:       # the legacy functional collectives name their ranks, not a group
        return "", int(bound.get("group_size", 0))
    return pg.group_name, pg.size()


def _api(frame: Any) -> Any:
    """The outermost frame of ``torch.distributed.distributed_c10d`` among the torch frames
    from ``frame`` outwards, through other dispatch modes (None when the operation came from
    elsewhere)."""
    found = None
    while frame is not None:
        code = frame.f_code
        if not (code.co_filename.startswith(_TORCH_DIR) or code.co_filename == _DECORATORS
                or code.co_name == "__torch_dispatch__"):
            break
        if code.co_filename == _C10D_FILE:
            found = frame
        frame = frame.f_back
    return found


class _Tracer(TorchDispatchMode):
    """Hands a :class:`Call` to ``sink`` for each collective the dispatcher runs."""

    def __init__(self, sink: Callable[[Call], None]) -> None:
        super().__init__()
        self.sink = sink
        # the last function's frame, held until the next collective so that no later call's
        # frame can take its address (frames are recycled)
        self.api_frame: Any = None
        self.api_calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        op = _kind(func)
        if op is not None:
            frame = _api(sys._getframe(1))
            if frame is None or frame is not self.api_frame:
                self.api_calls += 1
            self.api_frame = frame
            for call in self._calls(op, func, args, kwargs, out, frame):
                self.sink(call)
        return out

    def _calls(self, op: str, func: Any, args: tuple, kwargs: dict, out: Any,
               frame: Any) -> list[Call]:
        bound = dict(zip((a.name for a in func._schema.arguments), args)) | kwargs
        name, size = _process_group(bound)
        common = dict(phase=current_phase(), api=frame.f_code.co_name if frame else "",
                      api_call=self.api_calls,
                      dispatched=f"{func.namespace}.{func._overloadpacket.__name__}")
        if func._overloadpacket.__name__ == "batch_p2p_ops":     # one call per message
            return [Call("send" if kind == "isend" else "recv", name, size, _nbytes([t]),
                         shape=tuple(t.shape), dtype=t.dtype, **common)
                    for kind, t in zip(bound["op_list"], bound["tensors"])]
        buffer = _first(bound, _BUFFER.get(op, _INPUTS))
        nbytes = _nbytes(buffer)
        if op == "all_gather" and not buffer:            # functional: the input is one shard
            buffer = _first(bound, _INPUTS)
            nbytes = _nbytes(buffer) * size
        result = [] if op == "barrier" else _first(bound, _RESULT) or _tensors(out)
        dtype = (buffer or result)[0].dtype if (buffer or result) else None
        return [Call(op, name, size, nbytes, shape=_shape(result), dtype=dtype, **common)]


# ------------------------------------------------------------------------------- recording


@contextlib.contextmanager
def listen(sink: Callable[[Call], None], *, traced: bool = True,
           declared: bool = False) -> Iterator[None]:
    """Within the block, hand ``sink`` each collective: those the dispatcher runs on this
    thread (``traced``) and those the course's operators :func:`declare` (``declared``)."""
    validate.check_bool("traced", traced)
    validate.check_bool("declared", declared)
    with contextlib.ExitStack() as stack:
        if declared:
            _declared_sinks.append(sink)
            stack.callback(lambda: _declared_sinks.pop(
                next(i for i, s in enumerate(_declared_sinks) if s is sink)))
        if traced:
            stack.enter_context(_Tracer(sink))
        yield


def once_per_api_call(sink: Callable[[Call], None]) -> Callable[[Call], None]:
    """A sink that passes ``sink`` the first traced :class:`Call` of each call of a
    ``torch.distributed`` function (each ``api_call``): one per function a program called,
    whatever operations it ran (the messages of a ``batch_isend_irecv``, the two gathers of an
    ``all_gather_object``)."""
    last = [0]

    def first(call: Call) -> None:
        if not call.declared and call.api_call != last[0]:
            last[0] = call.api_call
            sink(call)
    return first


@contextlib.contextmanager
def record(*, traced: bool = True, declared: bool = False) -> Iterator[list[Call]]:
    """The list of :class:`Call` the block issues, in order: traced from the dispatcher
    (``traced``), declared by the course's operators (``declared``), or both."""
    calls: list[Call] = []
    with listen(calls.append, traced=traced, declared=declared):
        yield calls

"""The collectives of one training step at scale, traced from PyTorch itself (module 11).

:func:`trace_step` shards one rank's stage as ``scale_memory.shard_stage`` does, makes its
weights fake tensors (``FakeTensorMode``: shapes and dtypes, no data, no compute) and runs one
forward and backward of a microbatch under two dispatch modes: PyTorch's ``CommDebugMode``
(collectives by kind) and :class:`CollectiveLog`, which records every collective's mesh axis
and buffer (a view of the course's recorder, :mod:`course_utils.collectives.recorder`). Each
rank sends, under ring algorithms, ``(g-1)/g`` of an all-gather's output or a reduce-scatter's
input and ``2(g-1)/g`` of an all-reduce's buffer, over a group of ``g`` ranks
(:func:`sent_bytes`, from :mod:`course_utils.collectives.cost`).

The layers of a stage are identical, so the trace runs the stage with one and with two layers
and extends the difference to all of them (:func:`trace_step` says so in ``"layers_traced"``;
``tests/test_scale.py`` checks the extension against a full trace). Pipeline sends are not
traced (the stage runs alone): :func:`course_comms` counts them, as the course does.

:func:`course_comms` is the course's accounting: ZeRO-3's two all-gathers and one
reduce-scatter of the stage's parameters (``zero.expected_comm_bytes``), Megatron's two
all-reduces of the activations forward and two backward per layer, and one activation each
way between neighbouring stages.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections import defaultdict
from typing import Any

import torch

from course_utils.collectives import cost, recorder
from course_utils.runtime import backend
from course_utils.models import llama_shapes
from course_utils.scale import memory as scale_memory
from course_utils.zero import sizes as zero
from course_utils.runtime.validate import check_int

__all__ = ["KINDS", "CollectiveLog", "one_step", "accumulate", "summarize", "axis_names",
           "trace_step", "course_comms", "sent_bytes"]

KINDS = {"_allgather_base_": "all_gather", "all_gather_into_tensor": "all_gather",
         "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
         "all_reduce": "all_reduce", "allreduce_": "all_reduce"}


def sent_bytes(kind: str, buffer_bytes: float, group: int) -> float:
    """Bytes one rank sends for a ring collective over ``group`` ranks; ``buffer_bytes`` is the
    all-reduce's buffer, the all-gather's output or the reduce-scatter's input
    (:func:`course_utils.collectives.cost.ring_bytes`)."""
    return cost.ring_bytes(kind, buffer_bytes, group)


class CollectiveLog:
    """Records ``(kind, group name, group size, buffer bytes)`` for each collective dispatched
    (of :data:`KINDS`) while it is entered, as a ``with`` block; it may be entered again, the
    calls add up. A view of :func:`course_utils.collectives.recorder.listen`."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int, int]] = []
        self._open: list[contextlib.ExitStack] = []

    def __enter__(self) -> CollectiveLog:
        stack = contextlib.ExitStack()
        stack.enter_context(recorder.listen(self._seen))
        self._open.append(stack)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._open.pop().close()

    def _seen(self, call: recorder.Call) -> None:
        kind = KINDS.get(call.dispatched.rpartition(".")[2])
        if kind is not None:
            self.calls.append((kind, call.group_name, call.group_size, call.buffer_bytes))


def accumulate(module: torch.nn.Module, microbatch: int, microbatches: int) -> None:
    """Set FSDP2 for ``microbatch`` of a step's ``microbatches``, as ``torch.distributed.
    pipelining`` does (``stage.py``: ``backward_maybe_with_nosync`` turns gradient sync and
    resharding off for every backward; ``perform_reduce_grad`` reduce-scatters once at the
    end): here with FSDP2's public switches, on in the last backward only."""
    if hasattr(module, "set_requires_gradient_sync"):
        last = microbatch == microbatches - 1
        module.set_requires_gradient_sync(last)
        module.set_reshard_after_backward(last)
        module.set_is_last_backward(last)


def one_step(module: torch.nn.Module, model: str, batch: int, seq: int,
             mixed: bool, seq_shards: int = 1) -> None:
    """A forward and backward of one ``batch x seq`` microbatch through a stage: token ids
    into the first stage, activations into the others (bf16 when ``mixed``; this rank's
    ``1 / seq_shards`` of the sequence under sequence parallelism).

    Two of PyTorch's warnings are silenced here, and only here: the stage's input is data (no
    gradient), so a full backward hook fires on outputs alone; and the stage returns a view,
    which FSDP2 warns an in-place op could break (the output is only read)."""
    s = llama_shapes.shape(model)
    on = next(module.parameters()).device
    if module.embed is not None:
        x = torch.randint(0, s.vocab, (batch, seq), device=on)
    else:
        x = torch.randn(batch, seq // seq_shards, s.hidden, device=on,
                        dtype=torch.bfloat16 if mixed else torch.float32)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Full backward hook is firing when gradients are "
                                "computed with respect to module outputs", UserWarning)
        warnings.filterwarnings("ignore", "FSDP2-wrapped module .* returned a view tensor",
                                UserWarning)
        module(x).float().sum().backward()


def summarize(calls: list, names: dict[str, str]) -> dict[tuple[str, str], list[float]]:
    """Log entries summed by (mesh axis, kind): ``[calls, buffer bytes, bytes sent]``."""
    out: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for kind, name, group, nbytes in calls:
        row = out[(names.get(name, name), kind)]
        row[0] += 1
        row[1] += nbytes
        row[2] += sent_bytes(kind, nbytes, group)
    return dict(out)


def axis_names(mesh: Any) -> dict[str, str]:
    """Group name -> mesh axis."""
    return {mesh[axis].get_group().group_name: axis for axis in scale_memory.MESH_AXES}


def _trace(model: str, tp: int, pp: int, dp: int, n_layers: int, batch: int,
           seq: int, mixed: bool, tp_plan: str, reduce_dtype: str, microbatches: int,
           reshard_after_forward: bool) -> dict[tuple[str, str], list[float]]:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor.debug import CommDebugMode

    module, mesh = scale_memory.shard_stage(model, tp, pp, dp, n_layers=n_layers, mixed=mixed,
                                            tp_plan=tp_plan, reduce_dtype=reduce_dtype,
                                            reshard_after_forward=reshard_after_forward)
    log, counted = CollectiveLog(), 0
    with FakeTensorMode(allow_non_fake_inputs=True):
        module.to_empty(device=backend.SIMULATED_DEVICE)
        for i in range(microbatches):
            accumulate(module, i, microbatches)
            counts = CommDebugMode()  # (one per forward: its module tracker fails on a second)
            with counts, log:
                one_step(module, model, batch, seq, mixed, tp if tp_plan == "sequence" else 1)
            counted += counts.get_total_counts()
    if counted != len(log.calls):
        raise RuntimeError(f"CommDebugMode counted {counted} collectives, "
                           f"the log {len(log.calls)}")
    return summarize(log.calls, axis_names(mesh))


@functools.lru_cache(maxsize=128)
def _traced(model: str, tp: int, pp: int, dp: int, pp_coord: int, tp_coord: int, layers: int,
            *rest: Any) -> dict[tuple[str, str], list[float]]:
    """:func:`_trace` on the fake rank at DP coordinate 0 of (``pp_coord``, ``tp_coord``): the
    ranks of one (PP, TP) position run the same collectives on the same buffers, whatever their
    DP coordinate (FSDP2 pads uneven shards to the same size; ``tests/test_scale.py`` compares
    every real rank with it), so one trace per position serves them all (kept per process)."""
    rank = (pp_coord * dp) * tp + tp_coord
    return backend.fake_job(rank, tp * pp * dp, _trace, model, tp, pp, dp, layers, *rest)


def trace_step(model: str, tp: int = 1, pp: int = 1, dp: int = 1, rank: int = 0,
               batch: int = 1, seq: int = 4096, full: bool = False,
               mixed: bool = True, tp_plan: str = "per_linear",
               reduce_dtype: str = "bf16", microbatches: int = 1,
               reshard_after_forward: bool = True) -> dict[str, Any]:
    """The forward and backward passes of ``microbatches`` microbatches of ``batch x seq``
    tokens on ``rank`` (one step, gradients accumulated: :func:`accumulate`), traced.

    Returns ``{"rows": {(axis, kind): {"calls", "buffer", "sent"}}, "layers", "layers_traced"}``
    (bytes; ``sent`` per rank under rings). ``full``: trace every layer of the stage (slow for
    big stages) instead of one and two layers extended. ``mixed``: bf16 gathers, reductions and
    activations (the course's formulas), else fp32; ``reduce_dtype``: ``"fp32"`` reduces the
    gradients in fp32 under ``mixed`` (torchtitan's default). ``tp_plan``: one of
    ``llama_shapes.TP_PLANS``. ``reshard_after_forward``: FSDP2's; torchtitan passes
    ``not pp_enabled`` (under PP each stage keeps its weights gathered for the whole step).
    """
    check_int("microbatches", microbatches, 1)
    if not isinstance(reshard_after_forward, bool):
        raise ValueError(f"reshard_after_forward must be True or False; "
                         f"got {reshard_after_forward!r}")
    s = llama_shapes.shape(model)
    coords = scale_memory.mesh_coords(rank, tp, pp, dp)
    n = len(llama_shapes.stage_layers(s.layers, pp, coords["pp"]))

    def traced(layers: int) -> dict:
        return {key: list(v) for key, v in _traced(
            model, tp, pp, dp, coords["pp"], coords["tp"], layers, batch, seq, mixed, tp_plan,
            reduce_dtype, microbatches, reshard_after_forward).items()}

    if full or n <= 1:
        rows, n_traced = traced(n), n
    else:
        one = traced(1)
        two = traced(2) if n > 1 else one
        rows, n_traced = {}, min(n, 2)
        for key in set(one) | set(two):
            a, b = one.get(key, [0, 0.0, 0.0]), two.get(key, [0, 0.0, 0.0])
            rows[key] = [x + (n - 1) * (y - x) for x, y in zip(a, b)]
    named = {key: {"calls": int(v[0]), "buffer": v[1], "sent": v[2]} for key, v in rows.items()}
    return {"rows": named, "layers": n, "layers_traced": n_traced, "coords": coords}


def course_comms(model: str, tp: int = 1, pp: int = 1, dp: int = 1, rank: int = 0,
                 batch: int = 1, seq: int = 4096) -> dict[tuple[str, str], float]:
    """The course's bytes sent by ``rank`` in one step of one microbatch, by (axis, kind).

    DP: ``zero.expected_comm_bytes(units, dp, 3)`` over this stage's TP shards (bf16);
    TP: 4 all-reduces of ``batch x seq x hidden`` bf16 activations per layer (2 forward, 2
    backward, Megatron); PP: one such activation sent forward (all but the last stage) and its
    gradient backward (all but the first).
    """
    s = llama_shapes.shape(model)
    coords = scale_memory.mesh_coords(rank, tp, pp, dp)
    n = len(llama_shapes.stage_layers(s.layers, pp, coords["pp"]))
    first, last = coords["pp"] == 0, coords["pp"] == pp - 1
    units = [u // tp for u in llama_shapes.layer_params(s).values()] * n
    units = [u * tp if u == s.hidden // tp else u for u in units]   # norms stay whole under TP
    units += [s.vocab * s.hidden // tp] * (first + last) + [s.hidden] * last
    out: dict[tuple[str, str], float] = {}
    if dp > 1:
        dp_bytes = zero.expected_comm_bytes(units, dp, 3, reduce_dtype="bf16")
        out[("dp", "all_gather")] = dp_bytes["all_gather"]
        out[("dp", "reduce_scatter")] = dp_bytes["reduce_scatter"]
    act = batch * seq * s.hidden * 2
    if tp > 1:
        out[("tp", "all_reduce")] = 4 * n * sent_bytes("all_reduce", act, tp)
    if pp > 1:
        out[("pp", "send")] = act * ((not last) + (not first))
    return out

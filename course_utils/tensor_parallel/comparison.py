"""Tensor-parallel layers against one device: real ranks, every tensor assert_close'd.

:func:`compare` starts ``tp_size`` ranks (``course_utils.launch.run``); each runs
:func:`tp_worker`: it builds a layer of :data:`~course_utils.tensor_parallel.one_device.KINDS`
from a seed, shards it (the from-scratch layers of :mod:`course_utils.tensor_parallel.layers`,
or DTensor's ``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel`` for
``dtensor_mlp``), runs forward and backward and records its collectives. The ranks' outputs and
gradients, combined as each one's :data:`Spec` says, must equal
:func:`~course_utils.tensor_parallel.one_device.reference` (``torch.testing.assert_close``).
:class:`Comparison` holds what was checked and :func:`comparison_table` lays several TP degrees
side by side; :func:`conjugate_worker` checks the four conjugate operators alone. Serves
lecture 4.
"""

from __future__ import annotations

import pickle
import textwrap
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from course_utils.runtime import backend
from course_utils.runtime.validate import check_int
from course_utils.tensor_parallel import one_device
from course_utils.tensor_parallel.conjugates import (copy_to_tp, gather_from_tp, reduce_from_tp,
                                                     scatter_to_tp)
from course_utils.tensor_parallel.layers import (ColumnParallelLinear, RowParallelLinear,
                                                 TensorParallelAttention, TensorParallelMLP)
from course_utils.tensor_parallel.one_device import (KINDS, MLP, build_layer, check_split,
                                                     layer_config)
from course_utils.tensor_parallel.recording import record_comms
from course_utils.tensor_parallel.sharding import shard_range

__all__ = ["Spec", "pack", "unpack", "tp_worker", "conjugate_worker", "Comparison",
           "comparison_table", "compare"]

# How per-rank results combine into the single-device tensor: "replicated" (every rank holds
# all of it), ("cat", dim) (each rank holds a slice), "sum" (each rank holds a partial sum).
Spec = Any


def pack(obj: Any) -> bytes:
    """Pickle by value. A tensor returned as-is from a rank travels as a shared-memory file
    descriptor that the rank must stay alive to hand over; ranks exit right after reporting."""
    return pickle.dumps(backend.to_cpu(obj))


def unpack(per_rank: Sequence[bytes]) -> list[Any]:
    """The objects :func:`pack` made, one per rank, in rank order."""
    return [pickle.loads(blob) for blob in per_rank]


def _from_scratch(kind: str, model: nn.Module, tp_group: dist.ProcessGroup | None):
    if kind == "column":
        return ColumnParallelLinear.from_linear(model, tp_group, gather_output=True)
    if kind == "row":
        return RowParallelLinear.from_linear(model, tp_group, input_is_parallel=True)
    if kind == "mlp":
        return TensorParallelMLP.from_mlp(model, tp_group)
    return TensorParallelAttention.from_attention(model, tp_group)


def _xw_layout(ref: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A :func:`~course_utils.tensor_parallel.one_device.reference` with every weight gradient
    transposed to the ``Y = X W`` layout."""
    return {name: t.t() if name.endswith("weight.grad") and t.dim() == 2 else t
            for name, t in ref.items()}


def _grads_from_scratch(kind: str, tp: nn.Module) -> dict[str, tuple[torch.Tensor, Spec]]:
    """Local gradients in the ``Y = X W`` layout, the layout the from-scratch layers store
    (W and its gradient: (h_in, h_out) sliced), with how they combine."""
    col = lambda layer: {"weight.grad": (layer.weight.grad, ("cat", 1)),  # noqa: E731
                         "bias.grad": (layer.bias.grad, ("cat", 0))}
    row = lambda layer: {"weight.grad": (layer.weight.grad, ("cat", 0)),  # noqa: E731
                         "bias.grad": (layer.bias.grad, "replicated")}
    if kind == "column":
        return col(tp)
    if kind == "row":
        return row(tp)
    if kind == "mlp":
        return ({f"up.{k}": v for k, v in col(tp.up).items()}
                | {f"down.{k}": v for k, v in row(tp.down).items()})
    out = {}
    w_parts = tp.qkv.weight.grad.chunk(3, dim=1)       # 3 x (h, h/t)
    b_parts = tp.qkv.bias.grad.chunk(3, dim=0)         # 3 x (h/t,)
    for name, w, b in zip("qkv", w_parts, b_parts):
        out[f"{name}.weight.grad"] = (w, ("cat", 1))
        out[f"{name}.bias.grad"] = (b, ("cat", 0))
    out |= {f"o.{k}": v for k, v in row(tp.o).items()}
    return out


def _local_shapes(module: nn.Module) -> dict[str, tuple]:
    shapes = {}
    for name, p in module.named_parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        shapes[name] = tuple(local.shape)
    return shapes


def _dtensor_mlp(model: MLP, x: torch.Tensor, dy: torch.Tensor, world_size: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    tp_mesh = init_device_mesh(x.device.type, (world_size,), mesh_dim_names=("tp",))
    parallelize_module(model, tp_mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    x.requires_grad_(True)
    with CommDebugMode() as fwd_comms:
        y = model(x)  # an AsyncCollectiveTensor: the all-reduce completes on first use
    with CommDebugMode() as bwd_comms:
        (y * dy).sum().backward()
    y = y.detach().wait() if hasattr(y, "wait") else y.detach()
    results: dict[str, tuple[torch.Tensor, Spec]] = {
        "y": (torch.Tensor(y).clone(), "replicated"), "x.grad": (x.grad.clone(), "replicated")}
    placements = {}
    for name, p in model.named_parameters():
        placement = p.placements[0]
        spec = ("cat", placement.dim) if placement.is_shard() else "replicated"
        results[f"{name}.grad"] = (p.grad.to_local().clone(), spec)
        placements[name] = repr(placement)
    counts = lambda mode: {str(k).split(".")[-1]: v  # noqa: E731
                           for k, v in mode.get_comm_counts().items()}
    return {"results": results, "shapes": _local_shapes(model), "placements": placements,
            "comm_counts": {"forward": counts(fwd_comms), "backward": counts(bwd_comms)}}


def tp_worker(rank: int, world_size: int, kind: str, seeds: Sequence[int],
              cfg: dict | None = None) -> bytes:
    """One rank: build the layer from each seed, shard it, run forward and backward.

    Returns (pickled) one dict per seed: ``results`` {name: (local tensor, how it combines)},
    ``shapes`` (local parameter shapes), ``comms`` (this rank's
    :class:`~course_utils.tensor_parallel.recording.CommEvent` list,
    from-scratch kinds) or ``comm_counts`` (DTensor's CommDebugMode, ``dtensor_mlp``).
    """
    c = layer_config(cfg)
    tp_group = None  # the whole world is one tensor-parallel group here
    tp_rank, tp_size = dist.get_rank(tp_group), dist.get_world_size(tp_group)
    out = []
    for seed in seeds:
        model, x, dy = build_layer(kind, seed, c)
        model, x, dy = model.to(backend.device()), *backend.to_device((x, dy))
        if kind == "dtensor_mlp":
            out.append(_dtensor_mlp(model, x, dy, world_size))
            continue
        tp = _from_scratch(kind, model, tp_group)
        if kind == "row":  # input_is_parallel: this rank reads only its input features
            x = x[..., slice(*shard_range(x.shape[-1], tp_size, tp_rank))].clone()
        x.requires_grad_(True)
        with record_comms() as comms:
            y = tp(x)
            (y * dy).sum().backward()
        x_spec = ("cat", -1) if kind == "row" else "replicated"
        results = {"y": (y.detach(), "replicated"), "x.grad": (x.grad, x_spec)}
        if kind == "row":
            results["partial"] = ((x.detach() @ tp.weight.detach()), "sum")
        if kind == "column":
            results["y_local"] = ((x.detach() @ tp.weight.detach() + tp.bias.detach()),
                                  ("cat", -1))
        results |= _grads_from_scratch(kind, tp)
        out.append({"results": results, "shapes": _local_shapes(tp), "comms": comms})
    return pack(out)


def conjugate_worker(rank: int, world_size: int, seed: int, shape: tuple = (2, 3, 8)) -> bytes:
    """One rank: push a rank-specific x (and upstream gradient dy) through f, g, gather, scatter.

    Returns (pickled) {"x", "dy", "<op>.out", "<op>.grad", "<op>.comms"} for op in
    f, g, gather, scatter, where "<op>.grad" is dL/dx for L = sum(op(x) * dy_op).
    """
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    x = torch.randn(*shape, generator=gen).to(backend.device())  # differs per rank
    out: dict[str, Any] = {"x": x}
    ops = {"f": copy_to_tp, "g": reduce_from_tp, "gather": gather_from_tp,
           "scatter": scatter_to_tp}
    widths = {"f": shape[-1], "g": shape[-1], "gather": shape[-1] * world_size,
              "scatter": shape[-1] // world_size}
    for name, op in ops.items():
        dy = torch.randn(*shape[:-1], widths[name], generator=gen).to(x.device)  # dL/d op(x)
        xi = x.clone().requires_grad_(True)
        with record_comms() as comms:
            y = op(xi)
            (y * dy).sum().backward()
        out |= {f"{name}.dy": dy, f"{name}.out": y.detach(), f"{name}.grad": xi.grad,
                f"{name}.comms": [(e.op, e.phase) for e in comms]}
    return pack(out)


@dataclass
class Comparison:
    """What :func:`compare` checked: every tensor of ``kind`` on ``tp_size`` ranks, per seed."""

    kind: str
    tp_size: int
    seeds: tuple
    names: list[str]
    specs: dict[str, str]
    max_abs_diff: float
    shapes: list[dict] = field(default_factory=list)    # per rank, first seed
    comms: list[list] = field(default_factory=list)     # per rank, first seed
    extra: dict = field(default_factory=dict)           # DTensor placements and comm counts

    def summary(self) -> str:
        """One line per compared tensor, stable across runs (no floating-point noise)."""
        lines = [f"{self.kind} on {self.tp_size} ranks, seeds {list(self.seeds)}: "
                 f"{len(self.names)} tensors match the single-device layer (assert_close)"]
        for name in self.names:
            lines.append(f"  {name:<16} {self.specs[name]}")
        return "\n".join(lines)


_KIND_WORDS = {"column": "column-parallel linear", "row": "row-parallel linear",
               "mlp": "Megatron MLP", "attention": "attention split by heads",
               "dtensor_mlp": "DTensor MLP (parallelize_module)"}
_HOW_WORDS = {"same full tensor on every rank": "same on every rank",
              "partial sums: their sum is the tensor": "partial sums, added"}
# The layout of the weight shapes and gradient dims in a kind's table.
_LAYOUT_WORDS = {"dtensor_mlp": "nn.Linear layout: weight and its gradient are (h_out, h_in)",
                 "from scratch": "Y = X W layout: W and its gradient are (h_in, h_out)"}


def comparison_table(runs: Sequence[Comparison], width: int = 96) -> str:
    """One compact table for the same layer checked on several TP degrees (one column each).

    The first line says what matched, the second the layout in which weight shapes and the
    dims of weight gradients are given (``Y = X W`` for the from-scratch layers, ``nn.Linear``
    for DTensor); then, per degree, rank 0's local parameter shapes (with DTensor's placement),
    its collectives per phase, and, last, how the ranks' tensors give the single-device ones
    (same on every rank, concatenated, or added), tensors grouped by rule.
    Stable across runs: no floating-point noise.
    """
    runs = list(runs)
    if not runs or any(not isinstance(r, Comparison) for r in runs):
        raise ValueError("runs must be a non-empty sequence of Comparison (from compare)")
    first = runs[0]
    if any(r.kind != first.kind or r.names != first.names or r.specs != first.specs
           for r in runs):
        raise ValueError("runs must all check the same layer (same kind and tensors)")
    head = (f"{_KIND_WORDS.get(first.kind, first.kind)}: all {len(first.names)} tensors match "
            f"one device (assert_close, seeds {list(first.seeds)})")
    rows: list[tuple[str, list[str]]] = []
    placements = first.extra.get("placements", {})
    for name in first.shapes[0]:
        label = f"rank 0 {name}" + (f", {placements[name]}" if name in placements else "")
        rows.append((label, [str(r.shapes[0][name]) for r in runs]))
    for phase in ("forward", "backward"):
        cells = []
        for r in runs:
            if r.kind == "dtensor_mlp":
                counts = r.extra["comm_counts"][phase]
                cells.append(", ".join(f"{n} {op}" for op, n in counts.items()) or "none")
            else:
                cells.append("; ".join(f"{e.op} {e.shape} {e.nbytes:,} B"
                                       for e in r.comms[0] if e.phase == phase) or "none")
        rows.append((f"{phase} collectives", cells))
    groups: dict[str, list[str]] = {}
    for name in first.names:
        how = first.specs[name]
        how = _HOW_WORDS.get(how, how.replace("slices: ", ""))
        groups.setdefault(how, []).append(name)
    label_w = max(len(label) for label in [*(lab for lab, _ in rows), *groups]) + 2
    cell_w = max(len(c) for _, cells in rows for c in cells) + 3
    layout = _LAYOUT_WORDS.get(first.kind, _LAYOUT_WORDS["from scratch"])
    lines = [head, f"{'weights in':<{label_w}}{layout}",
             " " * label_w + "".join(f"{'t = ' + str(r.tp_size):<{cell_w}}"
                                     for r in runs).rstrip()]
    lines += [f"{label:<{label_w}}" + "".join(f"{c:<{cell_w}}" for c in cells).rstrip()
              for label, cells in rows]
    for how, names in groups.items():
        lines += textwrap.wrap(", ".join(names), width=width, initial_indent=f"{how:<{label_w}}",
                               subsequent_indent=" " * label_w, break_on_hyphens=False)
    return "\n".join(lines)


def _describe(spec: Spec) -> str:
    if spec == "replicated":
        return "same full tensor on every rank"
    if spec == "sum":
        return "partial sums: their sum is the tensor"
    return f"slices: concatenated along dim {spec[1]}"


def _combine(name: str, parts: list[tuple[torch.Tensor, Spec]],
             expected: torch.Tensor) -> float:
    spec = parts[0][1]
    if spec == "replicated":
        for r, (t, _) in enumerate(parts):
            torch.testing.assert_close(t, expected, msg=lambda m, r=r: f"{name} rank {r}: {m}")
        return max(float((t - expected).abs().max()) for t, _ in parts)
    if spec == "sum":
        got = torch.stack([t for t, _ in parts]).sum(0)
    else:
        got = torch.cat([t for t, _ in parts], dim=spec[1])
    torch.testing.assert_close(got, expected, msg=lambda m: f"{name}: {m}")
    return float((got - expected).abs().max())


def compare(kind: str, tp_size: int, seeds: Sequence[int] = (0, 1), cfg: dict | None = None,
            timeout_s: float = 120.0) -> Comparison:
    """Run ``kind`` on ``tp_size`` real ranks and assert_close every tensor to one device."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    check_int("tp_size", tp_size)
    seeds = tuple(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise ValueError(f"seeds must be a non-empty sequence of ints; got {seeds!r}")
    c = layer_config(cfg)
    check_split(kind, c, tp_size)
    from course_utils import launch

    per_rank = unpack(launch.run(tp_worker, tp_size, kind, seeds, c, timeout_s=timeout_s))
    names: list[str] = []
    specs: dict[str, str] = {}
    worst = 0.0
    for i, seed in enumerate(seeds):
        if kind == "dtensor_mlp":  # DTensor shards nn.Linear's own weight: (h_out, h_in)
            ref = one_device.reference("mlp", seed, c)
        else:                      # the from-scratch layers store W: (h_in, h_out)
            ref = _xw_layout(one_device.reference(kind, seed, c))
        got = [rank_out[i]["results"] for rank_out in per_rank]
        if set(got[0]) != set(ref):
            raise AssertionError(f"compared names differ: {sorted(got[0])} vs {sorted(ref)}")
        for name in ref:
            worst = max(worst, _combine(name, [g[name] for g in got], ref[name]))
            if i == 0:
                names.append(name)
                specs[name] = _describe(got[0][name][1])
    first = [rank_out[0] for rank_out in per_rank]
    extra = {}
    if kind == "dtensor_mlp":
        extra = {"placements": first[0]["placements"], "comm_counts": first[0]["comm_counts"]}
    return Comparison(kind, tp_size, seeds, names, specs, worst,
                      [f["shapes"] for f in first], [f.get("comms", []) for f in first], extra)

"""Tensor parallelism: one layer's matrices split across ranks, checked against one device.

Notation (the lesson's): ``Y = X @ W`` with ``X`` of shape (b, s, h_in) and ``W`` of shape
(h_in, h_out). ``nn.Linear`` stores ``W`` transposed (``weight`` is (h_out, h_in)), so "split W
by columns" means "split ``nn.Linear.weight`` by rows": that is why DTensor's ``ColwiseParallel``
shards ``weight`` with ``Shard(0)``. ``t`` is the tensor-parallel degree (ranks in ``tp_group``).

* **Column-parallel** (:class:`ColumnParallelLinear`): rank r holds ``W[:, cols_r]``
  (h_in, h_out/t) and computes ``Y[..., cols_r]``, its own output features. If the next
  operation needs every feature, an all-gather concatenates them; an elementwise next operation
  (GELU) needs no communication.
* **Row-parallel** (:class:`RowParallelLinear`): rank r holds ``W[rows_r, :]`` (h_in/t, h_out),
  reads ``X[..., rows_r]`` and computes a partial sum of full shape (b, s, h_out);
  ``Y = sum_r X_r @ W_r``, so an all-reduce combines them.
* **Megatron MLP** (:class:`TensorParallelMLP`): column-parallel, GELU, row-parallel. Two
  conjugate operators carry all its communication: :func:`copy_to_tp` ("f": identity forward,
  all-reduce backward) before the first matmul and :func:`reduce_from_tp` ("g": all-reduce
  forward, identity backward) after the second: one all-reduce forward, one backward.
* **Attention split by heads** (:class:`TensorParallelAttention`): each rank owns n_heads/t heads
  (a column slice of W_q, W_k, W_v and a row slice of W_o); the same f / g pair.

Every collective these operators issue can be recorded with :func:`record_comms`. Layers are
compared with a single-device reference by :func:`compare` (``torch.testing.assert_close``);
the DTensor version of the same MLP (``parallelize_module`` with ``ColwiseParallel`` /
``RowwiseParallel``) runs through the same comparison. :func:`tp_comm_bytes` counts the bytes.

Run the demo under torchrun (each rank checks itself against the single-device MLP)::

    torchrun --standalone --nproc-per-node 2 -m course_utils.tensor_parallel.layers
"""

from __future__ import annotations

import contextlib
import math
import pickle
import statistics
import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from course_utils.runtime import backend
from course_utils.runtime.clock import clock
from course_utils.runtime.validate import check_int as _check_int

__all__ = [
    "CommEvent", "record_comms", "copy_to_tp", "reduce_from_tp", "gather_from_tp",
    "scatter_to_tp", "CopyToTensorParallel", "ReduceFromTensorParallel",
    "GatherFromTensorParallel", "ScatterToTensorParallel", "shard_range", "column_shard",
    "row_shard", "ColumnParallelLinear", "RowParallelLinear", "MLP", "TensorParallelMLP",
    "Attention", "TensorParallelAttention", "KINDS", "tp_worker", "reference", "compare",
    "Comparison", "dtype_bytes", "tp_comm_bytes", "ring_all_reduce_bytes_per_rank",
    "mlp_param_count", "time_comm_vs_matmul", "spy_collectives", "row_parallel_harness",
    "run_row_parallel", "format_comms", "conjugate_worker", "mlp_comm_to_compute",
    "comparison_table", "LayerPlan", "PLAN_KINDS", "layer_plan",
]

# ------------------------------------------------------------------------------ checking input


def _check_tp(tp_rank: Any, tp_size: Any) -> None:
    _check_int("tp_size", tp_size)
    if isinstance(tp_rank, bool) or not isinstance(tp_rank, int) or not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank must be an int from 0 to tp_size-1 = {tp_size - 1}; "
                         f"got {tp_rank!r}")


def _check_matrix(name: str, w: Any) -> None:
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        got = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
        raise ValueError(f"{name} must be a 2-D tensor (h_in, h_out); got {got}")


# ------------------------------------------------------------------------ recording collectives


@dataclass(frozen=True)
class CommEvent:
    """One collective issued by a tensor-parallel operator on this rank."""

    op: str        # "all_reduce" or "all_gather"
    phase: str     # "forward" or "backward"
    shape: tuple   # shape of the collective's result on this rank
    nbytes: int    # bytes of that result (the tensor every rank ends up holding)
    seconds: float = field(default=0.0, compare=False)  # wall time inside the collective


_recorders: list[list[CommEvent]] = []


@contextlib.contextmanager
def record_comms() -> Iterator[list[CommEvent]]:
    """Collect, in order, every :class:`CommEvent` the TP operators issue inside the block."""
    events: list[CommEvent] = []
    _recorders.append(events)
    try:
        yield events
    finally:
        _recorders.remove(events)


def _log(op: str, phase: str, result: torch.Tensor, seconds: float = 0.0) -> None:
    event = CommEvent(op, phase, tuple(result.shape), result.numel() * result.element_size(),
                      seconds)
    for events in _recorders:
        events.append(event)


def _group_size(group: dist.ProcessGroup | None) -> int:
    return dist.get_world_size(group)


def _all_reduce(x: torch.Tensor, group: dist.ProcessGroup | None, phase: str,
                op: Any = dist.ReduceOp.SUM) -> torch.Tensor:
    out = x.contiguous().clone()  # never reduce into a tensor autograd may still need
    if _group_size(group) > 1:
        t0 = clock(out)
        dist.all_reduce(out, op=op, group=group)
        _log("all_reduce", phase, out, clock(out) - t0)
    return out


def _all_gather_cat(x: torch.Tensor, group: dist.ProcessGroup | None, phase: str,
                    dim: int = -1) -> torch.Tensor:
    """Every rank's ``x`` concatenated along ``dim`` in rank order (logged): the last dim for
    TP's features, the sequence dim for sequence parallelism."""
    t = _group_size(group)
    if t == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(t)]
    t0 = clock(x)
    dist.all_gather(parts, x, group=group)
    seconds = clock(x) - t0
    out = torch.cat(parts, dim=dim)  # t times x's size along dim
    _log("all_gather", phase, out, seconds)
    return out


def _own_slice_last(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    t, r = _group_size(group), dist.get_rank(group)
    start, stop = shard_range(x.shape[-1], t, r)
    return x[..., start:stop].contiguous()


# ------------------------------------------------------------------- the conjugate operators


class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's f: identity forward; all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # Each rank's dL/dX covers only its own output features: the full gradient is the sum.
        return _all_reduce(grad, ctx.group, "backward"), None


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's g: all-reduce forward (sum the partial results); identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        return _all_reduce(x, group, "forward")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # Y = sum_r P_r, so dL/dP_r = dL/dY on every rank: nothing to communicate.
        return grad, None


class GatherFromTensorParallel(torch.autograd.Function):
    """All-gather along the last dim forward; keep this rank's slice of the gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return _all_gather_cat(x, group, "forward")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _own_slice_last(grad, ctx.group), None


class ScatterToTensorParallel(torch.autograd.Function):
    """Keep this rank's slice of the last dim forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return _own_slice_last(x, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _all_gather_cat(grad, ctx.group, "backward"), None


def copy_to_tp(x: torch.Tensor, tp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """f: returns ``x`` unchanged; its gradient is all-reduced over ``tp_group`` in backward."""
    return CopyToTensorParallel.apply(x, tp_group)


def reduce_from_tp(x: torch.Tensor, tp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """g: sum of ``x`` over ``tp_group`` (all-reduce); the gradient passes through unchanged."""
    return ReduceFromTensorParallel.apply(x, tp_group)


def gather_from_tp(x: torch.Tensor, tp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """(..., n/t) per rank -> (..., n) on every rank, concatenated in tp-rank order."""
    return GatherFromTensorParallel.apply(x, tp_group)


def scatter_to_tp(x: torch.Tensor, tp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """(..., n) -> (..., n/t): this rank's contiguous slice of the last dim."""
    return ScatterToTensorParallel.apply(x, tp_group)


# --------------------------------------------------------------------------------- sharding


def shard_range(n: int, tp_size: int, tp_rank: int) -> tuple[int, int]:
    """[start, stop) of tp_rank's equal slice of n items; n must divide evenly by tp_size."""
    _check_int("n", n)
    _check_tp(tp_rank, tp_size)
    if n % tp_size:
        raise ValueError(f"n = {n} must be divisible by tp_size = {tp_size} (equal shards)")
    size = n // tp_size
    return tp_rank * size, (tp_rank + 1) * size


def column_shard(w: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """W (h_in, h_out) -> tp_rank's columns W[:, cols] (h_in, h_out/tp_size), a copy."""
    _check_matrix("w", w)
    start, stop = shard_range(w.shape[1], tp_size, tp_rank)
    return w[:, start:stop].clone()


def row_shard(w: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """W (h_in, h_out) -> tp_rank's rows W[rows, :] (h_in/tp_size, h_out), a copy."""
    _check_matrix("w", w)
    start, stop = shard_range(w.shape[0], tp_size, tp_rank)
    return w[start:stop, :].clone()


def _tp_coords(tp_group: dist.ProcessGroup | None) -> tuple[int, int]:
    if not dist.is_initialized():
        raise ValueError("tensor-parallel layers need an initialised process group "
                         "(start ranks with course_utils.launch.run)")
    return dist.get_rank(tp_group), dist.get_world_size(tp_group)


# ----------------------------------------------------------------------------- the layers


class ColumnParallelLinear(nn.Module):
    """This rank's output features of Y = X @ W + b: weight (h_in, h_out/t), bias (h_out/t,)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 tp_group: dist.ProcessGroup | None = None, gather_output: bool = False,
                 copy_input: bool = True):
        super().__init__()
        _check_matrix("weight", weight)
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())
        self.tp_group = tp_group
        self.gather_output = gather_output
        self.copy_input = copy_input

    @classmethod
    def from_linear(cls, linear: nn.Linear, tp_group: dist.ProcessGroup | None = None,
                    gather_output: bool = False, copy_input: bool = True) -> ColumnParallelLinear:
        """This rank's column shard of a full ``nn.Linear`` (whose weight is W transposed)."""
        tp_rank, tp_size = _tp_coords(tp_group)
        w = linear.weight.detach().t()  # (h_in, h_out)
        bias = None
        if linear.bias is not None:
            start, stop = shard_range(w.shape[1], tp_size, tp_rank)
            bias = linear.bias.detach()[start:stop]
        return cls(column_shard(w, tp_rank, tp_size), bias, tp_group, gather_output, copy_input)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (..., h_in), the same on every rank
        if self.copy_input:
            x = copy_to_tp(x, self.tp_group)
        y_local = x @ self.weight  # (..., h_out/t): this rank's output features
        if self.bias is not None:
            y_local = y_local + self.bias
        if self.gather_output:
            return gather_from_tp(y_local, self.tp_group)  # (..., h_out)
        return y_local


class RowParallelLinear(nn.Module):
    """Partial sums of Y = X @ W + b over this rank's input features: weight (h_in/t, h_out)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 tp_group: dist.ProcessGroup | None = None, input_is_parallel: bool = True):
        super().__init__()
        _check_matrix("weight", weight)
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())
        self.tp_group = tp_group
        self.input_is_parallel = input_is_parallel

    @classmethod
    def from_linear(cls, linear: nn.Linear, tp_group: dist.ProcessGroup | None = None,
                    input_is_parallel: bool = True) -> RowParallelLinear:
        """This rank's row shard of a full ``nn.Linear``; the bias stays whole (added once)."""
        tp_rank, tp_size = _tp_coords(tp_group)
        w = linear.weight.detach().t()  # (h_in, h_out)
        bias = None if linear.bias is None else linear.bias.detach()
        return cls(row_shard(w, tp_rank, tp_size), bias, tp_group, input_is_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (..., h_in/t) this rank's input features, or (..., h_in) if not input_is_parallel
        if not self.input_is_parallel:
            x = scatter_to_tp(x, self.tp_group)
        partial = x @ self.weight  # (..., h_out): this rank's share of the sum over h_in
        y = reduce_from_tp(partial, self.tp_group)  # (..., h_out) = sum over ranks
        if self.bias is not None:
            y = y + self.bias  # after the sum, so it is added once, not t times
        return y


class MLP(nn.Module):
    """Single-device transformer MLP: up (h -> ffn), GELU, down (ffn -> h)."""

    def __init__(self, h: int, ffn: int):
        super().__init__()
        _check_int("h", h)
        _check_int("ffn", ffn)
        self.up = nn.Linear(h, ffn)
        self.act = nn.GELU()
        self.down = nn.Linear(ffn, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))  # (..., h) -> (..., ffn) -> (..., h)


class TensorParallelMLP(nn.Module):
    """Megatron MLP: column-parallel up, GELU on local features, row-parallel down."""

    def __init__(self, up: ColumnParallelLinear, down: RowParallelLinear):
        super().__init__()
        self.up, self.act, self.down = up, nn.GELU(), down

    @classmethod
    def from_mlp(cls, mlp: MLP, tp_group: dist.ProcessGroup | None = None) -> TensorParallelMLP:
        """This rank's shard of a single-device :class:`MLP`."""
        return cls(ColumnParallelLinear.from_linear(mlp.up, tp_group),
                   RowParallelLinear.from_linear(mlp.down, tp_group))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x (..., h) replicated -> f -> (..., ffn/t) local features -> GELU -> g -> (..., h)
        return self.down(self.act(self.up(x)))


class Attention(nn.Module):
    """Single-device causal multi-head self-attention with separate q, k, v, o projections."""

    def __init__(self, h: int, n_heads: int):
        super().__init__()
        _check_int("h", h)
        _check_int("n_heads", n_heads)
        if h % n_heads:
            raise ValueError(f"h = {h} must be divisible by n_heads = {n_heads}")
        self.n_heads = n_heads
        self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _attend(x, self.q(x), self.k(x), self.v(x), self.n_heads, self.o)


def _attend(x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_heads: int,
            out_proj: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    b, s, _ = x.shape
    width = q.shape[-1]  # n_heads * head_dim
    q, k, v = (t.reshape(b, s, n_heads, width // n_heads).transpose(1, 2) for t in (q, k, v))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, n_heads, s, head_dim)
    return out_proj(a.transpose(1, 2).reshape(b, s, width))     # (b, s, width) -> (b, s, h)


class TensorParallelAttention(nn.Module):
    """Attention split by heads: this rank's n_heads/t heads; q/k/v column-, o row-parallel."""

    def __init__(self, qkv: ColumnParallelLinear, o: RowParallelLinear, local_heads: int):
        super().__init__()
        self.qkv, self.o, self.local_heads = qkv, o, local_heads

    @classmethod
    def from_attention(cls, attn: Attention,
                       tp_group: dist.ProcessGroup | None = None) -> TensorParallelAttention:
        """This rank's heads of a single-device :class:`Attention` (n_heads divisible by t)."""
        tp_rank, tp_size = _tp_coords(tp_group)
        if attn.n_heads % tp_size:
            raise ValueError(f"n_heads = {attn.n_heads} must be divisible by the tp size "
                             f"{tp_size} (attention is split by whole heads)")
        # Head i owns features [i*hd, (i+1)*hd), so a block of whole heads is a column slice.
        shards = [column_shard(p.weight.detach().t(), tp_rank, tp_size)
                  for p in (attn.q, attn.k, attn.v)]                   # 3 x (h, h/t)
        biases = [p.bias.detach()[slice(*shard_range(p.bias.shape[0], tp_size, tp_rank))]
                  for p in (attn.q, attn.k, attn.v)]                   # 3 x (h/t,)
        qkv = ColumnParallelLinear(torch.cat(shards, 1), torch.cat(biases), tp_group)
        o = RowParallelLinear.from_linear(attn.o, tp_group)
        return cls(qkv, o, attn.n_heads // tp_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # one f for all three; each (b, s, h/t)
        return _attend(x, q, k, v, self.local_heads, self.o)


# -------------------------------------------------------------- distributed vs single device


def _pack(obj: Any) -> bytes:
    """Pickle by value. A tensor returned as-is from a rank travels as a shared-memory file
    descriptor that the rank must stay alive to hand over; ranks exit right after reporting."""
    return pickle.dumps(backend.to_cpu(obj))


def _unpack(per_rank: Sequence[bytes]) -> list[Any]:
    return [pickle.loads(blob) for blob in per_rank]


KINDS = ("column", "row", "mlp", "attention", "dtensor_mlp")
_DEFAULTS = {"b": 2, "s": 4, "h": 16, "ffn": 32, "n_heads": 4}

# How per-rank results combine into the single-device tensor: "replicated" (every rank holds
# all of it), ("cat", dim) (each rank holds a slice), "sum" (each rank holds a partial sum).
Spec = Any


def _config(cfg: dict | None) -> dict:
    out = dict(_DEFAULTS)
    for key, value in (cfg or {}).items():
        if key not in _DEFAULTS:
            raise ValueError(f"unknown config key {key!r}; allowed: {sorted(_DEFAULTS)}")
        out[key] = _check_int(key, value)
    return out


def _build(kind: str, seed: int, c: dict) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The single-device layer, its input x and an upstream gradient dy, all from ``seed``."""
    torch.manual_seed(seed)
    if kind == "column":
        model, h_in, h_out = nn.Linear(c["h"], c["ffn"]), c["h"], c["ffn"]
    elif kind == "row":
        model, h_in, h_out = nn.Linear(c["ffn"], c["h"]), c["ffn"], c["h"]
    elif kind in ("mlp", "dtensor_mlp"):
        model, h_in, h_out = MLP(c["h"], c["ffn"]), c["h"], c["h"]
    elif kind == "attention":
        model, h_in, h_out = Attention(c["h"], c["n_heads"]), c["h"], c["h"]
    else:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    gen = torch.Generator().manual_seed(10_000 + seed)
    x = torch.randn(c["b"], c["s"], h_in, generator=gen)     # (b, s, h_in)
    dy = torch.randn(c["b"], c["s"], h_out, generator=gen)   # (b, s, h_out): dL/dY
    return model, x, dy


def reference(kind: str, seed: int, cfg: dict | None = None) -> dict[str, torch.Tensor]:
    """Output and every gradient of the single-device layer (loss = sum(y * dy)).

    Weight gradients are in the ``nn.Linear`` layout (h_out, h_in); :func:`compare` transposes
    them to the ``Y = X W`` layout for the from-scratch layers (:func:`_xw_layout`).
    """
    c = _config(cfg)
    model, x, dy = _build(kind, seed, c)
    x.requires_grad_(True)
    y = model(x)
    (y * dy).sum().backward()
    out = {"y": y.detach(), "x.grad": x.grad}
    if kind == "row":  # what the ranks' partial sums add up to: X @ W, before the bias
        out["partial"] = x.detach() @ model.weight.detach().t()
    if kind == "column":  # what the ranks' local features concatenate to, before the gather
        out["y_local"] = y.detach()
    out.update({f"{n}.grad": p.grad for n, p in model.named_parameters()})
    return out


def _from_scratch(kind: str, model: nn.Module, tp_group: dist.ProcessGroup | None):
    if kind == "column":
        return ColumnParallelLinear.from_linear(model, tp_group, gather_output=True)
    if kind == "row":
        return RowParallelLinear.from_linear(model, tp_group, input_is_parallel=True)
    if kind == "mlp":
        return TensorParallelMLP.from_mlp(model, tp_group)
    return TensorParallelAttention.from_attention(model, tp_group)


def _xw_layout(ref: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A :func:`reference` with every weight gradient transposed to the ``Y = X W`` layout."""
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
    ``shapes`` (local parameter shapes), ``comms`` (this rank's :class:`CommEvent` list,
    from-scratch kinds) or ``comm_counts`` (DTensor's CommDebugMode, ``dtensor_mlp``).
    """
    c = _config(cfg)
    tp_group = None  # the whole world is one tensor-parallel group here
    tp_rank, tp_size = dist.get_rank(tp_group), dist.get_world_size(tp_group)
    out = []
    for seed in seeds:
        model, x, dy = _build(kind, seed, c)
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
    return _pack(out)


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
    return _pack(out)


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


def _check_split(kind: str, c: dict, tp_size: int) -> None:
    """The dimension ``kind`` splits must divide by ``tp_size`` (whole heads for attention)."""
    if kind == "attention":
        if c["h"] % c["n_heads"]:
            raise ValueError(f"h = {c['h']} must be divisible by n_heads = {c['n_heads']}")
        if c["n_heads"] % tp_size:
            raise ValueError(f"n_heads = {c['n_heads']} must be divisible by tp_size = {tp_size}")
    elif c["ffn"] % tp_size:
        raise ValueError(f"ffn = {c['ffn']} (the split dimension) must be divisible by "
                         f"tp_size = {tp_size}")


def compare(kind: str, tp_size: int, seeds: Sequence[int] = (0, 1), cfg: dict | None = None,
            timeout_s: float = 120.0) -> Comparison:
    """Run ``kind`` on ``tp_size`` real ranks and assert_close every tensor to one device."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    _check_int("tp_size", tp_size)
    seeds = tuple(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise ValueError(f"seeds must be a non-empty sequence of ints; got {seeds!r}")
    c = _config(cfg)
    _check_split(kind, c, tp_size)
    from course_utils import launch

    per_rank = _unpack(launch.run(tp_worker, tp_size, kind, seeds, c, timeout_s=timeout_s))
    names: list[str] = []
    specs: dict[str, str] = {}
    worst = 0.0
    for i, seed in enumerate(seeds):
        if kind == "dtensor_mlp":  # DTensor shards nn.Linear's own weight: (h_out, h_in)
            ref = reference("mlp", seed, c)
        else:                      # the from-scratch layers store W: (h_in, h_out)
            ref = _xw_layout(reference(kind, seed, c))
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


# ------------------------------------------------------------------ communication, counted


def dtype_bytes(dtype: torch.dtype | str) -> int:
    """Bytes per element: torch.bfloat16 / "bf16" -> 2, torch.float32 / "fp32" -> 4, ..."""
    names = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
             "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
             "fp8": torch.float8_e4m3fn}
    if isinstance(dtype, str):
        if dtype not in names:
            raise ValueError(f"dtype must be a torch floating dtype or one of {sorted(names)}; "
                             f"got {dtype!r}")
        dtype = names[dtype]
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a torch floating dtype or one of {sorted(names)}; "
                         f"got {dtype!r}")
    return torch.empty((), dtype=dtype).element_size()


_ALL_REDUCES = {"mlp": (1, 1), "attention": (1, 1), "block": (2, 2)}


def ring_all_reduce_bytes_per_rank(nbytes: float, tp: int) -> float:
    """Bytes each rank sends in a ring all-reduce of an ``nbytes`` tensor: 2 (t-1)/t x nbytes."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, float)) or not nbytes >= 0:
        raise ValueError(f"nbytes must be a non-negative number; got {nbytes!r}")
    _check_int("tp", tp)
    return 2 * (tp - 1) / tp * nbytes


def tp_comm_bytes(b: int, s: int, h: int, tp: int, dtype: torch.dtype | str = "bf16",
                  layer: str = "mlp") -> dict[str, float]:
    """Bytes a Megatron tensor-parallel ``layer`` all-reduces per forward and backward pass.

    Every all-reduce is of one activation-shaped tensor (b, s, h): ``payload_bytes`` =
    b * s * h * bytes(dtype). ``layer`` is "mlp" or "attention" (one all-reduce forward, one
    backward) or "block" (both: two and two). The FFN width, the number of heads and the
    parameter count do not appear. ``ring_bytes_sent_per_rank`` is what each rank sends for
    forward plus backward with a ring all-reduce. With tp = 1 nothing is communicated.
    """
    for name, value in (("b", b), ("s", s), ("h", h), ("tp", tp)):
        _check_int(name, value)
    if layer not in _ALL_REDUCES:
        raise ValueError(f"layer must be one of {sorted(_ALL_REDUCES)}; got {layer!r}")
    fwd, bwd = _ALL_REDUCES[layer] if tp > 1 else (0, 0)
    payload = b * s * h * dtype_bytes(dtype)
    return {"all_reduces_forward": fwd, "all_reduces_backward": bwd,
            "payload_bytes": payload, "forward_bytes": fwd * payload,
            "backward_bytes": bwd * payload,
            "ring_bytes_sent_per_rank": ring_all_reduce_bytes_per_rank((fwd + bwd) * payload, tp)}


@dataclass(frozen=True)
class LayerPlan:
    """What every rank of a tensor-parallel layer holds and sends (:func:`layer_plan`)."""

    kind: str
    tp_size: int
    cfg: dict
    full_shapes: dict    # parameter name -> unsplit shape, in the Y = X W layout
    shapes: dict         # parameter name -> each rank's shape (equal shards)
    split: dict          # parameter name -> the dim it is cut along (None: whole on every rank)
    comms: list          # the CommEvents one rank issues, in order (forward, then backward)
    ring_bytes_sent_per_rank: float


PLAN_KINDS = ("column", "row", "mlp", "attention")


def layer_plan(kind: str, tp_size: int, cfg: dict | None = None,
               dtype: torch.dtype | str = "fp32") -> LayerPlan:
    """The shards and collectives of :func:`compare`'s ``kind`` on ``tp_size`` ranks, without
    running it: the from-scratch layers' parameter shapes (``weight`` (h_in, h_out)) and the
    :class:`CommEvent` list a rank records, for ``cfg`` (b, s, h, ffn, n_heads) in ``dtype``.
    ``column`` is nn.Linear(h, ffn) with its output gathered, ``row`` nn.Linear(ffn, h) on split
    input; the MLP's and attention's bytes are :func:`tp_comm_bytes`'s. A ring sends
    2 (t-1)/t of an all-reduce's bytes and (t-1)/t of an all-gather's."""
    if kind not in PLAN_KINDS:
        raise ValueError(f"kind must be one of {PLAN_KINDS}; got {kind!r}")
    _check_int("tp_size", tp_size)
    c = _config(cfg)
    _check_split(kind, c, tp_size)
    b, s, h, ffn, t, e = c["b"], c["s"], c["h"], c["ffn"], tp_size, dtype_bytes(dtype)
    col = lambda n_in, n_out: {"weight": ((n_in, n_out), 1), "bias": ((n_out,), 0)}  # noqa: E731
    row = lambda n_in, n_out: {"weight": ((n_in, n_out), 0), "bias": ((n_out,), None)}  # noqa
    params = {"column": col(h, ffn), "row": row(ffn, h),
              "mlp": {**{f"up.{k}": v for k, v in col(h, ffn).items()},
                      **{f"down.{k}": v for k, v in row(ffn, h).items()}},
              "attention": {**{f"qkv.{k}": v for k, v in col(h, 3 * h).items()},
                            **{f"o.{k}": v for k, v in row(h, h).items()}}}[kind]
    full = {name: shape for name, (shape, _) in params.items()}
    split = {name: dim for name, (_, dim) in params.items()}
    shapes = {name: tuple(n // t if d == split[name] else n for d, n in enumerate(shape))
              for name, shape in full.items()}
    act = lambda width: ((b, s, width), b * s * width * e)  # noqa: E731  (shape, bytes)
    comms: list[CommEvent] = []
    if t > 1 and kind == "column":
        comms = [CommEvent("all_gather", "forward", *act(ffn)),
                 CommEvent("all_reduce", "backward", *act(h))]
    elif t > 1 and kind == "row":
        comms = [CommEvent("all_reduce", "forward", *act(h))]
    elif kind in ("mlp", "attention"):
        counted = tp_comm_bytes(b, s, h, t, dtype, layer=kind)
        comms = ([CommEvent("all_reduce", "forward", (b, s, h), counted["payload_bytes"])]
                 * counted["all_reduces_forward"]
                 + [CommEvent("all_reduce", "backward", (b, s, h), counted["payload_bytes"])]
                 * counted["all_reduces_backward"])
    sent = sum(ring_all_reduce_bytes_per_rank(ev.nbytes, t) if ev.op == "all_reduce"
               else (t - 1) / t * ev.nbytes for ev in comms)
    return LayerPlan(kind, t, c, full, shapes, split, comms, sent)


def mlp_param_count(h: int, ffn: int) -> int:
    """Parameters of the :class:`MLP`: 2 * h * ffn weights + ffn + h biases."""
    _check_int("h", h)
    _check_int("ffn", ffn)
    return 2 * h * ffn + ffn + h


def format_comms(events: Sequence[CommEvent]) -> str:
    """One line per collective: phase, op, result shape and bytes."""
    if not events:
        return "  (no collectives)"
    return "\n".join(f"  {e.phase:<8} {e.op:<10} shape {str(e.shape):<12} {e.nbytes:>8,} bytes"
                     for e in events)


def mlp_comm_to_compute(h: int, tp: int, dtype: torch.dtype | str, flops_per_s: float,
                        link_bytes_per_s: float, ffn: int | None = None) -> float:
    """Idealised (all-reduce time) / (matmul time) for one rank's forward TP MLP.

    Per token, the rank's matmuls cost 4 * h * ffn / tp FLOPs and its ring all-reduce sends
    2 (tp-1)/tp * h * bytes(dtype) bytes, so the batch and sequence length cancel. With
    ffn = 4h this is (tp-1) * bytes * flops_per_s / (8 * h * link_bytes_per_s). Ignores latency,
    overlap and contention: a model to reason with, not a measurement.
    """
    _check_int("h", h)
    _check_int("tp", tp)
    ffn = 4 * h if ffn is None else _check_int("ffn", ffn)
    for name, value in (("flops_per_s", flops_per_s), ("link_bytes_per_s", link_bytes_per_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a positive number; got {value!r}")
    comm_s = ring_all_reduce_bytes_per_rank(h * dtype_bytes(dtype), tp) / link_bytes_per_s
    matmul_s = 4 * h * ffn / tp / flops_per_s
    return comm_s / matmul_s


# ------------------------------------------------------------------ communication, timed


def _median_time(fn: Callable[[], Any], repeats: int, group: dist.ProcessGroup | None) -> float:
    times, dev = [], backend.device()
    for _ in range(repeats):
        dist.barrier(group=group)
        start = clock(dev)  # on CUDA: wait for queued kernels, then read the clock
        fn()
        times.append(clock(dev) - start)
    return statistics.median(times)


def time_comm_vs_matmul(rank: int, world_size: int, sizes: Sequence[tuple[int, int, int]],
                        repeats: int = 5) -> list[dict]:
    """Worker: per (tokens, h, ffn), median seconds of this rank's MLP matmuls vs its all-reduce.

    ``tokens`` = b * s. The matmuls are this rank's share of the forward MLP,
    (tokens, h) @ (h, ffn/t) then (tokens, ffn/t) @ (ffn/t, h); the all-reduce is of the
    (tokens, h) fp32 result, as in the forward pass of :class:`TensorParallelMLP`.
    ``threads`` is the number of intra-op threads this rank's matmuls ran with.
    """
    _check_int("repeats", repeats)
    if not sizes:
        raise ValueError("sizes must be a non-empty list of (tokens, h, ffn)")
    for size in sizes:
        if len(size) != 3 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                                 for v in size) or size[2] % world_size:
            raise ValueError(f"sizes must hold (tokens, h, ffn) positive ints with ffn divisible "
                             f"by the world size {world_size}; got {size!r}")
    out = []
    for tokens, h, ffn in sizes:
        local_ffn = ffn // world_size
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(tokens, h, generator=gen)            # (tokens, h)
        w_up = torch.randn(h, local_ffn, generator=gen)      # (h, ffn/t)
        w_down = torch.randn(local_ffn, h, generator=gen)    # (ffn/t, h)
        x, w_up, w_down = backend.to_device((x, w_up, w_down))
        partial = torch.empty(tokens, h, device=x.device)    # (tokens, h)

        def matmuls() -> None:
            torch.matmul(F.gelu(x @ w_up), w_down, out=partial)

        def all_reduce() -> None:
            dist.all_reduce(partial)

        matmuls(), all_reduce()  # warm up both
        out.append({"tokens": tokens, "h": h, "ffn": ffn, "tp": world_size,
                    "matmul_s": _median_time(matmuls, repeats, None),
                    "all_reduce_s": _median_time(all_reduce, repeats, None),
                    "matmul_flops": 2 * 2 * tokens * h * local_ffn,
                    "all_reduce_bytes": tokens * h * 4, "threads": torch.get_num_threads()})
    return out


# ---------------------------------------------------------------- grading harness (no answers)

_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
                "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "broadcast",
                "reduce", "all_to_all", "all_to_all_single", "gather", "scatter")


@contextlib.contextmanager
def spy_collectives() -> Iterator[list[tuple[str, int]]]:
    """Record (collective name, size of the group it ran on) for each torch.distributed call."""
    calls: list[tuple[str, int]] = []
    saved = {}
    for name in _COLLECTIVES:
        original = getattr(dist, name, None)
        if original is None:
            continue
        saved[name] = original

        def spy(*args, _name=name, _original=original, **kwargs):
            group = kwargs.get("group")
            for arg in args:
                if isinstance(arg, dist.ProcessGroup):
                    group = arg
            calls.append((_name, dist.get_world_size(group)))
            return _original(*args, **kwargs)

        setattr(dist, name, spy)
    try:
        yield calls
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)


def row_parallel_harness(rank: int, world_size: int, fn: Callable, tp_size: int,
                         xs: Sequence[torch.Tensor], w: torch.Tensor,
                         bias: torch.Tensor) -> bytes:
    """Worker that runs a student's ``fn(x_local, w_local, bias, tp_group)`` on real ranks.

    Ranks form world_size / tp_size data-parallel replicas of tp_size ranks each
    (tp groups {0..t-1}, {t..2t-1}, ...); replica ``dp_rank`` gets input ``xs[dp_rank]``
    (b, s, h_in). Each rank passes its input features x[..., rows] (b, s, h_in/t) and rows of
    W (h_in/t, h_out). Returns, pickled, {"y": fn's result, "calls": [(collective, group size)]}.
    """
    _check_int("tp_size", tp_size)
    if world_size % tp_size or len(xs) != world_size // tp_size:
        raise ValueError(f"need world_size ({world_size}) divisible by tp_size ({tp_size}) and "
                         f"one input per replica; got {len(xs)} inputs")
    dp_rank, tp_rank = divmod(rank, tp_size)
    tp_group = None
    for replica in range(world_size // tp_size):  # every rank must create every group
        ranks = list(range(replica * tp_size, (replica + 1) * tp_size))
        group = backend.new_group(ranks, timeout_s=60)
        if replica == dp_rank:
            tp_group = group
    x, w, bias = backend.to_device((xs[dp_rank], w, bias))
    rows = slice(*shard_range(x.shape[-1], tp_size, tp_rank))
    x_local = x[..., rows].clone()                        # (b, s, h_in/t)
    w_local = w[rows, :].clone()                          # (h_in/t, h_out)
    with spy_collectives() as calls:
        y = fn(x_local, w_local, bias.clone(), tp_group)
    if isinstance(y, torch.Tensor):
        y = y.detach().clone()
        if hasattr(y, "wait"):
            y = y.wait()
    return _pack({"y": y, "calls": calls})


def run_row_parallel(fn: Callable, tp_size: int, xs: Sequence[torch.Tensor], w: torch.Tensor,
                     bias: torch.Tensor, timeout_s: float = 60.0) -> list[dict]:
    """Launch :func:`row_parallel_harness` on len(xs) * tp_size ranks; results in rank order."""
    from course_utils import launch

    _check_int("tp_size", tp_size)
    _check_matrix("w", w)
    if not xs:
        raise ValueError("xs must hold one input (b, s, h_in) per data-parallel replica")
    world_size = len(xs) * tp_size
    return _unpack(launch.run(row_parallel_harness, world_size, fn, tp_size, list(xs), w, bias,
                              timeout_s=timeout_s))


# --------------------------------------------------------------------------------- torchrun


def demo(rank: int, world_size: int) -> float:
    """Each rank runs the Megatron MLP and checks itself against the single-device MLP."""
    seed, c = 0, _config(None)
    model, x, dy = _build("mlp", seed, c)
    ref = backend.to_device(reference("mlp", seed, c))
    model, x, dy = model.to(backend.device()), *backend.to_device((x, dy))
    tp = TensorParallelMLP.from_mlp(model)
    x.requires_grad_(True)
    y = tp(x)
    (y * dy).sum().backward()
    torch.testing.assert_close(y.detach(), ref["y"])
    torch.testing.assert_close(x.grad, ref["x.grad"])
    return math.nan if y.numel() == 0 else float((y.detach() - ref["y"]).abs().max())


if __name__ == "__main__":
    from course_utils import launch

    launch.torchrun_main(demo)

"""Tensor-parallel layers: one layer's matrices split across ranks (Megatron-LM).

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
  conjugate operators carry all its communication (:mod:`course_utils.tensor_parallel.conjugates`):
  ``copy_to_tp`` ("f": identity forward, all-reduce backward) before the first matmul and
  ``reduce_from_tp`` ("g": all-reduce forward, identity backward) after the second: one
  all-reduce forward, one backward.
* **Attention split by heads** (:class:`TensorParallelAttention`): each rank owns n_heads/t heads
  (a column slice of W_q, W_k, W_v and a row slice of W_o); the same f / g pair.

They shard the single-device layers of :mod:`course_utils.tensor_parallel.one_device`;
:mod:`course_utils.tensor_parallel.comparison` checks them against those. Serves lecture 4.

Run the demo under torchrun (each rank checks itself against the single-device MLP)::

    torchrun --standalone --nproc-per-node 2 -m course_utils.tensor_parallel.layers
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn

from course_utils.runtime import backend
from course_utils.tensor_parallel.conjugates import (copy_to_tp, gather_from_tp, reduce_from_tp,
                                                     scatter_to_tp)
from course_utils.tensor_parallel.one_device import (MLP, Attention, attend, build_layer,
                                                     layer_config, reference)
from course_utils.tensor_parallel.sharding import (check_matrix, column_shard, row_shard,
                                                   shard_range)

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "TensorParallelMLP",
           "TensorParallelAttention", "demo"]


def _tp_coords(tp_group: dist.ProcessGroup | None) -> tuple[int, int]:
    if not dist.is_initialized():
        raise ValueError("tensor-parallel layers need an initialised process group "
                         "(start ranks with course_utils.launch.run)")
    return dist.get_rank(tp_group), dist.get_world_size(tp_group)


class ColumnParallelLinear(nn.Module):
    """This rank's output features of Y = X @ W + b: weight (h_in, h_out/t), bias (h_out/t,)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 tp_group: dist.ProcessGroup | None = None, gather_output: bool = False,
                 copy_input: bool = True):
        super().__init__()
        check_matrix("weight", weight)
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
        check_matrix("weight", weight)
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
        return attend(x, q, k, v, self.local_heads, self.o)


# --------------------------------------------------------------------------------- torchrun


def demo(rank: int, world_size: int) -> float:
    """Each rank runs the Megatron MLP and checks itself against the single-device MLP."""
    seed, c = 0, layer_config(None)
    model, x, dy = build_layer("mlp", seed, c)
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

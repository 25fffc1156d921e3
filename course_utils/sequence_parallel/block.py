"""Megatron sequence parallelism's transformer block: LayerNorms on this rank's tokens only.

Megatron tensor parallelism (lecture 4, :mod:`course_utils.tensor_parallel.layers`) splits the
matmuls of a transformer block over ``t`` ranks, but the LayerNorms, the residual adds (and
dropout) run on the whole (B, T, C) activation on every rank: :class:`TensorParallelBlock`.
Sequence parallelism (Korthikanti et al. 2022, section 4.2.2) runs them on this rank's slice of
the sequence, (B, T/t, C), with g (all-gather along the sequence) before each column-parallel
linear and g-bar (reduce-scatter) after each row-parallel one: :class:`SequenceParallelBlock`.
With ``regather=True`` it keeps only the slice of each LayerNorm output for backward and
all-gathers it again there, as Megatron does. :class:`Block` is the one-device block;
:func:`sync_sequence_parallel_grads` all-reduces the gradients of the parameters used on
sequence slices. Dropout is left out, as in lecture 4's layers. Lecture 9 measures what it saves
(:mod:`course_utils.sequence_parallel.comparison`); the package serves lecture 6.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from course_utils.runtime.validate import check_int
from course_utils.tensor_parallel.comms import all_reduce
from course_utils.tensor_parallel.conjugates import (all_gather_seq, reduce_scatter_seq,
                                                     reduce_scatter_to_sp)
from course_utils.tensor_parallel.layers import TensorParallelAttention, TensorParallelMLP
from course_utils.tensor_parallel.one_device import MLP, Attention

__all__ = ["MODES", "check_block_sizes", "Block", "TensorParallelBlock", "SequenceParallelBlock",
           "sync_sequence_parallel_grads"]

MODES = ("tp", "sp")   # TP alone (LayerNorm and residual replicated), TP + SP


def check_block_sizes(c: dict, tp_size: int) -> None:
    """ValueError naming the size (of b, s, h, ffn, n_heads) that ``tp_size`` does not
    divide: the block splits the sequence, the heads and the MLP width."""
    if c["h"] % c["n_heads"]:
        raise ValueError(f"h = {c['h']} must be divisible by n_heads = {c['n_heads']}")
    for key, what in (("s", "sequence length"), ("n_heads", "number of heads"),
                      ("ffn", "MLP width")):
        if c[key] % tp_size:
            raise ValueError(f"{key} = {c[key]} (the {what}) must be divisible by "
                             f"tp_size = {tp_size}")


class Block(nn.Module):
    """One device: x + attn(LN(x)), then x + MLP(LN(x)); module 4's Attention and MLP."""

    def __init__(self, h: int, ffn: int, n_heads: int):
        super().__init__()
        check_int("h", h)
        self.ln1, self.attn = nn.LayerNorm(h), Attention(h, n_heads)
        self.ln2, self.mlp = nn.LayerNorm(h), MLP(h, ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))      # (B, T, C)
        return x + self.mlp(self.ln2(x))    # (B, T, C)


class TensorParallelBlock(nn.Module):
    """Megatron TP: LayerNorms and residuals replicated on every rank; f/g all-reduces."""

    def __init__(self, block: Block, tp_group: dist.ProcessGroup | None = None):
        super().__init__()
        if not isinstance(block, Block):
            raise ValueError(f"block must be a sequence_parallel.Block; got {type(block).__name__}")
        self.tp_group = tp_group
        self.ln1, self.ln2 = copy.deepcopy(block.ln1), copy.deepcopy(block.ln2)
        self.attn = TensorParallelAttention.from_attention(block.attn, tp_group)
        self.mlp = TensorParallelMLP.from_mlp(block.mlp, tp_group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (B, T, C), the same on every rank
        x = x + self.attn(self.ln1(x))      # (B, T, C) replicated
        return x + self.mlp(self.ln2(x))    # (B, T, C) replicated


def _attend_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  n_heads: int) -> torch.Tensor:
    """Causal attention of this rank's heads: q, k, v (B, T, w) -> (B, T, w)."""
    b, s, w = q.shape
    q, k, v = (z.reshape(b, s, n_heads, w // n_heads).transpose(1, 2) for z in (q, k, v))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # (B, heads, T, w/heads)
    return a.transpose(1, 2).reshape(b, s, w)                     # (B, T, w)


class _GatherLinear(torch.autograd.Function):
    """g fused with a column-parallel linear: keeps only this rank's input slice for backward
    (``regather``) and all-gathers it again there, as Megatron does."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                group: dist.ProcessGroup | None, regather: bool) -> torch.Tensor:
        full = all_gather_seq(x, group, "forward")          # (B, T, C_in)
        ctx.group, ctx.regather, ctx.has_bias = group, regather, bias is not None
        ctx.save_for_backward(x if regather else full, weight)
        y = full @ weight                                   # (B, T, C_out/t)
        return y if bias is None else y + bias

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        kept, weight = ctx.saved_tensors
        full = all_gather_seq(kept, ctx.group, "backward") if ctx.regather else kept
        dx = reduce_scatter_seq(dy @ weight.t(), ctx.group, "backward")  # (B, T/t, C_in)
        dy2 = dy.reshape(-1, dy.shape[-1])                  # (B*T, C_out/t)
        dw = full.reshape(-1, full.shape[-1]).t() @ dy2     # (C_in, C_out/t)
        db = dy2.sum(0) if ctx.has_bias else None
        return dx, dw, db, None, None


class SequenceParallelBlock(TensorParallelBlock):
    """TP + SP: LayerNorms and residuals on this rank's (B, T/t, C) tokens; g / g-bar."""

    def __init__(self, block: Block, tp_group: dist.ProcessGroup | None = None,
                 regather: bool = True):
        super().__init__(block, tp_group)
        if not isinstance(regather, bool):
            raise ValueError(f"regather must be a bool; got {regather!r}")
        self.regather = regather

    def _column(self, x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
        # g then the column-parallel matmul: (B, T/t, C) -> (B, T, n/t)
        return _GatherLinear.apply(x, layer.weight, layer.bias, self.tp_group, self.regather)

    def _row(self, x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
        # the row-parallel matmul then g-bar: (B, T, n/t) -> (B, T/t, C); bias added once
        return reduce_scatter_to_sp(x @ layer.weight, self.tp_group) + layer.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (B, T/t, C), this rank's slice of the sequence
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError("x must be a (B, T/t, C) tensor: this rank's tokens")
        q, k, v = self._column(self.ln1(x), self.attn.qkv).chunk(3, dim=-1)  # 3 x (B, T, C/t)
        a = _attend_heads(q, k, v, self.attn.local_heads)                  # (B, T, C/t)
        x = x + self._row(a, self.attn.o)                                   # (B, T/t, C)
        hidden = F.gelu(self._column(self.ln2(x), self.mlp.up))             # (B, T, F/t)
        return x + self._row(hidden, self.mlp.down)                         # (B, T/t, C)


def sync_sequence_parallel_grads(block: SequenceParallelBlock) -> None:
    """All-reduce the gradients of the parameters used on sequence slices (LayerNorms, the
    row-parallel biases): each rank's covers only its tokens. Logged as phase "grad sync"."""
    if not isinstance(block, SequenceParallelBlock):
        raise ValueError(f"block must be a SequenceParallelBlock; got {type(block).__name__}")
    for p in (block.ln1.weight, block.ln1.bias, block.ln2.weight, block.ln2.bias,
              block.attn.o.bias, block.mlp.down.bias):
        p.grad = all_reduce(p.grad, block.tp_group, "grad sync")

"""One rank's piece of TinyLM in a 3-D job: its pipeline stage, with every block split by TP.

A DP x PP x TP job cuts :class:`course_utils.tiny_lm.TinyLM` twice. Pipeline parallelism gives
stage ``pp_rank`` the consecutive blocks of :func:`course_utils.pipeline_parallel.stage_bounds`
(the first stage also the embeddings, the last the final LayerNorm and the head). Tensor
parallelism splits each of those blocks as Megatron-LM does (module 4): attention by heads
(q, k, v column-parallel, the output projection row-parallel), the MLP column- then
row-parallel, with one all-reduce forward and one backward per sub-layer. LayerNorms, the
row-parallel biases, the embeddings and the head stay whole on every TP rank (Megatron splits
the embeddings and head by vocabulary; this model's 64-token vocabulary is not worth it).

:func:`shard_state` is the one place that says which slice of which full tensor a rank holds:
it builds a rank's stage from the full model (:func:`build_stage`) and cuts the one-device
reference's gradients and weights the same way, so a test can compare every rank's tensors
with the slices they must equal. :func:`stage_param_count` is the same count from the sizes
alone (the pen-and-paper figure that the memory prediction uses).
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.pipeline_parallel import stage_bounds
from course_utils.tensor_parallel import (ColumnParallelLinear, RowParallelLinear,
                                          TensorParallelAttention, TensorParallelMLP,
                                          column_shard, copy_to_tp, row_shard, shard_range)
from course_utils.tiny_lm import TinyLMConfig, build
from course_utils.validate import check_int

__all__ = ["check_coords", "stage_blocks", "shard_state", "TensorParallelBlock", "Stage",
           "build_stage", "stage_param_count"]


def check_coords(cfg: TinyLMConfig, pp_rank: int, pp_size: int, tp_rank: int,
                 tp_size: int) -> None:
    """Raise ValueError naming the argument unless the coordinates fit ``cfg``."""
    if not isinstance(cfg, TinyLMConfig):
        raise ValueError(f"cfg must be a TinyLMConfig; got {type(cfg).__name__}")
    check_int("pp_size", pp_size)
    check_int("tp_size", tp_size)
    for name, value, size in (("pp_rank", pp_rank, pp_size), ("tp_rank", tp_rank, tp_size)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
            raise ValueError(f"{name} must be an int from 0 to {size - 1}; got {value!r}")
    if pp_size > cfg.n_layers:
        raise ValueError(f"pp_size must be at most n_layers={cfg.n_layers} (a block per stage); "
                         f"got {pp_size}")
    for what, n in (("n_heads", cfg.n_heads), ("d_ff", cfg.d_ff)):
        if n % tp_size:
            raise ValueError(f"tp_size={tp_size} must divide {what}={n} (TP splits whole "
                             f"heads and equal slices of the MLP)")


def stage_blocks(cfg: TinyLMConfig, pp_rank: int, pp_size: int) -> range:
    """Indices of the blocks stage ``pp_rank`` of ``pp_size`` runs."""
    start, stop = stage_bounds(cfg.n_layers, pp_size)[pp_rank]
    return range(start, stop)


def _cols(t: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """This rank's slice of a bias or of a column-split output (the last dim)."""
    start, stop = shard_range(t.shape[-1], tp_size, tp_rank)
    return t[..., start:stop]


def shard_state(full: Mapping[str, torch.Tensor], cfg: TinyLMConfig, pp_rank: int, pp_size: int,
                tp_rank: int, tp_size: int) -> dict[str, torch.Tensor]:
    """The tensors one (pp_rank, tp_rank) holds, cut from a full TinyLM state (or its grads).

    ``full`` is keyed like ``TinyLM.state_dict()``; the result is keyed like this rank's
    :class:`Stage`. Weights are stored input-major, (h_in, h_out/t) or (h_in/t, h_out), as
    module 4's layers keep them. Cutting is linear, so it applies to gradients too.
    """
    check_coords(cfg, pp_rank, pp_size, tp_rank, tp_size)
    d, r, t = cfg.d_model, tp_rank, tp_size
    out: dict[str, torch.Tensor] = {}
    if pp_rank == 0:
        out["tok.weight"], out["pos.weight"] = full["tok.weight"], full["pos.weight"]
    for i in stage_blocks(cfg, pp_rank, pp_size):
        src, dst = f"blocks.{i}.", f"blocks.{i}."
        for ln in ("ln1", "ln2"):
            for p in ("weight", "bias"):
                out[f"{dst}{ln}.{p}"] = full[f"{src}{ln}.{p}"]
        w_qkv = full[src + "qkv.weight"].t()                                # (d, 3d)
        out[dst + "attn.qkv.weight"] = torch.cat(
            [column_shard(w, r, t) for w in w_qkv.split(d, dim=1)], dim=1)  # (d, 3d/t)
        out[dst + "attn.qkv.bias"] = torch.cat(
            [_cols(b, r, t) for b in full[src + "qkv.bias"].split(d)])      # (3d/t,)
        out[dst + "attn.o.weight"] = row_shard(full[src + "proj.weight"].t(), r, t)  # (d/t, d)
        out[dst + "attn.o.bias"] = full[src + "proj.bias"]
        out[dst + "mlp.up.weight"] = column_shard(full[src + "fc1.weight"].t(), r, t)  # (d, f/t)
        out[dst + "mlp.up.bias"] = _cols(full[src + "fc1.bias"], r, t)
        out[dst + "mlp.down.weight"] = row_shard(full[src + "fc2.weight"].t(), r, t)  # (f/t, d)
        out[dst + "mlp.down.bias"] = full[src + "fc2.bias"]
    if pp_rank == pp_size - 1:
        for name in ("ln_f.weight", "ln_f.bias", "head.weight", "head.bias"):
            out[name] = full[name]
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


class TensorParallelBlock(nn.Module):
    """TinyLM's pre-norm block with Megatron TP: x + attn(f(ln1(x))), then x + mlp(f(ln2(x))).

    ``f`` is Megatron's "f" operator before each column-parallel layer: identity forward,
    all-reduce of the input gradient over ``tp_group`` backward. Default
    :func:`course_utils.tensor_parallel.copy_to_tp`; any ``f(x, tp_group)`` can replace it (how
    assignment a10 runs a student's). The "g" after each row-parallel layer is in the layer.
    """

    def __init__(self, cfg: TinyLMConfig, tp_size: int, tp_group=None, f=None):
        super().__init__()
        d, ff, t = cfg.d_model, cfg.d_ff, tp_size
        self.f, self.tp_group = f or copy_to_tp, tp_group
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        qkv = ColumnParallelLinear(torch.empty(d, 3 * d // t), torch.empty(3 * d // t), tp_group,
                                   copy_input=False)
        o = RowParallelLinear(torch.empty(d // t, d), torch.empty(d), tp_group)
        self.attn = TensorParallelAttention(qkv, o, cfg.n_heads // t)
        self.mlp = TensorParallelMLP(
            ColumnParallelLinear(torch.empty(d, ff // t), torch.empty(ff // t), tp_group,
                                 copy_input=False),
            RowParallelLinear(torch.empty(ff // t, d), torch.empty(d), tp_group))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.f(self.ln1(x), self.tp_group))  # (B, T, D): local heads, g in o
        return x + self.mlp(self.f(self.ln2(x), self.tp_group))  # (B, T, D): ffn/t, g in down


class Stage(nn.Module):
    """Stage ``pp_rank``'s layers: token ids (B, T) or activations (B, T, D) in; activations
    (B, T, D) out, or logits (B, T, V) on the last stage.

    ``block(cfg)`` makes each block (default: a :class:`TensorParallelBlock` over ``tp_group``).
    """

    def __init__(self, cfg: TinyLMConfig, pp_rank: int, pp_size: int, tp_size: int = 1,
                 tp_group=None, f=None, block=None):
        super().__init__()
        block = block or (lambda c: TensorParallelBlock(c, tp_size, tp_group, f))
        self.cfg, self.first, self.last = cfg, pp_rank == 0, pp_rank == pp_size - 1
        if self.first:
            self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleDict({str(i): block(cfg)
                                     for i in stage_blocks(cfg, pp_rank, pp_size)})
        if self.last:
            self.ln_f = nn.LayerNorm(cfg.d_model)
            self.head = nn.Linear(cfg.d_model, cfg.vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            t = x.shape[1]
            x = self.tok(x) + self.pos(torch.arange(t, device=x.device))  # (B, T, D)
        for block in self.blocks.values():
            x = block(x)                                                   # (B, T, D)
        if self.last:
            return self.head(self.ln_f(x))                                 # (B, T, V)
        return x


def build_stage(cfg: TinyLMConfig, seed: int, pp_rank: int, pp_size: int, tp_rank: int,
                tp_size: int, tp_group=None, f=None) -> Stage:
    """This rank's :class:`Stage`, holding its slices of ``tiny_lm.build(cfg, seed)`` (``f``: see
    :class:`TensorParallelBlock`)."""
    full = build(cfg, seed).state_dict()
    stage = Stage(cfg, pp_rank, pp_size, tp_size, tp_group, f)
    stage.load_state_dict(shard_state(full, cfg, pp_rank, pp_size, tp_rank, tp_size))
    return stage


def stage_param_count(cfg: TinyLMConfig, pp_rank: int, pp_size: int, tp_size: int) -> int:
    """Parameter elements one rank of (pp_rank, any tp_rank) holds, from the sizes alone."""
    check_coords(cfg, pp_rank, pp_size, 0, tp_size)
    d, f, v, t = cfg.d_model, cfg.d_ff, cfg.vocab_size, tp_size
    per_block = (2 * d + 2 * d                      # ln1, ln2 (whole)
                 + d * 3 * d // t + 3 * d // t       # qkv: column split
                 + d // t * d + d                    # o: row split, bias whole
                 + d * f // t + f // t               # up: column split
                 + f // t * d + d)                   # down: row split, bias whole
    n = len(stage_blocks(cfg, pp_rank, pp_size)) * per_block
    if pp_rank == 0:
        n += v * d + cfg.seq_len * d                # token and position embeddings
    if pp_rank == pp_size - 1:
        n += 2 * d + d * v + v                      # ln_f, head
    return n


_FULL_NAMES = {"attn.qkv": "qkv", "attn.o": "proj", "mlp.up": "fc1", "mlp.down": "fc2"}


def full_name(name: str) -> str:
    """The TinyLM tensor a :class:`Stage` tensor is cut from: ``blocks.0.attn.o.weight`` ->
    ``blocks.0.proj.weight`` (names outside the blocks are the same)."""
    for local, full in _FULL_NAMES.items():
        name = name.replace(f".{local}.", f".{full}.")
    return name


def logits_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of (B, T, V) logits against (B, T) targets."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


__all__ += ["full_name", "logits_loss"]

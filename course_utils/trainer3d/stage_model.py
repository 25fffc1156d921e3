"""One rank's piece of TinyLM in a 3-D job: its pipeline stage, with every block split by TP.

A DP x PP x TP job cuts :class:`course_utils.models.tiny_lm.TinyLM` twice. Pipeline parallelism
gives stage ``pp_rank`` the consecutive blocks of :func:`course_utils.pipeline.runtime.stage_bounds`
(the first stage also the embeddings, the last the final LayerNorm and the head). Tensor
parallelism splits each of those blocks as Megatron-LM does (module 4): attention by heads
(q, k, v column-parallel, the output projection row-parallel), the MLP column- then
row-parallel, with one all-reduce forward and one backward per sub-layer. Two options take it
where Megatron-LM, picotron and torchtitan go:

* ``vocab_parallel``: the token embedding and the head split by token id
  (:mod:`course_utils.tensor_parallel.vocab`), the loss computed from the split logits;
* ``sp`` (sequence parallelism, module 9): between the TP regions each rank keeps only its
  T/t tokens (LayerNorms, residual adds, the activations sent to the next stage), and the
  all-reduces become all-gathers and reduce-scatters along the sequence. It needs
  ``vocab_parallel`` (the head's all-gather of the sequence then feeds split logits).

:func:`shard_state` is the one place that says which slice of which full tensor a rank holds:
it cuts the one-device reference's gradients and weights, and :func:`build_stage` fills a
rank's stage with the same cuts. :func:`build_stage` never builds the whole model: the stage is
made on the meta device (shapes, no storage), given real storage, and each full tensor is
drawn alone, cut and dropped (:func:`init_tensors`). :func:`stage_param_count` is the count
from the sizes alone (the pen-and-paper figure).
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.models.tiny_lm import TinyLMConfig
from course_utils.models.toy import seeded
from course_utils.pipeline.runtime import stage_bounds
from course_utils.runtime.validate import check_index, check_int
from course_utils.tensor_parallel.conjugates import copy_to_tp, gather_from_sp, reduce_scatter_to_sp
from course_utils.tensor_parallel.layers import (ColumnParallelLinear, RowParallelLinear,
                                                 TensorParallelAttention, TensorParallelMLP)
from course_utils.tensor_parallel.sharding import column_shard, row_shard, shard_range
from course_utils.tensor_parallel.vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy

__all__ = ["check_coords", "stage_blocks", "init_tensors", "shard_state", "TensorParallelBlock",
           "Stage", "build_stage", "stage_param_count", "full_name", "logits_loss"]


def check_coords(cfg: TinyLMConfig, pp_rank: int, pp_size: int, tp_rank: int, tp_size: int,
                 vocab_parallel: bool = False, sp: bool = False) -> None:
    """Raise ValueError naming the argument unless the coordinates and options fit ``cfg``."""
    if not isinstance(cfg, TinyLMConfig):
        raise ValueError(f"cfg must be a TinyLMConfig; got {type(cfg).__name__}")
    check_int("pp_size", pp_size)
    check_int("tp_size", tp_size)
    check_index("pp_rank", pp_rank, pp_size)
    check_index("tp_rank", tp_rank, tp_size)
    if pp_size > cfg.n_layers:
        raise ValueError(f"pp_size must be at most n_layers={cfg.n_layers} (a block per stage); "
                         f"got {pp_size}")
    splits = [("n_heads", cfg.n_heads), ("d_ff", cfg.d_ff)]
    splits += [("vocab_size", cfg.vocab_size)] if vocab_parallel else []
    splits += [("seq_len", cfg.seq_len)] if sp else []
    for what, n in splits:
        if n % tp_size:
            raise ValueError(f"tp_size={tp_size} must divide {what}={n} (TP splits it into "
                             f"equal parts)")
    if sp and not vocab_parallel:
        raise ValueError("sp=True needs vocab_parallel=True (the head reads the gathered "
                         "sequence and gives split logits)")


def stage_blocks(cfg: TinyLMConfig, pp_rank: int, pp_size: int) -> range:
    """Indices of the blocks stage ``pp_rank`` of ``pp_size`` runs."""
    start, stop = stage_bounds(cfg.n_layers, pp_size)[pp_rank]
    return range(start, stop)


def _init_order(cfg: TinyLMConfig):
    """(name, module factory) in the order ``TinyLM.__init__`` makes its layers."""
    d = cfg.d_model
    yield "tok", lambda: nn.Embedding(cfg.vocab_size, d)
    yield "pos", lambda: nn.Embedding(cfg.seq_len, d)
    for i in range(cfg.n_layers):
        for name, make in (("ln1", lambda: nn.LayerNorm(d)), ("qkv", lambda: nn.Linear(d, 3 * d)),
                           ("proj", lambda: nn.Linear(d, d)), ("ln2", lambda: nn.LayerNorm(d)),
                           ("fc1", lambda: nn.Linear(d, cfg.d_ff)),
                           ("fc2", lambda: nn.Linear(cfg.d_ff, d))):
            yield f"blocks.{i}.{name}", make
    yield "ln_f", lambda: nn.LayerNorm(d)
    yield "head", lambda: nn.Linear(d, cfg.vocab_size)


def init_tensors(cfg: TinyLMConfig, seed: int, keep: Callable[[str, torch.Tensor], None]) -> None:
    """Call ``keep(name, parameter)`` for every tensor of ``tiny_lm.build(cfg, seed)``, equal to
    it bit for bit, one layer alive at a time (``keep`` copies what it needs; it must not hold
    on to the parameter).

    The random stream has no skip-ahead, so every layer is drawn in ``TinyLM``'s order (the
    draws are what a layer's own initialisation makes); each is dropped after ``keep``.
    """
    with seeded(seed):
        for prefix, make in _init_order(cfg):
            layer = make()
            for name, p in layer.named_parameters():
                keep(f"{prefix}.{name}", p)
            del layer


def _cols(t: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """This rank's slice of a bias or of a column-split output (the last dim)."""
    start, stop = shard_range(t.shape[-1], tp_size, tp_rank)
    return t[..., start:stop]


def _cuts(cfg: TinyLMConfig, pp_rank: int, pp_size: int, tp_rank: int, tp_size: int,
          vocab_parallel: bool) -> dict[str, tuple[str, Callable]]:
    """For each full tensor this rank holds a part of: (its name in the Stage, the cut)."""
    d, r, t = cfg.d_model, tp_rank, tp_size
    whole = lambda w: w  # noqa: E731
    col_w = lambda w: column_shard(w.t(), r, t)   # noqa: E731  (out, in) -> (in, out/t)
    row_w = lambda w: row_shard(w.t(), r, t)      # noqa: E731  (out, in) -> (in/t, out)
    col_b = lambda b: _cols(b, r, t)                        # noqa: E731
    out: dict[str, tuple[str, Callable]] = {}
    if pp_rank == 0:
        vocab = lambda w: w[slice(*shard_range(cfg.vocab_size, t, r))]   # noqa: E731  rows
        out["tok.weight"] = ("tok.weight", vocab if vocab_parallel else whole)
        out["pos.weight"] = ("pos.weight", whole)
    for i in stage_blocks(cfg, pp_rank, pp_size):
        s = f"blocks.{i}."
        for ln in ("ln1", "ln2"):
            for p in ("weight", "bias"):
                out[f"{s}{ln}.{p}"] = (f"{s}{ln}.{p}", whole)
        out[s + "qkv.weight"] = (s + "attn.qkv.weight", lambda w: torch.cat(
            [column_shard(z, r, t) for z in w.t().split(d, dim=1)], dim=1))   # (d, 3d/t)
        out[s + "qkv.bias"] = (s + "attn.qkv.bias", lambda b: torch.cat(
            [_cols(z, r, t) for z in b.split(d)]))                            # (3d/t,)
        out[s + "proj.weight"] = (s + "attn.o.weight", row_w)                # (d/t, d)
        out[s + "proj.bias"] = (s + "attn.o.bias", whole)
        out[s + "fc1.weight"] = (s + "mlp.up.weight", col_w)                 # (d, f/t)
        out[s + "fc1.bias"] = (s + "mlp.up.bias", col_b)
        out[s + "fc2.weight"] = (s + "mlp.down.weight", row_w)               # (f/t, d)
        out[s + "fc2.bias"] = (s + "mlp.down.bias", whole)
    if pp_rank == pp_size - 1:
        out["ln_f.weight"], out["ln_f.bias"] = ("ln_f.weight", whole), ("ln_f.bias", whole)
        out["head.weight"] = ("head.weight", col_w if vocab_parallel else whole)  # (d, V/t)
        out["head.bias"] = ("head.bias", col_b if vocab_parallel else whole)
    return out


def shard_state(full: Mapping[str, torch.Tensor], cfg: TinyLMConfig, pp_rank: int, pp_size: int,
                tp_rank: int, tp_size: int,
                vocab_parallel: bool = False) -> dict[str, torch.Tensor]:
    """The tensors one (pp_rank, tp_rank) holds, cut from a full TinyLM state (or its grads).

    ``full`` is keyed like ``TinyLM.state_dict()``; the result is keyed like this rank's
    :class:`Stage`. Weights are stored input-major, (h_in, h_out/t) or (h_in/t, h_out), as
    module 4's layers keep them (and the head too, when it is split by vocabulary). Cutting is
    linear, so it applies to gradients too.
    """
    check_coords(cfg, pp_rank, pp_size, tp_rank, tp_size, vocab_parallel)
    cuts = _cuts(cfg, pp_rank, pp_size, tp_rank, tp_size, vocab_parallel)
    return {local: cut(full[name]).detach().contiguous().clone()
            for name, (local, cut) in cuts.items()}


class TensorParallelBlock(nn.Module):
    """TinyLM's pre-norm block with Megatron TP: x + attn(f(ln1(x))), then x + mlp(f(ln2(x))).

    ``f`` is Megatron's "f" operator before each column-parallel layer: identity forward, all-reduce
    of the input gradient over ``tp_group`` backward. Default
    :func:`course_utils.tensor_parallel.conjugates.copy_to_tp`; any ``f(x, tp_group)`` can replace
    it (how assignment a10 runs a student's). The "g" after each row-parallel layer is in the layer.
    With ``sp``, x is this rank's (B, T/t, D) tokens: an all-gather along the sequence before each
    column-parallel layer, a reduce-scatter after each row-parallel one (module 9).
    """

    def __init__(self, cfg: TinyLMConfig, tp_size: int, tp_group=None, f=None, sp: bool = False):
        super().__init__()
        d, ff, t = cfg.d_model, cfg.d_ff, tp_size
        self.f, self.tp_group, self.sp = f or copy_to_tp, tp_group, sp
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        qkv = ColumnParallelLinear(torch.empty(d, 3 * d // t), torch.empty(3 * d // t), tp_group,
                                   copy_input=False)
        o = RowParallelLinear(torch.empty(d // t, d), torch.empty(d), tp_group)
        self.attn = TensorParallelAttention(qkv, o, cfg.n_heads // t)
        self.mlp = TensorParallelMLP(
            ColumnParallelLinear(torch.empty(d, ff // t), torch.empty(ff // t), tp_group,
                                 copy_input=False),
            RowParallelLinear(torch.empty(ff // t, d), torch.empty(d), tp_group))

    def _row_sp(self, x: torch.Tensor, layer: RowParallelLinear) -> torch.Tensor:
        # the row-parallel matmul, then reduce-scatter: (B, T, n/t) -> (B, T/t, D); bias once
        return reduce_scatter_to_sp(x @ layer.weight, self.tp_group) + layer.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.sp:
            x = x + self.attn(self.f(self.ln1(x), self.tp_group))  # (B, T, D): g in o
            return x + self.mlp(self.f(self.ln2(x), self.tp_group))
        h = gather_from_sp(self.ln1(x), self.tp_group)                  # (B, T, D)
        q, k, v = self.attn.qkv(h).chunk(3, dim=-1)                      # 3 x (B, T, D/t)
        b, s, w = q.shape
        heads = self.attn.local_heads
        q, k, v = (z.reshape(b, s, heads, w // heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)     # (B, heads, T, hd)
        x = x + self._row_sp(a.transpose(1, 2).reshape(b, s, w), self.attn.o)  # (B, T/t, D)
        h = F.gelu(self.mlp.up(gather_from_sp(self.ln2(x), self.tp_group)))    # (B, T, F/t)
        return x + self._row_sp(h, self.mlp.down)


class Stage(nn.Module):
    """Stage ``pp_rank``'s layers: token ids (B, T) or activations (B, T', D) in; activations
    (B, T', D) out, or logits (B, T, V) on the last stage ((B, T, V/t) if ``vocab_parallel``).
    T' is T, or T/t with ``sp``.

    ``block(cfg)`` makes each block (default: a :class:`TensorParallelBlock` over ``tp_group``).
    """

    def __init__(self, cfg: TinyLMConfig, pp_rank: int, pp_size: int, tp_size: int = 1,
                 tp_group=None, f=None, block=None, *, tp_rank: int = 0,
                 vocab_parallel: bool = False, sp: bool = False):
        super().__init__()
        check_coords(cfg, pp_rank, pp_size, tp_rank, tp_size, vocab_parallel, sp)
        block = block or (lambda c: TensorParallelBlock(c, tp_size, tp_group, f, sp))
        self.cfg, self.first, self.last = cfg, pp_rank == 0, pp_rank == pp_size - 1
        self.tp_group, self.tp_rank, self.tp_size = tp_group, tp_rank, tp_size
        self.vocab_parallel, self.sp = vocab_parallel, sp
        d, v = cfg.d_model, cfg.vocab_size
        if self.first:
            self.tok = (VocabParallelEmbedding(v, d, tp_group, tp_rank, tp_size, sp)
                        if vocab_parallel else nn.Embedding(v, d))
            self.pos = nn.Embedding(cfg.seq_len, d)
        self.blocks = nn.ModuleDict({str(i): block(cfg)
                                     for i in stage_blocks(cfg, pp_rank, pp_size)})
        if self.last:
            self.ln_f = nn.LayerNorm(d)
            self.head = (ColumnParallelLinear(torch.empty(d, v // tp_size),
                                              torch.empty(v // tp_size), tp_group,
                                              copy_input=not sp)
                         if vocab_parallel else nn.Linear(d, v))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            t = x.shape[1]
            lo, hi = shard_range(t, self.tp_size, self.tp_rank) if self.sp else (0, t)
            x = self.tok(x) + self.pos(torch.arange(lo, hi, device=x.device))  # (B, T', D)
        for block in self.blocks.values():
            x = block(x)                                                       # (B, T', D)
        if self.last:
            h = self.ln_f(x)
            return self.head(gather_from_sp(h, self.tp_group) if self.sp else h)  # (B, T, V')
        return x

    def token_losses(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of every token, (B*T,), from this stage's logits (last stage)."""
        flat = logits.reshape(-1, logits.shape[-1])
        if self.vocab_parallel:
            return vocab_parallel_cross_entropy(flat, targets.reshape(-1), self.tp_group)
        return F.cross_entropy(flat.float(), targets.reshape(-1), reduction="none")

    def tp_partial(self) -> list[nn.Parameter]:
        """With ``sp``: the parameters used on this rank's tokens only (their gradients are
        partial sums over the TP group)."""
        if not self.sp:
            return []
        out = [self.pos.weight] if self.first else []
        for blk in self.blocks.values():
            out += [blk.ln1.weight, blk.ln1.bias, blk.ln2.weight, blk.ln2.bias, blk.attn.o.bias,
                    blk.mlp.down.bias]
        return out + ([self.ln_f.weight, self.ln_f.bias] if self.last else [])

    def tp_replicated(self) -> list[nn.Parameter]:
        """The parameters every rank of the TP group holds whole (the same values)."""
        out = [self.pos.weight] + ([] if self.vocab_parallel else [self.tok.weight]) \
            if self.first else []
        for blk in self.blocks.values():
            out += [blk.ln1.weight, blk.ln1.bias, blk.ln2.weight, blk.ln2.bias, blk.attn.o.bias,
                    blk.mlp.down.bias]
        if self.last:
            out += [self.ln_f.weight, self.ln_f.bias]
            out += [] if self.vocab_parallel else [self.head.weight, self.head.bias]
        return out


def build_stage(cfg: TinyLMConfig, seed: int, pp_rank: int, pp_size: int, tp_rank: int,
                tp_size: int, tp_group=None, f=None, *, vocab_parallel: bool = False,
                sp: bool = False, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu") -> Stage:
    """This rank's :class:`Stage` holding its slices of ``tiny_lm.build(cfg, seed)`` in
    ``dtype`` on ``device``, made without the whole model: on the meta device first, then
    given storage, then filled tensor by tensor (:func:`init_tensors`)."""
    with torch.device("meta"):
        stage = Stage(cfg, pp_rank, pp_size, tp_size, tp_group, f, tp_rank=tp_rank,
                      vocab_parallel=vocab_parallel, sp=sp)
    stage = stage.to(dtype).to_empty(device=device)
    params = dict(stage.named_parameters())
    cuts = _cuts(cfg, pp_rank, pp_size, tp_rank, tp_size, vocab_parallel)

    def keep(name: str, tensor: torch.Tensor) -> None:
        if name in cuts:
            local, cut = cuts[name]
            with torch.no_grad():
                params.pop(local).copy_(cut(tensor))

    init_tensors(cfg, seed, keep)
    if params:
        raise RuntimeError(f"no initial values for {sorted(params)}")
    return stage


def stage_param_count(cfg: TinyLMConfig, pp_rank: int, pp_size: int, tp_size: int,
                      vocab_parallel: bool = False) -> int:
    """Parameter elements one rank of (pp_rank, any tp_rank) holds, from the sizes alone."""
    check_coords(cfg, pp_rank, pp_size, 0, tp_size, vocab_parallel)
    d, f, v, t = cfg.d_model, cfg.d_ff, cfg.vocab_size, tp_size
    per_block = (2 * d + 2 * d                      # ln1, ln2 (whole)
                 + d * 3 * d // t + 3 * d // t       # qkv: column split
                 + d // t * d + d                    # o: row split, bias whole
                 + d * f // t + f // t               # up: column split
                 + f // t * d + d)                   # down: row split, bias whole
    n = len(stage_blocks(cfg, pp_rank, pp_size)) * per_block
    vocab = v // t if vocab_parallel else v
    if pp_rank == 0:
        n += vocab * d + cfg.seq_len * d            # token (split or whole) and positions
    if pp_rank == pp_size - 1:
        n += 2 * d + d * vocab + vocab              # ln_f, head (split or whole)
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

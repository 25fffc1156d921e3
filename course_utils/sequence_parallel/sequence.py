"""Sequence parallelism: split along the sequence what tensor parallelism replicates.

Megatron tensor parallelism (module 4, :mod:`course_utils.tensor_parallel.layers`) splits the matmuls
of a transformer block over ``t`` ranks, but the LayerNorms, the residual adds (and dropout)
run on the whole (B, T, C) activation on every rank: their saved inputs are *replicated*, the
``10 s b h`` term of Korthikanti et al. (2022), "Reducing Activation Recomputation in Large
Transformer Models", section 4.2.2, that no TP degree shrinks. Sequence parallelism (SP) runs
those operations on this rank's slice of the sequence, (B, T/t, C), and changes the two
conjugate operators around each TP region:

* **g** (:func:`gather_from_sp`): all-gather along the sequence forward (before the
  column-parallel linear, which needs every token); reduce-scatter of the gradient backward.
* **g-bar** (:func:`reduce_scatter_to_sp`): reduce-scatter along the sequence forward (after the
  row-parallel linear: the sum of the partial results, each rank keeping its tokens' slice);
  all-gather of the gradient backward.

TP's all-reduce becomes a reduce-scatter plus an all-gather, which is how a ring all-reduce
works anyway: the same bytes on the wire (:func:`ring_bytes_sent`). Megatron also keeps only
the slice of each LayerNorm output for backward and all-gathers it again there
(``regather=True``, :class:`SequenceParallelBlock`): the whole block's saved bytes are then
1/t of one device's, at the price of one extra all-gather per column-parallel linear in
backward. With ``regather=False`` the gathered (B, T, C) input is kept instead.

gloo's own reduce-scatter (``reduce_scatter_single``) works, but sends what an all-reduce of the
whole tensor sends (2(t-1)/t of it, twice a ring reduce-scatter's (t-1)/t:
:func:`reduce_scatter_bytes` measures both). So :func:`_reduce_scatter_seq` builds the
reduce-scatter from ``all_to_all_single`` (rank j receives every rank's j-th chunk and adds
them), which sends a ring's bytes, and the all-gather uses ``all_gather``; both are logged with module 4's recorder
(:func:`course_utils.tensor_parallel.layers.record_comms`). Dropout is left out, as in module 4's
layers: with SP each rank would draw the mask of its own tokens, and matching one device would
need one random stream per token; its masks are split exactly like the LayerNorm inputs.

:func:`compare` runs the three forms (one device, TP, TP+SP) from several seeds, asserts every
output and gradient equal (``torch.testing.assert_close``) and returns the saved bytes per rank
(:func:`course_utils.memory.activations.saved_bytes`) beside :func:`predicted_saved_bytes`, and the
collectives each rank issued.

Run the demo under torchrun (each rank checks TP+SP against one device)::

    torchrun --standalone --nproc-per-node 2 -m course_utils.sequence_parallel.sequence
"""

from __future__ import annotations

import copy
import math
import pickle
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from course_utils.memory import activations
from course_utils.runtime import backend
from course_utils.tensor_parallel import layers as tp
from course_utils.runtime import clock as timing
from course_utils.runtime.clock import clock
from course_utils.tensor_parallel.layers import (MLP, Attention, CommEvent, TensorParallelAttention,
                                          TensorParallelMLP, record_comms, shard_range)
from course_utils.runtime.validate import check_int as _check_int

__all__ = ["MODES", "SEQ_DIM", "GatherFromSequenceParallel", "ReduceScatterToSequenceParallel",
           "gather_from_sp", "reduce_scatter_to_sp", "Block", "TensorParallelBlock",
           "SequenceParallelBlock", "sync_sequence_parallel_grads", "reference", "sp_worker",
           "compare", "SPComparison", "saved_terms", "layernorm_part", "predicted_saved_bytes",
           "ring_bytes_sent", "comm_summary", "report", "conjugate_worker",
           "reduce_scatter_bytes_worker", "reduce_scatter_bytes", "demo"]

MODES = ("tp", "sp")   # TP alone (LayerNorm and residual replicated), TP + SP
SEQ_DIM = 1            # activations are (B, T, C): the sequence is dim 1
_FP32 = 4


# ------------------------------------------------------------------ collectives on the sequence


def _all_gather_seq(x: torch.Tensor, group: dist.ProcessGroup | None,
                    phase: str) -> torch.Tensor:
    """(B, T/t, ...) per rank -> (B, T, ...) on every rank, slices in rank order (logged)."""
    return tp._all_gather_cat(x, group, phase, dim=SEQ_DIM)


def _reduce_scatter_seq(x: torch.Tensor, group: dist.ProcessGroup | None,
                        phase: str) -> torch.Tensor:
    """(B, T, ...) partial sums per rank -> this rank's (B, T/t, ...) slice of their sum (logged).

    Built from ``all_to_all_single``: rank j is sent every rank's j-th sequence chunk and adds
    them, so each rank sends (t-1)/t of the tensor, as in a ring reduce-scatter.
    """
    t = dist.get_world_size(group)
    if t == 1:
        return x
    if x.shape[SEQ_DIM] % t:
        raise ValueError(f"the sequence length {x.shape[SEQ_DIM]} must be divisible by the "
                         f"tp size {t}")
    send = torch.stack(x.chunk(t, dim=SEQ_DIM)).contiguous()  # (t, B, T/t, ...): chunk j to rank j
    recv = torch.empty_like(send)
    t0 = clock(send)
    dist.all_to_all_single(recv, send, group=group)          # recv[r]: rank r's chunk for me
    out = recv.sum(0)                                        # (B, T/t, ...)
    tp._log("reduce_scatter", phase, out, clock(out) - t0)
    return out


class GatherFromSequenceParallel(torch.autograd.Function):
    """Megatron-SP's g: all-gather along the sequence forward; reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return _all_gather_seq(x, group, "forward")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # Every rank used all T tokens for its own heads/features: dL/dx sums over the ranks,
        # and each rank needs only its tokens' slice of that sum.
        return _reduce_scatter_seq(grad, ctx.group, "backward"), None


class ReduceScatterToSequenceParallel(torch.autograd.Function):
    """Megatron-SP's g-bar: reduce-scatter along the sequence forward; all-gather backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return _reduce_scatter_seq(x, group, "forward")

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # y_r = (sum_j P_j)[tokens_r], so dL/dP_j is the whole gathered gradient on every rank.
        return _all_gather_seq(grad, ctx.group, "backward"), None


def gather_from_sp(x: torch.Tensor, tp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """g: (B, T/t, C) this rank's tokens -> (B, T, C) every token; reduce-scatter backward."""
    return GatherFromSequenceParallel.apply(x, tp_group)


def _check_numel(numel: Any, world_size: int) -> int:
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 1 or numel % world_size:
        raise ValueError(f"numel must be a positive int divisible by world_size={world_size}; "
                         f"got {numel!r}")
    return numel


def reduce_scatter_bytes_worker(rank: int, world_size: int,
                                numel: int = 2**20) -> dict[str, float]:
    """Worker: bytes this rank sends (``timing.bytes_written``) reducing a (1, numel) fp32
    tensor to its 1/t slice: with gloo's own reduce-scatter (``dist.reduce_scatter_single``,
    torch 2.13's name for ``reduce_scatter_tensor``) and with the course's ``all_to_all_single``
    form; each after a warm-up, as a fraction of the tensor's bytes."""

    _check_numel(numel, world_size)
    x = torch.ones(1, numel, device=backend.device())                      # (1, n)
    out = {}
    for name, fn in (("gloo reduce-scatter", lambda: dist.reduce_scatter_single(
                         torch.empty(numel // world_size, device=x.device), x.flatten())),
                     ("course (all_to_all_single)", lambda: _reduce_scatter_seq(x, None, "x"))):
        fn()  # warm-up: connections and buffers
        dist.barrier()
        before = timing.bytes_written()
        fn()
        after = timing.bytes_written()
        out[name] = (math.nan if before is None or after is None
                     else (after - before) / (4 * numel))
    return out


def reduce_scatter_bytes(world_size: int = 2, numel: int = 2**20,
                         timeout_s: float = 60.0) -> dict[str, float]:
    """:func:`reduce_scatter_bytes_worker` on ``world_size`` gloo ranks: the most any rank sent,
    per form, as a fraction of the tensor's bytes (NaN where the host cannot see the bytes)."""
    from course_utils import launch

    _check_int("world_size", world_size, 2)
    _check_numel(numel, world_size)
    runs = launch.run(reduce_scatter_bytes_worker, world_size, numel, timeout_s=timeout_s,
                      show_output=False, backend="gloo")
    return {name: max(r[name] for r in runs) for name in runs[0]}


def reduce_scatter_to_sp(x: torch.Tensor,
                         tp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """g-bar: (B, T, C) partial sums -> (B, T/t, C) this rank's tokens of the sum."""
    return ReduceScatterToSequenceParallel.apply(x, tp_group)


class _GatherLinear(torch.autograd.Function):
    """g fused with a column-parallel linear: keeps only this rank's input slice for backward
    (``regather``) and all-gathers it again there, as Megatron does."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                group: dist.ProcessGroup | None, regather: bool) -> torch.Tensor:
        full = _all_gather_seq(x, group, "forward")         # (B, T, C_in)
        ctx.group, ctx.regather, ctx.has_bias = group, regather, bias is not None
        ctx.save_for_backward(x if regather else full, weight)
        y = full @ weight                                   # (B, T, C_out/t)
        return y if bias is None else y + bias

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        kept, weight = ctx.saved_tensors
        full = _all_gather_seq(kept, ctx.group, "backward") if ctx.regather else kept
        dx = _reduce_scatter_seq(dy @ weight.t(), ctx.group, "backward")  # (B, T/t, C_in)
        dy2 = dy.reshape(-1, dy.shape[-1])                  # (B*T, C_out/t)
        dw = full.reshape(-1, full.shape[-1]).t() @ dy2     # (C_in, C_out/t)
        db = dy2.sum(0) if ctx.has_bias else None
        return dx, dw, db, None, None


# ----------------------------------------------------------------------------------- the block


def _check_block_sizes(c: dict, tp_size: int) -> None:
    """ValueError naming the size that tp_size does not divide."""
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
        _check_int("h", h)
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
        p.grad = tp._all_reduce(p.grad, block.tp_group, "grad sync")


# -------------------------------------------------------------- distributed vs one device

Spec = Any   # "replicated" | ("cat", dim)


def _build(seed: int, c: dict) -> tuple[Block, torch.Tensor, torch.Tensor]:
    """The one-device block, its input x (B, T, C) and upstream gradient dy, from ``seed``."""
    torch.manual_seed(seed)
    block = Block(c["h"], c["ffn"], c["n_heads"])
    with torch.no_grad():  # LayerNorm starts at (1, 0): move it, so its gradients are tested
        for ln in (block.ln1, block.ln2):
            ln.weight.add_(0.1 * torch.randn_like(ln.weight))
            ln.bias.add_(0.1 * torch.randn_like(ln.bias))
    gen = torch.Generator().manual_seed(10_000 + seed)
    x = torch.randn(c["b"], c["s"], c["h"], generator=gen)    # (B, T, C)
    dy = torch.randn(c["b"], c["s"], c["h"], generator=gen)   # (B, T, C): dL/dy
    return block, x, dy


def reference(seed: int, cfg: dict | None = None) -> dict[str, torch.Tensor]:
    """Output and every gradient of the one-device :class:`Block` (loss = sum(y * dy))."""
    _check_int("seed", seed, 0)
    block, x, dy = _build(seed, tp._config(cfg))
    x.requires_grad_(True)
    y = block(x)
    (y * dy).sum().backward()
    return {"y": y.detach(), "x.grad": x.grad,
            **{f"{n}.grad": p.grad for n, p in block.named_parameters()}}


def _local_grads(par: TensorParallelBlock) -> dict[str, tuple[torch.Tensor, Spec]]:
    """This rank's gradients in the one-device ``nn.Linear`` layout, with how they combine."""
    out: dict[str, tuple[torch.Tensor, Spec]] = {}
    for name in ("ln1", "ln2"):
        ln = getattr(par, name)
        out[f"{name}.weight.grad"] = (ln.weight.grad, "replicated")
        out[f"{name}.bias.grad"] = (ln.bias.grad, "replicated")
    w_parts = par.attn.qkv.weight.grad.chunk(3, dim=1)              # 3 x (C, C/t)
    b_parts = par.attn.qkv.bias.grad.chunk(3, dim=0)                # 3 x (C/t,)
    for name, w, b in zip("qkv", w_parts, b_parts):
        out[f"attn.{name}.weight.grad"] = (w.t(), ("cat", 0))       # (C/t, C) rows
        out[f"attn.{name}.bias.grad"] = (b, ("cat", 0))
    for prefix, col, row in (("attn", None, par.attn.o), ("mlp", par.mlp.up, par.mlp.down)):
        if col is not None:
            out[f"{prefix}.up.weight.grad"] = (col.weight.grad.t(), ("cat", 0))
            out[f"{prefix}.up.bias.grad"] = (col.bias.grad, ("cat", 0))
        key = "o" if prefix == "attn" else "down"
        out[f"{prefix}.{key}.weight.grad"] = (row.weight.grad.t(), ("cat", 1))
        out[f"{prefix}.{key}.bias.grad"] = (row.bias.grad, "replicated")
    return out


def sp_worker(rank: int, world_size: int, seeds: Sequence[int], cfg: dict | None = None,
              regather: bool = True) -> bytes:
    """One rank: per seed, the block as TP and as TP+SP, forward and backward.

    Returns (pickled) one dict per seed, {mode: {"results": {name: (local tensor, how it
    combines)}, "saved_bytes": bytes saved for backward, "comms": [CommEvent]}} for mode in
    :data:`MODES`. Tensors are made on :func:`course_utils.runtime.backend.device` and returned on CPU.
    """
    c = tp._config(cfg)
    _check_block_sizes(c, world_size)
    dev = backend.device()
    tp_group = None  # the whole world is one tensor-parallel group here
    tokens = slice(*shard_range(c["s"], world_size, rank))
    out = []
    for seed in seeds:
        per_mode = {}
        for mode in MODES:
            block, x, dy = _build(seed, c)
            if mode == "tp":
                par = TensorParallelBlock(block, tp_group).to(dev)
                x_spec: Spec = "replicated"
            else:
                par = SequenceParallelBlock(block, tp_group, regather).to(dev)
                x, dy, x_spec = x[:, tokens].clone(), dy[:, tokens].clone(), ("cat", SEQ_DIM)
            x, dy = x.to(dev).requires_grad_(True), dy.to(dev)
            with record_comms() as comms:
                nbytes, y = activations.saved_bytes(lambda: par(x), exclude=par.parameters())
                (y * dy).sum().backward()
                if mode == "sp":
                    sync_sequence_parallel_grads(par)
            results = {"y": (y.detach(), x_spec), "x.grad": (x.grad, x_spec)} | _local_grads(par)
            per_mode[mode] = {
                "results": {k: (backend.to_cpu(t.detach()).contiguous().clone(), s)
                            for k, (t, s) in results.items()},
                "saved_bytes": nbytes, "comms": list(comms)}
        out.append(per_mode)
    return pickle.dumps(out)


def _assemble(name: str, parts: list[tuple[torch.Tensor, Spec]]) -> torch.Tensor:
    """The one-device tensor from the ranks' parts (replicated parts must agree)."""
    spec = parts[0][1]
    if spec == "replicated":
        for r, (t, _) in enumerate(parts[1:], 1):
            torch.testing.assert_close(t, parts[0][0], msg=lambda m, r=r: f"{name} rank {r}: {m}")
        return parts[0][0]
    return torch.cat([t for t, _ in parts], dim=spec[1])


@dataclass
class SPComparison:
    """What :func:`compare` checked and measured, per mode ("tp", "sp")."""

    tp_size: int
    seeds: tuple
    cfg: dict
    regather: bool
    names: list[str]
    equal: bool                                # every tensor assert_close to one device
    max_abs_diff: dict[str, float]
    saved_bytes: dict[str, list[int]]          # per mode, per rank (first seed); "one": 1 device
    predicted_bytes: dict[str, int]            # per mode, every rank; "one": one device
    comms: dict[str, list[CommEvent]]          # per mode, rank 0, first seed
    all_comms: dict[str, list[list[CommEvent]]] = field(default_factory=dict)  # per rank


def compare(tp_size: int, seeds: Sequence[int] = (0, 1), cfg: dict | None = None,
            regather: bool = True, timeout_s: float = 120.0, check: bool = True) -> SPComparison:
    """Run TP and TP+SP on ``tp_size`` ranks; assert_close every output and gradient to one
    device (and TP+SP to TP; ``check=False``: record instead of raising); return the
    measured and predicted bytes and the collectives."""
    _check_int("tp_size", tp_size)
    seeds = tuple(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"seeds must be a non-empty sequence of ints >= 0; got {seeds!r}")
    for name, value in (("regather", regather), ("check", check)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be a bool; got {value!r}")
    c = tp._config(cfg)
    _check_block_sizes(c, tp_size)
    from course_utils import launch

    per_rank = [pickle.loads(b) for b in launch.run(sp_worker, tp_size, seeds, c, regather,
                                                    timeout_s=timeout_s)]
    worst = {m: 0.0 for m in MODES}
    names: list[str] = []
    failures: list[str] = []

    def close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
        try:
            torch.testing.assert_close(got, want)
        except AssertionError as err:
            failures.append(f"{what}: {err}")

    for i, seed in enumerate(seeds):
        ref = reference(seed, c)
        full = {}
        for mode in MODES:
            got = [rank_out[i][mode]["results"] for rank_out in per_rank]
            if set(got[0]) != set(ref):
                raise AssertionError(f"compared names differ: {sorted(got[0])} vs {sorted(ref)}")
            full[mode] = {n: _assemble(n, [g[n] for g in got]) for n in ref}
            for n in ref:
                close(full[mode][n], ref[n], f"seed {seed} {mode} {n} vs one device")
                worst[mode] = max(worst[mode], float((full[mode][n] - ref[n]).abs().max()))
        for n in ref:
            close(full["sp"][n], full["tp"][n], f"seed {seed} sp vs tp {n}")
        names = list(ref)
    if failures and check:
        raise AssertionError("\n".join(failures))
    sizes = dict(b=c["b"], s=c["s"], h=c["h"], ffn=c["ffn"], n_heads=c["n_heads"])
    block, x, _ = _build(seeds[0], c)
    x.requires_grad_(True)
    one, _ = activations.saved_bytes(lambda: block(x), exclude=block.parameters())
    return SPComparison(
        tp_size, seeds, c, regather, names, not failures, worst,
        {"one": [one]} | {m: [r[0][m]["saved_bytes"] for r in per_rank] for m in MODES},
        {"one": predicted_saved_bytes(**sizes)}
        | {m: predicted_saved_bytes(**sizes, tp=tp_size, mode=m, regather=regather)
           for m in MODES},
        {m: per_rank[0][0][m]["comms"] for m in MODES},
        {m: [r[0][m]["comms"] for r in per_rank] for m in MODES})


# --------------------------------------------------------------------------- bytes, predicted

# (name, split by TP alone?) in the order the block saves them; the rest TP replicates
_TERMS = (("LayerNorm 1 input (block input)", False), ("LayerNorm 1 mean, 1/std", False),
          ("LayerNorm 1 output (QKV input)", False), ("Q, K, V (one buffer)", True),
          ("attention output (projection input)", True), ("log-sum-exp (B, heads, T)", True),
          ("LayerNorm 2 input (residual)", False), ("LayerNorm 2 mean, 1/std", False),
          ("LayerNorm 2 output (MLP input)", False), ("GELU input (B, T, F)", True),
          ("GELU output (down input)", True))


def saved_terms(b: int, s: int, h: int, ffn: int, n_heads: int, tp: int = 1,
                mode: str = "tp", regather: bool = True) -> dict[str, int]:
    """Elements one rank saves for backward in this module's block, by tensor (fp32, the CPU
    fused attention kernel). ``mode`` "tp": the LayerNorm part whole on every rank, the rest
    1/tp; "sp": everything 1/tp (with ``regather=False`` the two LayerNorm outputs stay whole,
    kept gathered for backward). tp = 1 is one device."""
    for name, value in (("b", b), ("s", s), ("h", h), ("ffn", ffn), ("n_heads", n_heads),
                        ("tp", tp)):
        _check_int(name, value)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}; got {mode!r}")
    if not isinstance(regather, bool):
        raise ValueError(f"regather must be a bool; got {regather!r}")
    _check_block_sizes({"b": b, "s": s, "h": h, "ffn": ffn, "n_heads": n_heads}, tp)
    btc, bt = b * s * h, b * s
    whole = dict(zip((n for n, _ in _TERMS),
                     (btc, 2 * bt, btc, 3 * btc, btc, b * n_heads * s, btc, 2 * bt, btc,
                      b * s * ffn, b * s * ffn)))
    out = {}
    for name, split_by_tp in _TERMS:
        kept_whole = (mode == "sp" and not regather and "output" in name
                      and name.startswith("LayerNorm"))
        divided = split_by_tp or mode == "sp"
        out[name] = whole[name] if kept_whole or not divided else whole[name] // tp
    return out


def layernorm_part(terms: dict[str, int]) -> int:
    """Of :func:`saved_terms`, the elements TP alone replicates: the LayerNorms' inputs (the
    residual stream), statistics and outputs."""
    if not isinstance(terms, dict) or set(terms) != {n for n, _ in _TERMS}:
        raise ValueError("terms must be a dict from saved_terms")
    return sum(terms[n] for n, split_by_tp in _TERMS if not split_by_tp)


def predicted_saved_bytes(b: int, s: int, h: int, ffn: int, n_heads: int, tp: int = 1,
                          mode: str = "tp", regather: bool = True) -> int:
    """Bytes one rank saves for backward: 4 x :func:`saved_terms`. TP: 4 (4BTC + 4BT) +
    4 (4BTC + 2BTF + BHT) / t; TP+SP (regather): 4 (8BTC + 2BTF + 4BT + BHT) / t."""
    return _FP32 * sum(saved_terms(b, s, h, ffn, n_heads, tp, mode, regather).values())


# ------------------------------------------------------------------------ bytes on the wire


def ring_bytes_sent(event: CommEvent, tp_size: int) -> float:
    """Bytes one rank sends for ``event`` in a ring: all-reduce 2 (t-1)/t N (N: the tensor);
    all-gather (t-1)/t N (N: the gathered result); reduce-scatter (t-1)/t N (N: the input,
    t times the result)."""
    if not isinstance(event, CommEvent):
        raise ValueError(f"event must be a tensor_parallel.CommEvent; got {type(event).__name__}")
    _check_int("tp_size", tp_size)
    factor = {"all_reduce": 2 * (tp_size - 1) / tp_size, "all_gather": (tp_size - 1) / tp_size,
              "reduce_scatter": float(tp_size - 1)}
    if event.op not in factor:
        raise ValueError(f"event.op must be one of {sorted(factor)}; got {event.op!r}")
    return factor[event.op] * event.nbytes


def comm_summary(events: Sequence[CommEvent], tp_size: int) -> dict[str, dict[str, Any]]:
    """Per phase: {"ops": {op: count}, "ring_bytes": bytes one rank sends in a ring}."""
    _check_int("tp_size", tp_size)
    if isinstance(events, (str, bytes)) or not hasattr(events, "__iter__"):
        raise ValueError(f"events must be a list of CommEvent; got {type(events).__name__}")
    events = list(events)
    wrong = sorted({type(e).__name__ for e in events if not isinstance(e, CommEvent)})
    if wrong:
        raise ValueError(f"events must hold only CommEvent (from a run's log); got {', '.join(wrong)}")
    out: dict[str, dict[str, Any]] = {}
    for e in events:
        entry = out.setdefault(e.phase, {"ops": {}, "ring_bytes": 0.0})
        entry["ops"][e.op] = entry["ops"].get(e.op, 0) + 1
        entry["ring_bytes"] += ring_bytes_sent(e, tp_size)
    return out


def _ops_words(ops: dict[str, int]) -> str:
    return " + ".join(f"{n} {op.replace('_', '-')}" for op, n in ops.items()) or "none"


def report(run: SPComparison) -> str:
    """A short table: saved bytes per rank (predicted, measured), collectives and ring bytes
    per phase, and whether every output and gradient equals one device. No timings."""
    if not isinstance(run, SPComparison):
        raise ValueError(f"run must be an SPComparison (from compare); got {type(run).__name__}")
    c, t = run.cfg, run.tp_size
    lines = [f"block B={c['b']} T={c['s']} C={c['h']} F={c['ffn']} heads={c['n_heads']}, "
             f"{t} gloo ranks, fp32",
             f"{'saved for backward, per rank':<30}{'predicted':>10}{'measured':>10}"
             f"{'LayerNorm part':>16}"]
    words = {"one": "one device", "tp": "TP (LayerNorm replicated)", "sp": "TP + SP"}
    for m in ("one", *MODES):
        got = sorted(set(run.saved_bytes[m]))
        shown = f"{got[0]:,}" if len(got) == 1 else "/".join(f"{g:,}" for g in got)
        ln = _FP32 * layernorm_part(saved_terms(c["b"], c["s"], c["h"], c["ffn"], c["n_heads"],
                                                1 if m == "one" else t, m if m in MODES else "tp",
                                                run.regather))
        lines.append(f"{words[m]:<30}{run.predicted_bytes[m]:>10,}{shown:>10}{ln:>16,}")
    for phase in ("forward", "backward"):
        for m in MODES:
            s = comm_summary(run.comms[m], t).get(phase, {"ops": {}, "ring_bytes": 0.0})
            lines.append(f"{phase + ' ' + m.upper():<13}{_ops_words(s['ops']):<42}"
                         f"ring sends {s['ring_bytes']:>7,.0f} B")
    lines.append(f"outputs/grads equal to one device (seeds {list(run.seeds)}): {run.equal}")
    return "\n".join(lines)


# -------------------------------------------------------------------- the conjugates alone


def conjugate_worker(rank: int, world_size: int, seed: int,
                     shape: tuple = (2, 4, 3)) -> bytes:
    """One rank: push rank-specific x and dy through g and g-bar (x's dim 1 is the sequence:
    this rank's slice for g, the whole length for g-bar). Returns (pickled)
    {"<op>.x", "<op>.dy", "<op>.out", "<op>.grad", "<op>.comms"} for op in g, gbar."""
    dev = backend.device()
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    b, s, c = shape
    out: dict[str, Any] = {}
    for name, op, s_in, s_out in (("g", gather_from_sp, s, s * world_size),
                                  ("gbar", reduce_scatter_to_sp, s * world_size, s)):
        x = torch.randn(b, s_in, c, generator=gen).to(dev).requires_grad_(True)
        dy = torch.randn(b, s_out, c, generator=gen).to(dev)
        with record_comms() as comms:
            y = op(x)
            (y * dy).sum().backward()
        out |= {f"{name}.x": x.detach(), f"{name}.dy": dy, f"{name}.out": y.detach(),
                f"{name}.grad": x.grad, f"{name}.comms": [(e.op, e.phase) for e in comms]}
    return pickle.dumps(backend.to_cpu(out))


# ------------------------------------------------------------------------------------ torchrun


def demo(rank: int, world_size: int) -> float:
    """Each rank runs the TP+SP block on its tokens and checks them against one device."""
    seed, c = 0, tp._config({"s": 4 * world_size})
    _check_block_sizes(c, world_size)
    block, x, dy = _build(seed, c)
    ref = reference(seed, c)
    tokens = slice(*shard_range(c["s"], world_size, rank))
    dev = backend.device()
    ref = backend.to_device(ref, dev)
    par = SequenceParallelBlock(block).to(dev)
    x = x[:, tokens].clone().to(dev).requires_grad_(True)
    y = par(x)
    (y * dy[:, tokens].to(dev)).sum().backward()
    sync_sequence_parallel_grads(par)
    torch.testing.assert_close(y.detach(), ref["y"][:, tokens])
    torch.testing.assert_close(x.grad, ref["x.grad"][:, tokens])
    torch.testing.assert_close(par.ln1.weight.grad, ref["ln1.weight.grad"])
    return math.nan if y.numel() == 0 else float((y.detach() - ref["y"][:, tokens]).abs().max())


if __name__ == "__main__":
    from course_utils import launch

    launch.torchrun_main(demo)

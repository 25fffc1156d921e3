"""Llama-shaped transformers, built on the meta device: the models module 11 shards at scale.

A :class:`Shape` is a published configuration (vocabulary, hidden size, layers, feed-forward
size, attention and key/value heads). :func:`build` makes the part of it one pipeline stage
holds (:func:`stage_layers`, balanced as torchtitan and Llama 3 split: the first stage also
holds the embedding, the last the final norm and the output head) on the meta device (shapes,
no storage: 405B parameters cost nothing), and
:func:`apply_tp` shards a stage with ``parallelize_module`` under one of three plans
(:data:`TP_PLANS`), each Megatron's split (column-parallel q, k, v, w1, w3; row-parallel o,
w2; vocabulary-parallel embedding and head; RMSNorm weights replicated), differing in what a
layer's input is:

* ``"per_linear"``: each ``ColwiseParallel`` wraps its own plain input, so in backward each of
  q, k, v, w1, w3 all-reduces its input's gradient: 2 all-reduces forward and 5 backward per
  layer. The simplest plan to write, and the course's figures before this choice was named.
* ``"block"``: each norm's output becomes one replicated DTensor (``PrepareModuleOutput``,
  ``use_local_output=False``) that q, k, v (and w1, w3) share, so their input gradients add up
  as one partial DTensor and are all-reduced once: 2 forward and 2 backward per layer,
  Megatron's count (its "f" and "g" operators), with no fused linear.
* ``"sequence"``: torchtitan's ``apply_tp`` (sequence parallelism): between layers the
  activations are split along the sequence (``SequenceParallel`` norms, row-parallel outputs
  reduce-scattered to ``Shard(1)``), and each half-layer all-gathers its input once: 2
  all-gathers and 2 reduce-scatters forward per layer, the same backward (torchtitan puts the
  gather in ``PrepareModuleInput`` on its attention and feed-forward modules; these blocks have
  none, so the norm's output is redistributed, the same collectives).

Sources: Llama 2 7B and 70B (Touvron et al. 2023, Table 1 and the released ``params.json``:
70B uses 8 key/value heads), Llama 3 405B (Llama Team 2024, "The Llama 3 Herd of Models",
Table 3: 126 layers, hidden 16,384, FFN 53,248, 128 heads, 8 KV heads; the table rounds the
vocabulary to 128,000, the released configuration's is 128,256, used here).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_utils.runtime.validate import check_index, check_int, one_of

__all__ = ["Shape", "SHAPES", "shape", "param_count", "layer_params", "SPLITS", "stage_layers",
           "Block", "StageModel", "build", "TP_PLANS", "apply_tp"]

TP_PLANS = {"per_linear": "each linear all-reduces its own input gradient",
            "block": "one DTensor input per half-layer (Megatron's count)",
            "sequence": "sequence parallelism, as torchtitan's apply_tp"}


@dataclass(frozen=True)
class Shape:
    """A Llama-style decoder: sizes only."""

    name: str
    vocab: int
    hidden: int
    layers: int
    ffn: int
    heads: int
    kv_heads: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SHAPES = {s.name: s for s in (
    Shape("7B", 32000, 4096, 32, 11008, 32, 32),          # Llama 2 7B
    Shape("70B", 32000, 8192, 80, 28672, 64, 8),          # Llama 2 70B
    Shape("405B", 128256, 16384, 126, 53248, 128, 8),     # Llama 3 405B
    Shape("tiny", 100, 32, 4, 48, 4, 2),                  # real ranks on a laptop
)}


def shape(name: str | Shape) -> Shape:
    """Look a shape up by name (or pass a :class:`Shape` through)."""
    return name if isinstance(name, Shape) else one_of("model", name, SHAPES)


def layer_params(s: Shape) -> dict[str, int]:
    """Parameters of one decoder layer, by weight (no biases, as Llama)."""
    s = shape(s)
    kv = s.kv_heads * s.head_dim
    return {"attn_norm": s.hidden, "q": s.hidden * s.hidden, "k": kv * s.hidden,
            "v": kv * s.hidden, "o": s.hidden * s.hidden, "ffn_norm": s.hidden,
            "w1": s.ffn * s.hidden, "w3": s.ffn * s.hidden, "w2": s.hidden * s.ffn}


def param_count(s: Shape | str) -> int:
    """All parameters: embedding, layers, final norm, untied output head."""
    s = shape(s)
    return 2 * s.vocab * s.hidden + s.layers * sum(layer_params(s).values()) + s.hidden


SPLITS = {
    "balanced": "the embedding and the output (norm and head) weigh one layer each, as "
                "torchtitan's generate_llm_fqn_per_model_part and Llama 3 split",
    "even": "the layers alone, evenly, the first n % P stages one more",
}


def stage_layers(n_layers: int, pp: int, stage: int, split: str = "balanced") -> range:
    """The layers pipeline stage ``stage`` of ``pp`` holds, contiguous, under ``split``.

    ``"balanced"`` (the default): the ``n_layers + 2`` "effective layers" (the embedding and
    the output counted as one each) are split evenly, the first ``(n_layers + 2) % pp`` stages
    one more, then the first and the last stage give one back: torchtitan's
    ``generate_llm_fqn_per_model_part`` (weights 1 and 1), and Llama 3's "we reduce one
    Transformer layer each from the first and the last stages" (Llama Team 2024, 3.3.2).
    ``"even"``: the layers alone, evenly. ``torch.distributed.pipelining`` has no split policy
    of its own: the split is the caller's choice.
    """
    check_int("n_layers", n_layers, 1)
    check_int("pp", pp, 1)
    one_of("split", split, SPLITS)
    check_index("stage", stage, pp)
    if split == "even" or pp == 1:
        if pp > n_layers:
            raise ValueError(f"pp must be at most the number of layers ({n_layers}); got {pp}")
        counts = [n_layers // pp + (i < n_layers % pp) for i in range(pp)]
    else:
        if pp > n_layers + 2:
            raise ValueError(f"pp must be at most the number of layers + 2 ({n_layers + 2}) "
                             f"for the balanced split; got {pp}")
        base, extra = divmod(n_layers + 2, pp)
        counts = [base + (i < extra) - (i == 0) - (i == pp - 1) for i in range(pp)]
    start = sum(counts[:stage])
    return range(start, start + counts[stage])


class Block(nn.Module):
    """One Llama decoder layer (RMSNorm, grouped-query attention, SwiGLU); no rotary embedding
    (it has no parameters and sends nothing)."""

    def __init__(self, s: Shape):
        super().__init__()
        self.head_dim = s.head_dim
        kv = s.kv_heads * s.head_dim
        self.attn_norm = nn.RMSNorm(s.hidden)
        self.q = nn.Linear(s.hidden, s.hidden, bias=False)
        self.k = nn.Linear(s.hidden, kv, bias=False)
        self.v = nn.Linear(s.hidden, kv, bias=False)
        self.o = nn.Linear(s.hidden, s.hidden, bias=False)
        self.ffn_norm = nn.RMSNorm(s.hidden)
        self.w1 = nn.Linear(s.hidden, s.ffn, bias=False)
        self.w3 = nn.Linear(s.hidden, s.ffn, bias=False)
        self.w2 = nn.Linear(s.ffn, s.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attn_norm(x)
        q, k, v = (lin(h) for lin in (self.q, self.k, self.v))
        b, t = q.shape[:2]              # the whole sequence (x holds a slice of it under SP)
        q, k, v = (z.view(b, t, -1, self.head_dim).transpose(1, 2)
                   for z in (q, k, v))                     # -1: the heads this TP rank holds
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class StageModel(nn.Module):
    """The layers of one pipeline stage; the embedding on the first, norm and head on the last."""

    def __init__(self, s: Shape, layers: range, first: bool, last: bool):
        super().__init__()
        self.embed = nn.Embedding(s.vocab, s.hidden) if first else None
        self.layers = nn.ModuleList(Block(s) for _ in layers)
        self.norm = nn.RMSNorm(s.hidden) if last else None
        self.head = nn.Linear(s.hidden, s.vocab, bias=False) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


def build(s: Shape | str, pp: int = 1, stage: int = 0, n_layers: int | None = None,
          device: torch.device | str = "meta", split: str = "balanced") -> StageModel:
    """Stage ``stage`` of ``pp`` of model ``s`` under ``split`` (:data:`SPLITS`; ``n_layers``
    overrides how many layers that stage gets: a trace of 1 or 2 layers stands for all of
    them, they are identical)."""
    s = shape(s)
    layers = stage_layers(s.layers, pp, stage, split)
    if n_layers is not None:
        layers = range(n_layers)
    with torch.device(device):
        return StageModel(s, layers, first=stage == 0, last=stage == pp - 1)


def apply_tp(module: StageModel, tp_mesh, plan: str = "per_linear") -> None:
    """Shard ``module`` over the 1-D mesh ``tp_mesh`` with ``parallelize_module`` under
    ``plan`` (one of :data:`TP_PLANS`, see the module docstring)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleOutput,
                                                   RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    one_of("plan", plan, TP_PLANS)
    sp = plan == "sequence"
    between = Shard(1) if sp else Replicate()      # the activations between layers
    layer = {name: ColwiseParallel() for name in ("q", "k", "v", "w1", "w3")}
    layer.update({name: RowwiseParallel(output_layouts=between) for name in ("o", "w2")})
    ends = {"embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=between),
            "head": ColwiseParallel(input_layouts=between)}   # logits split by vocabulary
    if sp:
        layer.update(attn_norm=SequenceParallel(), ffn_norm=SequenceParallel())
        ends["norm"] = SequenceParallel()
    parallelize_module(module, tp_mesh,
                       {k: v for k, v in ends.items() if getattr(module, k) is not None})
    for block in module.layers:
        parallelize_module(block, tp_mesh, layer)
        if plan != "per_linear":                   # one shared DTensor input per half-layer
            for norm in (block.attn_norm, block.ffn_norm):
                parallelize_module(norm, tp_mesh, PrepareModuleOutput(
                    output_layouts=between, desired_output_layouts=Replicate(),
                    use_local_output=False))

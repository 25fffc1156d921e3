"""The single-device side: the layers tensor parallelism splits, and their results from a seed.

:class:`MLP` (up, GELU, down) and :class:`Attention` (causal, separate q, k, v, o) are what the
tensor-parallel layers of :mod:`course_utils.tensor_parallel.layers` shard; :func:`build_layer`
makes a layer of a :data:`KINDS` kind with its input and upstream gradient from a seed, and
:func:`reference` runs it forward and backward on one device: what every comparison
(:mod:`course_utils.tensor_parallel.comparison`) checks the ranks against. :func:`layer_config`
and :func:`check_split` check the sizes. Serves lecture 4 (and lecture 9's block).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_utils.models.toy import seeded
from course_utils.runtime.validate import check_int

__all__ = ["MLP", "Attention", "attend", "KINDS", "DEFAULTS", "layer_config", "build_layer",
           "check_split", "reference"]


class MLP(nn.Module):
    """Single-device transformer MLP: up (h -> ffn), GELU, down (ffn -> h)."""

    def __init__(self, h: int, ffn: int):
        super().__init__()
        check_int("h", h)
        check_int("ffn", ffn)
        self.up = nn.Linear(h, ffn)
        self.act = nn.GELU()
        self.down = nn.Linear(ffn, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))  # (..., h) -> (..., ffn) -> (..., h)


class Attention(nn.Module):
    """Single-device causal multi-head self-attention with separate q, k, v, o projections."""

    def __init__(self, h: int, n_heads: int):
        super().__init__()
        check_int("h", h)
        check_int("n_heads", n_heads)
        if h % n_heads:
            raise ValueError(f"h = {h} must be divisible by n_heads = {n_heads}")
        self.n_heads = n_heads
        self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return attend(x, self.q(x), self.k(x), self.v(x), self.n_heads, self.o)



def attend(x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_heads: int,
           out_proj: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Causal attention of q, k, v (b, s, width) split into ``n_heads`` heads, then
    ``out_proj``: (b, s, width) -> (b, s, h)."""
    b, s, _ = x.shape
    width = q.shape[-1]  # n_heads * head_dim
    q, k, v = (t.reshape(b, s, n_heads, width // n_heads).transpose(1, 2) for t in (q, k, v))
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, n_heads, s, head_dim)
    return out_proj(a.transpose(1, 2).reshape(b, s, width))     # (b, s, width) -> (b, s, h)


KINDS = ("column", "row", "mlp", "attention", "dtensor_mlp")
DEFAULTS = {"b": 2, "s": 4, "h": 16, "ffn": 32, "n_heads": 4}
"""The sizes every comparison uses unless told: batch, sequence, hidden, MLP width, heads."""


def layer_config(cfg: dict | None) -> dict:
    """:data:`DEFAULTS` updated by ``cfg`` (b, s, h, ffn, n_heads: positive ints)."""
    out = dict(DEFAULTS)
    for key, value in (cfg or {}).items():
        if key not in DEFAULTS:
            raise ValueError(f"unknown config key {key!r}; allowed: {sorted(DEFAULTS)}")
        out[key] = check_int(key, value)
    return out


def build_layer(kind: str, seed: int, c: dict) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The single-device layer, its input x and an upstream gradient dy, all from ``seed``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    with seeded(seed):
        if kind == "column":
            model, h_in, h_out = nn.Linear(c["h"], c["ffn"]), c["h"], c["ffn"]
        elif kind == "row":
            model, h_in, h_out = nn.Linear(c["ffn"], c["h"]), c["ffn"], c["h"]
        elif kind in ("mlp", "dtensor_mlp"):
            model, h_in, h_out = MLP(c["h"], c["ffn"]), c["h"], c["h"]
        else:
            model, h_in, h_out = Attention(c["h"], c["n_heads"]), c["h"], c["h"]
    gen = torch.Generator().manual_seed(10_000 + seed)
    x = torch.randn(c["b"], c["s"], h_in, generator=gen)     # (b, s, h_in)
    dy = torch.randn(c["b"], c["s"], h_out, generator=gen)   # (b, s, h_out): dL/dY
    return model, x, dy


def check_split(kind: str, c: dict, tp_size: int) -> None:
    """The dimension ``kind`` splits must divide by ``tp_size`` (whole heads for attention)."""
    if kind == "attention":
        if c["h"] % c["n_heads"]:
            raise ValueError(f"h = {c['h']} must be divisible by n_heads = {c['n_heads']}")
        if c["n_heads"] % tp_size:
            raise ValueError(f"n_heads = {c['n_heads']} must be divisible by tp_size = {tp_size}")
    elif c["ffn"] % tp_size:
        raise ValueError(f"ffn = {c['ffn']} (the split dimension) must be divisible by "
                         f"tp_size = {tp_size}")


def reference(kind: str, seed: int, cfg: dict | None = None) -> dict[str, torch.Tensor]:
    """Output and every gradient of the single-device layer (loss = sum(y * dy)).

    Weight gradients are in the ``nn.Linear`` layout (h_out, h_in);
    :func:`~course_utils.tensor_parallel.comparison.compare` transposes them to the ``Y = X W``
    layout for the from-scratch layers.
    """
    c = layer_config(cfg)
    model, x, dy = build_layer(kind, seed, c)
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

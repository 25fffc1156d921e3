"""A tiny causal transformer language model and the text it learns, made locally (no download).

The text comes from a random *Markov chain* over a small vocabulary: each token has a few likely
successors. A model that learns the chain predicts the next token with cross-entropy equal to
the chain's entropy rate (:meth:`MarkovCorpus.entropy_rate`), a floor the loss cannot beat;
a model that knows nothing scores ``ln(vocab_size)``. Batches are a pure function of
``(seed, step)``, so every data-parallel rank can build the same global batch and keep its own
slice (:func:`shard_batch`) without any data files.

The model (:class:`TinyLM`) is GPT-shaped: token + position embeddings, ``n_layers`` pre-norm
blocks (causal self-attention, then an MLP), a final LayerNorm and a linear head. The default
:class:`TinyLMConfig` has 110,400 parameters (:func:`count_params`), small enough to train a few
steps on two CPU ranks in well under a second per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.models.toy import seeded
from course_utils.runtime.validate import check_index, check_int

__all__ = ["TinyLMConfig", "TinyLM", "MarkovCorpus", "count_params", "predicted_param_count",
           "lm_loss", "shard_batch", "build", "uniform_loss"]


@dataclass(frozen=True)
class TinyLMConfig:
    """Sizes of :class:`TinyLM` (all counts, no units)."""

    vocab_size: int = 64
    seq_len: int = 32
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 256

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "d_model", "n_heads", "n_layers", "d_ff"):
            check_int(name, getattr(self, name), 2 if name == "vocab_size" else 1)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model must be divisible by n_heads; got d_model={self.d_model}, "
                             f"n_heads={self.n_heads}")


class _Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: TinyLMConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape                                        # (B, T, D)
        h = self.n_heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)          # 3 x (B, T, D)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))  # (B, H, T, D/H)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)              # (B, H, T, D/H)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))                    # (B, T, D)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))                      # (B, T, D)


class TinyLM(nn.Module):
    """GPT-shaped causal language model: token ids (B, T) -> next-token logits (B, T, V)."""

    def __init__(self, cfg: TinyLMConfig | None = None):
        super().__init__()
        cfg = cfg or TinyLMConfig()
        if not isinstance(cfg, TinyLMConfig):
            raise ValueError(f"cfg must be a TinyLMConfig; got {type(cfg).__name__}")
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"tokens must be a (batch, seq) int64 tensor; got shape "
                             f"{tuple(tokens.shape)} dtype {tokens.dtype}")
        b, t = tokens.shape
        if t > self.cfg.seq_len:
            raise ValueError(f"sequence length {t} exceeds cfg.seq_len={self.cfg.seq_len}")
        x = self.tok(tokens) + self.pos(torch.arange(t, device=tokens.device))  # (B, T, D)
        for block in self.blocks:
            x = block(x)                                                        # (B, T, D)
        return self.head(self.ln_f(x))                                          # (B, T, V)


def count_params(model: nn.Module) -> int:
    """Number of parameter elements (each shared tensor counted once)."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    return sum(p.numel() for p in model.parameters())


def predicted_param_count(cfg: TinyLMConfig) -> int:
    """Parameter count of :class:`TinyLM` from its sizes alone (the pen-and-paper figure)."""
    if not isinstance(cfg, TinyLMConfig):
        raise ValueError(f"cfg must be a TinyLMConfig; got {type(cfg).__name__}")
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    per_block = (2 * d) + (d * 3 * d + 3 * d) + (d * d + d) + (2 * d) + (d * f + f) + (f * d + d)
    return v * d + cfg.seq_len * d + cfg.n_layers * per_block + 2 * d + (d * v + v)


def lm_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats/token) of ``model`` on (B, T) inputs and targets."""
    if inputs.shape != targets.shape:
        raise ValueError(f"inputs and targets must have the same shape; got "
                         f"{tuple(inputs.shape)} and {tuple(targets.shape)}")
    logits = model(inputs)                                                      # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class MarkovCorpus:
    """Text from a random Markov chain: each token has ``n_successors`` likely next tokens.

    The transition table is drawn once from ``seed``; :meth:`batch` draws sequences from it.
    """

    def __init__(self, vocab_size: int = 64, n_successors: int = 4, seed: int = 0):
        check_int("vocab_size", vocab_size, 2)
        if (isinstance(n_successors, bool) or not isinstance(n_successors, int)
                or not 1 <= n_successors <= vocab_size):
            raise ValueError(f"n_successors must be an int from 1 to vocab_size={vocab_size}; "
                             f"got {n_successors!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int; got {seed!r}")
        self.vocab_size, self.n_successors, self.seed = vocab_size, n_successors, seed
        g = torch.Generator().manual_seed(seed)
        probs = torch.zeros(vocab_size, vocab_size, dtype=torch.float64)        # (V, V)
        for token in range(vocab_size):
            nxt = torch.randperm(vocab_size, generator=g)[:n_successors]
            weights = torch.rand(n_successors, generator=g, dtype=torch.float64) + 0.5
            probs[token, nxt] = weights / weights.sum()
        self.transition = probs                               # row i: P(next | current = i)
        self._cdf = probs.cumsum(dim=1)                       # (V, V), last column = 1
        self._cdf[:, -1] = 1.0

    def stationary(self) -> torch.Tensor:
        """Stationary distribution pi of the chain, shape (V,), pi @ P = pi."""
        pi = torch.full((self.vocab_size,), 1.0 / self.vocab_size, dtype=torch.float64)
        for _ in range(2000):  # power iteration; a random sparse chain mixes quickly
            pi = pi @ self.transition
        return pi / pi.sum()

    def entropy_rate(self) -> float:
        """Best achievable next-token loss in nats: sum_i pi_i H(P[i, :])."""
        p = self.transition
        row_entropy = -(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum(dim=1)  # (V,)
        return float(self.stationary() @ row_entropy)

    def batch(self, step: int, batch_size: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The global batch for ``step``: (inputs, targets), each (batch_size, seq_len) int64."""
        for name, value, low in (("step", step, 0), ("batch_size", batch_size, 1),
                                 ("seq_len", seq_len, 1)):
            check_int(name, value, low)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        tokens = torch.empty(batch_size, seq_len + 1, dtype=torch.long)         # (B, T+1)
        tokens[:, 0] = torch.randint(self.vocab_size, (batch_size,), generator=g)
        u = torch.rand(seq_len, batch_size, 1, generator=g, dtype=torch.float64)  # (T, B, 1)
        for t in range(seq_len):  # inverse-CDF sampling of each next token, all rows at once
            cdf = self._cdf[tokens[:, t]]                                      # (B, V)
            nxt = torch.searchsorted(cdf, u[t], right=True)  # (B, 1): first cdf > u
            tokens[:, t + 1] = nxt.squeeze(1).clamp_(max=self.vocab_size - 1)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def shard_batch(x: torch.Tensor, dp_rank: int, dp_size: int) -> torch.Tensor:
    """Rows of the global batch ``x`` (B, ...) that ``dp_rank`` of ``dp_size`` owns:
    (B/dp_size, ...)."""
    check_int("dp_size", dp_size)
    check_index("dp_rank", dp_rank, dp_size)
    if x.shape[0] % dp_size:
        raise ValueError(f"the global batch ({x.shape[0]} rows) must divide evenly over "
                         f"dp_size={dp_size} ranks")
    per = x.shape[0] // dp_size
    return x[dp_rank * per:(dp_rank + 1) * per]


def build(cfg: TinyLMConfig | None = None, seed: int = 0) -> TinyLM:
    """A :class:`TinyLM` whose initial weights depend only on ``seed`` (same on every rank;
    :func:`course_utils.models.toy.seeded`)."""
    with seeded(seed):
        return TinyLM(cfg)


def uniform_loss(cfg: TinyLMConfig) -> float:
    """Loss of a model that knows nothing: ln(vocab_size) nats/token."""
    return math.log(cfg.vocab_size)

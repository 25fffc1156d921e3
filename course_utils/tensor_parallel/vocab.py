"""Vocabulary parallelism: the embedding, the head and the loss split by token id over TP ranks.

TP rank r of t holds the rows ``[r*V/t, (r+1)*V/t)`` of the token embedding and the same
output features of the head (Megatron-LM's ``VocabParallelEmbedding`` and column-parallel
output layer; picotron's ``VocabParallelEmbedding``; torchtitan's ``tok_embeddings`` and
``lm_head`` with weight ``Shard(0)`` in ``torchtitan/models/common/decoder_sharding.py``,
``set_decoder_sharding_config``). Nothing of size V is ever whole on a rank:

* :class:`VocabParallelEmbedding`: each rank looks up the ids it holds and writes zeros for the
  others; the sum over the TP group (an all-reduce, or with sequence parallelism a
  reduce-scatter along the sequence, which also leaves each rank its own tokens) is the lookup.
* :func:`vocab_parallel_cross_entropy`: the head's logits stay split, (N, V/t) per rank, and
  the cross-entropy is computed from three numbers per token and rank, never from the (N, V)
  logits: this rank's largest logit m_r, its sum of exp(z - m_r), and the target's logit if
  this rank holds it. Megatron-LM and torchtitan's ``_LossParallelCrossEntropy``
  (``torchtitan/components/loss.py``: "three TP all-reduces (max, sumexp, gather)") reduce
  them with three all-reduces; here one all-gather brings every rank's three numbers, and each
  rank combines them (the largest m_r is the row's maximum; each sum is rescaled by
  exp(m_r - max) before adding), one collective instead of three. Backward needs none
  (softmax minus one-hot, on this rank's columns). DTensor's ``loss_parallel()`` is the
  library form.

:func:`check_worker` compares both with one process (``nn.Embedding``, ``F.cross_entropy``) on
real ranks. Serves lecture 10 (the 3D trainer's split vocabulary; tensor parallelism is lecture
4's). Run it under torchrun (each rank prints its largest difference)::

    torchrun --standalone --nproc-per-node 2 -m course_utils.tensor_parallel.vocab
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_utils.runtime import backend
from course_utils.tensor_parallel.comms import all_gather_cat
from course_utils.tensor_parallel.conjugates import reduce_from_tp, reduce_scatter_to_sp
from course_utils.tensor_parallel.sharding import shard_range

__all__ = ["VocabParallelEmbedding", "VocabParallelCrossEntropy", "vocab_parallel_cross_entropy",
           "check_worker"]


def _tp_place(tp_group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(tp_rank, tp_size) of this process in ``tp_group`` (0, 1 without a process group)."""
    if not dist.is_initialized():
        return 0, 1
    return dist.get_rank(tp_group), dist.get_world_size(tp_group)


class VocabParallelEmbedding(nn.Module):
    """This rank's rows of a (V, D) token embedding: ids (B, T) in; (B, T, D) out, or with
    ``sp`` this rank's tokens (B, T/t, D)."""

    def __init__(self, vocab_size: int, dim: int, tp_group: dist.ProcessGroup | None = None,
                 tp_rank: int = 0, tp_size: int = 1, sp: bool = False):
        super().__init__()
        self.start, self.stop = shard_range(vocab_size, tp_size, tp_rank)
        self.weight = nn.Parameter(torch.empty(self.stop - self.start, dim))   # (V/t, D)
        self.tp_group, self.tp_size, self.sp = tp_group, tp_size, sp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start                                             # (B, T)
        mine = (local >= 0) & (local < self.weight.shape[0])
        rows = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight)  # (B, T, D)
        rows = rows * mine.unsqueeze(-1).to(rows.dtype)     # zeros for the ids other ranks hold
        if self.tp_size == 1:
            return rows
        if self.sp:
            return reduce_scatter_to_sp(rows, self.tp_group)                  # (B, T/t, D)
        return reduce_from_tp(rows, self.tp_group)                            # (B, T, D)


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy from this rank's (N, V/t) logits; one TP all-gather forward."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, start: int,
                tp_group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.dtype = logits.dtype
        z = logits.float()                                  # (N, V/t): fp32, as torchtitan does
        local_max = z.max(dim=-1).values                    # (N,)
        local_sum = (z - local_max.unsqueeze(-1)).exp().sum(-1)   # (N,) sum of exp(z - m_r)
        local = targets - start
        mine = (local >= 0) & (local < z.shape[-1])         # this rank holds the target's column
        col = local.clamp(0, z.shape[-1] - 1)
        picked = z.gather(1, col.unsqueeze(1)).squeeze(1) * mine               # (N,)
        stats = torch.stack([local_max, local_sum, picked])                  # (3, N)
        every = all_gather_cat(stats, tp_group, "forward", dim=0).view(-1, 3, z.shape[0])
        row_max = every[:, 0].max(dim=0).values                              # (N,) over all V
        sum_exp = (every[:, 1] * (every[:, 0] - row_max).exp()).sum(0)       # (N,)
        ctx.save_for_backward((z - row_max.unsqueeze(-1)).exp() / sum_exp.unsqueeze(-1), col,
                              mine)
        return row_max + sum_exp.log() - every[:, 2].sum(0)  # (N,) logsumexp - z[target]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        softmax, col, mine = ctx.saved_tensors              # (N, V/t), (N,), (N,)
        g = softmax.clone()
        g[torch.arange(g.shape[0], device=g.device), col] -= mine.to(g.dtype)
        return (g * grad.unsqueeze(-1)).to(ctx.dtype), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                                 tp_group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Cross-entropy of every token, (N,), from this rank's columns of the logits.

    ``logits``: (N, V/t), TP rank r's columns ``[r*V/t, (r+1)*V/t)``; ``targets``: (N,) token
    ids in [0, V). Equals ``F.cross_entropy(full_logits, targets, reduction="none")`` on every
    rank of the group.
    """
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"logits must be (N, V/t) and targets (N,); got "
                         f"{tuple(logits.shape)} and {tuple(targets.shape)}")
    tp_rank, tp_size = _tp_place(tp_group)
    start, _ = shard_range(logits.shape[-1] * tp_size, tp_size, tp_rank)
    return VocabParallelCrossEntropy.apply(logits, targets, start, tp_group)


def check_worker(rank: int, world_size: int, seed: int, vocab: int = 12, dim: int = 4,
                 tokens: int = 8) -> dict[str, float]:
    """Worker: the split embedding and loss against ``nn.Embedding`` + ``F.cross_entropy`` on
    one process (the same seeded tensors on every rank); the largest differences of the
    embedding output, the loss, and the gradients of the table and the logits."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(vocab, dim, generator=gen)                            # (V, D)
    ids = torch.randint(0, vocab, (2, tokens), generator=gen)                  # (B, T)
    logits = torch.randn(2 * tokens, vocab, generator=gen) * 3                 # (N, V)
    upstream = torch.randn(2, tokens, dim, generator=gen)                      # dL/d(embedding)
    ref_table = table.clone().requires_grad_(True)
    ref_logits = logits.clone().requires_grad_(True)
    ref_emb = F.embedding(ids, ref_table)
    (ref_emb * upstream).sum().backward()
    ref_loss = F.cross_entropy(ref_logits, ids.flatten(), reduction="none")
    ref_loss.sum().backward()
    dev = backend.device()
    emb = VocabParallelEmbedding(vocab, dim, None, rank, world_size).to(dev)
    cols = slice(emb.start, emb.stop)
    with torch.no_grad():
        emb.weight.copy_(table[cols])
    out = emb(ids.to(dev))
    (out * upstream.to(dev)).sum().backward()
    mine = logits[:, cols].clone().to(dev).requires_grad_(True)
    loss = vocab_parallel_cross_entropy(mine, ids.flatten().to(dev))
    loss.sum().backward()
    diff = lambda a, b: float((backend.to_cpu(a.detach()) - b.detach()).abs().max())  # noqa: E731
    return {"embedding": diff(out, ref_emb), "table grad": diff(emb.weight.grad,
                                                                 ref_table.grad[cols]),
            "loss": diff(loss, ref_loss), "logits grad": diff(mine.grad, ref_logits.grad[:, cols])}


def _torchrun_worker(rank: int, world_size: int) -> Any:
    return max(check_worker(rank, world_size, seed=0).values())


if __name__ == "__main__":
    from course_utils import launch

    launch.torchrun_main(_torchrun_worker)

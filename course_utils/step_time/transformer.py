"""A transformer's training step on a TP x CP x PP x DP mesh, predicted term by term (lecture 13).

:class:`Arch` is the model (a Llama-style or GPT-style decoder), :class:`Job` the plan (mesh
degrees, batch, schedule, recomputation, how data parallelism shards), :func:`predict` the step
on a :class:`~course_utils.step_time.hardware.Hardware`. Each term states its assumption where
it is computed:

* **compute**: every matmul of a microbatch through the rank's stage at its roofline
  (:func:`~course_utils.step_time.hardware.matmul_s`, the *achieved* rate); backward is twice
  forward (the input's gradient and the weight's), full recomputation adds a forward; the
  stages are equal (the layers and the head spread evenly: Llama 3 gives the end stages a layer
  fewer for this); elementwise work, softmax and norms are left out;
* **tp**: per layer and microbatch two collectives forward and two backward (Megatron's f and
  g; an all-gather and a reduce-scatter under sequence parallelism send the same bytes) of the
  microbatch's activation on the node's link, and under CP the keys' and values' all-gather
  forward and reduce-scatter backward (Llama 3's all-gather CP, section 3.3.2); none overlaps;
* **bubble**: the schedule played out with those times
  (:func:`course_utils.pipeline.schedule.simulate`), with one activation's send between stages;
* **dp_exposed**: the gradients' reduce-scatter (hidden behind the last microbatch's backward)
  and the weights' all-gather (behind the first forward when prefetched) of the rank's share
  of the weights, once per step, over DP on the network;
* **optimizer**: AdamW on the rank's shard, memory-bound: ``optimizer_bytes`` per parameter.

Every figure in seconds; the ring costs are :mod:`course_utils.collectives.cost`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from course_utils.collectives.cost import ring_time_s
from course_utils.models import llama_shapes
from course_utils.runtime import validate
from course_utils.step_time.hardware import Hardware, Link, matmul_flops, matmul_s
from course_utils.step_time.terms import StepTerms, assemble

__all__ = ["Arch", "Job", "FLOP_COUNTS", "matmul_params", "param_count", "flops_per_token",
           "predict", "Prediction"]


@dataclass(frozen=True)
class Arch:
    """A decoder's sizes: ``gated`` MLPs (SwiGLU: three ffn x hidden matrices) or two (GPT)."""

    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    gated: bool = True

    def __post_init__(self) -> None:
        for n in ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab"):
            validate.check_int(n, getattr(self, n))
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"heads must divide hidden and kv_heads must divide heads; got "
                             f"hidden={self.hidden}, heads={self.heads}, "
                             f"kv_heads={self.kv_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def llama(cls, name: str) -> "Arch":
        """One of :data:`course_utils.models.llama_shapes.SHAPES` (``"7B"``, ``"70B"``,
        ``"405B"``, ...)."""
        s = llama_shapes.shape(name)
        return cls(f"Llama {s.name}", s.layers, s.hidden, s.ffn, s.heads, s.kv_heads, s.vocab)

    @classmethod
    def gpt(cls, name: str, layers: int, hidden: int, heads: int, vocab: int) -> "Arch":
        """A GPT-style decoder: ffn = 4 hidden, two MLP matrices, every head its own keys."""
        return cls(name, layers, hidden, 4 * hidden, heads, heads, vocab, gated=False)


def _layer_matmuls(a: Arch, n: int, tp: int) -> list[tuple[int, int, int]]:
    """(m, k, n) of one layer's weight matmuls, forward, on one TP rank, for ``n`` tokens."""
    kv = a.kv_heads * a.head_dim
    mlp = [(n, a.hidden, a.ffn // tp)] * (3 if a.gated else 2)
    if a.gated:
        mlp[-1] = (n, a.ffn // tp, a.hidden)
    else:
        mlp[1] = (n, a.ffn // tp, a.hidden)
    return [(n, a.hidden, a.hidden // tp), (n, a.hidden, kv // tp), (n, a.hidden, kv // tp),
            (n, a.hidden // tp, a.hidden)] + mlp


def matmul_params(a: Arch) -> int:
    """Weights that multiply activations: every layer's projections and MLP, and the head (the
    embedding is a lookup: no FLOPs)."""
    return a.layers * sum(k * n for _, k, n in _layer_matmuls(a, 1, 1)) + a.vocab * a.hidden


def param_count(a: Arch) -> int:
    """All parameters: :func:`matmul_params`, the embedding and the norms (2 a layer, 1 final)."""
    return matmul_params(a) + a.vocab * a.hidden + (2 * a.layers + 1) * a.hidden


FLOP_COUNTS = ("6N", "attention", "megatron")
"""How a paper counts a token's training FLOPs (:func:`flops_per_token`)."""


def flops_per_token(a: Arch, seq: int, count: str = "attention") -> float:
    """Training FLOPs per token, as a paper counts them for MFU:

    * ``"6N"``: 6 x every parameter (Kaplan et al. 2020; no attention scores);
    * ``"attention"``: 6 x the matmul weights plus the attention scores and their use, 12 L s h
      (every score of the s x s matrix, PaLM's count: Chowdhery et al. 2022, appendix B);
    * ``"megatron"``: Narayanan et al. 2021, equation 3, per token: 96 L h^2 (1 + s / (6h) +
      V / (16 L h)), which counts a full recomputation's forward too (4 passes, not 3).
    """
    validate.one_of("count", count, FLOP_COUNTS)
    validate.check_int("seq", seq)
    if count == "6N":
        return 6.0 * param_count(a)
    if count == "megatron":
        L, h = a.layers, a.hidden
        return 96.0 * L * h * h * (1 + seq / (6 * h) + a.vocab / (16 * L * h))
    return 6.0 * matmul_params(a) + 12.0 * a.layers * seq * a.hidden


@dataclass(frozen=True)
class Job:
    """A plan: mesh degrees, ``global_batch`` sequences of ``seq`` tokens a step in microbatches
    of ``micro_batch`` sequences, the pipeline ``schedule`` (``v`` chunks a rank when
    interleaved), ``recompute`` ("none" or "full"), bytes a gradient is reduced in and a weight
    gathered in, bytes AdamW touches per parameter (fp32 weight, gradient, two moments read,
    three written, a bf16 copy: 30), whether the weights' all-gather is prefetched behind
    compute (FSDP) or waits (ZeRO-1 after its optimizer step), and whether the weights are
    gathered again for backward (``reshard``: FSDP's ``reshard_after_forward``)."""

    arch: Arch
    tp: int
    pp: int
    dp: int
    global_batch: int
    seq: int
    cp: int = 1
    micro_batch: int = 1
    schedule: str = "1f1b"
    v: int = 1
    recompute: str = "none"
    grad_bytes: int = 4
    param_bytes: int = 2
    optimizer_bytes: int = 30
    prefetch: bool = True
    reshard: bool = False

    def __post_init__(self) -> None:
        for n in ("tp", "pp", "dp", "global_batch", "seq", "cp", "micro_batch", "v",
                  "grad_bytes", "param_bytes", "optimizer_bytes"):
            validate.check_int(n, getattr(self, n))
        validate.one_of("recompute", self.recompute, ("none", "full"))
        validate.check_bool("prefetch", self.prefetch)
        validate.check_bool("reshard", self.reshard)
        if self.global_batch % (self.dp * self.micro_batch):
            raise ValueError(f"global_batch={self.global_batch} must split into dp={self.dp} "
                             f"replicas of microbatches of micro_batch={self.micro_batch}")
        a = self.arch
        for what, n in (("heads", a.heads), ("kv_heads", a.kv_heads), ("ffn", a.ffn)):
            if n % self.tp:
                raise ValueError(f"tp={self.tp} must divide the model's {what} ({n})")
        if self.seq % self.cp:
            raise ValueError(f"cp={self.cp} must divide seq={self.seq}")
        if self.pp > a.layers:
            raise ValueError(f"pp={self.pp} must be at most the model's layers ({a.layers})")

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def m(self) -> int:
        """Microbatches per DP replica per step."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def tokens(self) -> int:
        return self.global_batch * self.seq

    def but(self, **changes: Any) -> "Job":
        return replace(self, **changes)


@dataclass(frozen=True)
class Prediction:
    """A job's predicted step: its terms, and the throughput and MFU they give."""

    job: Job
    hw: Hardware
    terms: StepTerms
    parts: dict[str, float]

    @property
    def step_s(self) -> float:
        return self.terms.total

    def tflops_per_gpu(self, count: str = "attention") -> float:
        """Model FLOP/s per GPU, in TFLOP/s, with the paper's FLOP ``count``."""
        j = self.job
        return flops_per_token(j.arch, j.seq, count) * j.tokens / (self.step_s * j.gpus) / 1e12

    def mfu(self, count: str = "attention") -> float:
        """Model FLOPs utilization: :meth:`tflops_per_gpu` over the datasheet peak."""
        return self.tflops_per_gpu(count) * 1e12 / self.hw.peak_flops

    def tokens_per_s_per_gpu(self) -> float:
        return self.job.tokens / self.step_s / self.job.gpus


def _link(hw: Hardware, ranks_inside: int) -> Link:
    """The node's link when a group of ``ranks_inside`` consecutive ranks fits in a node."""
    return hw.intra if ranks_inside <= hw.gpus_per_node else hw.inter


def predict(job: Job, hw: Hardware) -> Prediction:
    """The step of ``job`` on ``hw``: :class:`Prediction` (terms in seconds, see the module's
    docstring for each term's assumption). Ranks are laid out TP innermost, then CP, PP, DP
    (Llama 3's order): TP stays in a node while ``tp <= gpus_per_node``."""
    if not isinstance(job, Job):
        raise ValueError(f"job must be a step_time.transformer.Job; got {type(job).__name__}")
    if not isinstance(hw, Hardware):
        raise ValueError(f"hw must be a step_time.hardware.Hardware; got {type(hw).__name__}")
    a, tp, cp, pp = job.arch, job.tp, job.cp, job.pp
    n = job.micro_batch * job.seq // cp                       # a microbatch's tokens on a rank
    layer = sum(matmul_s(*mm, hw) for mm in _layer_matmuls(a, n, tp))
    # attention: q k^T and the weighted values, every score (PaLM's count), heads / tp of them
    layer += 2 * matmul_flops(n, a.head_dim, job.seq) * (a.heads // tp) / hw.achieved_flops
    head = matmul_s(n, a.hidden, a.vocab // tp, hw)
    forward = (a.layers * layer + head) / pp                   # equal stages
    backward = 2 * forward + (forward if job.recompute == "full" else 0.0)
    per_stage = a.layers / pp
    tp_link, cp_link = _link(hw, tp), _link(hw, tp * cp)
    act = n * a.hidden * 2                                     # bf16 activation of a microbatch
    # (a group of one sends nothing: ring_time_s is 0 for TP, CP or DP of 1)
    tp_one = ring_time_s(act, tp, tp_link.alpha_s, tp_link.bytes_per_s)
    kv = job.micro_batch * job.seq * 2 * a.kv_heads * a.head_dim // tp * 2   # K and V, bf16
    cp_f = ring_time_s(kv, cp, cp_link.alpha_s, cp_link.bytes_per_s, "all_gather")
    cp_b = ring_time_s(kv, cp, cp_link.alpha_s, cp_link.bytes_per_s, "reduce_scatter")
    tp_forward = per_stage * (2 * tp_one + cp_f)
    tp_backward = per_stage * (2 * tp_one + cp_b)
    p2p_link = _link(hw, tp * cp * pp) if pp > 1 else hw.intra
    p2p = p2p_link.alpha_s + act / p2p_link.bytes_per_s
    shard = param_count(a) / (tp * pp)                         # the rank's share of the weights
    dp_link = _link(hw, job.gpus)
    rs = ring_time_s(shard * job.grad_bytes, job.dp, dp_link.alpha_s, dp_link.bytes_per_s,
                     "reduce_scatter")
    ag = ring_time_s(shard * job.param_bytes, job.dp, dp_link.alpha_s, dp_link.bytes_per_s,
                     "all_gather")
    dp = [(rs, backward), (ag, forward if job.prefetch else 0.0)]
    if job.reshard:                    # gathered again before backward, behind the backward
        dp.append((ag, backward))
    optimizer = shard / job.dp * job.optimizer_bytes / hw.mem_bytes_per_s
    terms = assemble(pp=pp, m=job.m, forward_s=forward, backward_s=backward,
                     tp_forward_s=tp_forward, tp_backward_s=tp_backward, p2p_s=p2p,
                     schedule=job.schedule, v=job.v if job.schedule == "interleaved" else None,
                     dp=tuple(dp), optimizer_s=optimizer)
    parts = {"forward_s": forward, "backward_s": backward, "tp_per_collective_s": tp_one,
             "p2p_s": p2p, "dp_reduce_scatter_s": rs, "dp_all_gather_s": ag,
             "microbatches": job.m, "tokens_per_microbatch": n}
    return Prediction(job, hw, terms, parts)

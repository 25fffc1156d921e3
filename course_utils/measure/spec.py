"""The run a measurement is about: its spec, data, optimizer and the single-process truth.

:class:`RunSpec` describes one data-parallel training run of
:class:`course_utils.models.tiny_lm.TinyLM` (batch, steps, optimizer, an injected scaling bug or
straggler, profiling or memory tracking); :func:`corpus`, :func:`make_optimizer` and
:func:`flat_grad` are the pieces every worker of :mod:`course_utils.measure.step` shares.
:func:`reference_gradients` and :func:`reference_losses` run the same global batch in one
process: what a correct distributed run must equal (lecture 7, step 1: verify before timing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from course_utils.models import tiny_lm
from course_utils.runtime import validate

__all__ = ["GRAD_SCALINGS", "ENGINES", "OPTIMIZERS", "PHASES", "N_SUCCESSORS", "RunSpec",
           "check_world", "corpus", "make_optimizer", "flat_grad", "reference_gradients",
           "reference_losses"]

GRAD_SCALINGS = ("mean", "sum", "double_mean")
ENGINES = ("manual", "ddp")
OPTIMIZERS = ("adamw", "sgd", "zero1_adamw")
PHASES = ("data", "forward", "backward", "wait", "optimizer")
N_SUCCESSORS = 4
"""Markov corpus of :func:`corpus`: likely successors per token."""


@dataclass(frozen=True)
class RunSpec:
    """One data-parallel training run of :class:`course_utils.models.tiny_lm.TinyLM`.

    ``global_batch`` sequences of ``cfg.seq_len`` tokens per step, split evenly over the ranks.
    ``scaling`` injects a gradient-scaling bug (``"mean"`` is correct). ``engine="ddp"`` uses
    ``DistributedDataParallel`` with a timing communication hook; ``"manual"`` all-reduces one
    flat buffer after backward. ``warmup_steps`` are run but left out of
    :func:`course_utils.measure.summary.summarize`.
    """

    cfg: tiny_lm.TinyLMConfig = field(default_factory=tiny_lm.TinyLMConfig)
    global_batch: int = 16
    steps: int = 8
    lr: float = 3e-3
    seed: int = 0
    data_seed: int = 0
    optimizer: str = "adamw"
    scaling: str = "mean"
    engine: str = "manual"
    straggler_rank: int | None = None
    straggler_delay_s: float = 0.0
    warmup_steps: int = 1
    log_every: int = 0
    profile: bool = False
    track_memory: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.cfg, tiny_lm.TinyLMConfig):
            raise ValueError(f"cfg must be a TinyLMConfig; got {type(self.cfg).__name__}")
        for name, low in (("global_batch", 1), ("steps", 1), ("seed", 0), ("data_seed", 0),
                          ("warmup_steps", 0), ("log_every", 0)):
            validate.check_int(name, getattr(self, name), low)
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps must be smaller than steps={self.steps}; "
                             f"got {self.warmup_steps}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not self.lr > 0:
            raise ValueError(f"lr must be a positive number; got {self.lr!r}")
        for name, allowed in (("optimizer", OPTIMIZERS), ("scaling", GRAD_SCALINGS),
                              ("engine", ENGINES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}; got {getattr(self, name)!r}")
        if self.straggler_rank is not None and (isinstance(self.straggler_rank, bool) or not
                                                isinstance(self.straggler_rank, int)
                                                or self.straggler_rank < 0):
            raise ValueError(f"straggler_rank must be None or an int >= 0; "
                             f"got {self.straggler_rank!r}")
        if self.profile and self.track_memory:
            raise ValueError("profile and track_memory cannot both be True: each tool slows and "
                             "distorts what the other measures; run them separately")
        delay = self.straggler_delay_s
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= 10:
            raise ValueError(f"straggler_delay_s must be a number of seconds from 0 to 10; "
                             f"got {delay!r}")

    def tokens_per_step(self) -> int:
        """Tokens in one global batch: global_batch x seq_len."""
        return self.global_batch * self.cfg.seq_len


def check_world(spec: RunSpec, world_size: int) -> None:
    """ValueError unless ``spec`` fits ``world_size`` ranks: the global batch divides evenly and
    the straggler (if any) is one of the ranks."""
    if spec.global_batch % world_size:
        raise ValueError(f"global_batch={spec.global_batch} must divide evenly over "
                         f"world_size={world_size} ranks")
    if spec.straggler_rank is not None and spec.straggler_rank >= world_size:
        raise ValueError(f"straggler_rank must be below world_size={world_size}; "
                         f"got {spec.straggler_rank}")


def corpus(spec: RunSpec) -> tiny_lm.MarkovCorpus:
    """The run's data: a Markov corpus over ``spec.cfg.vocab_size`` tokens, seeded by
    ``spec.data_seed`` (the same batches in every process)."""
    return tiny_lm.MarkovCorpus(spec.cfg.vocab_size, N_SUCCESSORS, spec.data_seed)


def make_optimizer(spec: RunSpec, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The optimizer ``spec.optimizer`` names over ``model``'s parameters (``zero1_adamw``:
    torch's ``ZeroRedundancyOptimizer`` around AdamW, inside a process group)."""
    params = list(model.parameters())
    if spec.optimizer == "sgd":
        return torch.optim.SGD(params, lr=spec.lr)
    if spec.optimizer == "zero1_adamw":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=spec.lr)
    return torch.optim.AdamW(params, lr=spec.lr)


def flat_grad(model: torch.nn.Module) -> torch.Tensor:
    """Every parameter's gradient, flattened and concatenated in parameter order: (N,)."""
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])          # (N,)


# ------------------------------------------------------------------------- single-process truth


def reference_gradients(spec: RunSpec) -> dict[str, Any]:
    """Single process, whole global batch of step 0: ``{"loss": float, "grad": (N,) tensor}``."""
    if not isinstance(spec, RunSpec):
        raise ValueError(f"spec must be a RunSpec; got {type(spec).__name__}")
    model = tiny_lm.build(spec.cfg, spec.seed)
    x, y = corpus(spec).batch(0, spec.global_batch, spec.cfg.seq_len)           # (B, T) each
    loss = tiny_lm.lm_loss(model, x, y)
    loss.backward()
    return {"loss": loss.item(), "grad": flat_grad(model).detach()}


def reference_losses(spec: RunSpec) -> list[float]:
    """Single process: the loss at each of ``spec.steps`` steps, same data and optimizer."""
    if not isinstance(spec, RunSpec):
        raise ValueError(f"spec must be a RunSpec; got {type(spec).__name__}")
    model = tiny_lm.build(spec.cfg, spec.seed)
    opt = torch.optim.SGD(model.parameters(), lr=spec.lr) if spec.optimizer == "sgd" else \
        torch.optim.AdamW(model.parameters(), lr=spec.lr)  # ZeRO-1 must match plain AdamW
    data, losses = corpus(spec), []
    for step in range(spec.steps):
        x, y = data.batch(step, spec.global_batch, spec.cfg.seq_len)
        loss = tiny_lm.lm_loss(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses

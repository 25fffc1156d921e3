"""A 3-D training run's plan: mesh degrees, data, precision and optimizer settings (lecture 10).

:class:`Plan` is what :func:`course_utils.trainer3d.train.run` trains and what
:mod:`course_utils.trainer3d.check` checks it against: it validates its numbers when it is made
and derives the mesh, the microbatch size and the gradient bucket from them. :data:`DTYPES`
names the precisions a plan may ask for.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_utils.data_parallel.overlap import MIB
from course_utils.mesh.grid import Mesh
from course_utils.models.tiny_lm import TinyLMConfig
from course_utils.runtime.validate import check_int, check_real
from course_utils.trainer3d.stage_model import check_coords

__all__ = ["DTYPES", "Plan"]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Plan:
    """A training run: mesh degrees, data, precision and optimizer settings (counts; ``lr`` per
    step; ``clip``: the gradient's largest norm, None for no clipping)."""

    dp: int = 2
    pp: int = 2
    tp: int = 2
    steps: int = 20
    batch: int = 16           # global batch (rows), split over DP, then into m microbatches
    m: int = 4                # microbatches per DP replica per step
    lr: float = 3e-3
    eps: float = 1e-5         # Adam's epsilon: train3d_check.TOLERANCES says why not 1e-8
    clip: float | None = 0.55  # below the first steps' gradient norms (0.6-0.66): it acts
    seed: int = 0
    bucket_mb: float = 0.05   # DP gradient buckets (MiB of fp32): a few per stage at this size
    vocab_parallel: bool = True
    sp: bool = True
    dtype: str = "fp32"       # "bf16": bf16 weights and compute, fp32 gradients and master
    cfg: TinyLMConfig = TinyLMConfig()

    def __post_init__(self) -> None:
        for name in ("dp", "pp", "tp", "steps", "batch", "m"):
            check_int(name, getattr(self, name))
        check_int("seed", self.seed, 0)
        for name in ("lr", "eps", "bucket_mb"):
            check_real(name, getattr(self, name))
        if self.clip is not None:
            check_real("clip", self.clip)
        for name in ("vocab_parallel", "sp"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False; got {getattr(self, name)!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}; got {self.dtype!r}")
        check_coords(self.cfg, 0, self.pp, 0, self.tp, self.vocab_parallel, self.sp)
        if self.batch % (self.dp * self.m):
            raise ValueError(f"batch={self.batch} must divide into dp={self.dp} replicas of "
                             f"m={self.m} equal microbatches")

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def mesh(self) -> Mesh:
        return Mesh.from_degrees(dp=self.dp, pp=self.pp, tp=self.tp)

    @property
    def microbatch(self) -> int:
        return self.batch // (self.dp * self.m)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def bucket_numel(self) -> int:
        """Elements of fp32 gradient per DP bucket (``bucket_mb`` MiB)."""
        return max(1, int(self.bucket_mb * MIB) // 4)

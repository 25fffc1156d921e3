"""The ZeRO stages' arithmetic: padded flat shards, and the bytes each rank keeps and sends.

ZeRO stage 0 (replicated DP) to 3 in the lesson's 16-byte layout (bf16 weights and gradients,
an fp32 master copy and fp32 Adam moments: 2 + 2 + 4 + 8 bytes per parameter). Sharding uses
flat buffers, one per ``nn.Linear`` (a *unit*, like an FSDP unit): the layer's n weight and bias
elements are flattened, padded with zeros to a multiple of D and rank r owns elements
``[r*S, (r+1)*S)`` with ``S = ceil(n / D)``. Padding is at most D - 1 elements a unit, and the
byte counts here include it: :func:`padded_state_bytes` (persistent bytes per rank) and
:func:`expected_comm_bytes` (bytes per rank and step, ring algorithms, from
:mod:`course_utils.collectives.cost`). Also the stages' names and the argument checks the
``zero`` modules share. Lecture 3 (ZeRO and FSDP).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from course_utils.collectives import cost
from course_utils.memory import sizing as memory
from course_utils.runtime import validate

__all__ = ["STAGES", "STAGE_NAMES", "REDUCE_DTYPES", "LAYOUT", "check_stage", "check_sizes",
           "check_units", "unit_sizes", "shard_numel", "padded_state_bytes",
           "expected_comm_bytes"]

STAGES = (0, 1, 2, 3)
STAGE_NAMES = {0: "replicated DP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
REDUCE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
LAYOUT = memory.layout("mixed_adam16")  # 2 weights + 2 grads + 12 (master + moments)


# ------------------------------------------------------------------------------ argument checks


def check_stage(stage: Any) -> int:
    """``stage`` if it is one of :data:`STAGES` (not a bool); else ValueError naming it."""
    if isinstance(stage, bool) or stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}; got {stage!r}")
    return stage


def check_sizes(sizes: Any) -> list[int]:
    """``sizes`` as a list if it holds at least 2 layer widths, ints >= 1; else ValueError
    naming it (or the bad ``sizes[i]``)."""
    if not isinstance(sizes, (list, tuple)) or len(sizes) < 2:
        raise ValueError(f"sizes must be a list of at least 2 layer widths; got {sizes!r}")
    for i, s in enumerate(sizes):
        validate.check_int(f"sizes[{i}]", s, 1)
    return list(sizes)


def check_units(units: Any) -> list[int]:
    """``units`` as a list if it is a non-empty list of element counts, ints >= 1; else
    ValueError naming it (or the bad ``units[i]``)."""
    if not isinstance(units, (list, tuple)) or not units:
        raise ValueError(f"units must be a non-empty list of element counts; got {units!r}")
    for i, n in enumerate(units):
        validate.check_int(f"units[{i}]", n, 1)
    return list(units)


# ------------------------------------------------------------------------------ shards


def unit_sizes(sizes: Sequence[int]) -> list[int]:
    """Elements in each Linear unit of :func:`~course_utils.zero.mlp.make_mlp` (weight + bias):
    ``[in*out + out, ...]``."""
    sizes = check_sizes(sizes)
    return [fan_in * fan_out + fan_out for fan_in, fan_out in zip(sizes[:-1], sizes[1:])]


def shard_numel(n: int, dp: int) -> int:
    """Elements each of ``dp`` ranks owns of a flat buffer of ``n`` elements: ceil(n / dp)."""
    validate.check_int("n", n, 1)
    validate.check_int("dp", dp, 1)
    return -(-n // dp)


# ------------------------------------------------------------------------------ formulas


def padded_state_bytes(units: Sequence[int], dp: int, stage: int) -> dict[str, int]:
    """Persistent bytes per rank in the 16-byte layout, flat shards padded per unit.

    Sharded buffers hold ``sum(ceil(n_u / dp))`` elements per rank; replicated ones ``N``.
    Equals ``memory.zero_state_bytes(N, dp, stage)`` when every unit divides by ``dp``.
    Returns ``{"weights", "grads", "optimizer", "total"}`` in bytes.
    """
    units = check_units(units)
    validate.check_int("dp", dp, 1)
    check_stage(stage)
    n = sum(units)
    s = sum(shard_numel(u, dp) for u in units)
    out = {"weights": LAYOUT.weights * (s if stage >= 3 else n),
           "grads": LAYOUT.grads * (s if stage >= 2 else n),
           "optimizer": LAYOUT.optimizer_bucket * (s if stage >= 1 else n)}
    out["total"] = out["weights"] + out["grads"] + out["optimizer"]
    return out


def expected_comm_bytes(units: Sequence[int], dp: int, stage: int,
                        reduce_dtype: str = "bf16") -> dict[str, float]:
    """Bytes each rank sends per training step (ring algorithms), by collective, and their total.

    Stage 0: all-reduce of the N-element gradient, 2(D-1)/D x N x b_reduce. Stages 1-2:
    reduce-scatter of the gradient plus all-gather of the bf16 weights, (D-1)/D x P each.
    Stage 3: two all-gathers (forward, backward) plus a reduce-scatter. P = padded elements.
    """
    units = check_units(units)
    validate.check_int("dp", dp, 1)
    check_stage(stage)
    rb = validate.one_of("reduce_dtype", reduce_dtype, REDUCE_DTYPES).itemsize  # per grad element
    pb = LAYOUT.weights                               # bytes per bf16 weight element sent
    n = sum(units)
    padded = sum(shard_numel(u, dp) * dp for u in units)
    out = {"all_reduce": 0.0, "reduce_scatter": 0.0, "all_gather": 0.0}
    if stage == 0:
        out["all_reduce"] = cost.ring_factor("all_reduce", dp) * n * rb
    else:
        out["reduce_scatter"] = cost.ring_factor("reduce_scatter", dp) * padded * rb
        gathers = 2 if stage == 3 else 1
        out["all_gather"] = gathers * cost.ring_factor("all_gather", dp) * padded * pb
    out["total"] = out["all_reduce"] + out["reduce_scatter"] + out["all_gather"]
    return out

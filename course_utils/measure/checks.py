"""Verify before timing: does a distributed run equal the single-process one?

Lecture 7, step 1.

A run with a gradient-scaling bug can look healthy and benchmarks as fast as a correct one.
:func:`check_gradient_scaling` compares a reduced gradient with
:func:`course_utils.measure.spec.reference_gradients` and names the bug: ``scaling="sum"``
(gradients summed but never divided by ``D``) and ``scaling="double_mean"`` (loss divided by
``D`` *and* gradients averaged) change the gradient norm by ``D`` or ``1/D``.
:func:`check_losses` compares loss curves; with Adam the *loss curve* barely notices such a bug
(Adam divides the gradient by its own running RMS, so a constant factor cancels): check
gradients, not only losses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from course_utils.runtime import validate

__all__ = ["ScalingReport", "check_gradient_scaling", "check_losses"]


@dataclass(frozen=True)
class ScalingReport:
    """Distributed vs single-process gradients: ``ok`` and, when not, the likely bug."""

    ok: bool
    norm_ratio: float        # ||g_dp|| / ||g_ref||
    cosine: float            # direction agreement, 1.0 = same direction
    max_abs_diff: float
    diagnosis: str


def check_gradient_scaling(dp_grad: torch.Tensor, ref_grad: torch.Tensor, world_size: int, *,
                           rtol: float = 1e-4, atol: float = 1e-6) -> ScalingReport:
    """Compare a reduced gradient (N,) with the single-process one (N,) and name the bug, if any.

    Both may be torch tensors or numpy arrays.
    """
    tensors = []
    for name, t in (("dp_grad", dp_grad), ("ref_grad", ref_grad)):
        if type(t).__module__ == "numpy":
            t = torch.from_numpy(t)
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or not t.is_floating_point():
            raise ValueError(f"{name} must be a 1-D floating-point tensor or array (flat gradient)")
        tensors.append(t)
    dp_grad, ref_grad = tensors
    if dp_grad.shape != ref_grad.shape:
        raise ValueError(f"dp_grad and ref_grad must have the same shape; got "
                         f"{tuple(dp_grad.shape)} and {tuple(ref_grad.shape)}")
    validate.check_int("world_size", world_size)
    a, b = dp_grad.double(), ref_grad.double()
    ref_norm = b.norm().item()
    if ref_norm == 0:
        raise ValueError("ref_grad is all zeros: nothing to compare against")
    ratio = a.norm().item() / ref_norm
    cosine = (a @ b).item() / max(a.norm().item() * ref_norm, 1e-300)
    max_diff = (a - b).abs().max().item()
    ok = bool(torch.allclose(a, b, rtol=rtol, atol=atol))
    d = world_size
    if ok:
        diagnosis = "gradients match the single-process run"
    elif cosine < 0.999:
        diagnosis = (f"gradients point elsewhere (cosine {cosine:.4f}): ranks saw different or "
                     "overlapping data, started from different weights, or the reduction mixed "
                     "up parameters")
    elif d > 1 and math.isclose(ratio, d, rel_tol=0.02):
        diagnosis = (f"gradient norm is {ratio:.3g}x the reference = world size {d}: gradients "
                     f"were summed over ranks but never divided by {d}")
    elif d > 1 and math.isclose(ratio, 1 / d, rel_tol=0.02):
        diagnosis = (f"gradient norm is 1/{d} of the reference: divided by the world size twice "
                     "(loss scaled by 1/D by hand, and the reduction averages as well)")
    else:
        diagnosis = (f"same direction but norm ratio {ratio:.4g}: a normalization factor is "
                     "wrong (world size, accumulation steps, or token count)")
    return ScalingReport(ok, ratio, cosine, max_diff, diagnosis)


def check_losses(dp_losses: Sequence[float], ref_losses: Sequence[float], *,
                 atol: float = 1e-4) -> float:
    """Largest |dp - ref| over steps; raises AssertionError naming the first step beyond
    ``atol``."""
    if len(dp_losses) != len(ref_losses) or not len(ref_losses):
        raise ValueError(f"dp_losses and ref_losses must be non-empty and equally long; got "
                         f"{len(dp_losses)} and {len(ref_losses)}")
    diffs = [abs(float(a) - float(b)) for a, b in zip(dp_losses, ref_losses)]
    for step, (diff, a, b) in enumerate(zip(diffs, dp_losses, ref_losses)):
        if diff > atol:
            raise AssertionError(f"loss differs from the single-process run at step {step + 1}: "
                                 f"{a:.6f} vs {b:.6f} (|diff| {diff:.2e} > {atol:g})")
    return max(diffs)

"""Recomputation in JAX: what ``jax.checkpoint`` keeps from the forward pass under each policy.

:func:`saved_residuals` lists what the backward pass of the lecture's MLP loss keeps (as
``jax.ad_checkpoint.print_saved_residuals`` prints it) under one of :data:`POLICIES`, the bytes
of what it computed, and the gradient, equal under every policy. Lecture 8 (JAX), section 6
(module 9's trade of memory for compute).
"""

from __future__ import annotations

import contextlib
import io
from typing import Sequence

from course_utils.jax_sharding import devices  # noqa: F401  (first: sets XLA_FLAGS)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.ad_checkpoint import print_saved_residuals  # noqa: E402

from course_utils.jax_sharding.hlo import shape_bytes  # noqa: E402
from course_utils.jax_sharding.mlp import check_sizes, init_mlp, mlp_apply  # noqa: E402
from course_utils.runtime.validate import check_int  # noqa: E402

__all__ = ["POLICIES", "saved_residuals"]

POLICIES = ("no checkpoint", "nothing_saveable", "dots_saveable", "everything_saveable")


def saved_residuals(policy: str, sizes: Sequence[int] = (16, 64, 64, 16), batch: int = 8,
                    seed: int = 0) -> dict:
    """What the backward pass of an MLP's mean-squared loss keeps from the forward pass, under
    ``jax.checkpoint`` with one of :data:`POLICIES` (``"no checkpoint"``: plain ``jax.grad``),
    as ``jax.ad_checkpoint.print_saved_residuals`` lists it; and the gradient, to compare."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {list(POLICIES)}; got {policy!r}")
    sizes = check_sizes(sizes)
    check_int("batch", batch)
    check_int("seed", seed, 0)
    params = [jnp.asarray(p) for p in init_mlp(seed, sizes)]
    x = jnp.asarray(np.random.default_rng(seed).standard_normal((batch, sizes[0]), np.float32))

    def loss(params, x):
        return jnp.mean(mlp_apply(params, x) ** 2)

    fn = loss if policy == "no checkpoint" else jax.checkpoint(
        loss, policy=getattr(jax.checkpoint_policies, policy))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_saved_residuals(fn, params, x)
    residuals = []
    for line in printed.getvalue().splitlines():
        kind, _, what = line.partition(" ")
        if " from the argument " not in what:
            what = what.split(" from ")[0]  # drop the source location (file:line)
        residuals.append((kind, what))
    computed = [r for r in residuals if "from the argument" not in r[1]]
    counts: dict[str, int] = {}
    for _, what in computed:
        counts[what] = counts.get(what, 0) + 1
    return {"policy": policy, "residuals": residuals, "computed": computed,
            "summary": ", ".join(f"{k} x {what}" for what, k in counts.items()),
            "computed_bytes": sum(shape_bytes(k) for k, _ in computed),
            "grads": [np.asarray(g) for g in jax.jit(jax.grad(fn))(params, x)]}  # (one compile)

"""The lecture's MLP in JAX: its weights, its forward pass and its loss.

``Linear, tanh, ..., Linear`` in the ``Y = X W + b`` layout: :func:`init_mlp` (numpy weights
from a seed), :func:`mlp_apply` and :func:`mse`, the model that data parallelism, FSDP and
recomputation train; :func:`check_sizes` checks its layer widths. Lecture 8 (JAX), sections 2,
4 and 6.
"""

from __future__ import annotations

from typing import Any, Sequence

from course_utils.jax_sharding import devices  # noqa: F401  (first: sets XLA_FLAGS)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from course_utils.runtime.validate import check_int  # noqa: E402

__all__ = ["init_mlp", "mlp_apply", "mse"]


def check_sizes(sizes: Any, name: str = "sizes") -> tuple[int, ...]:
    """Layer widths of an MLP: ``sizes`` as a tuple if it holds at least 2 ints >= 1; else
    ValueError naming ``name``."""
    if (isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence) or len(sizes) < 2
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes)):
        raise ValueError(f"{name} must be a sequence of at least 2 ints >= 1 (layer widths); "
                         f"got {sizes!r}")
    return tuple(sizes)


def init_mlp(seed: int, sizes: Sequence[int] = (16, 64, 16)) -> list[np.ndarray]:
    """Weights and biases of an MLP (numpy, float32): W_k ~ N(0, 1/fan_in), biases 0."""
    check_int("seed", seed, 0)
    sizes = check_sizes(sizes)
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        params.append((rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32))
        params.append(np.zeros(fan_out, dtype=np.float32))
    return params


def mlp_apply(params: Sequence[Any], x: Any) -> Any:
    """``x`` through Linear, tanh, ..., Linear (``Y = X W + b`` layout)."""
    if not isinstance(params, (list, tuple)) or not params or len(params) % 2:
        raise ValueError("params must be a list [W_1, b_1, W_2, b_2, ...] (init_mlp's), an even "
                         f"number of arrays; got {type(params).__name__} of "
                         f"{len(params) if isinstance(params, (list, tuple)) else '?'}")
    n = len(params) // 2
    for k in range(n):
        x = x @ params[2 * k] + params[2 * k + 1]
        if k < n - 1:
            x = jnp.tanh(x)
    return x


def mse(params: Sequence[Any], x: Any, y: Any) -> Any:
    """Mean squared error of :func:`mlp_apply` over the (global) batch."""
    return jnp.mean((mlp_apply(params, x) - y) ** 2)

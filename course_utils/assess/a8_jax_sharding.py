"""Assignment a8's harness: a student's row-parallel layer under ``shard_map`` on CPU devices.

The student writes ``row_parallel(x_local, w_local, b)``, the per-device program of a
row-parallel linear layer (module 4's, in JAX: X split by columns and W by rows over
``"model"``, the partial products summed with a collective). :func:`row_parallel_harness` runs
it on a ``"model"`` mesh and returns Y and the collectives of the compiled program; the visible
test compares them with ``X W + b``. Lecture 8 (JAX); assignment a8 (Q3).
"""

from __future__ import annotations

from typing import Any, Callable

from course_utils.jax_sharding.devices import DEVICES, check_devices  # first: sets XLA_FLAGS

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax import shard_map  # noqa: E402

from course_utils.jax_sharding.hlo import collective_names  # noqa: E402
from course_utils.jax_sharding.shardings import P, check_numeric, make_mesh, place  # noqa: E402

__all__ = ["row_parallel_harness"]


def row_parallel_harness(fn: Callable, x: Any, w: Any, b: Any, devices: int = DEVICES
                         ) -> dict:
    """Run a student's ``fn(x_local, w_local, b)`` under ``shard_map`` on a ``devices``-wide
    ``"model"`` mesh (X split by columns, W by rows, b replicated, Y replicated); return Y as
    numpy and the collectives of the compiled program."""
    if not callable(fn):
        raise TypeError(f"fn must be a function fn(x_local, w_local, b); got {type(fn).__name__}")
    check_devices(devices)
    x = np.asarray(check_numeric("x", x), np.float32)  # (tokens, h_in)
    w = np.asarray(check_numeric("w", w), np.float32)  # (h_in, h_out)
    b = np.asarray(check_numeric("b", b), np.float32)  # (h_out,)
    if x.ndim != 2 or w.ndim != 2 or w.shape[0] != x.shape[1]:
        raise ValueError(f"x must be (tokens, h_in) and w (h_in, h_out); got shapes {x.shape} "
                         f"and {w.shape}")
    if x.shape[1] % devices:
        raise ValueError(f"h_in = {x.shape[1]} (x's dim 1, w's dim 0) must be divisible by "
                         f"devices = {devices}: both are split over \"model\"")
    if b.ndim > 1 or b.size not in (1, w.shape[1]):
        raise ValueError(f"b must be the bias, shape (h_out,) = ({w.shape[1]},); got {b.shape}")
    mesh = make_mesh((devices,), ("model",))
    xs = place(x, mesh, P(None, "model"))
    ws = place(w, mesh, P("model", None))
    bs = place(b, mesh, P())
    layer = jax.jit(shard_map(fn, mesh=mesh, in_specs=(P(None, "model"), P("model", None), P()),
                              out_specs=P(), check_vma=False))
    y = layer(xs, ws, bs)
    return {"y": np.asarray(y), "collectives": collective_names(
        layer.lower(xs, ws, bs).compile().as_text())}

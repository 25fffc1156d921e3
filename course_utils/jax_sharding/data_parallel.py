"""Data parallelism in JAX: the batch split over a ``"data"`` axis, the weights replicated.

:func:`lesson_two_replicas` is module 2's two-replica example on a 2-device mesh (the compiler
all-reduces the gradient); :func:`dp_step_check` compares one data-parallel gradient of the
lecture's MLP with one device's and with the mean of per-shard gradients. Lecture 8 (JAX),
section 2.
"""

from __future__ import annotations

from typing import Sequence

from course_utils.jax_sharding.devices import DEVICES, check_devices, on_one_device

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from course_utils.jax_sharding.hlo import collectives, compiled_text  # noqa: E402
from course_utils.jax_sharding.mlp import check_sizes, init_mlp, mse  # noqa: E402
from course_utils.jax_sharding.shardings import P, check_numeric, make_mesh, place  # noqa: E402
from course_utils.runtime.validate import check_int, check_real  # noqa: E402

__all__ = ["lesson_two_replicas", "dp_step_check"]


def lesson_two_replicas(grads: Sequence[Sequence[float]] = ((2.0, 4.0), (6.0, 0.0)),
                        w0: Sequence[float] = (1.0, 1.0), lr: float = 0.1) -> dict:
    """Module 2's two-replica example on a 2-device ``"data"`` mesh: replica ``r``'s loss is
    ``g_r . w`` (so its local gradient is ``g_r``); ``jit`` of the mean loss's gradient with the
    rows sharded over ``"data"`` gives the mean gradient, and one SGD step."""
    g = np.asarray(check_numeric("grads", grads), dtype=np.float32)  # (replicas, params)
    if g.ndim != 2 or g.shape[0] < 1 or g.shape[1] < 1:
        raise ValueError(f"grads must be a list of equal-length gradients; got {grads!r}")
    check_devices(g.shape[0], "the number of gradients (replicas, one per device) in grads")
    w = np.asarray(check_numeric("w0", w0), dtype=np.float32)  # (params,)
    if w.shape != (g.shape[1],):
        raise ValueError(f"w0 must have {g.shape[1]} entries, like each gradient; got {w0!r}")
    check_real("lr", lr)
    mesh = make_mesh((g.shape[0],), ("data",))
    g_sharded = place(g, mesh, P("data"))      # replica r holds row r
    w_repl = place(w, mesh, P())               # every replica holds all of w

    def loss(w, g):
        return jnp.mean(g @ w)                 # mean over replicas of g_r . w

    def step(w, g):
        grad = jax.grad(loss)(w, g)
        return grad, w - lr * grad

    hlo = compiled_text(step, w_repl, g_sharded)
    grad, new_w = jax.jit(step)(w_repl, g_sharded)
    return {"local_grads": [shard.data.reshape(-1).tolist() for shard in
                            sorted(g_sharded.addressable_shards, key=lambda s: s.device.id)],
            "mean_grad": np.asarray(grad).tolist(), "new_w": np.asarray(new_w).tolist(),
            "collectives": collectives(hlo)}


def dp_step_check(seed: int = 0, devices: int = DEVICES, batch: int = 32,
                  sizes: Sequence[int] = (16, 64, 16)) -> dict:
    """One data-parallel gradient: batch split over ``"data"``, params replicated; compared with
    the same gradient on one device and with the mean of per-shard gradients."""
    check_int("seed", seed, 0)
    check_devices(devices)
    check_int("batch", batch)
    sizes = check_sizes(sizes)
    if batch % devices:
        raise ValueError(f"batch = {batch} must be divisible by devices = {devices} (equal "
                         "shards of the batch)")
    rng = np.random.default_rng(1000 + seed)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)   # (batch, in)
    y = rng.standard_normal((batch, sizes[-1])).astype(np.float32)  # (batch, out)
    params = init_mlp(seed, sizes)
    mesh = make_mesh((devices,), ("data",))
    p_repl = [place(p, mesh, P()) for p in params]
    xs, ys = place(x, mesh, P("data")), place(y, mesh, P("data"))
    grad_fn = jax.grad(mse)
    sharded = jax.jit(grad_fn)(p_repl, xs, ys)
    one = jax.device_get(jax.jit(grad_fn)(*on_one_device(params, x, y)))
    parts = np.split(np.arange(batch), devices)
    shard_grad = jax.jit(grad_fn)  # (one compile for the 8 equal shards; run op by op, each
    per_shard = [jax.device_get(shard_grad(params, x[i], y[i])) for i in parts]  # op compiles)
    mean_of_shards = [np.mean([g[k] for g in per_shard], axis=0) for k in range(len(params))]
    return {"grads": [np.asarray(g) for g in sharded], "one_device": list(one),
            "mean_of_shards": mean_of_shards,
            "grad_sharding": [g.sharding.spec for g in sharded],
            "collectives": collectives(compiled_text(grad_fn, p_repl, xs, ys))}

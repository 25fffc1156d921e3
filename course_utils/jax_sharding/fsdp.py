"""FSDP / ZeRO-3 in JAX: the training state sharded over ``"data"``, and what XLA allocates.

:func:`fsdp_state` shards an MLP's FP32 Adam state (weights, gradients, two moments) by the
first dim of every array: bytes per device read from the shards, and the collectives of the
forward pass and of a sharded linear layer's step; :func:`fsdp_memory` reads
``compiled.memory_analysis()`` of one Adam step on that state, plain and donated, beside
ZeRO-3's ``16 N / D``. Lecture 8 (JAX), section 4.
"""

from __future__ import annotations

from typing import Any, Sequence

from course_utils.jax_sharding.devices import DEVICES, check_devices

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402

from course_utils.jax_sharding.hlo import collectives, compiled_text  # noqa: E402
from course_utils.jax_sharding.mlp import check_sizes, init_mlp, mlp_apply  # noqa: E402
from course_utils.jax_sharding.shardings import (  # noqa: E402
    P, bytes_per_device, global_bytes, make_mesh, place,
)
from course_utils.runtime.validate import check_int  # noqa: E402

__all__ = ["fsdp_state", "fsdp_memory"]


def _sharded_adam_state(sizes: Any, seed: Any, devices: Any) -> tuple[Mesh, list, dict]:
    """(mesh, weights, state): an MLP's FP32 weights, gradients and two Adam moments, every
    array split by its first dim over a ``"data"`` axis of ``devices``; the three zero states
    are distinct buffers (a new one on every device for each)."""
    sizes = check_sizes(sizes)
    check_int("seed", seed, 0)
    check_devices(devices)
    if any(s % devices for s in sizes):
        raise ValueError(f"every entry of sizes must be divisible by devices = {devices} (each "
                         f"weight and bias is split by its first dim); got {sizes}")
    mesh = make_mesh((devices,), ("data",))
    params = [place(p, mesh, P("data")) for p in init_mlp(seed, sizes)]

    def zeros() -> list:
        return [place(np.zeros(p.shape, np.float32), mesh, P("data")) for p in params]

    return mesh, params, {"weights": params, "grads": zeros(), "adam_m": zeros(),
                          "adam_v": zeros()}


def fsdp_state(sizes: Sequence[int] = (64, 256, 64), seed: int = 0,
               devices: int = DEVICES) -> dict:
    """FP32 Adam training state (weights, gradients, two moments) sharded over ``"data"`` by the
    first dim of every array: bytes per device read from the shards; the collectives of the
    compiled forward pass (each weight gathered for its matmul) and of one SGD step of a single
    sharded linear layer (gather forward, gradient summed over ``"data"`` backward)."""
    mesh, params, state = _sharded_adam_state(sizes, seed, devices)
    rng = np.random.default_rng(seed)
    batch = 8 * devices
    x = place(rng.standard_normal((batch, sizes[0])).astype(np.float32), mesh, P("data"))
    forward = compiled_text(mlp_apply, params, x, out_shardings=NamedSharding(mesh, P("data")))

    def linear_step(w, x):
        grad = jax.grad(lambda w: jnp.mean((x @ w) ** 2))(w)
        return w - 0.01 * grad

    w = params[0]
    step = compiled_text(linear_step, w, x, out_shardings=w.sharding)
    n_params = sum(int(p.size) for p in params)
    return {"n_params": n_params, "bytes_per_device": bytes_per_device(state),
            "global_bytes": global_bytes(state),
            "parts_per_device": {k: bytes_per_device(v)[0] for k, v in state.items()},
            "forward": collectives(forward), "linear_step": collectives(step)}


def _adam_step(state: dict, lr: float = 1e-3, b1: float = 0.9, b2: float = 0.999,
               eps: float = 1e-8) -> dict:
    """One Adam update of ``{"weights", "grads", "adam_m", "adam_v"}``: the new weights and
    moments (the gradients are consumed)."""
    m = [b1 * m + (1 - b1) * g for m, g in zip(state["adam_m"], state["grads"])]
    v = [b2 * v + (1 - b2) * g * g for v, g in zip(state["adam_v"], state["grads"])]
    w = [w - lr * mm / (jnp.sqrt(vv) + eps) for w, mm, vv in zip(state["weights"], m, v)]
    return {"weights": w, "adam_m": m, "adam_v": v}


def _memory_fields(compiled: Any) -> dict[str, int]:
    stats = compiled.memory_analysis()
    return {k: int(getattr(stats, k)) for k in sorted(dir(stats))
            if k.endswith("_in_bytes") and not k.startswith("_")}


def fsdp_memory(sizes: Sequence[int] = (64, 256, 64), seed: int = 0,
                devices: int = DEVICES) -> dict:
    """``compiled.memory_analysis()`` of one Adam step on :func:`fsdp_state`'s sharded state,
    compiled plain and with the state donated: every ``*_in_bytes`` field it reports (bytes
    per device), beside ZeRO-3's ``16 N / D``; and the step's collectives."""
    mesh, params, state = _sharded_adam_state(sizes, seed, devices)
    n_params = sum(int(p.size) for p in params)
    plain = jax.jit(_adam_step).lower(state).compile()
    donated = jax.jit(_adam_step, donate_argnums=0).lower(state).compile()
    return {"n_params": n_params, "zero3_bytes": 16 * n_params // devices,
            "shard_bytes": bytes_per_device(state)[0], "n_outputs": 3 * len(params),
            "plain": _memory_fields(plain), "donated": _memory_fields(donated),
            "collectives": collectives(plain.as_text())}

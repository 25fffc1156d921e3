"""A ring written with ``jax.lax.ppermute`` in ``shard_map``: module 2's ring, in JAX.

:func:`ring_step` sends each device's block to the next device (one ``collective-permute``);
:func:`ring_reduce_scatter` is module 2's ring reduce-scatter, D - 1 such steps, compared with
``jax.lax.psum_scatter``. Lecture 8 (JAX), section 3.
"""

from __future__ import annotations

from course_utils.jax_sharding.devices import DEVICES, check_devices

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax import shard_map  # noqa: E402

from course_utils.jax_sharding.hlo import collectives  # noqa: E402
from course_utils.jax_sharding.shardings import P, make_mesh, place  # noqa: E402
from course_utils.runtime.validate import check_int  # noqa: E402

__all__ = ["ring_step", "ring_reduce_scatter"]


def _ring_perm(devices: int) -> list[tuple[int, int]]:
    return [(i, (i + 1) % devices) for i in range(devices)]  # device i sends to i + 1


def ring_step(devices: int = DEVICES) -> dict:
    """One step of a ring in ``shard_map``: ``jax.lax.ppermute`` sends each device's block to
    the next device. Returns what each device holds before and after, and the collectives."""
    check_devices(devices)
    mesh = make_mesh((devices,), ("model",))
    x = place(np.arange(devices, dtype=np.float32).reshape(devices, 1), mesh, P("model"))

    def step(block):                                    # (1, 1): this device's block
        return jax.lax.ppermute(block, "model", perm=_ring_perm(devices))

    fn = jax.jit(shard_map(step, mesh=mesh, in_specs=P("model"), out_specs=P("model")))
    after = fn(x)
    return {"before": np.asarray(x).reshape(-1).tolist(),
            "after": np.asarray(after).reshape(-1).tolist(),
            "collectives": collectives(fn.lower(x).compile().as_text())}


def ring_reduce_scatter(devices: int = DEVICES, chunk: int = 2, seed: int = 0) -> dict:
    """Module 2's ring reduce-scatter written with ``ppermute`` in ``shard_map``: D - 1 steps,
    each sending one chunk to the next device and adding the chunk received. Compared with
    ``jax.lax.psum_scatter`` and with numpy; the collectives of both programs."""
    check_devices(devices)
    check_int("chunk", chunk)
    check_int("seed", seed, 0)
    mesh = make_mesh((devices,), ("model",))
    rng = np.random.default_rng(seed)
    full = rng.standard_normal((devices, devices * chunk)).astype(np.float32)  # row r: device r
    x = place(full, mesh, P("model", None))

    def ring(vector):                                   # (1, D * chunk): this device's vector
        r = jax.lax.axis_index("model")
        chunks = vector.reshape(devices, chunk)         # (D, chunk)
        msg = chunks[r]                                 # step 0 sends chunk r
        for s in range(devices - 1):                    # step s receives chunk (r - s - 1) % D
            msg = jax.lax.ppermute(msg, "model", perm=_ring_perm(devices))
            msg = msg + chunks[(r - s - 1) % devices]
        return msg[None]                                # (1, chunk): reduced chunk (r + 1) % D

    def builtin(vector):                                # (1, D * chunk)
        return jax.lax.psum_scatter(vector.reshape(devices, chunk), "model",
                                    scatter_dimension=0, tiled=True)    # (1, chunk): chunk r

    spec = P("model", None)
    ring_fn = jax.jit(shard_map(ring, mesh=mesh, in_specs=spec, out_specs=spec))
    builtin_fn = jax.jit(shard_map(builtin, mesh=mesh, in_specs=spec, out_specs=spec))
    total = full.sum(axis=0).reshape(devices, chunk)    # (D, chunk): the summed chunks
    got = np.asarray(ring_fn(x))                        # row r: reduced chunk (r + 1) % D
    return {"ring": got, "expected": np.roll(total, -1, axis=0),
            "psum_scatter": np.asarray(builtin_fn(x)), "summed": total,
            "ring_collectives": collectives(ring_fn.lower(x).compile().as_text()),
            "psum_scatter_collectives": collectives(builtin_fn.lower(x).compile().as_text())}

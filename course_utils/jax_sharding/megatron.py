"""The Megatron MLP pair on a mesh: W1 split by columns, W2 by rows over ``"model"``.

:func:`constrained_mlp` compiles ``tanh(X W1) W2`` on a 1-D ``"model"`` mesh with and without
``jax.lax.with_sharding_constraint`` on the hidden activation (what pinning a layout inside a
program does to the collectives); :func:`mlp_2d` trains ``GELU(X W1) W2`` one SGD step on a 2-D
``("data", "model")`` mesh (the batch over ``"data"``, the pair over ``"model"``). Lecture 8
(JAX), sections 3 and 5.
"""

from __future__ import annotations

from course_utils.jax_sharding.devices import DEVICES, check_devices, on_one_device

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

from course_utils.jax_sharding.hlo import collectives, compiled_text  # noqa: E402
from course_utils.jax_sharding.shardings import P, bytes_per_device, make_mesh, place  # noqa: E402
from course_utils.runtime.validate import check_int  # noqa: E402

__all__ = ["constrained_mlp", "mlp_2d"]


def constrained_mlp(devices: int = DEVICES, seed: int = 0, tokens: int = 16, h: int = 32,
                    ffn: int = 128) -> list[dict]:
    """The Megatron pair ``tanh(X W1) W2`` (W1 by columns, W2 by rows over ``"model"``) compiled
    with and without ``jax.lax.with_sharding_constraint`` on the hidden activation: one row per
    constraint, its collectives, and whether Y equals the unconstrained Y."""
    check_devices(devices)
    check_int("seed", seed, 0)
    for name, value in (("tokens", tokens), ("h", h), ("ffn", ffn)):
        check_int(name, value)
    if tokens % devices or ffn % devices:
        raise ValueError(f"tokens = {tokens} and ffn = {ffn} must be divisible by devices = "
                         f"{devices} (the constraints split them over \"model\")")
    mesh = make_mesh((devices,), ("model",))
    rng = np.random.default_rng(seed)
    x = place(rng.standard_normal((tokens, h)).astype(np.float32), mesh, P())     # (t, h)
    w1 = place(rng.standard_normal((h, ffn)).astype(np.float32), mesh, P(None, "model"))
    w2 = place(rng.standard_normal((ffn, h)).astype(np.float32), mesh, P("model", None))
    replicated = NamedSharding(mesh, P())
    rows, reference = [], None
    for spec in (None, P(None, "model"), P(), P("model", None)):
        def block(x, w1, w2, spec=spec):
            hidden = jnp.tanh(x @ w1)                                   # (tokens, ffn)
            if spec is not None:
                hidden = jax.lax.with_sharding_constraint(hidden, NamedSharding(mesh, spec))
            return hidden @ w2                                          # (tokens, h)

        fn = jax.jit(block, out_shardings=replicated)
        y = np.asarray(fn(x, w1, w2))
        reference = y if reference is None else reference
        rows.append({"constraint": "none" if spec is None else str(spec),
                     "collectives": collectives(fn.lower(x, w1, w2).compile().as_text()),
                     "equal": bool(np.allclose(y, reference, rtol=1e-5, atol=1e-4))})
    return rows


def mlp_2d(seed: int = 0, data: int = 2, model: int = 4, batch: int = 8, h: int = 16,
           ffn: int = 64) -> dict:
    """A ``GELU(X W1) W2`` block on a ``("data", "model")`` mesh: X split by batch over
    ``"data"``, W1 by columns and W2 by rows over ``"model"`` (Megatron), replicated over
    ``"data"``. One SGD step of ``mean((Y - X)^2)`` compiled; bytes per device and
    collectives, and the result compared with one device."""
    check_int("seed", seed, 0)
    for name, value in (("data", data), ("model", model), ("batch", batch), ("h", h),
                        ("ffn", ffn)):
        check_int(name, value)
    check_devices(data * model, "data x model (the mesh's devices)")
    if batch % data or ffn % model:
        raise ValueError(f"batch = {batch} must be divisible by data = {data} and ffn = {ffn} by "
                         f"model = {model} (equal shards)")
    mesh = make_mesh((data, model), ("data", "model"))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, h)).astype(np.float32)                          # (b, h)
    w1 = (rng.standard_normal((h, ffn)) / np.sqrt(h)).astype(np.float32)            # (h, ffn)
    w2 = (rng.standard_normal((ffn, h)) / np.sqrt(ffn)).astype(np.float32)          # (ffn, h)
    specs = {"x": P("data", None), "w1": P(None, "model"), "w2": P("model", None)}
    xs, w1s, w2s = (place(x, mesh, specs["x"]), place(w1, mesh, specs["w1"]),
                    place(w2, mesh, specs["w2"]))

    def block(params, x):
        return jax.nn.gelu(x @ params[0]) @ params[1]

    def step(params, x):
        grads = jax.grad(lambda p: jnp.mean((block(p, x) - x) ** 2))(params)
        return [p - 0.1 * g for p, g in zip(params, grads)]

    out = [w1s.sharding, w2s.sharding]
    hlo = compiled_text(step, [w1s, w2s], xs, out_shardings=out)
    new = jax.jit(step, out_shardings=out)([w1s, w2s], xs)
    ref = jax.jit(step)(*on_one_device([w1, w2], x))
    fwd = compiled_text(block, [w1s, w2s], xs, out_shardings=NamedSharding(mesh, specs["x"]))
    return {"specs": specs, "bytes_per_device": bytes_per_device([w1s, w2s]),
            "x_bytes_per_device": bytes_per_device(xs),
            "shapes": {"x": x.shape, "w1": w1.shape, "w2": w2.shape},
            "mesh_shape": dict(mesh.shape), "forward": collectives(fwd),
            "step": collectives(hlo), "new": [np.asarray(a) for a in new],
            "one_device": [np.asarray(a) for a in ref]}

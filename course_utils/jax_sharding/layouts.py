"""Tensor-parallel layouts of ``Y = X W``, compiled by ``jit`` and written with ``shard_map``.

:data:`LAYOUTS` names each way to split the layer over a 1-D mesh (:class:`Layout`: the specs of
X, W and Y and the collective the ``shard_map`` version writes); :func:`jit_linear` lets the
compiler choose the communication, :func:`shard_map_linear` names it; :func:`compare_layouts`
runs every layout against one device and :func:`layout_table` prints it. Beyond Auto
propagation: :func:`partitioner` (which partitioner lowers the program) and
:func:`both_dims_on_one_axis` (the illegal layout, what Explicit axes say about it and what
Auto axes compile to). Lecture 8 (JAX), section 3; assignment a8 (Q3).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from course_utils.jax_sharding.devices import DEVICES, check_devices, on_one_device

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import shard_map  # noqa: E402
from jax.sharding import AxisType, Mesh, NamedSharding  # noqa: E402

from course_utils.jax_sharding.hlo import Collective, collectives  # noqa: E402
from course_utils.jax_sharding.shardings import (  # noqa: E402
    P, bytes_per_device, check_mesh, make_mesh, place,
)
from course_utils.runtime.validate import check_int, one_of  # noqa: E402

__all__ = ["Layout", "LAYOUTS", "linear_inputs", "jit_linear", "shard_map_linear",
           "compare_layouts", "layout_table", "partitioner", "both_dims_on_one_axis"]


@dataclass(frozen=True)
class Layout:
    """One way to split ``Y = X W`` over a 1-D mesh: the specs of X, W and Y, and the collective
    written explicitly in the ``shard_map`` version (None: none is needed)."""

    axis: str
    x: P
    w: P
    y: P
    explicit: str | None
    meaning: str


LAYOUTS: dict[str, Layout] = {
    "column": Layout("model", P(), P(None, "model"), P(None, "model"), None,
                     "W by columns, Y stays split by features"),
    "column, gathered": Layout("model", P(), P(None, "model"), P(), "all-gather",
                               "W by columns, every device needs all of Y"),
    "row": Layout("model", P(None, "model"), P("model", None), P(), "all-reduce",
                  "W by rows (the contraction dim), every device needs all of Y"),
    "row, scattered": Layout("model", P(None, "model"), P("model", None), P(None, "model"),
                             "reduce-scatter", "W by rows, Y left split by features"),
    "fsdp": Layout("data", P("data", None), P("data", None), P("data", None), "all-gather",
                   "batch and W's rows split over data; W gathered for the matmul"),
}


def _layout_on(name: str, mesh: Any) -> Layout:
    """The layout ``name``, checked against ``mesh`` (it must have the layout's axis)."""
    lay = one_of("layout", name, LAYOUTS)
    check_mesh(mesh)
    if lay.axis not in mesh.axis_names:
        raise ValueError(f"mesh must have the axis {lay.axis!r} that layout {name!r} splits "
                         f"over; its axes are {list(mesh.axis_names)}")
    return lay


def linear_inputs(seed: int, tokens: int = 16, h_in: int = 32, h_out: int = 64
                  ) -> tuple[np.ndarray, np.ndarray]:
    """X (tokens, h_in) and W (h_in, h_out), float32, from ``seed``."""
    check_int("seed", seed, 0)
    for name, value in (("tokens", tokens), ("h_in", h_in), ("h_out", h_out)):
        check_int(name, value)
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((tokens, h_in)).astype(np.float32),
            rng.standard_normal((h_in, h_out)).astype(np.float32))


def _linear(x, w):
    return x @ w  # (tokens, h_in) @ (h_in, h_out) -> (tokens, h_out)


def jit_linear(layout: str, mesh: Mesh) -> Callable:
    """``jit(X @ W)`` whose output is laid out as the layout's Y spec (the compiler decides the
    communication)."""
    lay = _layout_on(layout, mesh)
    return jax.jit(_linear, out_shardings=NamedSharding(mesh, lay.y))


def _column_local(x, w_local):
    return x @ w_local                                          # (tokens, h_out/t): own features


def _column_gathered_local(x, w_local):
    return jax.lax.all_gather(x @ w_local, "model", axis=1, tiled=True)   # (tokens, h_out)


def _row_local(x_local, w_local):
    return jax.lax.psum(x_local @ w_local, "model")             # (tokens, h_out): summed


def _row_scattered_local(x_local, w_local):
    # (tokens, h_out/t): this device's slice of the summed partial sums
    return jax.lax.psum_scatter(x_local @ w_local, "model", scatter_dimension=1, tiled=True)


def _fsdp_local(x_local, w_local):
    w = jax.lax.all_gather(w_local, "data", axis=0, tiled=True)  # (h_in, h_out): whole W
    return x_local @ w                                           # (tokens/d, h_out)


_LOCAL = {"column": _column_local, "column, gathered": _column_gathered_local,
          "row": _row_local, "row, scattered": _row_scattered_local, "fsdp": _fsdp_local}


def shard_map_linear(layout: str, mesh: Mesh) -> Callable:
    """The same layer written per device with ``shard_map``: each device's block in, its block
    of Y out, the collective named explicitly (``jax.lax.psum`` / ``all_gather`` /
    ``psum_scatter``)."""
    lay = _layout_on(layout, mesh)
    # An all-gather's result is the same on every device, but shard_map's replication check
    # cannot prove it for the gathered output: the check is turned off for that layout only.
    check = layout != "column, gathered"
    return jax.jit(shard_map(_LOCAL[layout], mesh=mesh, in_specs=(lay.x, lay.w),
                             out_specs=lay.y, check_vma=check))


def compare_layouts(seed: int = 0, devices: int = DEVICES) -> list[dict]:
    """Every layout of :data:`LAYOUTS` on a ``devices``-wide 1-D mesh: the collectives in the
    ``jit`` and the ``shard_map`` programs, and both results (as numpy) with one device's."""
    check_int("seed", seed, 0)
    check_devices(devices)
    if 16 % devices:
        raise ValueError(f"devices must divide 16 (linear_inputs' tokens; h_in 32 and h_out 64 "
                         f"are split too): 1, 2, 4 or 8; got {devices}")
    x, w = linear_inputs(seed)
    one = np.asarray(jax.jit(_linear)(*on_one_device(x, w)))
    rows = []
    for name, lay in LAYOUTS.items():
        mesh = make_mesh((devices,), (lay.axis,))
        xs, ws = place(x, mesh, lay.x), place(w, mesh, lay.w)
        jitted, explicit = jit_linear(name, mesh), shard_map_linear(name, mesh)
        y_jit, y_map = jitted(xs, ws), explicit(xs, ws)
        rows.append({"layout": name, "meaning": lay.meaning, "x": lay.x, "w": lay.w,
                     "y": lay.y,
                     "jit": collectives(jitted.lower(xs, ws).compile().as_text()),
                     "shard_map": collectives(explicit.lower(xs, ws).compile().as_text()),
                     "y_jit": np.asarray(y_jit), "y_shard_map": np.asarray(y_map),
                     "y_one_device": one, "y_spec": y_jit.sharding.spec,
                     "w_bytes_per_device": bytes_per_device(ws)})
    return rows


def layout_table(rows: Sequence[dict]) -> str:
    """:func:`compare_layouts`'s rows as a table: specs, the collective each program holds, and
    whether both results equal one device's (to 1e-5)."""
    keys = {"layout", "x", "w", "y", "jit", "shard_map", "y_jit", "y_shard_map", "y_one_device"}
    if (isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Sequence) or not rows
            or not all(isinstance(r, Mapping) and keys <= set(r) for r in rows)):
        raise ValueError("rows must be compare_layouts()'s list of dicts (each with keys "
                         f"{sorted(keys)})")

    def names(cs: Sequence[Collective]) -> str:
        return ", ".join(c.op for c in cs) or "none"

    lines = [f"{'layout':<17} {'X':<17} {'W':<17} {'Y':<17} {'jit inserted':<13} "
             f"{'shard_map says':<15} equal"]
    for r in rows:
        same = (np.allclose(r["y_jit"], r["y_one_device"], rtol=1e-5, atol=1e-5)
                and np.allclose(r["y_shard_map"], r["y_jit"], rtol=1e-5, atol=1e-5))
        lines.append(f"{r['layout']:<17} {str(r['x']):<17} {str(r['w']):<17} {str(r['y']):<17} "
                     f"{names(r['jit']):<13} {names(r['shard_map']):<15} {same}")
    return "\n".join(lines)


def partitioner(layout: str = "row", devices: int = DEVICES) -> dict:
    """Which partitioner this JAX lowers to: the ``jax_use_shardy_partitioner`` flag, and the
    Shardy (``sdy.``) attributes in the lowered (StableHLO) text of a layout's ``jit``."""
    lay = one_of("layout", layout, LAYOUTS)
    check_devices(devices)
    if 16 % devices:
        raise ValueError(f"devices must divide 16 (linear_inputs' tokens; h_in 32 and h_out 64 "
                         f"are split too): 1, 2, 4 or 8; got {devices}")
    mesh = make_mesh((devices,), (lay.axis,))
    x, w = linear_inputs(0)
    text = jit_linear(layout, mesh).lower(place(x, mesh, lay.x), place(w, mesh, lay.w)).as_text()
    mesh_line = next((ln.strip() for ln in text.splitlines() if ln.lstrip().startswith(
        "sdy.mesh")), None)
    return {"shardy": bool(jax.config.jax_use_shardy_partitioner),
            "attributes": sorted(set(re.findall(r"\b(sdy\.[a-z_]+)", text))),
            "gspmd_attributes": sorted(set(re.findall(r"\b(mhlo\.sharding)\b", text))),
            "mesh_line": mesh_line}


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0]}"


def both_dims_on_one_axis(devices: int = DEVICES, tokens: int = 16, h_in: int = 32,
                          h_out: int = 64) -> dict:
    """``Y = X W`` with X split by rows and W by columns over the same ``"model"`` axis, both
    non-contracting dims on one axis: what Explicit axes say (the sharding in the type, the
    error, ``out_sharding=``) and what Auto axes compile to instead."""
    check_devices(devices)
    for name, value in (("tokens", tokens), ("h_in", h_in), ("h_out", h_out)):
        check_int(name, value)
    if tokens % devices or h_out % devices:
        raise ValueError(f"tokens = {tokens} and h_out = {h_out} must be divisible by devices = "
                         f"{devices} (X's rows and W's columns are split over \"model\")")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((tokens, h_in)).astype(np.float32)   # (tokens, h_in)
    w = rng.standard_normal((h_in, h_out)).astype(np.float32)    # (h_in, h_out)
    explicit = jax.make_mesh((devices,), ("model",), axis_types=(AxisType.Explicit,),
                             devices=jax.devices("cpu")[:devices])
    xe = jax.device_put(x, NamedSharding(explicit, P("model", None)))
    we = jax.device_put(w, NamedSharding(explicit, P(None, "model")))
    out: dict = {"x_type": str(jax.typeof(xe)), "w_type": str(jax.typeof(we)),
                 "axis_types": str(explicit.axis_types)}
    try:
        jnp.matmul(xe, we)
        out["no_out_sharding"] = "no error"
    except Exception as e:  # noqa: BLE001 (JAX's own error type is the point)
        out["no_out_sharding"] = _first_line(e)
    try:
        NamedSharding(explicit, P("model", "model"))
        out["duplicate_spec"] = "no error"
    except Exception as e:  # noqa: BLE001
        out["duplicate_spec"] = _first_line(e)
    out["out_sharding"] = {}
    for spec in (P("model", None), P(None, "model")):
        target = NamedSharding(explicit, spec)

        def f(a, b, target=target):
            return jnp.matmul(a, b, out_sharding=target)   # (tokens, h_out), laid out as asked

        fn = jax.jit(f)
        y = fn(xe, we)
        out["out_sharding"][str(spec)] = {
            "type": str(jax.typeof(y)), "equal": bool(np.allclose(np.asarray(y), x @ w,
                                                                  rtol=1e-5, atol=1e-4)),
            "collectives": collectives(fn.lower(xe, we).compile().as_text())}
    auto = make_mesh((devices,), ("model",))
    xa, wa = place(x, auto, P("model", None)), place(w, auto, P(None, "model"))
    fn = jax.jit(_linear)
    y = fn(xa, wa)
    out["auto"] = {"x_type": str(jax.typeof(xa)), "y_spec": str(y.sharding.spec),
                   "equal": bool(np.allclose(np.asarray(y), x @ w, rtol=1e-5, atol=1e-4)),
                   "collectives": collectives(fn.lower(xa, wa).compile().as_text())}
    return out

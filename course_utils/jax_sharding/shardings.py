"""Meshes and shardings: named device axes, arrays placed on them, where each shard lives.

A mesh of CPU devices with named Auto axes (:func:`make_mesh`: the compiler propagates
shardings, GSPMD style), arrays placed on it as a ``PartitionSpec`` says (:func:`place`), where
each shard lives and what it weighs (:func:`shard_table`, :func:`bytes_per_device`,
:func:`local_bytes`, :func:`global_bytes`, :func:`draw_sharding`), and a spec as plain data
(:func:`spec_entries`). The argument checks the other modules share live here too
(:func:`check_mesh`, :func:`check_numeric`, :func:`check_shape`, :func:`check_spec`,
:func:`check_divisible`). Lecture 8 (JAX), section 1; assignment a8 (Q1, Q2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Sequence

from course_utils.jax_sharding.devices import require_devices  # first: sets XLA_FLAGS

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from course_utils.runtime.validate import check_int  # noqa: E402

__all__ = ["P", "make_mesh", "place", "shard_table", "bytes_per_device", "local_bytes",
           "global_bytes", "spec_entries", "draw_sharding"]


def make_mesh(shape: Sequence[int], names: Sequence[str]) -> Mesh:
    """A mesh of the first ``prod(shape)`` CPU devices, row-major, with Auto axes (the compiler
    propagates shardings and chooses the collectives)."""
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or not shape or any(
            isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape):
        raise ValueError(f"shape must be a non-empty sequence of ints >= 1; got {shape!r}")
    if (isinstance(names, (str, bytes)) or not isinstance(names, Sequence)
            or len(names) != len(shape) or len(set(names)) != len(names)
            or not all(isinstance(n, str) and n for n in names)):
        raise ValueError(f"names must give one distinct axis name per entry of shape "
                         f"{tuple(shape)}; got {names!r}")
    devices = require_devices(math.prod(shape))
    return Mesh(np.array(devices).reshape(tuple(shape)), tuple(names),
                axis_types=(AxisType.Auto,) * len(shape))


def check_mesh(mesh: Any, name: str = "mesh") -> Mesh:
    """``mesh`` if it is a ``jax.sharding.Mesh``; else TypeError naming ``name``."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"{name} must be a jax.sharding.Mesh (js.make_mesh(...)); got "
                        f"{type(mesh).__name__}")
    return mesh


def check_shape(name: str, shape: Any) -> tuple[int, ...]:
    """``shape`` as a tuple of ints >= 1 (an array's dims); else ValueError naming ``name``."""
    if (isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or any(
            isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1 for d in shape)):
        raise ValueError(f"{name} must be a sequence of ints >= 1 (an array's dims); got "
                         f"{shape!r}")
    return tuple(int(d) for d in shape)


def check_numeric(name: str, x: Any) -> Any:
    """``x`` (a jax.Array, or as a numpy array) if it holds numbers; else TypeError naming
    ``name``."""
    arr = x if isinstance(x, jax.Array) else None
    if arr is None:
        try:
            arr = np.asarray(x)
        except (TypeError, ValueError) as e:  # ragged nested lists
            raise TypeError(f"{name} must be an array of numbers; got {type(x).__name__} "
                            f"({e})") from None
    if not (jnp.issubdtype(arr.dtype, jnp.number) or jnp.issubdtype(arr.dtype, jnp.bool_)):
        raise TypeError(f"{name} must be an array of numbers; got dtype {arr.dtype}")
    return arr


def _spec_axes(entry: Any) -> tuple:
    return entry if isinstance(entry, tuple) else (entry,)


def check_spec(mesh: Mesh, spec: Any, ndim: int, name: str = "spec") -> None:
    """``spec`` must be a PartitionSpec of at most ``ndim`` entries, each None, an axis of
    ``mesh`` or a tuple of them, no axis twice; else TypeError / ValueError naming ``name``."""
    if not isinstance(spec, P):
        raise TypeError(f"{name} must be a PartitionSpec (P(...)); got {type(spec).__name__}")
    if len(spec) > ndim:
        raise ValueError(f"{name} {spec} has {len(spec)} entries for an array of {ndim} dims")
    used: list = []
    for entry in spec:
        for axis in _spec_axes(entry):
            if axis is None:
                continue
            if not isinstance(axis, str):
                raise TypeError(f"{name} {spec}: each entry must be None, a mesh axis name or a "
                                f"tuple of them; got {axis!r}")
            if axis not in mesh.axis_names:
                raise ValueError(f"{name} {spec} names axis {axis!r}; the mesh's axes are "
                                 f"{list(mesh.axis_names)}")
            if axis in used:
                raise ValueError(f"{name} {spec} names axis {axis!r} twice: a mesh axis can "
                                 "split at most one dim of an array")
            used.append(axis)


def check_divisible(mesh: Mesh, spec: P, shape: tuple[int, ...], name: str = "spec") -> None:
    """Each dim of ``shape`` must be divisible by the mesh axes ``spec`` splits it over; else
    ValueError naming ``name``."""
    for dim, (size, entry) in enumerate(zip(shape, spec)):
        parts = math.prod(mesh.shape[a] for a in _spec_axes(entry) if a is not None)
        if size % parts:
            raise ValueError(f"{name} {spec} splits dim {dim} (size {size}) of shape {shape} "
                             f"{parts} ways: the size must be divisible by {parts}")


def place(x: Any, mesh: Mesh, spec: P) -> jax.Array:
    """``x`` on ``mesh``, split as ``spec`` says (``jax.device_put`` with a NamedSharding)."""
    check_mesh(mesh)
    arr = check_numeric("x", x)
    check_spec(mesh, spec, arr.ndim)
    check_divisible(mesh, spec, tuple(arr.shape))
    if isinstance(arr, jax.Array):
        return jax.device_put(arr, NamedSharding(mesh, spec))
    # From the host, each device gets its block copied straight from numpy (JAX's dtype: float32
    # for float64). Going through jnp.asarray first would put the whole array on device 0 and
    # compile a program to split it: about half a second per new shape.
    host = np.asarray(arr, dtype=jax.dtypes.canonicalize_dtype(arr.dtype))
    return jax.device_put(host, NamedSharding(mesh, spec), may_alias=False)


def _slice_text(index: tuple, shape: tuple[int, ...]) -> str:
    parts = []
    for s, n in zip(index, shape):
        start, stop = s.start or 0, n if s.stop is None else s.stop
        parts.append(":" if (start, stop) == (0, n) else f"{start}:{stop}")
    return "[" + ", ".join(parts) + "]"


def shard_table(x: jax.Array) -> list[dict]:
    """One row per device: device id, the block of ``x`` it holds, its shape and bytes."""
    if not isinstance(x, jax.Array):
        raise TypeError(f"x must be a jax.Array; got {type(x).__name__}")
    rows = []
    for shard in sorted(x.addressable_shards, key=lambda s: s.device.id):
        rows.append({"device": shard.device.id, "block": _slice_text(shard.index, x.shape),
                     "shape": tuple(shard.data.shape), "nbytes": int(shard.data.nbytes)})
    return rows


def bytes_per_device(tree: Any) -> dict[int, int]:
    """Bytes each device holds for the arrays in ``tree`` (their shards, from
    ``addressable_shards``): ``{device id: bytes}``. A buffer that appears twice in ``tree``
    (the same array under two names) is counted once: it is one allocation."""
    out: dict[int, int] = {}
    leaves = jax.tree.leaves(tree)
    if not leaves or not all(isinstance(a, jax.Array) for a in leaves):
        raise TypeError("tree must hold jax.Arrays (a pytree of them)")
    seen = set()
    for a in leaves:
        for shard in a.addressable_shards:
            buffer = (shard.device.id, shard.data.unsafe_buffer_pointer())
            if buffer not in seen:
                seen.add(buffer)
                out[shard.device.id] = out.get(shard.device.id, 0) + int(shard.data.nbytes)
    return dict(sorted(out.items()))


def local_bytes(shape: Sequence[int], spec: P, mesh_shape: dict[str, int],
                itemsize: int = 4) -> int:
    """Bytes of one device's block of an array of ``shape`` split by ``spec`` over a mesh whose
    axis sizes are ``mesh_shape`` (a prediction, no devices needed)."""
    shape = check_shape("shape", shape)
    if not isinstance(spec, P):
        raise TypeError(f"spec must be a PartitionSpec (P(...)); got {type(spec).__name__}")
    if not isinstance(mesh_shape, Mapping) or not mesh_shape or any(
            not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int) or v < 1
            for k, v in mesh_shape.items()):
        raise ValueError(f"mesh_shape must map each axis name to its size (an int >= 1), like "
                         f"dict(mesh.shape); got {mesh_shape!r}")
    check_int("itemsize", itemsize)
    if len(spec) > len(shape):
        raise ValueError(f"spec {spec} has more entries than shape {tuple(shape)} has dims")
    n = math.prod(shape) * itemsize
    for dim, entry in zip(shape, spec):
        for axis in (entry if isinstance(entry, tuple) else (entry,)):
            if axis is None:
                continue
            if axis not in mesh_shape:
                raise ValueError(f"spec {spec} names axis {axis!r}; mesh_shape has "
                                 f"{list(mesh_shape)}")
            if dim % mesh_shape[axis]:
                raise ValueError(f"dim {dim} of shape {tuple(shape)} is not divisible by the "
                                 f"{axis!r} axis size {mesh_shape[axis]}")
            n //= mesh_shape[axis]
    return n


def global_bytes(tree: Any) -> int:
    """Bytes of the whole (global) arrays in ``tree``, as if on one device."""
    leaves = jax.tree.leaves(tree)
    if not leaves or not all(isinstance(a, (jax.Array, np.ndarray)) for a in leaves):
        raise TypeError("tree must hold arrays (jax.Array or numpy; a pytree of them)")
    return sum(int(a.size) * a.dtype.itemsize for a in jax.tree.leaves(tree))


def spec_entries(spec: Any, ndim: int) -> list:
    """``spec``'s entries padded with None to ``ndim`` (``P("data")`` and ``P("data", None)``
    say the same for a 2-D array), tuples as lists: plain data to submit and compare."""
    if not isinstance(spec, P):
        raise TypeError(f"spec must be a PartitionSpec (P(...)); got {type(spec).__name__}")
    check_int("ndim", ndim, 0)
    if len(spec) > ndim:
        raise ValueError(f"spec {spec} has {len(spec)} entries for an array of {ndim} dims")
    out = [list(e) if isinstance(e, tuple) else e for e in spec]
    return out + [None] * (ndim - len(out))


def draw_sharding(x: jax.Array, name: str = "W", ax: Any = None) -> Any:
    """Figure: the mesh's devices on a grid (rows: the first axis, columns: the second), each
    labelled with the block of ``x`` it holds; devices holding the same block share a colour.
    Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex, to_rgb
    from matplotlib.patches import Rectangle

    from course_utils import style

    if not isinstance(x, jax.Array) or not isinstance(x.sharding, NamedSharding):
        raise TypeError("x must be a jax.Array placed with a NamedSharding (course_utils."
                        "jax_sharding.place)")
    if not isinstance(name, str):
        raise TypeError(f"name must be a str (the array's label); got {type(name).__name__}")
    from matplotlib.axes import Axes
    if ax is not None and not isinstance(ax, Axes):
        raise TypeError(f"ax must be a matplotlib Axes or None; got {type(ax).__name__}")
    mesh = x.sharding.mesh
    shape = tuple(mesh.devices.shape)
    rows, cols = (shape[0], math.prod(shape[1:])) if len(shape) > 1 else (1, shape[0])
    blocks = {row["device"]: row["block"] for row in shard_table(x)}
    distinct = sorted(set(blocks.values()), key=list(blocks.values()).index)
    base = to_rgb(style.AXIS_COLORS["tp"])
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.9 * rows + 1.0), layout="constrained")
    for k, device in enumerate(mesh.devices.reshape(-1)):
        y, xpos = divmod(k, cols)
        f = distinct.index(blocks[device.id]) / max(1, len(distinct) - 1)
        colour = to_hex(tuple(0.75 * c + f * (1 - 0.75 * c) * 0.7 for c in base))
        ax.add_patch(Rectangle((xpos + 0.04, y + 0.06), 0.92, 0.88, facecolor=colour,
                               edgecolor="black", linewidth=1))
        _ = ax.text(xpos + 0.5, y + 0.5, f"device {device.id}\n{name}{blocks[device.id]}",
                    ha="center", va="center", fontsize=10, linespacing=1.4)
    _ = ax.set_xlim(0, cols)
    _ = ax.set_ylim(rows, 0)
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    names = mesh.axis_names
    _ = ax.set_xticks([c + 0.5 for c in range(cols)],
                      [f"{names[-1]} {c % shape[-1]}" for c in range(cols)])
    if len(shape) > 1:
        _ = ax.set_yticks([r + 0.5 for r in range(rows)], [f"{names[0]} {r}" for r in range(rows)])
    else:
        _ = ax.set_yticks([])
    _ = ax.set_title(f"{name} {tuple(x.shape)} split as {x.sharding.spec}: "
                     f"{len(distinct)} distinct block(s) of shape {shard_table(x)[0]['shape']}")
    return ax.figure

"""The course's plans in JAX: declare a mesh and shardings, the compiler inserts the collectives.

JAX sees one process with several devices. On a laptop those are CPU "devices" that XLA makes
when ``XLA_FLAGS`` contains ``--xla_force_host_platform_device_count=8`` at the moment JAX starts
its CPU backend (the first ``import jax`` of the process). Importing this module adds that flag
if JAX has not been imported yet; :func:`require_devices` refuses, naming the fix, if JAX
already started with fewer devices. JAX is imported only here and in
``course_utils.jax_sharding.framework_compare`` (the rest of ``course_utils`` works without it).

What is here, in the order of lecture 8:

* a mesh of CPU devices with named axes (:func:`make_mesh`, Auto axes: the compiler propagates
  shardings, GSPMD style), arrays placed on it (:func:`place`), where each shard lives
  (:func:`shard_table`, :func:`bytes_per_device`, :func:`draw_sharding`);
* the compiled program's collectives, read from its HLO text (:func:`compiled_text`,
  :func:`collectives`);
* data parallelism (:func:`lesson_two_replicas`, :func:`dp_step_check`), tensor-parallel
  layouts of ``Y = X W`` compiled by ``jit`` and written by hand with ``shard_map``
  (:data:`LAYOUTS`, :func:`jit_linear`, :func:`shard_map_linear`, :func:`compare_layouts`),
  FSDP/ZeRO-3 style sharded training state (:func:`fsdp_state`), and a 2-D (data x model) MLP
  block (:func:`mlp_2d`);
* beyond Auto propagation: Explicit axes and the illegal layout (:func:`both_dims_on_one_axis`),
  ``with_sharding_constraint`` (:func:`constrained_mlp`), what the CPU backend emits instead of
  a reduce-scatter (:func:`op_counts`), a ring step with ``ppermute`` (:func:`ring_step`,
  :func:`ring_reduce_scatter`), the compiler's memory figures (:func:`fsdp_memory`) and
  ``jax.checkpoint`` policies (:func:`saved_residuals`);
* what the collectives cost: module 2's alpha-beta ring model applied to the collectives read
  from the HLO (:func:`ring_cost`, :func:`cost_table`), and when FSDP's or TP's communication
  fits inside its matmul (:func:`hides_behind_matmul`, with published accelerator figures in
  :data:`ACCELERATORS`).

Every public function checks its arguments before any JAX work: a bad one raises ValueError or
TypeError naming it and saying what is allowed.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Sequence

DEVICES = 8  # the lecture's CPU devices
DEVICE_FLAG = "--xla_force_host_platform_device_count"


def with_device_flag(flags: str, n: int) -> str:
    """``flags`` (an ``XLA_FLAGS`` value) with the host device count set to ``n``."""
    if not isinstance(flags, str):
        raise TypeError(f"flags must be a str (an XLA_FLAGS value); got {type(flags).__name__}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1 (the number of CPU devices); got {n!r}")
    kept = [f for f in flags.split() if not f.startswith(DEVICE_FLAG + "=")]
    return " ".join(kept + [f"{DEVICE_FLAG}={n}"])


if "jax" not in sys.modules:  # the flag only counts before JAX starts its CPU backend
    os.environ["XLA_FLAGS"] = with_device_flag(os.environ.get("XLA_FLAGS", ""), DEVICES)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import shard_map  # noqa: E402
from jax.ad_checkpoint import print_saved_residuals  # noqa: E402
from jax.sharding import AxisType, Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from course_utils.runtime.validate import check_int, check_real  # noqa: E402

__all__ = ["DEVICES", "DEVICE_FLAG", "COLLECTIVES", "LAYOUTS", "Collective", "Layout", "P",
           "with_device_flag", "require_devices", "make_mesh", "place", "shard_table",
           "bytes_per_device", "local_bytes", "global_bytes", "compiled_text", "collectives",
           "collective_names", "draw_sharding", "lesson_two_replicas", "init_mlp", "mlp_apply",
           "mse", "dp_step_check", "jit_linear", "shard_map_linear", "linear_inputs",
           "compare_layouts", "layout_table", "fsdp_state", "mlp_2d", "spec_entries",
           "compile_plan", "row_parallel_harness", "both_dims_on_one_axis", "constrained_mlp",
           "op_counts", "partitioner", "ring_step", "ring_reduce_scatter", "fsdp_memory",
           "POLICIES", "saved_residuals", "RING_OPS", "ring_cost", "cost_table", "ACCELERATORS",
           "hides_behind_matmul"]

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def require_devices(n: int = DEVICES) -> list:
    """The first ``n`` CPU devices; a clear error if JAX started with fewer."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an int >= 1 (the number of CPU devices); got {n!r}")
    devices = jax.devices("cpu")
    if len(devices) < n:
        raise RuntimeError(
            f"JAX has {len(devices)} CPU device(s), and {n} are needed. The device count is "
            f"fixed when JAX starts: XLA_FLAGS must contain {DEVICE_FLAG}={n} before the first "
            "`import jax` in this process (it was imported earlier without it). Restart the "
            "kernel and run the setup cell first (it sets XLA_FLAGS, then imports JAX).")
    return devices[:n]


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


def _check_mesh(mesh: Any, name: str = "mesh") -> Mesh:
    if not isinstance(mesh, Mesh):
        raise TypeError(f"{name} must be a jax.sharding.Mesh (js.make_mesh(...)); got "
                        f"{type(mesh).__name__}")
    return mesh


def _check_callable(name: str, fn: Any) -> Callable:
    if not callable(fn):
        raise TypeError(f"{name} must be a function (a callable); got {type(fn).__name__}")
    return fn


def _check_shape(name: str, shape: Any) -> tuple[int, ...]:
    """``shape`` as a tuple of ints >= 1 (an array's dims); else ValueError naming ``name``."""
    if (isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or any(
            isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1 for d in shape)):
        raise ValueError(f"{name} must be a sequence of ints >= 1 (an array's dims); got "
                         f"{shape!r}")
    return tuple(int(d) for d in shape)


def _check_sizes(sizes: Any, name: str = "sizes") -> tuple[int, ...]:
    """Layer widths of an MLP: at least 2 ints >= 1."""
    if (isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence) or len(sizes) < 2
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes)):
        raise ValueError(f"{name} must be a sequence of at least 2 ints >= 1 (layer widths); "
                         f"got {sizes!r}")
    return tuple(sizes)


def _check_devices(devices: Any, name: str = "devices") -> int:
    """A device count from 1 to the CPU devices JAX has."""
    check_int(name, devices)
    have = len(jax.devices("cpu"))
    if devices > have:
        raise ValueError(f"{name} must be at most the {have} CPU devices JAX has; got {devices}")
    return devices


def _check_numeric(name: str, x: Any) -> Any:
    """``x`` (a jax.Array, or as a numpy array) if it holds numbers; else TypeError."""
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


def _check_spec(mesh: Mesh, spec: Any, ndim: int, name: str = "spec") -> None:
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


def _check_divisible(mesh: Mesh, spec: P, shape: tuple[int, ...], name: str = "spec") -> None:
    for dim, (size, entry) in enumerate(zip(shape, spec)):
        parts = math.prod(mesh.shape[a] for a in _spec_axes(entry) if a is not None)
        if size % parts:
            raise ValueError(f"{name} {spec} splits dim {dim} (size {size}) of shape {shape} "
                             f"{parts} ways: the size must be divisible by {parts}")


def place(x: Any, mesh: Mesh, spec: P) -> jax.Array:
    """``x`` on ``mesh``, split as ``spec`` says (``jax.device_put`` with a NamedSharding)."""
    _check_mesh(mesh)
    arr = _check_numeric("x", x)
    _check_spec(mesh, spec, arr.ndim)
    _check_divisible(mesh, spec, tuple(arr.shape))
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
    shape = _check_shape("shape", shape)
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


def compiled_text(fn: Callable, *args: Any, out_shardings: Any = None) -> str:
    """The HLO text of ``jit(fn)`` compiled for ``args`` (after XLA's partitioning passes)."""
    _check_callable("fn", fn)
    jitted = jax.jit(fn) if out_shardings is None else jax.jit(fn, out_shardings=out_shardings)
    return jitted.lower(*args).compile().as_text()


@dataclass(frozen=True)
class Collective:
    """One collective of a compiled program: its HLO op name, result shapes, bytes, group size."""

    op: str
    shapes: tuple[tuple[int, ...], ...]
    nbytes: int
    group_size: int | None

    def __str__(self) -> str:
        shapes = ", ".join(str(s) for s in self.shapes)
        group = f", groups of {self.group_size}" if self.group_size else ""
        return f"{self.op} of {shapes} ({self.nbytes} B{group})"


_ITEMSIZE = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s64": 8, "pred": 1,
             "s8": 1, "u8": 1}
_OP_LINE = re.compile(r"=\s*(?P<type>.+?)\s+(?P<op>" + "|".join(COLLECTIVES)
                      + r")(?P<phase>-start|-done)?\(")


def _group_size(line: str) -> int | None:
    explicit = re.search(r"replica_groups=\{\{([0-9,]+)\}", line)
    if explicit:
        return len(explicit.group(1).split(","))
    named = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if named:
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", named.group(1)))
        axes = re.findall(r"'([^']+)'", named.group(2))
        return math.prod(int(sizes[a]) for a in axes) if axes else None
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", line)
    return int(iota.group(2)) if iota else None


def collectives(hlo: str) -> list[Collective]:
    """The collectives in compiled HLO text, in program order, with their result shapes and bytes.

    An asynchronous pair (``all-gather-start`` / ``all-gather-done``, as XLA prints them on GPU)
    counts once, at its ``-done``, whose type is the result alone (the ``-start``'s type is the
    tuple of operand and result, plus context scalars for a collective-permute)."""
    if not isinstance(hlo, str):
        raise TypeError(f"hlo must be the HLO text (a str); got {type(hlo).__name__}")
    found, started = [], {}  # started: op -> the group size its -start line names
    for line in hlo.splitlines():
        m = _OP_LINE.search(line)
        if not m or line.lstrip().startswith("ROOT %tuple"):
            continue
        if m.group("phase") == "-start":
            started[m.group("op")] = _group_size(line)
            continue
        shapes, nbytes = [], 0
        for dtype, dims in re.findall(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]", m.group("type")):
            if dtype not in _ITEMSIZE:
                continue
            shape = tuple(int(d) for d in dims.split(",") if d)
            shapes.append(shape)
            nbytes += math.prod(shape) * _ITEMSIZE[dtype]
        group = (started.pop(m.group("op"), None) if m.group("phase") == "-done"
                 else _group_size(line))
        found.append(Collective(m.group("op"), tuple(shapes), nbytes, group))
    return found


def collective_names(hlo: str) -> list[str]:
    """Just the op names of :func:`collectives` (``[]``: the program communicates nothing)."""
    return [c.op for c in collectives(hlo)]


# ------------------------------------------------------------------------------------ pictures


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


# ------------------------------------------------------------------------- data parallelism


def _on_one_device(*trees: Any) -> tuple:
    """``trees`` placed whole on CPU device 0 (the one-device reference runs there)."""
    return jax.device_put(trees, jax.devices("cpu")[0])


def lesson_two_replicas(grads: Sequence[Sequence[float]] = ((2.0, 4.0), (6.0, 0.0)),
                        w0: Sequence[float] = (1.0, 1.0), lr: float = 0.1) -> dict:
    """Module 2's two-replica example on a 2-device ``"data"`` mesh: replica ``r``'s loss is
    ``g_r . w`` (so its local gradient is ``g_r``); ``jit`` of the mean loss's gradient with the
    rows sharded over ``"data"`` gives the mean gradient, and one SGD step."""
    g = np.asarray(_check_numeric("grads", grads), dtype=np.float32)  # (replicas, params)
    if g.ndim != 2 or g.shape[0] < 1 or g.shape[1] < 1:
        raise ValueError(f"grads must be a list of equal-length gradients; got {grads!r}")
    _check_devices(g.shape[0], "the number of gradients (replicas, one per device) in grads")
    w = np.asarray(_check_numeric("w0", w0), dtype=np.float32)  # (params,)
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


def init_mlp(seed: int, sizes: Sequence[int] = (16, 64, 16)) -> list[np.ndarray]:
    """Weights and biases of an MLP (numpy, float32): W_k ~ N(0, 1/fan_in), biases 0."""
    check_int("seed", seed, 0)
    sizes = _check_sizes(sizes)
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


def dp_step_check(seed: int = 0, devices: int = DEVICES, batch: int = 32,
                  sizes: Sequence[int] = (16, 64, 16)) -> dict:
    """One data-parallel gradient: batch split over ``"data"``, params replicated; compared with
    the same gradient on one device and with the mean of per-shard gradients."""
    check_int("seed", seed, 0)
    _check_devices(devices)
    check_int("batch", batch)
    sizes = _check_sizes(sizes)
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
    one = jax.device_get(jax.jit(grad_fn)(*_on_one_device(params, x, y)))
    parts = np.split(np.arange(batch), devices)
    shard_grad = jax.jit(grad_fn)  # (one compile for the 8 equal shards; run op by op, each
    per_shard = [jax.device_get(shard_grad(params, x[i], y[i])) for i in parts]  # op compiles)
    mean_of_shards = [np.mean([g[k] for g in per_shard], axis=0) for k in range(len(params))]
    return {"grads": [np.asarray(g) for g in sharded], "one_device": list(one),
            "mean_of_shards": mean_of_shards,
            "grad_sharding": [g.sharding.spec for g in sharded],
            "collectives": collectives(compiled_text(grad_fn, p_repl, xs, ys))}


# ------------------------------------------------------------------------- tensor parallelism


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


def _layout(name: str) -> Layout:
    if name not in LAYOUTS:
        raise ValueError(f"layout must be one of {list(LAYOUTS)}; got {name!r}")
    return LAYOUTS[name]


def _layout_on(name: str, mesh: Any) -> Layout:
    """The layout ``name``, checked against ``mesh`` (it must have the layout's axis)."""
    lay = _layout(name)
    _check_mesh(mesh)
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
    _check_devices(devices)
    if 16 % devices:
        raise ValueError(f"devices must divide 16 (linear_inputs' tokens; h_in 32 and h_out 64 "
                         f"are split too): 1, 2, 4 or 8; got {devices}")
    x, w = linear_inputs(seed)
    one = np.asarray(jax.jit(_linear)(*_on_one_device(x, w)))
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


# ------------------------------------------------------------------------------ FSDP / ZeRO-3


def _sharded_adam_state(sizes: Any, seed: Any, devices: Any) -> tuple[Mesh, list, dict]:
    """(mesh, weights, state): an MLP's FP32 weights, gradients and two Adam moments, every
    array split by its first dim over a ``"data"`` axis of ``devices``; the three zero states
    are distinct buffers (a new one on every device for each)."""
    sizes = _check_sizes(sizes)
    check_int("seed", seed, 0)
    _check_devices(devices)
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


# ----------------------------------------------------------------------------- 2-D mesh MLP


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
    _check_devices(data * model, "data x model (the mesh's devices)")
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
    ref = jax.jit(step)(*_on_one_device([w1, w2], x))
    fwd = compiled_text(block, [w1s, w2s], xs, out_shardings=NamedSharding(mesh, specs["x"]))
    return {"specs": specs, "bytes_per_device": bytes_per_device([w1s, w2s]),
            "x_bytes_per_device": bytes_per_device(xs),
            "shapes": {"x": x.shape, "w1": w1.shape, "w2": w2.shape},
            "mesh_shape": dict(mesh.shape), "forward": collectives(fwd),
            "step": collectives(hlo), "new": [np.asarray(a) for a in new],
            "one_device": [np.asarray(a) for a in ref]}


# ------------------------------------------------------------------------- assignment harness


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


def compile_plan(mesh: Mesh, fn: Callable, shapes: dict[str, tuple[int, ...]],
                 specs: dict[str, P], out_spec: P) -> dict:
    """Compile ``fn`` (positional arguments in the order of ``shapes``) for float32 arrays of
    ``shapes`` placed as ``specs``, its output laid out as ``out_spec``; return the collectives
    read from the compiled HLO and the bytes device 0 holds of each input and of the output."""
    _check_mesh(mesh)
    _check_callable("fn", fn)
    if not isinstance(shapes, Mapping) or not shapes:
        raise TypeError(f"shapes must be a dict {{name: shape}} of fn's arguments; got "
                        f"{type(shapes).__name__}")
    if not isinstance(specs, Mapping) or set(shapes) != set(specs):
        raise ValueError(f"specs must give one spec per array of shapes {list(shapes)}; got "
                         f"{list(specs) if isinstance(specs, Mapping) else type(specs).__name__}")
    for name, shape in shapes.items():
        _check_spec(mesh, specs[name], len(_check_shape(f"shapes[{name!r}]", shape)),
                    f"specs[{name!r}]")
        _check_divisible(mesh, specs[name], tuple(shape), f"specs[{name!r}]")
    _check_spec(mesh, out_spec, len(out_spec) if isinstance(out_spec, P) else 0, "out_spec")
    args = [place(np.zeros(shape, np.float32), mesh, specs[name]) for name, shape in
            shapes.items()]
    jitted = jax.jit(fn, out_shardings=NamedSharding(mesh, out_spec))
    out = jitted(*args)
    return {"collectives": collective_names(jitted.lower(*args).compile().as_text()),
            "bytes": {name: bytes_per_device(a)[0] for name, a in zip(shapes, args)},
            "out_bytes": bytes_per_device(out)[0]}


def row_parallel_harness(fn: Callable, x: Any, w: Any, b: Any, devices: int = DEVICES
                         ) -> dict:
    """Run a student's ``fn(x_local, w_local, b)`` under ``shard_map`` on a ``devices``-wide
    ``"model"`` mesh (X split by columns, W by rows, b replicated, Y replicated); return Y as
    numpy and the collectives of the compiled program."""
    if not callable(fn):
        raise TypeError(f"fn must be a function fn(x_local, w_local, b); got {type(fn).__name__}")
    _check_devices(devices)
    x = np.asarray(_check_numeric("x", x), np.float32)  # (tokens, h_in)
    w = np.asarray(_check_numeric("w", w), np.float32)  # (h_in, h_out)
    b = np.asarray(_check_numeric("b", b), np.float32)  # (h_out,)
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


# ------------------------------------------------------------- beyond Auto: Explicit axes


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0]}"


def both_dims_on_one_axis(devices: int = DEVICES, tokens: int = 16, h_in: int = 32,
                          h_out: int = 64) -> dict:
    """``Y = X W`` with X split by rows and W by columns over the same ``"model"`` axis, both
    non-contracting dims on one axis: what Explicit axes say (the sharding in the type, the
    error, ``out_sharding=``) and what Auto axes compile to instead."""
    _check_devices(devices)
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


def constrained_mlp(devices: int = DEVICES, seed: int = 0, tokens: int = 16, h: int = 32,
                    ffn: int = 128) -> list[dict]:
    """The Megatron pair ``tanh(X W1) W2`` (W1 by columns, W2 by rows over ``"model"``) compiled
    with and without ``jax.lax.with_sharding_constraint`` on the hidden activation: one row per
    constraint, its collectives, and whether Y equals the unconstrained Y."""
    _check_devices(devices)
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


def op_counts(hlo: str, ops: Sequence[str]) -> dict[str, int]:
    """How many instructions of each op name in ``ops`` the HLO text holds (fused computations
    included): ``{op: count}``."""
    if not isinstance(hlo, str):
        raise TypeError(f"hlo must be the HLO text (a str); got {type(hlo).__name__}")
    if (isinstance(ops, (str, bytes)) or not isinstance(ops, Sequence) or not ops
            or not all(isinstance(o, str) and re.fullmatch(r"[a-z][a-z0-9-]*", o) for o in ops)):
        raise ValueError(f"ops must be a list of HLO op names, like ['all-reduce', "
                         f"'dynamic-slice']; got {ops!r}")
    pattern = re.compile(r"=\s*.+?\s+(" + "|".join(map(re.escape, ops)) + r")\(")
    counts = dict.fromkeys(ops, 0)
    for line in hlo.splitlines():
        m = pattern.search(line)
        if m:
            counts[m.group(1)] += 1
    return counts


def partitioner(layout: str = "row", devices: int = DEVICES) -> dict:
    """Which partitioner this JAX lowers to: the ``jax_use_shardy_partitioner`` flag, and the
    Shardy (``sdy.``) attributes in the lowered (StableHLO) text of a layout's ``jit``."""
    lay = _layout(layout)
    _check_devices(devices)
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


# ---------------------------------------------------------------------- a ring with ppermute


def _ring_perm(devices: int) -> list[tuple[int, int]]:
    return [(i, (i + 1) % devices) for i in range(devices)]  # device i sends to i + 1


def ring_step(devices: int = DEVICES) -> dict:
    """One step of a ring in ``shard_map``: ``jax.lax.ppermute`` sends each device's block to
    the next device. Returns what each device holds before and after, and the collectives."""
    _check_devices(devices)
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
    _check_devices(devices)
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


# ------------------------------------------------------------------ what the compiler allocates


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


# ----------------------------------------------------------------- recomputation (module 9)

POLICIES = ("no checkpoint", "nothing_saveable", "dots_saveable", "everything_saveable")


def _dtype_bytes(text: str) -> int:
    m = re.match(r"([a-z]+[0-9]*)\[([0-9,]*)\]", text)
    if not m or m.group(1) not in _ITEMSIZE:
        return 0
    return math.prod(int(d) for d in m.group(2).split(",") if d) * _ITEMSIZE[m.group(1)]


def saved_residuals(policy: str, sizes: Sequence[int] = (16, 64, 64, 16), batch: int = 8,
                    seed: int = 0) -> dict:
    """What the backward pass of an MLP's mean-squared loss keeps from the forward pass, under
    ``jax.checkpoint`` with one of :data:`POLICIES` (``"no checkpoint"``: plain ``jax.grad``),
    as ``jax.ad_checkpoint.print_saved_residuals`` lists it; and the gradient, to compare."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {list(POLICIES)}; got {policy!r}")
    sizes = _check_sizes(sizes)
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
            "computed_bytes": sum(_dtype_bytes(k) for k, _ in computed),
            "grads": [np.asarray(g) for g in jax.jit(jax.grad(fn))(params, x)]}  # (one compile)


# ------------------------------------------------------------- what the collectives cost

RING_OPS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute")


def ring_cost(c: Collective, alpha_s: float, bandwidth_bytes_per_s: float) -> dict:
    """Module 2's alpha-beta time of one compiled collective on a ring of its group.

    Units: seconds; bytes. ``alpha_s`` is the fixed latency of each message, and
    ``bandwidth_bytes_per_s`` (beta) what one device's link sends per second. An all-reduce of
    n bytes over D devices is ``ring_allreduce.ring_time_s``: 2(D - 1) steps of n / D bytes.
    An all-gather (n = its result) and a reduce-scatter (n = its input, D x its result) are
    one of that ring's two phases, D - 1 steps of n / D: half of it. A collective-permute
    sends its buffer once: alpha + n / beta. Returns the steps, the bytes each device sends,
    and the latency, bandwidth and total time.
    """
    if not isinstance(c, Collective):
        raise TypeError(f"c must be a Collective (from js.collectives(hlo)); got "
                        f"{type(c).__name__}")
    if c.op not in RING_OPS:
        raise ValueError(f"c.op must be one of {list(RING_OPS)} (the ring model has no "
                         f"all-to-all); got {c.op!r}")
    alpha = check_real("alpha_s", alpha_s, 0, strict=False)
    beta = check_real("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
    from course_utils.collectives.ring import ring_bytes_per_rank, ring_time_s  # (imports torch)

    if c.op == "collective-permute":
        steps, sent, group = 1, float(c.nbytes), c.group_size
        total = alpha + c.nbytes / beta
    else:
        if c.group_size is None:
            raise ValueError(f"c.group_size is unknown for this {c.op}: the ring model needs D")
        group = c.group_size
        n = c.nbytes * group if c.op == "reduce-scatter" else c.nbytes
        sent = ring_bytes_per_rank(n, group, element_size=1)
        total = ring_time_s(n, group, alpha_s=alpha, bandwidth_bytes_per_s=beta)
        steps = 2 * (group - 1)
        if c.op != "all-reduce":                       # one phase of the ring: half of it
            sent, total, steps = sent / 2, total / 2, group - 1
    return {"op": c.op, "group": group, "steps": steps, "sent_bytes": sent,
            "latency_s": steps * alpha, "bandwidth_s": total - steps * alpha, "time_s": total}


def cost_table(programs: Mapping[str, Sequence[Collective]], alpha_s: float,
               bandwidth_bytes_per_s: float) -> str:
    """One line per collective of each program: bytes in the HLO, bytes each device sends, and
    :func:`ring_cost`'s latency, bandwidth and total time (microseconds)."""
    if not isinstance(programs, Mapping) or not programs or not all(
            isinstance(k, str) and isinstance(v, Sequence) for k, v in programs.items()):
        raise ValueError("programs must map a program's name to its list of Collectives "
                         "(js.collectives(hlo))")
    lines = [f"{'program':<22} {'collective':<19} {'D':>2} {'HLO bytes':>9} {'sent/device':>11} "
             f"{'latency':>9} {'bandwidth':>10} {'total':>9}"]
    for name, found in programs.items():
        for c in found:
            r = ring_cost(c, alpha_s, bandwidth_bytes_per_s)
            group = "-" if r["group"] is None else r["group"]
            lines.append(f"{name:<22} {c.op:<19} {group:>2} {c.nbytes:>9} "
                         f"{r['sent_bytes']:>11.0f} {r['latency_s'] * 1e6:>6.2f} us "
                         f"{r['bandwidth_s'] * 1e6:>7.3f} us {r['time_s'] * 1e6:>6.2f} us")
    return "\n".join(lines)


# Published figures, as stated by their sources (per chip; bytes/s one way per link).
ACCELERATORS: dict[str, dict[str, Any]] = {
    "TPU v5e": {"flops_per_s": 1.97e14, "link_bytes_per_s": 4.5e10,
                "source": "HTSYM tpus.md (jax-ml/scaling-book 0819a7d, lines 182, 192): "
                          "1.97e14 bf16 FLOP/s per chip; 4.5e10 B/s one way per ICI link "
                          "(9e10 bidirectional)"},
    "H100": {"flops_per_s": 9.9e14, "link_bytes_per_s": 4.5e11,
             "source": "HTSYM gpus.md (jax-ml/scaling-book 1a55377): 9.9e14 bf16 FLOP/s; "
                       "NVLink 4, 18 links x 25 GB/s = 450 GB/s each way per GPU"},
}
_PLANS = {"fsdp": "tokens per device", "tp": "d_ff per device"}


def hides_behind_matmul(plan: str, tokens_per_device: int, d_model: int, d_ff: int,
                        devices: int, flops_per_s: float, link_bytes_per_s: float,
                        itemsize: int = 2) -> dict:
    """Does the plan's collective fit in its local matmul's time (FLOPs / C vs bytes sent / W)?

    Units: seconds; FLOP/s; bytes/s (one device's link, one way, a one-way ring); itemsize in
    bytes (2: bf16). ``"fsdp"``: ``(tokens_per_device, d_model) @ (d_model, d_ff)`` needs the
    whole W all-gathered over ``devices``, (D - 1)/D x d_model d_ff itemsize bytes sent per
    device; the FLOPs grow with the tokens, the bytes do not. ``"tp"``: the Megatron pair
    ``(tokens, d_model) @ (d_model, d_ff / D) @ (d_ff / D, d_model)`` all-reduces its
    ``(tokens, d_model)`` output, 2 (D - 1)/D x tokens d_model itemsize bytes; the FLOPs grow
    with d_ff / D, the bytes do not. Both fit when that width (tokens per device, d_ff per
    device) is at least ``threshold`` = C / W x itemsize / 2 x (D - 1)/D, about C / W in bf16.
    The backward pass doubles both sides, so the rule holds for a training step. Latency
    (alpha) is left out: these messages are large.
    """
    if plan not in _PLANS:
        raise ValueError(f"plan must be one of {list(_PLANS)}; got {plan!r}")
    for name, value in (("tokens_per_device", tokens_per_device), ("d_model", d_model),
                        ("d_ff", d_ff), ("devices", devices), ("itemsize", itemsize)):
        check_int(name, value)
    c = check_real("flops_per_s", flops_per_s)
    w = check_real("link_bytes_per_s", link_bytes_per_s)
    if plan == "tp" and d_ff % devices:
        raise ValueError(f"d_ff = {d_ff} must be divisible by devices = {devices} (tensor "
                         "parallelism splits it)")
    from course_utils.collectives.ring import ring_time_s  # (imports torch)

    if plan == "fsdp":
        flops = 2 * tokens_per_device * d_model * d_ff          # (T, d) @ (d, f)
        comm = ring_time_s(d_model * d_ff * itemsize, devices, 0.0, w) / 2  # all-gather of W
        width = tokens_per_device
    else:
        flops = 2 * 2 * tokens_per_device * d_model * (d_ff // devices)   # two matmuls
        comm = ring_time_s(tokens_per_device * d_model * itemsize, devices, 0.0, w)  # all-reduce
        width = d_ff // devices
    threshold = c / w * itemsize / 2 * (devices - 1) / devices
    compute = flops / c
    return {"plan": plan, "width_name": _PLANS[plan], "width": width, "threshold": threshold,
            "compute_s": compute, "comm_s": comm, "hidden": compute >= comm}

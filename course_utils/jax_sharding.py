"""The course's plans in JAX: declare a mesh and shardings, the compiler inserts the collectives.

JAX sees one process with several devices. On a laptop those are CPU "devices" that XLA makes
when ``XLA_FLAGS`` contains ``--xla_force_host_platform_device_count=8`` at the moment JAX starts
its CPU backend (the first ``import jax`` of the process). Importing this module adds that flag
if JAX has not been imported yet; :func:`require_devices` refuses, naming the fix, if JAX
already started with fewer devices. JAX is imported only here and in
``course_utils.framework_compare`` (the rest of ``course_utils`` works without it).

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
  block (:func:`mlp_2d`).
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

DEVICES = 8  # the lecture's CPU devices
DEVICE_FLAG = "--xla_force_host_platform_device_count"


def with_device_flag(flags: str, n: int) -> str:
    """``flags`` (an ``XLA_FLAGS`` value) with the host device count set to ``n``."""
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
from jax.sharding import AxisType, Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

__all__ = ["DEVICES", "DEVICE_FLAG", "COLLECTIVES", "LAYOUTS", "Collective", "Layout", "P",
           "with_device_flag", "require_devices", "make_mesh", "place", "shard_table",
           "bytes_per_device", "local_bytes", "global_bytes", "compiled_text", "collectives",
           "collective_names", "draw_sharding", "lesson_two_replicas", "init_mlp", "mlp_apply",
           "mse", "dp_step_check", "jit_linear", "shard_map_linear", "linear_inputs",
           "compare_layouts", "layout_table", "fsdp_state", "mlp_2d", "spec_entries",
           "compile_plan", "row_parallel_harness"]

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


def _check_spec(mesh: Mesh, spec: Any, ndim: int, name: str = "spec") -> None:
    if not isinstance(spec, P):
        raise TypeError(f"{name} must be a PartitionSpec (P(...)); got {type(spec).__name__}")
    if len(spec) > ndim:
        raise ValueError(f"{name} {spec} has {len(spec)} entries for an array of {ndim} dims")
    for entry in spec:
        for axis in (entry if isinstance(entry, tuple) else (entry,)):
            if axis is not None and axis not in mesh.axis_names:
                raise ValueError(f"{name} {spec} names axis {axis!r}; the mesh's axes are "
                                 f"{list(mesh.axis_names)}")


def place(x: Any, mesh: Mesh, spec: P) -> jax.Array:
    """``x`` on ``mesh``, split as ``spec`` says (``jax.device_put`` with a NamedSharding)."""
    x = jnp.asarray(x)
    _check_spec(mesh, spec, x.ndim)
    return jax.device_put(x, NamedSharding(mesh, spec))


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
    return sum(int(a.size) * a.dtype.itemsize for a in jax.tree.leaves(tree))


def compiled_text(fn: Callable, *args: Any, out_shardings: Any = None) -> str:
    """The HLO text of ``jit(fn)`` compiled for ``args`` (after XLA's partitioning passes)."""
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
    g = np.asarray(grads, dtype=np.float32)  # (replicas, params)
    if g.ndim != 2 or g.shape[0] < 1:
        raise ValueError(f"grads must be a list of equal-length gradients; got {grads!r}")
    w = np.asarray(w0, dtype=np.float32)  # (params,)
    if w.shape != (g.shape[1],):
        raise ValueError(f"w0 must have {g.shape[1]} entries, like each gradient; got {w0!r}")
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
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        params.append((rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32))
        params.append(np.zeros(fan_out, dtype=np.float32))
    return params


def mlp_apply(params: Sequence[Any], x: Any) -> Any:
    """``x`` through Linear, tanh, ..., Linear (``Y = X W + b`` layout)."""
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
    per_shard = [jax.device_get(grad_fn(params, x[i], y[i])) for i in parts]
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


def linear_inputs(seed: int, tokens: int = 16, h_in: int = 32, h_out: int = 64
                  ) -> tuple[np.ndarray, np.ndarray]:
    """X (tokens, h_in) and W (h_in, h_out), float32, from ``seed``."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((tokens, h_in)).astype(np.float32),
            rng.standard_normal((h_in, h_out)).astype(np.float32))


def _linear(x, w):
    return x @ w  # (tokens, h_in) @ (h_in, h_out) -> (tokens, h_out)


def jit_linear(layout: str, mesh: Mesh) -> Callable:
    """``jit(X @ W)`` whose output is laid out as the layout's Y spec (the compiler decides the
    communication)."""
    lay = _layout(layout)
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
    lay = _layout(layout)
    # An all-gather's result is the same on every device, but shard_map's replication check
    # cannot prove it for the gathered output: the check is turned off for that layout only.
    check = layout != "column, gathered"
    return jax.jit(shard_map(_LOCAL[layout], mesh=mesh, in_specs=(lay.x, lay.w),
                             out_specs=lay.y, check_vma=check))


def compare_layouts(seed: int = 0, devices: int = DEVICES) -> list[dict]:
    """Every layout of :data:`LAYOUTS` on a ``devices``-wide 1-D mesh: the collectives in the
    ``jit`` and the ``shard_map`` programs, and both results (as numpy) with one device's."""
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


def fsdp_state(sizes: Sequence[int] = (64, 256, 64), seed: int = 0,
               devices: int = DEVICES) -> dict:
    """FP32 Adam training state (weights, gradients, two moments) sharded over ``"data"`` by the
    first dim of every array: bytes per device read from the shards; the collectives of the
    compiled forward pass (each weight gathered for its matmul) and of one SGD step of a single
    sharded linear layer (gather forward, gradient summed over ``"data"`` backward)."""
    mesh = make_mesh((devices,), ("data",))
    params = [place(p, mesh, P("data")) for p in init_mlp(seed, sizes)]
    def zeros():  # a new buffer on every device each call (the three states are distinct)
        return [place(np.zeros(p.shape, np.float32), mesh, P("data")) for p in params]

    state = {"weights": params, "grads": zeros(), "adam_m": zeros(), "adam_v": zeros()}
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
    if len(spec) > ndim:
        raise ValueError(f"spec {spec} has {len(spec)} entries for an array of {ndim} dims")
    out = [list(e) if isinstance(e, tuple) else e for e in spec]
    return out + [None] * (ndim - len(out))


def compile_plan(mesh: Mesh, fn: Callable, shapes: dict[str, tuple[int, ...]],
                 specs: dict[str, P], out_spec: P) -> dict:
    """Compile ``fn`` (positional arguments in the order of ``shapes``) for float32 arrays of
    ``shapes`` placed as ``specs``, its output laid out as ``out_spec``; return the collectives
    read from the compiled HLO and the bytes device 0 holds of each input and of the output."""
    if set(shapes) != set(specs):
        raise ValueError(f"specs must give one spec per array of shapes {list(shapes)}; got "
                         f"{list(specs)}")
    args = [place(np.zeros(shape, np.float32), mesh, specs[name]) for name, shape in
            shapes.items()]
    _check_spec(mesh, out_spec, len(out_spec) if isinstance(out_spec, P) else 0, "out_spec")
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
    mesh = make_mesh((devices,), ("model",))
    xs = place(np.asarray(x, np.float32), mesh, P(None, "model"))
    ws = place(np.asarray(w, np.float32), mesh, P("model", None))
    bs = place(np.asarray(b, np.float32), mesh, P())
    layer = jax.jit(shard_map(fn, mesh=mesh, in_specs=(P(None, "model"), P("model", None), P()),
                              out_specs=P(), check_vma=False))
    y = layer(xs, ws, bs)
    return {"y": np.asarray(y), "collectives": collective_names(
        layer.lower(xs, ws, bs).compile().as_text())}

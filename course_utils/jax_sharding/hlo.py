"""The compiled program: its HLO text and the collectives XLA inserted, read from that text.

:func:`compiled_text` compiles a function for its arguments and returns the HLO after XLA's
partitioning passes; :func:`collectives` reads each collective from it (op, result shapes,
bytes, group size: :class:`Collective`), :func:`collective_names` just their names and
:func:`op_counts` any op's count; :func:`compile_plan` places zero arrays as a plan's specs say,
compiles the plan and returns its collectives and each operand's bytes on a device.
:data:`ITEMSIZE` and :func:`shape_bytes` read an HLO array type's bytes. Lecture 8 (JAX),
sections 2 to 7; assignment a8 (Q2).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from course_utils.jax_sharding import devices  # noqa: F401  (first: sets XLA_FLAGS)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from course_utils.jax_sharding.shardings import (  # noqa: E402
    bytes_per_device, check_divisible, check_mesh, check_shape, check_spec, place,
)

__all__ = ["COLLECTIVES", "ITEMSIZE", "Collective", "compiled_text", "collectives",
           "collective_names", "op_counts", "compile_plan"]

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def _check_callable(name: str, fn: Any) -> Callable:
    if not callable(fn):
        raise TypeError(f"{name} must be a function (a callable); got {type(fn).__name__}")
    return fn


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


ITEMSIZE = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s64": 8, "pred": 1,
            "s8": 1, "u8": 1}
"""Bytes of one element of each HLO element type the course's programs use."""
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
            if dtype not in ITEMSIZE:
                continue
            shape = tuple(int(d) for d in dims.split(",") if d)
            shapes.append(shape)
            nbytes += math.prod(shape) * ITEMSIZE[dtype]
        group = (started.pop(m.group("op"), None) if m.group("phase") == "-done"
                 else _group_size(line))
        found.append(Collective(m.group("op"), tuple(shapes), nbytes, group))
    return found


def collective_names(hlo: str) -> list[str]:
    """Just the op names of :func:`collectives` (``[]``: the program communicates nothing)."""
    return [c.op for c in collectives(hlo)]


def shape_bytes(text: str) -> int:
    """Bytes of an array type written ``f32[8,64]`` (HLO's and JAX's short form); 0 for a type
    :data:`ITEMSIZE` does not list."""
    m = re.match(r"([a-z]+[0-9]*)\[([0-9,]*)\]", text)
    if not m or m.group(1) not in ITEMSIZE:
        return 0
    return math.prod(int(d) for d in m.group(2).split(",") if d) * ITEMSIZE[m.group(1)]


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


def compile_plan(mesh: Mesh, fn: Callable, shapes: dict[str, tuple[int, ...]],
                 specs: dict[str, P], out_spec: P) -> dict:
    """Compile ``fn`` (positional arguments in the order of ``shapes``) for float32 arrays of
    ``shapes`` placed as ``specs``, its output laid out as ``out_spec``; return the collectives
    read from the compiled HLO and the bytes device 0 holds of each input and of the output."""
    check_mesh(mesh)
    _check_callable("fn", fn)
    if not isinstance(shapes, Mapping) or not shapes:
        raise TypeError(f"shapes must be a dict {{name: shape}} of fn's arguments; got "
                        f"{type(shapes).__name__}")
    if not isinstance(specs, Mapping) or set(shapes) != set(specs):
        raise ValueError(f"specs must give one spec per array of shapes {list(shapes)}; got "
                         f"{list(specs) if isinstance(specs, Mapping) else type(specs).__name__}")
    for name, shape in shapes.items():
        check_spec(mesh, specs[name], len(check_shape(f"shapes[{name!r}]", shape)),
                   f"specs[{name!r}]")
        check_divisible(mesh, specs[name], tuple(shape), f"specs[{name!r}]")
    check_spec(mesh, out_spec, len(out_spec) if isinstance(out_spec, P) else 0, "out_spec")
    args = [place(np.zeros(shape, np.float32), mesh, specs[name]) for name, shape in
            shapes.items()]
    jitted = jax.jit(fn, out_shardings=NamedSharding(mesh, out_spec))
    out = jitted(*args)
    return {"collectives": collective_names(jitted.lower(*args).compile().as_text()),
            "bytes": {name: bytes_per_device(a)[0] for name, a in zip(shapes, args)},
            "out_bytes": bytes_per_device(out)[0]}

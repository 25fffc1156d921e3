"""Module 8's sharding visualiser: ``Y = X @ W`` on a mesh of 8 CPU devices, a ``PartitionSpec``
for X, for W and (or the compiler's choice) for Y: which device holds which block of each
operand, as ``jax.debug.visualize_array_sharding`` lays it out, and the collectives XLA inserts
into the compiled program.

The blocks come from JAX itself (``NamedSharding.devices_indices_map``, fast). The collectives
come from the real compiled program (``jit(...).lower(...).compile()``, read by
:func:`course_utils.jax_sharding.hlo.collectives`, the function lecture 8 asserts). A compilation
takes 50 to 500 ms here, too slow for a redraw, so every combination the controls can reach
was compiled once and its collectives cached in ``course_utils/data/sharding_collectives.json``
(``python -m course_utils.widgets.sharding`` writes it again; ``tests/test_widgets_sharding.py``
recompiles a sample and compares). A combination missing from the cache is compiled on the
spot. Importing this module imports JAX with 8 CPU devices (:mod:`course_utils.jax_sharding.devices`)::

    from course_utils.widgets.sharding import Sharding
    Sharding(x="P(None, 'model')", w="P('model', None)", y="P()")
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

from course_utils import jax_sharding as js
from course_utils.jax_sharding.shardings import P
from course_utils.widgets.base import Explorer, Row, dropdown

__all__ = ["Sharding", "MESHES", "AXES", "SPECS", "OUT_SPECS", "SHAPES", "CACHE",
           "compile_matmul", "record_cache", "cached", "blocks"]

AXES = ("data", "model")
MESHES = {"2 x 4": (2, 4), "4 x 2": (4, 2), "1 x 8": (1, 8)}
SPECS = {"P()": P(), "P('data', None)": P("data", None), "P(None, 'data')": P(None, "data"),
         "P('model', None)": P("model", None), "P(None, 'model')": P(None, "model"),
         "P('data', 'model')": P("data", "model"), "P('model', 'data')": P("model", "data")}
AUTO = "the compiler's choice"
OUT_SPECS = {AUTO: None, **SPECS}
SHAPES = {"X": (16, 32), "W": (32, 64), "Y": (16, 64)}  # float32, lecture 8's Y = X W
CACHE = Path(__file__).resolve().parent.parent / "data" / "sharding_collectives.json"


def _key(mesh: str, x: str, w: str, y: str) -> str:
    return f"{mesh} | X {x} | W {w} | Y {y}"


def _label(spec: Any) -> str:
    """The :data:`SPECS` name of a 2-D spec (``P('data')`` is ``P('data', None)``)."""
    entries = js.spec_entries(spec, 2)
    for label, candidate in SPECS.items():
        if js.spec_entries(candidate, 2) == entries:
            return label
    return str(spec)


def _check(mesh: str, x: str, w: str, y: str) -> None:
    for name, value, allowed in (("mesh", mesh, MESHES), ("x", x, SPECS), ("w", w, SPECS),
                                 ("y", y, OUT_SPECS)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {list(allowed)}; got {value!r}")


@functools.lru_cache(maxsize=None)
def _mesh(mesh: str) -> Any:
    return js.make_mesh(MESHES[mesh], AXES)


def _matmul(x, w):
    return x @ w  # (16, 32) @ (32, 64) -> (16, 64)


def compile_matmul(mesh: str, x: str, w: str, y: str) -> dict:
    """Compile ``X @ W`` with X and W placed as ``x`` and ``w`` (:data:`SPECS` names) on
    ``mesh`` (a :data:`MESHES` name), Y laid out as ``y`` (or as the compiler chooses); return
    the collectives of the compiled program (op, result shapes, bytes, group size) and the
    spec Y came out with (its entries, as :func:`course_utils.jax_sharding.shardings.spec_entries`)."""
    import jax
    from jax.sharding import NamedSharding

    _check(mesh, x, w, y)
    m = _mesh(mesh)
    xs = js.place(np.zeros(SHAPES["X"], np.float32), m, SPECS[x])
    ws = js.place(np.zeros(SHAPES["W"], np.float32), m, SPECS[w])
    out = OUT_SPECS[y]
    jitted = jax.jit(_matmul) if out is None else jax.jit(
        _matmul, out_shardings=NamedSharding(m, out))
    compiled = jitted.lower(xs, ws).compile()
    return {"collectives": [[c.op, [list(s) for s in c.shapes], c.nbytes, c.group_size]
                            for c in js.collectives(compiled.as_text())],
            "y": js.spec_entries(compiled.output_shardings.spec, 2)}


def record_cache(path: Path = CACHE) -> int:
    """Compile every combination of the controls and write their collectives to ``path``;
    returns how many were compiled."""
    import jax

    entries = {_key(m, x, w, y): compile_matmul(m, x, w, y)
               for m in MESHES for x in SPECS for w in SPECS for y in OUT_SPECS}
    data = {"recorded": {"jax": jax.__version__, "backend": "cpu", "devices": 8,
                         "program": "Y = X @ W, X (16, 32), W (32, 64), float32",
                         "how": "python -m course_utils.widgets.sharding"},
            "programs": entries}
    _write(Path(path), data)
    return len(entries)


def _write(path: Path, data: dict) -> None:
    """The cache as JSON, one program a line (a recompilation that changes one shows as one)."""
    lines = [f"  {json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}"
             for k, v in sorted(data["programs"].items())]
    path.write_text('{"recorded": ' + json.dumps(data["recorded"], sort_keys=True)
                    + ',\n"programs": {\n' + ",\n".join(lines) + "\n}}\n", encoding="utf-8")


@functools.lru_cache(maxsize=1)
def _cache() -> dict:
    if not CACHE.exists():
        return {}
    return json.loads(CACHE.read_text(encoding="utf-8"))["programs"]


_compiled_here: dict[str, dict] = {}


def cached(mesh: str, x: str, w: str, y: str) -> dict:
    """:func:`compile_matmul`'s answer from the cache (compiled now, once, if missing)."""
    _check(mesh, x, w, y)
    key = _key(mesh, x, w, y)
    found = _cache().get(key) or _compiled_here.get(key)
    if found is None:
        found = _compiled_here[key] = compile_matmul(mesh, x, w, y)
    return found


def _spec(entries: list) -> Any:
    """A PartitionSpec from :func:`course_utils.jax_sharding.shardings.spec_entries`' plain entries."""
    return P(*(tuple(e) if isinstance(e, list) else e for e in entries))


def blocks(mesh: str, spec: Any, shape: tuple[int, int]) -> list[tuple[tuple, list[int]]]:
    """The distinct blocks of an array of ``shape`` placed as ``spec`` (a PartitionSpec) on
    ``mesh``, row-major (as ``jax.debug.visualize_array_sharding`` lists them): ((rows, cols)
    slices as (start, stop) pairs, the ids of the devices holding the block)."""
    from jax.sharding import NamedSharding

    where = NamedSharding(_mesh(mesh), spec).devices_indices_map(tuple(shape))
    found: dict[tuple, list[int]] = {}
    for device, index in where.items():
        block = tuple((s.start or 0, shape[d] if s.stop is None else s.stop)
                      for d, s in enumerate(index))
        found.setdefault(block, []).append(device.id)
    return [(block, sorted(ids)) for block, ids in sorted(found.items())]


class Sharding(Explorer):
    """A mesh and a spec per operand -> each operand's blocks and devices, the bytes each device
    holds, and the collectives of the compiled ``X @ W``."""

    prefix = "sh"
    title = "Y = X @ W sharded on 8 devices: blocks and the compiled collectives"
    defaults = {"mesh": "2 x 4", "x": "P('data', None)", "w": "P(None, 'model')", "y": AUTO}
    figsize = (9.0, 3.0)
    alt = "X, W and Y cut into blocks, each labelled with the devices that hold it"

    def _controls(self, v: dict[str, Any]) -> dict[str, Any]:
        return {"mesh": dropdown("mesh (data x model)", list(MESHES), v["mesh"]),
                "x": dropdown("X (16, 32)", list(SPECS), v["x"]),
                "w": dropdown("W (32, 64)", list(SPECS), v["w"]),
                "y": dropdown("Y (16, 64)", list(OUT_SPECS), v["y"])}

    def compute(self, mesh: str, x: str, w: str, y: str) -> dict[str, Any]:
        program = cached(mesh, x, w, y)
        specs = {"X": SPECS[x], "W": SPECS[w], "Y": _spec(program["y"])}
        sizes = dict(zip(AXES, MESHES[mesh]))
        return {"mesh": mesh, "specs": {name: _label(spec) for name, spec in specs.items()},
                "auto": y == AUTO,
                "collectives": [js.Collective(op, tuple(map(tuple, shapes)), nbytes, group)
                                for op, shapes, nbytes, group in program["collectives"]],
                "blocks": {name: blocks(mesh, spec, SHAPES[name])
                           for name, spec in specs.items()},
                "bytes": {name: js.local_bytes(SHAPES[name], spec, sizes)
                          for name, spec in specs.items()}}

    def rows(self, s: dict[str, Any]) -> list[Row]:
        names = [c.op for c in s["collectives"]]
        held = ", ".join(f"{name} {s['bytes'][name]:,} B (" + _blocks(len(s['blocks'][name]))
                         + ")" for name in SHAPES)
        return [Row("collectives", "compiler inserted", ", ".join(names) if names else "none"),
                Row("detail", "each", "; ".join(str(c) for c in s["collectives"]) or "-"),
                Row("y-spec", "Y laid out as", s["specs"]["Y"]
                    + (" (the compiler's choice)" if s["auto"] else "")),
                Row("held", "one device holds", held)]

    def notes(self, s: dict[str, Any]) -> list[str]:
        x_cols = js.spec_entries(SPECS[s["specs"]["X"]], 2)[1]
        w_rows = js.spec_entries(SPECS[s["specs"]["W"]], 2)[0]
        if x_cols is not None or w_rows is not None:
            return ["The contraction dim (X's columns, W's rows) is split: the compiler gathers "
                    "it back, or adds the partial sums the devices compute; the collectives "
                    "say which it chose."]
        return ["Nothing is split along the contraction dim: each device computes whole "
                "values of its block of Y."]

    def draw(self, s: dict[str, Any], fig: Any) -> None:
        from matplotlib.collections import PolyCollection
        from matplotlib.colors import to_hex, to_rgb

        from course_utils.style import AXIS_COLORS

        ax = fig.add_axes((0.01, 0.09, 0.98, 0.76))
        base = to_rgb(AXIS_COLORS["tp"])
        scale = 1 / 16  # data units per array element (W's 64 columns: 4 units)
        x0, boxes, colours = 0.0, [], []
        for name in ("X", "W", "Y"):
            rows, cols = SHAPES[name]
            found = s["blocks"][name]
            for k, (block, devices) in enumerate(found):
                (r0, r1), (c0, c1) = block
                f = k / max(1, len(found) - 1)
                colours.append(to_hex(tuple(c + f * 0.75 * (1 - c) for c in base)))
                xa, xb = x0 + c0 * scale, x0 + c1 * scale
                ya, yb = 2.0 - r1 * scale, 2.0 - r0 * scale  # row 0 on top
                boxes.append([(xa, ya), (xb, ya), (xb, yb), (xa, yb)])
                text = ",".join(map(str, devices))
                if (xb - xa) > 0.1 * (len(text) + 1) and yb - ya > 0.2:
                    _ = ax.text((xa + xb) / 2, (ya + yb) / 2, text, ha="center",
                                va="center", fontsize=8)
            _ = ax.text(x0 + cols * scale / 2, 2.08, f"{name} {SHAPES[name]}\n"
                        f"{s['specs'][name]}", ha="center", va="bottom", fontsize=9)
            x0 += cols * scale + 0.6
        ax.add_collection(PolyCollection(boxes, facecolors=colours, edgecolors="black",
                                         linewidths=0.6))
        names = ", ".join(c.op for c in s["collectives"]) or "no collective"
        _ = ax.set_xlim(-0.05, x0)
        _ = ax.set_ylim(-0.05, 2.6)
        ax.set_aspect("equal")
        ax.set_axis_off()
        _ = fig.suptitle(f"mesh {s['mesh']} (data x model): the compiler inserted {names}",
                         x=0.02, ha="left", fontsize=12)
        _ = fig.text(0.02, 0.02, "numbers in a block: the devices that hold it (as "
                     "jax.debug.visualize_array_sharding lists them)", fontsize=9)


def _blocks(n: int) -> str:
    return "1 block" if n == 1 else f"{n} blocks"


if __name__ == "__main__":
    # python -m course_utils.widgets.sharding: compile every combination again
    print(f"compiled {record_cache()} programs into {CACHE}")

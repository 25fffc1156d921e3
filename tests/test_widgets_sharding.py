"""Module 8's sharding visualiser: its blocks are JAX's (as ``visualize_array_sharding`` draws
them), its collectives are the compiled programs' (the cache against fresh compilations, and
against lecture 8's layout table), and a device's bytes are its shards'."""

from __future__ import annotations

import contextlib
import io
import json
import re

from course_utils.jax_sharding import layouts, shardings  # (first: they set XLA_FLAGS)

import jax  # noqa: E402
import matplotlib  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

matplotlib.use("Agg")

from course_utils.widgets import sharding as sh  # noqa: E402
from test_widgets import no_problems  # noqa: E402


def test_the_cache_holds_every_setting_the_controls_reach():
    programs = json.loads(sh.CACHE.read_text(encoding="utf-8"))["programs"]
    want = {sh._key(m, x, w, y) for m in sh.MESHES for x in sh.SPECS for w in sh.SPECS
            for y in sh.OUT_SPECS}
    assert set(programs) == want and len(want) == 3 * 7 * 7 * 8


# the lecture's layouts on the 1 x 8 mesh and other settings: compiled again, now
SAMPLE = [("1 x 8", "P()", "P(None, 'model')", sh.AUTO),
          ("1 x 8", "P(None, 'model')", "P('model', None)", "P()"),
          ("2 x 4", "P('data', None)", "P(None, 'model')", sh.AUTO),
          ("2 x 4", "P('model', 'data')", "P('data', 'model')", "P('data', None)"),
          ("4 x 2", "P(None, 'data')", "P('data', None)", "P(None, 'model')"),
          ("4 x 2", "P('data', 'model')", "P()", sh.AUTO)]


@pytest.mark.parametrize("setting", SAMPLE, ids=lambda s: " | ".join(s))
def test_the_cache_is_what_the_compiler_inserts(setting):
    assert sh.compile_matmul(*setting) == sh._cache()[sh._key(*setting)]


def test_the_lectures_layouts_insert_the_lectures_collectives():
    """Lecture 8's table (``compare_layouts``, 8 devices on one "model" axis) against the
    widget's 1 x 8 mesh, whose "data" axis has one device."""
    for row in layouts.compare_layouts(seed=0):
        if row["layout"] == "fsdp":
            continue  # over "data": 8 devices there, 1 on the widget's 1 x 8 mesh
        x, w, y = (sh._label(row[k]) for k in ("x", "w", "y"))
        got = [c[0] for c in sh.cached("1 x 8", x, w, y)["collectives"]]
        assert got == [c.op for c in row["jit"]], row["layout"]


def _visualized(mesh: str, spec: str, shape) -> list[list[int]]:
    """The device lists ``jax.debug.visualize_array_sharding`` prints, block by block."""
    x = shardings.place(np.zeros(shape, np.float32), sh._mesh(mesh), sh.SPECS[spec])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        jax.debug.visualize_array_sharding(x, use_color=False)
    return [[int(d) for d in m.split(",")] for m in re.findall(r"CPU ([\d,]+)", out.getvalue())]


@pytest.mark.parametrize("mesh", list(sh.MESHES))
@pytest.mark.parametrize("spec", ["P()", "P('data', None)", "P(None, 'model')",
                                  "P('model', 'data')"])
def test_blocks_are_what_visualize_array_sharding_shows(mesh, spec):
    blocks = sh.blocks(mesh, sh.SPECS[spec], sh.SHAPES["W"])
    assert [devices for _, devices in blocks] == _visualized(mesh, spec, sh.SHAPES["W"])


def test_the_widget_shows_the_compiled_program_and_the_shards():
    w = sh.Sharding(x="P(None, 'model')", w="P('model', None)", y="P()")
    assert [c.op for c in w.state["collectives"]] == ["all-reduce"]
    assert "compiler inserted  all-reduce" in w.text()
    mesh = sh._mesh("2 x 4")
    for name, spec in (("X", "P(None, 'model')"), ("W", "P('model', None)")):
        placed = shardings.place(np.zeros(sh.SHAPES[name], np.float32), mesh, sh.SPECS[spec])
        assert w.state["bytes"][name] == shardings.bytes_per_device(placed)[0]
    no_problems(w)
    w.controls["y"].value = sh.AUTO
    w.controls["x"].value = "P('data', None)"
    w.controls["w"].value = "P(None, 'model')"  # data x model: no collective, Y by both
    assert w.state["collectives"] == [] and w.state["specs"]["Y"] == "P('data', 'model')"
    no_problems(w)
    for mesh in sh.MESHES:  # every mesh, every spec of W drawn
        w.controls["mesh"].value = mesh
        for spec in sh.SPECS:
            w.controls["w"].value = spec
            no_problems(w)

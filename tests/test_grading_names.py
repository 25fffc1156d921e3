"""The helper detection follows the library's layout (issue 48, done before anything moved):
a forbidden helper reached through a package, a nested module, a re-export or an old module
name kept as an alias is still flagged, and the index of names it uses is read statically."""

from __future__ import annotations

import textwrap

import pytest

from grading import leaks, names, scan

_REAL = ["memory.zero_state_bytes", "pipeline_schedule.bubble_fraction"]


@pytest.mark.parametrize("code, found", [
    # a module that imports the helper's module: the helper is one attribute further
    ("import course_utils.zero.training as z\nx = z.memory.zero_state_bytes(7e9, 8, 2)",
     ["memory.zero_state_bytes"]),
    ("from course_utils.zero import training\nx = training.memory.zero_state_bytes(7e9, 8, 2)",
     ["memory.zero_state_bytes"]),
    ("import course_utils\nx = course_utils.zero.training.memory.zero_state_bytes(7e9, 8, 2)",
     ["memory.zero_state_bytes"]),
    # a module that imports the helper itself (a re-export)
    ("from course_utils.mesh.plan_costs import bubble_fraction as b\nx = b(4, 8)",
     ["pipeline_schedule.bubble_fraction"]),
    ("from course_utils.mesh import plan_costs\nx = plan_costs.bubble_fraction(4, 8)",
     ["pipeline_schedule.bubble_fraction"]),
    # getattr with constant names, nested
    ("import course_utils as c\nx = getattr(getattr(c.zero, 'train' + 'ing'), 'memory').zero_state_bytes",
     ["memory.zero_state_bytes"]),
    # a computed name on a module that can reach the helper, one module removed
    ("from course_utils.zero import training\nx = getattr(training.memory, n)",
     ["memory.zero_state_bytes (through a computed name)"]),
    ("import course_utils as c\nx = getattr(getattr(c.zero, 'training'), n)",
     ["memory.zero_state_bytes (through a computed name)"]),
    # a module that cannot reach a helper: a computed name there is not flagged
    ("from course_utils import validate\nx = getattr(validate, n)", []),
    ("from course_utils.zero import training\nx = training.backend", []),
])
def test_a_helper_is_found_through_the_real_library(code, found):
    assert scan.helper_uses(code, _REAL) == found


def _library(tmp_path):
    """A library laid out in packages, with the old flat names kept as aliases."""
    files = {
        "__init__.py": "from course_utils import _aliases as _a\n",
        "_aliases.py": 'OLD_NAMES = {"pipeline_schedule": "pipeline.schedule",\n'
                       '             "memory_old": "memory.sizing", "loop_a": "loop_b",\n'
                       '             "loop_b": "loop_a"}\n',
        "memory/__init__.py": '"""Module 1."""\nfrom course_utils.memory.sizing import '
                              'zero_state_bytes, to_gib\n',
        "memory/sizing.py": "def zero_state_bytes(n, d, s):\n    return 0\n\n"
                            "def to_gib(x):\n    return x\n",
        "pipeline/__init__.py": "from .schedule import bubble_fraction\nfrom . import schedule\n",
        "pipeline/schedule.py": "from ..memory import sizing as _sizing\n\n"
                                "def bubble_fraction(p, m):\n    return 0\n",
        "mesh/__init__.py": "",
        "mesh/playground.py": "from course_utils.pipeline import bubble_fraction\n"
                              "import course_utils.memory.sizing as sizes\n",
    }
    root = tmp_path / "course_utils"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    return root


@pytest.mark.parametrize("helper", ["pipeline_schedule.bubble_fraction",
                                    "pipeline.schedule.bubble_fraction",
                                    "pipeline.bubble_fraction"])
@pytest.mark.parametrize("code", [
    "from course_utils.pipeline_schedule import bubble_fraction\nx = bubble_fraction(4, 8)",
    "import course_utils.pipeline_schedule as s\nx = s.bubble_fraction(4, 8)",
    "from course_utils import pipeline\nx = pipeline.schedule.bubble_fraction(4, 8)",
    "from course_utils.pipeline.schedule import bubble_fraction as f\nx = f(4, 8)",
    "import course_utils\nx = course_utils.mesh.playground.bubble_fraction(4, 8)",
    "from course_utils.mesh import playground\nx = playground.bubble_fraction(4, 8)",
    "from course_utils.pipeline import *\nx = bubble_fraction(4, 8)",
])
def test_a_moved_helper_is_found_under_every_name(tmp_path, monkeypatch, code, helper):
    root = _library(tmp_path)
    monkeypatch.setattr(scan.names, "index", lambda real=names.index: real(root))
    assert scan.helper_uses(code, [helper]) == [helper]


@pytest.mark.parametrize("code, found", [
    ("from course_utils import memory_old\nx = memory_old.zero_state_bytes(1, 2, 3)",
     ["memory.zero_state_bytes"]),
    ("from course_utils.pipeline import schedule\nx = schedule._sizing.zero_state_bytes",
     ["memory.zero_state_bytes"]),
    ("from course_utils.mesh.playground import sizes\nx = sizes.zero_state_bytes",
     ["memory.zero_state_bytes"]),
    ("import course_utils.pipeline as p\nx = getattr(p.schedule, name)",
     ["memory.zero_state_bytes (through a computed name)"]),
    ("from course_utils import memory\nx = memory.to_gib(3)", []),
    ("from course_utils import loop_a\nx = loop_a.zero_state_bytes", []),  # a loop: no hang
])
def test_nested_and_old_names_of_a_helper(tmp_path, monkeypatch, code, found):
    root = _library(tmp_path)
    monkeypatch.setattr(scan.names, "index", lambda real=names.index: real(root))
    assert scan.helper_uses(code, ["memory.zero_state_bytes"]) == found


def test_the_index_reads_packages_relative_imports_and_old_names(tmp_path):
    root = _library(tmp_path)
    index = names.index(root)
    assert index.resolve(["pipeline_schedule", "bubble_fraction"]) == (
        "pipeline.schedule", "bubble_fraction")
    assert index.resolve(["pipeline", "schedule"]) == "pipeline.schedule"
    assert index.resolve(["mesh", "playground", "sizes"]) == "memory.sizing"
    assert index.resolve(["nothing_here"]) is None
    assert names.source_file("memory_old", root) == root / "memory" / "sizing.py"
    with pytest.raises(ValueError, match="module='nope' is not a module of course_utils"):
        names.source_file("nope", root)


def test_the_leak_scanner_reads_the_given_programs_wherever_they_live():
    assert [p.name for p in leaks.GIVEN] == [names.source_file("pitfalls").name]
    assert all(p.exists() for p in leaks.GIVEN)

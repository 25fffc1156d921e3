"""``course_utils.style``: the figure check finds what issue reviewers found by eye, and passes
a clean figure."""

from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from course_utils import style  # noqa: E402
from course_utils.memory import sizing as _layouts  # noqa: E402,F401 - its labels


@pytest.fixture(autouse=True)
def _course_style():
    with matplotlib.rc_context():
        style.use()
        yield
    plt.close("all")


def _drawn_warnings(fig) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig.canvas.draw()
    return [str(w.message) for w in caught if issubclass(w.category, style.FigureWarning)]


def test_a_clean_figure_passes():
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot([0, 1, 2], [1, 3, 2], marker="o", label="data parallel")
    ax.set_xlim(-0.5, 2.5)
    ax.set_ylim(0, 4)
    ax.set_title("Module 2: a clean figure")
    ax.legend()
    assert _drawn_warnings(fig) == []


def test_each_problem_is_named():
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.text(0.95, 0.5, "a long label past the edge", clip_on=True)
    ax.text(0.1, 0.2, "P0")
    ax.text(0.1, 0.2, "P1")
    ax.text(0.5, 0.8, "tiny", fontsize=6)
    ax.plot([0.0, 0.5], [0.5, 0.5], marker="o", markersize=10, label="edge point")
    found = " | ".join(_drawn_warnings(fig))
    assert "'a long label past the edge' is cut" in found
    assert "'P0' and 'P1' overlap" in found
    assert "'tiny' is 6 pt" in found
    assert "marker of 'edge point' is cut" in found


def test_code_names_become_words():
    assert style.label("mixed_adam16") == "mixed-precision Adam (16 B/param)"
    assert style.label("some_code_name") == "some code name"
    assert set(style.AXIS_COLORS) >= {"dp", "tp", "pp", "cp", "ep"}


LECTURES = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", LECTURES, ids=lambda p: p.stem)
def test_every_lecture_uses_the_style_and_its_figures_pass_the_check(path):
    """Each lecture's setup cell calls ``style.use()`` (so every figure is checked as it is
    drawn), and no committed output carries a figure warning; each is titled "Module N: ..."
    and ends by naming its assignment."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "style.use()" in code[0].source, f"{path.name}: the setup cell must call style.use()"
    warned = [o.get("text", "") for c in code for o in c.get("outputs", [])
              if "course figure check" in str(o.get("text", ""))]
    assert not warned, f"{path.name}: {warned[:2]}"
    number = int(path.stem.split("_")[0])
    assert nb.cells[0].source.startswith(f"# Module {number}: "), nb.cells[0].source[:60]
    last = nb.cells[-1]
    assert last.cell_type == "markdown" and "Next" in last.source and (
        f"a{number}_" in last.source), f"{path.name} should end by naming assignment a{number}"


def test_tick_labels_outside_the_view_are_not_judged():
    """matplotlib keeps labels of ticks beyond the axis limits but never draws them."""
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot([1, 2, 3], [1, 2, 3])
    ax.set_xticks([0, 1, 2, 3, 12, 24])
    ax.set_xlim(0.5, 3.5)
    assert _drawn_warnings(fig) == []


@pytest.mark.parametrize("draw, words", [
    (lambda ax: (ax.bar([0, 1, 2], [1, 2, 3]), ax.set_xlim(-0.5, 1.5)), "a bar or patch"),
    (lambda ax: (ax.plot([0, 1, 2], [1, 2, 3], label="loss"), ax.set_xlim(0, 1.5)),
     "line 'loss' has points outside"),
    (lambda ax: (ax.broken_barh([(0, 19), (20, 2)], (0, 1)), ax.set_xlim(0, 19)),
     "a collection (PolyCollection)"),  # lecture 5's clipped schedule, in miniature
    (lambda ax: (ax.scatter([0, 5], [0, 5]), ax.set_xlim(-1, 4)), "a collection (PathCollection)"),
    (lambda ax: (ax.fill_between([0, 1, 2], [0, 1, 2]), ax.set_ylim(0, 1)), "a collection"),
])
def test_data_outside_the_axes_is_named(draw, words):
    """Issue 12 item 16: a figure must show all of its data."""
    fig, ax = plt.subplots(figsize=(6, 3))
    draw(ax)
    assert any(words in w for w in _drawn_warnings(fig)), _drawn_warnings(fig)


@pytest.mark.parametrize("draw", [
    lambda ax: ax.bar([0, 1, 2], [1, 2, 3]),
    lambda ax: (ax.plot([0, 1, 2], [1, 2, 3]), ax.axhline(2.5), ax.axvspan(0.5, 1),
                ax.axline((0, 0), slope=1)),
    lambda ax: ax.broken_barh([(0, 19), (20, 2)], (0, 1)),
    lambda ax: (ax.scatter([0, 5], [0, 5]), ax.fill_between([0, 1, 2], [0, 1, 2])),
    lambda ax: (ax.plot([0, 3], [0, 3], clip_on=False), ax.set_xlim(0, 2)),  # meant to leave
])
def test_data_inside_the_axes_passes(draw):
    fig, ax = plt.subplots(figsize=(6, 3))
    draw(ax)
    assert _drawn_warnings(fig) == []

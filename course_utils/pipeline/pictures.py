"""Pipeline timelines drawn: Gantt charts of :class:`course_utils.pipeline.schedule.Timeline`.

One row per rank; forwards (F), whole backwards (B), and a split backward's input-gradient (I)
and weight-gradient (W) halves each in their course colour (``style.PHASE_COLORS``); with v
chunks per rank, a later chunk in a lighter shade. The same colours serve lecture 5's
charts and its timeline widget (:mod:`course_utils.widgets.pipeline_timeline`)::

    from course_utils.pipeline import pictures as pipeline_pictures
    from course_utils.pipeline import schedule as ps
    pipeline_pictures.draw_timeline(ps.simulate("zb-h1", 4, 8, backward_ratio=2.0))
"""

from __future__ import annotations

from typing import Any, Sequence

from course_utils.pipeline.schedule import Timeline, op_label
from course_utils.runtime.validate import check_real

__all__ = ["op_color", "legend_handles", "draw_timeline"]

CHUNK_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _tint(color: str, amount: float) -> tuple[float, float, float]:
    """``color`` mixed with white (amount 0 = unchanged, 1 = white)."""
    from matplotlib.colors import to_rgb

    return tuple(c + (1.0 - c) * amount for c in to_rgb(color))


def op_color(kind: str, chunk: int, v: int) -> tuple[float, float, float]:
    """F, B (the whole backward), I (its input half) and W (its weight half) in the course's
    phase colours; a later chunk in a lighter shade."""
    from course_utils.style import PHASE_COLORS

    phase = {"F": "forward", "B": "backward", "I": "input", "W": "weight"}[kind]
    return _tint(PHASE_COLORS[phase], 0.55 * chunk / max(v - 1, 1))


def legend_handles(v: int, kinds: Sequence[str] = ("F", "B")) -> list:
    """Legend patches naming :func:`op_color`'s colours for these op kinds (per chunk)."""
    from matplotlib.patches import Patch

    words = {"F": "forward", "B": "backward", "I": "input grad (I)", "W": "weight grad (W)"}
    if "I" in kinds:
        words["B"] = "backward (B)"
    handles = []
    for kind in [k for k in "FBIW" if k in kinds]:
        for chunk in range(v):
            name = words[kind] if v == 1 else f"{words[kind]}, chunk {CHUNK_LETTERS[chunk]}"
            handles.append(Patch(facecolor=op_color(kind, chunk, v), edgecolor="black",
                                 linewidth=0.5, label=name))
    return handles


_WIDTHS: dict[tuple, float] = {}  # (text, font size, dpi) -> its width in pixels


def _fit_text_class() -> type:
    """A Text that, each time it is drawn, shows the longest of its candidate labels that fits
    inside its bar, and hides itself when none does (so labels never spill or overlap). A
    label's width is measured once per text, size and resolution, not at every draw."""
    from matplotlib.text import Text

    class _FitText(Text):
        def __init__(self, *args: Any, candidates: Sequence[str], span: tuple[float, float],
                     **kwargs: Any):
            super().__init__(*args, text=candidates[0], **kwargs)
            self._candidates, self._span = list(candidates), span

        def _width(self, renderer: Any, candidate: str) -> float:
            key = (candidate, self.get_fontsize(), self.figure.dpi)
            if key not in _WIDTHS:
                self.set_text(candidate)
                _WIDTHS[key] = super().get_window_extent(renderer).width
            return _WIDTHS[key]

        def draw(self, renderer: Any) -> None:
            ax = self.axes
            (x0, _), (x1, _) = ax.transData.transform([(self._span[0], 0), (self._span[1], 0)])
            box = ax.get_window_extent(renderer)
            room = x1 - x0 - 4  # a little padding on each side
            show = None
            self.set_visible(True)  # a hidden Text measures as an empty box
            if box.x0 - 1 <= x0 and x1 <= box.x1 + 1:  # only bars wholly inside the axes
                show = next((c for c in self._candidates if self._width(renderer, c) <= room),
                            None)
            self.set_visible(show is not None)
            if show is not None:
                if self.get_text() != show:
                    self.set_text(show)
                super().draw(renderer)

    return _FitText


def draw_timeline(timeline: Timeline, ax: Any = None, title: str | None = None, *,
                  tmax: float | None = None, legend: bool = True, sync: bool = True) -> Any:
    """Draw a Timeline as a Gantt chart: one row per rank, each op labelled F3 / B3 / I3 / W3
    (F3a / F3b for chunks) where the label fits, else by its microbatch number, else not at all.

    ``tmax``: end of the time axis (default: the makespan); give several charts the same value
    to compare them on one scale. ``legend``: name the colours to the right of the axes.
    ``sync``: which idle share the default title states (:meth:`Timeline.idle_fraction`).
    """
    import matplotlib.pyplot as plt

    if not isinstance(timeline, Timeline):
        raise ValueError(f"timeline must be a Timeline, got {type(timeline).__name__}")
    tmax = timeline.makespan if tmax is None else check_real("tmax", tmax)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.6 * timeline.p + 1.4))
    from matplotlib.collections import PolyCollection

    fit_text = _fit_text_class()
    t0 = timeline.start
    # a bar under ~7 pixels on this figure cannot hold a digit: no label to measure at each draw
    px_per_unit = ax.get_position().width * ax.figure.bbox.width / tmax
    boxes, faces = [], []
    for o in timeline.ops:
        face = op_color(o.kind, o.chunk, timeline.v)
        a, b = o.start - t0, o.end - t0
        boxes.append([(a, o.rank - 0.4), (b, o.rank - 0.4), (b, o.rank + 0.4), (a, o.rank + 0.4)])
        faces.append(face)
        if o.duration * px_per_unit < 7:
            continue
        dark = 0.299 * face[0] + 0.587 * face[1] + 0.114 * face[2] < 0.55
        label = fit_text(o.start - t0 + o.duration / 2, o.rank,
                         candidates=[op_label(o, timeline.v), str(o.microbatch)],
                         span=(o.start - t0, o.end - t0), ha="center", va="center",
                         fontsize=9, color="white" if dark else "black", clip_on=True)
        ax.add_artist(label)
    # one collection for every bar: one artist to draw, not one per op
    ax.add_collection(PolyCollection(boxes, facecolors=faces, edgecolors="black",
                                     linewidths=0.5), autolim=False)
    ax.set_yticks(range(timeline.p))
    _ = ax.set_yticklabels([f"rank {r}" for r in range(timeline.p)])
    ax.set_ylim(timeline.p - 0.5, -0.5)
    ax.set_xlim(0, tmax)
    ax.set_xlabel("time (units of one balanced forward)")
    if title is None:
        from course_utils.style import label as words

        title = (f"{words(timeline.schedule)}: P={timeline.p}, m={timeline.m}"
                 + (f", v={timeline.v}" if timeline.v > 1 else "")
                 + f", idle {timeline.idle_fraction(sync):.1%}")
    ax.set_title(title)
    if legend:
        kinds = sorted({o.kind for o in timeline.ops})
        ax.legend(handles=legend_handles(timeline.v, kinds), loc="upper left", frameon=False,
                  bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return ax

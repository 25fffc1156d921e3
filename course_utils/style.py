"""The course's figure style: one look, one colour per parallelism axis, a check on every figure.

Every lecture's setup cell calls :func:`use`. It sets readable sizes for a notebook's width,
and registers :func:`check_when_drawn` as a matplotlib figure hook, so that every figure made
with pyplot is checked when it is drawn. A figure with a problem emits a
:class:`FigureWarning` (on stderr, in the cell's output), naming it:

* text cut by the axes it is clipped to (a label drawn past the plot's edge);
* texts that overlap each other (two labels on top of one another);
* a marker cut by the edge of its axes (a point on the axis limit);
* data outside its axes: a line's points, a bar or other patch, or a collection (scatter,
  ``broken_barh``, ``fill_between``) that reaches past the axes limits, so the figure hides
  part of what it plots;
* text smaller than :data:`MIN_FONT_PT`.

``tests/test_sources.py`` fails if any committed lecture output carries such a warning.

Colours: :data:`AXIS_COLORS` gives each parallelism axis (data, tensor, pipeline, sequence/
context, expert) the same colour everywhere from module 2 to the playground;
:data:`STATE_COLORS` the parts of training state; :func:`label` turns the course's code names
(``mixed_adam16``) into words for legends.

Figures in HTML: :func:`png` renders a figure at :data:`DPI`, :func:`figure_html` puts it in a
page as an inline ``<img>`` and :func:`error_html` is the view while a widget's inputs are
invalid: the pieces the lectures' widgets (:mod:`course_utils.widgets.base`) and the device-mesh
playground (lecture 6, :mod:`course_utils.mesh.playground`) share.
"""

from __future__ import annotations

import base64
import html
import io
import json
import warnings
from typing import Any

__all__ = ["AXIS_COLORS", "STATE_COLORS", "PHASE_COLORS", "LABELS", "MIN_FONT_PT",
           "FigureWarning", "use", "label", "problems", "check_when_drawn", "DPI", "ERROR_STYLE",
           "STALE_STYLE", "png", "figure_html", "error_html"]

AXIS_COLORS = {"dp": "#4c72b0", "tp": "#dd8452", "pp": "#55a868", "cp": "#8172b3",
               "sp": "#8172b3", "ep": "#c44e52"}
STATE_COLORS = {"weights": "#4c72b0", "grads": "#dd8452", "master": "#937860",
                "optimizer": "#55a868", "activations": "#8172b3", "buffers": "#bbbbbb"}
PHASE_COLORS = {"forward": "#4c72b0", "backward": "#55a868", "input": "#8172b3",
                "weight": "#ccb974", "communication": "#dd8452", "optimizer": "#937860",
                "wait": "#c44e52", "idle": "#eeeeee", "data": "#bbbbbb"}
LABELS = {
    "dp": "data parallel", "tp": "tensor parallel", "pp": "pipeline parallel",
    "cp": "context parallel", "sp": "sequence parallel", "ep": "expert parallel",
    "zero_stage": "ZeRO stage", "gpipe": "GPipe", "1f1b": "1F1B",
    "interleaved": "interleaved 1F1B", "zb-h1": "ZB-H1", "zbv": "ZBV",
    "dualpipev": "DualPipeV",
}
MIN_FONT_PT = 8.0
DPI = 72  # figures are drawn at 72 dots per inch: 9 inches = 648 pixels, fast to render
ERROR_STYLE = "border-left:4px solid #b00020;background:#fdecee;padding:6px 10px;margin:6px 0"
STALE_STYLE = "opacity:0.3;filter:grayscale(1)"


class FigureWarning(UserWarning):
    """A course figure has clipped, overlapping or too small text, or data cut by its axes."""


def label(name: str) -> str:
    """Words for a code name (``mixed_adam16`` -> ``mixed-precision Adam (16 B/param)``), from
    :data:`LABELS`: axes and schedules here, and the words each module adds for its own names
    (:mod:`course_utils.memory` its byte layouts)."""
    return LABELS.get(name, name.replace("_", " "))


def use() -> None:
    """The course's matplotlib settings, and the check on every figure pyplot makes."""
    import matplotlib as mpl

    mpl.rcParams.update({
        "font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11, "xtick.labelsize": 10,
        "ytick.labelsize": 10, "legend.fontsize": 10, "figure.titlesize": 13,
        "axes.spines.top": False, "axes.spines.right": False, "figure.dpi": 100,
        "axes.prop_cycle": mpl.cycler(color=[AXIS_COLORS[k] for k in
                                             ("dp", "tp", "pp", "cp", "ep")]),
    })
    hook = f"{__name__}:check_when_drawn"
    hooks = list(mpl.rcParams.get("figure.hooks", []))
    if hook not in hooks:
        mpl.rcParams["figure.hooks"] = hooks + [hook]


def check_when_drawn(fig: Any) -> None:
    """Figure hook: check ``fig`` the first time it is drawn (see :func:`problems`)."""
    def on_draw(event: Any) -> None:
        fig.canvas.mpl_disconnect(cid)
        for problem in problems(fig, event.renderer):
            warnings.warn(f"course figure check: {problem}", FigureWarning, stacklevel=2)

    cid = fig.canvas.mpl_connect("draw_event", on_draw)


def _undrawn_tick_labels(fig: Any) -> set[int]:
    """Tick labels matplotlib keeps but does not draw (their tick is outside the view)."""
    hidden: set[int] = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            span = (hi - lo) * 1e-9
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                loc = tick.get_loc()
                if loc is None or not lo - span <= loc <= hi + span:
                    hidden.update((id(tick.label1), id(tick.label2)))
    return hidden


def _visible_texts(fig: Any) -> list:
    from matplotlib.text import Text

    hidden = _undrawn_tick_labels(fig)
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()
            and t.get_figure() is not None and id(t) not in hidden]


def problems(fig: Any, renderer: Any | None = None) -> list[str]:
    """What is wrong with ``fig`` as drawn: clipped or overlapping text, tiny text, markers cut
    at an axes edge. An empty list means the figure is whole."""
    from matplotlib.lines import Line2D

    if renderer is None:
        fig.canvas.draw_idle()
        renderer = fig.canvas.get_renderer()
    found: list[str] = []
    texts = _visible_texts(fig)
    boxes = []
    for t in texts:
        shown = repr(t.get_text()[:30])
        if t.get_fontsize() < MIN_FONT_PT:
            found.append(f"text {shown} is {t.get_fontsize():g} pt (at least {MIN_FONT_PT:g})")
        try:
            box = t.get_window_extent(renderer)
        except Exception:  # noqa: BLE001 - a text matplotlib cannot place is not ours to judge
            continue
        clip = t.get_clip_box() if t.get_clip_on() else None
        if clip is not None and (box.x0 < clip.x0 - 1 or box.x1 > clip.x1 + 1
                                 or box.y0 < clip.y0 - 1 or box.y1 > clip.y1 + 1):
            found.append(f"text {shown} is cut by the edge of its axes")
        boxes.append((t, box))
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1:]:
            if a.axes is not b.axes:
                continue
            overlap_w = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
            overlap_h = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
            if overlap_w > 2 and overlap_h > 2:
                found.append(f"texts {a.get_text()[:30]!r} and {b.get_text()[:30]!r} overlap")
    for ax in fig.axes:
        box = ax.get_window_extent(renderer)
        for line in ax.get_lines():
            if not (line.get_visible() and line.get_clip_on()) or line.get_marker() in (
                    None, "", "None", " ") or not isinstance(line, Line2D):
                continue
            half = line.get_markersize() * fig.dpi / 72 / 2
            xy = line.get_transform().transform(line.get_xydata())
            for x, y in xy:
                inside = box.x0 <= x <= box.x1 and box.y0 <= y <= box.y1
                if inside and (x - box.x0 < half - 0.5 or box.x1 - x < half - 0.5
                               or y - box.y0 < half - 0.5 or box.y1 - y < half - 0.5):
                    found.append(f"a marker of {line.get_label()!r} is cut by the axes edge "
                                 "(widen the limits or set clip_on=False)")
                    break
        found += _data_outside(ax, box, renderer)
    return list(dict.fromkeys(found))


def _name(artist: Any) -> str:
    label = str(artist.get_label() or "")
    return repr(label) if label and not label.startswith("_") else type(artist).__name__


def _data_outside(ax: Any, box: Any, renderer: Any, tol: float = 1.0) -> list[str]:
    """Artists of ``ax`` that reach past its edges (more than ``tol`` pixels): line points, bars
    and other patches, collections. Only clipped artists count: one drawn with
    ``clip_on=False`` is meant to leave its axes."""
    import numpy as np
    from matplotlib.lines import AxLine

    def beyond(x0: float, y0: float, x1: float, y1: float) -> bool:
        return (x0 < box.x0 - tol or x1 > box.x1 + tol or y0 < box.y0 - tol
                or y1 > box.y1 + tol)

    found = []
    for line in ax.get_lines():
        if not (line.get_visible() and line.get_clip_on()) or isinstance(line, AxLine):
            continue  # (an axline is infinite by design)
        xy = line.get_transform().transform(line.get_xydata())
        xy = xy[np.isfinite(xy).all(axis=1)]
        if len(xy) and beyond(*xy.min(axis=0), *xy.max(axis=0)):
            found.append(f"line {_name(line)} has points outside its axes (widen the limits)")
    for patch in ax.patches:
        if not (patch.get_visible() and patch.get_clip_on()):
            continue
        ext = patch.get_window_extent(renderer)
        if ext.width > 0 and ext.height > 0 and beyond(ext.x0, ext.y0, ext.x1, ext.y1):
            found.append(f"a bar or patch ({_name(patch)}) reaches past its axes "
                         "(widen the limits)")
    for coll in ax.collections:
        if not (coll.get_visible() and coll.get_clip_on()):
            continue
        points = [p.vertices for p in coll.get_paths() if len(p.vertices)]
        if not points:
            continue
        offsets = coll.get_offsets()
        if len(offsets) > 1 or (len(offsets) == 1 and np.any(offsets)):  # scatter-like
            xy = coll.get_offset_transform().transform(np.asarray(offsets, float))
        else:
            xy = coll.get_transform().transform(np.concatenate(points))
        xy = xy[np.isfinite(xy).all(axis=1)]
        if len(xy) and beyond(*xy.min(axis=0), *xy.max(axis=0)):
            found.append(f"a collection ({_name(coll)}) reaches past its axes (widen the limits)")
    return found


# ------------------------------------------------------------------------- figures in HTML


def png(fig: Any) -> bytes:
    """``fig`` (a matplotlib Figure) as PNG bytes at :data:`DPI`."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def figure_html(prefix: str, png_bytes: bytes, drawn: dict, alt: str,
                attribute: str = "data-state") -> str:
    """A figure as an inline ``<img>`` in ``<div class="<prefix>-figure">``; ``attribute`` (a
    ``data-`` attribute) holds the inputs it was drawn from, as JSON, for tests to read."""
    state = html.escape(json.dumps(drawn, sort_keys=True, default=str), quote=True)
    return (f'<div class="{prefix}-figure"><img alt="{html.escape(alt, quote=True)}" '
            f'{attribute}="{state}" style="max-width:100%" '
            f'src="data:image/png;base64,{base64.b64encode(png_bytes).decode()}"/></div>')


def error_html(prefix: str, message: str, last_figure: str,
               heading: str = "Not a setting that works") -> str:
    """The view while the inputs are invalid: ``message`` in a box (``<prefix>-error``) above
    the last valid figure, greyed (``<prefix>-stale``)."""
    stale = last_figure.replace(f'<div class="{prefix}-figure"',
                                f'<div class="{prefix}-figure {prefix}-stale" '
                                f'style="{STALE_STYLE}"', 1)
    return (f'<div class="{prefix}-error" role="alert" style="{ERROR_STYLE}"><b>{heading}:</b> '
            f'{html.escape(message.rstrip("."))}. Change one of the controls above; the figure '
            'below is the last setting that worked.</div>' + stale)

"""What the lectures' widgets share: controls wired to one tested function, one state, one view.

A widget subclasses :class:`Explorer` and says four things: its controls (``_controls``), how
the controls' values become a state (:meth:`Explorer.compute`: it calls the ``course_utils``
function the lecture asserts, which raises ValueError for a setting that does not work), the
numbers to print (:meth:`Explorer.rows`, :meth:`Explorer.notes`) and the figure to draw
(:meth:`Explorer.draw`). The base does the rest:

* every change computes the state once and writes the numbers and the figure together into one
  HTML view, so the two cannot disagree (two output areas could, after quick changes);
* a ValueError becomes a message inside the widget, in the function's own words (they name the
  argument), with the last figure greyed beneath it: never a traceback;
* :attr:`Explorer.redraw_s` is how long the last change took (``benchmarks/widget_redraw.py``
  measures every widget); figures are plain :class:`matplotlib.figure.Figure` objects rendered
  at :data:`DPI`, not pyplot's (no figure manager, no per-draw style check: the tests run
  :func:`course_utils.style.problems` on each widget's figures instead);
* displayed by a notebook cell, the output carries, besides the live widget, a plain-text
  summary of the numbers (what nbval compares, and what a kernel-less viewer prints), a PNG
  of the figure at that setting (what the course website shows in the widget's place) and the
  same picture under a line saying that it is one and that running the cell gives the
  controls (:data:`PICTURE_HINT`: what JupyterLab shows until the cell has run in this kernel).

:func:`figure_html`, :func:`error_html` and :func:`png` (the two pieces of the view and the
rendering, shared with the device-mesh playground, :mod:`course_utils.mesh.playground`) live in
:mod:`course_utils.style` and are bound here too.
"""

from __future__ import annotations

import base64
import contextlib
import html
import time
from typing import Any, ClassVar, Iterator, NamedTuple

from course_utils.style import (  # noqa: F401 - bound here for the widgets
    DPI, ERROR_STYLE, STALE_STYLE, error_html, figure_html, png,
)

__all__ = ["DPI", "Row", "Explorer", "figure_html", "error_html", "png", "key", "plain_axes",
           "nice_ticks", "slider", "choice_slider", "dropdown", "checkbox", "integer", "number"]


def _freeze_imports() -> None:
    """Once per kernel, before the first widget: move every object alive so far (torch, JAX,
    matplotlib: hundreds of thousands, nearly all of them imported modules' and never garbage)
    out of the garbage collector's reach (``gc.freeze``). A full collection then scans only what
    came after, and one that falls into a redraw costs tens of ms, not 130-270 ms
    (``benchmarks/widget_redraw.py`` counts them)."""
    import gc

    if not getattr(_freeze_imports, "done", False):
        gc.collect()
        gc.freeze()
        _freeze_imports.done = True


PICTURE_HINT = ("A picture of this widget as it was saved: run this cell (Shift+Enter) to get its "
                "controls.")
HINT_STYLE = "color:#555;font-style:italic;margin:2px 0 4px"
_STYLE = {"description_width": "140px"}


class Row(NamedTuple):
    """One printed number: ``key`` names its HTML class (``<prefix>-<key>``), ``label`` says what
    it is, ``value`` is the text shown (the same in the widget and in the plain-text summary)."""

    key: str
    label: str
    value: str


def key(fig: Any, entries: list[tuple[str, Any, Any]], x: float, top: float,
        step: float = 0.085, fontsize: float = 9) -> None:
    """A legend drawn in figure coordinates: for each (words, colour, line style) a coloured
    square (line style None) or a short line, then the words, one entry a row from ``top``
    down. A matplotlib legend measures every entry at each draw: about 50 ms of a redraw."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    height = fig.get_figheight()
    for i, (words, colour, line) in enumerate(entries):
        y = top - i * step
        if line is None:
            fig.add_artist(Rectangle((x, y - 0.06 / height), 0.016, 0.12 / height,
                                     transform=fig.transFigure, facecolor=colour,
                                     edgecolor="black", linewidth=0.4))
        else:
            fig.add_artist(Line2D([x - 0.008, x + 0.024], [y, y], transform=fig.transFigure,
                                  color=colour, linestyle=line, linewidth=1.6))
        fig.text(x + 0.03, y, words, va="center", fontsize=fontsize)


def nice_ticks(low: float, high: float, n: int = 5) -> list[tuple[float, str]]:
    """About ``n`` round tick positions from ``low`` to ``high``, with their labels."""
    from matplotlib.ticker import MaxNLocator

    return [(float(t), f"{t:g}") for t in MaxNLocator(n).tick_values(low, high)
            if low - 1e-9 <= t <= high + 1e-9]


def plain_axes(ax: Any, x_ticks: list[tuple[float, str]] | None = None,
               y_ticks: list[tuple[float, str]] | None = None, xlabel: str = "",
               ylabel: str = "", fontsize: float = 9) -> None:
    """Draw ``ax``'s bottom and left axis lines, tick marks and labels as plain artists, at
    ``(position in data units, label)``, and turn matplotlib's own axes off: its Tick objects
    are rebuilt at every redraw, a few milliseconds each. Set the limits first."""
    from matplotlib.lines import Line2D
    from matplotlib.markers import TICKDOWN, TICKLEFT
    from matplotlib.transforms import blended_transform_factory

    ax.set_axis_off()
    text = dict(textcoords="offset points", fontsize=fontsize, annotation_clip=False)
    for ticks, along, edge, mark, offset, align in (
            (x_ticks, blended_transform_factory(ax.transData, ax.transAxes), ax.get_xlim(),
             TICKDOWN, (0, -6), dict(ha="center", va="top")),
            (y_ticks, blended_transform_factory(ax.transAxes, ax.transData), ax.get_ylim(),
             TICKLEFT, (-6, 0), dict(ha="right", va="center"))):
        if ticks is None:
            continue
        horizontal = mark == TICKDOWN
        ends = ([min(edge), max(edge)], [0, 0]) if horizontal else ([0, 0], [min(edge), max(edge)])
        ax.add_line(Line2D(*ends, color="black", linewidth=0.8, transform=along, clip_on=False))
        at = [t for t, _ in ticks]
        ax.add_line(Line2D(at if horizontal else [0] * len(at), [0] * len(at) if horizontal
                           else at, linestyle="none", marker=mark, markersize=4, color="black",
                           markeredgewidth=0.8, transform=along, clip_on=False))
        for t, words in ticks:
            ax.annotate(words, (t, 0) if horizontal else (0, t), xycoords=along, xytext=offset,
                        **text, **align)
    if xlabel:
        ax.annotate(xlabel, (0.5, 0), xycoords="axes fraction", xytext=(0, -20), ha="center",
                    va="top", **{**text, "fontsize": fontsize + 1})
    if ylabel:
        ax.annotate(ylabel, (0, 0.5), xycoords="axes fraction", xytext=(-34, 0), ha="right",
                    va="center", rotation=90, **{**text, "fontsize": fontsize + 1})


# ---------------------------------------------------------------------------------- controls


def _layout() -> Any:
    import ipywidgets as w

    return w.Layout(width="auto")


def slider(description: str, value: int, low: int, high: int) -> Any:
    """An IntSlider that redraws when released (not at every pixel of a drag)."""
    import ipywidgets as w

    return w.IntSlider(value=value, min=low, max=high, description=description, style=_STYLE,
                       layout=_layout(), continuous_update=False)


def choice_slider(description: str, options: Any, value: Any) -> Any:
    """A SelectionSlider over ``options`` that redraws when released."""
    import ipywidgets as w

    return w.SelectionSlider(options=options, value=value, description=description,
                             style=_STYLE, layout=_layout(), continuous_update=False)


def dropdown(description: str, options: Any, value: Any) -> Any:
    """A Dropdown; ``options`` as ipywidgets takes them (values, or (label, value) pairs)."""
    import ipywidgets as w

    return w.Dropdown(options=options, value=value, description=description, style=_STYLE,
                      layout=_layout())


def _column_px(controls: Any) -> int:
    """The grid's narrowest column: the 140 px description plus room for the longest dropdown
    label (about 7 px a character), 280 to 420 px. (A cell narrower than its label cut it off;
    a child's ``grid_column`` did not reach the page in JupyterLab with ipywidgets 8.1.9.)"""
    import ipywidgets as w

    labels = [o for c in controls if isinstance(c, w.Dropdown) for o in c._options_labels]
    return min(420, max(280, 170 + 7 * max(map(len, labels), default=0)))


def checkbox(description: str, value: bool) -> Any:
    """A Checkbox."""
    import ipywidgets as w

    return w.Checkbox(value=value, description=description, style=_STYLE, layout=_layout())


def integer(description: str, value: int) -> Any:
    """An IntText (unbounded: a value the function refuses becomes the widget's message)."""
    import ipywidgets as w

    return w.IntText(value=value, description=description, style=_STYLE, layout=_layout())


def number(description: str, value: float) -> Any:
    """A FloatText (unbounded: a value the function refuses becomes the widget's message)."""
    import ipywidgets as w

    return w.FloatText(value=value, description=description, style=_STYLE, layout=_layout())


# ------------------------------------------------------------------------------------ widget


class Explorer:
    """Controls wired to one tested function; ``.widget`` is what a cell displays.

    ``.controls`` maps each input name to its control, ``.state`` is the latest state (None
    while the inputs are invalid), ``.view`` the one HTML view (numbers and figure), and
    ``.redraw_s`` how long the last change took. Subclasses set :attr:`prefix` (the HTML class
    prefix), :attr:`title`, :attr:`defaults` and :attr:`figsize`, and define ``_controls``,
    :meth:`compute`, :meth:`rows`, :meth:`draw` and, if they have any, :meth:`notes`.
    """

    prefix: ClassVar[str] = "ex"
    title: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    figsize: ClassVar[tuple[float, float]] = (9.0, 3.5)
    alt: ClassVar[str] = "the widget's figure"

    def __init__(self, **values: Any):
        import ipywidgets as w

        _freeze_imports()
        unknown = sorted(set(values) - set(self.defaults))
        if unknown:
            raise ValueError(f"unknown {type(self).__name__} inputs {unknown}; allowed: "
                             f"{sorted(self.defaults)}")
        self._hold = False
        self._fig: Any = None  # the figure each redraw clears and draws again
        self.controls: dict[str, Any] = self._controls(dict(self.defaults))
        with self._holding():  # in the controls' order, each dependent range brought in line
            for name in self.controls:
                if name in values:
                    _set(self.controls[name], name, values[name])
                    self._adjust()
        for name, control in self.controls.items():
            control.add_class(f"{self.prefix}-in-{name}")
            control.observe(self._update, names="value")
        self.view = w.HTML()
        self.view.add_class(f"{self.prefix}-view")
        column = _column_px(self.controls.values())
        grid = w.GridBox(list(self.controls.values()), layout=w.Layout(
            grid_template_columns=f"repeat(auto-fit, minmax({column}px, 1fr))",
            grid_gap="2px 12px"))
        self.widget = w.VBox([grid, self.view])
        self.widget.add_class(f"{self.prefix}-widget")
        self.state: Any = None
        self.redraw_s = 0.0
        self._figure = ""          # the last valid state's figure, as HTML
        self._png = b""            # ... and as PNG bytes
        self._message = ""         # why the inputs are invalid ("" while they are valid)
        self._update()

    # -- what a subclass defines
    def _controls(self, values: dict[str, Any]) -> dict[str, Any]:
        """The controls, one per input name, set to ``values``."""
        raise NotImplementedError

    def compute(self, **values: Any) -> Any:
        """The state for these inputs, from the tested function; ValueError if they are invalid."""
        raise NotImplementedError

    def rows(self, state: Any) -> list[Row]:
        """The numbers to print for ``state``."""
        raise NotImplementedError

    def notes(self, state: Any) -> list[str]:
        """Sentences to print under the numbers (what the state means); none by default."""
        return []

    def draw(self, state: Any, fig: Any) -> None:
        """Draw ``state`` into ``fig`` (an empty matplotlib Figure of :attr:`figsize`)."""
        raise NotImplementedError

    def _adjust(self) -> None:
        """Bring dependent controls in line before a redraw (a slider's range); none by default.
        Changes made here do not trigger redraws of their own."""

    # -- the machinery
    def values(self) -> dict[str, Any]:
        """The current inputs, as :meth:`compute` takes them."""
        return {name: control.value for name, control in self.controls.items()}

    @contextlib.contextmanager
    def _holding(self) -> Iterator[None]:
        old, self._hold = self._hold, True
        try:
            yield
        finally:
            self._hold = old

    def figure(self, state: Any, reuse: bool = False) -> Any:
        """A matplotlib Figure with ``state`` drawn (not pyplot's: nothing to close): a new one,
        or with ``reuse`` the widget's own, cleared (its renderer keeps the sizes of the texts
        it has drawn, which makes a redraw of the same labels faster)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = self._fig if reuse else None
        if fig is None:
            fig = Figure(figsize=self.figsize, dpi=DPI)
            FigureCanvasAgg(fig)
            if reuse:
                self._fig = fig
        else:
            fig.clear()
        self.draw(state, fig)
        return fig

    def _update(self, change: Any = None) -> None:
        if self._hold:
            return
        start = time.perf_counter()
        with self._holding():
            self._adjust()
        values = self.values()
        try:
            state = self.compute(**values)
        except ValueError as err:
            self.state, self._message = None, str(err).rstrip(".")
            self.view.value = error_html(self.prefix, self._message, self._figure)
        else:
            self.state, self._message = state, ""
            self._png = png(self.figure(state, reuse=True))
            self._figure = figure_html(self.prefix, self._png, values, self.alt)
            self.view.value = self._numbers_html(state) + self._figure
        self.redraw_s = time.perf_counter() - start

    def _numbers_html(self, state: Any) -> str:
        p, esc = self.prefix, html.escape
        rows = "".join(f'<tr><th style="text-align:left;font-weight:normal;padding:1px 14px 1px '
                       f'0">{esc(r.label)}</th><td class="{p}-{r.key}" style="font-weight:bold;'
                       f'padding:1px 0">{esc(r.value)}</td></tr>' for r in self.rows(state))
        notes = "".join(f'<div class="{p}-note" style="margin:2px 0">{esc(n)}</div>'
                        for n in self.notes(state))
        return (f'<div class="{p}-numbers" style="display:flex;flex-wrap:wrap;gap:4px 28px;'
                f'line-height:1.35;margin:6px 0"><table class="{p}-table">{rows}</table>'
                f'<div class="{p}-notes" style="flex:1;min-width:300px">{notes}</div></div>')

    def text(self) -> str:
        """The numbers (and notes) of the current state as plain text; the message when the
        inputs are invalid."""
        if self.state is None:
            return f"{self.title}\nNot a setting that works: {self._message}."
        rows = self.rows(self.state)
        width = max(len(r.label) for r in rows)
        return "\n".join([self.title] + [f"  {r.label:<{width}}  {r.value}" for r in rows]
                         + self.notes(self.state))

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        data = self.widget._repr_mimebundle_()
        data["text/plain"] = self.text()
        if self._png:
            data["image/png"] = base64.b64encode(self._png).decode()
            data["text/html"] = (  # (JupyterLab prefers the live widget to it, it to the PNG)
                f'<div class="{self.prefix}-picture"><div class="{self.prefix}-picture-hint" '
                f'style="{HINT_STYLE}">{html.escape(PICTURE_HINT)}</div><img alt='
                f'"{html.escape(self.alt, quote=True)}" style="max-width:100%" '
                f'src="data:image/png;base64,{data["image/png"]}"/></div>')
        return data


def _set(control: Any, name: str, value: Any) -> None:
    """Set a control to a value given to the constructor, or raise ValueError naming it."""
    from traitlets import TraitError

    try:
        control.value = value
    except TraitError as err:
        raise ValueError(f"{name}={value!r} is not one of the control's choices: {err}") from None
    if control.value != value:  # sliders clamp silently to their range
        raise ValueError(f"{name} must be from {control.min} to {control.max}; got {value!r}")

"""Pictures of tensor-parallel layouts: which rank holds which block of X, W and Y, with shapes.

Shards are drawn in the course's tensor-parallel colour (``style.AXIS_COLORS["tp"]``), one shade
per rank (rank 0 darkest); grey marks a tensor every rank holds whole. Drawn to scale from the
sizes given, so a shard's rectangle has its real proportions. Every figure is 9 inches wide
(a notebook's width) with text of at least 10 pt, and passes ``style.problems``. Serves
lecture 4.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.colors import to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle
from matplotlib.ticker import LogLocator, NullLocator, StrMethodFormatter

from course_utils import style

__all__ = ["MAX_TP", "WHOLE_COLOUR", "rank_colour", "draw_column_split", "draw_row_split",
           "draw_megatron_mlp", "draw_comm_vs_matmul"]

MAX_TP = 8
WHOLE_COLOUR = "#c8c8c8"   # a tensor every rank holds whole
_WIDTH_IN = 9.0            # a notebook's width at 100 dpi
_LABEL_PT, _CAPTION_PT, _SYMBOL_PT = 12, 11, 16


def rank_colour(rank: int, tp: int) -> str:
    """Rank ``rank``'s shade of the tensor-parallel colour: dark for rank 0, light for the last."""
    base = to_rgb(style.AXIS_COLORS["tp"])
    dark = tuple(0.8 * c for c in base)
    light = tuple(c + 0.6 * (1 - c) for c in base)
    f = rank / (tp - 1) if tp > 1 else 0.35
    return to_hex(tuple(d + f * (lt - d) for d, lt in zip(dark, light)))


def _text_colour(colour: str) -> str:
    r, g, b = to_rgb(colour)
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.55 else "black"


def _check(tp: int, **dims: int) -> None:
    if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= MAX_TP:
        raise ValueError(f"tp must be an int from 1 to {MAX_TP}; got {tp!r}")
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int; got {value!r}")
        if name != "tokens" and value % tp:
            raise ValueError(f"{name} = {value} must be divisible by tp = {tp}")


def _block(ax: Axes, x: float, y: float, w: float, h: float, colour: str, label: str = "",
           fontsize: float = _LABEL_PT, per_inch: float | None = None) -> None:
    """A rectangle with a centred label. Given ``per_inch`` (the figure is laid out), the label
    is left out where it would not fit inside the rectangle: the captions name every block."""
    patch = ax.add_patch(Rectangle((x, y), w, h, facecolor=colour, edgecolor="black",
                                   linewidth=1))
    if not label:
        return
    text = ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=fontsize,
                   color=_text_colour(colour))
    if per_inch is not None:
        renderer = ax.figure.canvas.get_renderer()
        ax.apply_aspect()
        inner = patch.get_window_extent(renderer).padded(-2)
        box = text.get_window_extent(renderer)
        if box.width > inner.width or box.height > inner.height:
            text.remove()


def _caption(ax: Axes, x: float, y: float, text: str) -> None:
    ax.text(x, y, text, ha="center", va="top", fontsize=_CAPTION_PT, linespacing=1.3)


def _symbol(ax: Axes, x: float, y: float, text: str) -> None:
    ax.text(x, y, text, ha="center", va="center", fontsize=_SYMBOL_PT)


def _figure(xlim: tuple, ylim: tuple) -> tuple[Figure, Axes, float]:
    """A figure _WIDTH_IN wide whose axes show ``xlim`` x ``ylim`` at one scale (equal aspect),
    with room for the title above; also returns the data units per inch."""
    title_in = 0.5
    per_inch = (xlim[1] - xlim[0]) / (0.98 * _WIDTH_IN)   # data units per inch
    height = (ylim[1] - ylim[0]) / per_inch + title_in
    fig, ax = plt.subplots(figsize=(_WIDTH_IN, height))
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.0, top=1 - title_in / height)
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig, ax, per_inch


def _below(xspan: float, lines: int, offset: float) -> float:
    """Data units that ``lines`` caption lines take, ``offset`` units below a block."""
    per_inch = xspan / (0.98 * _WIDTH_IN)
    return offset + (lines * _CAPTION_PT * 1.3 / 72 + 0.1) * per_inch


def draw_column_split(tp: int = 2, tokens: int = 8, h_in: int = 16, h_out: int = 32) -> Figure:
    """Y = X @ W with W split by columns: each rank computes its own output features."""
    _check(tp, tokens=tokens, h_in=h_in, h_out=h_out)
    gap, cols = 8, h_out // tp
    x_w = h_in + gap                  # W starts here
    x_y = x_w + h_out + gap           # Y starts here
    xlim = (-1, x_y + h_out + 1)
    bottom = min(tokens - h_in - _below(xlim[1] - xlim[0], 3, 2),
                 -_below(xlim[1] - xlim[0], 5, 2))
    fig, ax, per_inch = _figure(xlim, (bottom, tokens + 1))
    # X (tokens, h_in): every rank holds all of it
    _block(ax, 0, 0, h_in, tokens, WHOLE_COLOUR, "X", per_inch=per_inch)
    _caption(ax, h_in / 2, -2, f"X {(tokens, h_in)}\nwhole on\nevery rank")
    _symbol(ax, h_in + gap / 2, tokens / 2, "@")
    # W (h_in, h_out) drawn h_out wide, h_in tall, top-aligned with X: rank r owns cols_r
    for r in range(tp):
        _block(ax, x_w + r * cols, tokens - h_in, cols, h_in, rank_colour(r, tp), f"W{r}",
               per_inch=per_inch)
    _caption(ax, x_w + h_out / 2, tokens - h_in - 2,
             f"W {(h_in, h_out)}\nrank r holds W[:, cols_r]\n{(h_in, cols)}")
    _symbol(ax, x_w + h_out + gap / 2, tokens / 2, "=")
    for r in range(tp):
        _block(ax, x_y + r * cols, 0, cols, tokens, rank_colour(r, tp), f"Y{r}",
               per_inch=per_inch)
    _caption(ax, x_y + h_out / 2, -2,
             f"Y {(tokens, h_out)}\nrank r computes Y[:, cols_r]\n{(tokens, cols)}, no messages;\n"
             "all-gather if the next op\nneeds every feature")
    _ = ax.set_title(f"Column-parallel: W split by output features over {tp} ranks")
    return fig


def draw_row_split(tp: int = 2, tokens: int = 8, h_in: int = 32, h_out: int = 16) -> Figure:
    """Y = X @ W with W split by rows: each rank computes a full-shape partial sum."""
    _check(tp, tokens=tokens, h_in=h_in, h_out=h_out)
    gap, plus, arrow = 7, 6, 16
    rows = h_in // tp
    x_w = h_in + gap                               # W starts here
    x_p = x_w + h_out + gap                        # the partial sums start here
    p_width = tp * h_out + (tp - 1) * plus
    x_y = x_p + p_width + arrow                    # Y starts here
    xlim = (-1, x_y + h_out + 1)
    span = xlim[1] - xlim[0]
    bottom = min(tokens - h_in - _below(span, 3, 2), -_below(span, 3, 2))
    top = max(tokens + 1,
              tokens / 2 + 2.5 + (2 * _CAPTION_PT * 1.3 / 72) * span / (0.98 * _WIDTH_IN))
    fig, ax, per_inch = _figure(xlim, (bottom, top))
    for r in range(tp):  # X's columns are W's rows: rank r reads X[:, rows_r]
        _block(ax, r * rows, 0, rows, tokens, rank_colour(r, tp), f"X{r}", per_inch=per_inch)
    _caption(ax, h_in / 2, -2, f"X {(tokens, h_in)}\nrank r reads X[:, rows_r]\n{(tokens, rows)}")
    _symbol(ax, h_in + gap / 2, tokens / 2, "@")
    for r in range(tp):  # W (h_in, h_out): rank r owns rows_r, top-aligned with X
        _block(ax, x_w, tokens - (r + 1) * rows, h_out, rows, rank_colour(r, tp), f"W{r}",
               per_inch=per_inch)
    _caption(ax, x_w + h_out / 2, tokens - h_in - 2,
             f"W {(h_in, h_out)}\nrank r holds W[rows_r, :]\n{(rows, h_out)}")
    _symbol(ax, x_w + h_out + gap / 2, tokens / 2, "=")
    for r in range(tp):  # full-shape partial sums, side by side: they are added, not joined
        x = x_p + r * (h_out + plus)
        _block(ax, x, 0, h_out, tokens, rank_colour(r, tp), f"P{r}", per_inch=per_inch)
        if r:
            _symbol(ax, x - plus / 2, tokens / 2, "+")
    _caption(ax, x_p + p_width / 2, -2,
             f"rank r: partial sum\nP_r = X_r @ W_r\nfull shape {(tokens, h_out)}")
    ax.add_patch(FancyArrowPatch((x_p + p_width + 1.5, tokens / 2), (x_y - 1.5, tokens / 2),
                                 arrowstyle="-|>", mutation_scale=18, color="black"))
    ax.text(x_y - arrow / 2, tokens / 2 + 2, "all-reduce\n(sum)", ha="center", va="bottom",
            fontsize=_CAPTION_PT)
    _block(ax, x_y, 0, h_out, tokens, WHOLE_COLOUR, "Y", per_inch=per_inch)
    _caption(ax, x_y + h_out / 2, -2, f"Y {(tokens, h_out)}\non every rank")
    _ = ax.set_title(f"Row-parallel: W split by input features over {tp} ranks")
    return fig


def draw_megatron_mlp(tp: int = 2, h: int = 16, ffn: int = 64) -> Figure:
    """The Megatron MLP: f, column-parallel W1, GELU, row-parallel W2, g, per rank."""
    _check(tp, h=h, ffn=ffn)
    # (label, width, kind): kind "whole" (grey), "rank" (rank's shade) or "comm" (f or g)
    steps = [("X\n(b, s, h)", 2.3, "whole"), ("f", 1.5, "comm"),
             ("X @ W1[:, r]\n(b, s, ffn/t)", 3.0, "rank"), ("GELU\nlocal", 2.0, "rank"),
             ("@ W2[r, :]\n(b, s, h)\npartial sum", 3.0, "rank"), ("g", 1.5, "comm"),
             ("Y\n(b, s, h)", 2.3, "whole")]
    notes = {"f": "forward: identity\nbackward: all-reduce",
             "g": "forward: all-reduce\nbackward: identity"}
    gap, box_h, row_h, left = 0.9, 1.55, 2.1, 2.4
    xs, x = [], 0.0
    for _, width, _ in steps:
        xs.append(x)
        x += width + gap
    xlim = (-left, x - gap + 0.2)
    height = (tp - 1) * row_h + box_h
    line = (_CAPTION_PT * 1.3 / 72) * (xlim[1] - xlim[0]) / (0.98 * _WIDTH_IN)
    fig, ax, per_inch = _figure(xlim, (-0.5 - 2.2 * line, height + 0.5 + 1.4 * line))
    for i, (label, width, kind) in enumerate(steps):
        if kind == "comm":  # one band across all ranks: the collective joins them
            ax.add_patch(Rectangle((xs[i], -0.3), width, height + 0.6, facecolor="white",
                                   edgecolor="black", linestyle="--", linewidth=1.2))
            ax.text(xs[i] + width / 2, height + 0.4, label, ha="center", va="bottom",
                    fontsize=_SYMBOL_PT, fontweight="bold")
            ax.text(xs[i] + width / 2, -0.45, notes[label], ha="center", va="top",
                    fontsize=_CAPTION_PT - 1, linespacing=1.3)
    boxes = [i for i, step in enumerate(steps) if step[2] != "comm"]
    for r in range(tp):
        y = (tp - 1 - r) * row_h
        ax.text(-0.4, y + box_h / 2, f"rank {r}", ha="right", va="center", fontsize=_CAPTION_PT)
        for i in boxes:
            label, width, kind = steps[i]
            colour = WHOLE_COLOUR if kind == "whole" else rank_colour(r, tp)
            _block(ax, xs[i], y, width, box_h, colour, label, fontsize=_CAPTION_PT - 1,
                   per_inch=per_inch)
        for a, b in zip(boxes, boxes[1:]):  # arrows between boxes, through the f and g bands
            ax.add_patch(FancyArrowPatch((xs[a] + steps[a][1], y + box_h / 2),
                                         (xs[b], y + box_h / 2), arrowstyle="-|>",
                                         mutation_scale=12, color="black", shrinkA=0,
                                         shrinkB=0))
    _ = ax.set_title(f"Megatron MLP on {tp} ranks: one all-reduce forward (g), one backward (f)")
    return fig


def draw_comm_vs_matmul(timings: list[dict]) -> Figure:
    """Measured median times per hidden size: one rank's forward MLP matmuls vs the all-reduce
    of their result (rows of :func:`course_utils.tensor_parallel.comm_timing.time_comm_vs_matmul`)."""
    keys = {"h", "ffn", "tokens", "tp", "matmul_s", "all_reduce_s"}
    if not timings or any(not isinstance(row, dict) or not keys <= set(row) for row in timings):
        raise ValueError("timings must be the non-empty rows of tensor_parallel."
                         "time_comm_vs_matmul")
    fig, ax = plt.subplots(figsize=(7, 3.6))
    hs = [row["h"] for row in timings]
    ax.plot(hs, [row["matmul_s"] * 1e3 for row in timings], "o-",
            color=style.PHASE_COLORS["forward"], label="forward matmuls, per rank")
    ax.plot(hs, [row["all_reduce_s"] * 1e3 for row in timings], "s-",
            color=style.PHASE_COLORS["communication"], label="all-reduce of the result")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(hs, [str(h) for h in hs])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.margins(x=0.08, y=0.15)
    ffn = "ffn = 4h, " if all(row["ffn"] == 4 * row["h"] for row in timings) else ""
    _ = ax.set_xlabel(f"hidden size h ({ffn}{timings[0]['tokens']} tokens, "
                      f"{timings[0]['tp']} ranks)")
    _ = ax.set_ylabel("median time (ms)")
    ax.legend()
    fig.tight_layout()
    return fig

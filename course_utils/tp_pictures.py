"""Pictures of tensor-parallel layouts: which rank holds which block of X, W and Y, with shapes.

Colours mark ranks; grey marks a tensor every rank holds whole. Drawn to scale from the sizes
given, so a shard's rectangle has its real proportions.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

__all__ = ["RANK_COLOURS", "draw_column_split", "draw_row_split", "draw_megatron_mlp"]

RANK_COLOURS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860",
                "#DA8BC3", "#8C8C8C"]
_GREY = "#BBBBBB"


def _check(tp: int, **dims: int) -> None:
    if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= len(RANK_COLOURS):
        raise ValueError(f"tp must be an int from 1 to {len(RANK_COLOURS)}; got {tp!r}")
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int; got {value!r}")
        if name != "tokens" and value % tp:
            raise ValueError(f"{name} = {value} must be divisible by tp = {tp}")


def _block(ax: Axes, x: float, y: float, w: float, h: float, colour: str, label: str = "",
           alpha: float = 0.85, fontsize: int = 8) -> None:
    ax.add_patch(Rectangle((x, y), w, h, facecolor=colour, edgecolor="black", alpha=alpha))
    if label:
        ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=fontsize,
                color="white" if colour != _GREY else "black")


def _caption(ax: Axes, x: float, y: float, text: str) -> None:
    ax.text(x, y, text, ha="center", va="top", fontsize=9)


def _finish(fig: Figure, ax: Axes, title: str) -> Figure:
    ax.set_aspect("equal")
    ax.autoscale_view()
    ax.axis("off")
    _ = ax.set_title(title, fontsize=11)
    fig.tight_layout()
    return fig


def draw_column_split(tp: int = 2, tokens: int = 8, h_in: int = 16, h_out: int = 32) -> Figure:
    """Y = X @ W with W split by columns: each rank computes its own output features."""
    _check(tp, tokens=tokens, h_in=h_in, h_out=h_out)
    fig, ax = plt.subplots(figsize=(11, 3.6))
    gap = 6
    # X (tokens, h_in): every rank holds all of it
    _block(ax, 0, 0, h_in, tokens, _GREY, "X")
    _caption(ax, h_in / 2, -1, f"X {(tokens, h_in)}\nsame on every rank")
    ax.text(h_in + gap / 2, tokens / 2, "@", ha="center", va="center", fontsize=14)
    # W (h_in, h_out) drawn h_out wide, h_in tall: rank r owns columns r*h_out/t ...
    x0, cols = h_in + gap, h_out // tp
    for r in range(tp):
        _block(ax, x0 + r * cols, tokens - h_in, cols, h_in, RANK_COLOURS[r], f"W{r}")
    _caption(ax, x0 + h_out / 2, tokens - h_in - 1,
             f"W {(h_in, h_out)}\nrank r holds W[:, cols_r] {(h_in, cols)}")
    ax.text(x0 + h_out + gap / 2, tokens / 2, "=", ha="center", va="center", fontsize=14)
    x1 = x0 + h_out + gap
    for r in range(tp):
        _block(ax, x1 + r * cols, 0, cols, tokens, RANK_COLOURS[r], f"Y{r}")
    _caption(ax, x1 + h_out / 2, -1,
             f"Y {(tokens, h_out)}\nrank r computes Y[:, cols_r] {(tokens, cols)}\n"
             "all-gather (concatenate) if the next op needs every feature")
    return _finish(fig, ax, f"Column-parallel: W split by output features over {tp} ranks")


def draw_row_split(tp: int = 2, tokens: int = 8, h_in: int = 32, h_out: int = 16) -> Figure:
    """Y = X @ W with W split by rows: each rank computes a full-shape partial sum."""
    _check(tp, tokens=tokens, h_in=h_in, h_out=h_out)
    fig, ax = plt.subplots(figsize=(11, 3.8))
    gap = 6
    rows = h_in // tp
    for r in range(tp):  # X's columns are W's rows: rank r reads X[:, rows_r]
        _block(ax, r * rows, 0, rows, tokens, RANK_COLOURS[r], f"X{r}")
    _caption(ax, h_in / 2, -1, f"X {(tokens, h_in)}\nrank r reads X[:, rows_r] {(tokens, rows)}")
    ax.text(h_in + gap / 2, tokens / 2, "@", ha="center", va="center", fontsize=14)
    x0 = h_in + gap
    for r in range(tp):  # W (h_in, h_out): rank r owns rows r*h_in/t ...
        _block(ax, x0, tokens - (r + 1) * rows, h_out, rows, RANK_COLOURS[r], f"W{r}")
    _caption(ax, x0 + h_out / 2, tokens - h_in - 1,
             f"W {(h_in, h_out)}\nrank r holds W[rows_r, :] {(rows, h_out)}")
    ax.text(x0 + h_out + gap / 2, tokens / 2, "=", ha="center", va="center", fontsize=14)
    x1 = x0 + h_out + gap
    shift = 2.0
    for r in reversed(range(tp)):  # full-shape partial sums, stacked like cards
        _block(ax, x1 + r * shift, r * shift, h_out, tokens, RANK_COLOURS[r], f"P{r}", alpha=0.7)
    ax.text(x1 + h_out + tp * shift + gap / 2, tokens / 2, "sum\n→", ha="center", va="center",
            fontsize=11)
    x2 = x1 + h_out + tp * shift + gap
    _block(ax, x2, 0, h_out, tokens, _GREY, "Y")
    _caption(ax, (x1 + x2 + h_out) / 2, -1,
             f"each rank: partial sum P_r = X_r @ W_r {(tokens, h_out)}, the full shape\n"
             f"all-reduce (sum) -> Y {(tokens, h_out)} on every rank")
    return _finish(fig, ax, f"Row-parallel: W split by input features over {tp} ranks")


def draw_megatron_mlp(tp: int = 2, h: int = 16, ffn: int = 64) -> Figure:
    """The Megatron MLP: f, column-parallel W1, GELU, row-parallel W2, g, per rank."""
    _check(tp, h=h, ffn=ffn)
    fig, ax = plt.subplots(figsize=(11, 1.2 + 1.3 * tp))
    steps = [("X\n(b, s, h)", _GREY), ("f", "#FFFFFF"), ("X @ W1[:, r]\n(b, s, ffn/t)", None),
             ("GELU\nlocal", None), ("@ W2[r, :]\n(b, s, h) partial", None), ("g", "#FFFFFF"),
             ("Y\n(b, s, h)", _GREY)]
    width, height, gap = 2.6, 0.9, 0.5
    for r in range(tp):
        y = (tp - 1 - r) * 1.3
        for i, (label, colour) in enumerate(steps):
            x = i * (width + gap)
            if colour == "#FFFFFF":
                continue
            _block(ax, x, y, width, height, colour or RANK_COLOURS[r], label, fontsize=8)
            if i:
                ax.add_patch(FancyArrowPatch((x - gap - (width if steps[i - 1][1] == "#FFFFFF"
                                                         else 0), y + height / 2),
                                             (x, y + height / 2), arrowstyle="->",
                                             mutation_scale=10))
        ax.text(-0.3, y + height / 2, f"rank {r}", ha="right", va="center", fontsize=9)
    total = (tp - 1) * 1.3 + height
    for i, text in ((1, "f\nfwd: identity\nbwd: all-reduce"), (5, "g\nfwd: all-reduce\nbwd: identity")):
        x = i * (width + gap)
        ax.add_patch(Rectangle((x + 0.3, -0.2), width - 0.6, total + 0.4, facecolor="#FFF3B0",
                               edgecolor="black", linestyle="--"))
        ax.text(x + width / 2, total / 2, text, ha="center", va="center", fontsize=8)
    ax.set_xlim(-1.5, len(steps) * (width + gap))
    ax.set_ylim(-0.4, total + 0.4)
    ax.axis("off")
    _ = ax.set_title(f"Megatron MLP on {tp} ranks: one all-reduce forward (g), one backward (f)",
                     fontsize=11)
    fig.tight_layout()
    return fig

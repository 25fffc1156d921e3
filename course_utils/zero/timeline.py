"""A ZeRO rank's memory over one step: the timeline's events, its peak, and its drawing.

With ``record_timeline=True``, :func:`course_utils.zero.training.train_worker` returns the bytes
rank 0 holds after each event of its last step (persistent state, gathered weights, unsharded
gradients). :func:`short_event` turns an event into a tick label (key in :data:`TIMELINE_KEY`),
:func:`timeline_peak` finds the event of the peak, and :func:`draw_memory_timeline` /
:func:`draw_memory_timelines` draw ZeRO-2's and ZeRO-3's timelines. Lecture 3 (ZeRO and FSDP).
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["TIMELINE_KINDS", "TIMELINE_KEY", "short_event", "timeline_peak",
           "draw_memory_timeline", "draw_memory_timelines"]

TIMELINE_KINDS = ("persistent", "gathered weights", "unsharded grads")
_EVENT_CODES = {"gather": "g", "prefetch": "p", "release": "r", "grads of": "∇",
                "reduce-scatter": "rs"}
TIMELINE_KEY = ("g = gather, p = prefetch, r = release, ∇ = gradient computed, "
                "rs = reduce-scatter; the digit is the layer")


def _check_timeline(rows: Any) -> list[dict[str, Any]]:
    if not isinstance(rows, (list, tuple)) or not rows:
        raise ValueError("a timeline must be a non-empty list of rows (train_worker's "
                         "'timeline', recorded with record_timeline=True)")
    for row in rows:
        if not isinstance(row, dict) or "event" not in row or any(k not in row
                                                                  for k in TIMELINE_KINDS):
            raise ValueError(f"each timeline row needs 'event' and {list(TIMELINE_KINDS)}; "
                             f"got {row!r}")
    return list(rows)


def short_event(event: str) -> str:
    """A timeline event as a tick label: ``'backward: reduce-scatter L1'`` -> ``'rs1'``."""
    if event in ("step start", "loss"):
        return event.split()[-1]
    if event == "optimizer step":
        return "Adam"
    _, _, what = event.partition(": ")
    verb, _, layer = what.rpartition(" L")
    return _EVENT_CODES.get(verb, verb) + layer


def timeline_peak(rows: Sequence[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    """``(index, row)`` of the event at which the rank holds the most bytes (the first such)."""
    totals = [sum(r[k] for k in TIMELINE_KINDS) for r in _check_timeline(rows)]
    i = totals.index(max(totals))
    return i, rows[i]


def draw_memory_timeline(rows: Sequence[dict[str, Any]], ax: Any = None, *,
                         title: str | None = None, bottom: float | None = None,
                         top: float | None = None) -> Any:
    """Draw one rank's ZeRO-2 or ZeRO-3 memory timeline: the bytes it holds after each event.

    ``rows`` is :func:`~course_utils.zero.training.train_worker`'s ``timeline``. Stacked steps:
    persistent state (grey), gathered weights and unsharded gradients (the course's state
    colours), in kB (10³ bytes). The y-axis starts at ``bottom`` bytes (default: a little under the persistent state, so the
    per-layer gathers are not a thin band on a huge block; a break mark on the axis says so):
    the grey band is drawn from ``bottom`` up, so nothing plotted lies outside the axes.
    Forward and backward are shaded, each event is a tick (:func:`short_event`, key in
    :data:`TIMELINE_KEY`), and the peak is marked. Returns the Axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from course_utils import style

    rows = _check_timeline(rows)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.4))
    n = len(rows)
    xs = list(range(n + 1))
    stacks = [[r[k] for r in rows] for k in TIMELINE_KINDS]
    stacks = [s + s[-1:] for s in stacks]  # step="post": the last level lasts to x = n
    colors = [style.STATE_COLORS["buffers"], style.STATE_COLORS["weights"],
              style.STATE_COLORS["grads"]]
    labels = ["persistent state", "gathered weights", "unsharded gradients"]
    persistent = min(r["persistent"] for r in rows)
    peak_i, peak = timeline_peak(rows)
    peak_total = sum(peak[k] for k in TIMELINE_KINDS)
    extra = max(peak_total - persistent, 1)
    bottom = persistent - 0.35 * extra if bottom is None else bottom
    top = peak_total + 0.45 * extra if top is None else top
    if not bottom <= persistent <= peak_total <= top:
        raise ValueError(f"bottom={bottom} and top={top} must satisfy bottom <= the persistent "
                         f"state ({persistent} B) and top >= the peak ({peak_total} B)")
    # Drawn in bytes above `bottom` (the axis break): the grey band is the persistent state
    # above the break, and the tick labels give the real bytes.
    stacks[0] = [v - bottom for v in stacks[0]]
    for phase in ("forward", "backward"):  # shading first: the stacks are drawn over it
        idx = [i for i, r in enumerate(rows) if r["event"].startswith(phase + ":")]
        if idx:
            ax.axvspan(idx[0], idx[-1] + 1, color=style.PHASE_COLORS[phase], alpha=0.10, lw=0)
            ax.text((idx[0] + idx[-1] + 1) / 2, top - bottom, phase, ha="center", va="top",
                    color=style.PHASE_COLORS[phase], fontsize=11)
    ax.stackplot(xs, *stacks, step="post", colors=colors, labels=labels)
    ax.set_xlim(0, n)
    ax.set_ylim(0, top - bottom)
    ticks = [t for t in MaxNLocator(nbins=5).tick_values(bottom, top) if bottom <= t <= top]
    ax.set_yticks([t - bottom for t in ticks], [f"{t / 1e3:g}" for t in ticks])
    if bottom < persistent:
        ax.text(0.2, (persistent - bottom) / 2, f"persistent state: {persistent:,} B",
                va="center", fontsize=10, color="0.15")
    ax.set_xticks([i + 0.5 for i in range(n)], [short_event(r["event"]) for r in rows],
                  fontsize=10)
    ax.tick_params(axis="x", length=0)
    ax.annotate(f"peak {peak_total:,} B", xy=(peak_i + 0.5, peak_total - bottom),
                xytext=(peak_i + 0.5 - 0.06 * n, peak_total - bottom + 0.22 * extra),
                ha="right", va="center", fontsize=10,
                arrowprops={"arrowstyle": "->", "color": "0.3"})
    # a break mark at the foot of the y-axis: it does not start at zero
    for y in (0.0, 0.025):
        ax.plot([-0.012, 0.012], [y, y + 0.03], transform=ax.transAxes, color="0.2", lw=1,
                clip_on=False)
    ax.set_ylabel("kB held by rank 0")
    if title:
        ax.set_title(title, loc="left")
    return ax


def draw_memory_timelines(timelines: dict[str, Sequence[dict[str, Any]]],
                          width: float = 9.0) -> Any:
    """:func:`draw_memory_timeline` for each named timeline, stacked, on one y-scale, with one
    legend and the tick key. Returns the Figure."""
    import matplotlib.pyplot as plt

    if not isinstance(timelines, dict) or not timelines:
        raise ValueError("timelines must be a non-empty dict {title: timeline rows}")
    rows_all = [_check_timeline(rows) for rows in timelines.values()]
    persistent = min(r["persistent"] for rows in rows_all for r in rows)
    peak = max(sum(r[k] for k in TIMELINE_KINDS) for rows in rows_all for r in rows)
    extra = max(peak - persistent, 1)
    fig, axes = plt.subplots(len(timelines), 1, figsize=(width, 0.6 + 2.9 * len(timelines)),
                             squeeze=False)
    for ax, (title, rows) in zip(axes[:, 0], timelines.items()):
        draw_memory_timeline(rows, ax, title=title, bottom=persistent - 0.35 * extra,
                             top=peak + 0.45 * extra)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", ncols=len(labels), frameon=False)
    axes[-1, 0].set_xlabel(f"event ({TIMELINE_KEY})")
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    return fig

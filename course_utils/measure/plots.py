"""The figures of a measured run: where each rank's step goes, and its loss curves.

Lecture 7 draws them.

:func:`plot_step_breakdown` draws :func:`course_utils.measure.summary.summarize` rows as stacked
bars, one per rank; :func:`plot_loss_curves` draws runs' losses over the one-process curve of
:func:`course_utils.measure.spec.reference_losses`. Colours come from :mod:`course_utils.style`.
"""

from __future__ import annotations

from typing import Any, Sequence

from course_utils import style
from course_utils.measure.spec import PHASES

__all__ = ["plot_step_breakdown", "plot_loss_curves"]


_PHASE_COLORS = {"data": style.PHASE_COLORS["data"], "forward": style.PHASE_COLORS["forward"],
                 "backward": style.PHASE_COLORS["backward"], "wait": style.PHASE_COLORS["wait"],
                 "optimizer": style.STATE_COLORS["master"]}  # style has no optimizer phase


def plot_step_breakdown(rows: Sequence[dict[str, float]], title: str = "", ax: Any = None,
                        legend: bool = True) -> Any:
    """Horizontal stacked bars, one per rank: mean ms per phase of a step, the measured step
    time (phases plus the little between them) at the end of each bar. ``legend=False`` leaves
    the phase legend out (for a second panel under a first one). Returns the axes."""
    import matplotlib.pyplot as plt

    if not rows:
        raise ValueError("rows must be the non-empty list summarize() returns")
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 1.2 + 0.5 * len(rows)))
    for i, row in enumerate(rows):
        left = 0.0
        for phase in PHASES:
            width = row[f"{phase}_ms"]
            ax.barh(i, width, left=left, color=_PHASE_COLORS[phase],
                    label=phase if i == 0 else None)
            left += width
        ax.annotate(f"{row['step_ms']:.0f} ms", (max(left, row["step_ms"]), i), xytext=(4, 0),
                    textcoords="offset points", va="center")
    ax.set_yticks(range(len(rows)), [f"rank {int(r['rank'])}" for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, max(ax.get_xlim()[1], 1.15 * max(r["step_ms"] for r in rows)))
    ax.set_xlabel("mean time per step (ms)")
    if legend:
        ax.legend(ncols=len(PHASES), loc="lower center", bbox_to_anchor=(0.5, 1.0),
                  frameon=False)
    if title:
        ax.set_title(title, pad=22 if legend else 6)
    return ax


def plot_loss_curves(reference: Sequence[float], runs: dict[str, Sequence[float]],
                     title: str = "", ax: Any = None, ylabel: bool = True) -> Any:
    """Loss per step: the single-process ``reference`` as a wide grey band, each run in ``runs``
    (label -> losses) as markers on top, so runs that equal the reference sit inside the band.
    ``ylabel=False`` for a panel beside another that shares its y axis. Returns the axes."""
    import matplotlib.pyplot as plt

    if not runs or any(len(v) != len(reference) for v in runs.values()) or not len(reference):
        raise ValueError("reference and every run must be non-empty loss lists of equal length")
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.4))
    steps = range(1, len(reference) + 1)
    ax.plot(steps, reference, color="0.75", lw=7, solid_capstyle="round", label="one process")
    looks = [dict(marker="o", ms=8, mfc="none", ls="none"), dict(marker="x", ms=8, ls="--")]
    for k, (name, losses) in enumerate(runs.items()):
        ax.plot(steps, losses, color=style.AXIS_COLORS["dp"], mew=1.5, label=name,
                **looks[k % len(looks)])
    ax.set_xticks(list(steps))
    ax.set_xlabel("step")
    if ylabel:
        ax.set_ylabel("loss (nats/token)")
    if title:
        ax.set_title(title)
    return ax

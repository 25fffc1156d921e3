"""A step as a stacked bar per term (lecture 13): one bar per plan or run, predicted beside
measured when a measurement is given; each segment is labelled (its term's hatch tells them apart
in grey too), the total written at the end of the bar."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from course_utils.step_time.terms import TERMS, StepTerms

__all__ = ["TERM_COLORS", "TERM_HATCHES", "SHORT", "draw_terms"]

TERM_COLORS = {"compute": "#4c72b0", "tp": "#dd8452", "bubble": "#c0c0c0",
               "dp_exposed": "#55a868", "optimizer": "#8172b3"}
TERM_HATCHES = {"compute": "", "tp": "//", "bubble": "..", "dp_exposed": "\\\\", "optimizer": "xx"}
SHORT = {"compute": "compute", "tp": "TP/CP", "bubble": "bubble", "dp_exposed": "DP exposed",
         "optimizer": "optimizer"}


def draw_terms(bars: Mapping[str, StepTerms | Mapping[str, float]], ax: Any = None,
               unit: str = "ms", measured: Mapping[str, float] | None = None,
               title: str = "") -> Any:
    """Horizontal stacked bars, one per entry of ``bars`` (label -> :class:`StepTerms` or a
    dict with the :data:`TERMS`), in ``unit`` ("s" or "ms"); ``measured[label]``: a measured
    step (seconds) drawn as a black tick on that bar. Returns the axes."""
    import matplotlib.pyplot as plt

    scale = {"s": 1.0, "ms": 1e3}.get(unit)
    if scale is None:
        raise ValueError(f"unit must be 's' or 'ms'; got {unit!r}")
    if not bars:
        raise ValueError("bars must name at least one step")
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 1.0 + 0.45 * len(bars)))
    longest = 0.0
    for i, (label, terms) in enumerate(bars.items()):
        values = terms.as_dict() if isinstance(terms, StepTerms) else dict(terms)
        left = 0.0
        for t in TERMS:
            width = values[t] * scale
            ax.barh(i, width, left=left, color=TERM_COLORS[t], hatch=TERM_HATCHES[t],
                    edgecolor="white", label=SHORT[t] if i == 0 else None)
            left += width
        end = left
        text = f"{left:.3g} {unit}" if left < 10 else f"{left:.1f} {unit}"
        if measured and label in measured:
            x = measured[label] * scale
            ax.plot([x, x], [i - 0.4, i + 0.4], color="black", lw=2,
                    label="measured" if i == 0 else None)
            end = max(end, x)
            text += f" (measured {x:.3g})"
        ax.annotate(text, (end, i), xytext=(4, 0), textcoords="offset points", va="center")
        longest = max(longest, end)
    ax.set_yticks(range(len(bars)), list(bars))
    ax.invert_yaxis()
    ax.set_xlim(0, (1.35 if measured else 1.2) * longest)
    ax.set_xlabel(f"time per step ({unit})")
    ax.legend(ncols=len(TERMS) + bool(measured), loc="lower center", bbox_to_anchor=(0.5, 1.0),
              frameon=False, fontsize=8)
    if title:
        ax.set_title(title, pad=22)
    return ax

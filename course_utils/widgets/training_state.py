"""Module 1's training-state calculator: parameters x bytes per parameter, in GB and in GiB,
against common device budgets.

Every number comes from :mod:`course_utils.memory.sizing` (``state_bytes``, ``format_bytes``,
``fits``, the five :data:`~course_utils.memory.sizing.LAYOUTS`), the functions lecture 1 asserts::

    from course_utils.widgets.training_state import TrainingState
    TrainingState()            # 7B parameters, 16 B/param: 112.00 GB = 104.31 GiB
"""

from __future__ import annotations

from typing import Any

from course_utils.memory import sizing as memory
from course_utils.widgets.base import (Explorer, Row, dropdown, key, nice_ticks, number,
                                       plain_axes)

__all__ = ["BUDGETS_GB", "TrainingState", "state"]

BUDGETS_GB = {"24 GB": 24, "64 GB": 64, "80 GB": 80, "141 GB": 141}  # lecture 1's budgets
_PARTS = {"weights": "weights", "grads": "gradients", "master": "master copy",
          "optimizer": "optimizer state"}


def state(params_b: float, layout: str) -> dict[str, Any]:
    """The persistent state of ``params_b`` billion parameters in ``layout``: bytes by part and in
    total (``memory.state_bytes``), in GB and GiB, and which of :data:`BUDGETS_GB` it fits."""
    n = params_b * 1e9 if isinstance(params_b, (int, float)) and not isinstance(
        params_b, bool) else params_b
    total = memory.state_bytes(n, layout)  # checks both arguments
    lay = memory.layout(layout)
    return {"params_b": params_b, "layout": lay, "total": total,
            "parts": {k: n * b for k, b in lay.parts().items()},
            "gb": memory.format_bytes(total, "GB"), "gib": memory.format_bytes(total, "GiB"),
            "fits": {label: memory.fits(total, device_gb=gb) for label, gb in BUDGETS_GB.items()}}


class TrainingState(Explorer):
    """Parameters (billions) and a layout -> the state's bytes, GB and GiB, and the budgets it
    fits; the figure is the state as one bar of its parts with the budgets as lines."""

    prefix = "ts"
    title = "Training state (persistent: weights, gradients, master copy, optimizer)"
    defaults = {"params_b": 7.0, "layout": "mixed_adam16"}
    figsize = (9.0, 2.6)
    alt = "the training state as a bar of its parts against device budgets"

    def _controls(self, v: dict[str, Any]) -> dict[str, Any]:
        from course_utils.style import label

        return {"params_b": number("parameters (billions)", v["params_b"]),
                "layout": dropdown("bytes/param layout",
                                   [(label(name), name) for name in memory.LAYOUTS],
                                   v["layout"])}

    def compute(self, params_b: float, layout: str) -> dict[str, Any]:
        return state(params_b, layout)

    def rows(self, s: dict[str, Any]) -> list[Row]:
        lay = s["layout"]
        parts = " + ".join(str(b) for b in lay.parts().values() if b)
        fits = [label for label, ok in s["fits"].items() if ok]
        return [Row("params", "parameters N", f"{s['params_b']:g} billion"),
                Row("per-param", "bytes per parameter", f"{lay.total} B ({parts})"),
                Row("gb", "state in GB (10^9 B)", s["gb"]),
                Row("gib", "state in GiB (2^30 B)", s["gib"]),
                Row("fits", "fits a device of", ", ".join(fits) if fits else "none of "
                    + ", ".join(BUDGETS_GB))]

    def notes(self, s: dict[str, Any]) -> list[str]:
        return [f"{s['layout'].words}: {s['layout'].description}."]

    def draw(self, s: dict[str, Any], fig: Any) -> None:
        from course_utils.style import STATE_COLORS

        ax = fig.add_axes((0.035, 0.3, 0.7, 0.42))
        total_gb = s["total"] / memory.GB
        right = max(total_gb, max(BUDGETS_GB.values())) * 1.12
        left, entries = 0.0, []
        for part, nbytes in s["parts"].items():
            gb = nbytes / memory.GB
            if not gb:
                continue
            ax.barh(0, gb, left=left, height=0.7, color=STATE_COLORS[part])
            entries.append((f"{_PARTS[part]} ({s['layout'].parts()[part]} B)",
                            STATE_COLORS[part], None))
            if gb / right > 0.09:
                ax.text(left + gb / 2, 0, f"{gb:.0f}", ha="center", va="center", color="white",
                        fontweight="bold")
            left += gb
        last = None
        for text, gb in BUDGETS_GB.items():
            ax.axvline(gb, color="black", linestyle=":", linewidth=1.2)
            if last is None or (gb - last) / right > 0.08:  # label only where there is room
                ax.text(gb, 0.5, text, ha="center", va="bottom", fontsize=9)
                last = gb
        _ = ax.set_xlim(0, right)
        _ = ax.set_ylim(-0.5, 0.85)
        plain_axes(ax, nice_ticks(0, right, 6),
                   xlabel="GB (10^9 bytes) of state; dotted: device budgets")
        _ = fig.suptitle(f"{s['params_b']:g}B parameters x {s['layout'].total} B = {s['gb']} = "
                         f"{s['gib']}", x=0.035, ha="left", fontsize=12)
        key(fig, entries, x=0.77, top=0.66, step=0.12)

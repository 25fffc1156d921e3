"""Module 9's number-format explorer: a value in fp32, bf16, fp16, fp8 e4m3 and fp8 e5m2: its bits,
the number each format stores, the gap to the next one, and whether an update of size u added to
a weight of that value is lost.

Every number is torch's: :func:`course_utils.memory.precision.represent` casts the value and reads the
bits and the next number from them; :func:`course_utils.memory.precision.update_lost` adds the update
as :func:`~course_utils.memory.precision.repeated_update` does (its bf16 gap equals ``bf16_gap``, the
function lecture 9 asserts)::

    from course_utils.widgets.number_formats import NumberFormats
    NumberFormats(value=0.02, update=1e-3)
"""

from __future__ import annotations

import math
from typing import Any

from course_utils.memory import precision
from course_utils.widgets.base import Explorer, Row, number

__all__ = ["NumberFormats"]

_FIELD_COLOURS = {"sign": "#bbbbbb", "exponent": "#4c72b0", "fraction": "#55a868"}


def _g(x: float | None) -> str:
    return "none" if x is None else f"{x:.6g}"


class NumberFormats(Explorer):
    """A value and an update -> for each format: the stored value, its bits, the gap, and
    whether weight + update rounds back to the weight."""

    prefix = "nf"
    title = "A number in each format (torch's casts)"
    defaults = {"value": 0.02, "update": 1e-3}
    figsize = (9.0, 3.2)
    alt = "each format's bits, and half its gap at the value against the update"

    def _controls(self, v: dict[str, Any]) -> dict[str, Any]:
        return {"value": number("value (a weight) w", v["value"]),
                "update": number("update u", v["update"])}

    def compute(self, value: float, update: float) -> dict[str, Any]:
        return {"value": value, "update": update,
                "formats": {f: precision.represent(value, f) for f in precision.FORMATS},
                "updates": {f: precision.update_lost(value, update, f)
                            for f in precision.FORMATS}}

    def rows(self, s: dict[str, Any]) -> list[Row]:
        out = []
        for fmt, r in s["formats"].items():
            u = s["updates"][fmt]
            if r["overflow"]:
                text = (f"stores {_g(r['stored'])}: w is past its largest number, "
                        f"{_g(r['largest'])}")
            else:
                after = "lost" if u["lost"] else f"-> {_g(u['after'])}"
                text = f"stores {_g(r['stored'])}, gap {_g(r['gap'])}; w + u {after}"
            out.append(Row(fmt.replace(" ", "-"), fmt, text))
        return out

    def notes(self, s: dict[str, Any]) -> list[str]:
        lost = [f for f, u in s["updates"].items()
                if u["lost"] and not s["formats"][f]["overflow"]]
        if not lost:
            return [f"An update of {s['update']:g} survives in every format at w = "
                    f"{s['value']:g}."]
        return [f"Lost in {', '.join(lost)}: an update under half the gap rounds back to the "
                "weight (the fp32 master copy of the 16-byte layout keeps it)."]

    def draw(self, s: dict[str, Any], fig: Any) -> None:
        from matplotlib.collections import PolyCollection

        formats = list(s["formats"])
        ax = fig.add_axes((0.0, 0.02, 1.0, 0.84))
        boxes, colours = [], []
        n = len(formats)
        for row, fmt in enumerate(formats):  # one box per field, its bits written in it
            r, y = s["formats"][fmt], n - 1 - row
            _ = ax.text(9.5, y + 0.4, fmt, ha="right", va="center", fontsize=10)
            x = 10.0
            for field in ("sign", "exponent", "fraction"):
                width = 0.62 * len(r[field]) + 0.3
                boxes.append([(x, y), (x + width, y), (x + width, y + 0.8), (x, y + 0.8)])
                colours.append(_FIELD_COLOURS[field])
                _ = ax.text(x + width / 2, y + 0.4, r[field], ha="center", va="center",
                            fontsize=9, family="monospace",
                            color="black" if field == "sign" else "white")
                x += width + 0.15
        # half the gap at w on a log scale (one unit a factor 10), the update dashed
        halves = [(s["formats"][f]["gap"] or 0) / 2 for f in formats]
        u = abs(s["update"])
        lows = [h for h in halves if h > 0] + ([u] if u else [])
        lo = math.floor(math.log10(min(lows))) - 1 if lows else -12
        hi = math.ceil(math.log10(max(lows))) + 1 if lows else 0
        left, span = 36.0, 14.0
        scale = span / max(hi - lo, 1)
        for row, (fmt, half) in enumerate(zip(formats, halves)):
            y = n - 1 - row
            lost = s["updates"][fmt]["lost"] or s["formats"][fmt]["overflow"]
            if half > 0:
                end = left + (math.log10(half) - lo) * scale
                boxes.append([(left, y + 0.15), (end, y + 0.15), (end, y + 0.65),
                              (left, y + 0.65)])
                colours.append("#c44e52" if lost else "#55a868")
        ax.add_collection(PolyCollection(boxes, facecolors=colours, linewidths=0))
        for power in (lo, (lo + hi) // 2, hi):
            _ = ax.text(left + (power - lo) * scale, -0.12, f"1e{power}", ha="center",
                        va="top", fontsize=8)
        if u:
            x_u = left + (math.log10(u) - lo) * scale
            ax.plot([x_u, x_u], [-0.1, n], color="black", linestyle="--", linewidth=1.2)
        _ = ax.text(left, n + 0.05, "half the gap at w, log scale", va="bottom", fontsize=9)
        _ = ax.text(left, -0.75, "dashed: |u|; red: u is lost", va="top", fontsize=9)
        _ = ax.text(10.0, n + 0.05, "bits: sign | exponent | fraction", va="bottom",
                    fontsize=9)
        _ = ax.set_xlim(0, left + span + 1.5)
        _ = ax.set_ylim(-1.5, n + 0.5)
        ax.set_axis_off()
        _ = fig.suptitle(f"w = {s['value']:g}, u = {s['update']:g}", x=0.02, ha="left",
                         fontsize=12)

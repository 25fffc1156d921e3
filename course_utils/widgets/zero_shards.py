"""Module 3's ZeRO view: for ZeRO stage 0-3 on D data-parallel ranks, which rank holds which shard
of the weights, the gradients and the optimizer state, the bytes per rank, and the collectives
of one step with the bytes each rank sends.

The bytes are :func:`course_utils.memory.sizing.zero_state_bytes` (the lesson's 16-byte layout, ideal
N/D shards) and :func:`course_utils.zero.sizes.expected_comm_bytes` (ring algorithms, bf16), the two
functions lecture 3 asserts against its from-scratch ZeRO runs::

    from course_utils.widgets.zero_shards import ZeroShards
    ZeroShards(params_b=7, ranks=8, stage=2)
"""

from __future__ import annotations

from typing import Any

from course_utils.memory import sizing as memory
from course_utils.zero import sizes as zero
from course_utils.widgets.base import Explorer, Row, dropdown, number, slider

__all__ = ["ZeroShards", "MAX_DRAWN"]

MAX_DRAWN = 16  # ranks drawn one row each; more are summarised
_PARTS = (("weights", "weights (bf16)"), ("grads", "gradients (bf16)"),
          ("optimizer", "optimizer: fp32 master + Adam moments"))
_COLLECTIVES = {
    0: "all-reduce of the gradients",
    1: "reduce-scatter of the gradients, all-gather of the updated weights",
    2: "reduce-scatter of each layer's gradient during backward, all-gather of the updated "
       "weights",
    3: "all-gather of each layer before its forward and again before its backward, "
       "reduce-scatter of its gradient",
}


class ZeroShards(Explorer):
    """Parameters, D and a ZeRO stage -> each rank's shards and bytes, and the step's
    collectives; the figure has one row per rank and one strip per part of the state."""

    prefix = "zs"
    title = "ZeRO: what each data-parallel rank keeps (16-byte layout), and what a step sends"
    defaults = {"params_b": 7.0, "ranks": 8, "stage": 2}
    figsize = (9.0, 3.9)
    alt = "which rank holds which shard of the weights, gradients and optimizer state"

    def _controls(self, v: dict[str, Any]) -> dict[str, Any]:
        return {"params_b": number("parameters (billions)", v["params_b"]),
                "ranks": slider("data-parallel ranks D", v["ranks"], 1, 64),
                "stage": dropdown("ZeRO stage", [(zero.STAGE_NAMES[s], s)
                                                  for s in memory.ZERO_STAGES], v["stage"])}

    def compute(self, params_b: float, ranks: int, stage: int) -> dict[str, Any]:
        if isinstance(params_b, bool) or not isinstance(params_b, (int, float)) \
                or not params_b > 0:
            raise ValueError(f"params_b must be a positive number of billions; got {params_b!r}")
        n = int(round(params_b * 1e9))
        return {"params_b": params_b, "ranks": ranks, "stage": stage,
                "bytes": memory.zero_state_bytes(n, dp=ranks, stage=stage),
                "sent": zero.expected_comm_bytes([n], dp=ranks, stage=stage)}

    def rows(self, s: dict[str, Any]) -> list[Row]:
        b, gb = s["bytes"], lambda x: f"{x / memory.GB:.2f}"
        sharded = [words.split(" (")[0].split(":")[0] for part, words in _PARTS
                   if _is_sharded(part, s["stage"]) and s["ranks"] > 1]
        sent = s["sent"]
        return [Row("total", "persistent state per rank", f"{gb(b['total'])} GB"),
                Row("parts", "weights + gradients + optimizer",
                    f"{gb(b['weights'])} + {gb(b['grads'])} + {gb(b['optimizer'])} GB"),
                Row("sharded", "cut into D shards",
                    ", ".join(sharded) if sharded else "nothing (every rank holds it all)"),
                Row("sent", "sent per rank per step", f"{gb(sent['total'])} GB (ring, bf16)")]

    def notes(self, s: dict[str, Any]) -> list[str]:
        if s["ranks"] == 1:
            return ["One rank: nothing to shard and nothing to send."]
        return [f"One step: {_COLLECTIVES[s['stage']]}."]

    def draw(self, s: dict[str, Any], fig: Any) -> None:
        from matplotlib.collections import PolyCollection

        from course_utils.style import STATE_COLORS

        d, stage = s["ranks"], s["stage"]
        drawn = min(d, MAX_DRAWN)
        widths = {part: b for part, b in zip(("weights", "grads", "optimizer"),
                                             (2, 2, 12))}  # bytes per parameter: the strips
        ax = fig.add_axes((0.1, 0.12, 0.66, 0.7))
        fills, colours, frames = [], [], []
        x = 0.0
        for part, words in _PARTS:
            w = widths[part]
            for r in range(drawn):
                y = drawn - 1 - r
                frames.append([(x, y + 0.1), (x + w, y + 0.1), (x + w, y + 0.9), (x, y + 0.9)])
                if _is_sharded(part, stage):
                    lo, hi = x + w * r / d, x + w * (r + 1) / d
                else:
                    lo, hi = x, x + w
                fills.append([(lo, y + 0.1), (hi, y + 0.1), (hi, y + 0.9), (lo, y + 0.9)])
                colours.append(STATE_COLORS[part])
            _ = ax.text(x + w / 2, drawn + 0.05, words if w > 4 else words.split(" (")[0],
                        ha="center", va="bottom", fontsize=9)
            x += w + 0.6
        ax.add_collection(PolyCollection(fills, facecolors=colours, linewidths=0))
        ax.add_collection(PolyCollection(frames, facecolors="none", edgecolors="#888888",
                                         linewidths=0.6))
        per_rank = s["bytes"]["total"] / memory.GB
        step = max(1, drawn // 8)
        for r in range(0, drawn, step):
            _ = ax.text(-0.2, drawn - r - 0.5, f"rank {r}", ha="right", va="center", fontsize=9)
        _ = ax.text(x - 0.4, drawn - 0.5, f"{per_rank:.2f} GB\nper rank", va="top", fontsize=10)
        if drawn < d:
            _ = ax.text(x / 2, -0.5, f"... and {d - drawn} more ranks", ha="center",
                        va="center", fontsize=9)
        _ = ax.set_xlim(0, x)
        _ = ax.set_ylim(-0.9 if drawn < d else -0.1, drawn + 0.6)
        ax.set_axis_off()
        _ = fig.suptitle(f"{zero.STAGE_NAMES[stage]}, {s['params_b']:g}B parameters on D = {d}: "
                         f"{per_rank:.2f} GB per rank, {s['sent']['total'] / memory.GB:.2f} GB "
                         "sent per step", x=0.02, ha="left", fontsize=12)
        _ = fig.text(0.02, 0.01, "strip widths: bytes per parameter (2, 2, 12); a rank's "
                     "coloured part is what it keeps", fontsize=9, va="bottom")


def _is_sharded(part: str, stage: int) -> bool:
    """Whether ZeRO ``stage`` cuts ``part`` into D shards (1: optimizer, 2: + gradients,
    3: + weights), as :func:`course_utils.memory.sizing.zero_state_bytes` divides them."""
    return stage >= {"optimizer": 1, "grads": 2, "weights": 3}[part]

"""Module 2's collectives stepper: all-reduce, reduce-scatter and all-gather on the course's ring,
and the pairwise all-to-all, for D ranks, one step at a time.

What it shows is replayed from a real run (:mod:`course_utils.collectives.ring_trace`: the course's ring,
``ring_allreduce.reduce_scatter_phase`` and ``all_gather_phase``, traced on D gloo ranks),
not drawn from a formula: at step k, which shard each rank sent and to whom, what every shard
of every rank holds (whose data, decoded from the values), and the bytes sent so far, which end
at ``ring_allreduce.ring_bytes_per_rank`` for the all-reduce::

    from course_utils.widgets.ring_steps import RingSteps
    RingSteps(collective="all_reduce", ranks=4)
"""

from __future__ import annotations

from typing import Any

from course_utils.collectives import ring_trace
from course_utils.widgets.base import Explorer, Row, dropdown, slider

__all__ = ["RingSteps", "WORDS", "MAX_LABELLED"]

MAX_LABELLED = 5  # up to this D every shard says whose data it holds (each label ~1 ms)

WORDS = {"all_reduce": "all-reduce (ring)", "reduce_scatter": "reduce-scatter (ring)",
         "all_gather": "all-gather (ring)", "all_to_all": "all-to-all (pairwise)"}
_PHASE = {
    "reduce-scatter": "reduce-scatter: each rank sends one shard to the next rank, which adds "
                      "it into its own copy",
    "all-gather": "all-gather: each rank passes a complete shard to the next rank, which "
                  "overwrites its copy",
    "all-to-all": "all-to-all: at step k rank r sends its shard for rank r + k straight to it",
}


def _b(n: float) -> str:
    return f"{n:,.0f} B"


def _who(mask: int, world_size: int) -> str:
    ranks = ring_trace.ranks_of(mask)
    if not ranks:
        return "-"
    if len(ranks) == world_size:
        return "all"
    return ",".join(map(str, ranks)) if len(ranks) <= 3 else f"{len(ranks)} of {world_size}"


class RingSteps(Explorer):
    """A collective, D ranks and a step -> the recorded step: shards sent, what each rank holds
    (cells coloured by the ranks whose data they hold), bytes sent so far."""

    prefix = "rs"
    title = "Collectives step by step (replayed from a real gloo run)"
    defaults = {"collective": "all_reduce", "ranks": 4, "step": 0}
    figsize = (9.0, 3.6)
    alt = "every rank's shards at this step, coloured by whose data they hold"

    def _controls(self, v: dict[str, Any]) -> dict[str, Any]:
        steps = len(ring_trace.trace(v["collective"], v["ranks"]).steps)
        return {"collective": dropdown("collective", [(w, k) for k, w in WORDS.items()],
                                       v["collective"]),
                "ranks": slider("ranks D", v["ranks"], min(ring_trace.WORLD_SIZES),
                                max(ring_trace.WORLD_SIZES)),
                "step": slider("step k", v["step"], 0, steps)}

    def _adjust(self) -> None:
        steps = len(ring_trace.trace(self.controls["collective"].value,
                                     self.controls["ranks"].value).steps)
        step = self.controls["step"]
        step.value = min(step.value, steps)
        step.max = steps

    def compute(self, collective: str, ranks: int, step: int) -> dict[str, Any]:
        t = ring_trace.trace(collective, ranks)
        holds = t.holds(step)  # checks step
        return {"trace": t, "step": step, "holds": holds, "sent": t.sent_so_far(step),
                "last": t.steps[step - 1] if step else None}

    def rows(self, s: dict[str, Any]) -> list[Row]:
        t, k, last = s["trace"], s["step"], s["last"]
        d, numel = t.world_size, t.numel
        shard = numel * 4 // d
        if last is None:
            sends = "nothing yet (move the step slider)"
        else:
            r0, to0 = last.sends[0][0], last.sends[0][1]
            sends = f"rank 0 sends shard {r0} to rank {to0}, every rank one shard ({_b(shard)})"
        rows = [Row("step", "step", f"{k} of {len(t.steps)}"
                    + (f" ({last.phase})" if last else " (the start)")),
                Row("buffer", "each rank's buffer", f"N = {numel:,} float32 = {_b(numel * 4)}, "
                    f"{d} shards of {_b(shard)}"),
                Row("sends", "this step", sends),
                Row("sent", "sent so far, per rank", ", ".join(sorted({_b(b) for b in s["sent"]})))]
        if t.collective == "all_reduce":
            rows.append(Row("formula", "2(D-1)/D x N x 4 B",
                            f"{_b(ring_trace.ring_total(d))} per rank when done "
                            "(ring_bytes_per_rank)"))
        else:
            rows.append(Row("formula", "(D-1)/D x N x 4 B",
                            f"{_b(ring_trace.ring_total(d) / 2)} per rank when done"))
        return rows

    def notes(self, s: dict[str, Any]) -> list[str]:
        t, k, last = s["trace"], s["step"], s["last"]
        out = [_PHASE[last.phase] + "." if last else
               f"{WORDS[t.collective]} on {t.world_size} ranks: {len(t.steps)} steps."]
        if k == len(t.steps):
            done = {"all_reduce": "every rank holds the sum of every shard",
                    "reduce_scatter": "rank r holds the complete sum of shard (r + 1) mod D "
                                      "only",
                    "all_gather": "every rank holds every shard",
                    "all_to_all": "shard j of rank r holds rank j's data for rank r"}
            out.append(f"Done: {done[t.collective]}.")
        return out

    def draw(self, s: dict[str, Any], fig: Any) -> None:
        from matplotlib.collections import PolyCollection

        from course_utils.style import AXIS_COLORS

        t, holds, last = s["trace"], s["holds"], s["last"]
        d = t.world_size
        colours = _rank_colours(d)
        received = [_received(t.collective, last, r) for r in range(d)]
        ax = fig.add_axes((0.09, 0.04, 0.62, 0.8))
        fills, fill_colours, frames, frame_styles = [], [], [], []
        for r in range(d):
            y = d - 1 - r
            _ = ax.text(-0.12, y + 0.42, f"rank {r}", ha="right", va="center", fontsize=10)
            for c, mask in enumerate(holds[r]):
                ranks = ring_trace.ranks_of(mask) or [None]
                w, bottom = 1 / len(ranks), 0.32 if d <= MAX_LABELLED else 0.0
                for i, src in enumerate(ranks):  # stripes on top, the label in the white below
                    x0 = c + i * w
                    fills.append([(x0, y + bottom), (x0 + w, y + bottom), (x0 + w, y + 0.84),
                                  (x0, y + 0.84)])
                    fill_colours.append("#eeeeee" if src is None else colours[src])
                frames.append([(c, y), (c + 1, y), (c + 1, y + 0.84), (c, y + 0.84)])
                frame_styles.append("sent" if last is not None and last.sends[r][0] == c
                                    else "received" if c in received[r] else "")
                if d <= MAX_LABELLED:
                    _ = ax.text(c + 0.5, y + 0.15, _who(mask, d), ha="center", va="center",
                                fontsize=9)
            if last is not None:
                shard, to, _ = last.sends[r]
                _ = ax.text(d + 0.15, y + 0.42, f"sends shard {shard} -> rank {to}",
                            va="center", fontsize=10, color=AXIS_COLORS["dp"])
        ax.add_collection(PolyCollection(fills, facecolors=fill_colours, linewidths=0))
        looks = {"": ("#777777", 0.6, "solid"), "sent": ("black", 2.6, "solid"),
                 "received": ("black", 1.8, (0, (3, 2)))}
        for style_name, (colour, width, line) in looks.items():
            chosen = [f for f, k in zip(frames, frame_styles) if k == style_name]
            if chosen:
                ax.add_collection(PolyCollection(chosen, facecolors="none", edgecolors=colour,
                                                 linewidths=width, linestyles=line))
        for c in range(d):
            _ = ax.text(c + 0.5, d - 0.04, f"shard {c}", ha="center", va="bottom", fontsize=9)
        _ = ax.set_xlim(0, d)
        _ = ax.set_ylim(-0.1, d + 0.3)
        ax.set_axis_off()
        phase = f" ({last.phase})" if last else ""
        _ = fig.suptitle(f"{WORDS[t.collective]}, D = {d}: step {s['step']} of {len(t.steps)}"
                         f"{phase}; sent so far {_b(s['sent'][0])} per rank", x=0.02,
                         ha="left", fontsize=12)
        _ = fig.text(0.02, 0.0, "colours: whose data a shard holds; thick frame: sent at this "
                     "step; dashed: received", fontsize=9, va="bottom")


def _received(collective: str, last: Any, rank: int) -> set[int]:
    """The shards ``rank`` received at step ``last``: in the ring a shard keeps its index; in
    the all-to-all, rank q's shard for this rank lands in shard q."""
    if last is None:
        return set()
    if collective == "all_to_all":
        return {q for q, (_, to, _) in enumerate(last.sends) if to == rank}
    return {shard for shard, to, _ in last.sends if to == rank}


def _rank_colours(d: int) -> list[str]:
    """One colour per rank (module 2's picture: the course's colour cycle, then grey-blues)."""
    import matplotlib as mpl

    cycle = mpl.rcParams["axes.prop_cycle"].by_key().get("color", [])
    extra = ["#64b5cd", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#4c72b0"]
    return [(list(cycle) + extra)[r % (len(cycle) + len(extra))] for r in range(d)]

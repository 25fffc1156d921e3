"""Module 5's pipeline schedule explorer: P stages, m microbatches, GPipe, 1F1B or interleaved 1F1B
with v chunks, and optionally one slow stage: the timeline, the bubble fraction and the
microbatches whose activations each stage holds at its peak.

Everything is :func:`course_utils.pipeline_schedule.simulate`'s timeline (its idle fraction and
``peak_activations``), set beside the formulas ``bubble_fraction`` and
``interleaved_bubble_fraction``, the functions lecture 5 asserts; the chart is drawn in
``draw_timeline``'s colours, as one collection (a redraw must stay fast)::

    from course_utils.widgets.pipeline_timeline import PipelineTimeline
    PipelineTimeline(schedule="1f1b", stages=4, microbatches=8)
"""

from __future__ import annotations

from typing import Any

from course_utils import pipeline_schedule as ps
from course_utils.widgets.base import (Explorer, Row, checkbox, choice_slider, dropdown, key,
                                       nice_ticks, plain_axes, slider)

__all__ = ["PipelineTimeline", "STAGES", "SLOWDOWNS", "MAX_LABELLED"]

# P = 5 and 7 are left out: assignment a5's Q4 asks every student to read the same P = 5
# timelines (tests/test_widgets.py checks the widget cannot draw them)
STAGES = (2, 3, 4, 6, 8)
SLOWDOWNS = (1.5, 2.0, 3.0)
MAX_LABELLED = 40  # ops labelled F3 / B3 only up to this many: each label costs a redraw ~1 ms
_WORDS = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B"}


class PipelineTimeline(Explorer):
    """A schedule, P, m, v and an optional slow stage -> the simulated timeline, its bubble
    against the formula, and the activations each stage holds at its peak."""

    prefix = "pt"
    title = "Pipeline schedule (simulated op by op)"
    defaults = {"schedule": "1f1b", "stages": 4, "microbatches": 8, "chunks": 1,
                "slow_stage": -1, "slowdown": 2.0, "backward_2x": False}
    figsize = (9.0, 3.4)
    alt = "the pipeline's timeline: one row per stage, forwards blue and backwards green"

    def _controls(self, v: dict[str, Any]) -> dict[str, Any]:
        return {"schedule": dropdown("schedule", [(w, k) for k, w in _WORDS.items()],
                                     v["schedule"]),
                "stages": choice_slider("stages P", STAGES, v["stages"]),
                "microbatches": slider("microbatches m", v["microbatches"], 1, 32),
                "chunks": slider("chunks per rank v", v["chunks"], 1, 4),
                "slow_stage": dropdown("slow stage", _slow_options(8), v["slow_stage"]),
                "slowdown": dropdown("slow stage takes", [(f"{x:g} x", x) for x in SLOWDOWNS],
                                     v["slowdown"]),
                "backward_2x": checkbox("backward = 2 x forward", v["backward_2x"])}

    def compute(self, schedule: str, stages: int, microbatches: int, chunks: int,
                slow_stage: int, slowdown: float, backward_2x: bool) -> dict[str, Any]:
        if slow_stage >= stages:
            raise ValueError(f"slow_stage must be a stage from 0 to {stages - 1} (or none); got "
                             f"{slow_stage}")
        times = None if slow_stage < 0 else [slowdown if r == slow_stage else 1.0
                                             for r in range(stages)]
        tl = ps.simulate(schedule, p=stages, m=microbatches, v=chunks, stage_times=times,
                         backward_ratio=2.0 if backward_2x else 1.0)
        formula = (ps.interleaved_bubble_fraction(p=stages, m=microbatches, v=chunks)
                   if schedule == "interleaved" else ps.bubble_fraction(stages, microbatches))
        return {"timeline": tl, "formula": formula, "balanced": slow_stage < 0,
                "slow_stage": slow_stage, "slowdown": slowdown}

    def rows(self, s: dict[str, Any]) -> list[Row]:
        tl = s["timeline"]
        formula = ("(P-1)/(v m+P-1)" if tl.schedule == "interleaved" else "(P-1)/(m+P-1)")
        peaks = tl.peak_activations()
        return [Row("bubble", "bubble (idle share, simulated)", f"{tl.idle_fraction():.1%}"),
                Row("formula", f"formula {formula}", f"{s['formula']:.1%}"
                    + ("" if s["balanced"] else " (balanced stages only)")),
                Row("makespan", "step time", f"{tl.makespan:g} units (one forward = 1)"),
                Row("in-flight", "activations held at peak, per stage",
                    ", ".join(f"{x:g}" for x in peaks) + " microbatches"),
                Row("idle", "idle per stage", ", ".join(f"{x:.0%}"
                                                        for x in tl.rank_idle_fractions()))]

    def notes(self, s: dict[str, Any]) -> list[str]:
        tl = s["timeline"]
        if not s["balanced"]:
            return [f"Stage {s['slow_stage']} takes {s['slowdown']:g} x as long: every other "
                    "stage waits for it; more microbatches do not help, balancing the layers "
                    "does."]
        if tl.schedule == "gpipe":
            return ["GPipe: every forward, then every backward: each stage holds all m "
                    "microbatches at its peak."]
        if tl.schedule == "1f1b":
            return ["1F1B: a stage starts backwards before taking more forwards, so rank r "
                    "holds at most P - r microbatches, whatever m."]
        return ["Interleaved: v chunks per rank divide the fill and drain by v; the longer "
                "warm-up holds more than 1F1B's P - r (a chunk counts 1/v)."]

    def draw(self, s: dict[str, Any], fig: Any) -> None:
        from matplotlib.collections import PolyCollection

        tl = s["timeline"]
        ax = fig.add_axes((0.115, 0.17, 0.69, 0.68))
        t0, span = tl.start, tl.makespan
        boxes, colours = [], []
        width_px = 0.69 * fig.get_figwidth() * fig.dpi  # the axes' width in pixels
        for o in tl.ops:
            a, b = o.start - t0, o.end - t0
            boxes.append([(a, o.rank - 0.4), (b, o.rank - 0.4), (b, o.rank + 0.4),
                          (a, o.rank + 0.4)])
            face = ps.op_color(o.kind, o.chunk, tl.v)
            colours.append(face)
            label = ps.op_label(o, tl.v)
            room = (b - a) / span * width_px - 3
            if len(tl.ops) <= MAX_LABELLED and room >= 5.6 * len(label):  # 8.5 pt characters
                dark = 0.299 * face[0] + 0.587 * face[1] + 0.114 * face[2] < 0.55
                _ = ax.text((a + b) / 2, o.rank, label, ha="center", va="center", fontsize=8.5,
                            color="white" if dark else "black")
        ax.add_collection(PolyCollection(boxes, facecolors=colours, edgecolors="black",
                                         linewidths=0.4))
        _ = ax.set_ylim(tl.p - 0.5, -0.5)
        _ = ax.set_xlim(0, span)
        plain_axes(ax, nice_ticks(0, span, 6),
                   [(r, f"rank {r}" + (" (slow)" if r == s["slow_stage"] else ""))
                    for r in range(tl.p)], xlabel="time (units of one balanced forward)")
        key(fig, [(h.get_label(), h.get_facecolor(), None) for h in ps.legend_handles(tl.v)],
            x=0.82, top=0.8, step=0.09)
        v = f", v = {tl.v}" if tl.v > 1 else ""
        _ = fig.suptitle(f"{_WORDS[tl.schedule]}: P = {tl.p}, m = {tl.m}{v}: bubble "
                         f"{tl.idle_fraction():.1%}, step {tl.makespan:g} units", x=0.02,
                         ha="left", fontsize=12)


def _slow_options(stages: int) -> list[tuple[str, int]]:
    return [("none (balanced)", -1)] + [(f"rank {r}", r) for r in range(stages)]

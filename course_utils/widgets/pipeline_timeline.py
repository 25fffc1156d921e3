"""Module 5's pipeline schedule explorer: P stages, m microbatches, a schedule (GPipe, 1F1B,
interleaved 1F1B with v chunks, or a zero-bubble schedule that splits the backward into I and
W: ZB-H1, ZBV, DualPipeV), the ops' times and optionally one slow rank: the timeline, the
bubble against the formula (with and without the optimizer's global check) and the
microbatches whose activations each rank holds at its peak.

Everything is :func:`course_utils.pipeline.schedule.simulate`'s timeline (its idle fraction and
``peak_activations``), set beside the formulas ``bubble_fraction``,
``interleaved_bubble_fraction`` and :func:`course_utils.pipeline.zero_bubble.paper_bubble_fraction`,
the functions lecture 5 asserts; the chart is drawn in
:mod:`course_utils.pipeline.pictures`' colours, as one collection (a redraw must stay fast)::

    from course_utils.widgets.pipeline_timeline import PipelineTimeline
    PipelineTimeline(schedule="1f1b", stages=4, microbatches=8)
"""

from __future__ import annotations

from typing import Any

from course_utils.pipeline import pictures as pics
from course_utils.pipeline import schedule as ps
from course_utils.pipeline import zero_bubble as zb
from course_utils.widgets.base import (Explorer, Row, choice_slider, dropdown, key, nice_ticks,
                                       plain_axes, slider)

__all__ = ["PipelineTimeline", "STAGES", "SLOWDOWNS", "OP_TIMES", "MAX_LABELLED", "number"]

# P = 5 and 7 are left out: assignment a5's Q4 asks every student to read the same P = 5
# timelines, and Q7's pipelines have 5 or 7 stages (tests/test_widgets.py checks the widget
# cannot draw them)
STAGES = (2, 3, 4, 6, 8)
SLOWDOWNS = (1.5, 2.0, 3.0)
# the ops' times, forward = 1: name -> (words, whole backward B = I + W, W's share of B)
OP_TIMES = {"1:0.5:0.5": ("F : I : W = 1 : 0.5 : 0.5", 1.0, 0.5),
            "1:1:1": ("F : I : W = 1 : 1 : 1", 2.0, 0.5),
            "1:1.5:0.5": ("F : I : W = 1 : 1.5 : 0.5", 2.0, 0.25),
            "1:0.5:1.5": ("F : I : W = 1 : 0.5 : 1.5", 2.0, 0.75)}
MAX_LABELLED = 40  # ops labelled F3 / B3 only up to this many: each label costs a redraw ~1 ms
_WORDS = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B", "zb-h1": "ZB-H1",
          "zbv": "ZBV (2 chunks in a V)", "dualpipev": "DualPipeV (2 chunks in a V)"}


def number(x: float) -> str:
    """A time or a count as a reader wants it: at most two decimals, no trailing zeros
    (65.3333 -> "65.33", 4.5 -> "4.5", 5.0 -> "5")."""
    return f"{x:.2f}".rstrip("0").rstrip(".")


class PipelineTimeline(Explorer):
    """A schedule, P, m, v, the ops' times and an optional slow rank -> the simulated timeline,
    its bubble against the formula, and the activations each rank holds at its peak."""

    prefix = "pt"
    title = "Pipeline schedule (simulated op by op)"
    defaults = {"schedule": "1f1b", "stages": 4, "microbatches": 8, "chunks": 1,
                "slow_stage": -1, "slowdown": 2.0, "op_times": "1:0.5:0.5"}
    figsize = (9.0, 3.4)
    alt = ("the pipeline's timeline: one row per rank, forwards blue, backwards green, weight "
           "gradients ochre")

    def _controls(self, v: dict[str, Any]) -> dict[str, Any]:
        return {"schedule": dropdown("schedule", [(w, k) for k, w in _WORDS.items()],
                                     v["schedule"]),
                "stages": choice_slider("stages P", STAGES, v["stages"]),
                "microbatches": slider("microbatches m", v["microbatches"], 1, 32),
                "chunks": slider("chunks per rank v", v["chunks"], 1, 4),
                "slow_stage": dropdown("slow rank", _slow_options(v["stages"]), v["slow_stage"]),
                "slowdown": dropdown("slow rank takes", [(f"{x:g} x", x) for x in SLOWDOWNS],
                                     v["slowdown"]),
                "op_times": dropdown("op times", [(w, k) for k, (w, _, _) in OP_TIMES.items()],
                                     v["op_times"])}

    def _adjust(self) -> None:
        """Offer only the ranks that exist; a V schedule holds two chunks per rank."""
        stages, slow = self.controls["stages"].value, self.controls["slow_stage"]
        options = _slow_options(stages)
        if list(slow.options) != options:
            value = slow.value if slow.value < stages else -1
            slow.options = options
            slow.value = value
        chunks = self.controls["chunks"]
        v_shaped = self.controls["schedule"].value in zb.V_SCHEDULES
        if v_shaped:
            chunks.value = 2
        elif chunks.disabled:  # leaving a V schedule: back to one chunk
            chunks.value = 1
        chunks.disabled = v_shaped

    def compute(self, schedule: str, stages: int, microbatches: int, chunks: int,
                slow_stage: int, slowdown: float, op_times: str) -> dict[str, Any]:
        if slow_stage >= stages:
            raise ValueError(f"slow_stage must be a rank from 0 to {stages - 1} (or none); got "
                             f"{slow_stage}")
        words, ratio, share = OP_TIMES[op_times]
        times = None if slow_stage < 0 else [slowdown if r == slow_stage else 1.0
                                             for r in range(stages)]
        tl = ps.simulate(schedule, p=stages, m=microbatches, v=chunks, stage_times=times,
                         backward_ratio=ratio, weight_share=share)
        f, i, w = 1.0, ratio * (1 - share), ratio * share
        why = None
        if schedule == "interleaved":
            formula = ps.interleaved_bubble_fraction(p=stages, m=microbatches, v=chunks)
        elif schedule == "gpipe":
            formula = ps.bubble_fraction(stages, microbatches)
        elif schedule == "zbv" and not f == i == w:
            formula, why = None, "none for these times"  # the paper: only for F = I = W
        elif microbatches < zb.min_microbatches(schedule, stages):
            formula, why = None, f"holds for m >= {zb.min_microbatches(schedule, stages)} only"
        else:
            formula = zb.paper_bubble_fraction(schedule, stages, microbatches, f, i, w)
        return {"timeline": tl, "formula": formula, "why_none": why, "balanced": slow_stage < 0,
                "slow_stage": slow_stage, "slowdown": slowdown, "times": (f, i, w)}

    def rows(self, s: dict[str, Any]) -> list[Row]:
        tl = s["timeline"]
        formula = {"interleaved": "(P-1)/(v m+P-1)", "gpipe": "(P-1)/(m+P-1)",
                   "1f1b": "(P-1)/(m+P-1)", "zb-h1": "Qi et al., (P-1)(F+I-W)",
                   "zbv": "Qi et al., 0 at F = I = W",
                   "dualpipev": "DeepSeek, F&B = F+B"}[tl.schedule]
        if s["formula"] is None:
            shown = s["why_none"]
        else:
            shown = f"{s['formula']:.1%}" + ("" if s["balanced"] else " (balanced ranks only)")
        return [Row("bubble", "bubble (idle share, simulated)", f"{tl.idle_fraction():.1%}"),
                Row("nosync", "without the step's global check",
                    f"{tl.idle_fraction(sync=False):.1%}"),
                Row("formula", f"formula ({formula})", shown),
                Row("makespan", "step time", f"{number(tl.makespan)} units (one forward = 1)"),
                Row("in-flight", "activations held at peak, per rank",
                    ", ".join(number(x) for x in tl.peak_activations()) + " microbatches"),
                Row("idle", "idle per rank", ", ".join(f"{x:.0%}"
                                                       for x in tl.rank_idle_fractions()))]

    def notes(self, s: dict[str, Any]) -> list[str]:
        tl = s["timeline"]
        if not s["balanced"]:
            return [f"Rank {s['slow_stage']} takes {s['slowdown']:g} x as long: every other "
                    "rank waits for it; more microbatches do not help, balancing the layers "
                    "does."]
        return [{"gpipe": "GPipe: every forward, then every backward: each rank holds all m "
                          "microbatches at its peak.",
                 "1f1b": "1F1B: a rank starts backwards before taking more forwards, so rank r "
                         "holds at most P - r microbatches, whatever m.",
                 "interleaved": "Interleaved: v chunks per rank divide the fill and drain by v; "
                                "the longer warm-up holds more than 1F1B's P - r (a chunk "
                                "counts 1/v).",
                 "zb-h1": "ZB-H1: I at once, W held back to fill the wait: a third of 1F1B's "
                          "bubble at F = I = W, every rank holding P microbatches.",
                 "zbv": "ZBV: two chunks per rank in a V; zero bubble at F = I = W only once "
                        "steps no longer wait for a global check (post-validation).",
                 "dualpipev": "DualPipeV: a forward of one chunk and a backward of the other "
                              "run as a pair; the last rank's two chunks are neighbours."}[
            tl.schedule]]

    def draw(self, s: dict[str, Any], fig: Any) -> None:
        from matplotlib.collections import PolyCollection

        tl = s["timeline"]
        ax = fig.add_axes((0.115, 0.17, 0.64, 0.68))
        t0, span = tl.start, tl.makespan
        boxes, colours = [], []
        width_px = 0.64 * fig.get_figwidth() * fig.dpi  # the axes' width in pixels
        for o in tl.ops:
            a, b = o.start - t0, o.end - t0
            boxes.append([(a, o.rank - 0.4), (b, o.rank - 0.4), (b, o.rank + 0.4),
                          (a, o.rank + 0.4)])
            face = pics.op_color(o.kind, o.chunk, tl.v)
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
        kinds = sorted({o.kind for o in tl.ops})
        handles = pics.legend_handles(tl.v, kinds)
        key(fig, [(h.get_label(), h.get_facecolor(), None) for h in handles],
            x=0.77, top=0.8, step=0.8 / max(len(handles), 9), fontsize=8.5)
        v = f", v = {tl.v}" if tl.v > 1 else ""
        _ = fig.suptitle(f"{_WORDS[tl.schedule].split(' (')[0]}: P = {tl.p}, m = {tl.m}{v}: "
                         f"bubble {tl.idle_fraction():.1%}, step {number(tl.makespan)} units",
                         x=0.02, ha="left", fontsize=12)


def _slow_options(stages: int) -> list[tuple[str, int]]:
    return [("none (balanced)", -1)] + [(f"rank {r}", r) for r in range(stages)]

"""Tests for course_utils.pipeline.schedule: formulas, the simulator, and the lecture's figures."""

from __future__ import annotations

import math

import matplotlib
import pytest

from course_utils.pipeline import pictures as pics
from course_utils.pipeline import schedule as ps

matplotlib.use("Agg")

GRID = [(p, m) for p in (1, 2, 3, 4, 8) for m in (1, 2, 3, 4, 8, 16, 32)]


# ----------------------------------------------------------------------------------- formulas


def test_lesson_figures():
    assert ps.bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert round(100 * ps.bubble_fraction(4, 8), 1) == 27.3
    assert ps.bubble_fraction(4, 32) == pytest.approx(3 / 35)
    assert round(100 * ps.bubble_fraction(4, 32), 1) == 8.6
    assert ps.bubble_ratio(4, 8) == pytest.approx(0.375)
    assert round(100 * ps.bubble_ratio(4, 32), 1) == 9.4
    assert ps.effective_batch(2, 16, 4) == 128
    assert ps.bubble_fraction(4, 1) == 0.75  # the single-microbatch picture: 75 % idle


@pytest.mark.parametrize("p,m", GRID)
def test_ratio_and_fraction_describe_the_same_bubble(p, m):
    f, r = ps.bubble_fraction(p, m), ps.bubble_ratio(p, m)
    assert ps.ratio_to_fraction(r) == pytest.approx(f)
    assert ps.fraction_to_ratio(f) == pytest.approx(r)
    assert f <= r
    assert ps.interleaved_bubble_fraction(p, m, 1) == pytest.approx(f)


def test_min_microbatches():
    assert ps.min_microbatches(4, 0.10) == 27  # lecture: 27, not the ratio's 30
    assert ps.min_microbatches(8, 0.10) == 63
    assert ps.min_microbatches(1, 0.5) == 1
    for p in (2, 3, 4, 8, 16):
        for target in (0.5, 0.27, 0.1, 0.05, 0.01, 3 / 11):
            m = ps.min_microbatches(p, target)
            assert ps.bubble_fraction(p, m) <= target
            assert m == 1 or ps.bubble_fraction(p, m - 1) > target


def test_effective_batch_ignores_tp_and_pp():
    # the same microbatch and accumulation on any TP x PP split of each replica
    assert ps.effective_batch(2, 16, 4) == 128
    assert ps.effective_batch(4, 8, 2) == 64
    assert ps.effective_batch(1, 1, 1) == 1


@pytest.mark.parametrize("call", [
    lambda: ps.bubble_fraction(0, 4), lambda: ps.bubble_fraction(4, 0),
    lambda: ps.bubble_fraction(4.0, 8), lambda: ps.bubble_fraction(True, 8),
    lambda: ps.bubble_fraction("4", 8), lambda: ps.bubble_ratio(4, -1),
    lambda: ps.effective_batch(0, 16, 4), lambda: ps.effective_batch(2, 1.5, 4),
    lambda: ps.effective_batch(2, 16, -4), lambda: ps.min_microbatches(4, 0),
    lambda: ps.min_microbatches(4, 1.0), lambda: ps.min_microbatches(4, "0.1"),
    lambda: ps.ratio_to_fraction(-0.1), lambda: ps.fraction_to_ratio(1.0),
    lambda: ps.interleaved_bubble_fraction(4, 8, 0),
])
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_error_messages_name_the_argument():
    with pytest.raises(ValueError, match="p must be an int >= 1"):
        ps.bubble_fraction(0, 4)
    with pytest.raises(ValueError, match="m must be"):
        ps.bubble_fraction(4, 0)
    with pytest.raises(ValueError, match="dp must be"):
        ps.effective_batch(2, 16, 0)
    with pytest.raises(ValueError, match="microbatch_size"):
        ps.effective_batch(0, 16, 4)
    with pytest.raises(ValueError, match="accumulation_steps"):
        ps.effective_batch(2, 0, 4)


# ----------------------------------------------------------------------------------- simulator


def _all_configs():
    for p, m in GRID:
        yield "gpipe", p, m, 1
        yield "1f1b", p, m, 1
        for v in (1, 2, 3):
            if m % p == 0:
                yield "interleaved", p, m, v


@pytest.mark.parametrize("backward_ratio", [1.0, 2.0])
def test_balanced_idle_fraction_equals_formula(backward_ratio):
    for schedule, p, m, v in _all_configs():
        tl = ps.simulate(schedule, p, m, v=v, backward_ratio=backward_ratio)
        expected = ps.interleaved_bubble_fraction(p, m, v)
        assert tl.idle_fraction() == pytest.approx(expected, abs=1e-12), (schedule, p, m, v)
        if v == 1:
            assert tl.idle_fraction() == pytest.approx(ps.bubble_fraction(p, m), abs=1e-12)
        assert tl.makespan == pytest.approx((m + (p - 1) / v) * (1 + backward_ratio))


def test_timelines_are_consistent():
    """Every forward precedes its backward, inputs precede use, no rank does two things at once."""
    for schedule, p, m, v in _all_configs():
        for kw in ({}, {"backward_ratio": 2.0}, {"stage_times": [1.0 + 0.5 * r for r in range(p)]},
                   {"comm_time": 0.3}):
            tl = ps.simulate(schedule, p, m, v=v, **kw)
            tl.check()
            assert len(tl.ops) == 2 * m * p * v
            for rank in range(p):
                ops = tl.rank_ops(rank)
                for a, b in zip(ops, ops[1:]):
                    assert a.end <= b.start + 1e-9
                fwd_end = {(o.microbatch, o.chunk): o.end for o in ops if o.kind == "F"}
                for o in ops:
                    if o.kind == "B":
                        assert fwd_end[o.microbatch, o.chunk] <= o.start + 1e-9


def test_check_catches_bad_timelines():
    tl = ps.simulate("gpipe", 2, 2)
    ops = list(tl.ops)
    first = ops[0]
    ops[0] = ps.Op(first.rank, first.kind, first.microbatch, first.chunk, first.start,
                   first.end + 5)  # overlaps the next op on the same rank
    with pytest.raises(AssertionError):
        ps.Timeline("gpipe", 2, 2, 1, ops).check()
    # a backward that starts before its own forward ended
    b = next(o for o in tl.ops if o.kind == "B" and o.rank == 1)
    moved = [o if o is not b else ps.Op(o.rank, "B", o.microbatch, 0, -2.0, -1.0) for o in tl.ops]
    with pytest.raises(AssertionError):
        ps.Timeline("gpipe", 2, 2, 1, moved).check()


def test_schedule_orders():
    gpipe = ps.schedule_order("gpipe", 2, 3)
    assert gpipe[0] == [("F", 0, 0), ("F", 1, 0), ("F", 2, 0),
                        ("B", 0, 0), ("B", 1, 0), ("B", 2, 0)]
    ofob = ps.schedule_order("1f1b", 2, 3)
    assert ofob[0] == [("F", 0, 0), ("F", 1, 0), ("B", 0, 0), ("F", 2, 0),
                       ("B", 1, 0), ("B", 2, 0)]
    assert ofob[1] == [("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("B", 1, 0),
                       ("F", 2, 0), ("B", 2, 0)]
    for schedule, p, m, v in _all_configs():
        for rank_ops in ps.schedule_order(schedule, p, m, v):
            assert sorted(rank_ops) == sorted((k, i, c) for k in "FB" for i in range(m)
                                              for c in range(v))


def test_lecture_timelines_and_figures():
    one = ps.simulate("gpipe", 4, 1)
    assert one.idle_fraction() == 0.75
    assert ps.format_timeline(one).splitlines()[0] == "rank 0 | F0 .  .  .  .  .  .  B0"
    assert ps.format_timeline(ps.simulate("1f1b", 4, 8)).splitlines()[3] == (
        "rank 3 | .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 .  .  .")
    assert ps.simulate("gpipe", 4, 8).makespan == 22
    assert ps.simulate("interleaved", 4, 8, v=2).makespan == 19
    assert ps.simulate("interleaved", 4, 8, v=2).idle_fraction() == pytest.approx(3 / 19)


def test_backward_twice_forward_keeps_fraction_imbalance_raises_it():
    for schedule in ("gpipe", "1f1b"):
        base = ps.simulate(schedule, 4, 8).idle_fraction()
        assert ps.simulate(schedule, 4, 8, backward_ratio=2.0).idle_fraction() == pytest.approx(base)
        slow = ps.simulate(schedule, 4, 8, backward_ratio=2.0, stage_times=[1, 1, 2, 1])
        assert slow.idle_fraction() > base + 0.15
        idle = slow.rank_idle_fractions()
        assert min(idle) == idle[2]  # the slow rank is the busiest; the others wait for it
    # the figures printed by the lecture
    printed = {("gpipe", 1.5): "40.0%", ("1f1b", 1.5): "37.9%",
               ("gpipe", 2.0): "47.4%", ("1f1b", 2.0): "45.5%"}
    for (schedule, slow_factor), text in printed.items():
        tl = ps.simulate(schedule, 4, 8, backward_ratio=2.0, stage_times=[1, 1, slow_factor, 1])
        assert f"{tl.idle_fraction():.1%}" == text
    slow = ps.simulate("1f1b", 4, 8, backward_ratio=2.0, stage_times=[1, 1, 2, 1])
    assert [f"{x:.1%}" for x in slow.rank_idle_fractions()] == ["56.4%", "56.4%", "12.7%", "56.4%"]


def test_comm_time_adds_to_bubble():
    free = ps.simulate("gpipe", 2, 8).idle_fraction()
    costly = ps.simulate("gpipe", 2, 8, comm_time=0.2).idle_fraction()
    assert costly > free


def test_activations_in_flight():
    for p in (2, 3, 4, 8):
        for m in (1, 2, 4, 8, 16, 32):
            g = ps.simulate("gpipe", p, m).peak_activations()
            o = ps.simulate("1f1b", p, m).peak_activations()
            assert g == [float(m)] * p  # GPipe holds every microbatch
            assert o == [float(min(p - r, m)) for r in range(p)]  # 1F1B: min(P - r, m)
    assert ps.simulate("interleaved", 4, 8, v=2).peak_activations() == [5.5, 4.5, 3.5, 2.5]
    assert ps.simulate("interleaved", 4, 32, v=2).peak_activations() == [5.5, 4.5, 3.5, 2.5]


@pytest.mark.parametrize("call", [
    lambda: ps.simulate("pipedream", 4, 8),
    lambda: ps.simulate("gpipe", 4, 8, v=2),
    lambda: ps.simulate("interleaved", 4, 6, v=2),
    lambda: ps.simulate("gpipe", 0, 8),
    lambda: ps.simulate("gpipe", 4, 8, stage_times=[1, 1, 1]),
    lambda: ps.simulate("gpipe", 4, 8, stage_times=[1, 1, 0, 1]),
    lambda: ps.simulate("gpipe", 4, 8, backward_ratio=0),
    lambda: ps.simulate("gpipe", 4, 8, comm_time=-1),
    lambda: ps.simulate("gpipe", 4, 8, forward_time=math.nan),
    lambda: ps.schedule_order("1f1b", 2, 0),
    lambda: ps.format_timeline("not a timeline"),
    lambda: ps.format_timeline(ps.simulate("gpipe", 2, 2), unit=0),
])
def test_simulator_bad_input(call):
    with pytest.raises(ValueError):
        call()


def test_draw_timeline_runs():
    import matplotlib.pyplot as plt

    for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1),
                        ("zbv", 2), ("dualpipev", 2)):
        ax = pics.draw_timeline(ps.simulate(schedule, 4, 8, v=v))
        assert "idle" in ax.get_title()
        plt.close("all")


def test_drawn_timelines_pass_the_course_figure_check():
    """Every schedule, on one shared time scale, draws with no clipped or overlapping label."""
    import matplotlib
    import matplotlib.pyplot as plt

    from course_utils import style

    with matplotlib.rc_context():
        style.use()
        timelines = [ps.simulate("gpipe", 4, 8), ps.simulate("1f1b", 4, 8),
                     ps.simulate("interleaved", 4, 8, v=2)]
        longest = max(tl.makespan for tl in timelines)
        fig, axes = plt.subplots(len(timelines), 1, figsize=(9, 8.5), sharex=True)
        for ax, tl in zip(axes, timelines):
            pics.draw_timeline(tl, ax=ax, tmax=longest)
        fig.tight_layout()
        fig.canvas.draw()
        assert style.problems(fig, fig.canvas.get_renderer()) == []
        assert axes[0].get_xlim() == (0.0, longest)
        shown = [t.get_text() for t in axes[0].texts if t.get_visible()]
        assert "F0" in shown and "B7" in shown  # balanced ops carry their full label
        plt.close(fig)
        # a slow stage stretches the time axis: short ops fall back to their microbatch number
        ax = pics.draw_timeline(ps.simulate("1f1b", 4, 8, backward_ratio=2.0,
                                            stage_times=[1, 1, 2, 1]))
        ax.figure.canvas.draw()
        assert style.problems(ax.figure, ax.figure.canvas.get_renderer()) == []
        shown = {t.get_text() for t in ax.texts if t.get_visible()}
        assert {"0", "B0", "F0"} <= shown
        plt.close("all")


# ----------------------------------------------------------------------------------- a5's givens


def test_every_a5_pipeline_given_is_one_the_simulator_and_the_cited_systems_accept():
    """Issue 36: a5 drew interleaved pipelines with m not a multiple of P (6, 14, 3), which the
    course's simulator refuses, Megatron-LM rejects by default and the formula assumes. Every
    option of every a5 pipeline given: the simulator plays it and gets the formula the
    question asks for; interleaved ones pass Megatron-LM's rule (m a multiple of P) and
    torch's ScheduleInterleaved1F1B's (m a multiple of its rounds, max(1, m // P):
    ``torch/distributed/pipelining/schedules.py``, ScheduleInterleaved1F1B.__init__); Q7's
    ZB-H1 pipelines idle Qi et al.'s (P-1)(T_F + T_B - T_W) with T_B = B - W, every rank
    holding P microbatches at its peak."""
    from course_utils.assess import variants

    givens = variants.givens_of("a5_pipeline")
    for name in ("q1_gpipe", "q1_1f1b"):
        schedule = name.split("_")[1]
        for p, m in givens[name].options:
            tl = ps.simulate(schedule, p, m)
            assert tl.idle_fraction() == pytest.approx(ps.bubble_fraction(p, m)), (name, p, m)
    for p, m, v in givens["q1_interleaved"].options:
        assert m % p == 0, (p, m, v)  # Megatron-LM (microbatches go round in groups of P)
        assert m % max(1, m // p) == 0  # torch's ScheduleInterleaved1F1B
        tl = ps.simulate("interleaved", p, m, v=v)
        tl.check()
        assert tl.idle_fraction() == pytest.approx(ps.interleaved_bubble_fraction(p, m, v))
    for p, m, f, b, w, r in givens["q7"].options:
        i = b - w
        assert m >= p and w <= f and w <= i and 0 < r < p
        tl = ps.simulate("zb-h1", p, m, forward_time=f, backward_ratio=b / f, weight_share=w / b)
        tl.check()
        bubble = (p - 1) * (f + i - w)
        assert [tl.makespan - tl.busy(k) for k in range(p)] == pytest.approx([bubble] * p)
        assert tl.idle_fraction() == pytest.approx(bubble / (bubble + m * (f + b)))
        assert tl.peak_activations()[r] == p
        ofob = ps.simulate("1f1b", p, m, forward_time=f, backward_ratio=b / f)
        assert ofob.makespan - ofob.busy(0) == pytest.approx((p - 1) * (f + b))  # the mistake
        assert ofob.peak_activations()[r] == p - r

"""Pipeline schedules: bubble formulas, batch accounting and a schedule simulator.

A pipeline splits a model's layers into P consecutive *stages*, one per rank, and feeds it m
*microbatches*. This module answers "how much of the time does each rank sit idle?" three ways:

* the idealized formula :func:`bubble_fraction` = (P - 1) / (m + P - 1) (balanced stages, no
  communication cost), and the ratio :func:`bubble_ratio` = (P - 1) / m that some sources quote;
* a simulator, :func:`simulate`, that plays a schedule (``"gpipe"``, ``"1f1b"``, ``"interleaved"``)
  op by op and returns a :class:`Timeline` (who computes what, when), from which idle fraction and
  activations in flight are read off, and which :func:`draw_timeline` / :func:`format_timeline`
  draw as a Gantt chart;
* :mod:`course_utils.pipeline_parallel` measures it on real ranks.

Batch accounting lives here too: :func:`effective_batch` (tensor and pipeline parallelism do not
change it).

Time is in arbitrary units (one forward of one microbatch through a balanced stage = 1.0 by
default). Ranks and stages are numbered from 0; microbatches too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = ["bubble_fraction", "bubble_ratio", "ratio_to_fraction", "fraction_to_ratio",
           "interleaved_bubble_fraction", "min_microbatches", "effective_batch", "SCHEDULES",
           "Op", "Timeline", "schedule_order", "simulate", "format_timeline", "draw_timeline",
           "op_label", "op_color", "legend_handles"]

SCHEDULES = ("gpipe", "1f1b", "interleaved")


# ----------------------------------------------------------------------------------- checks


def _check_pos_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer (>= 1), got {value!r}")
    return value


def _check_pos_number(name: str, value: Any, allow_zero: bool = False) -> float:
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (value >= 0 if allow_zero else value > 0))
    if not ok:
        what = "a finite number >= 0" if allow_zero else "a finite number > 0"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return float(value)


# ----------------------------------------------------------------------------------- formulas


def bubble_fraction(p: int, m: int) -> float:
    """Idle fraction (P-1)/(m+P-1) of a balanced pipeline with p stages and m microbatches."""
    _check_pos_int("p", p)
    _check_pos_int("m", m)
    return (p - 1) / (m + p - 1)


def bubble_ratio(p: int, m: int) -> float:
    """Bubble time over useful compute time, (P-1)/m (the form GPipe and Megatron papers quote)."""
    _check_pos_int("p", p)
    _check_pos_int("m", m)
    return (p - 1) / m


def ratio_to_fraction(ratio: float) -> float:
    """Convert bubble/compute ratio r to the idle fraction of total time: r / (1 + r)."""
    _check_pos_number("ratio", ratio, allow_zero=True)
    return ratio / (1.0 + ratio)


def fraction_to_ratio(fraction: float) -> float:
    """Convert an idle fraction f (0 <= f < 1) of total time to the bubble/compute ratio f/(1-f)."""
    _check_pos_number("fraction", fraction, allow_zero=True)
    if fraction >= 1:
        raise ValueError(f"fraction must be in [0, 1), got {fraction!r}")
    return fraction / (1.0 - fraction)


def interleaved_bubble_fraction(p: int, m: int, v: int) -> float:
    """Idle fraction (P-1)/(v*m+P-1) of interleaved 1F1B with v model chunks per rank (Megatron-LM)."""
    _check_pos_int("p", p)
    _check_pos_int("m", m)
    _check_pos_int("v", v)
    return (p - 1) / (v * m + p - 1)


def min_microbatches(p: int, target: float) -> int:
    """Smallest m with bubble_fraction(p, m) <= target (0 < target < 1)."""
    _check_pos_int("p", p)
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target < 1:
        raise ValueError(f"target must be a fraction strictly between 0 and 1, got {target!r}")
    # (p-1)/(m+p-1) <= t  <=>  m >= (p-1)(1-t)/t ; then step past floating-point rounding
    m = max(1, math.ceil((p - 1) * (1 - target) / target - 1e-9))
    while m > 1 and bubble_fraction(p, m - 1) <= target:
        m -= 1
    while bubble_fraction(p, m) > target:
        m += 1
    return m


def effective_batch(microbatch_size: int, accumulation_steps: int, dp: int) -> int:
    """Examples per optimizer step: microbatch_size x accumulation_steps x dp (TP and PP do not count)."""
    _check_pos_int("microbatch_size", microbatch_size)
    _check_pos_int("accumulation_steps", accumulation_steps)
    _check_pos_int("dp", dp)
    return microbatch_size * accumulation_steps * dp


# ----------------------------------------------------------------------------------- schedules


def _check_schedule(schedule: Any, p: int, m: int, v: int) -> str:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {list(SCHEDULES)}, got {schedule!r}")
    _check_pos_int("p", p)
    _check_pos_int("m", m)
    _check_pos_int("v", v)
    if schedule != "interleaved" and v != 1:
        raise ValueError(f"v (chunks per rank) must be 1 for schedule {schedule!r}, got {v}; "
                         "use schedule='interleaved' for v > 1")
    if schedule == "interleaved" and m % p != 0:
        raise ValueError(f"m must be a multiple of p for the interleaved schedule "
                         f"(microbatches go round in groups of p), got m={m}, p={p}")
    return schedule


def schedule_order(schedule: str, p: int, m: int, v: int = 1) -> list[list[tuple[str, int, int]]]:
    """Per-rank op order: ``order[rank]`` is a list of (kind 'F'|'B', microbatch, chunk).

    ``"gpipe"``: every forward, then every backward (microbatches in order).
    ``"1f1b"``: rank r runs min(P-r-1, m) warm-up forwards, then alternates one forward and one
    backward, then drains the remaining backwards (PipeDream-flush).
    ``"interleaved"``: each rank holds v chunks (chunk c of rank r is virtual stage c*P + r) and
    runs Megatron-LM's interleaved 1F1B order; m must be a multiple of p.
    """
    _check_schedule(schedule, p, m, v)
    order: list[list[tuple[str, int, int]]] = []
    for rank in range(p):
        if schedule == "gpipe":
            ops = [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
        elif schedule == "1f1b":
            warmup = min(p - rank - 1, m)
            ops = [("F", i, 0) for i in range(warmup)]
            for k in range(m - warmup):
                ops += [("F", warmup + k, 0), ("B", k, 0)]
            ops += [("B", i, 0) for i in range(m - warmup, m)]
        else:
            total = m * v

            def unit(k: int, forward: bool) -> tuple[int, int]:
                group, within = divmod(k, p * v)
                chunk, slot = divmod(within, p)
                if not forward:
                    chunk = v - 1 - chunk
                return group * p + slot, chunk

            warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)
            ops = [("F", *unit(k, True)) for k in range(warmup)]
            for k in range(total - warmup):
                ops += [("F", *unit(warmup + k, True)), ("B", *unit(k, False))]
            ops += [("B", *unit(k, False)) for k in range(total - warmup, total)]
        order.append(ops)
    return order


# ----------------------------------------------------------------------------------- timeline


@dataclass(frozen=True)
class Op:
    """One unit of work on one rank: forward ('F') or backward ('B') of a microbatch's chunk."""

    rank: int
    kind: str
    microbatch: int
    chunk: int
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class Timeline:
    """What each rank did, when: ops (start/end in time units) for P ranks and m microbatches."""

    schedule: str
    p: int
    m: int
    v: int
    ops: list[Op] = field(default_factory=list)

    def rank_ops(self, rank: int) -> list[Op]:
        """The ops of one rank, by start time."""
        return sorted((o for o in self.ops if o.rank == rank), key=lambda o: o.start)

    @property
    def start(self) -> float:
        return min(o.start for o in self.ops)

    @property
    def makespan(self) -> float:
        """Time from the first op's start to the last op's end."""
        return max(o.end for o in self.ops) - self.start

    def busy(self, rank: int) -> float:
        """Time units rank spends computing."""
        return sum(o.duration for o in self.ops if o.rank == rank)

    def idle_fraction(self) -> float:
        """Share of the P x makespan rank-time spent idle (the measured bubble)."""
        total = self.p * self.makespan
        return 1.0 - sum(self.busy(r) for r in range(self.p)) / total

    def rank_idle_fractions(self) -> list[float]:
        """Idle share of the makespan, per rank."""
        return [1.0 - self.busy(r) / self.makespan for r in range(self.p)]

    def activations_in_flight(self, rank: int) -> float:
        """Peak microbatches whose activations rank holds (forward started, backward not done).

        Counted in whole-stage microbatches: with v chunks per rank, one chunk counts 1/v.
        """
        events = []
        for o in self.ops:
            if o.rank != rank:
                continue
            events.append((o.start, 1, o.kind == "F"))  # a forward starts holding activations
            events.append((o.end, 0, o.kind == "B"))     # a backward releases them at its end
        held, peak = 0, 0
        for _, is_start, counts in sorted(events):  # at equal times, releases come first
            if counts:
                held += 1 if is_start else -1
                peak = max(peak, held)
        return peak / self.v

    def peak_activations(self) -> list[float]:
        """activations_in_flight for every rank."""
        return [self.activations_in_flight(r) for r in range(self.p)]

    def check(self) -> None:
        """Raise AssertionError unless the timeline is consistent (no overlap; F before B; deps)."""
        for r in range(self.p):
            ops = self.rank_ops(r)
            for a, b in zip(ops, ops[1:]):
                assert a.end <= b.start + 1e-9, f"rank {r} runs {a} and {b} at once"
        done = {(o.kind, o.microbatch, o.chunk * self.p + o.rank): o for o in self.ops}
        stages = self.p * self.v
        assert len(done) == len(self.ops) == 2 * self.m * stages, "missing or duplicated ops"
        for (kind, mb, vs), o in done.items():
            if kind == "F" and vs > 0:
                assert done["F", mb, vs - 1].end <= o.start + 1e-9, f"{o} before its input"
            if kind == "B":
                assert done["F", mb, vs].end <= o.start + 1e-9, f"{o} before its forward"
                if vs < stages - 1:
                    assert done["B", mb, vs + 1].end <= o.start + 1e-9, f"{o} before its grad"


def simulate(schedule: str, p: int, m: int, *, v: int = 1,
             stage_times: Sequence[float] | None = None, forward_time: float = 1.0,
             backward_ratio: float = 1.0, comm_time: float = 0.0) -> Timeline:
    """Play a schedule op by op and return its Timeline.

    Each rank runs its ops in :func:`schedule_order`; an op starts when the rank is free and its
    inputs exist (forward: the previous stage's forward of that microbatch; backward: this
    stage's forward and the next stage's backward), plus ``comm_time`` when they cross ranks.
    ``stage_times[r]``: forward time of rank r's layers for one microbatch (default
    ``forward_time`` on every rank); a backward takes ``backward_ratio`` times its forward;
    with v chunks, each chunk takes 1/v of its rank's time.
    """
    _check_schedule(schedule, p, m, v)
    if stage_times is None:
        stage_times = [_check_pos_number("forward_time", forward_time)] * p
    else:
        if isinstance(stage_times, (str, bytes)) or len(stage_times) != p:
            raise ValueError(f"stage_times must be a sequence of p={p} positive numbers, "
                             f"got {stage_times!r}")
        stage_times = [_check_pos_number(f"stage_times[{i}]", t) for i, t in enumerate(stage_times)]
    _check_pos_number("backward_ratio", backward_ratio)
    _check_pos_number("comm_time", comm_time, allow_zero=True)

    order = schedule_order(schedule, p, m, v)
    stages = p * v
    finished: dict[tuple[str, int, int], tuple[float, int]] = {}  # (kind, mb, vstage) -> (end, rank)
    free = [0.0] * p
    next_op = [0] * p
    ops: list[Op] = []
    remaining = sum(len(o) for o in order)
    while remaining:
        progressed = False
        for rank in range(p):
            while next_op[rank] < len(order[rank]):
                kind, mb, chunk = order[rank][next_op[rank]]
                vs = chunk * p + rank
                deps = []
                if kind == "F" and vs > 0:
                    deps.append(("F", mb, vs - 1))
                if kind == "B":
                    deps.append(("F", mb, vs))
                    if vs < stages - 1:
                        deps.append(("B", mb, vs + 1))
                if any(d not in finished for d in deps):
                    break
                ready = free[rank]
                for d in deps:
                    end, dep_rank = finished[d]
                    ready = max(ready, end + (comm_time if dep_rank != rank else 0.0))
                duration = stage_times[rank] / v * (backward_ratio if kind == "B" else 1.0)
                op = Op(rank, kind, mb, chunk, ready, ready + duration)
                ops.append(op)
                finished[kind, mb, vs] = (op.end, rank)
                free[rank] = op.end
                next_op[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - every built-in order is deadlock-free
            raise RuntimeError(f"schedule {schedule!r} deadlocked at {next_op}")
    return Timeline(schedule, p, m, v, sorted(ops, key=lambda o: (o.rank, o.start)))


# ----------------------------------------------------------------------------------- drawing


def op_label(op: Op, v: int) -> str:
    """``F3`` / ``B3`` (``F3a`` / ``F3b`` with v chunks): how charts name an op."""
    return f"{op.kind}{op.microbatch}" + ("abcdefghijklmnopqrstuvwxyz"[op.chunk] if v > 1 else "")


def format_timeline(timeline: Timeline, unit: float | None = None) -> str:
    """Text Gantt chart: one row per rank, one column per ``unit`` of time ('.' = idle).

    F3 = forward of microbatch 3, B3 its backward; with v chunks a letter names the chunk
    (F3a = chunk 0, F3b = chunk 1). Default unit: the shortest op.
    """
    if not isinstance(timeline, Timeline):
        raise ValueError(f"timeline must be a Timeline, got {type(timeline).__name__}")
    unit = min(o.duration for o in timeline.ops) if unit is None else _check_pos_number("unit", unit)
    width = max(len(op_label(o, timeline.v)) for o in timeline.ops) + 1
    slots = round(timeline.makespan / unit)
    t0 = timeline.start
    lines = []
    for rank in range(timeline.p):
        cells = [".".ljust(width)] * slots
        for o in timeline.rank_ops(rank):
            a, b = round((o.start - t0) / unit), round((o.end - t0) / unit)
            for s in range(a, max(b, a + 1)):
                if s < slots:
                    cells[s] = op_label(o, timeline.v).ljust(width)
        lines.append(f"rank {rank} | " + "".join(cells).rstrip())
    return "\n".join(lines)


def _tint(color: str, amount: float) -> tuple[float, float, float]:
    """``color`` mixed with white (amount 0 = unchanged, 1 = white)."""
    from matplotlib.colors import to_rgb

    return tuple(c + (1.0 - c) * amount for c in to_rgb(color))


def op_color(kind: str, chunk: int, v: int) -> tuple[float, float, float]:
    """Forward and backward in the course's phase colours; a later chunk in a lighter shade."""
    from course_utils.style import PHASE_COLORS

    base = PHASE_COLORS["forward" if kind == "F" else "backward"]
    return _tint(base, 0.55 * chunk / max(v - 1, 1))


def legend_handles(v: int) -> list:
    """Legend patches naming :func:`op_color`'s colours (forward, backward; per chunk)."""
    from matplotlib.patches import Patch

    handles = []
    for kind, word in (("F", "forward"), ("B", "backward")):
        for chunk in range(v):
            name = word if v == 1 else f"{word}, chunk {'abcdefghijklmnopqrstuvwxyz'[chunk]}"
            handles.append(Patch(facecolor=op_color(kind, chunk, v), edgecolor="black",
                                 linewidth=0.5, label=name))
    return handles


def _fit_text_class() -> type:
    """A Text that, each time it is drawn, shows the longest of its candidate labels that fits
    inside its bar, and hides itself when none does (so labels never spill or overlap)."""
    from matplotlib.text import Text

    class _FitText(Text):
        def __init__(self, *args: Any, candidates: Sequence[str], span: tuple[float, float],
                     **kwargs: Any):
            super().__init__(*args, text=candidates[0], **kwargs)
            self._candidates, self._span = list(candidates), span

        def draw(self, renderer: Any) -> None:
            ax = self.axes
            (x0, _), (x1, _) = ax.transData.transform([(self._span[0], 0), (self._span[1], 0)])
            box = ax.get_window_extent(renderer)
            room = x1 - x0 - 4  # a little padding on each side
            show = None
            self.set_visible(True)  # a hidden Text measures as an empty box
            if box.x0 - 1 <= x0 and x1 <= box.x1 + 1:  # only bars wholly inside the axes
                for candidate in self._candidates:
                    if self.get_text() != candidate:
                        self.set_text(candidate)
                    if super().get_window_extent(renderer).width <= room:
                        show = candidate
                        break
            self.set_visible(show is not None)
            if show is not None:
                super().draw(renderer)

    return _FitText


def draw_timeline(timeline: Timeline, ax: Any = None, title: str | None = None, *,
                  tmax: float | None = None, legend: bool = True) -> Any:
    """Draw a Timeline as a Gantt chart: one row per rank, forward and backward ops in the
    course's phase colours (with v chunks, later chunks lighter), each op labelled F3 / B3
    (F3a / F3b for chunks) where the label fits, else by its microbatch number, else not at all.

    ``tmax``: end of the time axis (default: the makespan); give several charts the same value
    to compare them on one scale. ``legend``: name the colours to the right of the axes.
    """
    import matplotlib.pyplot as plt

    if not isinstance(timeline, Timeline):
        raise ValueError(f"timeline must be a Timeline, got {type(timeline).__name__}")
    tmax = timeline.makespan if tmax is None else _check_pos_number("tmax", tmax)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.6 * timeline.p + 1.4))
    fit_text = _fit_text_class()
    t0 = timeline.start
    for o in timeline.ops:
        face = op_color(o.kind, o.chunk, timeline.v)
        ax.broken_barh([(o.start - t0, o.duration)], (o.rank - 0.4, 0.8), facecolors=face,
                       edgecolor="black", linewidth=0.5)
        dark = 0.299 * face[0] + 0.587 * face[1] + 0.114 * face[2] < 0.55
        label = fit_text(o.start - t0 + o.duration / 2, o.rank,
                         candidates=[op_label(o, timeline.v), str(o.microbatch)],
                         span=(o.start - t0, o.end - t0), ha="center", va="center",
                         fontsize=9, color="white" if dark else "black", clip_on=True)
        ax.add_artist(label)
    ax.set_yticks(range(timeline.p))
    _ = ax.set_yticklabels([f"rank {r}" for r in range(timeline.p)])
    ax.set_ylim(timeline.p - 0.5, -0.5)
    ax.set_xlim(0, tmax)
    ax.set_xlabel("time (units of one balanced forward)")
    if title is None:
        from course_utils.style import label as words

        title = (f"{words(timeline.schedule)}: P={timeline.p}, m={timeline.m}"
                 + (f", v={timeline.v}" if timeline.v > 1 else "")
                 + f", idle {timeline.idle_fraction():.1%}")
    ax.set_title(title)
    if legend:
        ax.legend(handles=legend_handles(timeline.v), loc="upper left", frameon=False,
                  bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return ax

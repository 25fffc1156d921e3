"""Pipeline schedules: bubble formulas, batch accounting and a schedule simulator.

A pipeline splits a model's layers into P consecutive *stages*, one per rank, and feeds it m
*microbatches*. This module answers "how much of the time does each rank sit idle?" three ways:

* the idealized formula :func:`bubble_fraction` = (P - 1) / (m + P - 1) (balanced stages, no
  communication cost), and the ratio :func:`bubble_ratio` = (P - 1) / m that some sources quote;
* a simulator, :func:`simulate`, that plays a schedule (``"gpipe"``, ``"1f1b"``, ``"interleaved"``,
  and the zero-bubble schedules with the backward split in two, ``"zb-h1"``, ``"zbv"``,
  ``"dualpipev"``: :mod:`course_utils.pipeline.zero_bubble`) op by op and returns a
  :class:`Timeline` (who computes what, when), from which idle fraction and activations in
  flight are read off, and which :func:`format_timeline` prints (and
  :func:`course_utils.pipeline.pictures.draw_timeline` draws) as a Gantt chart;
* :mod:`course_utils.pipeline.runtime` measures it on real ranks.

Batch accounting lives here too: :func:`effective_batch` (tensor and pipeline parallelism do not
change it).

Time is in arbitrary units (one forward of one microbatch through a balanced stage = 1.0 by
default). Ranks and stages are numbered from 0; microbatches too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from course_utils.pipeline.zero_bubble import (SPLIT_SCHEDULES, V_SCHEDULES, overlapped_pairs,
                                               split_order)
from course_utils.runtime.validate import check_int, check_real, one_of

__all__ = ["bubble_fraction", "bubble_ratio", "ratio_to_fraction", "fraction_to_ratio",
           "interleaved_bubble_fraction", "min_microbatches", "effective_batch", "SCHEDULES",
           "Op", "Timeline", "schedule_order", "virtual_stage", "simulate", "format_timeline",
           "op_label"]

SCHEDULES = ("gpipe", "1f1b", "interleaved") + SPLIT_SCHEDULES


# ----------------------------------------------------------------------------------- formulas


def bubble_fraction(p: int, m: int) -> float:
    """Idle fraction (P-1)/(m+P-1) of a balanced pipeline with p stages and m microbatches."""
    check_int("p", p)
    check_int("m", m)
    return (p - 1) / (m + p - 1)


def bubble_ratio(p: int, m: int) -> float:
    """Bubble time over useful compute time, (P-1)/m (the form GPipe and Megatron papers quote)."""
    check_int("p", p)
    check_int("m", m)
    return (p - 1) / m


def ratio_to_fraction(ratio: float) -> float:
    """Convert bubble/compute ratio r to the idle fraction of total time: r / (1 + r)."""
    check_real("ratio", ratio, 0, strict=False)
    return ratio / (1.0 + ratio)


def fraction_to_ratio(fraction: float) -> float:
    """Convert an idle fraction f (0 <= f < 1) of total time to the bubble/compute ratio f/(1-f)."""
    check_real("fraction", fraction, 0, strict=False, maximum=1)
    return fraction / (1.0 - fraction)


def interleaved_bubble_fraction(p: int, m: int, v: int) -> float:
    """Idle fraction (P-1)/(v*m+P-1) of interleaved 1F1B with v model chunks per rank
    (Megatron-LM)."""
    check_int("p", p)
    check_int("m", m)
    check_int("v", v)
    return (p - 1) / (v * m + p - 1)


def min_microbatches(p: int, target: float) -> int:
    """Smallest m with bubble_fraction(p, m) <= target (0 < target < 1)."""
    check_int("p", p)
    check_real("target", target, 0, maximum=1)
    # (p-1)/(m+p-1) <= t  <=>  m >= (p-1)(1-t)/t ; then step past floating-point rounding
    m = max(1, math.ceil((p - 1) * (1 - target) / target - 1e-9))
    while m > 1 and bubble_fraction(p, m - 1) <= target:
        m -= 1
    while bubble_fraction(p, m) > target:
        m += 1
    return m


def effective_batch(microbatch_size: int, accumulation_steps: int, dp: int) -> int:
    """Examples per optimizer step: microbatch_size x accumulation_steps x dp (TP and PP do not
    count)."""
    check_int("microbatch_size", microbatch_size)
    check_int("accumulation_steps", accumulation_steps)
    check_int("dp", dp)
    return microbatch_size * accumulation_steps * dp


# ----------------------------------------------------------------------------------- schedules


def _check_schedule(schedule: Any, p: int, m: int, v: Any) -> int:
    """Check the arguments; return v (None: 2 for the V schedules, else 1)."""
    one_of("schedule", schedule, SCHEDULES)
    check_int("p", p)
    check_int("m", m)
    if v is None:
        v = 2 if schedule in V_SCHEDULES else 1
    check_int("v", v)
    if schedule in V_SCHEDULES and v != 2:
        raise ValueError(f"v (chunks per rank) must be 2 for schedule {schedule!r} (rank r holds "
                         f"stages r and 2p - 1 - r), got {v}")
    if schedule not in V_SCHEDULES and schedule != "interleaved" and v != 1:
        raise ValueError(f"v (chunks per rank) must be 1 for schedule {schedule!r}, got {v}; "
                         "use schedule='interleaved' for v > 1")
    if schedule == "interleaved" and m % p != 0:
        raise ValueError(f"m must be a multiple of p for the interleaved schedule "
                         f"(microbatches go round in groups of p), got m={m}, p={p}")
    return v


def virtual_stage(schedule: str, p: int, rank: int, chunk: int) -> int:
    """Which of the model's p*v stages chunk ``chunk`` of ``rank`` holds: c*P + r when
    interleaved, r and 2P - 1 - r in a V (zbv, dualpipev), r otherwise."""
    if schedule in V_SCHEDULES:
        return rank if chunk == 0 else 2 * p - 1 - rank
    return chunk * p + rank


def schedule_order(schedule: str, p: int, m: int,
                   v: int | None = None) -> list[list[tuple[str, int, int]]]:
    """Per-rank op order: ``order[rank]`` is a list of (kind, microbatch, chunk), kind one of
    'F' (forward), 'B' (the whole backward), 'I' (its input-gradient half), 'W' (its
    weight-gradient half).

    ``"gpipe"``: every forward, then every backward (microbatches in order).
    ``"1f1b"``: rank r runs min(P-r-1, m) warm-up forwards, then alternates one forward and one
    backward, then drains the remaining backwards (PipeDream-flush).
    ``"interleaved"``: each rank holds v chunks (chunk c of rank r is virtual stage c*P + r) and
    runs Megatron-LM's interleaved 1F1B order; m must be a multiple of p.
    ``"zb-h1"``, ``"zbv"``, ``"dualpipev"``: backward split into I and W
    (:mod:`course_utils.pipeline.zero_bubble`); zbv and dualpipev hold 2 chunks per rank in a V.
    """
    v = _check_schedule(schedule, p, m, v)
    if schedule in SPLIT_SCHEDULES:
        return [split_order(schedule, p, m, rank) for rank in range(p)]
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
    """One unit of work on one rank: 'F', 'B' (whole backward), 'I' or 'W' (its two halves) of
    a microbatch's chunk, from ``start`` to ``end``."""

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

    def span(self, rank: int) -> float:
        """Time from this rank's first op's start to its last op's end."""
        ops = [o for o in self.ops if o.rank == rank]
        return max(o.end for o in ops) - min(o.start for o in ops)

    def period(self, sync: bool = True) -> float:
        """Time per step when steps repeat: the makespan when every rank waits for the whole
        step to end before its optimizer step (``sync``, a global check such as the gradient
        norm); without that wait (post-validation), each rank starts its next step as soon as
        its own work is done, and the steps tile every max(span) units."""
        return self.makespan if sync else max(self.span(r) for r in range(self.p))

    def idle_fraction(self, sync: bool = True) -> float:
        """Share of the P x period rank-time spent idle (the bubble); see :meth:`period`."""
        total = self.p * self.period(sync)
        return 1.0 - sum(self.busy(r) for r in range(self.p)) / total

    def rank_idle_fractions(self, sync: bool = True) -> list[float]:
        """Idle share of the period, per rank."""
        period = self.period(sync)
        return [1.0 - self.busy(r) / period for r in range(self.p)]

    def activations_in_flight(self, rank: int) -> float:
        """Peak microbatches whose activations rank holds: from the start of a forward until
        the end of the backward that frees them, B or, when the backward is split, W (W needs
        the layer inputs the forward saved).

        Counted in whole-stage microbatches: with v chunks per rank, one chunk counts 1/v.
        """
        events = []
        for o in self.ops:
            if o.rank != rank:
                continue
            events.append((o.start, 1, o.kind == "F"))        # a forward starts holding
            events.append((o.end, 0, o.kind in ("B", "W")))   # B or W releases at its end
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
        """Raise AssertionError unless the timeline is consistent: no rank runs two ops at
        once; every (microbatch, stage) has one F and either one B or one I and one W; a
        forward follows the previous stage's, a backward (B or I) this stage's forward and the
        next stage's backward, a W its own I."""
        for r in range(self.p):
            ops = self.rank_ops(r)
            for a, b in zip(ops, ops[1:]):
                assert a.end <= b.start + 1e-9, f"rank {r} runs {a} and {b} at once"
        stages = self.p * self.v
        done: dict[tuple[str, int, int], Op] = {}
        for o in self.ops:
            key = (o.kind, o.microbatch, virtual_stage(self.schedule, self.p, o.rank, o.chunk))
            assert key not in done, f"{o} runs twice"
            done[key] = o
        for mb in range(self.m):
            for vs in range(stages):
                kinds = {k for k in "FBIW" if (k, mb, vs) in done}
                assert kinds in ({"F", "B"}, {"F", "I", "W"}), (
                    f"microbatch {mb} at stage {vs} has ops {sorted(kinds)}")
        assert len(done) == len(self.ops), "ops beyond the m microbatches"

        def grad(mb: int, vs: int) -> Op:  # the op that computes stage vs's input gradient
            return done.get(("I", mb, vs)) or done["B", mb, vs]

        for (kind, mb, vs), o in done.items():
            before = []
            if kind == "F" and vs > 0:
                before.append(done["F", mb, vs - 1])
            if kind in ("B", "I"):
                before.append(done["F", mb, vs])
                if vs < stages - 1:
                    before.append(grad(mb, vs + 1))
            if kind == "W":
                before.append(done["I", mb, vs])
            for dep in before:
                assert dep.end <= o.start + 1e-9, f"{o} starts before {dep} ends"


def simulate(schedule: str, p: int, m: int, *, v: int | None = None,
             stage_times: Sequence[float] | None = None, forward_time: float = 1.0,
             backward_ratio: float = 1.0, weight_share: float = 0.5,
             comm_time: float = 0.0, pair_time: float | None = None) -> Timeline:
    """Play a schedule op by op and return its Timeline.

    Each rank runs its ops in :func:`schedule_order`; an op starts when the rank is free and its
    inputs exist (forward: the previous stage's forward of that microbatch; backward, B or I:
    this stage's forward and the next stage's backward; W: its own I), plus ``comm_time`` when
    they cross ranks. ``stage_times[r]``: forward time of rank r's layers for one microbatch
    (default ``forward_time`` on every rank); a whole backward B takes ``backward_ratio`` times
    its forward, split into W = ``weight_share`` of it and I = the rest; with v chunks, each
    chunk takes 1/v of its rank's time. v: chunks per rank (default 2 for zbv and dualpipev,
    else 1).

    ``pair_time`` (dualpipev only): None runs each overlapped pair's forward and backward one
    after the other, each as soon as its input is there (torch's runtime); a number runs the
    pair as one unit, as DeepSeek's runtime does: it starts when both inputs are there, lasts
    ``pair_time`` x (F + B) (1: no overlap gain; the README's F&B), and both outputs leave at
    its end.
    """
    v = _check_schedule(schedule, p, m, v)
    if stage_times is None:
        stage_times = [check_real("forward_time", forward_time)] * p
    else:
        if isinstance(stage_times, (str, bytes)) or len(stage_times) != p:
            raise ValueError(f"stage_times must be a sequence of p={p} positive numbers, "
                             f"got {stage_times!r}")
        stage_times = [check_real(f"stage_times[{i}]", t) for i, t in enumerate(stage_times)]
    check_real("backward_ratio", backward_ratio)
    check_real("weight_share", weight_share, 0, maximum=1)  # W's part of the backward
    check_real("comm_time", comm_time, 0, strict=False)
    if pair_time is not None:
        if schedule != "dualpipev":
            raise ValueError(f"pair_time is for schedule 'dualpipev' (its overlapped pairs), "
                             f"got schedule {schedule!r}")
        check_real("pair_time", pair_time)
    scale = {"F": 1.0, "B": backward_ratio, "I": backward_ratio * (1 - weight_share),
             "W": backward_ratio * weight_share}

    order = schedule_order(schedule, p, m, v)
    paired = [set(overlapped_pairs(p, m, r)) if pair_time is not None else set()
              for r in range(p)]
    stages = p * v
    # (what, mb, vstage) -> (end, rank); what: "F", "grad" (B or I), "I"
    finished: dict[tuple[str, int, int], tuple[float, int]] = {}
    free = [0.0] * p
    next_op = [0] * p
    ops: list[Op] = []
    remaining = sum(len(o) for o in order)

    def needs(rank: int, kind: str, mb: int, vs: int) -> list[tuple[str, int, int]]:
        if kind == "F":
            return [("F", mb, vs - 1)] if vs > 0 else []
        if kind == "W":
            return [("I", mb, vs)]
        return [("F", mb, vs)] + ([("grad", mb, vs + 1)] if vs < stages - 1 else [])

    def ready_at(rank: int, deps: list) -> float:
        ready = free[rank]
        for d in deps:
            end, dep_rank = finished[d]
            ready = max(ready, end + (comm_time if dep_rank != rank else 0.0))
        return ready

    def record(op: Op, vs: int, end: float) -> None:
        ops.append(op)
        for what in {"F": ["F"], "B": ["grad"], "I": ["grad", "I"], "W": []}[op.kind]:
            finished[what, op.microbatch, vs] = (end, op.rank)

    while remaining:
        progressed = False
        for rank in range(p):
            while next_op[rank] < len(order[rank]):
                k = next_op[rank]
                group = order[rank][k:k + 2] if k in paired[rank] else order[rank][k:k + 1]
                stages_of = [virtual_stage(schedule, p, rank, c) for _, _, c in group]
                deps = [d for (kind, mb, _), vs in zip(group, stages_of)
                        for d in needs(rank, kind, mb, vs)]
                if any(d not in finished for d in deps):
                    break
                start = ready_at(rank, deps)
                lengths = [stage_times[rank] / v * scale[kind] for kind, _, _ in group]
                if len(group) == 2:  # an overlapped pair: one unit, both outputs at its end
                    lengths = [t * pair_time for t in lengths]
                end = start + sum(lengths)
                t = start
                for (kind, mb, chunk), vs, length in zip(group, stages_of, lengths):
                    record(Op(rank, kind, mb, chunk, t, t + length), vs,
                           end if len(group) == 2 else t + length)
                    t += length
                free[rank] = end
                next_op[rank] += len(group)
                remaining -= len(group)
                progressed = True
        if not progressed:  # pragma: no cover - every built-in order is deadlock-free
            raise RuntimeError(f"schedule {schedule!r} deadlocked at {next_op}")
    return Timeline(schedule, p, m, v, sorted(ops, key=lambda o: (o.rank, o.start)))


def format_timeline(timeline: Timeline, unit: float | None = None) -> str:
    """Text Gantt chart: one row per rank, one column per ``unit`` of time ('.' = idle).

    F3 = forward of microbatch 3, B3 its backward (I3 and W3 its two halves); with v chunks a
    letter names the chunk (F3a = chunk 0, F3b = chunk 1). Default unit: the shortest op.
    """
    if not isinstance(timeline, Timeline):
        raise ValueError(f"timeline must be a Timeline, got {type(timeline).__name__}")
    unit = min(o.duration for o in timeline.ops) if unit is None else check_real("unit", unit)
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


def op_label(op: Op, v: int) -> str:
    """``F3`` / ``B3`` / ``I3`` / ``W3`` (``F3a`` / ``F3b`` with v chunks): how charts name an
    op."""
    return f"{op.kind}{op.microbatch}" + ("abcdefghijklmnopqrstuvwxyz"[op.chunk] if v > 1 else "")

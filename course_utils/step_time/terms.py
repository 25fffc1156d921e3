"""One step's time, term by term, from its parts: what every prediction of lecture 13 returns.

A rank's step is its pipeline schedule played out (compute and tensor-parallel collectives inside
each microbatch's forward and backward, the bubble and the point-to-point sends between stages:
:func:`course_utils.pipeline.schedule.simulate`), then the data-parallel collectives that do not
hide behind compute, then the optimizer. :func:`assemble` builds :class:`StepTerms` from those
parts; every term is in seconds and the terms add up to the step:

    total = compute + tp + bubble + dp_exposed + optimizer

``dp_hidden`` is the data-parallel time that overlaps compute: shown, never added (adding it is
counting overlapped communication twice).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from course_utils.pipeline.schedule import simulate
from course_utils.runtime import validate

__all__ = ["TERMS", "WORDS", "StepTerms", "assemble", "format_terms"]

TERMS = ("compute", "tp", "bubble", "dp_exposed", "optimizer")
"""The terms that add up to the step, in the order a step meets them."""

WORDS = {"compute": "compute (matmuls at the achieved rate)",
         "tp": "TP/CP collectives (inside each microbatch, not overlapped)",
         "bubble": "pipeline bubble and stage-to-stage sends",
         "dp_exposed": "DP/FSDP collectives not hidden by compute",
         "optimizer": "optimizer step (memory-bound)"}


@dataclass(frozen=True)
class StepTerms:
    """Seconds of one step on the slowest rank, by term (:data:`TERMS` add up to ``total``)."""

    compute: float
    tp: float
    bubble: float
    dp_exposed: float
    optimizer: float
    dp_hidden: float = 0.0

    @property
    def total(self) -> float:
        return sum(getattr(self, t) for t in TERMS)

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


def assemble(*, pp: int, m: int, forward_s: float, backward_s: float, tp_forward_s: float = 0.0,
             tp_backward_s: float = 0.0, p2p_s: float = 0.0, schedule: str = "1f1b",
             v: int | None = None, dp: tuple[tuple[float, float], ...] = (),
             optimizer_s: float = 0.0) -> StepTerms:
    """Put a step together (seconds; per microbatch and per rank for the first five).

    ``forward_s``/``backward_s``: one microbatch's compute through the rank's whole stage (all
    its chunks); ``tp_*_s``: that microbatch's tensor- (and context-) parallel collectives,
    which run between its matmuls and add to them; ``p2p_s``: one activation's send to the next
    stage. The schedule is played out with those times (:func:`simulate`; the stages are
    assumed equal) and the bubble is what the slowest rank does not spend computing or in TP.
    ``dp``: the step's data-parallel collectives as ``(seconds, window)`` pairs, the window
    being the compute each can hide behind (a gradient reduce-scatter behind the last
    microbatch's backward, as module 9's buckets do; a prefetched all-gather behind the first
    forward; 0 for one that waits, such as ZeRO-1's all-gather after the optimizer): each adds
    ``max(0, seconds - window)`` to the step.
    """
    validate.check_int("pp", pp)
    validate.check_int("m", m)
    for name, value in (("forward_s", forward_s), ("backward_s", backward_s)):
        validate.check_real(name, value)
    for name, value in (("tp_forward_s", tp_forward_s), ("tp_backward_s", tp_backward_s),
                        ("p2p_s", p2p_s), ("optimizer_s", optimizer_s)):
        validate.check_real(name, value, 0, strict=False)
    pairs = [(validate.check_real(f"dp[{i}] seconds", s, 0, strict=False),
              validate.check_real(f"dp[{i}] window", w, 0, strict=False))
             for i, (s, w) in enumerate(dp)]
    f, b = forward_s + tp_forward_s, backward_s + tp_backward_s
    if pp == 1:
        span = m * (f + b)
    else:
        # one time unit = one microbatch's forward through the stage; comm in the same unit
        timeline = simulate(schedule, pp, m, v=v, forward_time=1.0, backward_ratio=b / f,
                            comm_time=p2p_s / f)
        span = timeline.makespan * f
    compute = m * (forward_s + backward_s)
    tp = m * (tp_forward_s + tp_backward_s)
    exposed = sum(max(0.0, s - w) for s, w in pairs)
    bubble = max(0.0, span - compute - tp) if pp > 1 else 0.0   # (not a rounding's 1e-14)
    return StepTerms(compute=compute, tp=tp, bubble=bubble,
                     dp_exposed=exposed, optimizer=optimizer_s,
                     dp_hidden=sum(s for s, _ in pairs) - exposed)


def format_terms(terms: StepTerms, unit: str = "ms") -> str:
    """The terms, one a line, with their share of the step."""
    scale = validate.one_of("unit", unit, {"s": 1.0, "ms": 1e3})
    total = terms.total
    lines = [f"{WORDS[t]:<58}{getattr(terms, t) * scale:>10.2f} {unit} "
             f"{100 * getattr(terms, t) / total:>5.1f} %" for t in TERMS]
    lines.append(f"{'step':<58}{total * scale:>10.2f} {unit}")
    if terms.dp_hidden:
        lines.append(f"{'(DP time hidden behind compute, not added)':<58}"
                     f"{terms.dp_hidden * scale:>10.2f} {unit}")
    return "\n".join(lines)

"""F, I and W of a transformer layer: counted, measured, and what unequal times do to a bubble.

Lecture 5's zero-bubble schedules take the forward (F), the input gradient (I) and the weight
gradient (W) of a stage to cost the same, the model Qi et al. (2023) start from
(:mod:`course_utils.pipeline.backward_split`). For one linear layer that holds: F, I and W are
each one matmul of 2 n d_in d_out floating-point operations (``backward_split.matmul_flops``). A
transformer layer also multiplies activations by activations: the attention scores q k^T and
their product with v, 2 s^2 h each for a sequence of s tokens of width h. They have no weights,
so they add to F (two products) and to I (four: the gradients of q, k, v and of the scores) and
nothing to W. The longer the sequence against the width, the further I > F > W.

* :class:`Layer`: a pre-norm layer (LayerNorm, attention, LayerNorm, a GELU MLP, no biases),
  attention written out as matmuls (``torch.utils.flop_counter`` has no formula for the CPU
  kernel of ``scaled_dot_product_attention``, so written out every product is counted);
* :func:`layer_flops`: F, I and W of it, counted by hand (matmuls only, 2 m n k each);
* :func:`measure_fiw`: their wall times on this CPU, one thread, I and W as torch runs them
  (``stage_backward_input`` and ``stage_backward_weight`` in
  ``torch/distributed/pipelining/_backward.py``);
* :func:`schedule_idle` and :func:`compare_table`: a schedule's idle share simulated with those
  times (:func:`course_utils.pipeline.schedule.simulate`) beside F = I = W and the papers'
  formulas (:func:`course_utils.pipeline.zero_bubble.paper_bubble_fraction`).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Mapping

import torch
from torch import nn

from course_utils.pipeline import schedule as ps
from course_utils.pipeline import zero_bubble as zb
from course_utils.models.toy import seeded
from course_utils.runtime.validate import check_bool, check_int, check_real, one_of

__all__ = ["Layer", "layer_flops", "measure_fiw", "SCHEDULES", "schedule_idle", "compare_rows",
           "compare_table"]

SCHEDULES = {"1f1b": "F, then the whole backward B = I + W",
             "zb-h1": "1F1B's order, each W held back (Qi et al. section 2.1)",
             "zbv": "two chunks per rank in a V, torch's ScheduleZBVZeroBubble",
             "dualpipev": "DualPipe on a V, torch's ScheduleDualPipeV"}


def _sizes(hidden: Any, seq: Any, heads: Any, batch: Any, ffn: Any,
           attention: Any) -> tuple[int, int, int, int, int]:
    check_int("hidden", hidden)
    check_int("seq", seq)
    check_int("heads", heads)
    check_int("batch", batch)
    ffn = 4 * hidden if ffn is None else check_int("ffn", ffn)
    if hidden % heads:
        raise ValueError(f"heads must divide hidden = {hidden}; got {heads}")
    check_bool("attention", attention)
    return hidden, seq, heads, batch, ffn


class Layer(nn.Module):
    """x + attn(norm(x)), then + mlp(norm(.)); ``attention=False`` keeps the MLP half only."""

    def __init__(self, hidden: int, heads: int, ffn: int | None = None,
                 attention: bool = True) -> None:
        super().__init__()
        hidden, _, heads, _, ffn = _sizes(hidden, 1, heads, 1, ffn, attention)
        self.heads, self.attention = heads, attention
        if attention:
            self.norm1 = nn.LayerNorm(hidden)
            self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
            self.out = nn.Linear(hidden, hidden, bias=False)
        self.norm2 = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.attention:
            b, s, h = x.shape
            q, k, v = (z.view(b, s, self.heads, -1).transpose(1, 2)
                       for z in self.qkv(self.norm1(x)).chunk(3, dim=-1))
            scores = (q @ k.transpose(-2, -1)) * (h // self.heads) ** -0.5  # 2 s^2 h per seq
            a = torch.softmax(scores, dim=-1) @ v                            # 2 s^2 h again
            x = x + self.out(a.transpose(1, 2).reshape(b, s, h))
        return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))


def layer_flops(hidden: int, seq: int, heads: int = 1, batch: int = 1, ffn: int | None = None,
                attention: bool = True) -> dict[str, int]:
    """Matmul FLOPs of :class:`Layer`'s F, I and W (2 m n k a product; norms, softmax, GELU
    and the scale left out).

    Weights (qkv 3h^2, out h^2, MLP 2 h ffn): each gives F, I and W one product, 2 n h_in h_out
    for n = batch x seq tokens. Attention, per sequence and summed over heads: F computes
    q k^T and P v (2 s^2 h each); I computes the four gradients of those two products (of q,
    k, P and v: 2 s^2 h each); W has none. ``attention=False``: F = I = W.
    """
    hidden, seq, heads, batch, ffn = _sizes(hidden, seq, heads, batch, ffn, attention)
    tokens = batch * seq
    weights = 2 * tokens * (hidden * ffn * 2 + (4 * hidden * hidden if attention else 0))
    product = 2 * batch * seq * seq * hidden if attention else 0  # one s x s product, all heads
    return {"F": weights + 2 * product, "I": weights + 4 * product, "W": weights}


def measure_fiw(hidden: int = 256, seq: int = 512, heads: int = 4, batch: int = 1,
                repeats: int = 7, *, ffn: int | None = None, attention: bool = True,
                warmup: int = 2, seed: int = 0) -> dict[str, Any]:
    """Median wall time (s) of F, I and W of one :class:`Layer` on this CPU, on one thread.

    Each repeat runs the forward with autograd recording (F), then torch's own split backward:
    ``stage_backward_input`` (I: ``torch.autograd.grad`` for the layer's input alone, the graph
    kept, the gradients reaching the weights' products saved, plus a walk of the graph to find
    them) and ``stage_backward_weight`` (W: from those saved gradients to the weights), as
    :func:`course_utils.pipeline.zero_bubble.held_for_w` runs I. ``warmup`` repeats go first,
    untimed; torch's thread count is set to 1 and restored. Returns ``"F"``, ``"I"``, ``"W"``
    (seconds), ``"flops"`` (:func:`layer_flops`) and the sizes.
    """
    from torch.distributed.pipelining._backward import (stage_backward_input,
                                                        stage_backward_weight)

    hidden, seq, heads, batch, ffn = _sizes(hidden, seq, heads, batch, ffn, attention)
    check_int("repeats", repeats)
    check_int("warmup", warmup, minimum=0)
    gen = torch.Generator().manual_seed(check_int("seed", seed, minimum=0))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with seeded(seed):
            layer = Layer(hidden, heads, ffn, attention)
        x = torch.randn(batch, seq, hidden, generator=gen)
        grad = torch.randn(batch, seq, hidden, generator=gen)
        times: dict[str, list[float]] = {"F": [], "I": [], "W": []}
        for k in range(warmup + repeats):
            layer.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_(True)
            t0 = time.perf_counter()
            y = layer(xi)
            t1 = time.perf_counter()
            _, groups = stage_backward_input([y], [grad], [xi], layer.parameters())
            t2 = time.perf_counter()
            stage_backward_weight(layer.parameters(), groups)
            t3 = time.perf_counter()
            if k >= warmup:
                for name, dt in (("F", t1 - t0), ("I", t2 - t1), ("W", t3 - t2)):
                    times[name].append(dt)
    finally:
        torch.set_num_threads(threads)
    return {**{name: statistics.median(ts) for name, ts in times.items()},
            "flops": layer_flops(hidden, seq, heads, batch, ffn, attention),
            "hidden": hidden, "seq": seq, "heads": heads, "batch": batch, "ffn": ffn,
            "attention": attention, "repeats": repeats}


def schedule_idle(schedule: str, p: int, m: int, f: float, i: float, w: float,
                  sync: bool = False) -> float:
    """Idle share of ``schedule`` (:data:`SCHEDULES`) on ``p`` ranks, ``m`` microbatches, one
    stage's F, I, W taking ``f``, ``i``, ``w`` (any unit), simulated.

    :func:`course_utils.pipeline.schedule.simulate` with ``forward_time=f``,
    ``backward_ratio=(i + w) / f`` and ``weight_share=w / (i + w)`` (1F1B's B is then i + w), as
    ``tests/test_zero_bubble.py`` runs it; dualpipev as torch runs it (a pair's halves one after
    the other). ``sync=False``: without the optimizer's global check, each rank's next step
    starting when its own work ends (``Timeline.period``), the share the papers' bubble formulas
    give; ``sync=True``: every rank waits for the step's end (zbv at P = 4, m = 8, F = I = W:
    5.9 % instead of 0, ``test_lecture_5s_stated_figures``).
    """
    one_of("schedule", schedule, SCHEDULES)
    check_int("p", p)
    check_int("m", m)
    f, i, w = check_real("f", f), check_real("i", i), check_real("w", w)
    check_bool("sync", sync)
    timeline = ps.simulate(schedule, p, m, forward_time=f, backward_ratio=(i + w) / f,
                           weight_share=w / (i + w))
    return timeline.idle_fraction(sync)


def _fiw(times: Any) -> tuple[float, float, float]:
    if not isinstance(times, Mapping) or not all(k in times for k in "FIW"):
        raise ValueError("times must be a mapping with keys 'F', 'I', 'W' (as measure_fiw "
                         f"returns); got {times!r}")
    f, i, w = (check_real(f"times[{k!r}]", times[k]) for k in "FIW")
    return 1.0, i / f, w / f


def _paper(schedule: str, p: int, m: int, f: float, i: float, w: float) -> float | None:
    try:
        return zb.paper_bubble_fraction(schedule, p, m, f, i, w)
    except ValueError:  # zbv at unequal times, or m below the formula's bound
        return None


def compare_rows(times: Mapping[str, float], p: int = 4, m: int = 8,
                 sync: bool = False) -> list[dict[str, Any]]:
    """Per schedule: idle share simulated at F = I = W (``"equal"``) and at ``times``
    normalised to F = 1 (``"measured"``), and the papers' formula at each (``"paper_equal"``,
    ``"paper_measured"``: None where
    :func:`~course_utils.pipeline.zero_bubble.paper_bubble_fraction` gives none: zbv at unequal
    times, m below the bound)."""
    f, i, w = _fiw(times)
    return [{"schedule": s,
             "equal": schedule_idle(s, p, m, 1.0, 1.0, 1.0, sync),
             "measured": schedule_idle(s, p, m, f, i, w, sync),
             "paper_equal": _paper(s, p, m, 1.0, 1.0, 1.0),
             "paper_measured": _paper(s, p, m, f, i, w)} for s in SCHEDULES]


def compare_table(times: Mapping[str, float], p: int = 4, m: int = 8, sync: bool = False,
                  label: str = "measured") -> str:
    """:func:`compare_rows` as text, a row per schedule; ``label`` names ``times`` in the
    header (``"measured"``, or ``"FLOPs"`` for :func:`layer_flops`)."""
    _, i, w = _fiw(times)
    rows = compare_rows(times, p, m, sync)
    if not isinstance(label, str) or not 0 < len(label) <= 9:
        raise ValueError(f"label must be a str of 1 to 9 characters; got {label!r}")

    def pct(x: float | None) -> str:
        return f"{'-' if x is None else f'{x:.1%}':>9s}"

    head = (f"P={p} m={m}, idle share {'with' if sync else 'without'} the global check; "
            f"{label} F:I:W = {1 / w:.2f} : {i / w:.2f} : 1\n"
            f"{'schedule':<11s}{'F=I=W':>9s}{label:>9s}   paper: {'F=I=W':>9s}"
            f"{label:>9s}")
    lines = [f"{r['schedule']:<11s}{pct(r['equal'])}{pct(r['measured'])}          "
             f"{pct(r['paper_equal'])}{pct(r['paper_measured'])}" for r in rows]
    note = ("zbv: no formula at unequal times. dualpipev: the formula counts DeepSeek's "
            "overlapped pairs; the simulation runs torch's halves one after the other.")
    return "\n".join([head, *lines, note])

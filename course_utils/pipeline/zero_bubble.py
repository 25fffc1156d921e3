"""Zero-bubble pipeline schedules: the backward split in two, the op orders, the papers' formulas.

A stage's backward pass does two jobs. The gradient with respect to the stage's *input* (op
``I``) is what the previous stage waits for; the gradient with respect to the stage's *weights*
(op ``W``) nobody else needs before the optimizer step. Zero-bubble schedules run ``I`` at once
and move ``W`` into slots that would otherwise be idle (Qi et al., 2023, "Zero Bubble Pipeline
Parallelism", arXiv 2401.10241). Letters as ``torch.distributed.pipelining`` names its actions
(``_ComputationType`` in ``schedules.py``): ``F`` forward, ``I`` input gradient (the paper's
"B"), ``W`` weight gradient, ``B`` the full backward (I and W together, as 1F1B runs it and as
DeepSeek-V3's formulas count it).

Op orders, per rank a list of ``(kind, microbatch, chunk)`` as
:func:`course_utils.pipeline.schedule.simulate` plays them:

* ``"zb-h1"``: 1F1B's order with I in place of B, each W held back until the rank has P
  microbatches in flight (Qi et al. section 2.1): rank 0's peak is 1F1B's, and every other
  rank holds as many.
* ``"zbv"``: two chunks per rank in a V (rank r holds stages r and 2P - 1 - r), torch's
  ``ScheduleZBVZeroBubble`` (Qi et al. section 6).
* ``"dualpipev"``: DeepSeek's DualPipe cut in half onto the same V, torch's
  ``ScheduleDualPipeV``. In its steady phase a rank runs a forward of one chunk and a whole
  backward of the other as one overlapped pair (:func:`overlapped_pairs`): DeepSeek's runtime
  starts a pair when both inputs are there and overlaps the two (their F&B); torch runs the two
  halves one after the other unless a custom overlap function is registered.

:func:`paper_bubble` and :func:`paper_peak_activations` are the papers' formulas, written out
so the simulator can be checked against them (``tests/test_zero_bubble.py``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from course_utils.runtime.validate import check_index, check_int, check_real, one_of

__all__ = ["SPLIT_SCHEDULES", "V_SCHEDULES", "split_order", "overlapped_pairs", "paper_bubble",
           "min_microbatches", "paper_bubble_fraction", "paper_peak_activations", "held_for_w"]

SPLIT_SCHEDULES = ("zb-h1", "zbv", "dualpipev")
V_SCHEDULES = ("zbv", "dualpipev")  # two chunks per rank, placed in a V

Order = list[tuple[str, int, int]]


def _check(schedule: Any, p: Any, m: Any, rank: Any) -> None:
    one_of("schedule", schedule, SPLIT_SCHEDULES)
    check_int("p", p)
    check_int("m", m)
    check_index("rank", rank, p)
    if schedule == "dualpipev" and m < 2 * p:
        raise ValueError(f"m must be at least 2p = {2 * p} (one microbatch per stage) for "
                         f"dualpipev, as torch's ScheduleDualPipeV requires; got m={m}")


def split_order(schedule: str, p: int, m: int, rank: int) -> Order:
    """Rank ``rank``'s ops for a B/W-split schedule (see the module docstring)."""
    _check(schedule, p, m, rank)
    if schedule == "dualpipev":
        return _dualpipev(p, m, rank)[0]
    return {"zb-h1": _zb_h1, "zbv": _zbv}[schedule](p, m, rank)


def overlapped_pairs(p: int, m: int, rank: int) -> list[int]:
    """Positions k in rank's dualpipev order whose ops k and k + 1 (a forward of one chunk, a
    whole backward of the other) DualPipe runs as one overlapped pair."""
    _check("dualpipev", p, m, rank)
    return _dualpipev(p, m, rank)[1]


def _zb_h1(p: int, m: int, rank: int) -> Order:
    """1F1B with I for B; a W whenever P microbatches are in flight, the rest at the end."""
    warmup = min(p - rank - 1, m)
    ops: Order = [("F", i, 0) for i in range(warmup)]
    nf, nw = warmup, 0
    for k in range(m):
        if nf < m:
            ops.append(("F", nf, 0))
            nf += 1
        ops.append(("I", k, 0))
        if nf - nw >= p or nf == m:  # memory full, or the forwards are done: W fills the wait
            ops.append(("W", nw, 0))
            nw += 1
    return ops + [("W", i, 0) for i in range(nw, m)]


def _zbv(p: int, m: int, rank: int) -> Order:
    """torch's ScheduleZBVZeroBubble order: chunk 0 is stage r, chunk 1 stage 2P - 1 - r."""
    n = max(2 * p - 1, m)  # as torch: the pattern for at least 2P - 1, extra microbatches dropped
    count: dict[tuple[str, int], int] = defaultdict(int)
    ops: Order = []

    def add(kind: str, chunk: int) -> None:
        ops.append((kind, count[kind, chunk], chunk))
        count[kind, chunk] += 1

    for _ in range(2 * (p - rank) - 1):
        add("F", 0)
    for _ in range(rank):
        add("F", 1)
        add("F", 0)
    for _ in range(p - rank):
        add("F", 1)
        add("I", 1)
        add("W", 1)
    while count["F", 1] < count["F", 0] or count["F", 0] < n:  # steady: one of each per chunk
        if count["F", 0] < n:
            add("F", 0)
        for kind, chunk in (("I", 0), ("W", 0), ("F", 1), ("I", 1), ("W", 1)):
            add(kind, chunk)
    for _ in range(rank):
        add("I", 0)
        add("I", 1)
    for _ in range(p - rank):
        add("I", 0)
        add("W", 0)
    for chunk in (1, 0):
        while count["W", chunk] < count["I", chunk]:
            add("W", chunk)
    return [op for op in ops if op[1] < m]


def _dualpipev(p: int, m: int, rank: int) -> tuple[Order, list[int]]:
    """torch's ScheduleDualPipeV order (DeepSeek's DualPipe cut in half onto a V), and where
    its overlapped pairs start."""
    count: dict[tuple[str, int], int] = defaultdict(int)
    pending_w: list[tuple[int, int]] = []  # (chunk, microbatch) whose I ran and whose W waits
    ops: Order = []
    pairs: list[int] = []

    def add(kind: str, chunk: int) -> None:
        mb = count["I" if kind == "B" else kind, chunk]
        ops.append((kind, mb, chunk))
        if kind == "B":  # a whole backward counts as both halves
            count["I", chunk] += 1
            count["W", chunk] += 1
        else:
            count[kind, chunk] += 1
            if kind == "I":
                pending_w.append((chunk, mb))

    def add_pair(forward_chunk: int) -> None:  # F of one chunk overlapped with B of the other
        pairs.append(len(ops))
        add("F", forward_chunk)
        add("B", 1 - forward_chunk)

    def add_w() -> None:
        if pending_w:
            chunk, mb = pending_w.pop(0)
            ops.append(("W", mb, chunk))
            count["W", chunk] += 1

    for _ in range(2 * (p - rank - 1)):  # 1: forwards down the V
        add("F", 0)
    for _ in range(rank + 1):  # 2: both chunks' forwards
        add("F", 0)
        add("F", 1)
    for _ in range(p - rank - 1):  # 3: I, W, F on the way back up
        add("I", 1)
        add_w()
        add("F", 1)
    for i in range(m - 2 * p + rank + 1):  # 4: the steady phase, two overlapped pairs
        if i == 0 and rank == p - 1:  # torch: not overlapped, for a smaller bubble
            add("F", 0)
            add("B", 1)
        else:
            add_pair(0)
        add_pair(1)
    for _ in range(p - rank - 1):  # 5
        add("B", 1)
        add_pair(1)
    split = False  # 6: from the middle on, I and W apart
    for i in range(rank + 1):
        if i == (rank + 1) // 2 and rank % 2 == 1:
            split = True
        add("I" if split else "B", 1)
        if i == (rank + 1) // 2 and rank % 2 == 0:
            split = True
        add("I" if split else "B", 0)
    for _ in range(p - rank - 1):  # 7
        add_w()
        add("I" if split else "B", 0)
    for _ in range(rank + 1):  # 8: the weight gradients left
        add_w()
    return ops, pairs


# ----------------------------------------------------------------------------------- formulas


def _times(f: Any, i: Any, w: Any) -> tuple[float, float, float]:
    return check_real("f", f), check_real("i", i), check_real("w", w)


def paper_bubble(schedule: str, p: int, f: float, i: float, w: float) -> float:
    """Idle time per rank in one step, as the papers give it; f, i, w: one stage's F, I, W times.

    * ``"1f1b"``: (P-1)(T_F + T_B + T_W), Qi et al. Table 2 (their T_B is our i);
    * ``"zb-h1"``: (P-1)(T_F + T_B - T_W), Qi et al. Table 2;
    * ``"zbv"``: 0 when F = I = W (Qi et al. section 6; torch's ScheduleZBVZeroBubble
      docstring) and m >= 2P - 1 (:func:`min_microbatches`): no formula for other times, so
      ValueError;
    * ``"dualpipev"``: (PP/2 - 1)(F&B + B - 3W) over PP = 2P chunks, DualPipe's README (B the
      full backward), with a chunk's times f/2, (i+w)/2, w/2 and F&B = F + B (no overlap).
    """
    check_int("p", p)
    f, i, w = _times(f, i, w)
    if schedule == "1f1b":
        return (p - 1) * (f + i + w)
    if schedule == "zb-h1":
        return (p - 1) * (f + i - w)
    if schedule == "zbv":
        if not f == i == w:
            raise ValueError("the paper gives ZB-V's bubble only for f == i == w (zero); "
                             f"got f={f:g}, i={i:g}, w={w:g}: simulate it instead")
        return 0.0
    if schedule == "dualpipev":
        stages = 2 * p  # the README's PP: chunks, two per rank
        cf, cb, cw = f / 2, (i + w) / 2, w / 2  # one chunk's F, whole backward B and W
        return (stages / 2 - 1) * ((cf + cb) + cb - 3 * cw)
    raise ValueError(f"schedule must be one of ['1f1b', 'zb-h1', 'zbv', 'dualpipev'], "
                     f"got {schedule!r}")


def min_microbatches(schedule: str, p: int) -> int:
    """The fewest microbatches for which :func:`paper_bubble` holds on ``p`` ranks.

    * ``"1f1b"``: 1 (its bubble is (P-1)(F+B) for any m);
    * ``"zb-h1"``: P (fewer leave too few W's to fill the wait);
    * ``"zbv"``: 2P - 1. Torch's ``ScheduleZBVZeroBubble`` plans ``max(2P - 1, m)``
      microbatches and leaves the missing ones' slots empty
      (``_calculate_single_rank_operations`` in ``pipelining/schedules.py``); the simulator's
      bubble at F = I = W is then 2P - 1 - m forward times per rank;
    * ``"dualpipev"``: 2P (torch's ``ScheduleDualPipeV`` refuses fewer).
    """
    check_int("p", p)
    return one_of("schedule", schedule,
                  {"1f1b": 1, "zb-h1": p, "zbv": 2 * p - 1, "dualpipev": 2 * p})


def paper_bubble_fraction(schedule: str, p: int, m: int, f: float, i: float, w: float) -> float:
    """The idle share of a step: bubble / (bubble + m (f + i + w)), every rank doing m
    microbatches' worth of work; ValueError below :func:`min_microbatches`."""
    check_int("m", m)
    if m < min_microbatches(schedule, p):
        raise ValueError(f"the paper's bubble for {schedule} holds for m >= "
                         f"{min_microbatches(schedule, p)} on p={p} ranks; got m={m}: "
                         "simulate it instead")
    bubble = paper_bubble(schedule, p, f, i, w)
    f, i, w = _times(f, i, w)
    return bubble / (bubble + m * (f + i + w))


def paper_peak_activations(schedule: str, p: int) -> float:
    """Peak microbatches of activations a rank holds (rank 0, the most), in whole-rank units.

    1F1B and ZB-H1: P (Qi et al. Table 2: pM_B); ZB-V: P (section 6: as 1F1B); DualPipeV:
    PP + 1 = 2P + 1 chunks (DualPipe's README), a chunk being half a rank.
    """
    check_int("p", p)
    peaks = {"1f1b": p, "zb-h1": p, "zbv": p, "dualpipev": (2 * p + 1) / 2}
    return float(one_of("schedule", schedule, peaks))


def held_for_w(block: Any, x: Any) -> dict[str, int]:
    """What a deferred W keeps of one layer's forward, measured (bytes).

    ``W`` of a linear ``y = x A`` computes ``dA = x^T dy``: it needs the linear's input ``x``
    (saved in forward) and the gradient of its output ``dy`` (made by ``I``), nothing else of
    the layer. Runs ``block(x)`` once and returns ``"saved"``, every tensor autograd saves for
    backward (``activations.saved_bytes``: parameters left out, each storage once);
    ``"inputs"``, the distinct inputs of the block's ``nn.Linear`` layers; ``"output_grads"``,
    their outputs' size (the ``dy`` that wait with them); and ``"torch_after_i"``, what of
    ``"saved"`` is still alive after torch's own I (``stage_backward_input`` in
    ``torch/distributed/pipelining/_backward.py``), before its W.
    """
    import gc

    import torch
    from torch.distributed.pipelining._backward import stage_backward_input

    from course_utils.memory import activations

    if not isinstance(block, torch.nn.Module):
        raise ValueError(f"block must be a torch.nn.Module; got {type(block).__name__}")
    if not (isinstance(x, torch.Tensor) and x.requires_grad):
        raise ValueError("x must be a tensor that requires grad (the stage's input, as I "
                         f"computes its gradient); got {type(x).__name__}")
    inputs: dict[int, int] = {}
    outputs = 0

    def pre(_module: Any, args: tuple) -> None:
        storage = args[0].untyped_storage()
        inputs.setdefault(storage.data_ptr(), storage.nbytes())

    def post(_module: Any, _args: tuple, out: Any) -> None:
        nonlocal outputs
        outputs += out.numel() * out.element_size()

    linears = [m for m in block.modules() if isinstance(m, torch.nn.Linear)]
    hooks = [h for m in linears for h in (m.register_forward_pre_hook(pre),
                                          m.register_forward_hook(post))]
    refs: dict[int, Any] = {}
    try:
        saved, y = activations.saved_bytes(lambda: block(x), block.parameters(), refs=refs)
    finally:
        for h in hooks:
            h.remove()
    _, groups = stage_backward_input([y], [torch.ones_like(y)], [x], block.parameters())
    del y
    gc.collect()
    alive = sum(n for ref, n in refs.values() if ref() is not None)
    return {"saved": saved, "inputs": sum(inputs.values()), "output_grads": outputs,
            "torch_after_i": alive}

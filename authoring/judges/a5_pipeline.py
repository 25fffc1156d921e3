"""Judge of a5_pipeline: one function per test cell, run by the grader outside the kernel.

Each function gets ``got`` and ``ref``: ``{name: value}`` that the student's and the reference
solution's hidden tests submitted (``course_utils.assess.checks.submit``), and raises AssertionError
with the message that names the mistake. See ``grading/judge.py``.

Q5's pipeline step is judged against the one-process loss and gradients
(``course_utils.pipeline.runtime.microbatch_reference``), recomputed here from the same seeds,
as are its known mistakes (equal weighting of the microbatches, summed microbatch losses).
"""

import torch

from course_utils.assess import checks
from course_utils.pipeline import runtime as pp_harness

# Course helpers that compute a graded answer outright, per answer cell: a submission whose
# answer cell (or any cell it added) uses one is flagged in the instructor's report
# (grading.integrity.helper_uses), since the question asks for the reasoning the helper does.
HELPERS_NOT_ALLOWED = {
    "q1": ["pipeline.schedule.bubble_fraction", "pipeline.schedule.bubble_ratio",
           "pipeline.schedule.ratio_to_fraction", "pipeline.schedule.interleaved_bubble_fraction",
           "pipeline.schedule.simulate"],
    "q2": ["pipeline.schedule.min_microbatches", "pipeline.schedule.bubble_fraction",
           "pipeline.schedule.ratio_to_fraction"],
    "q3": ["pipeline.schedule.effective_batch"],
    "q4": ["pipeline.schedule.simulate", "pipeline.schedule.schedule_order",
           "pipeline.schedule.format_timeline"],
    "q5": ["pipeline.runtime.pipeline_worker", "pipeline.runtime.reference_step",
           "pipeline.runtime.microbatch_reference"],
    "q7": ["pipeline.schedule.simulate", "pipeline.zero_bubble.paper_bubble",
           "pipeline.zero_bubble.paper_bubble_fraction",
           "pipeline.zero_bubble.paper_peak_activations"],
}

SCHEDULES = ["gpipe", "1f1b", "interleaved"]

def _draw_q5(rng):
    """pipeline_step's hidden runs, drawn per submission: (pp_size, seed, microbatch sizes).
    Equal sizes first (a missing 1/m shows up there), then unequal ones on 2 and 3 stages for
    two seeds (weighting each microbatch equally shows up there)."""
    seeds = rng.sample(range(10_000), 3)
    cases = [[3, seeds[0], [rng.randint(2, 4)] * 4]]
    for seed in seeds[1:]:
        cases.append([2, seed, rng.sample(range(1, 7), 4)])
        cases.append([3, seed, rng.sample(range(1, 7), 3)])
    return cases


HIDDEN_CASES = {"q5_test": _draw_q5}


def _smallest_m(fits) -> int:
    return next(m for m in range(1, 100_000) if fits(m))


def q1_test(got, ref):
    p, m = got.givens.q1_gpipe
    checks.check_number("bubble_gpipe", got["bubble_gpipe"], (p - 1) / (m + p - 1), mistakes=[
        ((p - 1) / m, "that is the ratio (P-1)/m of bubble time to compute time; the fraction of "
                      "total time is (P-1)/(m+P-1)"),
        (p / (m + p), "the fill and drain take P-1 steps, not P: (P-1)/(m+P-1)"),
        (p / m, "the bubble has P-1 slots, and the total time is m+P-1 slots, not m")])
    p, m = got.givens.q1_1f1b
    checks.check_number("bubble_1f1b", got["bubble_1f1b"], (p - 1) / (m + p - 1), mistakes=[
        (0, "1F1B still fills and drains the pipeline: it reorders the ops, the P-1 idle slots "
            "stay"),
        ((p - 1) / m, "that is the ratio (P-1)/m; the fraction of total time is (P-1)/(m+P-1)"),
        (p / (m + p), "the bubble has P-1 slots, not P")])
    p, m, v = got.givens.q1_interleaved
    plain = (p - 1) / (m + p - 1)
    checks.check_number("bubble_interleaved", got["bubble_interleaved"],
                        (p - 1) / (v * m + p - 1), mistakes=[
        (plain, "that is plain 1F1B; v chunks per rank divide the fill and drain by v: "
                "(P-1)/(v*m+P-1)"),
        ((p - 1) / (v * m), "that is the interleaved ratio (P-1)/(v*m); the fraction is "
                            "(P-1)/(v*m+P-1)"),
        (plain / v, "dividing plain 1F1B's fraction by v is not the same as (P-1)/(v*m+P-1)")])


def q2_test(got, ref):
    for name, given in (("m_a", "q2_a"), ("m_b", "q2_b")):
        p, t = got.givens[given]
        right = _smallest_m(lambda m: (p - 1) / (m + p - 1) <= t)
        checks.check_number(name, got[name], right, mistakes=[
            (_smallest_m(lambda m: (p - 1) / m <= t),
             f"that makes the ratio (P-1)/m <= {t:.4g}; the fraction (P-1)/(m+P-1) already "
             "reaches the target at a smaller m"),
            (right - 1, f"with m = {right - 1} the fraction is {p - 1}/{right + p - 2} > "
                        f"{t:.4g}: round m up"),
            (_smallest_m(lambda m: p / (m + p) <= t),
             f"the bubble has P-1 = {p - 1} slots, not P = {p}")])


def q3_test(got, ref):
    tp, pp, dp, b, k = got.givens.q3_a
    checks.check_number("batch_a", got["batch_a"], b * k * dp, mistakes=[
        (b * k * tp * pp * dp, f"you multiplied by all {tp * pp * dp} devices: TP and PP ranks "
                               "work on the same examples, so only the DP degree multiplies "
                               "the batch"),
        (b * k * dp * tp, "you counted the TP degree: tensor-parallel ranks split each "
                          "example's layers, they do not see different examples"),
        (b * k * dp * pp, "you counted the PP degree: pipeline stages process the same "
                          "microbatches one after another"),
        (b * dp, f"the {k} accumulated microbatches all feed one optimizer step: multiply by "
                 "them"),
        (b * k, f"each of the DP = {dp} replicas takes its own {b * k} examples: multiply by "
                "the DP degree")])
    tp, pp, dp, b, m = got.givens.q3_b
    checks.check_number("batch_b", got["batch_b"], b * m * dp, mistakes=[
        (b * m * tp * pp * dp, f"you multiplied by all {tp * pp * dp} devices: only the DP "
                               "degree multiplies the batch"),
        (b * dp, f"the pipeline's m = {m} microbatches are accumulation steps: their gradients "
                 "are summed before the one optimizer step"),
        (b * m * dp * tp, "you counted the TP degree: TP ranks share the same examples"),
        (b * m * dp * pp, "you counted the PP degree: PP stages share the same microbatches"),
        (b * m, f"each of the DP = {dp} replicas takes its own {b * m} examples")])


def q4_test(got, ref):
    checks.check_choice("schedule_a", got["schedule_a"], "1f1b", SCHEDULES, mistakes={
        "gpipe": "in A the backwards start before all forwards are done (B0 comes before F5 on "
                 "rank 0): that is 1F1B's steady one-forward-one-backward phase",
        "interleaved": "A has no chunk letters: each rank holds one stage"})
    checks.check_choice("schedule_b", got["schedule_b"], "gpipe", SCHEDULES, mistakes={
        "1f1b": "in B every rank finishes all forwards before any backward: "
                "all-forward-all-backward is GPipe",
        "interleaved": "B has no chunk letters: each rank holds one stage"})
    checks.check_choice("schedule_c", got["schedule_c"], "interleaved", SCHEDULES, mistakes={
        "1f1b": "the letters a/b show each rank holding two chunks of layers: interleaved 1F1B",
        "gpipe": "the letters a/b show two chunks per rank, and backwards start before the last "
                 "forward: interleaved 1F1B"})
    checks.check_number("peak_a_rank0", got["peak_a_rank0"], 5, mistakes=[
        (4, "rank 0 starts F4 (its 5th forward) before B0 finishes: 5 are held at once"),
        (7, "that is GPipe; 1F1B starts a backward after P forwards on rank 0"),
        (1, "count the microbatches whose forward has started and whose backward has not "
            "finished")])
    checks.check_number("peak_b_rank0", got["peak_b_rank0"], 7, mistakes=[
        (5, "that is 1F1B; in B rank 0 runs all 7 forwards before its first backward"),
        (6, "all 7 forwards run before B0: count F6 too")])
    checks.check_choice("most_activations_rank_a", got["most_activations_rank_a"], 0,
                        [0, 1, 2, 3, 4], mistakes={
        4: "the last stage computes the loss, but under 1F1B it runs each backward right after "
           "the forward: it holds one microbatch at a time. Rank r holds P - r at its peak, so "
           "stage 0 holds the most",
        1: "rank r warms up with P - r forwards before its first backward: rank 0 warms up "
           "longest and holds the most",
        2: "rank r holds P - r microbatches at its peak: the first stage holds the most",
        3: "rank r holds P - r microbatches at its peak: the first stage holds the most"})


def _q5_case(number):
    return f"pipeline_step on hidden case {number}"


def _close(a, b):
    b = torch.as_tensor(b)
    return (isinstance(a, torch.Tensor) and tuple(a.shape) == tuple(b.shape)
            and torch.allclose(a.double(), b.double(), atol=1e-5, rtol=1e-4))


def _q5_feedback(got, number, pp_size, seed, sizes):
    """Compare one run on real ranks with one process; name the mistake."""
    case = _q5_case(number)
    losses, all_grads = got[f"{case} losses"], got[f"{case} grads"]
    assert isinstance(losses, list) and len(losses) == pp_size, (
        f"{case}: expected one result per rank ({pp_size}), got {losses!r}")
    assert isinstance(all_grads, list) and len(all_grads) == pp_size, (
        f"{case}: expected the gradients of {pp_size} ranks")
    loss, grads = pp_harness.microbatch_reference(seed, sizes, 8, 6, pp_size)
    eq_loss, eq_grads = pp_harness.microbatch_reference(seed, sizes, 8, 6, pp_size,
                                                        weighting="microbatches")
    for rank in range(pp_size - 1):
        assert losses[rank] is None, f"rank {rank} should return None"
    got_loss = checks.as_number("loss on the last rank", losses[-1])

    for rank in range(pp_size):
        assert isinstance(all_grads[rank], list) and len(all_grads[rank]) == len(grads[rank]), (
            f"rank {rank}: expected {len(grads[rank])} parameter gradients")
        if all(_close(g, w) for g, w in zip(all_grads[rank], eq_grads[rank])) and not all(
                _close(g, w) for g, w in zip(all_grads[rank], grads[rank])):
            raise AssertionError(
                "your gradients weight every microbatch equally (loss / m), but the microbatches "
                "have different sizes: weight each microbatch's mean loss by n_i / N so the sum "
                "is the mean over all examples")
        for k, (g, w) in enumerate(zip(all_grads[rank], grads[rank])):
            assert g is not None, f"rank {rank}: parameter {k} has no .grad"
            if _close(g, len(sizes) * w) and not _close(g, w):
                raise AssertionError(f"rank {rank}: gradients are {len(sizes)}x too large: "
                                     "the microbatch losses must be scaled before they are summed")
            torch.testing.assert_close(torch.as_tensor(g), torch.as_tensor(w), atol=1e-5,
                                       rtol=1e-4, msg=lambda m, rank=rank: (
                                           f"rank {rank}: gradients differ from one process "
                                           f"(hidden case {number}). {m}"))
    checks.check_number("loss on the last rank", got_loss, loss, rel=1e-4, mistakes=[
        (eq_loss, "your loss weights every microbatch equally; weight by n_i / N"),
        (loss * len(sizes), "that is the sum of the microbatch losses; the mean over all "
                            "examples scales each by n_i / N")])


def q5_test(got, ref):
    for number, (pp_size, seed, sizes) in enumerate(got.cases, 1):
        _q5_feedback(got, number, pp_size, seed, sizes)


def q7_test(got, ref):
    p, m, f, b, w, r = got.givens.q7
    bubble = (p - 1) * (f + (b - w) - w)  # Qi et al.'s (p-1)(T_F + T_B - T_W), T_B = I = B - W
    checks.check_number("zb_bubble_ms", got["zb_bubble_ms"], bubble, mistakes=[
        ((p - 1) * (f + b), "that is 1F1B's bubble (P-1)(F+B): ZB-H1 moves W into the wait, "
                            "(P-1)(T_F + T_B - T_W)"),
        ((p - 1) * (f + b - w), "you used the whole backward B for Qi et al.'s T_B, which is only "
                                "the input half I = B - W: (P-1)(F + (B-W) - W)"),
        (p * (f + b - 2 * w), "the pipeline fills and drains in P-1 steps, not P"),
        (0, "ZB-H1 is not bubble-free: it keeps (P-1)(T_F + T_B - T_W) of idle time")])
    work = m * (f + b)  # a rank's compute per step: F and the whole backward per microbatch
    checks.check_number("zb_fraction", got["zb_fraction"], bubble / (bubble + work), mistakes=[
        (bubble / work, "that divides by the compute time m (F + B) only; the fraction divides by "
                        "the whole step, idle time included"),
        ((p - 1) / (m + p - 1), "that is 1F1B's fraction (P-1)/(m+P-1): ZB-H1's bubble is "
                                "shorter"),
        (bubble / (bubble + m * (f + b + w)), "W is part of B: a microbatch's work is F + B, not "
                                              "F + B + W"),
        ((p - 1) * (f + b - w) / ((p - 1) * (f + b - w) + work),
         "the bubble in it used the whole backward B for Qi et al.'s T_B (the input half "
         "I = B - W)")])
    checks.check_number("zb_peak_rank", got["zb_peak_rank"], p, mistakes=[
        (p - r, "that is 1F1B's P - r: ZB-H1 holds each W back until the rank has P microbatches "
                "in flight, so every rank reaches P"),
        (m, "that is GPipe's m: ZB-H1 starts backwards after its warm-up, as 1F1B does"),
        (1, "a microbatch's activations stay from its forward until its W finishes")])

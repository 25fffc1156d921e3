"""Judge of a13_time_at_scale: one function per test cell, run by the grader outside the kernel.

Each function gets ``got`` and ``ref``: ``{name: value}`` that the student's and the reference
solution's hidden tests submitted (``course_utils.assess.checks.submit``), and raises AssertionError
with the message that names the mistake. See ``grading/judge.py``.

The expected values are not the reference's: they are lecture 13's model itself,
``course_utils.step_time.transformer.predict`` (its ``terms``), for the student's own job
(``got.givens.q1``) and plans (``got.givens.q2``), and ``flops_per_token(..., "attention")``
over the datasheet peak for Q3's run (``got.givens.q3``). The typical mistakes (the peak for
the achieved rate, 6N without the attention scores, bytes for seconds, the bubble or the sends
between stages left out, the DP time hidden behind compute added as well, the plan with less
compute taken for the faster) are computed here from the same givens; a mistake that gives the
answer's value for a student's numbers (within the tolerance) is not named for them.
"""

import functools

from course_utils.assess.checks import check_choice, check_number
from course_utils.collectives import cost
from course_utils.step_time import hardware, published, transformer

_PREDICT = ["step_time.transformer.predict", "step_time.transformer.Prediction",
            "step_time.terms.assemble", "step_time.published.rows",
            "step_time.published.table", "step_time.published.published_value",
            "step_time.published.closing_efficiency", "step_time.published.leave_one_out"]
_COUNT = ["step_time.transformer.flops_per_token", "step_time.transformer.predict",
          "step_time.transformer.Prediction", "step_time.published.published_value",
          "step_time.published.rows", "step_time.published.table"]
# (the practice answers too: the graded answers call the functions written there)
HELPERS_NOT_ALLOWED = {"q1_practice": _PREDICT, "q1": _PREDICT, "q2_practice": _PREDICT,
                       "q2": _PREDICT, "q3_practice": _COUNT, "q3": _COUNT}

MODELS = {"LLAMA3_8B": published.LLAMA3_8B, "LLAMA3_70B": published.LLAMA3_70B,
          "LLAMA3_405B": published.LLAMA3_405B}
DEVICES = {"H100": hardware.H100, "A100": hardware.A100}
REL = 1e-3


def job_of(model, tp, pp, dp, batch, seq):
    """The plan as lecture 13's model takes it: 1F1B, microbatches of one sequence."""
    return transformer.Job(MODELS[model], tp=tp, pp=pp, dp=dp, global_batch=batch, seq=seq)


@functools.lru_cache(maxsize=None)
def predicted(model, device, tp, pp, dp, batch, seq, efficiency=None):
    """``transformer.predict`` of the plan on the device (at another ``efficiency`` if given)."""
    hw = DEVICES[device] if efficiency is None else DEVICES[device].but(efficiency=efficiency)
    return transformer.predict(job_of(model, tp, pp, dp, batch, seq), hw)


def _apart(expected, mistakes):
    """The mistakes that a student's value can tell apart: outside the tolerance of the answer
    and of every mistake kept before it (the first listed keeps its message)."""
    def close(a, b):
        return abs(a - b) <= REL * max(abs(a), abs(b))
    kept = []
    for wrong, why in mistakes:
        if not close(wrong, expected) and not any(close(wrong, w) for w, _ in kept):
            kept.append((wrong, why))
    return kept


def _flops_s(model, device, tp, pp, dp, batch, seq, count="attention", rate="achieved"):
    """A rank's compute as FLOPs over one rate: its tokens' FLOPs (``count``) over TP x PP."""
    hw = DEVICES[device]
    tokens = batch // dp * seq
    flops = tokens * transformer.flops_per_token(MODELS[model], seq, count) / (tp * pp)
    return flops / (hw.achieved_flops if rate == "achieved" else hw.peak_flops)


def step_mistakes(plan, label):
    """(wrong step, what it means) of one plan's step, the answer's value first."""
    p = predicted(*plan)
    t, peak = p.terms, predicted(*plan, efficiency=1.0).terms
    return t.total, [
        (t.total + t.dp_hidden, f"{label}adds the DP collectives that compute hides (the "
                                "gradients' reduce-scatter behind the last backward, the "
                                "weights' all-gather behind the first forward) to the step: "
                                "only the part longer than its window counts, max(0, time - "
                                "window)"),
        (t.total - t.bubble, f"{label}leaves the pipeline bubble out: with PP > 1 the first "
                             "and last stages wait while the pipeline fills and drains"),
        (t.compute, f"{label}is the compute alone: TP's collectives, the bubble and the "
                    "exposed DP time add to it"),
        (t.compute + t.tp, f"{label}is compute and TP only: the bubble (and the DP time not "
                           "hidden) add to the step"),
        (t.total - t.dp_exposed, f"{label}leaves out the DP time that backward does not "
                                 "hide: max(0, reduce-scatter - last backward) + max(0, "
                                 "all-gather - first forward)"),
        (peak.total, f"{label}runs the matmuls at the datasheet peak: a matmul reaches the "
                     "achieved rate, peak x efficiency"),
        (t.total * 1e3, "that is milliseconds; give seconds"),
    ]


def q1_test(got, ref):
    model, device, tp, pp, dp, batch, seq = plan = got.givens.q1
    p = predicted(*plan)
    t, parts, hw, a = p.terms, p.parts, DEVICES[device], MODELS[model]
    m, act = p.job.m, seq * a.hidden * 2
    per_rank = m * a.layers / pp * 4          # TP all-reduces of one rank's step
    check_number("q1_compute_s", got["q1_compute_s"], t.compute, unit="s", mistakes=_apart(
        t.compute, [
            (predicted(*plan, efficiency=1.0).terms.compute,
             "that runs the matmuls at the datasheet peak: they reach the achieved rate, "
             "peak x efficiency (the device's efficiency)"),
            (_flops_s(*plan, rate="peak"), "that divides the FLOPs by the datasheet peak: "
                                           "they run at the achieved rate, peak x efficiency"),
            (_flops_s(*plan, count="6N"), "that counts 6N FLOPs a token: the attention "
                                          "scores (4 s h a layer forward, every score) are "
                                          "missing, and the embedding is a lookup, not a "
                                          "matmul"),
            (_flops_s(*plan, count="6N", rate="peak"), "that counts 6N FLOPs a token at the "
                                                       "datasheet peak: add the attention "
                                                       "scores, and use the achieved rate"),
            (m * seq * 6 * transformer.matmul_params(a) / (tp * pp * hw.achieved_flops),
             "the attention scores are missing: q k^T and their use add 4 s h FLOPs per "
             "token and layer forward, split over TP"),
            (_flops_s(*plan), f"that is every matmul on the FLOPs side of the roofline: at "
                              f"TP {tp} the K and V projections' output is too narrow; they "
                              f"are memory-bound (hardware.matmul_s takes the larger side)"),
            (t.compute / 3, "that is the forward alone: the backward takes twice the "
                            "forward (the inputs' and the weights' gradients)"),
            (t.compute / m, f"that is one microbatch: the rank runs m = {m} of them a step"),
            (t.compute * tp * pp, "that is the whole model's matmuls: a rank holds 1 / TP of "
                                  "each of its stage's layers and 1 / PP of the layers"),
            (t.compute * 1e3, "that is milliseconds; give seconds"),
        ]))
    ring = cost.ring_time_s(act, tp, hw.intra.alpha_s, hw.intra.bytes_per_s)
    check_number("q1_tp_s", got["q1_tp_s"], t.tp, unit="s", mistakes=_apart(t.tp, [
        (per_rank * cost.ring_bytes("all_reduce", act, tp), "that is bytes, not seconds: "
                                                            "divide what each rank sends "
                                                            "by the link's bandwidth"),
        (t.tp / 2, "that counts the forward's two all-reduces a layer: backward has two "
                   "more (the inputs' gradients of the column-parallel halves)"),
        (t.tp / 4, "that counts one all-reduce a layer and microbatch: Megatron's f and g "
                   "make two forward and two backward"),
        (t.tp / m, f"that is one microbatch's: every one of the m = {m} runs them"),
        (per_rank * act / hw.intra.bytes_per_s, "that sends the activation once over the "
                                                "link: a ring all-reduce sends 2(g-1)/g of "
                                                "it, in 2(g-1) steps of alpha each"),
        (per_rank * cost.ring_time_s(act, tp, hw.inter.alpha_s, hw.inter.bytes_per_s),
         "that puts the TP group on the network link: TP stays inside a node, on NVLink"),
        (per_rank * cost.ring_time_s(2 * act, tp, hw.intra.alpha_s, hw.intra.bytes_per_s),
         "the activations are bf16 (2 bytes), not fp32"),
        (per_rank * (ring - 2 * (tp - 1) * hw.intra.alpha_s), "the latency is missing: a "
                                                              "ring all-reduce takes 2(g-1) "
                                                              "steps of alpha"),
        (t.tp * 1e3, "that is milliseconds; give seconds"),
    ]))
    f, b = parts["forward_s"], parts["backward_s"]
    tp_f = t.tp / (2 * m)
    c = parts["p2p_s"]
    check_number("q1_bubble_s", got["q1_bubble_s"], t.bubble, unit="s", mistakes=_apart(
        t.bubble, [
            (0.0, f"the bubble is missing: {pp} stages idle while 1F1B fills and drains"),
            ((pp - 1) * (f + b + 2 * tp_f), "the sends between stages are missing: each "
                                            "activation (and its gradient) takes c to reach "
                                            "the next stage, and 1F1B's steady state waits "
                                            "for them too"),
            ((pp - 1) * (f + b), "that is (p-1)(F+B) with compute alone, and no sends: a "
                                 "microbatch's forward and backward include their TP "
                                 "collectives, and the sends between stages delay the "
                                 "steady state too"),
            ((pp - 1) * (f + b + 2 * tp_f + 2 * c), "that adds one send each way per stage "
                                                    "boundary, (p-1)(F+B+2c): the sends also "
                                                    "hold up 1F1B's steady state, as the "
                                                    "simulator plays it (see the rule)"),
            ((pp - 1) / (m + pp - 1), "that is the bubble's fraction (p-1)/(m+p-1), a "
                                      "number without unit: give the seconds"),
            (t.bubble * 1e3, "that is milliseconds; give seconds"),
        ]))
    step, wrongs = step_mistakes(plan, "that ")
    check_number("q1_step_s", got["q1_step_s"], step, unit="s", mistakes=_apart(step, wrongs))


def q2_test(got, ref):
    model, device, seq, batch, plan_a, plan_b = got.givens.q2
    plans = {k: (model, device, *plan, batch, seq) for k, plan in (("A", plan_a), ("B", plan_b))}
    steps = {}
    for k, other in (("A", "B"), ("B", "A")):
        step, wrongs = step_mistakes(plans[k], "that ")
        steps[k] = step
        wrongs.append((predicted(*plans[other]).terms.total, f"that is plan {other}'s step"))
        check_number(f"q2_step_{k.lower()}_s", got[f"q2_step_{k.lower()}_s"], step, unit="s",
                     mistakes=_apart(step, wrongs))
    faster = min(steps, key=steps.get)
    slower = "B" if faster == "A" else "A"
    compute = {k: predicted(*plans[k]).terms.compute for k in plans}
    if abs(compute["A"] - compute["B"]) <= REL * max(compute.values()):
        why = ("both plans compute the same per rank (the same FLOPs on the same GPUs): "
               "compute alone cannot choose; the bubble, TP's collectives and the DP time "
               "not hidden decide, plan by plan")
    elif compute[slower] < compute[faster]:
        why = (f"plan {slower} computes less per rank (fewer memory-bound matmuls), but "
               f"compute alone does not pick the faster plan: its bubble, TP collectives and "
               f"exposed DP time make its step the longer")
    else:
        why = (f"plan {slower}'s step is the longer: add up each plan's compute, TP, bubble "
               f"and exposed DP time")
    # the wrong choice's reason as a hint, not a named mistake: with two choices, half the
    # class's numbers would "give" any copied choice as a mistake (grading.copies)
    check_choice("q2_faster", got["q2_faster"], faster, ["A", "B"], hint=why)


def q3_test(got, ref):
    model, device, seq, tokens_per_s = got.givens.q3
    a, hw = MODELS[model], DEVICES[device]
    flops = tokens_per_s * transformer.flops_per_token(a, seq, "attention")
    mfu = flops / hw.peak_flops
    six_n = tokens_per_s * transformer.flops_per_token(a, seq, "6N")
    check_number("q3_mfu", got["q3_mfu"], mfu, mistakes=_apart(mfu, [
        (six_n / hw.peak_flops, "that counts 6N a token: the question counts the attention "
                                "scores too (12 L s h a token), as Llama 3 and PaLM do, and "
                                "the embedding's lookup is no matmul"),
        (tokens_per_s * 6 * transformer.matmul_params(a) / hw.peak_flops,
         "the attention scores are missing: 12 L s h FLOPs a token (forward and backward)"),
        (flops / hw.achieved_flops, "that divides by the achieved rate: MFU is over the "
                                    "datasheet peak (an MFU of 1 is the peak)"),
        (six_n / hw.achieved_flops, "that is 6N over the achieved rate: count the attention "
                                    "scores, and divide by the datasheet peak"),
        (tokens_per_s * transformer.flops_per_token(a, seq, "megatron") / hw.peak_flops,
         "that is Megatron's count (their equation 3), which adds a full recomputation's "
         "forward: MFU counts the forward and the backward only"),
        (mfu / 3, "that counts the forward alone: training is forward and backward, 3 x the "
                  "forward's FLOPs"),
        (100 * mfu, "that is a percentage: give MFU as a fraction between 0 and 1"),
    ]))

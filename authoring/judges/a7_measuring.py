"""Judge of a7_measuring: one function per test cell, run by the grader outside the kernel.

Each function gets ``got`` and ``ref``: ``{name: value}`` that the student's and the reference
solution's hidden tests submitted (``course_utils.assess.checks.submit``), and raises AssertionError
with the message that names the mistake. See ``grading/judge.py``.

Q7's seconds are timings: they are judged for consistency with the delay of the late rank, never
compared with the reference's.
"""

import torch

from course_utils.assess.checks import as_number, check_choice, check_number
from course_utils.assess.givens import a7_runs

# Course helpers that compute a graded answer outright, per answer cell: a submission whose
# answer cell (or any cell it added) uses one is flagged in the instructor's report
# (grading.integrity.helper_uses), since the question asks for the reasoning the helper does.
HELPERS_NOT_ALLOWED = {
    "q2": ["measure.throughput"],
    "q3": ["measure.wait_fraction", "measure.summarize"],
    "q4": ["measure.summarize", "measure.wait_fraction"],
    "q6": ["measure.predicted_allreduce_bytes", "collectives.cost.ring_bytes_per_rank",
           "collectives.cost.ring_time_s"],
    "q7": ["data_parallel.straggler_worker"],
}

Q1_CHOICES = ["correct", "summed, not averaged", "averaged twice", "ranks saw the same data"]
Q4_CHOICES = ["straggler", "communication-bound", "memory-bound", "healthy"]


def _draw_q7(rng):
    """timed_mean_allreduce's hidden runs, drawn per submission: (world_size, late_rank,
    delay_s): every rank on time (2 ranks), then one late rank, drawn, on 3 ranks and on 2 (the
    same rank counts for everyone: the submissions keep their names)."""
    return [[2, -1, 0.0], [3, rng.randrange(3), round(rng.uniform(0.3, 0.5), 2)],
            [2, rng.randrange(2), round(rng.uniform(0.3, 0.5), 2)]]


HIDDEN_CASES = {"q7_test": _draw_q7}


D = 4

def q1_test(got, ref):
    summed = got.givens.q1 == D
    answer = "summed, not averaged" if summed else "averaged twice"
    mistakes = {
        "correct": "a correct reduction gives the single-process gradient exactly (ratio 1.0). "
                   "Equal losses do not prove the gradients are right: the logged loss does not "
                   "depend on how gradients are reduced.",
        "ranks saw the same data": "duplicated data changes the gradient's direction (it is the "
                                   "mean over fewer distinct examples), not its length by "
                                   f"exactly {got.givens.q1:g}; here the cosine is 1.0.",
    }
    if summed:
        mistakes["averaged twice"] = ("dividing by D twice would make the norm 1/D = 0.25 "
                                      "times the reference, not 4 times.")
    else:
        mistakes["summed, not averaged"] = ("summing without dividing by D would make the norm "
                                            "D = 4 times the reference, not 1/4.")
    check_choice("q1_diagnosis", got["q1_diagnosis"], answer, Q1_CHOICES, mistakes=mistakes)


def q2_test(got, ref):
    _, _, batch, seq = got.givens.job
    run_a = a7_runs(got.givens)[0]
    tokens, step_s = batch * D * seq, run_a["step_ms"] / 1000
    check_number("q2_tokens_per_s", got["q2_tokens_per_s"], tokens / step_s, unit="tokens/s",
                 mistakes=[
        (tokens / D / step_s, "that is one rank's throughput (or the global batch divided by "
                              "D again): the global batch is BATCH_PER_RANK x D sequences per "
                              "step, and the D ranks process theirs within the same step."),
        (tokens / run_a["step_ms"], "that divides by milliseconds: convert the step time to "
                                    "seconds."),
        (batch * D / step_s, "that counts sequences per second; multiply by SEQ_LEN tokens per "
                             "sequence."),
        (tokens / (step_s - run_a["wait_ms"][0] / 1000), "the step time includes the wait: "
                                                         "throughput is tokens per wall-clock "
                                                         "step, waiting included."),
    ])


def q3_test(got, ref):
    run_a = a7_runs(got.givens)[0]
    step, wait, compute = run_a["step_ms"], run_a["wait_ms"], run_a["compute_ms"]
    right_a, right_b = wait[0] / step, sum(wait) / (D * step)
    mistakes_a = [(100 * right_a, "that is a percentage; give a fraction between 0 and 1."),
                  (wait[0] / compute[0], "that divides by the compute time; the question asks "
                                         "for a fraction of the whole step."),
                  (right_b, "that is the mean over ranks; part (a) asks about rank 0 only.")]
    slow = compute.index(max(compute))
    if slow != 0:
        mistakes_a.append((wait[slow] / step, f"that is rank {slow}'s wait (the list is in rank "
                                              "order, rank 0 first)."))
    check_number("q3a_rank0_fraction", got["q3a_rank0_fraction"], right_a, mistakes=mistakes_a)
    longest = max(wait)
    mistakes_b = [(100 * right_b, "that is a percentage; give a fraction between 0 and 1."),
                  (sum(wait) / step, f"that adds the waits of {D} ranks but compares them with "
                                     "one rank's step: divide by D x step time."),
                  (right_a, "that is rank 0 alone; average the wait over all ranks.")]
    if longest != wait[0]:
        mistakes_b.append((longest / step, "that is the largest wait; average the wait over all "
                                           "ranks."))
    check_number("q3b_cluster_fraction", got["q3b_cluster_fraction"], right_b,
                 mistakes=mistakes_b)


def q4_test(got, ref):
    run_a, run_b, _ = a7_runs(got.givens)
    slow = run_a["compute_ms"].index(max(run_a["compute_ms"]))
    others = [w for r, w in enumerate(run_a["wait_ms"]) if r != slow]
    waiting = sum(others) / len(others) / run_a["step_ms"]
    check_choice("q4_run_a", got["q4_run_a"], "straggler", Q4_CHOICES, mistakes={
        "communication-bound": "if moving bytes were the problem, every rank would wait about "
                               f"as long; here rank {slow} waits {run_a['wait_ms'][slow]:g} ms "
                               f"and the others about {sum(others) / len(others):.0f} ms. "
                               "Ranks that wait long are waiting for a slow peer.",
        "memory-bound": "peak memory is about 51 of 80 GB and the allocator never retried.",
        "healthy": f"three ranks spend about {waiting:.0%} of every step waiting for one rank.",
    })
    wait_b = run_b["wait_ms"][0]
    check_choice("q4_run_b", got["q4_run_b"], "communication-bound", Q4_CHOICES, mistakes={
        "straggler": "a straggler shows as one rank that waits much less than the others; here "
                     f"all four wait about {wait_b:g} ms, about as long as sending the gradients "
                     "takes (see Q6).",
        "memory-bound": "peak memory is about 38 of 80 GB.",
        "healthy": f"{wait_b / run_b['step_ms']:.0%} of every step is spent inside the "
                   "all-reduce.",
    })
    check_choice("q4_run_c", got["q4_run_c"], "memory-bound", Q4_CHOICES, mistakes={
        "healthy": "look at memory: the peak is within 1 GB of the 80 GB device and the "
                   "allocator retried dozens of times (it had to free cached blocks and try "
                   "again).",
        "straggler": "the ranks' compute and wait times are all about equal.",
        "communication-bound": "the wait is only about 6% of the step.",
    })


def q5_test(got, ref):
    run_a = a7_runs(got.givens)[0]
    wait = run_a["wait_ms"]
    slow = run_a["compute_ms"].index(max(run_a["compute_ms"]))
    longest = wait.index(max(wait))
    mistakes = [(longest, f"rank {longest} waits the longest: it is a victim, waiting for the "
                          "slow rank. The straggler is the rank that waits least, because "
                          "everyone else is already there when it arrives.")]
    mistakes += [(r, f"rank {r} waits about {wait[r]:g} ms: it is waiting for the slow rank, "
                     "not causing the wait.") for r in range(D) if r not in (slow, longest)]
    check_number("q5_straggler_rank", got["q5_straggler_rank"], slow, mistakes=mistakes)


def q6_test(got, ref):
    n_params, bus, _, _ = got.givens.job
    once = 2 * n_params / (bus * 1e9) * 1000               # GRAD_BYTES once, in ms
    right = 2 * (D - 1) / D * once
    check_number("q6_predicted_ms", got["q6_predicted_ms"], right, unit="ms", mistakes=[
        (once, "that sends GRAD_BYTES once; a ring all-reduce sends (D-1)/D x bytes in its "
               "reduce-scatter half and as much again in its all-gather half: 2(D-1)/D x "
               "bytes."),
        (right / 2, "that is only one half of the ring (reduce-scatter or all-gather): the full "
                    "all-reduce sends 2(D-1)/D x bytes."),
        (2 * once, "that uses 2 x bytes; each rank sends 2(D-1)/D x bytes, which is 1.5 x for "
                   "D = 4."),
        (right / 1000, "that is in seconds; the question asks for milliseconds."),
        (2 * right, "that uses 4 bytes per parameter; the gradients are all-reduced in BF16 "
                    "(GRAD_BYTES = 2 x N_PARAMS)."),
        (8 * right, "GB/s are bytes, not bits: do not multiply by 8."),
    ])

def _q7_check(got, number, world_size, late_rank, delay_s):
    """One run of timed_mean_allreduce on ``world_size`` ranks, ``late_rank`` ``delay_s`` late."""
    call = f"_q7_worker on hidden case {number}"
    inputs = [torch.arange(6, dtype=torch.float32).view(2, 3) * (r + 1) ** 2 + 10 * r
              for r in range(world_size)]                              # each (2, 3)
    total = torch.stack(inputs).sum(dim=0)                             # (2, 3), one process
    expected = total / world_size
    waited = []
    for rank in range(world_size):
        result = got[f"{call} rank {rank}: tensor"]
        assert isinstance(result, torch.Tensor) and tuple(result.shape) == (2, 3), (
            "the tensor must keep its shape (2, 3)")
        result = result.float()
        if torch.allclose(result, inputs[rank]):
            raise AssertionError(f"rank {rank}: the tensor is unchanged. Update it in place "
                                 "(dist.all_reduce(tensor) and tensor.div_(...)), do not "
                                 "rebind the name to a new tensor.")
        if torch.allclose(result, total):
            raise AssertionError("the result is the SUM over ranks: divide by world_size to "
                                 "get the mean.")
        if torch.allclose(result, total / world_size ** 2):
            raise AssertionError("the result is divided by world_size twice.")
        if world_size != 2 and torch.allclose(result, total / 2):
            raise AssertionError("the result is divided by 2 whatever the number of ranks: "
                                 "use world_size.")
        torch.testing.assert_close(result, expected, msg=lambda m, rank=rank: (
            f"rank {rank}: the result differs from the mean computed in one process. {m}"))
        waited.append(as_number(f"rank {rank}: the returned seconds",
                                got[f"{call} rank {rank}: seconds"]))
        kind = got[f"{call} rank {rank}: type"]
        if kind != "float":
            raise AssertionError(f"return a plain float (got {kind}); "
                                 "use float(...) or .item()")
    if late_rank >= 0:
        on_time = [w for r, w in enumerate(waited) if r != late_rank]
        if min(on_time) < 0.5 * delay_s:
            raise AssertionError(
                f"hidden case {number}: one rank arrived {delay_s} s late, yet an on-time rank "
                f"reported only "
                f"{min(on_time):.3f} s: start the timer just before dist.all_reduce and stop it "
                "right after, so the time spent blocked inside the collective is counted.")
        if max(on_time) > 20 * delay_s + 5:
            raise AssertionError("the reported seconds are far too large: return seconds "
                                 "(time.perf_counter() differences), not milliseconds.")
        if not waited[late_rank] < min(on_time):
            raise AssertionError("the late rank should wait least: the others are already "
                                 "inside the collective when it arrives.")


def q7_test(got, ref):
    for number, (world_size, late_rank, delay_s) in enumerate(got.cases, 1):
        _q7_check(got, number, world_size, late_rank, delay_s)

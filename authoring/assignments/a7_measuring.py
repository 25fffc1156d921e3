# %% [markdown]
# # Assignment 7: reading the measurements of a real run
#
# Lecture 7 verified a data-parallel run against one process, then measured its step time,
# throughput, memory and the time its ranks spent waiting inside collectives. Here you read such
# measurements and decide what limits each run.
#
# Answer each question by assigning the named variable in its answer cell (delete the
# `raise NotImplementedError()` line), then run the cells below it.
#
# **Practice, then the graded question.** Each numeric or multiple-choice question starts with a
# *practice* question (not graded) that asks the same reasoning about other numbers or another
# run. The cell after your practice answer checks it fully: it says whether it is right and, if
# not, which misconception your value reveals. Do the practice first.
#
# **What the test cells check while you work.** The test cell after a graded answer checks its
# type (a number, one of the listed strings) and rejects a few known wrong values, naming the
# misconception, but it never tells you the right value: passing it does not mean your answer is
# right. For Q7 (a function) the test cell runs your function on real ranks on visible cases and
# checks everything: the averaged tensor, the returned type and the timing.
#
# **What grading adds.** When the assignment is graded, the same test cells also submit your
# values, and the grader compares them with the reference values and names the mistake if they
# differ; for Q7 it runs your function on further hidden cases (other numbers of ranks, other
# late ranks and delays).
#
# Vocabulary used below:
#
# * **wait**: the time a rank spends inside the gradient all-reduce (moving bytes, or blocked
#   until the other ranks arrive). **Wait fraction** = wait / step time.
# * **straggler**: one rank is slower than the others, so the others wait for it.
# * **communication-bound**: every rank spends a large, similar part of the step inside the
#   collective, about as long as moving the bytes takes; compute is not the bottleneck.
# * **memory-bound**: the peak memory is at the device's limit, so the run cannot grow its
#   per-rank batch (or had to turn on recomputation, or the allocator is retrying); the
#   collectives are not the problem.
# * **healthy**: none of the above.
#
# **Your own numbers.** The job, run A and Q1's ratio are drawn for you (the table the next
# cell shows, `G`, and the tables built from it): your classmates have other ones, so their
# answers are wrong for you. They come from your identity (your JupyterHub user, the name
# `make lab` asked for once, or, when your instructor grades, your student id, whatever this
# notebook says). Do not edit that cell.
#
# **Work the answers out yourself.** Some `course_utils` helpers compute a graded answer
# outright (here, for example, `measure.throughput`). An answer that uses one is flagged for
# your instructor: the questions ask for the reasoning those helpers do.

# %%
import time

import torch
import torch.distributed as dist

from course_utils import launch
from course_utils.assess import checks, givens as assignment_givens, variants

_ = launch.run(lambda rank, world_size: None, 2, timeout_s=55)  # start the rank launcher once
G = variants.givens("a7_measuring", on=True)  # your numbers (do not edit this cell)
G

# %% [markdown]
# ## The measurements
#
# Three data-parallel runs of the same `N_PARAMS`-parameter model on D = 4 GPUs with 80 GB each.
# Each rank processes `BATCH_PER_RANK` sequences of `SEQ_LEN` tokens per step. Gradients are
# all-reduced in BF16 (2 bytes per parameter) at a measured bus bandwidth of `BUS_GB_PER_S`
# GB/s per rank. Every list has one entry per rank (rank 0 first): means over 50 steps after a
# warm-up. The ranks synchronize at every step, so all ranks of a run share one step time.

# %%
D = 4
N_PARAMS, BUS_GB_PER_S, BATCH_PER_RANK, SEQ_LEN = G.job  # BUS_GB_PER_S: 10**9 bytes/s per rank
GRAD_BYTES = 2 * N_PARAMS        # BF16 gradients
DEVICE_GB = 80.0
# compute_ms: data + forward + backward + optimizer
RUN_A, RUN_B, RUN_C = assignment_givens.a7_runs(G)
for _name, _run in (("RUN_A", RUN_A), ("RUN_B", RUN_B), ("RUN_C", RUN_C)):
    print(f"{_name} = {_run}")

# %% [markdown]
# Two more runs, used only by the practice questions: run P (4 ranks) and run H (4 ranks), the
# same model and devices as above.

# %%
RUN_P = {"step_ms": 500.0,
         "compute_ms": [352.0, 486.0, 349.0, 357.0],
         "wait_ms": [141.0, 6.0, 144.0, 136.0],
         "peak_gb": [47.0, 47.1, 47.5, 47.0],
         "alloc_retries": [0, 0, 0, 0]}
RUN_H = {"step_ms": 300.0,
         "compute_ms": [279.0, 280.0, 278.0, 279.0],
         "wait_ms": [19.0, 18.0, 20.0, 19.0],
         "peak_gb": [44.2, 44.3, 44.1, 44.2],
         "alloc_retries": [0, 0, 0, 0]}

# %% [markdown]
# ## Q1. Verify first (2 points)
#
# *Practice (not graded)*: in another data-parallel run on D = 8 ranks, one step was compared
# with a single process on the same global batch. The gradient norm on every rank came out
# **1.06 times** the single-process norm, the **cosine** between the two gradients is **0.93**,
# and rank 0 logged a loss of 2.31 where the single process logged 2.27. Which is it? Assign
# one of these strings to `practice_diagnosis`:
#
# `"correct"`, `"summed, not averaged"`, `"averaged twice"`, `"ranks saw the same data"`

# %% [answer q1_practice]
### BEGIN SOLUTION
practice_diagnosis = "ranks saw the same data"
### END SOLUTION

# %%
checks.check_choice("practice_diagnosis", practice_diagnosis, "ranks saw the same data",
                    ["correct", "summed, not averaged", "averaged twice",
                     "ranks saw the same data"], mistakes={
    "correct": "a correct reduction reproduces the single-process gradient up to rounding: "
               "cosine 1.0 and the same length. A cosine of 0.93 means the gradient points "
               "elsewhere, and the loss differs too.",
    "summed, not averaged": "summing instead of averaging multiplies every component by the "
                            "same factor: the length changes but the direction stays (cosine "
                            "1.0). Here the direction changed.",
    "averaged twice": "an extra division scales the gradient and keeps its direction (cosine "
                      "1.0). Here the direction changed.",
})
print("practice_diagnosis: right")

# %% [markdown]
# **Graded**: before any of these runs was timed, one step was compared with a single process
# on the same global batch. In run A the gradient norm on every rank came out **`G.q1` times**
# the single-process gradient norm (yours is in the table at the top), with the same direction
# (cosine 1.0), and the same loss.
# Which is it? Assign one of these strings to `q1_diagnosis`:
#
# `"correct"`, `"summed, not averaged"`, `"averaged twice"`, `"ranks saw the same data"`

# %% [answer q1]
### BEGIN SOLUTION
q1_diagnosis = "summed, not averaged" if G.q1 == D else "averaged twice"
### END SOLUTION

# %% [test q1_test points=2]
Q1_CHOICES = ["correct", "summed, not averaged", "averaged twice", "ranks saw the same data"]
checks.check_choice("q1_diagnosis", q1_diagnosis, None, Q1_CHOICES, variant=G.key("q1"), mistakes={
    "correct": "equal losses do not show that the reduction is right (the logged loss is "
               "computed before any gradient is reduced); a right reduction gives the "
               "single-process gradient, length included.",
})
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q1_diagnosis", q1_diagnosis)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q2. Throughput (2 points)
#
# *Practice (not graded)*: a run on D = 8 GPUs processes 4 sequences of 2048 tokens per rank
# per step. Its step time is 250 ms, of which rank 0 spends 90 ms waiting in the all-reduce.
# How many tokens per second does it process, all ranks together? Assign it to
# `practice_tokens_per_s`.

# %% [answer q2_practice]
### BEGIN SOLUTION
practice_tokens_per_s = 4 * 8 * 2048 / 0.250
### END SOLUTION

# %%
checks.check_number("practice_tokens_per_s", practice_tokens_per_s, 262144.0, unit="tokens/s",
                    mistakes=[
    (32768.0, "that counts one rank only: the global batch is BATCH_PER_RANK x D sequences "
              "(4 x 8 = 32 here), all processed within the same 250 ms step."),
    (262.144, "that divides by milliseconds: 250 ms is 0.25 s."),
    (128.0, "that is sequences per second: each sequence has 2048 tokens."),
    (409600.0, "that leaves the 90 ms wait out: a step takes 250 ms of wall-clock time, "
               "waiting included, and throughput is tokens per wall-clock second."),
])
print("practice_tokens_per_s: right")

# %% [markdown]
# **Graded**: how many **tokens per second** does run A process, all ranks together? Assign it to
# `q2_tokens_per_s`.

# %% [answer q2]
### BEGIN SOLUTION
q2_tokens_per_s = BATCH_PER_RANK * D * SEQ_LEN / (RUN_A["step_ms"] / 1000)
### END SOLUTION

# %% [test q2_test points=2]
checks.check_number("q2_tokens_per_s", q2_tokens_per_s, unit="tokens/s",
                    variant=G.key("job", "run_a"), mistakes=[
    (BATCH_PER_RANK * SEQ_LEN / (RUN_A["step_ms"] / 1000),
     "that counts the tokens of one rank: the global batch is BATCH_PER_RANK x D sequences, and "
     "the D ranks process theirs at the same time, within one step."),
])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q2_tokens_per_s", q2_tokens_per_s)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q3. Fraction of the step spent waiting (2 points)
#
# *Practice (not graded)*: (a) what fraction of each step does **rank 3** of run P spend
# waiting? Assign it to `practice_rank3_fraction`. (b) What fraction of all the GPU time of
# run P (all ranks together) is spent waiting? Assign it to `practice_cluster_fraction`.

# %% [answer q3_practice]
### BEGIN SOLUTION
practice_rank3_fraction = RUN_P["wait_ms"][3] / RUN_P["step_ms"]
practice_cluster_fraction = sum(RUN_P["wait_ms"]) / (len(RUN_P["wait_ms"]) * RUN_P["step_ms"])
### END SOLUTION

# %%
checks.check_number("practice_rank3_fraction", practice_rank3_fraction, 0.272, mistakes=[
    (27.2, "that is a percentage; a fraction lies between 0 and 1."),
    (136 / 357, "that compares the wait with rank 3's compute time (357 ms); the fraction is "
                "of the whole 500 ms step."),
    (0.282, "that is rank 0's wait; the lists are in rank order, so rank 3 is the last entry."),
    (0.012, "that is rank 1's wait; the lists are in rank order, so rank 3 is the last entry."),
    (0.288, "that is rank 2's wait; the lists are in rank order, so rank 3 is the last entry."),
    (0.2135, "that averages over the four ranks; (a) asks about rank 3 alone."),
])
checks.check_number("practice_cluster_fraction", practice_cluster_fraction, 0.2135, mistakes=[
    (21.35, "that is a percentage; a fraction lies between 0 and 1."),
    (0.854, "that adds four ranks' waits (427 ms) but divides by one rank's step: the GPU time "
            "of the run is 4 x 500 ms."),
    (0.288, "that is the largest wait, rank 2's; the question is about all ranks together."),
    (0.272, "that is rank 3 alone; the question is about all ranks together."),
    (427 / 1544, "that divides by the total compute time; divide by the total step time "
                 "(waiting is part of the GPU time)."),
])
print("practice fractions: right")

# %% [markdown]
# **Graded**: (a) what fraction of each step does **rank 0** of run A spend waiting? Assign a number
# between 0 and 1 to `q3a_rank0_fraction`.
#
# (b) What fraction of all the GPU time of run A (all ranks together) is spent waiting?
# Assign it to `q3b_cluster_fraction`.

# %% [answer q3]
### BEGIN SOLUTION
q3a_rank0_fraction = RUN_A["wait_ms"][0] / RUN_A["step_ms"]
q3b_cluster_fraction = sum(RUN_A["wait_ms"]) / (D * RUN_A["step_ms"])
### END SOLUTION

# %% [test q3_test points=2]
for _name, _value in (("q3a_rank0_fraction", q3a_rank0_fraction),
                      ("q3b_cluster_fraction", q3b_cluster_fraction)):
    checks.check_number(_name, _value)
    if not 0 <= float(_value) <= 1:
        raise AssertionError(f"{_name} = {float(_value):g} is not a fraction between 0 and 1. "
                             "A percentage? Or a total wait compared with a shorter time?")
checks.check_number("q3a_rank0_fraction", q3a_rank0_fraction, variant=G.key("run_a"), mistakes=[
    (RUN_A["wait_ms"][_r] / RUN_A["step_ms"],
     f"that is rank {_r}'s wait; the lists are in rank order, rank 0 first.") for _r in (1, 2, 3)
    if RUN_A["wait_ms"][_r] != RUN_A["wait_ms"][0]])
checks.check_number("q3b_cluster_fraction", q3b_cluster_fraction, variant=G.key("run_a"),
                    mistakes=[
    (max(RUN_A["wait_ms"]) / RUN_A["step_ms"],
     "that is the largest wait of one rank; (b) is about the GPU time of all ranks together."),
    (min(RUN_A["wait_ms"]) / RUN_A["step_ms"],
     "that is the smallest wait of one rank; (b) is about the GPU time of all ranks together."),
])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q3a_rank0_fraction", q3a_rank0_fraction)
submit("q3b_cluster_fraction", q3b_cluster_fraction)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q4. Diagnose the three runs (3 points)
#
# *Practice (not graded)*: diagnose run H. Assign one of `"straggler"`, `"communication-bound"`,
# `"memory-bound"`, `"healthy"` to `practice_run_h`.

# %% [answer q4_practice]
### BEGIN SOLUTION
practice_run_h = "healthy"
### END SOLUTION

# %%
checks.check_choice("practice_run_h", practice_run_h, "healthy",
                    ["straggler", "communication-bound", "memory-bound", "healthy"], mistakes={
    "straggler": "no rank stands out in run H: every rank computes 278 to 280 ms and waits 18 "
                 "to 20 ms.",
    "communication-bound": "run H waits about 19 of its 300 ms (about 6%): the collective costs "
                           "little next to the compute.",
    "memory-bound": "run H peaks at about 44 of 80 GB and its allocator never retried: there is "
                    "room to grow the batch.",
})
print("practice_run_h: right")

# %% [markdown]
# **Graded**: for each of runs A, B and C assign one of `"straggler"`,
# `"communication-bound"`, `"memory-bound"`, `"healthy"` to `q4_run_a`, `q4_run_b`, `q4_run_c`.

# %% [answer q4]
### BEGIN SOLUTION
q4_run_a = "straggler"
q4_run_b = "communication-bound"
q4_run_c = "memory-bound"
### END SOLUTION

# %% [test q4_test points=3]
Q4_CHOICES = ["straggler", "communication-bound", "memory-bound", "healthy"]
Q4_KNOWN_WRONG = {
    "q4_run_a": {"healthy": "run A's ranks spend a large part of every step inside the "
                            "all-reduce: the GPUs do no work then, so something limits the run."},
    "q4_run_b": {"memory-bound": "run B peaks at under half of the 80 GB and its allocator "
                                 "never retried."},
    "q4_run_c": {"communication-bound": "run C's ranks spend only a small part of the step "
                                        "(about 26 of 412 ms) inside the all-reduce."},
}
for _name, _value in (("q4_run_a", q4_run_a), ("q4_run_b", q4_run_b), ("q4_run_c", q4_run_c)):
    checks.check_choice(_name, _value, None, Q4_CHOICES, mistakes=Q4_KNOWN_WRONG[_name])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q4_run_a", q4_run_a)
submit("q4_run_b", q4_run_b)
submit("q4_run_c", q4_run_c)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q5. Which rank is the straggler? (1 point)
#
# *Practice (not graded)*: one rank of run P is slow. Which? Assign its number to
# `practice_straggler_rank`.

# %% [answer q5_practice]
### BEGIN SOLUTION
practice_straggler_rank = 1
### END SOLUTION

# %%
checks.check_number("practice_straggler_rank", practice_straggler_rank, 1, mistakes=[
    (2, "rank 2 waits the longest (144 ms), but a rank that waits is already inside the "
        "all-reduce, waiting for a peer that has not arrived: it is a victim, not the cause."),
    (0, "rank 0 waits 141 ms inside the all-reduce: it arrives early and waits for the slow "
        "rank."),
    (3, "rank 3 waits 136 ms inside the all-reduce: it arrives early and waits for the slow "
        "rank."),
])
print("practice_straggler_rank: right")

# %% [markdown]
# **Graded**: in run A, which rank is slow? Assign its number to `q5_straggler_rank`.

# %% [answer q5]
### BEGIN SOLUTION
q5_straggler_rank = RUN_A["compute_ms"].index(max(RUN_A["compute_ms"]))
### END SOLUTION

# %% [test q5_test points=1]
checks.check_number("q5_straggler_rank", q5_straggler_rank)
if float(q5_straggler_rank) not in [float(_r) for _r in range(D)]:
    raise AssertionError(f"q5_straggler_rank = {q5_straggler_rank}: run A's ranks are "
                         f"numbered 0 to {D - 1}.")
checks.check_number("q5_straggler_rank", q5_straggler_rank, variant=G.key("run_a"), mistakes=[
    (RUN_A["wait_ms"].index(max(RUN_A["wait_ms"])),
     "that rank waits the longest; a rank waits inside the all-reduce when it arrives early, so "
     "a long wait does not make it the slow one."),
])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q5_straggler_rank", q5_straggler_rank)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q6. Is run B's wait explained by the bytes? (2 points)
#
# *Practice (not graded)*: a 0.5B-parameter model is trained on D = 8 ranks; its gradients are
# all-reduced in BF16 (2 bytes per parameter) at a bus bandwidth of 25 GB/s per rank. Predict
# the time of one ring all-reduce of its gradients, **in milliseconds**, with the formula below,
# and assign it to `practice_predicted_ms`.

# %% [answer q6_practice]
### BEGIN SOLUTION
practice_predicted_ms = 2 * (8 - 1) / 8 * (2 * 0.5e9) / 25e9 * 1000
### END SOLUTION

# %%
checks.check_number("practice_predicted_ms", practice_predicted_ms, 70.0, unit="ms", mistakes=[
    (40.0, "that sends the 1 GB of gradients once; in a ring all-reduce each rank sends "
           "2(D-1)/D x the bytes (reduce-scatter, then all-gather), 1.75 x for D = 8."),
    (35.0, "that counts only one of the ring's two halves (reduce-scatter or all-gather)."),
    (80.0, "that sends 2 x the bytes; the factor is 2(D-1)/D, 1.75 for D = 8."),
    (0.07, "that is the time in seconds; give it in milliseconds (1 s = 1000 ms)."),
    (140.0, "that counts 4 bytes per parameter; BF16 gradients take 2."),
    (560.0, "GB/s counts bytes: no factor 8 for bits."),
])
print("practice_predicted_ms: right")

# %% [markdown]
# **Graded**: predict the time one ring all-reduce of run B's gradients takes: each rank sends
# 2(D-1)/D x `GRAD_BYTES` at `BUS_GB_PER_S`. Assign the prediction **in milliseconds** to
# `q6_predicted_ms`. (Compare it with run B's measured wait: if they are close, more bandwidth or
# fewer bytes is the fix, not a faster GPU.)

# %% [answer q6]
### BEGIN SOLUTION
q6_predicted_ms = 2 * (D - 1) / D * GRAD_BYTES / (BUS_GB_PER_S * 1e9) * 1000
### END SOLUTION

# %% [test q6_test points=2]
checks.check_number("q6_predicted_ms", q6_predicted_ms, unit="ms", variant=G.key("job"),
                    mistakes=[
    (GRAD_BYTES / (BUS_GB_PER_S * 1e9) * 1000,
     "that sends GRAD_BYTES once; each rank of a ring all-reduce sends 2(D-1)/D x GRAD_BYTES."),
    (2 * GRAD_BYTES / (BUS_GB_PER_S * 1e9) * 1000,
     "that sends 2 x GRAD_BYTES; the factor of a ring all-reduce is 2(D-1)/D, not 2."),
])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q6_predicted_ms", q6_predicted_ms)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q7. Time the wait yourself, on real ranks (4 points)
#
# Write `timed_mean_allreduce(tensor, world_size)`. On every rank it must
#
# 1. replace `tensor` **in place** with the mean of all ranks' tensors (use `dist.all_reduce`,
#    whose default operation is a sum), and
# 2. return the **seconds spent inside the collective** as a plain `float`
#    (use `time.perf_counter()`).
#
# `perf_counter` around the call works here because the ranks are gloo processes on CPU:
# `dist.all_reduce` returns only when the mean is in place. With NCCL on GPUs the call returns
# once the collective is enqueued, so you would call `torch.cuda.synchronize()` before each
# clock reading (`course_utils.measure.clock(tensor)` does it) or time with CUDA events.
#
# The test cell runs your function on real ranks with `launch.run` (2 ranks with rank 1 late
# by 0.3 s, and 3 ranks on time), compares each rank's tensor with the mean computed in one
# process and checks the returned seconds: the on-time rank must report the extra waiting, the
# late rank less. Grading runs it on further cases.

# %% [answer q7]
def timed_mean_allreduce(tensor, world_size):
    """Average ``tensor`` over all ranks in place; return seconds spent inside the all-reduce."""
    ### BEGIN SOLUTION
    start = time.perf_counter()
    dist.all_reduce(tensor)             # sum over ranks, in place
    waited = time.perf_counter() - start
    tensor.div_(world_size)             # sum -> mean
    return float(waited)
    ### END SOLUTION

# %% [test q7_test points=4]
def _q7_worker(rank, world_size, late_rank, delay_s):
    """Each rank averages its own (2, 3) tensor; ``late_rank`` arrives ``delay_s`` late."""
    import time as _time

    import torch as _torch

    x = _torch.arange(6, dtype=_torch.float32).view(2, 3) * (rank + 1) ** 2 + 10 * rank  # (2, 3)
    if rank == late_rank:
        _time.sleep(delay_s)
    waited = timed_mean_allreduce(x, world_size)
    return {"x": x.tolist(), "waited": waited, "type": type(waited).__name__}


def _q7_visible(world_size, late_rank, delay_s):
    """Run the function on ``world_size`` real ranks and check every rank's tensor and seconds."""
    runs = launch.run(_q7_worker, world_size, late_rank, delay_s, timeout_s=50, show_output=False)
    mine = [torch.arange(6, dtype=torch.float32).view(2, 3) * (r + 1) ** 2 + 10 * r
            for r in range(world_size)]                                  # each rank's (2, 3)
    summed = torch.stack(mine).sum(dim=0)                                # (2, 3)
    case = f"{world_size} ranks"
    if late_rank >= 0:
        case += f", rank {late_rank} {delay_s} s late"
    for r, out in enumerate(runs):
        got = torch.tensor(out["x"], dtype=torch.float32)
        assert tuple(got.shape) == (2, 3), f"{case}, rank {r}: the tensor's shape changed"
        if torch.allclose(got, mine[r]):
            raise AssertionError(f"{case}, rank {r}: the tensor still holds this rank's own "
                                 "values. Change it in place (dist.all_reduce works in place; "
                                 "divide with tensor.div_), do not assign a new tensor to the "
                                 "name.")
        if torch.allclose(got, summed):
            raise AssertionError(f"{case}, rank {r}: the tensor holds the SUM over the ranks "
                                 "(all_reduce sums by default); the mean also divides by "
                                 "world_size.")
        if torch.allclose(got, summed / world_size ** 2):
            raise AssertionError(f"{case}, rank {r}: the sum was divided by world_size twice.")
        if world_size != 2 and torch.allclose(got, summed / 2):
            raise AssertionError(f"{case}, rank {r}: the sum was divided by 2, not by world_size.")
        torch.testing.assert_close(got, summed / world_size, msg=lambda m, r=r: (
            f"{case}, rank {r}: not the mean of the ranks' tensors. {m}"))
        checks.check_number(f"{case}, rank {r}: the returned seconds", out["waited"])
        assert out["type"] == "float", (f"{case}, rank {r}: returned a {out['type']}; return a "
                                        "plain float (float(...)).")
    if late_rank >= 0:
        early = [out["waited"] for r, out in enumerate(runs) if r != late_rank]
        assert min(early) >= 0.5 * delay_s, (
            f"{case}: an on-time rank reported {min(early):.3f} s, but it had to wait about "
            f"{delay_s} s for rank {late_rank}. Time only the collective: read perf_counter "
            "just before dist.all_reduce and just after it.")
        assert max(early) < 100 * delay_s, (f"{case}: {max(early):g} is far too long: return "
                                            "seconds, not milliseconds.")
        assert runs[late_rank]["waited"] < min(early), (
            f"{case}: the late rank reported a longer wait than the on-time ranks; it should be "
            "the shortest, since the others are already waiting inside the collective.")


_q7_visible(2, 1, 0.3)
_q7_visible(3, -1, 0.0)
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import hidden_cases, submit


def _q7_submit(number, world_size, late_rank, delay_s):
    """Run the student's function on real ranks; submit each rank's tensor, seconds and type."""
    runs = launch.run(_q7_worker, world_size, late_rank, delay_s, show_output=False, timeout_s=50)
    call = f"_q7_worker on hidden case {number}"
    for rank, out in enumerate(runs):
        submit(f"{call} rank {rank}: tensor", torch.tensor(out["x"]))
        submit(f"{call} rank {rank}: seconds", out["waited"])
        submit(f"{call} rank {rank}: type", out["type"])


for _number, _case in enumerate(hidden_cases("q7_test"), 1):  # drawn per submission
    _q7_submit(_number, *_case)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q8. Add ranks to run B? (3 points, graded by hand)
#
# The team behind run B proposes going from D = 4 to D = 8 ranks with the same per-rank batch,
# to train faster. Using the measurements and the 2(D-1)/D formula: what happens to the bytes
# each rank sends per step, to the wait, and to the throughput? Would you expect a 2x speed-up?
# Name two changes that would attack run B's actual bottleneck, and say what you would measure
# to check that they worked.

# %% [manual q8_explain points=3]
# ### BEGIN SOLUTION
# (Written for the base numbers, 1.4B parameters at 16 GB/s; a student's own job, in their
# table, scales the bytes and the wait: the reasoning and the rubric are the same.)
# Each rank sends 2(D-1)/D x GRAD_BYTES: 1.5 x 2.8 GB = 4.2 GB at D = 4, 1.75 x 2.8 GB = 4.9 GB
# at D = 8, so at the same bus bandwidth the wait grows from about 262 ms to about 306 ms (more
# if the extra ranks sit on a slower link). Compute per rank stays about 140 ms, so the step
# becomes about 450 ms instead of 412 ms while the global batch doubles: throughput rises by
# roughly 2 x 412 / 450 = 1.8x, not 2x, and the run stays communication-bound (about 68% of
# each step waiting). Fixes that attack the bottleneck: overlap the all-reduce with backward
# (bucketed DDP-style reduction, so the wait hides behind compute), accumulate gradients over
# several micro-batches before each all-reduce (fewer bytes per token), a larger per-rank batch
# (memory allows it: 38 of 80 GB), compressing or reducing in lower precision, or placing ranks
# on faster links. To check: per-rank wait time and wait fraction, step time and global
# tokens/s, the achieved bus bandwidth, and again that loss and gradients still match a
# single-process run after the change.
#
# **Rubric** (3 points):
# * 1 point: says the bytes each rank sends grow from 1.5 x 2.8 GB = 4.2 GB to 1.75 x 2.8 GB =
#   4.9 GB (they do not shrink with more ranks), so the wait grows from about 262 ms (measured
#   270 ms) to about 306 ms at 16 GB/s (or 270 x 1.75 / 1.5 = 315 ms), more on slower links.
# * 1 point: says compute stays about 140 ms per rank, so the step grows to about 450 ms while
#   the global batch doubles: throughput rises about 2 x 412 / 450 = 1.8x (1.8x to 1.85x
#   accepted), not 2x, and run B stays communication-bound (about two thirds of each step
#   waiting).
# * 1 point: names two changes that attack the communication (overlap the all-reduce with
#   backward through bucketing, gradient accumulation or a larger per-rank batch since 38 of
#   80 GB is used, gradients compressed below BF16, faster links) and what to measure
#   to check them: per-rank wait time or wait fraction, step time, global tokens/s, or the
#   achieved bus bandwidth.
# * 0 points: expects a 2x speed-up (the bytes per rank said to stay the same or shrink) and
#   names only fixes for the other runs' problems (run A's straggler: data loader; run C's
#   memory pressure: allocator, activation checkpointing), which do not fit run B's balanced
#   ranks at 38 of 80 GB.
# ### END SOLUTION

# %% [markdown]
# ## Submitting
#
# Save the notebook, then hand in this file itself, **`a7_measuring.ipynb`**, with its name
# unchanged (in `make lab` it is `workspace/assignments/a7_measuring/a7_measuring.ipynb`), the way your
# instructor asks. Outputs may be cleared (*Edit > Clear Outputs of All Cells*): your instructor
# runs the whole notebook again, from the top, in a fresh kernel, to grade it, so first check
# that *Kernel > Restart Kernel and Run All Cells* meets no `NameError` (a check that names a
# mistake stops *Run All* where it is; grading runs every cell anyway). Learning on your own with
# the full repository? `make check A=a7_measuring` grades your copy the same way.

# %% [markdown]
# # Assignment 7: reading the measurements of a real run
#
# Lecture 7 verified a data-parallel run against one process, then measured its step time,
# throughput, memory and the time its ranks spent waiting inside collectives. Here you read such
# measurements and decide what limits each run.
#
# Answer each question by assigning the named variable in its answer cell (delete the
# `raise NotImplementedError()` line). Run each test cell after your answer: a failed check says
# what went wrong. More checks run when the assignment is graded.
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

# %%
import time

import torch
import torch.distributed as dist

from course_utils import checks, launch

_ = launch.run(lambda rank, world_size: None, 2, timeout_s=55)  # start the rank launcher once

# %% [markdown]
# ## The measurements
#
# Three data-parallel runs of the same 1.4B-parameter model on D = 4 GPUs with 80 GB each.
# Each rank processes `BATCH_PER_RANK` sequences of `SEQ_LEN` tokens per step. Gradients are
# all-reduced in BF16 (2 bytes per parameter) at a measured bus bandwidth of `BUS_GB_PER_S`
# GB/s per rank. Every list has one entry per rank (rank 0 first): means over 50 steps after a
# warm-up. The ranks synchronize at every step, so all ranks of a run share one step time.

# %%
D = 4
N_PARAMS = 1.4e9
GRAD_BYTES = 2 * N_PARAMS        # BF16 gradients
BUS_GB_PER_S = 16.0              # GB/s (10**9 bytes/s) sent per rank
DEVICE_GB = 80.0
BATCH_PER_RANK = 16              # sequences per rank per step
SEQ_LEN = 1024                   # tokens per sequence

RUN_A = {"step_ms": 412.0,
         "compute_ms": [250.0, 252.0, 398.0, 249.0],   # data + forward + backward + optimizer
         "wait_ms": [160.0, 158.0, 12.0, 161.0],
         "peak_gb": [51.2, 51.3, 51.9, 51.2],
         "alloc_retries": [0, 0, 0, 0]}
RUN_B = {"step_ms": 412.0,
         "compute_ms": [140.0, 141.0, 139.0, 140.0],
         "wait_ms": [270.0, 269.0, 271.0, 270.0],
         "peak_gb": [38.4, 38.5, 38.4, 38.6],
         "alloc_retries": [0, 0, 0, 0]}
RUN_C = {"step_ms": 412.0,
         "compute_ms": [384.0, 385.0, 383.0, 384.0],
         "wait_ms": [26.0, 25.0, 27.0, 26.0],
         "peak_gb": [79.2, 79.4, 79.1, 79.3],
         "alloc_retries": [37, 41, 35, 39]}

# %% [markdown]
# ## Q1. Verify first (2 points)
#
# Before any of these runs was timed, one step was compared with a single process on the same
# global batch. In run A the gradient norm on every rank came out **4.0 times** the
# single-process gradient norm, with the same direction (cosine 1.0), and the same loss.
# Which is it? Assign one of these strings to `q1_diagnosis`:
#
# `"correct"`, `"summed, not averaged"`, `"averaged twice"`, `"ranks saw the same data"`

# %% [answer q1]
### BEGIN SOLUTION
q1_diagnosis = "summed, not averaged"
### END SOLUTION

# %% [test q1_test points=2]
Q1_CHOICES = ["correct", "summed, not averaged", "averaged twice", "ranks saw the same data"]
checks.check_choice("q1_diagnosis", q1_diagnosis, None, Q1_CHOICES)
### BEGIN HIDDEN TESTS
checks.check_choice("q1_diagnosis", q1_diagnosis, "summed, not averaged", Q1_CHOICES, mistakes={
    "correct": "a correct reduction gives the single-process gradient exactly (ratio 1.0). "
               "Equal losses do not prove the gradients are right: the logged loss does not "
               "depend on how gradients are reduced.",
    "averaged twice": "dividing by D twice would make the norm 1/D = 0.25 times the "
                      "reference, not 4 times.",
    "ranks saw the same data": "duplicated data changes the gradient's direction (it is the "
                               "mean over fewer distinct examples), not its length by exactly "
                               "D = 4; here the cosine is 1.0 and the ratio equals D.",
})
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q2. Throughput (2 points)
#
# How many **tokens per second** does run A process, all ranks together? Assign it to
# `q2_tokens_per_s`.

# %% [answer q2]
### BEGIN SOLUTION
q2_tokens_per_s = BATCH_PER_RANK * D * SEQ_LEN / (RUN_A["step_ms"] / 1000)
### END SOLUTION

# %% [test q2_test points=2]
checks.check_number("q2_tokens_per_s", q2_tokens_per_s)
### BEGIN HIDDEN TESTS
_tokens = 16 * 4 * 1024
checks.check_number("q2_tokens_per_s", q2_tokens_per_s, _tokens / 0.412, unit="tokens/s",
                    mistakes=[
    (_tokens / 4 / 0.412, "that is one rank's throughput: the global batch is BATCH_PER_RANK x "
                          "D sequences per step."),
    (_tokens / 412, "that divides by milliseconds: convert the step time to seconds."),
    (16 * 4 / 0.412, "that counts sequences per second; multiply by SEQ_LEN tokens per sequence."),
    (_tokens / (0.412 - 0.160), "the step time includes the wait: throughput is tokens per "
                                "wall-clock step, waiting included."),
    (_tokens / (0.412 * 4), "dividing by D again: the D ranks run at the same time, so their "
                            "tokens add up within one step time."),
])
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q3. Fraction of the step spent waiting (2 points)
#
# (a) What fraction of each step does **rank 0** of run A spend waiting? Assign a number
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
checks.check_number("q3a_rank0_fraction", q3a_rank0_fraction)
checks.check_number("q3b_cluster_fraction", q3b_cluster_fraction)
### BEGIN HIDDEN TESTS
checks.check_number("q3a_rank0_fraction", q3a_rank0_fraction, 160 / 412, mistakes=[
    (100 * 160 / 412, "that is a percentage; give a fraction between 0 and 1."),
    (160 / 250, "that divides by the compute time; the question asks for a fraction of the "
                "whole step."),
    (12 / 412, "that is rank 2's wait (the list is in rank order, rank 0 first)."),
    (491 / 4 / 412, "that is the mean over ranks; part (a) asks about rank 0 only."),
])
checks.check_number("q3b_cluster_fraction", q3b_cluster_fraction, 491 / (4 * 412), mistakes=[
    (100 * 491 / (4 * 412), "that is a percentage; give a fraction between 0 and 1."),
    (491 / 412, "that adds the waits of 4 ranks but compares them with one rank's step: divide "
                "by D x step time."),
    (160 / 412, "that is rank 0 alone; average the wait over all ranks."),
    (161 / 412, "that is the largest wait; average the wait over all ranks."),
])
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q4. Diagnose the three runs (3 points)
#
# For each run assign one of `"straggler"`, `"communication-bound"`, `"memory-bound"`,
# `"healthy"` to `q4_run_a`, `q4_run_b`, `q4_run_c`.

# %% [answer q4]
### BEGIN SOLUTION
q4_run_a = "straggler"
q4_run_b = "communication-bound"
q4_run_c = "memory-bound"
### END SOLUTION

# %% [test q4_test points=3]
Q4_CHOICES = ["straggler", "communication-bound", "memory-bound", "healthy"]
for _name in ("q4_run_a", "q4_run_b", "q4_run_c"):
    checks.check_choice(_name, globals()[_name], None, Q4_CHOICES)
### BEGIN HIDDEN TESTS
checks.check_choice("q4_run_a", q4_run_a, "straggler", Q4_CHOICES, mistakes={
    "communication-bound": "if moving bytes were the problem, every rank would wait about as "
                           "long; here rank 2 waits 12 ms and the others about 160 ms. Ranks "
                           "that wait long are waiting for a slow peer.",
    "memory-bound": "peak memory is about 51 of 80 GB and the allocator never retried.",
    "healthy": "three ranks spend almost 40% of every step waiting for one rank.",
})
checks.check_choice("q4_run_b", q4_run_b, "communication-bound", Q4_CHOICES, mistakes={
    "straggler": "a straggler shows as one rank that waits much less than the others; here "
                 "all four wait about 270 ms, about as long as sending the gradients takes "
                 "(see Q6).",
    "memory-bound": "peak memory is about 38 of 80 GB.",
    "healthy": "two thirds of every step is spent inside the all-reduce.",
})
checks.check_choice("q4_run_c", q4_run_c, "memory-bound", Q4_CHOICES, mistakes={
    "healthy": "look at memory: the peak is within 1 GB of the 80 GB device and the allocator "
               "retried dozens of times (it had to free cached blocks and try again).",
    "straggler": "the ranks' compute and wait times are all about equal.",
    "communication-bound": "the wait is only about 6% of the step.",
})
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q5. Which rank is the straggler? (1 point)
#
# In run A, which rank is slow? Assign its number to `q5_straggler_rank`.

# %% [answer q5]
### BEGIN SOLUTION
q5_straggler_rank = 2
### END SOLUTION

# %% [test q5_test points=1]
checks.check_number("q5_straggler_rank", q5_straggler_rank)
### BEGIN HIDDEN TESTS
checks.check_number("q5_straggler_rank", q5_straggler_rank, 2, mistakes=[
    (3, "rank 3 waits the longest: it is a victim, waiting for the slow rank. The straggler "
        "is the rank that waits least, because everyone else is already there when it arrives."),
    (0, "rank 0 waits about 160 ms: it is waiting for the slow rank, not causing the wait."),
    (1, "rank 1 waits about 158 ms: it is waiting for the slow rank, not causing the wait."),
])
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q6. Is run B's wait explained by the bytes? (2 points)
#
# Predict the time one ring all-reduce of run B's gradients takes: each rank sends
# 2(D-1)/D x `GRAD_BYTES` at `BUS_GB_PER_S`. Assign the prediction **in milliseconds** to
# `q6_predicted_ms`. (Compare it with run B's measured wait: if they are close, more bandwidth or
# fewer bytes is the fix, not a faster GPU.)

# %% [answer q6]
### BEGIN SOLUTION
q6_predicted_ms = 2 * (D - 1) / D * GRAD_BYTES / (BUS_GB_PER_S * 1e9) * 1000
### END SOLUTION

# %% [test q6_test points=2]
checks.check_number("q6_predicted_ms", q6_predicted_ms)
### BEGIN HIDDEN TESTS
checks.check_number("q6_predicted_ms", q6_predicted_ms, 262.5, unit="ms", mistakes=[
    (175.0, "that sends GRAD_BYTES once; a ring all-reduce sends (D-1)/D x bytes in its "
            "reduce-scatter half and as much again in its all-gather half: 2(D-1)/D x bytes."),
    (131.25, "that is only one half of the ring (reduce-scatter or all-gather): the full "
             "all-reduce sends 2(D-1)/D x bytes."),
    (350.0, "that uses 2 x bytes; each rank sends 2(D-1)/D x bytes, which is 1.5 x for D = 4."),
    (0.2625, "that is in seconds; the question asks for milliseconds."),
    (525.0, "that uses 4 bytes per parameter; the gradients are all-reduced in BF16 "
            "(GRAD_BYTES = 2 x N_PARAMS)."),
    (2100.0, "GB/s are bytes, not bits: do not multiply by 8."),
])
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
# The tests run your function on 2 and 3 real ranks with `launch.run`, compare the result with
# the mean computed in one process, and make one rank late on purpose: the on-time ranks must
# report the extra waiting.

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


_runs = launch.run(_q7_worker, 2, -1, 0.0, timeout_s=50, show_output=False)
for _r, _out in enumerate(_runs):
    checks.check_number(f"rank {_r}: the returned seconds", _out["waited"])
    assert len(_out["x"]) == 2 and len(_out["x"][0]) == 3, "the tensor must keep its shape (2, 3)"
### BEGIN HIDDEN TESTS
def _q7_check(world_size, late_rank, delay_s):
    runs = launch.run(_q7_worker, world_size, late_rank, delay_s, show_output=False, timeout_s=50)
    inputs = [torch.arange(6, dtype=torch.float32).view(2, 3) * (r + 1) ** 2 + 10 * r
              for r in range(world_size)]                              # each (2, 3)
    total = torch.stack(inputs).sum(dim=0)                             # (2, 3), one process
    expected = total / world_size
    for rank, out in enumerate(runs):
        got = torch.tensor(out["x"])
        if torch.allclose(got, inputs[rank]):
            raise AssertionError(f"rank {rank}: the tensor is unchanged. Update it in place "
                                 "(dist.all_reduce(tensor) and tensor.div_(...)), do not "
                                 "rebind the name to a new tensor.")
        if torch.allclose(got, total):
            raise AssertionError("the result is the SUM over ranks: divide by world_size to "
                                 "get the mean.")
        if torch.allclose(got, total / world_size ** 2):
            raise AssertionError("the result is divided by world_size twice.")
        if world_size != 2 and torch.allclose(got, total / 2):
            raise AssertionError("the result is divided by 2 whatever the number of ranks: "
                                 "use world_size.")
        torch.testing.assert_close(got, expected, msg=lambda m, rank=rank: (
            f"rank {rank}: the result differs from the mean computed in one process. {m}"))
        checks.as_number(f"rank {rank}: the returned seconds", out["waited"])
        if out["type"] != "float":
            raise AssertionError(f"return a plain float (got {out['type']}); "
                                 "use float(...) or .item()")
    if late_rank >= 0:
        on_time = [out["waited"] for r, out in enumerate(runs) if r != late_rank]
        if min(on_time) < 0.5 * delay_s:
            raise AssertionError(
                f"rank {late_rank} arrived {delay_s} s late, yet an on-time rank reported only "
                f"{min(on_time):.3f} s: start the timer just before dist.all_reduce and stop it "
                "right after, so the time spent blocked inside the collective is counted.")
        if max(on_time) > 20 * delay_s + 5:
            raise AssertionError("the reported seconds are far too large: return seconds "
                                 "(time.perf_counter() differences), not milliseconds.")
        if not runs[late_rank]["waited"] < min(on_time):
            raise AssertionError("the late rank should wait least: the others are already "
                                 "inside the collective when it arrives.")


_q7_check(2, -1, 0.0)
_q7_check(3, 1, 0.4)
_q7_check(2, 0, 0.4)
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
# ### END SOLUTION

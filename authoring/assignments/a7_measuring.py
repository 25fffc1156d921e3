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
from course_utils.checks import submit

submit("q1_diagnosis", q1_diagnosis)
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
from course_utils.checks import submit

submit("q2_tokens_per_s", q2_tokens_per_s)
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
from course_utils.checks import submit

submit("q3a_rank0_fraction", q3a_rank0_fraction)
submit("q3b_cluster_fraction", q3b_cluster_fraction)
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
from course_utils.checks import submit

submit("q4_run_a", q4_run_a)
submit("q4_run_b", q4_run_b)
submit("q4_run_c", q4_run_c)
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
from course_utils.checks import submit

submit("q5_straggler_rank", q5_straggler_rank)
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
from course_utils.checks import submit

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
from course_utils.checks import submit


def _q7_submit(world_size, late_rank, delay_s):
    """Run the student's function on real ranks; submit each rank's tensor, seconds and type."""
    runs = launch.run(_q7_worker, world_size, late_rank, delay_s, show_output=False, timeout_s=50)
    call = f"_q7_worker(world_size={world_size}, late_rank={late_rank}, delay_s={delay_s:g})"
    for rank, out in enumerate(runs):
        submit(f"{call} rank {rank}: tensor", torch.tensor(out["x"]))
        submit(f"{call} rank {rank}: seconds", out["waited"])
        submit(f"{call} rank {rank}: type", out["type"])


_q7_submit(2, -1, 0.0)
_q7_submit(3, 1, 0.4)
_q7_submit(2, 0, 0.4)
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

# %% [markdown]
# # Assignment 5: Pipeline parallelism
#
# Lecture 5 simulated, drew and measured the pipeline bubble. In this assignment you compute
# bubbles and batch sizes yourself, read timelines, and write a pipeline step that the tests run
# on real gloo ranks and compare with one process.
#
# **Notation** (as in the lecture): **P** stages, one per rank; **m** microbatches per optimizer
# step; the *bubble fraction* is the share of total time a rank is idle; the *bubble ratio* is
# idle time divided by useful compute time. Assume balanced stages and free communication
# unless a question says otherwise.
#
# Answer in the cells marked `YOUR CODE HERE`, then run the test cell below each one. Visible
# tests check types; hidden tests check the values when the assignment is graded.

# %%
import math

import torch
import torch.distributed as dist

from course_utils import checks, launch

# %% [markdown]
# ## Q1. Bubble fractions (2 points)
#
# Give each answer as a float between 0 and 1 (not a percentage).
#
# * `bubble_p8_m24`: the bubble fraction of GPipe with P = 8 stages and m = 24 microbatches.
# * `bubble_p4_m4`: the bubble fraction of 1F1B with P = 4 and m = 4.
# * `bubble_interleaved`: interleaved 1F1B with P = 4, m = 8 and v = 2 chunks per rank.

# %% [answer q1]
### BEGIN SOLUTION
bubble_p8_m24 = (8 - 1) / (24 + 8 - 1)
bubble_p4_m4 = (4 - 1) / (4 + 4 - 1)
bubble_interleaved = (4 - 1) / (2 * 8 + 4 - 1)
### END SOLUTION

# %% [test q1_test points=2]
for name in ("bubble_p8_m24", "bubble_p4_m4", "bubble_interleaved"):
    checks.check_number(name, globals()[name])
    assert 0 <= globals()[name] < 1, f"{name} should be a fraction between 0 and 1"
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

submit("bubble_p8_m24", bubble_p8_m24)
submit("bubble_p4_m4", bubble_p4_m4)
submit("bubble_interleaved", bubble_interleaved)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q2. How many microbatches? (2 points)
#
# Give ints.
#
# * `m_p4_10pct`: the smallest m for which a balanced P = 4 pipeline has a bubble fraction of at
#   most 10 %.
# * `m_p8_5pct`: the smallest m for which P = 8 has a bubble fraction of at most 5 %.

# %% [answer q2]
### BEGIN SOLUTION
def smallest_m(p, target):
    m = 1
    while (p - 1) / (m + p - 1) > target:
        m += 1
    return m


m_p4_10pct = smallest_m(4, 0.10)
m_p8_5pct = smallest_m(8, 0.05)
### END SOLUTION

# %% [test q2_test points=2]
for name in ("m_p4_10pct", "m_p8_5pct"):
    assert type(globals()[name]) is int, f"{name} should be an int, got {type(globals()[name]).__name__}"
    checks.check_number(name, globals()[name])
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

submit("m_p4_10pct", m_p4_10pct)
submit("m_p8_5pct", m_p8_5pct)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q3. Effective batch sizes (2 points)
#
# The effective batch is the number of examples one optimizer step learns from. Give ints.
#
# * `batch_a`: a 32-device mesh with TP = 4, PP = 2, DP = 4. Each microbatch has 2 examples and
#   each replica accumulates gradients over 16 microbatches before its optimizer step.
# * `batch_b`: a 64-device mesh with TP = 8, PP = 4, DP = 2. Each pipeline step pushes m = 8
#   microbatches of 4 examples through the pipeline, and the optimizer steps once per pipeline
#   step (no further accumulation).

# %% [answer q3]
### BEGIN SOLUTION
batch_a = 2 * 16 * 4
batch_b = 4 * 8 * 2
### END SOLUTION

# %% [test q3_test points=2]
for name in ("batch_a", "batch_b"):
    assert type(globals()[name]) is int, f"{name} should be an int, got {type(globals()[name]).__name__}"
    checks.check_number(name, globals()[name])
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

submit("batch_a", batch_a)
submit("batch_b", batch_b)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q4. Read the timeline (2 points)
#
# Each chart shows one optimizer step of a P = 4 pipeline with m = 8 microbatches, one row per
# rank and one column per time unit. `F3` is the forward of microbatch 3 and `B3` its backward.
# A trailing letter names a chunk of layers (`F3a` = chunk 0, `F3b` = chunk 1), and `.` is idle.
#
# ```
# Timeline A
# rank 0 | F0 F1 F2 F3 .  .  .  B0 F4 B1 F5 B2 F6 B3 F7 B4 .  B5 .  B6 .  B7
# rank 1 | .  F0 F1 F2 .  .  B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 .  B6 .  B7 .
# rank 2 | .  .  F0 F1 .  B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 .  B7 .  .
# rank 3 | .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 .  .  .
#
# Timeline B
# rank 0 | F0 F1 F2 F3 F4 F5 F6 F7 .  .  .  .  .  .  B0 B1 B2 B3 B4 B5 B6 B7
# rank 1 | .  F0 F1 F2 F3 F4 F5 F6 F7 .  .  .  .  B0 B1 B2 B3 B4 B5 B6 B7 .
# rank 2 | .  .  F0 F1 F2 F3 F4 F5 F6 F7 .  .  B0 B1 B2 B3 B4 B5 B6 B7 .  .
# rank 3 | .  .  .  F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7 .  .  .
#
# Timeline C (each chunk takes half a time unit; one column = half a unit)
# rank 0 | F0a F1a F2a F3a F0b F1b F2b F3b F4a F5a F6a B0b F7a B1b .   .   F4b B2b F5b B3b F6b B0a F7b B1a B2a B3a .   B4b .   B5b .   B6b .   B7b B4a B5a B6a B7a
# rank 1 | .   F0a F1a F2a F3a F0b F1b F2b F3b F4a B0b F5a B1b F6a B2b F7a B3b F4b B0a F5b B1a F6b B2a F7b B3a .   B4b .   B5b .   B6b .   B7b B4a B5a B6a B7a .
# rank 2 | .   .   F0a F1a F2a F3a F0b F1b F2b B0b F3b B1b F4a B2b F5a B3b F6a B0a F7a B1a F4b B2a F5b B3a F6b B4b F7b B5b .   B6b .   B7b B4a B5a B6a B7a .   .
# rank 3 | .   .   .   F0a F1a F2a F3a F0b B0b F1b B1b F2b B2b F3b B3b F4a B0a F5a B1a F6a B2a F7a B3a F4b B4b F5b B5b F6b B6b F7b B7b B4a B5a B6a B7a .   .   .
# ```
#
# * `schedule_a`, `schedule_b`, `schedule_c`: each one of `"gpipe"`, `"1f1b"`, `"interleaved"`.
# * `peak_a_rank0`, `peak_b_rank0`: ints, the largest number of microbatches whose activations
#   rank 0 holds at once (forward started, backward not yet finished) in timelines A and B.

# %% [answer q4]
### BEGIN SOLUTION
schedule_a = "1f1b"
schedule_b = "gpipe"
schedule_c = "interleaved"
peak_a_rank0 = 4
peak_b_rank0 = 8
### END SOLUTION

# %% [test q4_test points=2]
SCHEDULES = ["gpipe", "1f1b", "interleaved"]
for name in ("schedule_a", "schedule_b", "schedule_c"):
    value = globals()[name]
    assert type(value) is str and value.lower() in SCHEDULES, f"{name} should be one of {SCHEDULES}, got {value!r}"
for name in ("peak_a_rank0", "peak_b_rank0"):
    checks.check_number(name, globals()[name])
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

submit("schedule_a", schedule_a)
submit("schedule_b", schedule_b)
submit("schedule_c", schedule_c)
submit("peak_a_rank0", peak_a_rank0)
submit("peak_b_rank0", peak_b_rank0)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q5. A pipeline step on real ranks (4 points)
#
# Write `pipeline_step(stage, pp_rank, pp_size, x_mbs, y_mbs)`, which every rank of a pipeline
# runs. It is one GPipe step: all forwards, then all backwards.
#
# * `stage`: this rank's `nn.Module` (stage `pp_rank` of `pp_size` consecutive stages).
# * `x_mbs`, `y_mbs`: lists of microbatches, the same on every rank. Microbatch `i` has inputs
#   `x_mbs[i]` and targets `y_mbs[i]`, both of shape `(n_i, width)`. **The sizes n_i may
#   differ.** Every activation crossing a stage boundary for microbatch `i` has the same shape
#   as `x_mbs[i]`.
# * Rank 0 feeds `x_mbs[i]` to its stage. Every other rank receives its input from
#   `pp_rank - 1`. Every rank except the last sends its output to `pp_rank + 1`. The last rank
#   computes the loss.
# * The loss must equal `torch.nn.functional.mse_loss(model(x), y)` on the **whole batch**
#   (the mean over every example), and after your backward pass each stage's parameter `.grad`
#   must equal that loss's gradient. Think about how to weight each microbatch's loss.
# * In the backward pass, the last rank backpropagates its loss. Every other rank receives the
#   gradient of its output from `pp_rank + 1`. Every rank except rank 0 sends the gradient of its
#   input to `pp_rank - 1`.
# * Return the loss as a Python float on the last rank, and `None` on the others.
#
# Use `dist.send`/`dist.recv` or `dist.isend`/`dist.irecv` (if you use `isend`, keep the
# returned work objects and call `.wait()` on them before returning). The tests run your
# function on 2 and 3 real ranks and compare with one process.

# %% [answer q5]
def pipeline_step(stage, pp_rank, pp_size, x_mbs, y_mbs):
    """One GPipe step on this rank; returns the whole-batch loss (float) on the last rank."""
    ### BEGIN SOLUTION
    n_total = sum(len(x) for x in x_mbs)
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    inputs, outputs, sends = [], [], []
    total = 0.0
    for x_mb, y_mb in zip(x_mbs, y_mbs):
        x = x_mb
        if not first:
            x = torch.empty(x_mb.shape)              # (n_i, width) from pp_rank - 1
            dist.recv(x, src=pp_rank - 1)
            x.requires_grad_(True)
        out = stage(x)                               # (n_i, width)
        if last:
            # weight each microbatch's mean by its share of the examples
            out = torch.nn.functional.mse_loss(out, y_mb) * (len(x_mb) / n_total)
            total += out.item()
        else:
            act = out.detach()
            sends.append((dist.isend(act, dst=pp_rank + 1), act))
        inputs.append(x)
        outputs.append(out)
    for i, x_mb in enumerate(x_mbs):
        grad = None
        if not last:
            grad = torch.empty(x_mb.shape)           # dLoss/d(output) from pp_rank + 1
            dist.recv(grad, src=pp_rank + 1)
        torch.autograd.backward(outputs[i], grad_tensors=grad)
        if not first:
            sends.append((dist.isend(inputs[i].grad, dst=pp_rank - 1), inputs[i].grad))
    for work, _ in sends:
        work.wait()
    return total if last else None
    ### END SOLUTION

# %% [test q5_test points=4]
import contextlib
import io

from course_utils import pipeline_parallel as pp_harness

with contextlib.redirect_stderr(io.StringIO()):
    runs = pp_harness.run_student_pipeline(pipeline_step, 2, 0, [3, 3], width=8, depth=4)
checks.check_number("loss on the last rank", runs[-1]["loss"])
assert runs[0]["loss"] is None, f"rank 0 should return None, got {runs[0]['loss']!r}"
for rank, run in enumerate(runs):
    assert all(g is not None for g in run["grads"]), (
        f"rank {rank}: some parameters of its stage have no .grad after your backward pass")
### BEGIN HIDDEN TESTS
from course_utils.checks import submit


def _q5_run(pp_size, seed, sizes):
    """Run the student's step on real ranks; hand each rank's loss and grads to the grader."""
    with contextlib.redirect_stderr(io.StringIO()) as _hidden_sink:
        runs = pp_harness.run_student_pipeline(pipeline_step, pp_size, seed, sizes,
                                               width=8, depth=6)
    case = f"pipeline_step(pp_size={pp_size}, seed={seed}, sizes={sizes})"
    submit(f"{case} losses", [run["loss"] for run in runs])
    submit(f"{case} grads", [run["grads"] for run in runs])


_q5_run(3, 2, [3, 3, 3, 3])  # equal sizes first: a missing 1/m shows up here
for seed in (0, 1):
    _q5_run(2, seed, [4, 3, 2, 1])
    _q5_run(3, seed, [1, 5, 2])
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q6. Choosing a schedule (2 points, graded by hand)
#
# A colleague's P = 8 pipeline runs GPipe with m = 16 and runs out of activation memory. They
# propose switching to 1F1B "to shrink the bubble". In a few sentences: what does switching to
# 1F1B change and what does it leave the same, in bubble and in memory? What would interleaved
# 1F1B with v = 2 change, and what does it cost? And why might the bubble they measure on real
# hardware be larger than (P - 1)/(m + P - 1)?

# %% [manual q6_explain points=2]
# ### BEGIN SOLUTION
# 1F1B leaves the bubble unchanged: with balanced stages it is still (P-1)/(m+P-1) = 7/23, about
# 30 %. What it changes is memory. GPipe holds all m = 16 microbatches' activations on every
# stage, while 1F1B holds at most P - r (8 on rank 0) because it starts backwards early. So the
# switch fixes the memory problem, not the bubble. With the memory saved, they can raise m to
# shrink the bubble. Interleaved 1F1B with v = 2 gives each rank two chunks. That divides the
# fill/drain by v, to (P-1)/(v·m+P-1) = 7/39, about 18 %. The cost is v times as many
# boundary messages per microbatch, a little more activation memory during warm-up, and m must
# be a multiple of P. On real hardware each op also pays for send/recv latency and
# synchronisation. Stages are rarely perfectly balanced, and the slowest sets the pace. Smaller
# microbatches also run matmuls less efficiently. All of these add to the formula's idealized
# bubble.
# ### END SOLUTION

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
# Answer in the cells marked `YOUR CODE HERE`, then run the cell below each one.
#
# **What the cells check while you practise.** Q1 to Q4 and Q7 each start with a *practice*
# question (not graded) that asks the same reasoning with other numbers or another timeline;
# the cell after it checks your practice answer fully: it tells you whether it is right and,
# for a known wrong answer, names the misconception. The visible test of each graded answer
# checks its type and rejects some known wrong values (naming the misconception), but it never
# tells you the right value: passing it does not mean your answer is right. Q5's visible test
# runs your `pipeline_step` on two small practice cases on real ranks and compares the loss and
# every gradient with one process.
#
# **What grading adds.** Hidden tests check the values of your graded answers, and run Q5 on
# further cases (other seeds, microbatch sizes and pipeline depths).
#
# **Work the answers out yourself.** Some `course_utils` helpers compute a graded answer
# outright (here, for example, `pipeline_schedule.bubble_fraction`). An answer that uses one is
# flagged for your instructor: the questions ask for the reasoning those helpers do.

# %%
import math

import torch
import torch.distributed as dist

from course_utils import launch
from course_utils.assess import checks, variants

G = variants.givens("a5_pipeline", on=True)  # your numbers (do not edit this cell)
G

# %% [markdown]
# ## Q1. Bubble fractions (2 points)
#
# Give each answer as a float between 0 and 1 (not a percentage).
#
# *Practice (not graded)*: the same questions with other numbers.
#
# * `practice_bubble_gpipe`: the bubble fraction of GPipe with P = 6 stages and m = 10
#   microbatches.
# * `practice_bubble_1f1b`: the bubble fraction of 1F1B with P = 5 and m = 10.
# * `practice_bubble_interleaved`: interleaved 1F1B with P = 6, m = 12 and v = 3 chunks per rank.

# %% [answer q1_practice]
### BEGIN SOLUTION
practice_bubble_gpipe = (6 - 1) / (10 + 6 - 1)
practice_bubble_1f1b = (5 - 1) / (10 + 5 - 1)
practice_bubble_interleaved = (6 - 1) / (3 * 12 + 6 - 1)
### END SOLUTION

# %%
checks.check_number("practice_bubble_gpipe", practice_bubble_gpipe, 5 / 15, mistakes=[
    (5 / 10, "that is the ratio (P-1)/m = 5/10, idle time over compute time; the fraction "
             "divides the 5 idle slots by all m + P - 1 = 15 slots of the step"),
    (6 / 16, "a rank is idle for P - 1 = 5 slots (fill plus drain), not P = 6"),
    (6 / 10, "P/m counts one idle slot too many and leaves the idle slots out of the total")])
checks.check_number("practice_bubble_1f1b", practice_bubble_1f1b, 4 / 14, mistakes=[
    (0, "1F1B still fills and drains the pipeline: it reorders the ops, the P - 1 idle slots "
        "stay"),
    (4 / 10, "that is the ratio (P-1)/m = 4/10; the fraction divides by all m + P - 1 = 14 "
             "slots"),
    (5 / 15, "a rank is idle for P - 1 = 4 slots, not P = 5")])
checks.check_number("practice_bubble_interleaved", practice_bubble_interleaved, 5 / 41, mistakes=[
    (5 / 17, "that is plain 1F1B (5/17): with v = 3 chunks per rank each fill/drain slot is "
             "a third as long, so count the step in chunk slots: v*m + P - 1 = 41"),
    (5 / 36, "that is the interleaved ratio (P-1)/(v*m) = 5/36; the fraction also counts the "
             "idle slots in the total: 5/41"),
    (5 / 51, "dividing plain 1F1B's fraction 5/17 by v shrinks the total too: only the fill "
             "and drain get shorter, 5/(v*m + P - 1)")])
print("practice Q1: all right")

# %% [markdown]
# Now the graded question, with your own numbers (the table at the top of the notebook):
#
# * `bubble_gpipe`: the bubble fraction of GPipe with `(P, m) = G.q1_gpipe` (P stages, m
#   microbatches).
# * `bubble_1f1b`: the bubble fraction of 1F1B with `(P, m) = G.q1_1f1b`.
# * `bubble_interleaved`: interleaved 1F1B with `(P, m, v) = G.q1_interleaved` (v chunks per
#   rank).

# %% [answer q1]
### BEGIN SOLUTION
p, m = G.q1_gpipe
bubble_gpipe = (p - 1) / (m + p - 1)
p, m = G.q1_1f1b
bubble_1f1b = (p - 1) / (m + p - 1)
p, m, v = G.q1_interleaved
bubble_interleaved = (p - 1) / (v * m + p - 1)
### END SOLUTION

# %% [test q1_test points=2]
for name in ("bubble_gpipe", "bubble_1f1b", "bubble_interleaved"):
    assert 0 <= checks.as_number(name, globals()[name]) < 1, (
        f"{name} should be a fraction between 0 and 1")
# known wrong values (the right one is checked when the assignment is graded)
_p, _m = G.q1_gpipe
checks.check_number("bubble_gpipe", bubble_gpipe, variant=G.key("q1_gpipe"), mistakes=[
    ((_p - 1) / _m, "that is the ratio (P-1)/m, idle time over compute time; the question asks "
                    "for the share of the whole step's time that a rank is idle")])
_p, _m = G.q1_1f1b
checks.check_number("bubble_1f1b", bubble_1f1b, variant=G.key("q1_1f1b"), mistakes=[
    (0, "1F1B reorders the forwards and backwards, but a rank still waits while the pipeline "
        "fills and drains"),
    ((_p - 1) / _m, "that is the ratio (P-1)/m; the question asks for a fraction of the total "
                    "time")])
_p, _m, _v = G.q1_interleaved
checks.check_number("bubble_interleaved", bubble_interleaved, variant=G.key("q1_interleaved"),
                    mistakes=[
    ((_p - 1) / (_m + _p - 1), "that is plain 1F1B with one chunk per rank; here each rank "
                               "holds v chunks"),
    ((_p - 1) / (_v * _m), "that is a ratio over the compute time; the question asks for a "
                           "fraction of the total time"),
    ((_p - 1) / (_m + _p - 1) / _v, "dividing plain 1F1B's fraction by v also divides the "
                                    "compute time in the total; only the fill and drain get "
                                    "shorter")])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("bubble_gpipe", bubble_gpipe)
submit("bubble_1f1b", bubble_1f1b)
submit("bubble_interleaved", bubble_interleaved)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q2. How many microbatches? (2 points)
#
# Give ints.
#
# *Practice (not graded)*:
#
# * `practice_m_p6_20pct`: the smallest m for which a balanced P = 6 pipeline has a bubble
#   fraction of at most 20 %.
# * `practice_m_p8_3pct`: the smallest m for which P = 8 has a bubble fraction of at most 3 %.

# %% [answer q2_practice]
### BEGIN SOLUTION
practice_m_p6_20pct = 1
while (6 - 1) / (practice_m_p6_20pct + 6 - 1) > 0.20:
    practice_m_p6_20pct += 1
practice_m_p8_3pct = 1
while (8 - 1) / (practice_m_p8_3pct + 8 - 1) > 0.03:
    practice_m_p8_3pct += 1
### END SOLUTION

# %%
for name, value in (("practice_m_p6_20pct", practice_m_p6_20pct), ("practice_m_p8_3pct", practice_m_p8_3pct)):
    assert type(value) is int, f"{name} should be an int, got {type(value).__name__}"
checks.check_number("practice_m_p6_20pct", practice_m_p6_20pct, 20, mistakes=[
    (25, "m = 25 makes the ratio 5/m equal 20 %; the fraction 5/(m + 5) gets there sooner"),
    (24, "the bubble is P - 1 = 5 slots, not P = 6"),
    (21, "'at most 20 %' includes exactly 20 %: 5/(20 + 5) is already enough")])
checks.check_number("practice_m_p8_3pct", practice_m_p8_3pct, 227, mistakes=[
    (226, "with m = 226 the fraction is 7/233, just above 3 %: round m up, not down"),
    (234, "m = 234 brings the ratio 7/m under 3 %; the fraction 7/(m + 7) gets there sooner"),
    (259, "the bubble is P - 1 = 7 slots, not P = 8")])
print("practice Q2: all right")

# %% [markdown]
# Now the graded question, with your own numbers (the table at the top):
#
# * `m_a`: the smallest m for which a balanced pipeline of P stages has a bubble fraction of at
#   most t, where `(P, t) = G.q2_a` (t a fraction: 0.08 means 8 %).
# * `m_b`: the same for `(P, t) = G.q2_b`.

# %% [answer q2]
### BEGIN SOLUTION
def smallest_m(p, target):
    m = 1
    while (p - 1) / (m + p - 1) > target:
        m += 1
    return m


m_a = smallest_m(*G.q2_a)
m_b = smallest_m(*G.q2_b)
### END SOLUTION

# %% [test q2_test points=2]
for name in ("m_a", "m_b"):
    assert type(globals()[name]) is int, f"{name} should be an int, got {type(globals()[name]).__name__}"
# known wrong values (the right one is checked when the assignment is graded)
for name, given in (("m_a", "q2_a"), ("m_b", "q2_b")):
    _p, _t = G[given]
    checks.check_number(name, globals()[name], variant=G.key(given), mistakes=[
        (min(m for m in range(1, 10_000) if (_p - 1) / m <= _t),
         "that m brings the ratio (P-1)/m down to the target; the question bounds the fraction "
         "of the total time"),
        (min(m for m in range(1, 10_000) if _p / (m + _p) <= _t),
         "that m counts P idle slots per rank; the fill and drain leave a rank idle one slot "
         "less")])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("m_a", m_a)
submit("m_b", m_b)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q3. Effective batch sizes (2 points)
#
# The effective batch is the number of examples one optimizer step learns from. Give ints.
#
# *Practice (not graded)*:
#
# * `practice_batch_a`: a 48-device mesh with TP = 2, PP = 3, DP = 8. Each microbatch has 4
#   examples and each replica accumulates gradients over 6 microbatches before its optimizer
#   step.
# * `practice_batch_b`: a 96-device mesh with TP = 4, PP = 6, DP = 4. Each pipeline step pushes
#   m = 12 microbatches of 3 examples through the pipeline, and the optimizer steps once per
#   pipeline step (no further accumulation).

# %% [answer q3_practice]
### BEGIN SOLUTION
practice_batch_a = 4 * 6 * 8
practice_batch_b = 3 * 12 * 4
### END SOLUTION

# %%
for name, value in (("practice_batch_a", practice_batch_a), ("practice_batch_b", practice_batch_b)):
    assert type(value) is int, f"{name} should be an int, got {type(value).__name__}"
checks.check_number("practice_batch_a", practice_batch_a, 192, mistakes=[
    (1152, "you multiplied by all 48 devices; only data-parallel replicas see different examples"),
    (384, "you multiplied by TP = 2: the two TP ranks of a stage split the layers of the same "
          "examples"),
    (576, "you multiplied by PP = 3: the three stages pass the same microbatches along"),
    (32, "the 6 accumulated microbatches all go into one optimizer step: count them"),
    (24, "the 8 DP replicas each take their own 24 examples: count all of them")])
checks.check_number("practice_batch_b", practice_batch_b, 144, mistakes=[
    (3456, "you multiplied by all 96 devices; only data-parallel replicas see different "
           "examples"),
    (576, "you multiplied by TP = 4: TP ranks work on the same examples"),
    (864, "you multiplied by PP = 6: the stages pass the same microbatches along"),
    (12, "the pipeline's m = 12 microbatches accumulate into one optimizer step: count them"),
    (36, "the 4 DP replicas each push their own 36 examples: count all of them")])
print("practice Q3: all right")

# %% [markdown]
# Now the graded question, with your own numbers (the table at the top):
#
# * `batch_a`: a mesh of TP x PP x DP devices, `(TP, PP, DP, b, k) = G.q3_a`. Each microbatch
#   has b examples and each replica accumulates gradients over k microbatches before its
#   optimizer step.
# * `batch_b`: a mesh of TP x PP x DP devices, `(TP, PP, DP, b, m) = G.q3_b`. Each pipeline
#   step pushes m microbatches of b examples through the pipeline, and the optimizer steps once
#   per pipeline step (no further accumulation).

# %% [answer q3]
### BEGIN SOLUTION
tp, pp, dp, b, k = G.q3_a
batch_a = b * k * dp
tp, pp, dp, b, m = G.q3_b
batch_b = b * m * dp
### END SOLUTION

# %% [test q3_test points=2]
for name in ("batch_a", "batch_b"):
    assert type(globals()[name]) is int, f"{name} should be an int, got {type(globals()[name]).__name__}"
    checks.check_number(name, globals()[name])
# known wrong values (the right one is checked when the assignment is graded)
for name, given in (("batch_a", "q3_a"), ("batch_b", "q3_b")):
    _tp, _pp, _dp, _b, _k = G[given]
    checks.check_number(name, globals()[name], variant=G.key(given), mistakes=[
        (_b * _k * _tp * _pp * _dp, "you multiplied by all the devices of the mesh; ask which "
                                    "ranks see examples that the others do not")])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("batch_a", batch_a)
submit("batch_b", batch_b)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q4. Read the timeline (2 points)
#
# Each chart shows one optimizer step of a pipeline, one row per rank and one column per time
# unit. `F3` is the forward of microbatch 3 and `B3` its backward. A trailing letter names a
# chunk of layers (`F3a` = chunk 0, `F3b` = chunk 1), and `.` is idle. A rank *holds* a
# microbatch's activations from the start of its forward until its backward finishes.
#
# *Practice (not graded)*: P = 3, m = 6.
#
# ```
# Timeline X (each chunk takes half a time unit; one column = half a unit)
# rank 0 | F0a F1a F2a F0b F1b F2b F3a F4a B0b F5a B1b .   F3b B2b F4b B0a F5b B1a B2a .   B3b .   B4b .   B5b B3a B4a B5a
# rank 1 | .   F0a F1a F2a F0b F1b F2b B0b F3a B1b F4a B2b F5a B0a F3b B1a F4b B2a F5b B3b .   B4b .   B5b B3a B4a B5a .
# rank 2 | .   .   F0a F1a F2a F0b B0b F1b B1b F2b B2b F3a B0a F4a B1a F5a B2a F3b B3b F4b B4b F5b B5b B3a B4a B5a .   .
#
# Timeline Y
# rank 0 | F0 F1 F2 F3 F4 F5 .  .  .  .  B0 B1 B2 B3 B4 B5
# rank 1 | .  F0 F1 F2 F3 F4 F5 .  .  B0 B1 B2 B3 B4 B5 .
# rank 2 | .  .  F0 F1 F2 F3 F4 F5 B0 B1 B2 B3 B4 B5 .  .
#
# Timeline Z
# rank 0 | F0 F1 F2 .  .  B0 F3 B1 F4 B2 F5 B3 .  B4 .  B5
# rank 1 | .  F0 F1 .  B0 F2 B1 F3 B2 F4 B3 F5 B4 .  B5 .
# rank 2 | .  .  F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 .  .
# ```
#
# * `practice_schedule_x`, `practice_schedule_y`, `practice_schedule_z`: each one of
#   `"gpipe"`, `"1f1b"`, `"interleaved"`.
# * `practice_peak_y_rank0`: the largest number of microbatches whose activations rank 0 holds at
#   once in timeline Y; `practice_peak_z_rank1`: the same for **rank 1** in timeline Z (ints).
# * `practice_most_z`: the rank (an int) that holds the most microbatches at its peak in
#   timeline Z.

# %% [answer q4_practice]
### BEGIN SOLUTION
practice_schedule_x = "interleaved"
practice_schedule_y = "gpipe"
practice_schedule_z = "1f1b"
practice_peak_y_rank0 = 6
practice_peak_z_rank1 = 2
practice_most_z = 0
### END SOLUTION

# %%
PRACTICE_SCHEDULES = ["gpipe", "1f1b", "interleaved"]
checks.check_choice("practice_schedule_x", practice_schedule_x, "interleaved", PRACTICE_SCHEDULES,
                    mistakes={"1f1b": "the letters a and b say each rank runs two chunks of "
                                      "layers: that is what interleaving means",
                              "gpipe": "X has chunk letters, and B0b starts while forwards are "
                                       "still to come: interleaved 1F1B"})
checks.check_choice("practice_schedule_y", practice_schedule_y, "gpipe", PRACTICE_SCHEDULES,
                    mistakes={"1f1b": "in Y no rank starts a backward before its last forward "
                                      "(F5): all forwards, then all backwards",
                              "interleaved": "Y has no chunk letters: one stage per rank"})
checks.check_choice("practice_schedule_z", practice_schedule_z, "1f1b", PRACTICE_SCHEDULES,
                    mistakes={"gpipe": "in Z rank 0 runs B0 before F3: after the warm-up it "
                                       "alternates one forward and one backward",
                              "interleaved": "Z has no chunk letters: one stage per rank"})
for name, value in (("practice_peak_y_rank0", practice_peak_y_rank0), ("practice_peak_z_rank1", practice_peak_z_rank1)):
    assert type(value) is int, f"{name} should be an int, got {type(value).__name__}"
checks.check_number("practice_peak_y_rank0", practice_peak_y_rank0, 6, mistakes=[
    (3, "in Y rank 0 runs every forward before its first backward (B0): count all of them"),
    (5, "when B0 starts, F0 to F5 have all run and none has finished its backward: count F5 "
        "too"),
    (1, "activations stay from the forward until the backward finishes, not only while the "
        "rank computes")])
checks.check_number("practice_peak_z_rank1", practice_peak_z_rank1, 2, mistakes=[
    (3, "that is rank 0's count; rank 1 runs only two forwards before its first backward"),
    (6, "in Z rank 1 finishes B0, and frees microbatch 0, before it starts F2"),
    (1, "activations stay from the forward until the backward finishes, not only while the "
        "rank computes")])
checks.check_choice("practice_most_z", practice_most_z, 0, [0, 1, 2], mistakes={
    2: "the last stage computes the loss, but it runs each backward right after the "
       "forward: it never holds more than one microbatch",
    1: "under 1F1B rank r warms up with P - r forwards before its first backward: the first "
       "rank warms up longest"})
print("practice Q4: all right")

# %% [markdown]
# Now the graded question: P = 5 stages and m = 7 microbatches in timelines A and B, P = 2
# and m = 4 in timeline C.
#
# ```
# Timeline A
# rank 0 | F0 F1 F2 F3 F4 .  .  .  .  B0 F5 B1 F6 B2 .  B3 .  B4 .  B5 .  B6
# rank 1 | .  F0 F1 F2 F3 .  .  .  B0 F4 B1 F5 B2 F6 B3 .  B4 .  B5 .  B6 .
# rank 2 | .  .  F0 F1 F2 .  .  B0 F3 B1 F4 B2 F5 B3 F6 B4 .  B5 .  B6 .  .
# rank 3 | .  .  .  F0 F1 .  B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 .  B6 .  .  .
# rank 4 | .  .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 .  .  .  .
#
# Timeline B
# rank 0 | F0 F1 F2 F3 F4 F5 F6 .  .  .  .  .  .  .  .  B0 B1 B2 B3 B4 B5 B6
# rank 1 | .  F0 F1 F2 F3 F4 F5 F6 .  .  .  .  .  .  B0 B1 B2 B3 B4 B5 B6 .
# rank 2 | .  .  F0 F1 F2 F3 F4 F5 F6 .  .  .  .  B0 B1 B2 B3 B4 B5 B6 .  .
# rank 3 | .  .  .  F0 F1 F2 F3 F4 F5 F6 .  .  B0 B1 B2 B3 B4 B5 B6 .  .  .
# rank 4 | .  .  .  .  F0 F1 F2 F3 F4 F5 F6 B0 B1 B2 B3 B4 B5 B6 .  .  .  .
#
# Timeline C (each chunk takes half a time unit; one column = half a unit)
# rank 0 | F0a F1a F0b F1b F2a B0b F3a B1b F2b B0a F3b B1a .   B2b .   B3b B2a B3a
# rank 1 | .   F0a F1a F0b B0b F1b B1b F2a B0a F3a B1a F2b B2b F3b B3b B2a B3a .
# ```
#
# * `schedule_a`, `schedule_b`, `schedule_c`: each one of `"gpipe"`, `"1f1b"`, `"interleaved"`.
# * `peak_a_rank0`, `peak_b_rank0`: ints, the largest number of microbatches whose activations
#   rank 0 holds at once (forward started, backward not yet finished) in timelines A and B.
# * `most_activations_rank_a`: the rank (an int) that holds the most microbatches at its peak in
#   timeline A.

# %% [answer q4]
### BEGIN SOLUTION
schedule_a = "1f1b"
schedule_b = "gpipe"
schedule_c = "interleaved"
peak_a_rank0 = 5
peak_b_rank0 = 7
most_activations_rank_a = 0
### END SOLUTION

# %% [test q4_test points=2]
SCHEDULES = ["gpipe", "1f1b", "interleaved"]
for name in ("schedule_a", "schedule_b", "schedule_c"):
    value = globals()[name]
    assert type(value) is str and value.lower() in SCHEDULES, f"{name} should be one of {SCHEDULES}, got {value!r}"
# known wrong values (the right ones are checked when the assignment is graded)
for name in ("peak_a_rank0", "peak_b_rank0"):
    checks.check_number(name, globals()[name], mistakes=[
        (0, "rank 0 holds at least the microbatch whose forward it has just run"),
        (1, "a rank keeps a microbatch's activations from its forward until its backward "
            "finishes, not only while it computes")])
assert type(most_activations_rank_a) is int and 0 <= most_activations_rank_a < 5, (
    "most_activations_rank_a should be a rank of timeline A: an int from 0 to 4")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("schedule_a", schedule_a)
submit("schedule_b", schedule_b)
submit("schedule_c", schedule_c)
submit("peak_a_rank0", peak_a_rank0)
submit("peak_b_rank0", peak_b_rank0)
submit("most_activations_rank_a", most_activations_rank_a)
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
# returned work objects and call `.wait()` on them before returning). The visible test runs
# your function on two small practice cases (2 and 3 real ranks, microbatches of different
# sizes) and compares the loss and every gradient with one process; grading runs it on further
# cases (other seeds, sizes and pipeline depths).

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

from course_utils.pipeline import runtime as pp_harness


def _q5_practice(pp_size, seed, sizes):
    """Run pipeline_step on a small practice case and compare it with one process."""
    with contextlib.redirect_stderr(io.StringIO()):
        runs = pp_harness.run_student_pipeline(pipeline_step, pp_size, seed, sizes,
                                               width=8, depth=6)
    case = f"practice case pp_size={pp_size}, sizes={sizes}"
    want_loss, want_grads = pp_harness.microbatch_reference(seed, sizes, 8, 6, pp_size)
    flat_loss, flat_grads = pp_harness.microbatch_reference(seed, sizes, 8, 6, pp_size,
                                                            weighting="microbatches")
    m = len(sizes)

    def near(a, b):
        return abs(a - b) <= 1e-4 * abs(b) + 1e-6

    def all_near(got, want, scale=1.0):
        return all(torch.allclose(torch.as_tensor(g).double(), scale * torch.as_tensor(w).double(),
                                  rtol=1e-4, atol=1e-6) for g, w in zip(got, want))

    for rank in range(pp_size - 1):
        assert runs[rank]["loss"] is None, (
            f"{case}: rank {rank} is not the last rank and should return None, "
            f"got {runs[rank]['loss']!r}")
    for rank, run in enumerate(runs):
        assert len(run["grads"]) == len(want_grads[rank]), (
            f"{case}: rank {rank} should have {len(want_grads[rank])} parameter gradients")
        for k, g in enumerate(run["grads"]):
            assert g is not None, (
                f"{case}: rank {rank}: parameter {k} of its stage has no .grad after your "
                "backward pass")
    loss = checks.as_number(f"{case}: the loss on the last rank", runs[-1]["loss"])
    if near(loss, m * flat_loss):
        raise AssertionError(f"{case}: your loss adds up the {m} microbatch losses; the "
                             "question asks for the mean over all examples of the batch")
    if near(loss, flat_loss) and not near(loss, want_loss):
        raise AssertionError(f"{case}: your loss averages the {m} microbatch means as equals, "
                             "but these microbatches differ in size: a microbatch of n_i "
                             "examples must count n_i / N of the loss")
    assert near(loss, want_loss), (
        f"{case}: the last rank returned {loss:.6g}; one process computes {want_loss:.6g}")
    for rank, run in enumerate(runs):
        if all_near(run["grads"], flat_grads[rank], m):
            raise AssertionError(f"{case}: rank {rank}'s gradients come from the sum of the "
                                 f"{m} microbatch losses: weight each before backpropagating")
        if all_near(run["grads"], flat_grads[rank]) and not all_near(run["grads"],
                                                                     want_grads[rank]):
            raise AssertionError(f"{case}: rank {rank}'s gradients weight every microbatch "
                                 "the same, but their sizes differ: use n_i / N as the weight")
        for k, (g, w) in enumerate(zip(run["grads"], want_grads[rank])):
            torch.testing.assert_close(
                torch.as_tensor(g).double(), torch.as_tensor(w).double(), rtol=1e-4, atol=1e-5,
                msg=lambda detail, rank=rank, k=k: (
                    f"{case}: rank {rank}, parameter {k}: the gradient differs from one "
                    f"process. {detail}"))


_q5_practice(2, 3, [3, 1])     # two ranks, unequal microbatches
_q5_practice(3, 4, [2, 4, 1])  # a middle rank receives and sends
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import hidden_cases, submit


def _q5_run(number, pp_size, seed, sizes):
    """Run the student's step on real ranks; hand each rank's loss and grads to the grader."""
    with contextlib.redirect_stderr(io.StringIO()) as _hidden_sink:
        runs = pp_harness.run_student_pipeline(pipeline_step, pp_size, seed, sizes,
                                               width=8, depth=6)
    case = f"pipeline_step on hidden case {number}"
    submit(f"{case} losses", [run["loss"] for run in runs])
    submit(f"{case} grads", [run["grads"] for run in runs])


for _number, _case in enumerate(hidden_cases("q5_test"), 1):  # drawn per submission
    _q5_run(_number, *_case)
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
#
# **Rubric** (2 points):
# * 1 point: says that 1F1B leaves the bubble the same, (P-1)/(m+P-1) = 7/23, about 30 %, and
#   changes memory: each stage holds the activations of at most P = 8 microbatches (P - r on
#   rank r) instead of all m = 16 under GPipe; so it fixes the memory problem, not the bubble.
# * 1 point: says that interleaved 1F1B with v = 2 shrinks the bubble to (P-1)/(v*m+P-1) =
#   7/39, about 18 %, and names one cost (v times as many boundary sends per microbatch, more
#   activation memory in warm-up, m a multiple of P); and gives one reason the measured bubble
#   is larger (send/recv latency and synchronisation, unbalanced stages where the slowest sets
#   the pace, smaller microbatches running matmuls less efficiently).
# * 0 points: agrees that 1F1B shrinks the bubble and says nothing correct about memory,
#   interleaving or real hardware.
# ### END SOLUTION

# %% [markdown]
# ## Q7. Zero-bubble schedules: the backward split in two (2 points)
#
# Lecture 5 split a stage's backward pass B into the input gradient I (the previous stage waits
# for it) and the weight gradient W (nothing waits for it before the optimizer step), so
# B = I + W, and ran ZB-H1 (Qi et al., 2023): I at once, each W held back to fill the wait.
# Take balanced stages, m >= P, W no longer than F or I (where the paper's formula holds) and
# the optimizer's global check at the end of each step. The times below are per stage and per
# microbatch, in ms, and B is the whole backward, as DeepSeek's table writes it: mind which
# backward each formula you use means.
#
# *Practice (not graded)*: P = 4 stages, m = 12 microbatches, F = 10 ms, B = 19 ms of which
# W = 8 ms.
#
# * `practice_zb_bubble_ms`: the time (ms) each rank idles in one ZB-H1 step.
# * `practice_zb_fraction`: the bubble fraction of that step (idle time over the step's time).
# * `practice_zb_peak_rank2`: the most microbatches whose activations rank 2 holds at once
#   (from its forward until its W finishes) under ZB-H1 (an int).

# %% [answer q7_practice]
### BEGIN SOLUTION
_i = 19 - 8                                     # the input half of the backward
practice_zb_bubble_ms = (4 - 1) * (10 + _i - 8)
practice_zb_fraction = practice_zb_bubble_ms / (practice_zb_bubble_ms + 12 * (10 + 19))
practice_zb_peak_rank2 = 4                      # ZB-H1 keeps P in flight on every rank
### END SOLUTION

# %%
assert type(practice_zb_peak_rank2) is int, (
    f"practice_zb_peak_rank2 should be an int, got {type(practice_zb_peak_rank2).__name__}")
checks.check_number("practice_zb_bubble_ms", practice_zb_bubble_ms, 39, mistakes=[
    (87, "that is 1F1B's bubble (P - 1)(F + B): ZB-H1 fills part of the wait with W"),
    (63, "you used the whole backward B = 19 ms for Qi et al.'s T_B, which is only the input "
         "half I = B - W = 11 ms"),
    (52, "the pipeline fills and drains in P - 1 = 3 steps, not P = 4"),
    (0, "ZB-H1 is not bubble-free: it keeps (P - 1)(T_F + T_B - T_W) of idle time")])
checks.check_number("practice_zb_fraction", practice_zb_fraction, 39 / 387, mistakes=[
    (39 / 348, "that divides by the compute time m (F + B) only: the fraction divides by the "
               "whole step, idle time included"),
    (3 / 15, "that is 1F1B's fraction (P - 1)/(m + P - 1)"),
    (39 / 483, "W is part of B: a microbatch's work is F + B = 29 ms, not F + B + W")])
checks.check_number("practice_zb_peak_rank2", practice_zb_peak_rank2, 4, mistakes=[
    (2, "that is 1F1B's P - r: ZB-H1 holds each W back until the rank has P microbatches in "
        "flight, so every rank reaches P"),
    (12, "that is GPipe's m: ZB-H1 starts backwards after its warm-up, as 1F1B does"),
    (1, "a microbatch is held from its forward until its W finishes (W needs each linear's "
        "input; torch's runtime keeps the whole microbatch)")])
print("practice Q7: all right")

# %% [markdown]
# Now the graded question, with your own numbers (the table at the top):
# `(P, m, F, B, W, r) = G.q7`, a ZB-H1 pipeline of P balanced stages and m microbatches; F,
# B (the whole backward) and W (its weight half) in ms per stage and microbatch.
#
# * `zb_bubble_ms`: the time (ms) each rank idles in one step.
# * `zb_fraction`: the bubble fraction of the step.
# * `zb_peak_rank`: the most microbatches whose activations rank r holds at once (an int).

# %% [answer q7]
### BEGIN SOLUTION
p, m, f, b, w, r = G.q7
zb_bubble_ms = (p - 1) * (f + (b - w) - w)
zb_fraction = zb_bubble_ms / (zb_bubble_ms + m * (f + b))
zb_peak_rank = p
### END SOLUTION

# %% [test q7_test points=2]
assert type(zb_peak_rank) is int, (
    f"zb_peak_rank should be an int, got {type(zb_peak_rank).__name__}")
assert 0 <= checks.as_number("zb_fraction", zb_fraction) < 1, (
    "zb_fraction should be a fraction between 0 and 1")
# known wrong values (the right one is checked when the assignment is graded)
_p, _m, _f, _b, _w, _r = G.q7
checks.check_number("zb_bubble_ms", zb_bubble_ms, variant=G.key("q7"), mistakes=[
    ((_p - 1) * (_f + _b), "(P - 1)(F + B) is what 1F1B idles; ZB-H1 puts W's into that wait"),
    ((_p - 1) * (_f + _b - _w), "Qi et al.'s T_B is only the input half of the backward, "
                                "B - W: you used the whole B"),
    (_p * (_f + _b - 2 * _w), "a rank waits for P - 1 stages to fill and drain, not P"),
    (0, "ZB-H1 does not reach zero: Qi et al. give it (P - 1)(T_F + T_B - T_W)")])
checks.check_number("zb_fraction", zb_fraction, variant=G.key("q7"), mistakes=[
    ((_p - 1) / (_m + _p - 1), "(P - 1)/(m + P - 1) is 1F1B's fraction; ZB-H1 idles less")])
checks.check_number("zb_peak_rank", zb_peak_rank, variant=G.key("q7"), mistakes=[
    (_p - _r, "P - r is what 1F1B's rank r holds; ZB-H1 keeps W back until P are in flight"),
    (_m, "m is what GPipe holds; ZB-H1 runs backwards from the end of its warm-up on")])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("zb_bubble_ms", zb_bubble_ms)
submit("zb_fraction", zb_fraction)
submit("zb_peak_rank", zb_peak_rank)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Submitting
#
# Save the notebook, then hand in this file itself, **`a5_pipeline.ipynb`**, with its name
# unchanged (in `make lab` it is `workspace/assignments/a5_pipeline/a5_pipeline.ipynb`), the way your
# instructor asks. Outputs may be cleared (*Edit > Clear Outputs of All Cells*): your instructor
# runs the whole notebook again, from the top, in a fresh kernel, to grade it, so first check
# that *Kernel > Restart Kernel and Run All Cells* meets no `NameError` (a check that names a
# mistake stops *Run All* where it is; grading runs every cell anyway). Learning on your own with
# the full repository? `make check A=a5_pipeline` grades your copy the same way.

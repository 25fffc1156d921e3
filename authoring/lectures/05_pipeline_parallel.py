# %% [markdown]
# # Module 5: Pipeline parallelism
#
# Pipeline parallelism (PP) cuts a model into consecutive groups of layers, called *stages*, and
# puts each stage on its own rank. Only two kinds of tensor cross a stage boundary: activations
# going forward and their gradients coming back. The price is idle time. A stage cannot start a
# microbatch before the stage in front of it has finished it, so the pipeline first has to fill
# and at the end has to drain. The idle time is called the *bubble*.
#
# In this notebook you will:
#
# 1. derive the idealized bubble fraction (P - 1)/(m + P - 1) and relate it to the ratio
#    (P - 1)/m that the Megatron-LM interleaving paper quotes instead;
# 2. simulate three schedules (GPipe, 1F1B, interleaved 1F1B), draw them as Gantt charts and see
#    what imbalanced stages and a slower backward pass change;
# 3. count the activations each schedule keeps in flight;
# 4. run a real pipeline on gloo ranks, first written out with `send`/`recv` and then with
#    `torch.distributed.pipelining`, and check that it gives the same loss and gradients as the
#    unsplit model;
# 5. measure the bubble from each rank's timestamps and put it beside the formula;
# 6. keep batch accounting separate from all of this.
#
# Notation: **P** is the number of stages (one per rank), **m** the number of microbatches per
# optimizer step. Ranks and microbatches are numbered from 0.

# %%
import functools
import os
import textwrap

import matplotlib.pyplot as plt
import torch
from torch.distributed import pipelining

from course_utils import launch, style
from course_utils import pipeline_parallel as pp
from course_utils import pipeline_schedule as ps
from course_utils.widgets.pipeline_timeline import PipelineTimeline

style.use()

# %% [markdown]
# ## Layers split into stages
#
# Our model is a stack of 8 identical blocks (`Linear -> Tanh`). With P = 4, each rank keeps two
# consecutive blocks. `split_stages` slices the `nn.Sequential`, so the stages share the
# model's parameters.

# %%
model = pp.make_model(seed=0, width=16, depth=8)
for pp_rank, (start, end) in enumerate(pp.stage_bounds(len(model), 4)):
    print(f"pp_rank {pp_rank}: blocks {start}..{end - 1}")
stages = pp.split_stages(model, 4)
print("parameters per stage:", [sum(q.numel() for q in st.parameters()) for st in stages])

# %% [markdown]
# Feed the whole batch through as a single microbatch (m = 1). Rank 1 waits for rank 0's
# forward pass, rank 2 waits for rank 1, and on the way back the order reverses. Below, each
# column is one time unit (one forward of one stage); `F0` is the forward of microbatch 0, `B0`
# its backward, and `.` is idle.

# %%
one = ps.simulate("gpipe", p=4, m=1)
print(ps.format_timeline(one))
print(f"idle fraction: {one.idle_fraction():.1%}")

# %% [markdown]
# Each rank works for 2 of the 8 time units: three quarters of the machine time is bubble. The
# cure is to cut the batch into m microbatches so that the stages work on different
# microbatches at the same time.
#
# ## The bubble fraction
#
# Assume every stage takes the same time per microbatch, t_f forward and t_b backward, and that
# communication costs nothing. The first microbatch needs P - 1 stage-steps to reach the last
# stage, and the last one needs P - 1 steps to drain out again. So one step takes
# (m + P - 1)(t_f + t_b), of which each rank computes for m(t_f + t_b). The idle share of the
# total time is
#
# $$\text{bubble fraction} = \frac{P - 1}{m + P - 1}.$$
#
# The GPipe paper (Huang et al., 2019, section 2.3) states this fraction, as
# O((K - 1)/(M + K - 1)) in its letters: K partitions, M micro-batches. The paper that
# introduced interleaved 1F1B (Narayanan et al., 2021, "Efficient large-scale language model
# training on GPU clusters using Megatron-LM") measures the bubble differently: as the *ratio* of
# bubble time to ideal compute time, (p - 1)/m in its letters. The two describe the same bubble:
# with ratio r, the fraction is r / (1 + r), and with fraction f the ratio is f / (1 - f). The
# ratio is always the larger number and can exceed 1; the fraction is a share of wall-clock time
# and never reaches 1.

# %%
for m in (8, 32):
    f, r = ps.bubble_fraction(4, m), ps.bubble_ratio(4, m)
    print(f"P=4, m={m:2d}: fraction 3/{m + 3} = {f:.1%}   ratio 3/{m} = {r:.1%}   "
          f"r/(1+r) = {ps.ratio_to_fraction(r):.1%}")

# %% [markdown]
# With P = 4, eight microbatches leave 27.3 % of the time idle, and thirty-two leave 8.6 %.
# How many microbatches does a target need? For a bubble of at most 10 % with P = 4:

# %%
print("smallest m with bubble <= 10%:", ps.min_microbatches(4, 0.10))
print("smallest m with bubble ratio (P-1)/m <= 10%:", round((4 - 1) / 0.10))
print("P=8 needs:", ps.min_microbatches(8, 0.10))

# %% [markdown]
# Reading the ratio as the fraction would make you ask for 30 microbatches where 27 are enough.
# More stages need proportionally more microbatches.
#
# ## A schedule simulator
#
# The formula assumes a schedule, balanced stages and free communication. To see what
# happens when those assumptions fail, `ps.simulate` plays a schedule op by op. Each rank runs its
# list of ops in order (`ps.schedule_order`). An op starts as soon as the rank is free and its
# inputs exist: a forward needs the previous stage's forward of the same microbatch, and a
# backward needs this stage's forward and the next stage's backward. Three schedules:
#
# * **GPipe** (all-forward-all-backward): every rank runs all m forwards, then all m backwards.
# * **1F1B** (PipeDream-flush): rank r runs P - r - 1 warm-up forwards, then alternates one
#   forward with one backward, then drains the remaining backwards.
# * **Interleaved 1F1B** (Megatron-LM): each rank holds v non-consecutive *chunks* of layers
#   (chunk c of rank r is virtual stage c·P + r), so a microbatch visits every rank v times.
#   Each chunk does 1/v of the rank's work.
#
# In the charts below, forwards are blue and backwards green, each box labelled by its
# microbatch; in the interleaved chart the lighter shade is a rank's second chunk.

# %%
P, M = 4, 8
timelines = {
    "gpipe": ps.simulate("gpipe", p=P, m=M),
    "1f1b": ps.simulate("1f1b", p=P, m=M),
    "interleaved": ps.simulate("interleaved", p=P, m=M, v=2),
}
longest = max(tl.makespan for tl in timelines.values())  # one time scale for all three
fig, axes = plt.subplots(3, 1, figsize=(9, 8.5), sharex=True)
for k, (ax, tl) in enumerate(zip(axes, timelines.values())):
    ps.draw_timeline(tl, ax=ax, tmax=longest, legend=k in (0, 2))
    if k < 2:
        ax.set_xlabel("")
fig.tight_layout()
plt.show()

# %%
for name, tl in timelines.items():
    print(f"{name:12s} idle {tl.idle_fraction():.4f}   makespan {tl.makespan:.0f} units")
print(f"formula (P-1)/(m+P-1)      = {ps.bubble_fraction(P, M):.4f}")
print(f"formula (P-1)/(v*m+P-1), v=2 = {ps.interleaved_bubble_fraction(p=P, m=M, v=2):.4f}")

# %% [markdown]
# With balanced stages, GPipe and 1F1B have exactly the formula's idle fraction: 1F1B
# reorders the work but keeps the same fill and drain. Interleaving with v chunks divides the
# fill and drain time by v. Its bubble is (P - 1)/(v·m + P - 1), but each microbatch now
# crosses rank boundaries v times as often, so it sends v times as many messages. (The
# formulas are checked against the simulator over many P, m and v in
# `tests/test_pipeline_schedule.py`.)
#
# So (P - 1)/(m + P - 1) is the bubble of GPipe and 1F1B, not a floor for every schedule.
# Interleaving goes below it, and *zero-bubble* schedules (Qi et al., "Zero Bubble Pipeline
# Parallelism", ICLR 2024) go lower still: they split each backward into the gradient with
# respect to the stage's input, which the previous stage is waiting for, and the gradient with
# respect to its weights, which no other stage needs, and run the weight-gradient work in slots
# that would otherwise be idle. `torch.distributed.pipelining` ships such schedules too:

# %%
names = [name for name in sorted(dir(pipelining)) if name.startswith("Schedule")]
print(textwrap.fill(f"torch {torch.__version__.split('+')[0]}, torch.distributed.pipelining: "
                    + ", ".join(names), width=90, subsequent_indent="    "))

# %% [markdown]
# The text view of the 1F1B timeline shows its warm-up, its steady one-forward-one-backward
# phase and its drain:

# %%
print(ps.format_timeline(timelines["1f1b"]))

# %% [markdown]
# ### Backward = 2 x forward, and an imbalanced stage
#
# A backward pass costs about twice a forward pass: it computes gradients for both the input
# and the weights. That stretches every slot, including the bubble's, so the *fraction* is
# unchanged. An imbalanced stage is different. If one rank's layers take twice as long, the
# whole pipeline runs at that rank's pace and every other rank waits for it.

# %%
cases = [
    ("balanced, backward = forward", dict()),
    ("balanced, backward = 2 x forward", dict(backward_ratio=2.0)),
    ("rank 2 takes 1.5x, backward = 2x", dict(backward_ratio=2.0, stage_times=[1, 1, 1.5, 1])),
    ("rank 2 takes 2x, backward = 2x", dict(backward_ratio=2.0, stage_times=[1, 1, 2, 1])),
]
print(f"{'P=4, m=8':34s} {'gpipe':>7s} {'1f1b':>7s}")
for label, kw in cases:
    g, o = (ps.simulate(s, p=4, m=8, **kw).idle_fraction() for s in ("gpipe", "1f1b"))
    print(f"{label:34s} {g:7.1%} {o:7.1%}")

# %%
imbalanced = ps.simulate("1f1b", p=4, m=8, backward_ratio=2.0, stage_times=[1, 1, 2, 1])
ps.draw_timeline(imbalanced, title="1F1B, backward = 2x forward, rank 2 twice as slow")
plt.show()
print("idle per rank:", [f"{x:.1%}" for x in imbalanced.rank_idle_fractions()])

# %% [markdown]
# The slow rank is busy almost all of the time, and everyone else idles while they wait for it.
# Adding microbatches does not help here. Only moving layers so that the stages balance does.
#
# ## Activations in flight: the memory side of the choice
#
# A stage must keep a microbatch's saved activations from the start of its forward until its
# backward has finished. GPipe runs every forward before any backward, so each stage holds all m
# microbatches. In 1F1B, rank r never holds more than P - r, because it starts a backward before
# taking on more forwards. Interleaving holds a little more than 1F1B during its longer warm-up.
# The counts below are in units of one microbatch's activations for a whole stage (a chunk
# counts 1/v).

# %%
print(f"{'peak activations held per rank':32s}  m=8                     m=32")
for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
    peaks = [ps.simulate(name, p=4, m=m, v=v).peak_activations() for m in (8, 32)]
    print(f"{name:32s}  {str(peaks[0]):22s}  {peaks[1]}")

# %% [markdown]
# Both GPipe and 1F1B have the same bubble, but GPipe's activation memory grows with m and
# 1F1B's stays at about P. Since a smaller bubble needs a larger m, that difference is why 1F1B
# is the usual default. (Activation checkpointing is the other lever: it saves less per
# microbatch and recomputes the rest during backward.)
#
# ### Try it: the schedule explorer
#
# The explorer below plays a schedule with `ps.simulate` for the P, m and v you choose, with
# one stage slowed down if you like, and sets the simulated bubble beside the formula and the
# activations each stage holds at its peak. It starts at the 1F1B chart above. **Predict,
# then move the controls:**
#
# 1. What bubble does the formula give for 1F1B at P = 4 and m = 16? And what will stage 0
#    hold at its peak? Predict both, then move m.
# 2. Make rank 2 twice as slow. Will m = 32 bring the bubble back down to the formula's?
#    Predict, then try it.

# %%
PipelineTimeline(schedule="1f1b", stages=4, microbatches=8)

# %% [markdown]
# ## A real pipeline on gloo ranks
#
# `pp.pipeline_worker` runs on every rank. It builds the same model from a seed, keeps its own
# stage and runs that rank's op order from `ps.schedule_order`. For a forward it receives the
# boundary activation from `pp_prev_rank` (except on rank 0), runs its stage, and sends the
# output to `pp_next_rank` (the last rank computes the loss instead). For a backward it receives
# the gradient of its output from `pp_next_rank`, backpropagates through its stage, and sends
# the gradient of its input to `pp_prev_rank`. Sends are `isend`. In 1F1B a rank sends an
# activation forward at the moment its neighbour sends a gradient back, and two blocking sends
# facing each other would deadlock.
#
# The loss is a mean over the batch, and each microbatch's loss is divided by m, so the
# accumulated gradients equal those of the full batch. We compare with the unsplit model on one
# process, for both schedules, P = 2 and 4, and two seeds:

# %%
def max_diff(results, seed, p, m, microbatch):
    """Largest |difference| of loss and grads between a pipeline run and one process."""
    loss, grads = pp.reference_step(seed=seed, batch=m * microbatch, width=16, depth=4, p=p)
    worst = abs(results[-1]["loss"] - loss)
    for rank in range(p):
        for got, want in zip(results[rank]["grads"], grads[rank]):
            worst = max(worst, (torch.as_tensor(got) - want).abs().max().item())
    return worst


scratch = {}
for schedule in ("gpipe", "1f1b"):
    for p in (2, 4):
        runs = [launch.run(functools.partial(pp.pipeline_worker, schedule=schedule, m=4,
                                             seed=seed, microbatch=3, width=16, depth=4),
                           p, timeout_s=60, show_output=False) for seed in (0, 1)]
        scratch[schedule, p] = runs[0]
        worst = max(max_diff(res, seed=seed, p=p, m=4, microbatch=3)
                    for seed, res in zip((0, 1), runs))
        print(f"send/recv {schedule:5s} P={p}: matches one process (max |diff| < 1e-6):",
              worst < 1e-6)

# %% [markdown]
# The same pipeline written with PyTorch's API takes a few lines: wrap each rank's stage in a
# `PipelineStage` (given the boundary shape, like our `recv` buffers) and drive it with a
# schedule. `ScheduleGPipe` and `Schedule1F1B` handle the microbatching, the send/recv and the
# 1/m scaling of gradients. We check them against one process and against our hand-written version:

# %%
for schedule in ("gpipe", "1f1b"):
    for p in (2, 4):
        mine = scratch[schedule, p]
        theirs = launch.run(functools.partial(pp.torch_pipeline_worker, schedule=schedule, m=4,
                                              seed=0, microbatch=3, width=16, depth=4),
                            p, timeout_s=60, show_output=False)
        same = all(torch.allclose(torch.as_tensor(a), torch.as_tensor(b), atol=1e-6)
                   for r in range(p) for a, b in zip(mine[r]["grads"], theirs[r]["grads"]))
        print(f"torch.distributed.pipelining {schedule:5s} P={p}: matches one process:",
              max_diff(theirs, seed=0, p=p, m=4, microbatch=3) < 1e-6, "| matches send/recv:", same)

# %% [markdown]
# ## Measuring the bubble
#
# Both workers record the start and end of every forward and backward on every rank, using
# `time.perf_counter`, which on Linux is one clock shared by all processes. The measured
# bubble is 1 - (busy time summed over ranks) / (P x makespan). Time a rank spends waiting in
# `recv` counts as idle.
#
# One detail of the machine: the ranks are processes sharing this machine's CPU cores, which may
# be fewer than the ranks and may be busy with other programs (the first line below says how many
# there are). If stages did their work as CPU matmuls, a rank without a free core would wait for
# one, and we would measure that contention rather than the schedule. So we do what a GPU
# pipeline does. Each forward is stretched to `op_time_s` = 10 ms and each backward to twice
# that, by sleeping (the host waiting for its device), while the real, small math still runs.
# Communication, waiting and scheduling stay real. The measurement takes several seconds.

# %%
# NBVAL_IGNORE_OUTPUT
print(f"this machine: {os.cpu_count()} logical CPUs for up to 4 ranks")
measured = {p: pp.measure_bubble(p, [1, 2, 4, 8, 16], op_time_s=0.01, steps=2) for p in (2, 4)}
print(f"{'':5s}{'P=2 formula':>12s}{'measured':>10s}{'P=4 formula':>14s}{'measured':>10s}")
for row2, row4 in zip(measured[2], measured[4]):
    print(f"m={row2['m']:<3d}{row2['formula']:12.3f}{row2['measured']:10.3f}"
          f"{row4['formula']:14.3f}{row4['measured']:10.3f}")

# %%
fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 7), height_ratios=[1.2, 1])
shades = {2: "#a9d3b4", 4: style.AXIS_COLORS["pp"]}  # the pipeline axis's colour, P=2 lighter
for p, rows in measured.items():
    ms = [row["m"] for row in rows]
    ax1.plot(ms, [row["formula"] for row in rows], "--", color=shades[p], label=f"P={p}, formula")
    ax1.plot(ms, [row["measured"] for row in rows], "o-", color=shades[p],
             label=f"P={p}, measured")
ax1.set_xscale("log", base=2)
ax1.set_xticks(ms, [str(m) for m in ms])
ax1.set_ylim(0, 0.85)
ax1.set_xlabel("microbatches m")
ax1.set_ylabel("idle fraction")
ax1.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, borderaxespad=0.0)
_ = ax1.set_title("GPipe bubble on gloo ranks: formula vs measured")
ps.draw_timeline(measured[4][2]["timeline"], ax=ax2, title="measured timeline, P=4, m=4")
ax2.set_xlabel("seconds")
fig.tight_layout()
plt.show()

# %% [markdown]
# The measured bubble follows the formula's shape: it is largest at m = 1 and shrinks as m
# grows. It sits above the formula, and the gap is larger at large m. Every op adds a little
# time the formula leaves out: the `recv` has to wake up, the data has to cross, and a loaded
# machine adds scheduling jitter. These costs grow with the number of ops, while the ideal
# bubble shrinks. `ps.simulate(..., comm_time=...)` adds such a per-hop cost to the model.
#
# ## Smaller microbatches run less efficiently
#
# Why not simply take m = 1000? Each microbatch becomes a smaller matrix multiply, and small
# matrix multiplies use the hardware poorly. Here is one core multiplying a (b, 512) microbatch
# by a 512 x 512 weight:

# %%
# NBVAL_IGNORE_OUTPUT
sizes = [1, 4, 16, 64, 256]
gflops = pp.matmul_throughput(sizes, width=512, min_time_s=0.03)
for b, g in zip(sizes, gflops):
    print(f"microbatch {b:4d}: {g:6.1f} GFLOP/s")
print(f"b=256 vs b=1: {gflops[-1] / gflops[0]:.0f}x")

# %%
plt.figure(figsize=(6, 3.5))
plt.plot(sizes, gflops, "o-", color=style.PHASE_COLORS["forward"])
plt.xscale("log", base=2)
plt.xticks(sizes, [str(b) for b in sizes])
plt.ylim(0, max(gflops) * 1.15)
plt.xlabel("rows per microbatch")
plt.ylabel("GFLOP/s (1 core)")
_ = plt.title("matmul throughput vs microbatch size")
plt.show()

# %% [markdown]
# A one-row microbatch is a matrix-vector product. It reads the whole weight matrix to do a
# single row's arithmetic, so it is limited by memory bandwidth, not by compute. So more
# microbatches shrink the bubble, but past some point each one runs slower and every
# boundary costs a message. The best m comes from measuring, not from the formula alone.
#
# ## Batch accounting
#
# Pipelining changes *when* the work is done, not how many examples one optimizer step sees:
#
# $$\text{effective batch} = \text{examples per microbatch} \times \text{accumulation steps}
#   \times \text{DP degree}.$$
#
# Tensor parallelism and pipeline parallelism cooperate on the *same* examples, so their degrees
# do not enter the formula. In a pipeline, the m microbatches of one step *are* its
# accumulation steps: their gradients are summed before the optimizer runs.

# %%
print("2 examples x 16 accumulation steps x DP 4 =",
      ps.effective_batch(microbatch_size=2, accumulation_steps=16, dp=4))
for tp, pp_degree, dp in ((1, 1, 4), (4, 2, 4), (8, 4, 4)):
    devices = tp * pp_degree * dp
    print(f"TP={tp} PP={pp_degree} DP={dp} ({devices:3d} devices): effective batch "
          f"{ps.effective_batch(microbatch_size=2, accumulation_steps=16, dp=dp)}")

# %% [markdown]
# The 32-device mesh TP=4, PP=2, DP=4 trains on 128 examples per step, the same as 4 plain
# data-parallel replicas. Multiplying by all 32 devices would give 1024, which counts the same
# examples eight times.
#
# ## Closing note: measured vs formula
#
# The measurement above ran GPipe on real gloo ranks with 10 ms forwards and 20 ms backwards.
# Its gap to the formula grows with m, because every extra op pays for a message and a wake-up:
# `benchmarks/pipeline_bubble.py` runs the same measurement with more steps, for both
# from-scratch and `torch.distributed.pipelining`.

# %%
# NBVAL_IGNORE_OUTPUT
print("measured - formula:", "   ".join(
    f"P={p}: m=1 {rows[0]['measured'] - rows[0]['formula']:+.2f}, "
    f"m={rows[-1]['m']} {rows[-1]['measured'] - rows[-1]['formula']:+.2f}"
    for p, rows in measured.items()))

# %% [markdown]
# What to take away:
#
# * (P - 1)/(m + P - 1) is the idle fraction of GPipe and 1F1B with balanced stages and free
#   communication; imbalanced stages raise it, and so do the messages and wake-ups of a real
#   run. It is not a floor for every schedule: interleaving went down to 15.8 % where they had
#   27.3 % (P = 4, m = 8, v = 2), and zero-bubble schedules go lower still. The ratio (P - 1)/m
#   describes the same bubble relative to compute time.
# * GPipe and 1F1B have the same bubble. 1F1B holds about P microbatches of activations
#   instead of m. Interleaving divides the bubble by about v and costs v times more messages.
# * The slowest stage sets the pace. Balance the stages before adding microbatches.
# * The measured bubble is above the formula because every op pays for communication and
#   waking up, and smaller microbatches also compute less efficiently.
# * The effective batch counts examples per microbatch, accumulation steps and DP degree,
#   never the TP or PP degree.

# %% [markdown]
# **Next**: the assignment `a5_pipeline` (in your workspace under `assignments/a5_pipeline/`)
# practises the bubble arithmetic, reading timelines and batch accounting, and has you write a
# pipeline step that runs on real gloo ranks and matches one process. Module 6, *Building a
# device mesh*, combines DP, TP and PP on one mesh and adds the axes beyond them.

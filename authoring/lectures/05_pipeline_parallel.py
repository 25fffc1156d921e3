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
# 4. split the backward pass into its input gradient and its weight gradient, and simulate the
#    *zero-bubble* schedules built on that split (ZB-H1, ZBV, DualPipeV) against their papers'
#    formulas, including where those formulas stop holding;
# 5. run real pipelines on gloo ranks, written out with `send`/`recv` and with
#    `torch.distributed.pipelining` (zero-bubble ones included), and check that each gives the
#    same loss and gradients as the unsplit model;
# 6. measure the bubble and the activations each rank holds, beside the simulation, and see
#    what the zero-bubble schedules cost: memory, and the optimizer step's global check;
# 7. keep batch accounting separate from all of this.
#
# Notation: **P** is the number of stages (one per rank), **m** the number of microbatches per
# optimizer step. Ranks and microbatches are numbered from 0.

# %%
import os
import textwrap

import matplotlib.pyplot as plt
import torch

from course_utils import launch, style
from course_utils.checkpoint import post_validation
from course_utils.models import llama_shapes
from course_utils.pipeline import (backward_split as bs, fiw_times, pictures as pics, runtime as pp,
                                   schedule as ps, zero_bubble as zb, zero_bubble_runtime as zbp)
from course_utils.widgets.pipeline_timeline import PipelineTimeline

style.use()
torch.set_num_threads(1)  # this notebook's tensors are tiny: two threads wait on each other
launch.start_forkserver()  # the ranks' process server imports torch now, while the first cells run

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
    pics.draw_timeline(tl, ax=ax, tmax=longest, legend=k in (0, 2))
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
# Interleaving goes below it, and the *zero-bubble* schedules later in this notebook go lower
# still. `torch.distributed.pipelining` ships all of them, as the ranks will list below.
#
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
pics.draw_timeline(imbalanced, title="1F1B, backward = 2x forward, rank 2 twice as slow")
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
# ## The backward pass in two halves
#
# A stage's backward pass B does two jobs. For a linear layer y = x W^T + b, with g = dL/dy
# arriving from the layer above:
#
# * **I**, the gradient with respect to the layer's *input*: dL/dx = g W. The stage before
#   this one waits for it; until it is sent, that stage cannot start its own backward.
# * **W**, the gradient with respect to the layer's *weights*: dL/dW = g^T x and dL/db, the sum
#   of g over the rows. Nothing reads it before the optimizer step. It can wait, as long as the
#   stage keeps g and x.
#
# So B = I + W. We name the two halves I and W as `torch.distributed.pipelining` names its
# actions (`F`, `I`, `W`, and `B` for the whole backward). Qi et al. (2023, "Zero Bubble
# Pipeline Parallelism") write the input half as B. We keep B for the whole backward, as in
# the 1F1B charts above and in DeepSeek's formulas below. Each half is one matmul of the same
# size as the forward's, 2 n d_in d_out floating-point operations, so F, I and W take about
# the same time. That is Qi et al.'s model, T_F = T_B = T_W.
#
# Below, `bs.full_backward` runs one ordinary backward. `bs.autograd_split` asks autograd for the
# input gradient alone, keeping the graph, and later for the weight gradients. The by-hand
# formulas give the same numbers, for two seeds:

# %%
for seed in (0, 1):
    gen = torch.Generator().manual_seed(seed)
    layer = torch.nn.Linear(16, 8)
    x, g = torch.randn(5, 16, generator=gen), torch.randn(5, 8, generator=gen)  # input, dL/dy
    dx, (dw, db) = bs.full_backward(layer, x, g)
    by_hand = (bs.linear_input_grad(g, layer.weight), *bs.linear_weight_grad(g, x))
    split = bs.autograd_split(layer, x, g)
    print(f"seed {seed}: I and W by hand == full backward:",
          all(torch.allclose(a, b) for a, b in zip(by_hand, (dx, dw, db))),
          "| autograd in two calls == full backward:",
          all(torch.allclose(a, b) for a, b in zip((split[0], *split[1]), (dx, dw, db))))
print("FLOPs of one (5 x 16) -> 8 layer:", bs.matmul_flops(5, 16, 8))

# %% [markdown]
# `tests/test_zero_bubble.py` checks the same for whole stages: by hand
# (`bs.SplitStage`, used on real ranks below), and with the two functions
# `torch.distributed.pipelining` calls for I and W (`stage_backward_input`, which keeps the
# autograd graph, and `stage_backward_weight`, which walks it again from the saved
# intermediates).
#
# ## Zero-bubble schedules, simulated
#
# Splitting B lets a schedule send I back at once and keep W for a slot that would otherwise
# be idle. `ps.simulate` plays three such schedules, and the charts below set them beside 1F1B.
# Every op takes one unit here (F = I = W = 1, so B = 2):
#
# * **ZB-H1** (Qi et al., section 2.1) is 1F1B with I in place of B. Each W waits until the rank
#   has P microbatches in flight. The B's travel back faster, and the held-back W's fill the
#   drain.
# * **ZBV** (Qi et al., section 6; torch's `ScheduleZBVZeroBubble`) gives each rank two chunks in
#   a V: rank r holds stages r and 2P - 1 - r, so rank 0 holds both the first and the last.
# * **DualPipeV** is DeepSeek's DualPipe (DeepSeek-V3 technical report, section 3.2.1) cut in
#   half onto the same V, a procedure Sea AI Lab introduced as "Cut-in-half" (a blog post the
#   DualPipe repository's README credits; torch's `ScheduleDualPipeV`). In its
#   steady phase a rank runs a forward of one chunk and a whole backward of the other as a pair.
#   DeepSeek overlaps the pair's computation with its communication. Torch runs the two halves
#   one after the other, and so do we here.
#
# The orders for ZBV and DualPipeV are torch's own: `tests/test_zero_bubble.py` compares them
# with what torch's schedule classes compute, for P up to 8.

# %%
zb_timelines = {name: ps.simulate(name, p=4, m=8, backward_ratio=2.0)
                for name in ("1f1b", "zb-h1", "zbv", "dualpipev")}
longest = max(tl.makespan for tl in zb_timelines.values())
fig, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
for k, (ax, tl) in enumerate(zip(axes, zb_timelines.values())):
    pics.draw_timeline(tl, ax=ax, tmax=longest)
    if k < 3:
        ax.set_xlabel("")
fig.tight_layout()
plt.show()

# %% [markdown]
# How much idle time is left? The papers give it per rank and per step, in the op times. Qi et
# al. (Table 2) give (P - 1)(T_F + T_B + T_W) for 1F1B and (P - 1)(T_F + T_B - T_W) for ZB-H1, with
# their T_B our I. ZBV has no bubble when F = I = W (section 6). DualPipe's README gives
# (PP/2 - 1)(F&B + B - 3W), counted over PP = 2P chunks, a chunk's F, its whole backward B and
# its W, with F&B the time of one overlapped pair. With no overlap, F&B = F + B. As a fraction
# of the step, the bubble is bubble / (bubble + m (F + B)). The column "no check" is explained
# two sections down.

# %%
print(f"{'P=4, m=8, F=I=W=1':20s}{'idle':>7s}{'no check':>10s}{'formula':>9s}   "
      "activations at peak, per rank (formula: rank 0)")
for name, tl in zb_timelines.items():
    formula = zb.paper_bubble_fraction(name, 4, 8, f=1, i=1, w=1)
    peaks = ", ".join(f"{x:g}" for x in tl.peak_activations())
    print(f"{name:20s}{tl.idle_fraction():7.1%}{tl.idle_fraction(sync=False):10.1%}"
          f"{formula:9.1%}   {peaks}  ({zb.paper_peak_activations(name, 4):g})")

# %% [markdown]
# ZB-H1 leaves a third of 1F1B's idle time: 3 units per rank where 1F1B has 9, as Qi et al.
# state. Its activation memory is not 1F1B's, though. Every rank now holds P = 4 microbatches at
# its peak, where 1F1B's rank r holds P - r, because a microbatch waits with part of its
# activations until its W has run (the simulator counts a whole microbatch). Rank 0, which sets
# the peak, holds no more than under 1F1B. The V schedules hold about the same on every rank.
# DualPipeV holds 2P + 1 = 9 chunks, 4.5 stages' worth: the README's PP + 1, with PP = 8
# chunks.
#
# Which part waits? W of a linear `y = x A` computes `dA = x^T dy`: it needs the linear's input
# `x` and the gradient of its output `dy`, nothing else. Measured on one Llama-shaped layer
# (hidden 512, feed-forward 1,400, 1,024 tokens; `zb.held_for_w`):

# %%
small = llama_shapes.Shape("small", 100, 512, 1, 1400, 8, 8)
held = zb.held_for_w(llama_shapes.Block(small), torch.randn(1, 1024, 512, requires_grad=True))
print(f"saved for backward by the layer's forward: {held['saved'] / 1e6:.1f} MB")
print(f"the linears' inputs, which W needs:        {held['inputs'] / 1e6:.1f} MB "
      f"({held['inputs'] / held['saved']:.0%})")
print(f"their outputs' gradients, made by I:       {held['output_grads'] / 1e6:.1f} MB")
print(f"still alive after torch's own I:           {held['torch_after_i'] / 1e6:.1f} MB")

# %% [markdown]
# So after I, a schedule could free about three quarters of what the forward saved (attention's
# and the activation functions' tensors) and keep the linears' inputs, but it must also keep the
# output gradients I made, another half of it: what waits for W is about three quarters as big
# as the whole. Torch's runtime frees none of it: `stage_backward_input` (in
# `torch/distributed/pipelining/_backward.py`) computes I with `retain_graph=True` and keeps the
# graph's nodes where the weight path splits off, which reach back to the stage's input, so
# every saved tensor stays alive until W: there, the whole microbatch waits, as the simulator
# counts it.
#
# DualPipeV's simulated bubble is half the README's. Torch starts each half of a pair as soon as
# its own input has arrived. The README's formula counts a pair as one unit that starts when
# both inputs are there, as DeepSeek's runtime runs it. Simulated that way (`pair_time=1`), the
# bubble is exactly the README's:

# %%
paired = ps.simulate("dualpipev", p=4, m=8, backward_ratio=2.0, pair_time=1.0)
print(f"DualPipeV, each pair one unit: idle {paired.idle_fraction():.1%}, "
      f"README {zb.paper_bubble_fraction('dualpipev', 4, 8, f=1, i=1, w=1):.1%}")

# %% [markdown]
# ### Where they do not reach zero
#
# The formulas hold under conditions. The simulator shows what happens when a condition fails.
# For ZB-H1, Qi et al.'s formula matches the simulation exactly when W takes no longer than F
# or I and m >= P (`tests/test_zero_bubble.py` sweeps the times). ZBV's zero needs F = I = W
# and m >= 2P - 1: torch's `ScheduleZBVZeroBubble` plans `max(2P - 1, m)` microbatches and
# leaves the missing ones' slots empty (`_calculate_single_rank_operations` in
# `torch/distributed/pipelining/schedules.py`). Below its bound a formula does not apply
# ("none"), and fewer microbatches leave every schedule idle:

# %%
cases = [("F:I:W = 1:1:1, m = 8", 8, (1, 1, 1)), ("F:I:W = 1:1.5:0.5, m = 8", 8, (1, 1.5, 0.5)),
         ("F:I:W = 1:0.5:1.5, m = 8", 8, (1, 0.5, 1.5)), ("F:I:W = 1:1:1, m = 2", 2, (1, 1, 1))]
print(f"{'P = 4, no check':26s}{'ZB-H1':>7s}{'formula':>9s}{'ZBV':>8s}{'formula':>9s}")
for label, m, (f, i, w) in cases:
    times = dict(backward_ratio=i + w, weight_share=w / (i + w))
    h1, v = (ps.simulate(name, p=4, m=m, **times).idle_fraction(sync=False)
             for name in ("zb-h1", "zbv"))
    formulas = [f"{zb.paper_bubble_fraction(name, 4, m, f, i, w):9.1%}"
                if m >= zb.min_microbatches(name, 4) and (name != "zbv" or f == i == w)
                else f"{'none':>9s}" for name in ("zb-h1", "zbv")]
    print(f"{label:26s}{h1:7.1%}{formulas[0]}{v:8.1%}{formulas[1]}")
zbv_idle = [ps.simulate("zbv", p=4, m=m, backward_ratio=2.0, weight_share=0.5)
            .idle_fraction(sync=False) for m in range(4, 8)]
print("ZBV, F = I = W, P = 4, m = 4 to 7: " + ", ".join(f"{x:.1%}" for x in zbv_idle)
      + f" idle (2P - 1 = {zb.min_microbatches('zbv', 4)})")

# %% [markdown]
# A long I, 1.5 units, makes ZB-H1's bubble larger, 20.0 %, and its formula follows. A long W,
# 1.5 units, sets the formula to (P - 1)(1 + 0.5 - 1.5) = 0, but the simulation keeps 5.9 %: the
# formula counts every W as filling idle time, and a W longer than the gap it is put in delays
# what comes after it instead. ZBV keeps some idle time whenever the three times differ. With
# m = 2 < P, there are not enough microbatches to fill the pipeline: both schedules idle for
# almost half the step. ZBV needs more than P: each microbatch short of 2P - 1 leaves one
# forward's time idle on every rank, so it reaches zero only at m = 7 on 4 ranks (at m = 3 on
# 2).
#
# ### F = I = W holds for a linear layer, not for a transformer layer
#
# For one linear layer, F, I and W are each one matrix product of the same size, so equal
# times are a fair model. A transformer layer also multiplies activations by activations: the
# attention scores q k^T and their product with v. These have no weights, so they add to F
# (two products) and to I (four: the gradients of q, k, v and of the scores), and nothing to
# W; norms, softmax and the activation function have no weights either. `fiw_times.Layer` is
# a pre-norm layer (width 256, 4 heads, 512 tokens) with its attention written out as matrix
# products, and `fiw_times.layer_flops` counts its products (`tests/test_fiw_times.py` checks
# the count against `torch.utils.flop_counter.FlopCounterMode`). The schedules, run with times
# in proportion to those counts:

# %%
flops = fiw_times.layer_flops(hidden=256, seq=512, heads=4)
print({k: f"{v / flops['W']:.2f} x W" for k, v in flops.items()})
print(fiw_times.compare_table(flops, p=4, m=8, label="FLOPs"))

# %% [markdown]
# And the same layer timed on this machine (one thread; I and W as torch's pipeline runs them,
# `stage_backward_input` and `stage_backward_weight`). The times differ from machine to machine;
# on the one that built this notebook, I came out longer than F and W shorter, further apart
# than the counts, because the weightless norm, softmax and GELU add their backward to I:

# %%
# NBVAL_IGNORE_OUTPUT
measured = fiw_times.measure_fiw(hidden=256, seq=512, heads=4)
print({k: f"{measured[k] * 1e3:.1f} ms" for k in "FIW"})
print(fiw_times.compare_table(measured, p=4, m=8))

# %% [markdown]
# 1F1B does not change (it never splits B). The zero-bubble schedules lose part of their gain:
# I is on the critical path and longer than the model says, and W is too short to fill the
# gaps it was meant to fill. ZBV's zero holds only at equal times. The longer the sequence
# against the width, the larger I gets against W (`benchmarks/fiw_times.py --seq 2048
# --hidden 128`).
#
# ### Try it: the schedule explorer
#
# The explorer below plays a schedule with `ps.simulate` for the P, m and v you choose, the op
# times (F : I : W, with B = I + W), and one rank slowed down if you like. It sets the
# simulated bubble beside the formula, with and without the optimizer's global check, and shows
# the activations each rank holds at its peak. It starts at the 1F1B chart of the first section.
# **Predict, then move the controls:**
#
# 1. What bubble does the formula give for 1F1B at P = 4 and m = 16? And what will rank 0 hold
#    at its peak? Predict both, then move m.
# 2. Make rank 2 twice as slow. Will m = 32 bring the bubble back down to the formula's?
#    Predict, then try it.
# 3. Choose ZB-H1 with F : I : W = 1 : 1 : 1 at P = 4, m = 8. What should it hold at its peak on
#    rank 3, compared with 1F1B's one microbatch? Then predict what a W of 1.5 does.

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
# process, for both schedules, P = 2 and 4, and two seeds. Starting ranks takes about a second,
# and each pipeline here takes milliseconds. So one launch per P runs every pipeline of this
# section, and of the zero-bubble section further down, one after the other
# (`pp.jobs_worker`):

# %%
def max_diff(results, seed, m, depth, stages):
    """Largest |difference| of loss and every gradient between a pipeline run and one process."""
    loss, grads = pp.reference_step(seed=seed, batch=m * 3, width=16, depth=depth, p=stages)
    worst = abs(next(res["loss"] for res in results if res["loss"] is not None) - loss)
    for rank, res in enumerate(results):  # a V schedule's rank holds two stages
        by_stage = res["grads"] if isinstance(res["grads"], dict) else {rank: res["grads"]}
        for stage, got in by_stage.items():
            for a, b in zip(got, grads[stage]):
                worst = max(worst, (torch.as_tensor(a) - b).abs().max().item())
    return worst


runs = {}
for p in (2, 4):
    jobs = {("send/recv", s, seed): (pp.pipeline_worker, dict(schedule=s, m=4, seed=seed,
                                                              microbatch=3, depth=4))
            for s in ("gpipe", "1f1b") for seed in (0, 1)}
    jobs |= {("torch", s, 0): (pp.torch_pipeline_worker, dict(schedule=s, m=4, seed=0,
                                                              microbatch=3, depth=4))
             for s in ("gpipe", "1f1b")}
    jobs |= {("send/recv", "zb-h1", seed): (zbp.split_pipeline_worker,
                                            dict(schedule="zb-h1", m=2 * p, seed=seed, depth=4))
             for seed in (0, 1)}
    jobs |= {("torch", s, seed): (zbp.torch_split_worker, dict(schedule=s, m=2 * p, seed=seed,
                                                               depth=8))
             for s in ("zbv", "dualpipev") for seed in (0, 1)}
    if p == 2:  # what the ranks' torch.distributed.pipelining offers
        jobs[("torch", "classes", 0)] = (pp.schedule_classes, {})
    if p == 4:  # the optimizer step's global check, two ways (explained further down)
        jobs |= {("post-validation", max_norm, 0): (zbp.post_validation_worker,
                                                    dict(seed=0, max_norm=max_norm))
                 for max_norm in (1e6, 1e-3)}
    results = launch.run(pp.jobs_worker, p, list(jobs.values()), timeout_s=120,
                         show_output=False)
    runs[p] = {key: [results[rank][k] for rank in range(p)] for k, key in enumerate(jobs)}

for schedule in ("gpipe", "1f1b"):
    for p in (2, 4):
        worst = max(max_diff(runs[p]["send/recv", schedule, seed], seed, m=4, depth=4, stages=p)
                    for seed in (0, 1))
        print(f"send/recv {schedule:5s} P={p}: matches one process (max |diff| < 1e-6):",
              worst < 1e-6)

# %% [markdown]
# The same pipeline written with PyTorch's API takes a few lines: wrap each rank's stage in a
# `PipelineStage` (given the boundary shape, like our `recv` buffers) and drive it with a
# schedule. `ScheduleGPipe` and `Schedule1F1B` handle the microbatching, the send/recv and the
# 1/m scaling of gradients. Its schedule classes, as the ranks' torch lists them:

# %%
print(textwrap.fill(f"torch {torch.__version__.split('+')[0]}, torch.distributed.pipelining: "
                    + ", ".join(runs[2]["torch", "classes", 0][0]), width=90,
                    subsequent_indent="    "))

# %% [markdown]
# We check `ScheduleGPipe` and `Schedule1F1B` against one process and against our hand-written
# version:

# %%
for schedule in ("gpipe", "1f1b"):
    for p in (2, 4):
        mine, theirs = runs[p]["send/recv", schedule, 0], runs[p]["torch", schedule, 0]
        same = all(torch.allclose(torch.as_tensor(a), torch.as_tensor(b), atol=1e-6)
                   for r in range(p) for a, b in zip(mine[r]["grads"], theirs[r]["grads"]))
        print(f"torch.distributed.pipelining {schedule:5s} P={p}: matches one process:",
              max_diff(theirs, seed=0, m=4, depth=4, stages=p) < 1e-6,
              "| matches send/recv:", same)

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
pics.draw_timeline(measured[4][2]["timeline"], ax=ax2, title="measured timeline, P=4, m=4")
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
# ## Zero-bubble schedules on real ranks
#
# The course's own ZB-H1, `zbp.split_pipeline_worker`, is the send/recv pipeline above with the
# backward split. Each rank's stage is a `bs.SplitStage`, whose forward, I and W are written out
# by hand. After an I the rank sends the input gradient at once. It runs that microbatch's W where
# ZB-H1's order (`ps.schedule_order("zb-h1", ...)`) puts it, and until then keeps what W needs:
# each layer's input and the gradient of its output. Torch's `ScheduleZBVZeroBubble` and
# `ScheduleDualPipeV` (`zbp.torch_split_worker`) give each rank two `PipelineStage`s in a V.
# Rank 0 holds the first and the last stage, so it gets the loss. All three ran in the launches
# above, against one process, for P = 2 and 4 and two seeds:

# %%
for name, schedule, depth in (("ZB-H1, send/recv", "zb-h1", 4), ("ZBV, torch", "zbv", 8),
                              ("DualPipeV, torch", "dualpipev", 8)):
    for p in (2, 4):
        key = "send/recv" if schedule == "zb-h1" else "torch"
        stages = p if schedule == "zb-h1" else 2 * p
        worst = max(max_diff(runs[p][key, schedule, seed], seed, m=2 * p, depth=depth,
                             stages=stages) for seed in (0, 1))
        print(f"{name:17s} P={p}: matches one process (2 seeds, max |diff| < 1e-6):",
              worst < 1e-6)

# %% [markdown]
# To time them, every op is stretched as before: F, I and W take 10 ms each per rank (a chunk of
# a V half of that), a whole backward B 20 ms. This is Qi et al.'s T_F = T_B = T_W. Torch's
# stages record their ops through a `PipelineStage` subclass that timestamps `forward_one_chunk`,
# `backward_one_chunk` (B, or I when torch splits) and `backward_weight_one_chunk` (W). The same
# launch counts the bytes of the activations each rank keeps for a later I or W. On torch's
# stages, `torch.autograd.graph.saved_tensors_hooks` sees every tensor autograd saves, and
# counts it until autograd lets it go. The measurement takes a few seconds:

# %%
# NBVAL_IGNORE_OUTPUT
zb_measured = zbp.measure_schedules(4, 8, ("1f1b", "zb-h1", "zbv", "dualpipev"), op_time_s=0.01,
                                    steps=2)
print(f"{'P=4, m=8':10s}{'idle: sim':>10s}{'measured':>9s}{'no check':>9s}   idle per rank "
      "measured (simulated)")
for name, row in zb_measured.items():
    sim = ps.simulate(name, p=4, m=8, backward_ratio=2.0)
    per_rank = ", ".join(f"{x:.0%} ({y:.0%})" for x, y in zip(row["rank_idle"],
                                                              sim.rank_idle_fractions()))
    print(f"{name:10s}{sim.idle_fraction():10.1%}{row['idle']:9.1%}{row['idle_nosync']:9.1%}   "
          f"{per_rank}")

# %%
fig, axes = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
longest = max(zb_measured[name]["timeline"].makespan for name in ("zb-h1", "dualpipev"))
for ax, name in zip(axes, ("zb-h1", "dualpipev")):
    tl = zb_measured[name]["timeline"]
    pics.draw_timeline(tl, ax=ax, tmax=longest, title=f"measured: {style.label(name)}, P=4, "
                       f"m=8, idle {tl.idle_fraction():.1%}")
axes[0].set_xlabel("")
axes[1].set_xlabel("seconds")
fig.tight_layout()
plt.show()

# %% [markdown]
# On real ranks every schedule idles more than its simulation, by the messages and wake-ups of
# every op, as GPipe did. ZB-H1 still idles less than 1F1B. The V schedules send each
# microbatch across every rank twice, twice as many messages as ZB-H1, and their ops (a chunk's)
# are half as long. On a CPU, where a message and a wake-up cost around a millisecond
# (`benchmarks/zero_bubble.py` prints the excess per op), that can cost them more than the
# simulation says they save. (`tests/test_zero_bubble.py` asserts, on real ranks, that ZB-H1
# idles less than 1F1B and that no schedule idles less than its simulation on any rank.)
#
# ## What they cost: memory, and the optimizer's global check
#
# **Memory.** The launch above also counted each rank's activation bytes at their peak. One block
# per stage makes a microbatch keep the same bytes after its F and after its I, so bytes divided
# by one microbatch's bytes counts microbatches. Here is that count beside the simulator's:

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'P=4, m=8':10s}activations held at peak per rank: measured (predicted)")
for name, row in zb_measured.items():
    predicted = ps.simulate(name, p=4, m=8).peak_activations()
    print(f"{name:10s}" + ", ".join(f"{x:g} ({y:g})" for x, y in zip(row["peak"], predicted)))

# %% [markdown]
# ZB-H1 holds P = 4 microbatches on every rank, against 1F1B's P - r. The V schedules hold about
# P on every rank, except the last, which measures less than predicted. Its two chunks are the
# neighbouring stages P - 1 and P, so the activation that stage P - 1 hands to stage P stays in
# place, and one tensor serves both. (`tests/test_zero_bubble.py` asserts each count.)
#
# **The optimizer's global check.** The "no check" columns earlier assumed that a rank may start
# its next step as soon as its own work is done. Most training setups do not allow that.
# Clipping needs the gradient norm over all stages, and fp16 training with a loss scaler needs a
# check for inf and NaN over all stages. Both are an all-reduce before the optimizer step, so
# every rank waits for the slowest one's last W. For ZBV that wait was the whole bubble: 5.9 %
# with the check, 0 % without. Qi et al. (section 4) remove the wait with *post-validation*. The
# partial norm travels forward from stage to stage. Each stage steps at once with the clipping
# factor its partial norm gives, and keeps its old weights. The last stage knows the whole norm
# and sends it back. A stage whose factor was wrong rolls back and steps again. The synchronous
# answer is unchanged. Two runs on 4 ranks, SGD with clipping at a threshold the norm stays
# under, and at one it exceeds:

# %%
for max_norm in (1e6, 1e-3):
    res = runs[4]["post-validation", max_norm, 0]
    want = zbp.post_validation_reference(seed=0, max_norm=max_norm, p=4)
    same = all(torch.allclose(torch.as_tensor(a), torch.as_tensor(b), atol=1e-6)
               for rank in range(4) for key in ("sync", "validated")
               for a, b in zip(res[rank][key], want[rank]))
    print(f"clip at {max_norm:g}: rolled back on ranks",
          [rank for rank in range(4) if res[rank]["rolled_back"]],
          "| both ways equal one process's clip_grad_norm_ + SGD:", same)

# %% [markdown]
# Under the threshold nobody rolls back. Over it, every stage but the last used a partial norm
# that was too small and redoes its step. Either way the weights are the ones the in-order check
# gives. The price here is a kept copy of the weights, and a second step after each rollback.
#
# **Rolling back AdamW in place.** Qi et al.'s code keeps no copy. A stage steps early only
# while the norm summed so far needs no clipping (`can_local_step` in their Megatron fork); if
# the whole norm then says it did, the stage inverts its AdamW step in place
# (`rollback_adamw`, `megatron/core/optimizer/zbpp_optimizer_helper.py`): the update is
# recomputed from the new moments, p = (p' + lr m_hat / (sqrt(v_hat) + eps)) / (1 - lr wd), each
# moment is un-updated with the gradient, m = (m' - (1 - b1) g) / b1 and likewise v, and the step
# count goes back by one. No copy is kept, but the gradient must stay until the check arrives,
# and the inverse is exact only up to rounding. (Their `--enable-exactly-numeric-match` keeps a
# copy of the weights and both moments instead.) `post_validation.post_validation_run` does
# both on 4 stages, 3 AdamW steps, with a threshold every step exceeds, against
# `clip_grad_norm_` + `torch.optim.AdamW` in one process (`post_validation.adamw_step` is
# torch's AdamW op for op, equal bit for bit; a third way keeps the early step and never
# rolls back):

# %%
pv = post_validation.post_validation_run(p=4, steps=3, max_norm=0.12)
for way, r in pv["ways"].items():
    print(f"{way:12s} rollbacks {r['rollbacks']}   largest |w - reference| "
          f"{r['max_abs_diff']:.1e}   bytes kept for rolling back {r['extra_bytes']:,}")

# %% [markdown]
# The kept copy ends equal to the reference bit for bit, at 12 bytes per fp32 parameter it
# copies; the inverse ends about 3e-8 away with no copy; not rolling back leaves the weights
# 1e-3 away after three steps. The course's SGD version above keeps the copy: it is exact,
# and its weights are tiny. Which global check a step needs depends on the precision: clipping
# always needs the norm; the inf/NaN check belongs to fp16 with a loss scaler
# (`torch.amp.GradScaler`, made for float16), and bf16 training usually runs without one
# (Megatron's optimizer sets no grad scaler for bf16), leaving only the norm.
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
# The GPipe measurement ran on real gloo ranks with 10 ms forwards and 20 ms backwards. Its gap
# to the formula grows with m, because every extra op pays for a message and a wake-up:
# `benchmarks/pipeline_bubble.py` runs the same measurement with more steps, for both
# from-scratch and `torch.distributed.pipelining`.

# %%
# NBVAL_IGNORE_OUTPUT
print("measured - formula:", "   ".join(
    f"P={p}: m=1 {rows[0]['measured'] - rows[0]['formula']:+.2f}, "
    f"m={rows[-1]['m']} {rows[-1]['measured'] - rows[-1]['formula']:+.2f}"
    for p, rows in measured.items()))

# %% [markdown]
# And each schedule of this notebook at P = 4, m = 8, F = I = W (every idle share with the
# optimizer's global check): the bubble from its paper's formula, simulated and measured, and
# the activations each rank holds at its peak, predicted and measured.
# `benchmarks/zero_bubble.py` prints the same table with more steps.

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'P=4, m=8':10s}{'formula':>8s}{'simulated':>10s}{'measured':>9s}   "
      "peak per rank: predicted | measured")
for name, row in zb_measured.items():
    sim = ps.simulate(name, p=4, m=8, backward_ratio=2.0)
    predicted = ", ".join(f"{x:g}" for x in sim.peak_activations())
    print(f"{name:10s}{zb.paper_bubble_fraction(name, 4, 8, f=1, i=1, w=1):8.1%}"
          f"{sim.idle_fraction():10.1%}{row['idle']:9.1%}   {predicted} | "
          + ", ".join(f"{x:g}" for x in row["peak"]))

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
# * A backward is two jobs: the input gradient I, which the previous stage waits for, and the
#   weight gradient W, which can wait. At F = I = W, ZB-H1 fills two thirds of 1F1B's bubble
#   with W's, and every rank then holds P microbatches. ZBV reaches zero only with
#   F = I = W, m >= 2P - 1 and no global check before the optimizer step, and DualPipeV's
#   bubble depends on how its pairs run (it needs m >= 2P). With m < P none of them helps.
# * The papers' formulas hold under conditions (W no longer than F or I for ZB-H1; equal times
#   for ZBV): the simulator shows what happens outside them.
# * A zero bubble needs steps that do not wait for a global check: post-validation steps at once
#   and rolls back when the whole norm says so.
# * The slowest stage sets the pace. Balance the stages before adding microbatches.
# * The measured bubble is above the formula because every op pays for communication and
#   waking up, and smaller microbatches also compute less efficiently.
# * The effective batch counts examples per microbatch, accumulation steps and DP degree,
#   never the TP or PP degree.

# %% [markdown]
# **Next**: the assignment `a5_pipeline` (in your workspace under `assignments/a5_pipeline/`)
# practises the bubble arithmetic, reading timelines, batch accounting and a zero-bubble
# schedule's bubble and memory, and has you write a pipeline step that runs on real gloo ranks
# and matches one process. Module 6, *Building a device mesh*, combines DP, TP and PP on one
# mesh and adds the axes beyond them.

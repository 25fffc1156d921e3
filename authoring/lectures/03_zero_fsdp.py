# %% [markdown]
# # Module 3: ZeRO and FSDP
#
# Plain data parallelism gives every rank a full copy of the training state. In the lesson's
# mixed-precision Adam layout that is 16 bytes for each parameter: bf16 weights (2), bf16
# gradients (2), an fp32 master copy (4) and two fp32 Adam moments (8). ZeRO removes the
# duplication in three stages, each sharding (cutting into D slices, one per rank) more of it.
# With D data-parallel ranks:
#
# | layout | what is sharded | persistent bytes per rank |
# | --- | --- | --- |
# | replicated DP | nothing | 16N |
# | ZeRO-1 | optimizer state (master + moments, 12 B) | (4 + 12/D)N |
# | ZeRO-2 | ... and gradients | (2 + 14/D)N |
# | ZeRO-3 | ... and weights | 16N/D |
#
# This notebook does not take the table on trust. It builds all three stages from collectives
# on real gloo ranks, trains a small model with each, checks that every stage computes the same
# model as one unsharded process, and measures the bytes each rank keeps.

# %%
import functools
import math

import matplotlib.pyplot as plt
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from course_utils import collectives, launch, memory, style, zero
from course_utils.widgets.zero_shards import ZeroShards
from course_utils.zero import fsdp

style.use()

# %% [markdown]
# ## 1. The table at N = 7B, D = 8
#
# `memory.zero_state_bytes` applies the formulas. 1 GB = 10⁹ bytes; 1 GiB = 2³⁰ bytes.

# %%
N, D = 7e9, 8
print(f"{'layout':<14}{'weights':>9}{'grads':>8}{'optim':>8}{'total GB':>10}{'GiB':>8}")
for stage in memory.ZERO_STAGES:
    b = memory.zero_state_bytes(N, dp=D, stage=stage)
    print(f"{zero.STAGE_NAMES[stage]:<14}{b['weights'] / 1e9:>9.2f}{b['grads'] / 1e9:>8.2f}"
          f"{b['optimizer'] / 1e9:>8.2f}{b['total'] / 1e9:>10.2f}{memory.to_gib(b['total']):>8.2f}")

# %% [markdown]
# Only ZeRO-3 keeps shrinking as D grows. ZeRO-1 and ZeRO-2 level off at the replicated part
# (4N and 2N bytes); replicated DP does not shrink at all.

# %%
dps = [1, 2, 4, 8, 16, 32, 64]
fig, ax = plt.subplots(figsize=(8, 4.2))
for stage in memory.ZERO_STAGES:
    gb = [memory.zero_state_bytes(N, dp=d, stage=stage)["total"] / 1e9 for d in dps]
    ax.plot(dps, gb, marker="o", label=zero.STAGE_NAMES[stage])
ax.axhline(64, color="0.5", ls="--", lw=1)
_ = ax.annotate("64 GB device", xy=(1, 64), xycoords=("axes fraction", "data"), xytext=(6, 0),
                textcoords="offset points", va="center", color="0.3")  # beside its line
ax.set_xscale("log", base=2)
ax.set_yscale("log")
_ = ax.set_xticks(dps, [str(d) for d in dps])
_ = ax.set_yticks([2, 5, 10, 20, 50, 100], ["2", "5", "10", "20", "50", "100"])
ax.minorticks_off()
_ = ax.set_xlabel("data-parallel ranks D")
_ = ax.set_ylabel("persistent GB per rank")
_ = ax.set_title("7B parameters, 16 bytes each", loc="left")
_ = ax.legend(loc="lower left")
plt.tight_layout()
plt.show()

# %% [markdown]
# ### Try it: which rank keeps which shard
#
# The view below draws, for a stage and D, each rank's share of the three parts of the state
# (one row per rank, the strips as wide as the bytes per parameter), with the same formula and
# the bytes each rank sends in one step (`zero.expected_comm_bytes`, section 6 checks it against
# real runs). It starts at the lesson's 7B model on 8 ranks under ZeRO-2. **Predict, then move
# the controls:**
#
# 1. What does a ZeRO-2 rank keep at D = 64? Write down your number before you move the
#    slider. Why does it stop shrinking?
# 2. Which stage sends more per step than replicated DP's all-reduce, and how much more?
#    Predict, then switch the stage.

# %%
ZeroShards(params_b=7, ranks=8, stage=2)

# %% [markdown]
# ## 2. Check yourself, worked out
#
# *An eight-rank job uses the 7B model with ZeRO-2. A colleague says its persistent state is
# 112/8 = 14 GB per GPU. Is that right?*
#
# No. Dividing everything by 8 is ZeRO-3. ZeRO-2 shards gradients and optimizer state but keeps
# a full copy of the bf16 weights on every rank:

# %%
weights = 7e9 * 2                 # bf16 weights, replicated
grads_and_optimizer = 7e9 * 14 / 8  # 2 B gradients + 12 B master and moments, sharded over 8
print(f"weights (replicated):           {weights / 1e9:.2f} GB")
print(f"gradients + optimizer (sharded): {grads_and_optimizer / 1e9:.2f} GB")
print(f"ZeRO-2 per rank:                {(weights + grads_and_optimizer) / 1e9:.2f} GB")
zero3 = memory.zero_state_bytes(7e9, dp=8, stage=3)["total"]
print(f"112/8 is the ZeRO-3 figure:      {zero3 / 1e9:.2f} GB")

# %% [markdown]
# These are persistent bytes only. Activations, temporary buffers and (under ZeRO-3) gathered
# layers come on top of them.
#
# ## 3. The two collectives ZeRO is built from
#
# *All-gather*: each rank contributes a shard and every rank ends with the concatenation.
# *Reduce-scatter*: each rank contributes a full tensor and rank r ends with shard r of the sum.
# An all-reduce does the same job as a reduce-scatter followed by an all-gather, which is why
# ZeRO-1 and ZeRO-2 can shard without sending more than data parallelism. Both collectives run
# here on two real gloo ranks:

# %%
fig, axes = plt.subplots(2, 1, figsize=(7.5, 3.6))
for ax, name in zip(axes, ["all_gather", "reduce_scatter"]):
    before, after = collectives.run_collective(name, world_size=2, show_output=False)
    print(f"{name:>14}: before {[t.tolist() for t in before]} -> after {[t.tolist() for t in after]}")
    collectives.draw_collective(name, before, after, ax=ax)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 4. ZeRO-1, 2 and 3 from collectives
#
# `course_utils.zero.ZeroDP` is one data-parallel rank. The model is a bf16 MLP; each Linear
# layer is one *unit* whose weight and bias are flattened into one buffer, padded with zeros
# to a multiple of D, and cut into D equal slices of S = ceil(n/D) elements. Rank r owns slice
# r of the fp32 master copy and both Adam moments (ZeRO-1), of the gradient (ZeRO-2), and of
# the bf16 weights (ZeRO-3). One step:
#
# * **replicated DP**: backward, all-reduce the gradients, every rank updates everything.
# * **ZeRO-1**: backward into full bf16 gradients (kept between steps), then reduce-scatter them
#   (rank r receives the mean of slice r), Adam on my slice of the master copy, round it to
#   bf16, all-gather the new weights.
# * **ZeRO-2**: the same collectives, but a layer's gradient is reduce-scattered *during*
#   backward, as soon as autograd has accumulated it: a hook registered with
#   `register_post_accumulate_grad_hook` on the layer's weight and bias fires, reduce-scatters
#   the layer into its gradient slice and frees the full gradient before the next layer's
#   exists. Reduce-scattering after the whole backward would save nothing at the peak: every
#   layer's full gradient would exist at once.
# * **ZeRO-3**: no full weights at all. Before a layer's forward its slices are all-gathered,
#   used, and released; backward gathers them again, computes the layer's gradient and
#   reduce-scatters it straight into the rank's gradient slice.
#
# The model has three units. With 2 ranks every unit splits evenly; with 3 the first unit
# (544 elements) needs 2 elements of padding:

# %%
SIZES = [16, 32, 32, 8]
units = zero.unit_sizes(SIZES)
print("elements per unit:", units, "N =", sum(units))
for dp in (2, 3):
    shards = [zero.shard_numel(n, dp) for n in units]
    print(f"D={dp}: slice per rank {shards}, padding {[s * dp - n for s, n in zip(shards, units)]}")

# %% [markdown]
# Train three steps with each stage on 2 ranks, then once more as a single process holding the
# whole model (`reference_train`: the same micro-batches one after another, their gradients
# averaged, `MixedPrecisionAdam`). Every stage must give the same losses and weights.

# %%
runs = {dp: zero.run_all_stages(dp, SIZES, seed=0, reduce_dtype="bf16" if dp == 2 else "fp32")
        for dp in (2, 3)}
reference = zero.reference_train(SIZES, seed=0, n_steps=3, dp=2, reduce_dtype="bf16")
print(f"{'':<14} {'losses':<32}{'same losses':<13}max |weight - reference|")
print(f"{'reference':<14} {[round(v, 6) for v in reference['losses']]}")
for stage in zero.STAGES:
    rank_results = runs[2][stage]
    worst = max(zero.max_abs_diff(r["params"], reference["params"]) for r in rank_results)
    same_loss = rank_results[0]["losses"] == reference["losses"]
    losses = str([round(v, 6) for v in rank_results[0]["losses"]])
    print(f"{zero.STAGE_NAMES[stage]:<14} {losses:<32}{same_loss!s:<13}{worst}")

# %% [markdown]
# Bit for bit the same model. With 2 ranks a bf16 sum of two numbers has one rounding, whichever
# rank adds; dividing by 2 is exact. With more ranks each partial sum of a ring is rounded to
# bf16 again, and the result depends on the order the collective adds in. So the 3-rank runs
# reduce in fp32 (`reduce_dtype="fp32"`), like their reference, and match it too:

# %%
reference3 = zero.reference_train(SIZES, seed=0, n_steps=3, dp=3, reduce_dtype="fp32")
for stage in zero.STAGES:
    worst = max(zero.max_abs_diff(r["params"], reference3["params"]) for r in runs[3][stage])
    print(f"D=3 {zero.STAGE_NAMES[stage]:<14} max |weight - reference| = {worst}")

# %% [markdown]
# Order is the smaller problem; precision is the larger. bf16 keeps 8 significant bits (fp32
# keeps 24), so every addition rounds to about 2 to 3 decimal digits, and the rounding errors of
# a long sum add up. `zero.sum_rounding_error` adds D bf16 gradients one rank at a time, in bf16
# or in fp32, and rounds the mean to bf16 (where it is stored) once at the end:

# %%
for dtype in (torch.bfloat16, torch.float32):
    eps = torch.finfo(dtype).eps  # the gap between 1 and the next number
    print(f"{str(dtype):<15} eps = 2^{math.log2(eps):.0f}: {1 - math.log2(eps):.0f} significant bits")
print("in bf16, 256 + 1 =", (torch.tensor(256.0, dtype=torch.bfloat16) + 1).item())
print(f"{'ranks D':<9}{'summed in bf16':>16}{'summed in fp32':>16}   mean relative error")
for d in (2, 8, 64):
    print(f"{d:<9}{zero.sum_rounding_error(d, 'bf16'):>16.1e}"
          f"{zero.sum_rounding_error(d, 'fp32'):>16.1e}")

# %% [markdown]
# With 2 ranks both give the same single rounding. Summed in fp32, the error stays at that one
# final rounding for any D; summed in bf16, it grows with the number of ranks. That is why FSDP
# is often configured to reduce gradients in fp32 while it computes in bf16. FSDP2 makes this a
# field of `MixedPrecisionPolicy`, and its defaults are worth knowing:

# %%
print(MixedPrecisionPolicy())

# %% [markdown]
# By default (torch 2.13) the policy changes no dtype at all: `param_dtype=None` all-gathers
# and computes in the parameters' own dtype, `reduce_dtype=None` reduces the gradients in the
# dtype they were computed in, `output_dtype=None` leaves the forward outputs as they are, and
# `cast_forward_inputs=True` casts floating-point inputs to `param_dtype`, which does nothing
# while `param_dtype` is `None`. So setting only `param_dtype=torch.bfloat16` also makes the
# reduce-scatter run in bf16; fp32 reduction has to be asked for with
# `reduce_dtype=torch.float32`. (FSDP2 then casts the reduced slice back to the parameters' own
# dtype for the optimizer.)

# %% [markdown]
# ## 5. Measured bytes per rank against the formula
#
# `ZeroDP.state_bytes()` adds up the storages a rank really holds after a step (each storage
# once): bf16 weights or weight slices, bf16 gradients or gradient slices, and the fp32 master
# slice with its two moments. Adam's step counters (4 bytes each) are bookkeeping outside the
# 16-byte layout and are left out. "formula" is `padded_state_bytes` (sharded parts hold
# S = ceil(n/D) per unit); "ideal" is the table's formula with exact N/D.

# %%
for dp in (2, 3):
    print(f"D = {dp}, N = {sum(units)}")
    print(f"  {'stage':<14}{'weights':>8}{'grads':>7}{'optim':>7}{'measured':>10}{'formula':>9}"
          f"{'ideal':>10}{'padding B':>10}")
    for stage in zero.STAGES:
        got = runs[dp][stage][0]["bytes"]
        want = zero.padded_state_bytes(units, dp=dp, stage=stage)["total"]
        ideal = memory.zero_state_bytes(sum(units), dp=dp, stage=stage)["total"]
        print(f"  {zero.STAGE_NAMES[stage]:<14}{got['weights']:>8}{got['grads']:>7}"
              f"{got['optimizer']:>7}{got['total']:>10}{want:>9}{ideal:>10.1f}{got['total'] - ideal:>10.1f}")

# %% [markdown]
# With 2 ranks every measured total equals the lesson's formula to the byte. With 3 ranks the
# 2 padding elements of unit 0 sit in the last rank's slice; every rank allocates the same
# slice size, so each pays for 2/3 of an element in every sharded buffer: 12 B × 2/3 = 8 B
# at ZeRO-1, (2 + 12) × 2/3 ≈ 9.3 B at ZeRO-2, 16 × 2/3 ≈ 10.7 B at ZeRO-3. Padding costs
# at most D − 1 elements per unit, which is nothing for a real model.
#
# ## 6. Communication per step
#
# Every collective the engine issues is logged with its buffer size. A ring all-gather or
# reduce-scatter of a P-element buffer makes each rank send (D−1)/D × P elements; a ring
# all-reduce twice that. Replicated DP all-reduces the gradients; ZeRO-1/2 reduce-scatter them
# and all-gather the new weights (the same bytes); ZeRO-3 all-gathers every layer twice, for
# forward and again for backward, plus the reduce-scatter: 1.5× the traffic.

# %%
print(f"{'stage':<14}{'all-reduce':>11}{'red-scat':>9}{'all-gath':>9}{'total B':>9}{'expected':>9}"
      f"{'vs DP':>7}")
dp_bytes = runs[2][0][0]["comm"]["total"]
for stage in zero.STAGES:
    c = runs[2][stage][0]["comm"]
    want = zero.expected_comm_bytes(units, dp=2, stage=stage)["total"]
    print(f"{zero.STAGE_NAMES[stage]:<14}{c['all_reduce']:>11.0f}{c['reduce_scatter']:>9.0f}"
          f"{c['all_gather']:>9.0f}{c['total']:>9.0f}{want:>9.0f}{c['total'] / dp_bytes:>7.2f}")

# %% [markdown]
# These are bytes *sent per rank*, by the ring model; the real time also depends on latency,
# bucket sizes and overlap. At 7B parameters in bf16 and D = 8 the same rule gives:

# %%
big = [7_000_000_000]
for stage in zero.STAGES:
    sent = zero.expected_comm_bytes(big, dp=8, stage=stage)["total"]
    print(f"{zero.STAGE_NAMES[stage]:<14}{sent / 1e9:6.2f} GB sent per rank per step")

# %% [markdown]
# ## 7. The peak is not the persistent state
#
# Between steps a ZeRO-2 rank holds full weights and gradient slices, a ZeRO-3 rank only
# slices. During the step both hold more. ZeRO-2's backward produces each layer's full-size
# gradient, which exists until its hook reduce-scatters it. ZeRO-3 cannot compute with a
# slice: each layer is gathered in full for forward, released, gathered again for backward,
# and its full-size gradient exists until it is reduce-scattered. The engine records the bytes
# it holds at each event of the last step (persistent state, gathered weights, unsharded
# gradients; activations and the collectives' temporary buffers come on top and are not
# counted here).
#
# The y-axis starts just under the persistent state, so that the layers coming and going are
# visible. Each tick is one event, labelled by what happened and to which layer: `g1` gathers
# layer 1, `p1` prefetches it, `r1` releases it, `∇1` computes its gradient, `rs1`
# reduce-scatters that gradient (and frees it, and under ZeRO-3 the layer).

# %%
timelines = {"ZeRO-2": runs[2][2][0]["timeline"], "ZeRO-3": runs[2][3][0]["timeline"],
             "ZeRO-3 + prefetch": runs[2]["3+prefetch"][0]["timeline"]}
fig = zero.draw_memory_timelines(timelines)
plt.show()
for name, rows in timelines.items():
    _, peak = zero.timeline_peak(rows)
    total = sum(peak[kind] for kind in zero.TIMELINE_KINDS)
    print(f"{name:<18} persistent {rows[0]['persistent']} B, peak {total} B at '{peak['event']}'")
zero2 = timelines["ZeRO-2"][0]["persistent"]
print(f"ZeRO-2 holding every full gradient at once: {zero2} + 2 x {sum(units)} = "
      f"{zero2 + 2 * sum(units)} B")

# %% [markdown]
# ZeRO-2's peak is its persistent state plus one layer's full gradient, the largest (layer 1:
# 1056 elements, 2112 B), never all of them. ZeRO-3's peak is the persistent slices plus the
# largest layer gathered in full plus its unsharded gradient. Prefetching (starting the next
# layer's all-gather before computing this one, so the transfer overlaps the compute) raises
# the peak by one more gathered layer. Overlap only pays when there is enough independent
# compute to hide the transfer *and* the memory headroom to hold two layers at once; on a
# device that is already full, prefetch is the first thing to switch off.
#
# **Gradient accumulation and ZeRO-2.** With several micro-batches per optimizer step, the
# gradients of all micro-batches must be summed before the update, and ZeRO-2 must choose at
# every micro-batch. Either it keeps the full gradients until the last micro-batch (2N bytes on
# every rank, as ZeRO-1 holds, and the saving is gone), or it reduce-scatters each layer after
# every micro-batch and adds the result into its gradient slice (the memory stays at ZeRO-2's,
# but the reduce-scatter is sent once per micro-batch instead of once per step). FSDP2 offers
# both: by default every backward reduce-scatters and adds into the sharded gradient;
# `set_requires_gradient_sync(False)` skips the reduce-scatter and keeps unsharded gradients.
#
# ## 8. The real APIs: `ZeroRedundancyOptimizer`
#
# PyTorch's ZeRO-1 (here with DDP and fp32 weights, so Adam's state is its two moments, 8 bytes
# per parameter) does not cut a flat buffer. It gives each rank whole parameters, largest first,
# so the shards are uneven. It trains the same model as single-process Adam:

# %%
zro = launch.run(functools.partial(fsdp.zero_redundancy_worker, sizes=SIZES, seed=0, n_steps=3),
                 2, timeout_s=180)
ref32 = fsdp.reference_adam(SIZES, seed=0, n_steps=3, dp=2)
even = 8 * sum(units) / 2
print(f"even split of the Adam moments: {even:.0f} B per rank")
print(f"{'rank':<6}{'owns':<42}{'params':>7}{'moments B':>11}  max |weight - reference|")
for rank, r in enumerate(zro):
    worst = zero.max_abs_diff(r["params"], ref32["params"])
    owned = ", ".join(r["owned"])
    print(f"{rank:<6}{owned:<42}{r['owned_numel']:>7}{r['adam_bytes']:>11}  {worst}")

# %% [markdown]
# Our flat-buffer ZeRO-1 gives each rank exactly 1/D of the optimizer state (plus at most
# D − 1 padding elements per unit); whole-parameter assignment can leave one rank with much
# more, and the most loaded rank decides whether the job fits.
#
# ## 9. The real APIs: FSDP2 `fully_shard`
#
# `fully_shard` on each Linear, then on the whole model, turns every parameter into a DTensor
# split by rows. It keeps fp32 weights, fp32 gradients and fp32 Adam moments sharded:
# 4 + 4 + 8 = 16 bytes per parameter, all divided by D, the same total as ZeRO-3 in the
# 16-byte layout. (The runs below use the default `MixedPrecisionPolicy()`, so they compute in
# fp32; with `param_dtype=torch.bfloat16` the bf16 compute copies are made on the fly.)
# `reshard_after_forward` chooses the schedule: `True` frees the gathered weights after forward
# and gathers again for backward (ZeRO-3); `False` keeps them until backward, one all-gather
# fewer but full weights held through the step, as ZeRO-2 holds them.

# %%
fsdp_runs = {raf: launch.run(functools.partial(fsdp.fsdp2_worker, sizes=SIZES, seed=0,
                                               reshard_after_forward=raf, n_steps=3),
                             2, timeout_s=180)
             for raf in (True, False)}
r0 = fsdp_runs[True][0]
print("rank 0 shard shapes:", ", ".join(f"{n} {'×'.join(map(str, shape))}"
                                      for n, shape in r0["local_shapes"].items()))
b, ours = r0["bytes"], runs[2][3][0]["bytes"]["total"]
print(f"rank 0 bytes: weights {b['weights']} + grads {b['grads']} + optimizer {b['optimizer']} = "
      f"{b['weights'] + b['grads'] + b['optimizer']} (from-scratch ZeRO-3: {ours})")
print(f"{'one step':<34}{'all-gathers':>12}{'reduce-scatters':>16}{'held fwd->bwd':>15}"
      f"  max |weight - reference|")
for raf, res in fsdp_runs.items():
    c, worst = res[0]["comm_counts"], zero.max_abs_diff(res[0]["params"], ref32["params"])
    name = f"FSDP2 reshard_after_forward={raf}"
    print(f"{name:<34}{c['all_gather']:>12}{c['reduce_scatter']:>16}"
          f"{res[0]['held_after_forward']:>13} B  {worst}")
for stage in (2, 3):
    c, name = runs[2][stage][0]["comm_counts"], "from-scratch " + zero.STAGE_NAMES[stage]
    print(f"{name:<34}{c['all_gather']:>12}{c['reduce_scatter']:>16}"
          f"{'':>15}  (all-reduces: {c['all_reduce']})")

# %% [markdown]
# `reshard_after_forward=True` issues 6 all-gathers per step for 3 layers (forward and backward),
# like our ZeRO-3; `False` issues 3 and holds the full weights (D times its shard) between forward and
# backward. (Our ZeRO-2 also issues 3 all-gathers, after the update instead of before forward.)
# Both FSDP2 runs match single-process fp32 Adam exactly.
#
# With bf16 compute (`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`) FSDP2 and
# our ZeRO-3 compute the same forward passes, but FSDP2 keeps fp32 gradients where the
# 16-byte layout rounds them to bf16, so the losses agree to about four digits:

# %%
fsdp_mp = launch.run(functools.partial(fsdp.fsdp2_worker, sizes=SIZES, seed=0,
                                        reshard_after_forward=True, n_steps=3, micro_batch=4,
                                        lr=1e-2, mixed_precision=True),
                     2, timeout_s=180)
print("FSDP2 bf16:          ", [round(v, 4) for v in fsdp_mp[0]["losses"]])
print("from-scratch ZeRO-3: ", [round(v, 4) for v in runs[2][3][0]["losses"]])

# %% [markdown]
# ## Summary
#
# * ZeRO-1, -2 and -3 are data parallelism with the duplicated state cut into slices: each
#   stage here computed exactly the model one process computes.
# * The bytes a rank keeps match (4 + 12/D)N, (2 + 14/D)N and 16N/D, plus at most D − 1
#   padding elements per sharded buffer.
# * ZeRO-1/2 send what an all-reduce sends; ZeRO-3 sends 1.5× as much.
# * ZeRO-2 reduce-scatters each layer's gradient as backward produces it, so its peak holds one
#   layer's full gradient, not all of them; gradient accumulation forces a choice between
#   keeping full gradients and reduce-scattering every micro-batch.
# * ZeRO-3's peak is the slices plus a gathered layer and its gradient, plus activations;
#   prefetching adds another gathered layer.
# * A bf16 sum loses precision as D grows, so gradients are often reduced in fp32. FSDP2's
#   `MixedPrecisionPolicy()` changes no dtype by default; fp32 reduction needs `reduce_dtype`.
# * `ZeroRedundancyOptimizer` shards whole parameters (uneven); FSDP2 shards every parameter by
#   rows, and `reshard_after_forward` trades an all-gather for memory.

# %% [markdown]
# **Next**: the assignment `a3_zero` (in your workspace under `assignments/a3_zero/`) practises
# ZeRO's memory accounting for any N and D, picks the smallest stage that fits a device, and has
# you write one rank's sharded Adam update from a reduce-scattered gradient, run on real ranks.
# Then **Module 4: Tensor parallelism** splits a single layer's matrices across devices.

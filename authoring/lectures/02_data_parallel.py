# %% [markdown]
# # Module 2: Data parallelism and the all-reduce
#
# In data parallelism every rank (one process of the distributed job) holds the same weights and
# trains on different examples. After the backward pass the ranks combine their gradients with
# an **all-reduce**, so every replica takes the same step and the weights stay identical.
#
# This notebook runs everything on real processes: each demo starts gloo ranks on this machine
# through `course_utils.launch`, and each result is set beside what a single process computes.
# By the end you can follow one update across two replicas, say where the gradient
# normalization belongs (and what happens when local batches are unequal), build an all-reduce
# from point-to-point messages, count its bytes, and name what limits scaling.

# %%
import functools
import os

import matplotlib.pyplot as plt
import torch

from course_utils import collectives, data_parallel, launch, style
from course_utils.collectives import ring as ring_allreduce
from course_utils.widgets.ring_steps import RingSteps

style.use()

# %% [markdown]
# ## 1. Follow one update across two replicas
#
# Both replicas start from weights $w = [1, 1]$. Their local batches have the same size and give
# mean gradients $[2, 4]$ (rank 0) and $[6, 0]$ (rank 1). An all-reduce with SUM gives both ranks
# $[8, 4]$; dividing by the number of ranks $D = 2$ gives the mean $[4, 2]$, and SGD with learning
# rate 0.1 moves both replicas to $[1, 1] - 0.1 \times [4, 2] = [0.6, 0.8]$. Here it is on two
# ranks, each printing what it holds:

# %%
grads, w_start, lr = [[2.0, 4.0], [6.0, 0.0]], [1.0, 1.0], 0.1
weights = launch.run(functools.partial(data_parallel.two_replica_update_worker,
                                       local_grads=grads, w0=w_start, lr=lr), 2)
mean, expected = data_parallel.sgd_reference(local_grads=grads, w0=w_start, lr=lr)
print("single process: mean gradient", mean, "-> weights", [round(v, 6) for v in expected])
print("replicas identical:", weights[0] == weights[1])

# %% [markdown]
# The ranks never exchange weights, only gradients. They stay in step because they start equal
# and apply the same update; DDP broadcasts rank 0's weights once at start-up to make the first
# part true.
#
# ## 2. All-reduce and its relatives
#
# A **collective** is a communication call that every rank of a group makes together. Five of
# them carry almost all of data parallelism and of the sharding in the next module. In the
# pictures, each row is a rank, each cell one element; a cell's colour says which rank's input
# it came from, and a striped cell is a reduction over the ranks of its colours. Rank r's input
# is 10r + 1, 10r + 2, ... so the tens digit shows the rank. Each collective runs once here, on
# two real ranks (root 0 where there is one):

# %%
fig, axes = plt.subplots(5, 1, figsize=(8, 9.5))
for ax, name in zip(axes, collectives.COLLECTIVES):
    before, after = collectives.run_collective(name, world_size=2, show_output=False)
    print(f"{name.replace('_', '-'):>14}: {[t.tolist() for t in before]} -> "
          f"{[t.tolist() for t in after]}")
    collectives.draw_collective(name, before=before, after=after, ax=ax)
plt.tight_layout()
plt.show()

# %% [markdown]
# * **all-reduce**: every rank ends with the combination (here the sum) of everyone's tensor.
#   This is the gradient synchronization of data parallelism.
# * **reduce**: only the root ends with the sum. PyTorch documents nothing about the other
#   ranks' buffers afterwards, so treat them as scratch (grey in the picture) and never read
#   them. In this run gloo happened to leave rank 1's buffer as it was, [11, 12] above.
# * **broadcast**: every rank ends with the root's tensor (DDP uses it for the initial weights).
# * **all-gather**: each rank contributes a shard; every rank ends with all shards in rank order.
# * **reduce-scatter**: each rank contributes a full tensor; rank r ends with shard r of the sum.
#
# A reduce-scatter followed by an all-gather of the result is an all-reduce. Section 5 builds
# an all-reduce exactly that way.

# %%
x = collectives.example_inputs("reduce_scatter", 2)
shards = collectives.reference("reduce_scatter", x)
print("reduce-scatter then all-gather:", collectives.reference("all_gather", shards)[0].tolist())
print("all-reduce:                    ", collectives.reference("all_reduce", x)[0].tolist())

# %% [markdown]
# ## 3. A sum needs its normalization somewhere
#
# The loss is a mean over examples, so the gradient we want is a mean too. A SUM all-reduce
# returns D times the mean; the division has to happen exactly once, either after the sum or
# inside the collective with `ReduceOp.AVG`. Whether AVG is accepted depends on backend and
# version: the NCCL backend needs NCCL 2.10 or later; gloo gained it in PyTorch 2.8 (pull
# request #149781, a SUM followed by a division), and gloo in PyTorch 2.7 and earlier raises
# "Cannot use ReduceOp.AVG with Gloo". The `ReduceOp` docstring, even in 2.13, still says
# NCCL only. Two bugs are common: forgetting the division (gradients D times too large, like
# a learning rate D times too high) and dividing again after AVG (D times too small). Each mode
# on two real gloo ranks (the AVG rows check that this install's gloo accepts AVG):

# %%
synced = launch.run(functools.partial(data_parallel.all_normalizations_worker,
                                      local_grads=grads), 2, show_output=False)
for mode in data_parallel.NORMALIZATIONS:
    assert synced[0][mode] == synced[1][mode]
    print(f"{style.label(mode):>16}: every rank uses {synced[0][mode]}")
print(f"torch {torch.__version__.split('+')[0]}: gloo all_reduce with ReduceOp.AVG ran and gave "
      f"the mean: {synced[0]['avg_op'] == synced[0]['sum_then_divide']}")

# %% [markdown]
# With D = 2 the bugs are a factor of 2 either way; with D = 64 they are a factor of 64. Plain
# SGD then diverges or crawls. Adam divides each gradient by its own running RMS, so a constant
# factor almost cancels, and the loss curve can look normal while the gradients are wrong: check
# gradients against a single-process run, not only the loss (Module 7 does this).
#
# ## 4. Unequal local batches: weight by example count
#
# "Sum and divide by D" is the mean over all examples only when every rank has the same number
# of examples. Take a linear regression with 4 examples, split 1 and 3 across two ranks, and the
# mean-squared-error loss. Averaging the two ranks' *mean* gradients gives the lone example on
# rank 0 weight 1/2 and each example on rank 1 weight 1/6: a different objective from the mean
# over all 4 examples, where each weighs 1/4. The fix: all-reduce the gradient *sums*
# ($n_r \times$ local mean) and the counts $n_r$, then divide sum by sum.

# %%
X, y = data_parallel.make_regression(seed=0, n=4)
shards = data_parallel.split_by_counts(X=X, y=y, counts=[1, 3])
w0 = torch.zeros(2, dtype=torch.float64)
lr, steps = 0.1, 60
runs = {}
for weighting in data_parallel.WEIGHTINGS:
    print(f"--- {style.label(weighting)}")
    worker = functools.partial(data_parallel.unequal_batch_worker, shards=shards, w0=w0, lr=lr,
                               steps=steps, weighting=weighting)
    runs[weighting] = torch.tensor(launch.run(worker, 2)[0], dtype=torch.float64)
full = data_parallel.full_batch_train(X=X, y=y, w0=w0, lr=lr, steps=steps)
reweighted = data_parallel.weighted_train(shards=shards, w0=w0, lr=lr, steps=steps)
print("single process, full batch, step-1 gradient:",
      [round(v, 4) for v in ((w0 - full[1]) / lr).tolist()])
torch.testing.assert_close(runs["example_weighted"], full)
torch.testing.assert_close(runs["mean_of_means"], reweighted)
print("example-weighted DP == full-batch training at all", steps, "steps: True")
print("mean-of-means DP == training on the re-weighted loss (1/2, 1/6, 1/6, 1/6): True")

# %% [markdown]
# The naive run does not fail; it converges, to the minimum of the wrong objective. Both
# minimums, in closed form (weighted least squares), against where each run ends:

# %%
for weighting in data_parallel.WEIGHTINGS:
    target = data_parallel.least_squares_minimizer(shards, weighting)
    end = [round(v, 3) for v in runs[weighting][-1].tolist()]
    print(f"{style.label(weighting):>16}: after {steps} steps {end}"
          f", minimum of its objective {[round(v, 3) for v in target.tolist()]}")
loss = {k: ((X @ v[-1] - y) ** 2).mean().item() for k, v in runs.items()}
print(f"full-data loss: example-weighted {loss['example_weighted']:.4f}, "
      f"mean of means {loss['mean_of_means']:.4f}")

# %%
fig, ax = plt.subplots(figsize=(7, 4.5))
looks = {"example_weighted": ("weighted by example count (= full batch)",
                              style.AXIS_COLORS["dp"], "-"),
         "mean_of_means": ("mean of the ranks' means (re-weighted)", "0.45", "--")}
for weighting in data_parallel.WEIGHTINGS:
    words, color, line = looks[weighting]
    path = runs[weighting]
    ax.plot(path[:, 0], path[:, 1], line, marker=".", color=color, label=words, clip_on=False)
    target = data_parallel.least_squares_minimizer(shards, weighting)
    ax.plot(*target.tolist(), "x", markersize=11, mew=2, color=color, clip_on=False)
ax.plot([], [], "x", color="black", label="minimum of that run's objective")
ax.margins(0.08)
_ = ax.set_xlabel("w[0]")
_ = ax.set_ylabel("w[1]")
_ = ax.set_title("Two data-parallel runs from w = [0, 0], 60 steps each")
_ = ax.legend(loc="upper left")
plt.show()

# %% [markdown]
# Where unequal batches come from: the last batch of an epoch, a dataset that does not divide
# by D, variable-length sequences when the loss is a mean over *tokens* (each rank has a
# different number of tokens even with the same number of sequences), and masked examples.
# DDP itself always divides by D, so with unequal counts scale each rank's loss by
# $n_r D / N$ (or use a sum loss and divide by the global count) before `backward`.
#
# ## 5. Ring all-reduce from send and receive
#
# An all-reduce is not magic: it is messages between pairs of ranks. The ring algorithm cuts
# the flat tensor of N elements into D shards (sizes differ by at most one when D does not
# divide N). Rank r sends only to rank r + 1 and receives only from rank r − 1:
#
# 1. **Reduce-scatter phase** (D − 1 steps): at step s, rank r sends shard (r − s) mod D and adds
#    the shard it receives into its own copy. Afterwards rank r holds the complete sum of shard
#    (r + 1) mod D.
# 2. **All-gather phase** (D − 1 steps): each rank passes the complete shards around the ring,
#    overwriting its stale copies.
#
# Three ranks, 7 elements (7 is not divisible by 3), after each phase:

# %%
inputs = [torch.arange(1, 8, dtype=torch.float32) * 10**r for r in range(3)]
phases = launch.run(ring_allreduce.ring_phases_worker, 3, inputs)
bounds = collectives.shard_bounds(7, 3)
ints = lambda values: "[" + ", ".join(f"{v:g}" for v in values) + "]"  # noqa: E731
print(f"{'rank':<6}{'complete after reduce-scatter':<32}after all-gather")
for rank, (after1, after2) in enumerate(phases):
    lo, hi = bounds[(rank + 1) % 3]
    print(f"{rank:<6}{f'shard {(rank + 1) % 3} = {ints(after1[lo:hi])}':<32}{ints(after2)}")
print(f"{'sum over ranks':<38}{ints(torch.stack(inputs).sum(0).tolist())}")

# %% [markdown]
# The same ring must work for any size and 2 to 4 ranks; `tests/test_ring_allreduce.py` checks
# it on random sizes (including 0, 1 and sizes below D). A spot check against gloo's own
# all-reduce:

# %%
for world_size, n in [(2, 5), (3, 100), (4, 3)]:
    g = torch.Generator().manual_seed(n)
    ins = [torch.randn(n, generator=g) for _ in range(world_size)]
    out = launch.run(functools.partial(ring_allreduce.ring_worker, inputs=ins), world_size,
                     show_output=False)
    for values, _ in out:
        torch.testing.assert_close(torch.tensor(values), torch.stack(ins).sum(0))
    print(f"D={world_size}, N={n}: ring == sum on every rank: True")

# %% [markdown]
# ### Bytes on the wire
#
# Every step, every rank sends one shard of about N/D elements, and there are 2(D − 1) steps.
# So each rank sends $2(D-1)/D \times N \times$ (bytes per element). That is almost
# independent of D: for large D each rank sends just under twice the buffer, however many ranks
# share the work. The ring counts what it sends; with 4 ranks and N = 1000 float32 values:

# %%
ins = [torch.ones(1000) for _ in range(4)]
out = launch.run(functools.partial(ring_allreduce.ring_worker, inputs=ins), 4, show_output=False)
print("bytes sent per rank:", [stats["bytes_sent"] for _, stats in out])
print("2(D-1)/D x N x 4   =", ring_allreduce.ring_bytes_per_rank(1000, 4))
print("(sending the whole buffer once would be", 1000 * 4, "bytes; twice,", 2 * 1000 * 4, ")")

# %% [markdown]
# For the lesson's 7B model with bf16 gradients (2 bytes each) on D = 8 ranks, every rank sends
# this much per step:

# %%
per_rank = ring_allreduce.ring_bytes_per_rank(numel=7 * 10**9, world_size=8, element_size=2)
print(f"{per_rank / 1e9:.2f} GB per rank per step (2 x 7/8 x 14 GB of gradients)")

# %% [markdown]
# ### Step by step: a recorded run of the ring
#
# The stepper below replays the course's ring, recorded once on real gloo ranks
# (`course_utils.collectives.ring_trace`: the phases above, traced step by step), for 2 to 8 ranks and a
# buffer of N = 840 float32 per rank: which shard each rank sends at step k, what every shard of
# every rank holds (a cell's colours are the ranks whose data it contains, read from the
# values the run produced), and the bytes sent so far. It also replays a reduce-scatter, an
# all-gather, and an all-to-all built from the same sends and receives. **Predict, then move
# the slider:**
#
# 1. On 4 ranks, which shard does rank 0 hold complete after the reduce-scatter phase (step 3)?
#    And which shards does it hold only partly summed?
# 2. Each rank sends 5,040 B in the all-reduce on 4 ranks. How many on 2 ranks, and on 8? Work
#    them out with 2(D − 1)/D × N × 4 B, then set D.

# %%
RingSteps(collective="all_reduce", ranks=4)

# %% [markdown]
# ### Bytes are not time: the alpha-beta model
#
# The bytes each rank sends barely depend on D; the time does. The alpha-beta model charges
# every message a fixed latency α (start-up, synchronization, software) plus its size over the
# link bandwidth β. The ring's 2(D − 1) steps run one after another, each sending n/D bytes:
#
# $$T_\text{ring} \approx 2(D-1)\,\alpha + \frac{2(D-1)}{D}\,\frac{n}{\beta}$$
#
# The bandwidth term stays below 2n/β for every D; the latency term grows linearly with D.
# `ring_allreduce.ring_time_s` computes it; with α = 10 µs, β = 10 GB/s and n = 1 GB:

# %%
alpha, beta, n_bytes = 10e-6, 10e9, 10**9
model = functools.partial(ring_allreduce.ring_time_s, bandwidth_bytes_per_s=beta)
print(f"{'D':>5}  {'sent per rank':>13}  {'latency term':>12}  {'bandwidth term':>14}  "
      f"{'total':>9}  {'latency share':>13}")
for d in [2, 8, 64, 1024, 8192]:
    sent = ring_allreduce.ring_bytes_per_rank(numel=n_bytes, world_size=d, element_size=1)
    latency = model(n_bytes=0, world_size=d, alpha_s=alpha)
    bandwidth = model(n_bytes=n_bytes, world_size=d, alpha_s=0)
    print(f"{d:>5}  {sent / 1e9:>10.3f} GB  {latency * 1e3:>9.2f} ms  {bandwidth * 1e3:>11.2f} ms  "
          f"{(latency + bandwidth) * 1e3:>6.1f} ms  {latency / (latency + bandwidth):>13.0%}")
bucket = 25 * 2**20  # DDP's default cap (bucket_cap_mb=25) for every bucket but the first, in bytes
crossover = next(d for d in range(2, 10**5) if model(n_bytes=0, world_size=d, alpha_s=alpha)
                 > model(n_bytes=bucket, world_size=d, alpha_s=0))
print(f"25 MiB bucket: the latency term is the larger one from D = {crossover}")

# %% [markdown]
# At 8192 ranks almost half of the 1 GB all-reduce is latency, and a small message (one DDP
# bucket) is latency-bound from a few hundred ranks on. That is why NCCL does not only use
# rings: since NCCL 2.4 it also has a double binary tree, whose latency term grows with log₂ D
# instead of D, and it picks an algorithm for each call from the message size, the number of
# ranks and the hardware (on suitable hardware also NVLink SHARP and in-network reductions).

# %% [markdown]
# ### Timing the ring against gloo
#
# A textbook ring waits for each whole shard before adding it. The library's pipelined
# version cuts each shard into pieces of about 1 MiB (at most 16) and forwards every piece as
# soon as it arrives, so that transfers, additions and both phases can overlap. At the three
# sizes timed below, on 2 ranks, a shard is cut into:

# %%
sizes = [2**16, 2**20, 2**22]  # bytes: 64 KiB, 1 MiB, 4 MiB of float32
for nbytes in sizes:
    pieces = ring_allreduce.default_pieces(numel=nbytes // 4, world_size=2)
    print(f"{nbytes // 2**10:>5} KiB: shard of {nbytes // 2**11:>5} KiB -> {pieces} piece(s)")

# %% [markdown]
# So at 64 KiB and 1 MiB there is nothing to pipeline: both rings send the same two whole
# shards per rank and differ only in bookkeeping (how they post the messages, which buffers
# receive them); at 4 MiB two pieces leave little to overlap. Do not expect the pipelined ring
# to win here. On gloo over one CPU host every piece costs its own Python-level `isend`,
# `irecv`, `wait` and slice addition, and the same few cores run the interpreter, copy the
# bytes through TCP sockets and add them, so there is no idle link for the overlap to hide
# work behind. In our runs, at each of the three sizes, the pipelined ring was faster than the
# textbook one in some runs and slower in others. Pipelining pays where each piece is cheap to
# issue and the links are otherwise idle, as inside NCCL's GPU kernels. Timings on a shared
# machine vary from run to run (the cell's output is not checked); `benchmarks/ring_allreduce.py`
# measures 1, 16 and 64 MiB with more repeats.

# %%
# NBVAL_IGNORE_OUTPUT
times = launch.run(functools.partial(ring_allreduce.bandwidth_worker, sizes_bytes=sizes,
                                     repeats=3, include_simple=True), 2, show_output=False)[0]
print(f"{'tensor size':>24}: " + ", ".join(f"{s // 2**10:>5} KiB" for s in sizes))
fig, ax = plt.subplots(figsize=(7, 4.2))
looks = [("gloo", "gloo's all-reduce", "0.3", "--", "s"),
         ("ring", "ring, pipelined", style.AXIS_COLORS["dp"], "-", "o"),
         ("simple", "ring, textbook", style.PHASE_COLORS["communication"], ":", "^")]
for name, words, color, line, marker in looks:
    ms = [t * 1e3 for t in times[name]]
    ax.plot([s / 2**10 for s in sizes], ms, line, marker=marker, color=color, label=words,
            clip_on=False)
    print(f"{words:>24}: " + ", ".join(f"{t:5.2f} ms" for t in ms))
ax.set_xscale("log")
ax.set_yscale("log")
_ = ax.set_xticks([s / 2**10 for s in sizes], [f"{s // 2**10:,}" for s in sizes])
low = min(t for name, *_ in looks for t in times[name]) * 1e3
high = max(t for name, *_ in looks for t in times[name]) * 1e3
ticks = [v for v in [0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500] if low / 2 <= v <= high * 2]
_ = ax.set_yticks(ticks, [f"{v:g}" for v in ticks])
ax.minorticks_off()
_ = ax.set_xlim(sizes[0] / 2**10 / 1.5, sizes[-1] / 2**10 * 1.5)
_ = ax.set_ylim(min(low / 1.5, ticks[0]), max(high * 1.5, ticks[-1]))
_ = ax.set_xlabel("tensor size (KiB, float32)")
_ = ax.set_ylabel("time per all-reduce (ms)")
_ = ax.set_title("All-reduce on 2 ranks (median of 3 runs)")
_ = ax.legend(loc="upper left")
plt.show()

# %% [markdown]
# Small tensors are dominated by the fixed cost of each message (latency), large ones by
# bandwidth. That is why DDP packs gradients into buckets (by default the first capped at
# 1 MiB and the others at 25 MiB, `bucket_cap_mb`: module 9 reads real DDP's buckets) instead
# of all-reducing each parameter on its own, and (from its second step on) starts each
# bucket's all-reduce as soon as its gradients are ready, overlapping communication with the
# rest of the backward pass.
#
# ## 6. A data-parallel loop from scratch, DDP, and one process
#
# A from-scratch data-parallel step is: forward and backward on the local slice of the batch,
# then all-reduce every gradient (SUM) and divide by D, then the optimizer step. PyTorch's
# `DistributedDataParallel` does the same inside `backward` (bucketed, overlapped, and already
# divided by D). Both must equal one process training on the whole global batch. Three seeds,
# three SGD steps, global batch 8 split over 2 ranks:

# %%
seeds = [0, 1, 2]
per_rank = launch.run(functools.partial(data_parallel.dp_compare_worker, seeds=seeds), 2,
                      show_output=False)
for seed in seeds:
    ref_params, ref_losses = data_parallel.train_single(seed=seed)
    for results in per_rank:
        for mode in ["scratch", "ddp"]:
            params, losses = results[seed, mode]
            torch.testing.assert_close(torch.tensor(params), ref_params)
            torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses))
    print(f"seed {seed}: from-scratch DP == DDP == single process "
          f"(losses {[round(v, 4) for v in ref_losses]})")

# %% [markdown]
# ### Gradient accumulation with `no_sync`
#
# To train with a global batch larger than fits in one forward pass, each rank runs several
# micro-batches and adds up their gradients before the step (scaling each micro-batch loss by
# 1/number of micro-batches). Only the last backward needs to synchronize: inside
# `ddp.no_sync()` DDP skips the all-reduce and just accumulates locally. The forward pass must
# be inside `no_sync` too, because DDP decides during forward whether the next backward syncs.
# A comm hook counts DDP's all-reduces; 4 micro-batches per rank, 2 ranks, global batch 16:

# %%
ref_params, _ = data_parallel.train_single(seed=0, steps=2, global_batch=16)
for use_no_sync in [False, True]:
    worker = functools.partial(data_parallel.accumulation_worker, seed=0, micro_batches=4,
                               use_no_sync=use_no_sync, steps=2, global_batch=16)
    out = launch.run(worker, 2, show_output=False)
    for r in out:
        torch.testing.assert_close(torch.tensor(r["params"]), ref_params)
    print(f"no_sync={use_no_sync!s:>5}: {out[0]['allreduces']:.0f} all-reduce(s) per step, "
          "weights == single process on the full batch")

# %% [markdown]
# The effective batch is examples per micro-batch × accumulation steps × DP degree: here
# 2 × 4 × 2 = 16.
#
# ## 7. What limits scaling
#
# More replicas process more examples per second only while each rank stays busy. Here each
# rank trains on a fixed 256 examples per step (the global batch grows with D), one CPU thread
# per rank. Once D exceeds the CPUs this process may use, ranks take turns on them (and any
# other jobs on the machine take their share), so expect the curve to flatten or drop from
# there. What the machine running this notebook has (logical CPUs; a container's CPU quota can
# allow less than either number):

# %%
# NBVAL_IGNORE_OUTPUT
usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
print(f"os.cpu_count(): {os.cpu_count()}, usable by this process: {usable}")

# %% [markdown]
# The throughput at D = 1, 2 and 4 (the output is not checked, since it varies):

# %%
# NBVAL_IGNORE_OUTPUT
scaling = {}
for world_size in [1, 2, 4]:
    worker = functools.partial(data_parallel.throughput_worker, per_rank_batch=256, steps=6,
                               width=256)
    scaling[world_size] = launch.run(worker, world_size, threads_per_rank=1,
                                     show_output=False)[0]
    print(f"D={world_size}: {scaling[world_size]:,.0f} examples/s "
          f"({scaling[world_size] / scaling[1]:.2f}x one rank; ideal {world_size}x)")
ranks = list(scaling)
fig, ax = plt.subplots(figsize=(6, 3.8))
ax.plot(ranks, [scaling[1] * d / 1e3 for d in ranks], "--", color="0.45",
        label="ideal (linear)")
ax.plot(ranks, [scaling[d] / 1e3 for d in ranks], marker="o", color=style.AXIS_COLORS["dp"],
        label="measured", clip_on=False)
_ = ax.set_xticks(ranks, [str(d) for d in ranks])
_ = ax.set_xlim(0.7, 4.3)
_ = ax.set_ylim(0, scaling[1] * 4 / 1e3 * 1.1)
_ = ax.set_xlabel("data-parallel ranks D")
_ = ax.set_ylabel("thousand examples / s")
_ = ax.set_title(f"Throughput at 256 examples per rank, {usable} usable CPUs")
_ = ax.legend(loc="upper left")
plt.show()

# %% [markdown]
# ### A straggler sets the pace
#
# An all-reduce cannot finish until every rank has joined it. Make rank 1 of 2 take 0.2 s
# longer per step (a slow input pipeline, a busier host) and time, on each rank, the "compute"
# and the wait inside `all_reduce`:

# %%
# NBVAL_IGNORE_OUTPUT
straggle = launch.run(functools.partial(data_parallel.straggler_worker, slow_rank=1,
                                        delay_s=0.2), 2, show_output=False)
for rank, r in enumerate(straggle):
    print(f"rank {rank}: compute {r['compute_s'] * 1e3:6.1f} ms, waiting in the all-reduce "
          f"{r['wait_s'] * 1e3:6.1f} ms, step {r['step_s'] * 1e3:6.1f} ms")
fig, ax = plt.subplots(figsize=(7, 2.6))
for rank, r in enumerate(straggle):
    ax.barh(rank, r["compute_s"] * 1e3, height=0.6, color=style.PHASE_COLORS["forward"],
            label="compute" if rank == 0 else None)
    ax.barh(rank, r["wait_s"] * 1e3, left=r["compute_s"] * 1e3, height=0.6,
            color=style.PHASE_COLORS["wait"],
            label="waiting in the all-reduce" if rank == 0 else None)
    for left, width, what in [(0, r["compute_s"], "compute"),
                              (r["compute_s"], r["wait_s"], "waiting")]:
        if width > 0.15 * r["step_s"]:  # label the wide segments inside the bar
            _ = ax.text((left + width / 2) * 1e3, rank, f"{what} {width * 1e3:.0f} ms",
                        ha="center", va="center", color="white")
_ = ax.set_yticks([0, 1], ["rank 0", "rank 1 (slow)"])
_ = ax.set_ylim(1.5, -0.5)  # rank 0 on top
_ = ax.set_xlabel("time per step (ms)")
_ = ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=2, frameon=False)
plt.show()

# %% [markdown]
# The fast rank spends the straggler's extra time waiting inside the collective, so both ranks
# run at the slow one's pace (`tests/test_data_parallel.py` asserts this on every run). With
# many ranks, the slowest of them sets every step, so occasional hiccups on any one rank add up.
#
# What else limits scaling:
#
# * **Synchronization.** Each step moves about 2× the gradient bytes per rank; when that takes
#   longer than the backward pass can hide, adding ranks adds waiting. Bigger per-rank batches
#   (more compute per byte) and bucketing/overlap help.
# * **Input loading.** Every rank needs its own stream of examples each step. If decoding and
#   augmentation cannot keep up, ranks idle, and a rank with a slower loader is a straggler.
# * **The global batch size.** Data parallelism multiplies the global batch by D (at a fixed
#   per-rank batch). Past some size a larger batch stops reducing the number of steps to reach a
#   given loss, and the learning rate and warm-up need retuning. Keeping the global batch fixed
#   instead shrinks the per-rank batch, which lowers each rank's efficiency and raises the
#   communication share.
# * **Memory.** Plain data parallelism keeps the full model state on every rank: more ranks make
#   training faster but never make a model fit. Module 3 shards that state.
#
# ## Summary
#
# * DP: same weights, different examples, all-reduce the gradients, identical update.
# * A SUM all-reduce needs exactly one division by D (or the AVG op); forgetting it makes
#   gradients D times too large.
# * With unequal local batches, weight by example counts; the mean of rank means optimizes a
#   different objective.
# * A ring all-reduce is a reduce-scatter then an all-gather, built from sends and receives;
#   each rank sends 2(D − 1)/D × N × element size bytes.
# * Those bytes barely depend on D, but the time does: the ring's latency term 2(D − 1)α grows
#   with D, which is why NCCL also has trees (latency growing with log₂ D) for large D.
# * From-scratch DP, DDP and single-process training on the global batch compute the same
#   weights; `no_sync` cuts communication during gradient accumulation.
# * Scaling is limited by communication, stragglers, input loading and how large a global batch
#   still trains well.

# %% [markdown]
# **Next**: assignment `a2_data_parallel` (in your workspace under
# `assignments/a2_data_parallel/`) practises one update across replicas, where the division by D
# goes, unequal local batches and the ring's bytes, and has you write the gradient
# synchronization for unequal batches on real gloo ranks. Then **Module 3: ZeRO and FSDP —
# shard the duplicated state**.

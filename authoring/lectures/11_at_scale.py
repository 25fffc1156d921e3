# %% [markdown]
# # Module 11: The lesson at its own scale — real PyTorch sharding on 8 to 16,384 ranks
#
# The lesson's numbers are about big jobs: a 7B model on 8 GPUs (112 GB per GPU replicated,
# 38.5 / 26.25 / 14 GB under ZeRO-1 / 2 / 3) and a 70B model on 32 (TP 4 x PP 2 x DP 4,
# "35 GB per device under ZeRO-3"). The course has so far run at most 8 real ranks with small
# models. This module runs the lesson's own configurations, and bigger ones, with PyTorch's
# real sharding code, in one CPU process:
#
# * PyTorch's **fake process group** (`init_process_group("fake", ...)`): this process plays
#   one rank of a job of any size; collectives return at once and move nothing;
# * Llama-shaped layers on the **meta device** (shapes, no storage: 405B parameters cost
#   nothing), split into pipeline stages evenly by layers (the course's rule: `pipelining`
#   has no split policy; torchtitan and Llama 3 give the end stages a layer fewer);
# * `init_device_mesh`, DTensor's `parallelize_module` (tensor parallelism) and FSDP2's
#   `fully_shard` (ZeRO-3) shard them exactly as on a real cluster; each rank's bytes are read
#   from its sharded tensors and from the state `torch.optim.AdamW` creates;
# * `FakeTensorMode` and `CommDebugMode` trace the collectives of one forward and backward.
#
# Then it checks the simulation against 8 real ranks. The code is in `course_utils`:
# `llama_shapes.py` (the models), `scale_memory.py` (bytes per rank), `scale_comms.py`
# (collectives), `scale_check.py` (real ranks), `scale_tables.py` (the tables), and
# `backend.fake_job` (one rank of a fake job).

# %%
import matplotlib.pyplot as plt
import torch

from course_utils import memory, style
from course_utils.mesh import playground
from course_utils.models import llama_shapes
from course_utils.scale import (check as scale_check, comms as scale_comms, memory as scale_memory,
                                tables as scale_tables)

style.use()
torch.set_num_threads(1)
for name in ("7B", "70B", "405B"):
    print(f"Llama {name}: {llama_shapes.param_count(name):,} parameters")

# %% [markdown]
# The shapes are the published ones (Llama 2 7B and 70B, Llama 3 405B; sources in
# `llama_shapes.py`). None has exactly its name's size: 70B has 8 key/value heads
# (grouped-query attention), so its k and v weights are an eighth of q's.
#
# ## 1. The lesson's configurations, measured
#
# One rank of a fake 8-rank job, FSDP2 over all 8: rank 3's shards, read from the DTensors.

# %%
state = scale_memory.rank_state("7B", dp=8, rank=3)
print(f"rank 3 holds {state['params']:,} parameters ({state['layers']} layers' shards)")
for part in ("weights", "grads", "optimizer", "total"):
    print(f"  {part:<10} {state[part] / memory.GB:6.2f} GB")
print(f"N / 8 = {llama_shapes.param_count('7B') / 8:,.0f}")

# %% [markdown]
# Exactly N / 8: every weight of Llama 7B divides by 8 along its first dimension. The bytes are
# 16 per parameter, as the lesson's, split differently: FSDP2 keeps fp32 weights (4), fp32
# gradients (4) and AdamW's two fp32 moments (8) — the state `AdamW` created in a real `step`
# on the meta shards — where the lesson's mixed-precision layout has 2 + 2 + 12.
#
# The whole table: the lesson's figure (N = 7e9), the course's formula
# (`memory.zero_state_bytes` with the real N), and the simulated figure. What ran, per row
# (column "by"): `replicas`, the whole model and AdamW's state on every rank with no wrapper
# (real DDP also holds its gradient buckets: a second copy of the gradients unless
# `gradient_as_bucket_view=True`, as its docstring in `torch/nn/parallel/distributed.py`
# says); `course`, the course's flat ZeRO-1 and ZeRO-2 shards (`zero.padded_state_bytes`;
# PyTorch's ZeRO-1, `ZeroRedundancyOptimizer`, gives each rank whole parameters instead, so
# its bytes per rank are not (4 + 12 / D) N: `tests/test_zero1.py` shows it); `FSDP2` and
# `FSDP2+TP`, PyTorch's own sharding.

# %%
lesson = scale_tables.lesson_rows()
print(scale_tables.lesson_table(lesson))

# %%
scale_tables.draw_lesson(lesson)
plt.show()

# %% [markdown]
# Every difference in the totals is the parameter count: the lesson rounds 6.74e9 up to 7e9,
# and 68.98e9 up to 70e9. How the bytes split does differ, as the bars show: PyTorch's DDP and
# FSDP2 rows hold fp32 weights and gradients (4 + 4 bytes a parameter, 8 for the moments:
# the model is built in fp32, and FSDP2 keeps each parameter in the dtype it has), the
# course's ZeRO-1 and 2 the lesson's bf16 weights and gradients with a 12-byte fp32 optimizer
# state (master copy and moments). On the 70B mesh the two pipeline stages are not quite equal:

# %%
stages = lesson[-1]["stages"]
print(f"stage 0 (embedding + 40 layers):    {stages[0]:,} bytes")
print(f"stage 1 (40 layers + norm + head):  {stages[1]:,} bytes")
print(f"16 N / 32 = {16 * llama_shapes.param_count('70B') / 32:,.0f} bytes")
print(f"the final norm's DP shard, 8192 / 4 elements x 16 B: {8192 // 4 * 16:,} bytes")

# %% [markdown]
# Tensor parallelism splits the matrices over its 4 ranks but keeps the RMSNorm weights whole
# (every TP rank normalizes the full hidden vector), so each rank holds its norms' DP shard
# only: a little more than 16 N / 32. The last stage has one more norm (the final one): 32,768
# bytes more. The embedding and the head are the same size here (vocabulary x hidden, split
# over TP by vocabulary), so the stages balance.
#
# **Uneven shards.** FSDP2 splits each weight along dim 0 into DP chunks of ceil(rows / DP)
# rows; when the rows do not divide, the last ranks get fewer rows, but every rank allocates
# the padded chunk. On 12 ranks (4096 / 12 does not divide):

# %%
for rank in (0, 11):
    s = scale_memory.rank_state("7B", dp=12, rank=rank)
    print(f"rank {rank:>2}: {s['params']:,} parameters, {s['padded']:,} allocated, "
          f"{s['total'] / memory.GB:.3f} GB")
print(f"16 N / 12 = {16 * llama_shapes.param_count('7B') / 12 / memory.GB:.3f} GB")

# %% [markdown]
# Rank 0 holds more than N / 12 (whole chunks), rank 11 fewer; both allocate the padded size
# for weights and gradients; AdamW's moments follow the real shard (it makes them with
# `zeros_like`).
#
# ## 2. The collectives of one step at scale
#
# Rank 0 of the 70B job, one forward and backward of one 4096-token sequence, traced under
# `FakeTensorMode` (no data, no compute) with PyTorch's `CommDebugMode` and the course's
# `CollectiveLog` (which also records each collective's mesh axis and buffer). FSDP2 gathers
# bf16 weights and reduces bf16 gradients here (`MixedPrecisionPolicy`), as the course's
# formulas assume. Bytes are what one rank sends with ring algorithms.

# %%
rows, trace = scale_tables.comm_rows("70B", tp=4, pp=2, dp=4, rank=0)
print(scale_tables.comm_table(rows))
print(f"layers on this stage: {trace['layers']}, traced: {trace['layers_traced']} "
      "(identical layers: one and two traced, the difference extended)")

# %% [markdown]
# Read it axis by axis:
#
# * **DP, reduce-scatter**: equal to the course's ZeRO-3 formula (`zero.expected_comm_bytes`),
#   once over every gradient, in bf16 as the formula assumes. torchtitan reduces in fp32 by
#   default (its `training.mixed_precision_reduce` is `"float32"`), and so did Llama 3: then
#   the reduce-scatter sends twice as much (the next cell traces it).
# * **DP, all-gather**: 81 gathers, not 82: FSDP2 gathers each layer before its forward and
#   again before its backward, but keeps the root module's own weights (here the embedding)
#   gathered from forward to backward. The course's formula gathers everything twice.
# * **TP, all-reduce**: 281 calls where Megatron's accounting has 4 per layer (160). That
#   count is this trace's TP plan, not PyTorch's only one: each of q, k, v, w1 and w3 is a
#   `ColwiseParallel` that wraps its own plain input, so each all-reduces its input's gradient
#   in backward, 5 per layer instead of 2, plus one for the embedding. Forward matches: 2 per
#   layer. The next cell traces two other plans.
# * **PP**: the stage runs alone, so its sends are counted by the course's rule (one
#   activation per microbatch to the next stage); the framework cannot trace them here.
#
# %%
fp32 = scale_comms.trace_step("70B", tp=4, pp=2, dp=4, rank=0, reduce_dtype="fp32")["rows"]
bf16_gb = trace["rows"][("dp", "reduce_scatter")]["sent"] / 1e9
print(f"DP reduce-scatter, bf16 gradients: {bf16_gb:.2f} GB; "
      f"fp32: {fp32[('dp', 'reduce_scatter')]['sent'] / 1e9:.2f} GB")

# %% [markdown]
# `CommDebugMode` agrees on every count (the trace fails if its total differs from the log's):

# %%
print({f"{axis} {kind}": v["calls"] for (axis, kind), v in sorted(trace["rows"].items())})

# %% [markdown]
# **Three TP plans, the same split.** `llama_shapes.apply_tp` shards the layers under one of
# three plans; they split the weights alike and differ in what a layer's input is:
#
# * `per_linear` (above): each column-parallel linear turns its plain input into a DTensor of
#   its own, so autograd meets five separate partial gradients;
# * `block`: each norm's output becomes one replicated DTensor that q, k and v (or w1 and w3)
#   share (`PrepareModuleOutput(..., use_local_output=False)`), so their input gradients add up
#   as one partial DTensor and are all-reduced once: Megatron's 2 + 2 per layer, with no fused
#   linear;
# * `sequence`: torchtitan's `apply_tp` (sequence parallelism): between layers the activations
#   are split along the sequence, each half-layer all-gathers its input once and
#   reduce-scatters its output; the norms' replicated weights all-reduce their small
#   gradients. torchtitan puts the gather in `PrepareModuleInput` on its attention and
#   feed-forward modules; these blocks have none, so the norm's output is redistributed
#   instead: the same collectives.
#
# Rank 0 of the same 70B job, one step under each:

# %%
print(scale_tables.plan_table(scale_tables.plan_rows("70B", tp=4, pp=2, dp=4, rank=0)))

# %% [markdown]
# Keeping one DTensor input per half-layer saves 120 all-reduces (12 GB for this rank); the
# sequence-parallel plan sends the same bytes as `block` (a ring all-reduce is a
# reduce-scatter and an all-gather), and in exchange each rank keeps only its slice of the
# sequence's activations between layers (module 8). `tests/test_scale.py` runs the three plans
# on 2 real gloo ranks and checks the loss and every gradient against one process.
#
# **One microbatch is not one step.** Everything above is one forward and backward of one
# sequence. A step with PP = 2 runs m >= 2 microbatches through each stage (module 5: a
# schedule needs m >= P to fill its pipe), and each repeats TP's all-reduces and PP's sends.
# The gradients add up over the m microbatches and are reduced once: PyTorch's pipeline
# schedules turn FSDP2's gradient sync and its reshard after backward off for every
# microbatch and reduce-scatter once at the end (`torch/distributed/pipelining/stage.py`,
# `backward_maybe_with_nosync` and `perform_reduce_grad`); `scale_comms.trace_step(...,
# microbatches=m)` does the same with FSDP2's public switches (`set_requires_gradient_sync`,
# `set_reshard_after_backward`). Whether the all-gathers repeat is FSDP2's
# `reshard_after_forward`: by default each layer is freed after its forward and gathered
# again for its backward, every microbatch; torchtitan passes `reshard_after_forward = not
# pp_enabled`, so under PP a stage keeps its (bf16) weights gathered for the whole step.
# Rank 0, a step of 4 microbatches, traced three ways:

# %%
steps = scale_tables.step_rows("70B", tp=4, pp=2, dp=4, rank=0, microbatches=4)
print(scale_tables.step_table(steps))

# %% [markdown]
# TP's all-reduces and PP's sends grow with m (1,124 = 4 x 281); DP's reduce-scatter does
# not (41 calls, once per step). DP's all-gathers are 41 + 40 m under FSDP2's default (the
# first forward gathers the 40 layers and the root, each microbatch's backward gathers the
# layers again) and 41 under torchtitan's setting, the same for any m: it trades the
# gathers for holding the stage's gathered weights through the step. Per step, TP's
# traffic is what grows: a reason TP stays inside a node.

# %% [markdown]
# ## 3. Checked on real ranks
#
# Is the fake job the real one? `scale_check.check` runs a small Llama-shaped model on 6 real
# gloo ranks (PP 2 x DP 3: a 100-word vocabulary and a hidden size of 32, so that most shards
# do not divide by 3 and FSDP2 pads them), records each rank's bytes (the gradients measured
# after a real backward) and collectives, and compares them, rank by rank, with the fake
# process group's figures for the same rank. (`tests/test_scale.py` does the same with TP as
# well: TP 2 x PP 2 x DP 3 on 12 ranks, and other meshes.)

# %%
real, simulated, differences = scale_check.check(tp=1, pp=2, dp=3)
print(f"ranks compared: {len(real)}, differences: {len(differences)}")
print("rank 0 measured: ", real[0]["rows"])
print("rank 0 simulated:", simulated[0]["rows"])
for rank in (0, 1, 2):        # stage 0, DP coordinates 0, 1, 2
    print(f"rank {rank} (DP {rank}): {real[rank]['weights']:,} bytes of weights allocated, "
          f"{real[rank]['optimizer']:,} of AdamW moments")

# %% [markdown]
# The three DP ranks of a stage allocate the same padded weights, but the last holds fewer
# real rows, so AdamW (which makes its moments like the real shard) keeps less there: the
# padding is measured on real ranks, and the fake job predicts it byte for byte.
#
# ## 4. Beyond the lesson: 1,024 and 16,384 ranks
#
# Llama 3 405B's published pre-training mesh is TP 8 x PP 16 x DP 128 on 16,384 GPUs (Llama
# Team 2024, "The Llama 3 Herd of Models", Table 4). Below: the same TP and PP with DP 8, 1,024
# ranks, and the published mesh itself. Ranks hold the same shards within a stage kind (same
# ends, same layer count), so one rank per kind stands for them all, plus the last DP and TP
# coordinate where shards are uneven.

# %%
jobs = scale_tables.job_rows(scale_tables.PUBLISHED[1:])
print(scale_tables.job_table(jobs))

# %% [markdown]
# The stages are split as Llama 3 split them, and as torchtitan's
# `generate_llm_fqn_per_model_part` does (`llama_shapes.stage_layers`, the "balanced" split):
# the embedding and the output count as a layer each, so the first stage holds the embedding
# and 7 layers, the last 7 layers and the head, the 14 others 8 ("we reduce one Transformer
# layer each from the first and the last stages", Llama Team 2024, 3.3.2). Why min and max
# still differ: the embedding and the head (128,256 x 16,384 each, 2.1e9 parameters) are not
# quite a layer (3.2e9), and on DP 128 the vocabulary's TP shard (16,032 rows) does not divide
# by 128: uneven shards. The course's formula divides evenly. The even split would put 8
# layers and the embedding on the first stage:

# %%
even = scale_memory.rank_state("405B", tp=8, pp=16, dp=8, rank=0, split="even")
print(f"405B, 1,024 ranks, even split: rank 0 holds {even['total'] / memory.GB:.2f} GB "
      f"({even['layers']} layers and the embedding)")

# %% [markdown]
# Other things this simulation of Llama 3's job does not do as Llama 3 did: its pipeline ran
# interleaved virtual stages (several chunks per rank); its mesh was ordered [TP, CP, PP, DP]
# with DP outermost (here [PP, DP, TP]: the same shards, other neighbours); and its FSDP did
# not reshard the weights after forward (the tables above use FSDP2's default, which
# changes the all-gathers, not the persistent bytes; section 2 traces both settings).
#
# On this machine (varies, not compared):

# %%
# NBVAL_IGNORE_OUTPUT
for job in jobs:
    print(f"{job['label']:<18} {job['ranks']:>6,} ranks: {job['seconds']:.1f} s "
          f"({len(job['by_rank'])} ranks built)")
print(f"this kernel's peak memory: {scale_tables.rss_mb():.0f} MB")

# %% [markdown]
# ## 5. What a simulation cannot tell
#
# A fake process group moves no bytes and fake tensors compute nothing. What it gives is
# exact for the plan it was given (this TP plan, this FSDP2 wrapping and reshard policy,
# weights built in fp32): the shards, the persistent bytes per rank, which collectives run on
# which axis and their sizes. What it cannot give:
#
# * **time**: how long a collective takes depends on bandwidth, latency and topology (module
#   7 measures them on real ranks; module 6's playground only counts);
# * **overlap**: whether FSDP2's prefetch hides the all-gathers behind compute;
# * **stragglers** and failures (module 12);
# * **allocator peaks**: activations, the gathered layer, communication buffers, the caching
#   allocator's fragmentation (`torch.cuda.max_memory_allocated` on a GPU, module 7).
#
# Module 6's playground uses the same formula as the course column above:

# %%
p = playground.plan(model_params_b=llama_shapes.param_count("70B") / 1e9, tp=4, pp=2, dp=4,
                    zero_stage=3)
print(f"playground, 70B on TP 4 x PP 2 x DP 4, ZeRO-3: {p.gb['total']:.2f} GB per device")
print(f"simulated, largest rank:                      "
      f"{lesson[-1]['simulated'] / memory.GB:.2f} GB")

# %% [markdown]
# ## Summary
#
# | configuration | lesson | course formula | simulated (real PyTorch) | why they differ |
# | --- | --- | --- | --- | --- |
# | 7B DDP, 8 ranks | 112 GB | 107.81 GB | 107.81 GB | N = 6.74e9, not 7e9 |
# | 7B ZeRO-1 | 38.5 GB | 37.06 GB | 37.06 GB (course's ZeRO) | N |
# | 7B ZeRO-2 | 26.25 GB | 25.27 GB | 25.27 GB (course's ZeRO) | N |
# | 7B ZeRO-3 / FSDP2 | 14 GB | 13.48 GB | 13.48 GB | N; 4+4+8 bytes, not 2+2+12 |
# | 70B TP 4 x PP 2 x DP 4 | 35 GB | 34.49 GB | 34.49 GB (largest stage) | N = 68.98e9; norms whole under TP |
# | 405B TP 8 x PP 16 x DP 8 (1,024 ranks) | — | 6.34 GB | 6.10-6.38 GB | embedding and head are not quite a layer (6.90 GB with the even split) |
# | Llama 3 405B, 16,384 ranks | — | 0.40 GB | 0.37-0.40 GB | and uneven vocabulary shards |
#
# One microbatch's traffic on the 70B mesh: DP's reduce-scatter as the formula; DP's
# all-gather 81 of 82 (the root stays gathered); TP's all-reduces 281 under the per-linear
# plan, 161 (Megatron's 4 per layer and the embedding's) when each half-layer shares one
# DTensor input, and the same bytes as all-gathers and reduce-scatters under sequence
# parallelism. A step of m microbatches repeats TP's and PP's traffic m times, reduces DP's
# gradients once, and gathers once too when the weights stay gathered (torchtitan under PP).
# Each job above takes seconds on 2 CPU cores and the whole notebook under 1 GB (its peak is
# printed above); the times are printed above and by `benchmarks/scale_sim.py`.
#
# **Next**: assignment `a11_at_scale` (in your workspace under `assignments/a11_at_scale/`):
# predict one rank's bytes and one step's traffic per axis for meshes and models drawn for you,
# then check your prediction with the simulated job; grading compares your figures and your
# function with PyTorch's sharding on meshes this notebook does not show. Then module 12:
# checkpoints, resuming, and surviving a lost rank.

# %% [markdown]
# # Module 10: Putting it together, a DP x PP x TP trainer on 8 ranks
#
# Modules 2 to 9 took one idea at a time. This one puts them into one training run: TinyLM
# (module 7's language model) trained for 20 steps on 8 real gloo ranks laid out as
# **DP 2 x PP 2 x TP 2**. Each rank uses
#
# * module 6's **rank grid** for its coordinates and groups,
# * module 4's **Megatron tensor parallelism** inside every transformer block,
# * module 5's **1F1B pipeline schedule** across two stages,
# * module 9's **bucketed gradient all-reduce** over DP, started while backward is still
#   running, and
# * module 3's **ZeRO-1**: Adam's moments sharded over DP, the weights all-gathered after the
#   update.
#
# Then it checks the result the way module 7 taught: the loss and every gradient and weight
# on every rank must equal one process training the whole model on the whole batch. After
# that it compares each rank's memory with the prediction, splits the step's time into its
# parts, builds the same plan from PyTorch's own parts, and gives the commands that run the same
# code on a GPU node and on a Slurm cluster.
#
# The trainer is in `course_utils`, one concern per file, each short enough to read:
# `stage_model.py` (one rank's piece of the model), `zero1.py` (the sharded optimizer),
# `train3d.py` (groups, the step, the worker), `train3d_check.py` (the one-process reference
# and the predictions), `train3d_torch.py` (the PyTorch-parts version).

# %%
import inspect

import matplotlib.pyplot as plt
import torch

from course_utils import launch, stage_model, style, tiny_lm, train3d, train3d_torch
from course_utils import train3d_check as check

style.use()
torch.set_num_threads(1)

# %% [markdown]
# ## 1. One rank grid, every group
#
# The plan is a `train3d.Plan`: the three degrees, 20 steps, a global batch of 16 sequences
# of 32 tokens, m = 4 microbatches per DP replica, Adam with a learning rate of 3e-3. The ranks
# fill the grid (dp, pp, tp) in row-major order, TP innermost, as in module 6, so the two
# ranks of a TP group are neighbours (on a GPU node, the same NVLink island).
#
# Each rank reads three things off the grid: its **DP group** (the same (pp, tp) in the other
# replica: gradients are averaged there), its **TP group** (the same (dp, pp): the all-reduces
# inside each block), and its **pipeline neighbours** (the same (dp, tp), one stage before and
# after: activations go forward to `pp_next_rank`, gradients back to `pp_prev_rank`).

# %%
plan = train3d.Plan()
print(plan)
print(check.groups_table(plan.mesh))

# %% [markdown]
# `train3d.build_groups` turns this table into process groups on the real ranks (every rank
# calls `new_group` for every group, in the same order). PyTorch's
# `init_device_mesh(device, (2, 2, 2), mesh_dim_names=("dp", "pp", "tp"))` builds the same
# groups from the same row-major grid; the next cell starts 8 ranks and compares them.

# %%
torch_groups = launch.run(train3d_torch.mesh_groups_worker, 8, plan, timeout_s=120)
same = all(g == {axis: plan.mesh.group(rank, axis) for axis in ("dp", "pp", "tp")}
           for rank, g in enumerate(torch_groups))
print("rank 5 under init_device_mesh:", torch_groups[5])
print("every rank's dp, pp and tp groups equal the grid's:", same)

# %% [markdown]
# ## 2. What each rank holds
#
# PP gives stage 0 the embeddings and block 0, stage 1 block 1, the final LayerNorm and the
# head. TP then splits each block as module 4 did: attention by heads (q, k and v
# column-parallel, the output projection row-parallel), the MLP column- then row-parallel.
# The LayerNorms, the row-parallel biases (added once, after the all-reduce), the embeddings and
# the head stay whole on both TP ranks. Megatron-LM splits the embedding and the head by
# vocabulary too; with 64 tokens it is not worth it here.
#
# `stage_model.shard_state` is the one function that says which slice of which tensor a rank
# holds. The trainer builds each rank's stage with it, and the checks below cut the
# one-process reference with it. Weights are stored input-major, (in, out), as in module 4.

# %%
cfg = plan.cfg
full = tiny_lm.build(cfg, plan.seed).state_dict()
mine = stage_model.shard_state(full, cfg, pp_rank=0, pp_size=2, tp_rank=1, tp_size=2)
print("rank (dp, pp, tp) = (0, 0, 1) holds          its slice   of the whole tensor")
for name, value in mine.items():
    whole = stage_model.full_name(name)
    print(f"  {name:24s} {tuple(value.shape)!s:>10}   {whole:20s} {tuple(full[whole].shape)}")

# %%
N = tiny_lm.count_params(tiny_lm.build(cfg))
held = {p: stage_model.stage_param_count(cfg, p, plan.pp, plan.tp) for p in range(plan.pp)}
print(f"TinyLM: {N:,} parameters")
for p, n in held.items():
    print(f"a rank of stage {p} holds {n:,} ({n / N:.1%} of the model)")
print(f"summed over the 4 ranks of one replica: {plan.tp * sum(held.values()):,} "
      f"(more than N: what TP keeps whole is held twice)")

# %% [markdown]
# ## 3. One training step
#
# This is the step every rank runs (`train3d.train_step`). Read it with the 1F1B chart of
# module 5 in mind: `schedule_order("1f1b", 2, 4)` gives stage 0 the order
# one warm-up forward, then one forward and one backward in turn; stage 1 alternates from the
# start (printed below). Three details decide whether the numbers come out right:
#
# * **Normalisation.** The last stage divides each microbatch's mean loss by m, so the
#   gradients add up to the replica's mean; `BucketAllReduce.finish` divides the summed
#   gradients by D, so they become the global batch's mean (module 2).
# * **When DP talks.** The m backward passes accumulate into the same `.grad`. The bucket
#   hooks stay off (`dp_sync.active = False`) until the last microbatch's backward, as DDP's
#   `no_sync` does, so each bucket is all-reduced once per step, while the rest of that
#   backward still runs (module 9).
# * **Who talks to whom.** Sends and receives go to `pp_prev_rank` / `pp_next_rank`; the TP
#   all-reduces happen inside the stage's layers, on `tp_group`; the bucket all-reduces and
#   ZeRO-1's all-gather use `dp_group`. A collective on the wrong group does not fail: it
#   averages the wrong tensors, or hangs.

# %%
for pp_rank, order in enumerate(train3d.schedule_order("1f1b", 2, 4)):
    print(f"stage {pp_rank}:", " ".join(f"{kind}{i}" for kind, i, _ in order))
print()
print(inspect.getsource(train3d.train_step))

# %% [markdown]
# ## 4. Train on 8 ranks, and check against one process
#
# `train3d.run(plan)` starts 8 ranks and trains 20 steps; `check.reference_train(plan)`
# trains `tiny_lm.build(cfg, seed)` on one process, whole batch, `torch.optim.Adam`, on the
# same batches. `check.check_against_reference` then asserts, rank by rank, that the loss of
# every step, the first step's gradients and the final weights equal the reference's slices
# (`torch.testing.assert_close` within `check.TOLERANCES`), and returns the largest
# differences. Two seeds: two different models and data streams.
#
# One slice is left out of the weight comparison: the key projection's bias. Its gradient is
# zero in exact arithmetic (adding b_k shifts every attention score of a query by the same
# amount, and softmax ignores such a shift), so backward computes only rounding noise, about
# 1e-10, different in every summation order; Adam divides that noise by its own root mean
# square and moves those weights by up to the learning rate, in a random direction. Their
# gradients are compared, and are tiny on both sides.

# %%
runs = {}
for seed in (0, 1):
    p = train3d.Plan(seed=seed)
    results, ref = train3d.run(p), check.reference_train(p)
    runs[seed] = (p, results, ref, check.check_against_reference(p, results, ref))
    print(f"seed {seed}: loss {ref['losses'][0]:.3f} -> {ref['losses'][-1]:.3f} in 20 steps; "
          "every step's loss, the first gradients and the final weights of all 8 ranks equal "
          "one process's")
print("(rtol, atol):", check.TOLERANCES)

# %%
# NBVAL_IGNORE_OUTPUT
for seed, (*_, worst) in runs.items():
    print(f"seed {seed}: largest differences", {k: f"{v:.1e}" for k, v in worst.items()})

# %%
fig, ax = plt.subplots(figsize=(6.4, 3.4))
for seed, (p, results, ref, _) in runs.items():
    ax.plot(ref["losses"], label=f"one process, seed {seed}")
    ax.plot(check.replica_losses(p, results), "o", ms=4, mfc="none",
            label=f"8 ranks (DP 2 x PP 2 x TP 2), seed {seed}")
ax.axhline(tiny_lm.MarkovCorpus(cfg.vocab_size, seed=0).entropy_rate(), ls=":", c="grey",
           label="entropy rate of the text (seed 0)")
ax.set(xlabel="step", ylabel="loss (nats/token)", title="The same loss curve, to 1e-5")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## 5. Memory: predicted from the sizes, measured on the ranks
#
# Everything is fp32 here (so that the comparison with one process can be tight), so module
# 1's layout is `fp32_adam`: 4 bytes of weight and 4 of gradient per parameter a rank holds,
# and module 3's ZeRO-1 puts Adam's 8 bytes of moments on one DP rank per element: 8n/D with
# the shard rounded up to whole elements. `check.predicted_state_bytes` computes that from the
# sizes alone (`stage_param_count`, `memory.zero_state_bytes`); `memory.count_state_bytes`
# measured each rank's tensors (every storage once) after the first backward. With D = 2 the
# moments take 8n/2 = 4n bytes, the same as the weights: a coincidence of this plan.

# %%
p, results, *_ = runs[0]
print(check.memory_table(p, results))
print("predicted == measured on every rank:",
      all(check.predicted_state_bytes(p, r["coords"][1])["total"] == r["state_bytes"]["total"]
          for r in results))

# %% [markdown]
# The communication can be counted the same way. Megatron's block issues one all-reduce
# forward and one backward in attention, the same in the MLP: 4 per block per microbatch, each
# of one microbatch's activations, 2 x 32 x 64 fp32 values = 16,384 bytes. Counted on the
# ranks (module 4's `record_comms`) during the first step:

# %%
for r in results[:4]:
    want = check.predicted_comms(p, r["coords"][1])
    print(f"rank {r['coords']}: {r['comms']['tp_all_reduces']} TP all-reduces, "
          f"{r['comms']['tp_bytes']:,} B (predicted {want['tp_all_reduces']}, "
          f"{want['tp_bytes']:,} B); its gradients in {r['comms']['dp_buckets']} DP buckets "
          f"of at most {p.bucket_mb} MiB")

# %% [markdown]
# ## 6. Where a step's time goes
#
# Each rank timed four parts of every step: the TP all-reduces (inside the layers), waiting
# for a pipeline neighbour in `recv` (the bubble, and any neighbour that is late), DP (waiting
# for the last gradient buckets after backward, plus ZeRO-1's all-gather) and the rest, which
# is computation. The table gives the median over steps 2-20, in milliseconds.
#
# Read it with this machine in mind: 8 processes share the cores printed below, so a rank
# waiting in a collective is often waiting for its partner to get a core, and the parts say
# where each rank waited, not what the same plan costs on GPUs. 1F1B's ideal bubble with
# P = 2 and m = 4 is (P - 1)/(m + P - 1) = 20% of the step; the measured pipeline wait
# includes it. On GPUs the proportions are different again; module 7's checklist says how to
# time there (synchronize before each clock reading).

# %%
# NBVAL_IGNORE_OUTPUT
import os

print(f"this machine: {os.cpu_count()} logical CPUs for 8 ranks")
rows = check.breakdown(results)
print("rank  (dp, pp, tp)   step  compute     TP  PP wait     DP")
for rank, (r, b) in enumerate(zip(results, rows)):
    print(f"{rank:>4}  {r['coords']!s:>12} {b['step']:>6.1f} {b['compute']:>8.1f} "
          f"{b['tp']:>6.1f} {b['pp_wait']:>8.1f} {b['dp']:>6.1f}")
fig, ax = plt.subplots(figsize=(6.4, 3.0))
left = [0.0] * len(rows)
for part, label in zip(check.PARTS, ("compute", "TP all-reduce", "PP wait", "DP wait")):
    widths = [b[part] for b in rows]
    ax.barh(range(len(rows)), widths, left=left, label=label)
    left = [a + w for a, w in zip(left, widths)]
ax.set(yticks=range(len(rows)), yticklabels=[str(r["coords"]) for r in results],
       xlabel="ms per step (median)", ylabel="rank (dp, pp, tp)")
ax.invert_yaxis()
ax.legend(fontsize=8, ncol=4, loc="lower center", bbox_to_anchor=(0.5, 1.0))
plt.show()

# %% [markdown]
# ## 7. The same plan with PyTorch's own parts
#
# `train3d_torch` builds the plan from the library: `init_device_mesh` for the groups,
# DTensor's `parallelize_module` with `ColwiseParallel` / `RowwiseParallel` for TP,
# `torch.distributed.pipelining`'s `PipelineStage` and `Schedule1F1B` for PP, and FSDP2's
# `fully_shard` over the "dp" sub-mesh for DP. Two differences from the hand-built trainer:
#
# * FSDP2 shards the weights and gradients too (ZeRO-3), where the hand-built trainer shards
#   only Adam's moments (ZeRO-1). The update is the same Adam on the same averaged gradients,
#   so the numbers must still agree.
# * `ColwiseParallel` gives a TP rank a contiguous block of the fused q/k/v projection's rows.
#   TinyLM orders them [q | k | v], and a contiguous half of that is all of q, not "my heads of
#   q, k and v". So the rows are reordered once, [q_0 k_0 v_0 | q_1 k_1 v_1], and the attention
#   takes its head count from the local width, as torchtitan's Llama attention does ("Use -1
#   instead of `n_heads` ... as TP may have sharded them", in
#   `torchtitan/models/llama3/model/model.py`).
#
# The second point, shown on 2 ranks: fill a fused (12, 4) q/k/v weight's rows with their own index,
# apply `ColwiseParallel`, and read back which rows each rank kept.

# %%
print("rows of [q | k | v] (0-3 q, 4-7 k, 8-11 v) each rank keeps under ColwiseParallel:",
      launch.run(train3d_torch.colwise_rows_worker, 2, 4, timeout_s=60))

# %% [markdown]
# Five steps here, to keep the notebook short (each step all-gathers FSDP2's weight shards);
# `tests/test_train3d.py` runs more.

# %%
p5 = train3d.Plan(steps=5)
torch_results = train3d_torch.run(p5)
train3d_torch.check_against_reference(p5, torch_results, check.reference_train(p5))
ours = check.replica_losses(*runs[0][:2])[:5]
theirs = check.replica_losses(p5, torch_results)
print("losses, PyTorch's parts:", [f"{x:.4f}" for x in theirs])
print("losses, hand-built:     ", [f"{x:.4f}" for x in ours])
print("PyTorch's parts equal one process (losses, and every rank's gathered weights, within "
      "check.TOLERANCES) and the hand-built run")

# %% [markdown]
# ## 8. The same code on a GPU node and on a cluster
#
# `train3d.train_worker` picks its device from the backend (`course_utils.backend`): NCCL with
# one GPU per rank where there are enough GPUs, gloo on CPU otherwise. Under torchrun the module
# runs as a demo: each rank trains 5 steps and prints its largest weight difference from the
# one-process run (8 ranks: DP 2 x PP 2 x TP 2; 4 ranks drop DP; 2 ranks are a 2-stage
# pipeline):
#
# ```bash
# # one node, 8 GPUs (or 8 CPU processes)
# torchrun --standalone --nproc-per-node 8 -m course_utils.train3d
# # two nodes of 4 GPUs: each node holds one whole replica (both stages, both TP ranks)
# torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \
#     --rdzv-endpoint HEAD_NODE:29500 -m course_utils.train3d        # on each node
# # Slurm: one torchrun per node, the first node hosts the rendezvous
# NPROC_PER_NODE=4 sbatch --nodes 2 scripts/cluster.sbatch course_utils.train3d
# ```
#
# With 4 ranks per node the grid puts ranks 0-3 (dp = 0) on the first node and 4-7 (dp = 1)
# on the second: TP and PP stay inside a node and only DP's gradient buckets and ZeRO-1's
# all-gather cross nodes, the placement module 6 recommends.
#
# ## Summary
#
# | what | predicted | measured |
# | --- | --- | --- |
# | groups of the 2 x 2 x 2 grid | the rank grid | `init_device_mesh` builds the same |
# | loss, gradients, weights after 20 steps, 2 seeds | one process's | equal on all 8 ranks (1e-5, 1e-6, 1e-4) |
# | persistent bytes per rank, fp32 Adam, ZeRO-1 | 4n + 4n + 8n/D | equal, to the byte |
# | TP all-reduces per step per rank | 4 x blocks x m = 16, 262,144 B | equal |
# | 1F1B bubble, P = 2, m = 4 | 20% of the step | inside the pipeline wait (shared CPU) |
# | DeviceMesh + DTensor + pipelining + FSDP2 | one process's | equal (5 steps) |

# %% [markdown]
# **Next**: assignment `a10_capstone` (in your workspace under `assignments/a10_capstone/`):
# write this step yourself (any schedule, the DP average and ZeRO-1's all-gather by hand) and
# Megatron's "f" operator, both run on real ranks against one process on meshes the notebook
# does not show; then debug five short data-parallel programs, each broken by a pitfall real
# training runs have had (one of them hangs). This is the course's last module. After it, take module 7's checklist to a
# real multi-GPU run (NCCL instead of gloo, a synchronize or CUDA events around everything you
# time, `torch.cuda.max_memory_allocated()` for the peak, the profiler's GPU timeline) and read
# the papers under *References* in the course README: Megatron-LM's interleaved schedule and
# sequence parallelism, ZeRO, and TorchTitan, which composes the same PyTorch parts as section
# 7 with context parallelism at scale. Where to go after it: **quantization** (weights, then
# activations and optimizer state, stored in 8 bits or fewer: module 1's bytes per parameter,
# cut again), then **model serving** (running a trained model for many users at once: batching
# requests, the KV cache, and this course's tensor and pipeline splits applied to inference).

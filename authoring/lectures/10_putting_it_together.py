# %% [markdown]
# # Module 10: Putting it together, a DP x PP x TP trainer on 8 ranks
#
# Modules 2 to 9 took one idea at a time. This one puts them into one training run: TinyLM
# (module 7's language model) trained for 20 steps on 8 real gloo ranks laid out as
# **DP 2 x PP 2 x TP 2**. Each rank uses
#
# * module 6's **rank grid** for its coordinates and groups;
# * module 4's **Megatron tensor parallelism** inside every block, and the vocabulary split
#   over TP too: the embedding, the head and a cross-entropy computed from the split logits;
# * module 9's **sequence parallelism** between the TP regions;
# * module 5's **1F1B pipeline schedule** across two stages, each exchange with a neighbour one
#   `batch_isend_irecv`;
# * module 9's **bucketed gradient communication** over DP, started while backward is still
#   running, from one contiguous fp32 gradient buffer;
# * module 3's **ZeRO-1**: each DP rank's optimizer updates one slice of the weights, which the
#   gradients are reduce-scattered into and the weights all-gathered from; the gradient is
#   clipped by its norm over all 8 ranks first.
#
# No rank ever builds the whole model: each builds its stage on the meta device (shapes, no
# memory) and fills in only its slices. Then the run is checked the way module 7 taught: the
# loss, the gradient norm and every gradient and weight on every rank must equal one process
# training the whole model on the whole batch. After that it compares each rank's memory, in
# fp32 and in bf16 with fp32 gradients, with the prediction, counts every message, splits the
# step's time into its parts, measures throughput and MFU, builds the same plan from PyTorch's
# own parts, and gives the commands that run the same code on a GPU node and on a cluster.
#
# The trainer is in `course_utils`, one concern per file, each short enough to read:
# `stage_model.py` (one rank's piece of the model), `vocab_parallel.py` (the split vocabulary),
# `grad_buffer.py` (the gradients and their reduce-scatter), `zero1.py` (the sharded optimizer),
# `train3d.py` (groups, the step, the worker), `train3d_comms.py` (what a step sends),
# `train3d_check.py` (the one-process reference and the predictions), `train3d_torch.py` (the
# PyTorch-parts version).

# %%
import matplotlib.pyplot as plt
import torch

from course_utils import memory, style
from course_utils.models import tiny_lm
from course_utils.trainer3d import (check, comms as train3d_comms, stage_model,
                                    torch_parts as train3d_torch, train as train3d)

style.use()
torch.set_num_threads(1)

# %% [markdown]
# ## 1. One rank grid, every group
#
# The plan is a `train3d.Plan`: the three degrees, 20 steps, a global batch of 16 sequences
# of 32 tokens, m = 4 microbatches per DP replica, Adam with a learning rate of 3e-3, the
# gradient clipped to a norm of 0.55. The ranks fill the grid (dp, pp, tp) in row-major order,
# TP innermost, as in module 6, so the two ranks of a TP group are neighbours (on a GPU node,
# the same NVLink island).
#
# Each rank reads three things off the grid: its **DP group** (the same (pp, tp) in the other
# replica: gradients are averaged there), its **TP group** (the same (dp, pp): the collectives
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
# groups from the same row-major grid: section 7 compares them on the 8 ranks.
#
# ## 2. What each rank holds
#
# PP gives stage 0 the embeddings and block 0, stage 1 block 1, the final LayerNorm and the
# head. TP then splits each block as module 4 did: attention by heads (q, k and v
# column-parallel, the output projection row-parallel), the MLP column- then row-parallel. The
# token embedding and the head are split by token id: TP rank r holds the rows of tokens
# 32r to 32r + 31, and the head's outputs for the same tokens (picotron's and Megatron-LM's
# `VocabParallelEmbedding`; torchtitan shards both the same way). The LayerNorms, the position
# embedding and the row-parallel biases (added once, after the sum) stay whole on both TP ranks.
#
# `stage_model.shard_state` is the one function that says which slice of which tensor a rank
# holds. The trainer fills each rank's stage with it, and the checks below cut the one-process
# reference with it. Weights are stored input-major, (in, out), as in module 4.

# %%
cfg = plan.cfg
full = tiny_lm.build(cfg, plan.seed).state_dict()
for coords in ((0, 0, 1), (0, 1, 1)):
    mine = stage_model.shard_state(full, cfg, pp_rank=coords[1], pp_size=2, tp_rank=coords[2],
                                   tp_size=2, vocab_parallel=True)
    print(f"rank (dp, pp, tp) = {coords}:", ", ".join(
        f"{n.replace('blocks.', 'b')} {tuple(v.shape)}" for n, v in mine.items()
        if not n.endswith("bias") and "ln" not in n))

# %%
N = tiny_lm.count_params(tiny_lm.build(cfg))
held = {p: stage_model.stage_param_count(cfg, p, plan.pp, plan.tp, vocab_parallel=True)
        for p in range(plan.pp)}
print(f"TinyLM: {N:,} parameters")
for p, n in held.items():
    print(f"a rank of stage {p} holds {n:,} ({n / N:.1%} of the model)")
print(f"summed over the 4 ranks of one replica: {plan.tp * sum(held.values()):,} "
      f"(more than N: what TP keeps whole is held twice)")

# %% [markdown]
# A rank builds its stage without the model: `stage_model.build_stage` makes the `Stage`
# under `torch.device("meta")` (every parameter a shape with no memory), gives it memory with
# `to_empty`, then draws TinyLM's tensors one layer at a time, with the same random numbers
# `tiny_lm.build` draws, keeps its slices and drops the rest (torchtitan builds on the meta
# device too, then initialises each rank's shards). On a model that does not fit one device,
# that is the only way to start. A meta tensor still reports the bytes it would take
# (`untyped_storage().nbytes()`, numel x element size); `memory.count_state_bytes` counts only
# storages with memory behind them (the measured column of section 5's memory table):

# %%
with torch.device("meta"):
    shell = stage_model.Stage(cfg, 0, 2, 2, tp_rank=1, vocab_parallel=True, sp=True)
size = sum(p.numel() * p.element_size() for p in shell.parameters())
print(f"on the {next(shell.parameters()).device} device: the parameters would take {size:,} "
      f"bytes and hold {memory.count_state_bytes(shell)['total']:,}")
shell.to_empty(device="cpu")
print(f"after to_empty(device='cpu'): they hold {memory.count_state_bytes(shell)['total']:,} "
      "bytes (not yet filled)")
drawn = []
stage_model.init_tensors(cfg, plan.seed, lambda name, t: drawn.append(name))
print(f"build_stage draws TinyLM's {len(drawn)} tensors one layer at a time; stage 0 keeps a "
      f"slice of {sum(1 for n in drawn if n.startswith(('tok', 'pos', 'blocks.0')))}")

# %% [markdown]
# ## 3. One training step
#
# Every rank runs `train3d.train_step` (read it in `course_utils/trainer3d/train.py`). Its order is
# module 5's 1F1B: stage 0 does one warm-up forward, then alternates; stage 1 alternates from
# the start. Between two operations a rank posts **one** `batch_isend_irecv`: the send the last
# operation produced and the receive the next one needs. In the steady phase that is "send my
# activation, receive the gradient of an earlier microbatch", and the neighbour posts the mirror
# image at the same moment (picotron's `bidirectional_pipeline_communicate`). `a` is an
# activation, `g` a gradient:

# %%
for pp_rank in range(plan.pp):
    print(f"stage {pp_rank}:", train3d_comms.format_exchange(pp_rank, plan.pp, plan.m))

# %% [markdown]
# What decides whether the numbers come out right:
#
# * **Normalisation.** The last stage adds up its tokens' cross-entropies and divides by the
#   replica's number of tokens (b x T), so the m backward passes add up to the gradient of the
#   replica's mean loss, whatever the microbatches hold; the DP mean then divides by D. That
#   gives the global batch's mean because every replica holds the same number of tokens here:
#   with padded sequences, both would have to count real tokens only (a10 Q5).
# * **Where the gradients go.** Each parameter's gradient is added, as it is produced, into its
#   place in one fp32 buffer (`grad_buffer.GradBuffer`); the buffer is cut into buckets
#   in backward order. Until the last microbatch's backward nothing is sent (DDP's `no_sync`);
#   during it, each bucket is **reduce-scattered** over DP the moment its last gradient arrives,
#   so each DP rank receives the mean of exactly the slice it updates, while the rest of
#   backward still runs. No gradient is copied into a bucket: the bucket is the buffer.
# * **The update.** `zero1.ShardedOptimizer` computes the gradient's norm from the slices:
#   every rank adds the squares of its slice (a TP-replicated weight, such as a LayerNorm, on
#   TP rank 0 only) and one all-reduce over all 8 ranks sums them, across DP, PP and TP; the
#   slices are scaled by min(0.55 / norm, 1), as `torch.nn.utils.clip_grad_norm_` does; then
#   `torch.optim.Adam` updates this rank's slice, and each bucket of weights is all-gathered in
#   place. Per step that is (D-1)/D of the gradient reduce-scattered plus (D-1)/D of the weights
#   all-gathered: what one all-reduce costs (module 3), where all-reducing the gradients and
#   then all-gathering the weights would send half as much again, 3(D-1)/D.
# * **Who talks to whom.** Point-to-point goes to `pp_prev_rank` / `pp_next_rank`; the TP
#   collectives happen inside the stage's layers, on `tp_group`; the buckets and the
#   all-gathers use `dp_group`. A collective on the wrong group does not fail: it averages the
#   wrong tensors, or hangs.

# %% [markdown]
# ## 4. Train on 8 ranks, and check against one process
#
# `train3d_torch.run_both` starts 8 ranks once. They train three plans in turn with the
# hand-built trainer: seed 0 for 20 steps and seed 1 for 10 (two different models and data
# streams; `tests/test_train3d.py` runs both for 20), and seed 0 for 2 steps in bf16 (section
# 5); then seed 0 for 2 steps with PyTorch's own parts (section 7). Each step of this plan
# makes about 55 calls to `torch.distributed` on every rank (section 5 counts them), which is
# what takes the time here: 8 processes share the machine's cores.
# `check.reference_train(plan)` trains `tiny_lm.build(cfg, seed)` on one process, whole batch,
# `torch.optim.Adam` and `clip_grad_norm_`, on the same batches. `check.check_against_reference`
# then asserts, rank by rank, that the loss of every step on every rank of the last stage (both
# TP ranks of both replicas), the first step's gradient norm on every rank, its gradients, and
# the final weights equal the reference's slices (`torch.testing.assert_close` within
# `check.TOLERANCES`), and returns the largest differences.
#
# **When such a comparison can hold.** Two correct fp32 runs that only add in another order
# differ by rounding, about 1e-9 in a gradient here. Adam turns a gradient g into a step of
# about lr x g / (|g| + eps). Where |g| is far above eps, the rounding moves the step by a
# fraction of itself, and the runs stay together. Where |g| is near eps or below, the
# rounding decides the step: with torch's default eps = 1e-8, a gradient that is pure noise
# moves its weight by about lr x |g| / eps per step (exactly that on the first step, where
# Adam's bias-corrected m / sqrt(v) is g / |g|), in a random direction. The key projection's
# bias is such a weight: its true gradient is zero (softmax ignores a shift shared by a whole
# row of scores), so what backward returns for it is rounding. `check.noise_steps` trains the
# plan on one process with eps = 1e-8 and measures, for each of the key bias's 128 weights
# (64 per block) and each of the 20 steps, |gradient| and how far the step moved the weight,
# over lr. The cell prints the medians and the largest move, rounded to a power of ten (the
# noise's digits depend on the CPU's kernels; `tests/test_train3d.py` checks the same
# roundings on two seeds):

# %%
import math


def power_of_ten(x: float) -> float:
    """x rounded to the nearest power of ten."""
    return 10.0 ** round(math.log10(x))


noise = check.noise_steps(train3d.Plan(eps=1e-8))
grads, moves = noise["grads"], noise["moves"]               # (steps, weights) each
print(f"key bias, one process, eps = 1e-8: {moves.shape[1]} weights x {moves.shape[0]} steps")
print(f"|gradient|: median about {power_of_ten(grads.median()):.0e}")
print(f"move per step: median about {100 * power_of_ten(moves.median()):g} % of lr, "
      f"largest about {100 * power_of_ten(moves.max()):g} % of lr")

# %% [markdown]
# A gradient below eps that is not noise moves its weight a lot too: seed 6 has a first-step
# gradient of about 1.3e-9 on `head.weight[30, 55]` (its last digits depend on the CPU's
# arithmetic), and Adam's first step moves that weight by lr x g / (g + 1e-8), about an eighth
# of lr.
# `tests/test_train3d.py` measures it on one process: seed 6 with eps = 1e-8 ends about 3e-4
# apart from itself summed in another order (4 microbatches), beyond any useful tolerance. The
# plan uses eps = 1e-5 (as a10 does): a step then moves at most lr / eps = 300 times a
# gradient's noise, and the same two runs end under 1e-6 apart for every seed the test tries.

# %%
plans = [train3d.Plan(seed=0), train3d.Plan(seed=1, steps=10),
         train3d.Plan(dtype="bf16", steps=2)]
results, torch_results = train3d_torch.run_both(plans, train3d.Plan(steps=2), timeout_s=300)
runs = {}
for p, res in zip(plans[:2], results):
    ref = check.reference_train(p)
    runs[p.seed] = (p, res, ref, check.check_against_reference(p, res, ref))
    clipped = sum(n > p.clip for n in ref["grad_norms"])
    print(f"seed {p.seed}: loss {ref['losses'][0]:.3f} -> {ref['losses'][-1]:.3f} in "
          f"{p.steps} steps, clipped in {clipped}; all 8 ranks equal one process")
print("(rtol, atol):", check.TOLERANCES)

# %%
# NBVAL_IGNORE_OUTPUT
for seed, (*_, worst) in runs.items():
    print(f"seed {seed}: largest differences", {k: f"{v:.1e}" for k, v in worst.items()})

# %%
fig, ax = plt.subplots(figsize=(6.4, 3.4))
for seed, (p, res, ref, _) in runs.items():
    ax.plot(ref["losses"], label=f"one process, seed {seed}")
    ax.plot(check.replica_losses(p, res), "o", ms=4, mfc="none",
            label=f"8 ranks (DP 2 x PP 2 x TP 2), seed {seed}")
ax.axhline(tiny_lm.MarkovCorpus(cfg.vocab_size, seed=0).entropy_rate(), ls=":", c="grey",
           label="entropy rate of the text (seed 0)")
ax.set(xlabel="step", ylabel="loss (nats/token)", title="The same loss curve, to 1e-5")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## 5. Memory: predicted from the sizes, measured on the ranks
#
# **fp32.** A rank's parameters live in one flat buffer, its buckets padded to a multiple of D
# = 2 elements, so module 1's layout `fp32_adam` gives 4 bytes of weight and 4 of gradient per
# element of that buffer, and module 3's ZeRO-1 puts Adam's 8 bytes of moments only on the
# elements of this rank's slices, about n/D (plus a 4-byte step counter per piece of a
# parameter a slice touches). `check.predicted_state_bytes` computes it from the sizes alone
# (the stage's shapes, read from a `Stage` on the meta device, and the bucket layout);
# `memory.count_state_bytes` measured each rank's tensors (every storage once) after the first
# step. With D = 2 the moments take about 8n/2 = 4n bytes, the same as the weights: a
# coincidence of this plan.

# %%
p, res, *_ = runs[0]
print(check.memory_table(p, res))
print("predicted == measured on every rank:",
      all(check.predicted_state_bytes(p, r["coords"][1], r["coords"][0]) == r["state_bytes"]
          for r in res))

# %% [markdown]
# **bf16 with fp32 gradients.** The third run (2 steps) computes in bf16: the weights in the
# buffer are bf16 (2 bytes), every microbatch's bf16 gradient is added into the fp32 buffer
# (4 bytes: summing in bf16 would lose the small contributions, module 9), and each rank keeps
# an fp32 master copy of its slices beside the moments (4 + 8 bytes per owned element): the
# "bf16 parameters, fp32 gradients" row of Megatron Core's distributed optimizer, 6 + 12/d
# bytes per parameter (its user guide, "Distributed Optimizer"). Its losses, gradients and
# weights are compared with one process running the same policy, within bf16's precision
# (`check.BF16_TOLERANCES`).

# %%
bf16 = plans[2]
check.check_against_reference(bf16, results[2], check.reference_train(bf16))
print(check.memory_table(bf16, results[2]))
print("predicted == measured on every rank:",
      all(check.predicted_state_bytes(bf16, r["coords"][1], r["coords"][0]) == r["state_bytes"]
          for r in results[2]))
print("bf16 losses equal one process's bf16 run within (rtol, atol)",
      check.BF16_TOLERANCES["losses"])

# %% [markdown]
# The communication can be counted the same way. With sequence parallelism each of Megatron's
# all-reduces becomes an all-gather of the whole activation before a column-parallel layer and
# a reduce-scatter to this rank's half of the tokens after a row-parallel one, forward and
# backward (module 9): 8 per block per microbatch. The vocabulary split adds the embedding's
# reduce-scatter and the head's all-gather, each with its backward, and the loss's one
# all-gather of three numbers per token (each rank's largest logit, its sum of exponentials and
# the target's logit: Megatron-LM and torchtitan send the same in three all-reduces); and once
# per step the gradients of the LayerNorms, biases and position embedding, which saw only this
# rank's tokens, are all-reduced over TP, coalesced into one call. `train3d_comms` predicts
# every count and byte from the plan; the ranks counted their calls during the first step:

# %%
print(check.comms_table(p, res))

# %% [markdown]
# DP's buckets are cut in backward order, and a bucket closes once it holds at least
# `bucket_mb` = 0.05 MiB (52,429 bytes): the gradient that crosses the cap stays in it, as in
# DDP, so every bucket but the last is larger than the cap:

# %%
for pp_rank in range(plan.pp):
    print(f"stage {pp_rank}: buckets of", ", ".join(
        f"{b:,}" for b in check.bucket_bytes(plan, pp_rank)), "bytes of fp32 gradient")

# %% [markdown]
# ## 6. Where a step's time goes, and how fast it runs
#
# Each rank timed four parts of every step: the TP collectives (inside the layers, and the
# gradients of the sequence-split weights), the pipeline (waiting for a receive, and at the end
# of the step for the sends still in flight: the bubble, and any neighbour that is late), DP
# (waiting for the last buckets after backward, the norm's all-reduce and ZeRO-1's
# all-gathers) and the rest, computation. The table gives the median over steps 2-20, in
# milliseconds.
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
rows = check.breakdown(res)
print("rank  (dp, pp, tp)   step  compute     TP  PP wait     DP")
for rank, (r, b) in enumerate(zip(res, rows)):
    print(f"{rank:>4}  {r['coords']!s:>12} {b['step']:>6.1f} {b['compute']:>8.1f} "
          f"{b['tp']:>6.1f} {b['pp_wait']:>8.1f} {b['dp']:>6.1f}")
fig, ax = plt.subplots(figsize=(6.4, 3.0))
left = [0.0] * len(rows)
for part, label in zip(check.PARTS, ("compute", "TP collectives", "PP wait", "DP wait")):
    widths = [b[part] for b in rows]
    ax.barh(range(len(rows)), widths, left=left, label=label)
    left = [a + w for a, w in zip(left, widths)]
ax.set(yticks=range(len(rows)), yticklabels=[str(r["coords"]) for r in res],
       xlabel="ms per step (median)", ylabel="rank (dp, pp, tp)")
ax.invert_yaxis()
ax.legend(fontsize=8, ncol=4, loc="lower center", bbox_to_anchor=(0.5, 1.0))
plt.show()

# %% [markdown]
# **Throughput and MFU.** A training token costs 6N FLOPs in the matmuls, N the weights that
# multiply activations (2N forward; backward computes the input's and the weight's gradient,
# 4N), plus 12 L T d for attention's scores and weighted sums (PaLM's count, the one picotron's
# `get_mfu` uses). PyTorch's `FlopCounterMode` counts the matmuls of one process's step
# exactly (it does not see the CPU's attention kernel):

# %%
from torch.utils.flop_counter import FlopCounterMode

f = check.flops_per_token(cfg)
x, y = tiny_lm.MarkovCorpus(cfg.vocab_size).batch(0, 4, cfg.seq_len)
with FlopCounterMode(display=False) as counter:
    tiny_lm.lm_loss(tiny_lm.build(cfg), x, y).backward()
print(f"per token: 6N = 6 x {check.matmul_weights(cfg):,} = {f['matmuls']:,}; "
      f"FlopCounterMode: {counter.get_total_flops() // x.numel():,}; "
      f"attention 12LTd = {f['attention']:,}; total {f['total']:,}")

# %% [markdown]
# MFU divides the FLOPs the tokens needed by what the hardware the run used could do in the
# same time: one device's peak times the devices the ranks ran on. On GPUs that is one GPU per
# rank at the vendor's dense figure (989.5e12 bf16 FLOP/s for an H100 SXM, picotron's
# default). A CPU has no such figure, so here it is one core's measured matmul rate, times the
# cores the 8 ranks share: min(8, the cores this process may run on), `check.peak_units`. On a
# machine with fewer cores than ranks, dividing by 8 cores' peak would understate the MFU by
# 8 / cores (four times, on 2 cores):

# %%
# NBVAL_IGNORE_OUTPUT
peak = check.peak_flops()
speed = check.throughput(p, res, peak)
print(f"one core: {peak / 1e9:.1f} GFLOP/s on a 512 x 512 matmul; the 8 ranks ran on "
      f"{speed['units']} cores: a peak of {speed['units'] * peak / 1e9:.1f} GFLOP/s")
print(f"the run: {speed['tokens_per_s']:,.0f} tokens/s, MFU {speed['mfu']:.2%}")

# %% [markdown]
# A tiny model on 8 processes that share a few cores spends its time communicating and
# switching, not multiplying: the MFU is what that looks like. Large runs are reported near
# half (PaLM: 46.2 % on TPU v4, Chowdhery et al. 2022).
#
# ## 7. The same plan with PyTorch's own parts
#
# `train3d_torch` builds the plan from the library: `init_device_mesh` for the groups,
# DTensor's `parallelize_module` with `ColwiseParallel` / `RowwiseParallel` for TP,
# `torch.distributed.pipelining`'s `PipelineStage` and `Schedule1F1B` for PP, FSDP2's
# `fully_shard` over the "dp" sub-mesh for DP, and torchtitan's clipping recipe (the norm
# of the stage's DTensor gradients, its square summed over the PP group). Three differences
# from the hand-built trainer:
#
# * FSDP2 shards the weights and gradients too (ZeRO-3), where the hand-built trainer shards
#   the optimizer (ZeRO-1). The update is the same Adam on the same clipped mean gradients,
#   so the numbers must still agree.
# * The vocabulary split and sequence parallelism are left out (torchtitan's DTensor plan for
#   them is `set_decoder_sharding_config`): one process's arithmetic is the same either way.
# * `ColwiseParallel` gives a TP rank a contiguous block of the fused q/k/v projection's rows.
#   TinyLM orders them [q | k | v], and the first half of that is all of q and half of k, not
#   "my heads of q, k and v". So the rows are reordered once, [q_0 k_0 v_0 | q_1 k_1 v_1], and
#   the attention takes its head count from the local width, as torchtitan's attention does
#   ("Use -1 instead of n_heads (or n_kv_heads) to infer the actual local heads from sizes as
#   TP may have sharded them", in `torchtitan/models/common/attention.py`).
#
# The ranks of section 4 ran it, after the hand-built plans: two steps, to keep the notebook
# short (`tests/test_train3d.py` runs three). Each rank also reported its groups under
# `init_device_mesh`, and, for the third point, which rows of a fused (12, 4) q/k/v weight
# whose rows hold their own index `ColwiseParallel` left it.

# %%
p2 = train3d.Plan(steps=2)
train3d_torch.check_against_reference(p2, torch_results, check.reference_train(p2))
same = all(r["groups"] == {axis: plan.mesh.group(rank, axis) for axis in ("dp", "pp", "tp")}
           for rank, r in enumerate(torch_results))
print("rank 5 under init_device_mesh:", torch_results[5]["groups"])
print("every rank's dp, pp and tp groups equal the grid's:", same)
print("rows of [q | k | v] (0-3 q, 4-7 k, 8-11 v) TP ranks 0 and 1 keep under ColwiseParallel:",
      torch_results[0]["colwise_rows"], torch_results[1]["colwise_rows"])
print("losses, PyTorch's parts:", [f"{v:.4f}" for v in check.replica_losses(p2, torch_results)])
print("losses, hand-built:     ", [f"{v:.4f}" for v in check.replica_losses(*runs[0][:2])[:2]])
print("PyTorch's parts equal one process (losses, and every rank's gathered weights, within "
      "check.TOLERANCES) and the hand-built run")

# %% [markdown]
# ## 8. The same code on a GPU node and on a cluster
#
# `train3d.train_worker` picks its device from the backend (`course_utils.runtime.backend`): NCCL with
# one GPU per rank where there are enough GPUs, gloo on CPU otherwise (where the
# reduce-scatter is built from `all_to_all_single`, since gloo's own sends what an all-reduce
# sends; `backend.reduce_scatter_in_place`). Under torchrun the module runs as a demo: each
# rank trains 5 steps and prints its largest weight difference from the one-process run (8
# ranks: DP 2 x PP 2 x TP 2; 4 ranks drop DP; 2 ranks are a 2-stage pipeline):
#
# ```bash
# # one node, 8 GPUs (or 8 CPU processes)
# torchrun --standalone --nproc-per-node 8 -m course_utils.trainer3d.train
# # two nodes of 4 GPUs: each node holds one whole replica (both stages, both TP ranks)
# torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \
#     --rdzv-endpoint HEAD_NODE:29500 -m course_utils.trainer3d.train        # on each node
# # Slurm: one torchrun per node, the first node hosts the rendezvous
# NPROC_PER_NODE=4 sbatch --nodes 2 scripts/cluster.sbatch course_utils.trainer3d.train
# ```
#
# With 4 ranks per node the grid puts ranks 0-3 (dp = 0) on the first node and 4-7 (dp = 1)
# on the second: TP and PP stay inside a node and only DP's reduce-scatters and all-gathers
# cross nodes, the placement module 6 recommends.
#
# ## Summary
#
# | what | predicted | measured |
# | --- | --- | --- |
# | groups of the 2 x 2 x 2 grid | the rank grid | `init_device_mesh` builds the same |
# | loss, gradient norm, gradients, weights; 2 seeds (20 and 10 steps), fp32 | one process's | equal on all 8 ranks, (rtol, atol) (1e-5, 1e-5), (1e-4, 1e-6), (1e-4, 1e-4) |
# | the same in bf16, fp32 gradients | one process's bf16 run | equal within (2e-2, 2e-2) |
# | persistent bytes per rank, fp32 and bf16 | the buffer's size, and ZeRO-1's slices | equal, to the byte |
# | TP, pipeline and DP calls and TP bytes per step | from the plan | equal |
# | training FLOPs per token | 6N + 12LTd | the matmuls' 6N equal `FlopCounterMode`'s count |
# | 1F1B bubble, P = 2, m = 4 | 20% of the step | inside the pipeline wait (shared CPU) |
# | DeviceMesh + DTensor + pipelining + FSDP2 | one process's | equal (2 steps) |

# %% [markdown]
# **Next**: assignment `a10_capstone` (in your workspace under `assignments/a10_capstone/`):
# write the 3-D step yourself, with plain point-to-point calls, the DP average by all-reduce
# and ZeRO-1's all-gather by hand, and Megatron's "f" operator, both run on real ranks against
# one process on meshes the notebook does not show; then debug five short data-parallel
# programs, each broken by a pitfall real training runs have had (one of them hangs). Two modules
# follow: module 11 sizes the lesson's own configurations (7B to 405B, up to 16,384 ranks) with
# PyTorch's real sharding on a fake process group, and module 12 saves and resumes this module's
# trainer. After the course, take module 7's checklist to a real multi-GPU run (NCCL
# instead of gloo, a synchronize or CUDA events around everything you time,
# `torch.cuda.max_memory_allocated()` for the peak, the profiler's GPU timeline) and read the
# papers under *References* in the course README: Megatron-LM's interleaved schedule and
# sequence parallelism, ZeRO, and TorchTitan, which composes the same PyTorch parts as section
# 7 with context parallelism at scale. Where to go after it: **quantization** (weights, then
# activations and optimizer state, stored in 8 bits or fewer: module 1's bytes per parameter,
# cut again), then **model serving** (running a trained model for many users at once: batching
# requests, the KV cache, and this course's tensor and pipeline splits applied to inference).

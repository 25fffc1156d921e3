# %% [markdown]
# # Module 6: Building a device mesh
#
# Modules 2 to 5 used one axis at a time: data parallelism (DP), ZeRO/FSDP, tensor parallelism
# (TP), pipeline parallelism (PP). A real job combines them, and the way they combine is a
# **device mesh**: one grid of ranks whose axes are the parallelism degrees. This module builds
# one, then adds the axes beyond DP, TP and PP. By the end of this notebook you can
#
# * count the devices a plan needs and the persistent state each one holds,
# * turn a rank into its (dp, pp, tp) coordinates and list the ranks it talks to on each axis,
# * say why the axis order decides which groups share a node,
# * build the same mesh with PyTorch's `init_device_mesh` and run a 2-D (DP x TP) step on it,
# * say how often DP talks under ZeRO-1 and ZeRO-3, and why ZeRO-3 and PP combine badly,
# * draw an all-to-all, say what mixture-of-experts (MoE) parallelism and Ulysses move with it,
#   and how ring attention and Megatron sequence parallelism communicate instead, and
# * use the device-mesh playground, with activations and recomputation, and say what its
#   estimate leaves out.

# %%
import functools

import matplotlib.pyplot as plt

from course_utils import launch, memory, style
from course_utils.sequence_parallel import experts as expert_parallel
from course_utils.mesh import (Mesh, check_dp_tp, draw_rank_groups, hand_mesh_groups,
                               torch_mesh_groups)
from course_utils.mesh.playground import collectives, figure, OMITTED, plan, Playground, summary

style.use()

# %% [markdown]
# ## The three axes side by side
#
# Before combining them, here is what each of the three basic axes cuts, what it has to send,
# and what limits it:
#
# | axis | what each device gets | what crosses devices | what limits it |
# |---|---|---|---|
# | DP | different examples, the whole model | gradients (or their shards; parameters too under ZeRO-3) | every device keeps the whole state unless it is sharded (ZeRO/FSDP) |
# | TP | a slice of each layer's tensors | partial activations or results, inside every layer | communication in every layer, on the critical path |
# | PP | a run of consecutive layers | activations at stage boundaries forward, their gradients backward | unequal stages and the idle bubble |
#
# TP talks the most often, so it usually goes on the fastest links, inside a node; but the
# topology you have and what you measure decide the placement, not a rule. PP sends fewer kinds
# of tensors, only at stage boundaries, yet one boundary activation can be large (batch x
# sequence x hidden) and a slow link makes even that exchange expensive.

# %% [markdown]
# ## Multiply the degrees, then size one device
#
# When the axes are independent, every combination of a DP index, a PP stage and a TP index is
# one device, so the job needs **TP x PP x DP** devices. The lesson's candidate uses 32 devices
# with TP = 4, PP = 2 and DP = 4. One copy of the model is spread over the TP x PP devices of
# one DP index; the DP axis repeats that copy.

# %%
N, tp, pp, dp = 70e9, 4, 2, 4
lay = memory.layout("mixed_adam16")
shard = N / (tp * pp)
per_device = memory.zero_state_bytes(n_params=shard, dp=dp, stage=3, layout_name=lay)
print(f"devices: TP x PP x DP = {tp} x {pp} x {dp} = {tp * pp * dp}")
print(f"devices per model replica: TP x PP = {tp * pp}")
print(f"parameters per TP/PP shard: 70B / {tp * pp} = {shard / 1e9:.2f}B")
print(f"ZeRO-3 over the {dp} DP ranks: {shard / 1e9:.2f} x {lay.total} / {dp} = "
      f"{memory.format_bytes(per_device['total'], 'GB')} per device")

# %% [markdown]
# 35 GB is the *persistent* state under ideal balance: weights, gradients, master copy and Adam
# moments. Activations, the parameters ZeRO-3 gathers for each layer, and communication
# workspaces still need room on top of it.
#
# Two mistakes give numbers that look just as plausible. ZeRO shards over the **DP** ranks only:
# the TP/PP split has already divided the model by 8, so dividing by all 32 devices again
# counts that split twice. And DP does not shrink the model shard: every DP index holds a whole
# copy of the model, split over its own 8 devices.

# %%
print(f"wrong - DP ranks counted in the shard: 70B / 32 x 16 / 4 = {70 / 32 * 16 / 4:.3f} GB")
print(f"wrong - ZeRO-3 over all 32 devices:    8.75B x 16 / 32 = {8.75 * 16 / 32:.3f} GB")

# %% [markdown]
# ## Rank <-> coordinates from one grid
#
# Lay the ranks out on a grid of shape (DP, PP, TP) in row-major order: the **last** axis
# varies fastest. A rank's coordinates come from repeated division, innermost axis first:
# `tp = rank % TP`, `pp = (rank // TP) % PP`, `dp = rank // (TP * PP)`. The group of a rank
# along one axis is every rank that agrees with it on all *other* coordinates.
#
# Below, the 32 ranks are drawn with one row per DP index and the (pp, tp) columns in order,
# so reading the grid row by row counts the ranks. Rank 13's three groups are coloured by axis.

# %%
mesh = Mesh.from_degrees(dp=4, pp=2, tp=4)   # axes outermost first: dp, pp, tp
rank = 13
draw_rank_groups(mesh, rank)
plt.show()
print(f"rank {rank}: coordinates {mesh.coords(rank)}")
for axis in ("tp", "pp", "dp"):
    print(f"  its {axis} group: {mesh.group(rank, axis)}")

# %% [markdown]
# Rank 13 is TP index 1 of the TP group [12..15] (it computes a quarter of each layer with
# them), stage 1 of the pipeline [9, 13], and DP index 1 of [5, 13, 21, 29], the four ranks
# that hold the *same* shard of the model and average its gradients.

# %%
for axis in ("tp", "pp", "dp"):
    print(f"{axis} groups: {mesh.groups(axis)}")

# %% [markdown]
# ## Axis order decides which ranks share a node
#
# Ranks fill nodes in order: with 8 devices per node, ranks 0-7 are node 0, 8-15 node 1, and
# so on. The innermost axis has consecutive ranks, so its groups stay inside a node. TP talks in
# every layer, forward and backward, so TP innermost keeps it on the fastest links (NVLink
# inside a node rather than the network between nodes). Put TP outermost and every TP group
# spans four nodes:

# %%
for order in [("dp", "pp", "tp"), ("tp", "pp", "dp")]:
    m = Mesh.from_degrees(order=order, dp=4, pp=2, tp=4)
    crossing = {a: len(m.groups_crossing_nodes(a, devices_per_node=8)) for a in order}
    print(f"order {order}: TP group of rank 0 = {m.group(0, 'tp')}; "
          f"groups crossing nodes: {crossing}")

# %% [markdown]
# In the lesson's order every DP group spans nodes. What that costs depends on the ZeRO stage.
# Plain DP and ZeRO-1 reduce the gradients once per step, after the last microbatch, and can
# overlap that with the backward pass. The lesson's plan uses **ZeRO-3**, which all-gathers
# every layer's parameters before its forward and again before its backward. With PP, each
# microbatch runs its own forward and backward through the stage, so each gather happens once
# per microbatch: with 16 microbatches, 32 times per layer per step, over groups that span
# nodes.

# %%
for stage in (1, 3):
    sends = collectives(tp=4, pp=2, dp=4, zero_stage=stage, microbatches=16)["dp"]
    print(f"ZeRO-{stage}, PP = 2, 16 microbatches - DP: {sends}")
print(f"kept gathered through a step, a stage's weights take "
      f"{memory.format_bytes(per_device['weights'] * dp, 'GB')} per device, not "
      f"{memory.format_bytes(per_device['weights'], 'GB')}")

# %% [markdown]
# Frameworks avoid paying this. DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3: it stops
# with an assertion at start-up, so with its pipeline DP uses ZeRO-1 at most. torchtitan runs
# FSDP (PyTorch's ZeRO-3) under PP, but its default sets `reshard_after_forward=False` when PP
# is on, and the pipeline stage of `torch.distributed.pipelining` (torch 2.13) turns off the
# reshard after each microbatch's backward, resharding once all microbatches are done. The
# parameters are then gathered once and stay gathered between microbatches: the communication
# is bought back with memory (the last line above), which the 35 GB estimate does not count.
# The playground below warns when a plan combines ZeRO-3 with PP.
#
# Whether PP or DP should sit in the middle of the order depends on measured traffic: PP sends
# activations each microbatch, DP with ZeRO-1 sends gradients each step.
#
# ## The same mesh, built by PyTorch on real ranks
#
# `torch.distributed.device_mesh.init_device_mesh` builds this grid and one process group per
# axis. Run it on 4 gloo ranks and compare what torch builds with the hand-built groups, for a
# 2 x 2 (dp, tp) mesh and for a 3-axis (dp, pp, tp) = (2, 1, 2) mesh. A degree of 1 is still
# an axis: each of its groups is a single rank.

# %%
for sizes, names in [((2, 2), ("dp", "tp")), ((2, 1, 2), ("dp", "pp", "tp"))]:
    from_torch = launch.run(functools.partial(torch_mesh_groups, sizes=sizes, names=names), 4,
                            timeout_s=120)
    print(f"mesh {dict(zip(names, sizes))}: torch's mesh tensor {from_torch[0]['mesh']}")
    for r, view in enumerate(from_torch):
        print(f"  rank {r}: coords {view['coords']}, groups {view['groups']}")
    print("  equal to the hand-built groups:", from_torch == hand_mesh_groups(sizes, names))

# %% [markdown]
# ## A 2-D job: DP x TP on 4 ranks, checked against one device
#
# Now use the (dp=2, tp=2) mesh for one training step of a two-layer MLP. TP splits the hidden
# width: `up` by output columns, `down` by input rows; each TP rank produces a partial output
# that an all-reduce over its **TP group** sums. DP gives each TP pair its slice of the batch.
# Each DP rank weights its mean loss by its share of the examples, and an all-reduce over the
# **DP group** sums the gradients: that is the whole batch's mean gradient even when DP does not
# divide the batch (DP = 3 on 8 examples gives slices of 2, 3 and 3; averaging the three means
# would be module 2's mean of means). Every rank's loss, gradient shard and updated weight
# shard must equal the matching slice of one device's step on the full batch. The same step
# written with torch's API (`init_device_mesh`, `parallelize_module` with
# `ColwiseParallel`/`RowwiseParallel` on `mesh["tp"]`, gradients summed over `mesh["dp"]`)
# must match too.

# %%
for line in check_dp_tp(seeds=(0, 1), dp=2, tp=2):
    print(line)

# %% [markdown]
# ## Other axes: sequence/context parallelism and experts
#
# Two more axes appear in long-context and mixture-of-experts models. Expert parallelism, and
# one of the sequence-parallel schemes (Ulysses), rest on the **all-to-all**: each rank cuts
# its tensor into one chunk per rank of its group and sends chunk j to rank j, so it ends with
# one chunk from every rank. On 4 ranks:

# %%
expert_parallel.draw_all_to_all(world_size=4)
plt.show()

# %% [markdown]
# Rank 1 starts with four chunks, one for each rank (its row on the left), and ends with chunk 1
# of every rank (its row on the right): the grid is transposed. Each rank keeps its diagonal
# chunk (outlined) and sends the other three.
#
# **Sequence/context parallelism** splits a long sequence over ranks, so each holds the
# activations of its own tokens. The name covers schemes that move different things:
#
# | scheme | what crosses devices | collective | what limits the degree |
# | --- | --- | --- | --- |
# | DeepSpeed-Ulysses | q, k, v into attention, its output back | all-to-all, twice per attention layer | the attention heads: one rank per head at most (per KV head with grouped-query attention, unless K and V are copied) |
# | ring attention | key/value blocks, handed to the next rank while each rank works on the block it holds | point-to-point send/recv around a ring | not the heads |
# | Megatron sequence parallelism | the activations outside the TP regions (layer norm, dropout), split along the sequence | all-gather into each TP region, reduce-scatter out of it (instead of TP's all-reduce) | it is the TP group |
#
# Ulysses swaps the split: an all-to-all turns "my tokens, all heads" into "all tokens, my
# heads", attention runs per head over the whole sequence, and a second all-to-all swaps back.
# On 4 ranks, 8 tokens, 4 heads, each rank ends with one head, so this model allows at most 4
# Ulysses ranks:

# %%
for seed in (0, 1):
    res = expert_parallel.check_ulysses(seed=seed, world_size=4, seq=8, heads=4)
    print(f"seed {seed}: equals one device's attention on all 4 ranks")
print(f"rank 0 holds q/k/v of shape {res[0]['local_shape']} (tokens, heads, head_dim); "
      f"after the all-to-all {res[0]['heads_shape']}")
print(f"elements rank 0 sends to other ranks (q, k, v in, output back): "
      f"{res[0]['sent_elements']}")

# %% [markdown]
# **Expert parallelism (MoE)** places different experts on different ranks. A router picks an
# expert for each token (top-1 here); one all-to-all sends each token to the rank that holds its
# expert, the expert runs there, and a second all-to-all returns the result to the token's rank,
# where it is scaled by the router's probability. The splits are uneven: they depend on the
# router. 4 ranks, 6 tokens each, one expert per rank; each square counts the tokens one rank
# sends to another:

# %%
runs = {}
for seed in (0, 1):
    res = expert_parallel.check_moe(seed=seed, world_size=4, tokens_per_rank=6, n_experts=4)
    runs[f"seed {seed}"] = res
    print(f"seed {seed}: equals one device's MoE layer on all 4 ranks; tokens each expert "
          f"receives: {[sum(out['received']) for out in res]}")
expert_parallel.draw_token_routing(runs)
plt.show()

# %% [markdown]
# The router is not balanced: with seed 0, rank 3's expert receives 10 of the 24 tokens and rank
# 2's only 1, so rank 3 works ten times longer while the others wait at the next all-to-all.
# Real MoE layers add a load-balancing loss and cap each expert's capacity.
#
# **Reusing device groups.** These axes need not multiply the device count. Expert parallelism
# commonly reuses the DP groups: DP ranks already hold different examples, so each can hold
# different experts too. The non-expert weights stay as DP keeps them: replicated under plain
# DP, sharded over the DP ranks under the lesson's ZeRO-3. On the 2 x 2 (dp, tp) mesh, the two
# DP groups {0, 2} and {1, 3} each run their own all-to-all, with the 4 experts split two per
# rank (Ulysses can reuse the TP groups the same way):

# %%
res = expert_parallel.check_moe(seed=0, world_size=4, tokens_per_rank=6, n_experts=4,
                                mesh_sizes=(2, 2), mesh_names=("dp", "tp"), ep_axis="dp")
for r, out in enumerate(res):
    print(f"rank {r}: EP group {out['ep_ranks']}, experts {out['my_experts']}, "
          f"sends {out['sent']}, receives {out['received']}")
res = expert_parallel.check_ulysses(seed=0, world_size=4, seq=8, heads=4, mesh_sizes=(2, 2),
                                    mesh_names=("dp", "tp"), sp_axis="tp")
print(f"Ulysses over the TP groups {res[0]['sp_ranks']} and {res[2]['sp_ranks']}: "
      "equals one device")

# %% [markdown]
# What each axis moves, and when:
#
# | axis | what crosses devices | when |
# | --- | --- | --- |
# | TP | partial activations (all-reduce, or all-gather + reduce-scatter) | every layer, forward and backward |
# | PP | boundary activations forward, their gradients backward (send/recv) | every microbatch, between neighbouring stages |
# | DP / ZeRO | gradients (all-reduce or reduce-scatter), ZeRO-3 also parameters (all-gather) | ZeRO-0/1: once per step; ZeRO-3: every layer, in each microbatch's forward and backward |
# | CP (Ulysses) | q, k, v and attention output (all-to-all) | every attention layer, forward and backward |
# | CP (ring attention) | key/value blocks (send/recv around a ring) | every attention layer, forward and backward |
# | SP (Megatron, on the TP group) | activations into and out of the TP regions (all-gather, reduce-scatter) | every layer, forward and backward |
# | EP (MoE) | the tokens themselves, to experts and back (all-to-all, uneven) | every MoE layer, forward and backward |
#
# Megatron sequence parallelism reuses the TP group (same ranks, with the activations between
# the TP regions split along the sequence); context parallelism (Ulysses or ring) is usually a
# separate axis whose ranks also reduce gradients together with DP; expert parallelism is
# usually a factor of the DP axis. So define the mesh explicitly, axis by axis, *before*
# multiplying degrees.
#
# ## The device-mesh playground
#
# The playground puts all of this in one place. Its arithmetic is a plain function, `plan`,
# with tests; the widget below only wires controls to it (and also lists what each axis
# sends). The lesson's plan, whose one warning is the ZeRO-3 x PP cost from above:

# %%
lesson = dict(model_params_b=70, layout="mixed_adam16", tp=4, pp=2, dp=4, zero_stage=3,
              microbatches=16, microbatch_size=2, accumulation_steps=16, device_memory_gb=80,
              devices_per_node=8, devices=32, num_layers=80, num_heads=64)
p = plan(**lesson)
print(summary(p))
figure(p)
plt.show()

# %% [markdown]
# Top: persistent GB per device for ZeRO stages 0-3 (the chosen stage solid) against the
# device budget, in the state colours of module 1. Bottom: the 32 devices, one row per node of
# 8, shaded by TP group, PP stage and DP group in each axis's colour (the DP blue of module 2).
#
# ### Activations and the peak
#
# The 35 GB is persistent state only. Give `plan` a sequence length and the model's shape (a
# GPT-style 70B: hidden size 8192, 64 heads, 80 layers) and it adds the activations saved for
# backward, with module 9's formula (Korthikanti et al.: 16-bit, with dropout; it shrinks with
# TP, sequence parallelism and recomputation), and a **peak** per device:
#
# * the pipeline runs **1F1B**: its first stage, the fullest, holds 80 / 2 = 40 layers and keeps
#   up to P = 2 microbatches in flight, so it saves 40 x 2 = 80 layer-microbatches: as many as
#   all 80 layers of one microbatch, whatever P;
# * under ZeRO-3 each layer is gathered whole before its forward and its backward: one layer of
#   the device's TP shard, 70B / (80 x 4) parameters in 2-byte weights = 0.44 GB, on top;
# * peak = persistent state + activations + gathered layer, against the 80 GB device.
#
# The lesson's plan at 4096 tokens per sequence, with full recomputation:

# %%
p_act = plan(**lesson, seq_len=4096, hidden=8192, recompute="full")
print(summary(p_act))
figure(p_act)
plt.show()

# %% [markdown]
# The activations (purple) sit on every ZeRO stage's bar; the grey sliver on ZeRO-3 is the
# gathered layer, and each bar ends at that stage's peak. Full recomputation is the cheapest in
# memory; the other settings, at microbatch size 2 unless stated:

# %%
for recompute, sp, b in [("none", False, 2), ("selective", False, 2), ("selective", True, 2),
                         ("selective", True, 1)]:
    q = plan(**{**lesson, "microbatch_size": b}, seq_len=4096, hidden=8192,
             recompute=recompute, sp=sp)
    print(f"recompute {recompute:9s} SP {'on ' if sp else 'off'}  b = {b}: activations "
          f"{q.peak_gb['activations']:6.2f} GB, peak {q.peak_gb['peak']:6.2f} GB -> "
          f"{'fits' if q.peak_fits else 'does not fit'}")

# %% [markdown]
# Without recomputation the activations are 301 GB, more than eight times the persistent state.
# Selective recomputation drops the attention scores (86 GB); sequence parallelism also splits
# the LayerNorm and dropout activations over the 4 TP ranks (46 GB), which leaves the peak at
# 81.07 GB, just over the device; one sequence per microbatch halves the activations and fits.
# (With full recomputation the formula keeps each layer's whole input, 2 s b h bytes, with or
# without SP.) These are estimates of a model, not measurements: module 7 measures.
#
# Change a setting and the warnings say what goes wrong: here TP = 8 on 4-device nodes, and 3
# pipeline stages for 80 layers.

# %%
bad = plan(model_params_b=70, tp=8, pp=3, dp=2, zero_stage=1, microbatches=16,
           accumulation_steps=16, device_memory_gb=80, devices_per_node=4, devices=32,
           num_layers=80, num_heads=64)
for w in bad.warnings:
    print("WARNING:", w)

# %% [markdown]
# Try it: the playground below starts from this broken plan, with activations at 4096 tokens
# and no recomputation (its peak is 208.55 GB). Move the controls until no warning is left: the
# mesh, and the sequence length, microbatch size, recomputation (none / selective / full) and
# sequence parallelism; watch the bars, the grid and the warnings change. (The widget needs a
# running kernel; in a static view of this notebook you see only its last state.)

# %%
# NBVAL_IGNORE_OUTPUT
Playground(tp=8, pp=3, dp=2, zero_stage=1, devices_per_node=4)

# %% [markdown]
# ## What the playground leaves out
#
# The bars are a teaching model, not a measured peak: a bar that ends before the budget line is
# not a guarantee that the job fits. The estimate now counts activations, recomputation,
# sequence parallelism and one gathered layer, under the 1F1B assumption above; it still omits:

# %%
for item in OMITTED:
    print("-", item)

# %% [markdown]
# In a real run, measure instead of trusting the estimate: step time, throughput, peak memory
# and the time spent waiting at collectives, and verify the loss and the gradient scaling
# *before* benchmarking speed (module 7).

# %% [markdown]
# **Next**: the assignment `a6_device_mesh` (in your workspace under
# `assignments/a6_device_mesh/`) practises rank coordinates and groups, by hand and as
# functions you run on real gloo ranks, and deciding whether a plan fits a device. Module 7,
# *Measuring a real run*, measures what this estimate leaves out.

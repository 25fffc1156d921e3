# %% [markdown]
# # Module 12: Checkpoints, resuming, and surviving a lost rank
#
# Long training runs stop: a GPU fails, a node reboots, the job's time runs out. Meta's Llama 3
# report counts 419 unexpected interruptions in 54 days of pre-training on 16,384 H100 GPUs,
# about one every three hours. A run survives only if it can save its state and start again
# from it. This module does that on real ranks with PyTorch's own tools:
#
# 1. what a checkpoint must hold to resume **exactly**, measured by leaving each piece out;
# 2. a resume in a new job that equals the uninterrupted run **bit for bit** (and what breaks
#    that on GPUs);
# 3. **resharding**: saving on one mesh and loading on another, and the bytes each rank reads;
# 4. a **lost rank**: a real SIGKILL, torchrun's agent restarts the job, and the time lost; then
#    how often to checkpoint;
# 5. module 10's DP x PP x TP trainer saved and resumed on 8 ranks;
# 6. checkpoints that must be refused: half-written, missing a file, of another model.
#
# The tool is `torch.distributed.checkpoint` (DCP): every rank writes its own shards in
# parallel, a `.metadata` file records where each piece of each tensor went, and a load reads
# whatever pieces the loading rank needs, whatever mesh wrote them. The code is in
# `course_utils`: `resume_job.py` (the run), `checkpoint.py` (save, load, checks),
# `resume_demo.py`, `reshard.py`, `lost_rank.py`, `lost_node.py`, `checkpoint_interval.py`,
# `checkpoint3d.py`.

# %%
import functools
import os
import shutil
import tempfile

import matplotlib.pyplot as plt
import numpy as np
import torch

from course_utils import checkpoint, launch, style
from course_utils.checkpoint import (interval as checkpoint_interval, lost_node, lost_rank, reshard,
                                     resume_demo, resume_job, trainer3d as checkpoint3d)
from course_utils.trainer3d import train as train3d

style.use()
torch.set_num_threads(1)
launch.preload(*checkpoint.PRELOAD)               # the ranks import DCP once, not per launch
workdir = tempfile.mkdtemp(prefix="lecture12-")   # every checkpoint of this notebook; removed
print("checkpoints go to a temporary folder, removed at the end")

# %% [markdown]
# ## 1. What a checkpoint must hold
#
# The run (`resume_job.Job`): an MLP classifier on 2 ranks, sharded by FSDP2 (`fully_shard`:
# ZeRO-3, each rank holds half of every weight and of Adam's moments), `AdamW`, a learning-rate
# schedule that warms up for 3 steps and then decays, a `DistributedSampler` that shuffles the
# 32 examples anew every epoch (4 steps an epoch), and three random number generators the step
# draws from: torch's (dropout), NumPy's (noise added to the inputs) and Python's (which input
# feature is masked). Everything that decides the next step is state:
#
# | piece | where it lives | sharded? |
# | --- | --- | --- |
# | weights | the model's parameters (DTensor shards) | yes |
# | optimizer | AdamW's moments (shards) and step counts | yes |
# | schedule | `LambdaLR.last_epoch` | no |
# | torch, NumPy, Python RNGs | each process, different on every rank | per rank |
# | sampler epoch, position | `sampler.epoch`, the step within the epoch | no |
# | step | the training loop's counter | no |
#
# `checkpoint.save` writes all of it with DCP; `checkpoint.load(trainer, path, omit=...)`
# restores all but the pieces named. The next cell trains 12 steps without a break, saving at
# step 6, then resumes from that checkpoint once with everything and once without each piece,
# each time as a new job does (a fresh trainer, its generators seeded from the job's seed), and
# trains on to step 12.

# %%
job = resume_job.Job()
omits = [()] + [(piece,) for piece in checkpoint.PIECES]
path6 = os.path.join(workdir, "step_6")
runs = launch.run(functools.partial(resume_demo.omission_worker, job=job, path=path6, save_at=6,
                                    omits=omits), job.world_size, timeout_s=180,
                  threads_per_rank=1)
print(resume_demo.departure_table(runs[0], omits, save_at=6))

# %% [markdown]
# Read the table from the top. With everything restored the resumed losses equal the
# uninterrupted ones exactly: "none" differs. Every piece left out changes the run:
#
# * **weights**: the new job goes on from its initial weights (a large difference at once). A
#   trap on the way: `get_model_state_dict` returns the parameters themselves, so `dcp.load`
#   writes into them even when a program means to keep them (`checkpoint.load` drops them from
#   the dict to leave them out);
# * **generators**, **sampler epoch**, **position**: the very first resumed step differs (other
#   dropout masks, other noise, another masked feature, another epoch's order, rows read twice);
# * **optimizer**: the first loss is still right (it is computed before the update), the next
#   differs: Adam starts again from zero moments and step count 1, so its first update has the
#   full size `lr` in every direction;
# * **schedule**: one step later still. The optimizer's saved `lr` is right for step 6, but the
#   restarted schedule sets step 7's from its own count, 1: the warm-up again;
# * **step**: no loss differs ("none"), but the job trains 12 more steps, not 6 (18 in all):
#   it ends elsewhere.
#
# Two details of DCP decide whether the generators survive. First, the checkpoint holds one
# state per rank, under a key of its own (`rng.rank0`, `rng.rank1`): DCP writes a key that every
# rank saves **once** (it takes equal keys for one replicated value: `dedup_save_plans` in
# `torch/distributed/checkpoint/_dedup_save_plans.py`), so a single `"rng"` key would give every
# rank the same generator. Second, `get_state_dict` on an optimizer that has not stepped yet
# makes its state by calling `step()` with zero gradients and `lr = 0` (`_init_optim_state` in
# `torch/distributed/checkpoint/state_dict.py`), so there are tensors to load into; a plain
# `optimizer.state_dict()` of a new optimizer has none, and a load into it silently restores
# nothing.

# %%
fig, ax = plt.subplots(figsize=(7.4, 3.4))
markers = iter("osD^v<>p")
for omit, losses in zip(omits[1:], runs[0]["resumed"][1:]):
    if omit[0] == "step":
        continue
    gap = np.abs(np.array(losses[:job.steps - 6]) - np.array(runs[0]["uninterrupted"][6:]))
    ax.plot(np.arange(6, job.steps), np.maximum(gap, 1e-9), marker=next(markers), ms=4, lw=1,
            ls="-" if omit[0] in ("weights", "optimizer", "schedule") else "--",
            label=f"without {omit[0]}")
ax.set(yscale="log", ylim=(5e-10, 3), xlabel="step (resumed at 6)",
       ylabel="|loss - uninterrupted loss|", title="How far each resume departs (1e-9: equal)")
ax.legend(fontsize=8, ncol=2, loc="lower right")
plt.show()

# %% [markdown]
# **Loaded before wrapping.** Two ways of resuming *before* `fully_shard` look harmless. Loading
# the checkpoint into the whole model and then sharding it gives the right weights, but every
# rank reads every piece of every weight (D times the bytes, and the whole model in each rank's
# memory: at 70B parameters that does not fit). And an optimizer made before `fully_shard` holds
# the parameters that wrapping replaces: the next cell trains with one for 2 steps.

# %%
wrapped = launch.run(functools.partial(resume_demo.before_wrapping_worker, job=job, path=path6),
                     job.world_size, timeout_s=120, threads_per_rank=1)
w = wrapped[0]
print(f"bytes rank 0 reads: {w['read_before']:,} loading before fully_shard, "
      f"{w['read_after']:,} after (its shard)")
print("the model moved in 2 steps with an optimizer made before fully_shard:", w["moved"])

# %% [markdown]
# The weights never move, and nothing fails: the optimizer steps tensors no forward pass uses.
# Build the model, shard it, make the optimizer, *then* load.
#
# ## 2. Bit for bit, in a new job
#
# A real resume happens in new processes, where nothing survives but the files. The next cell
# starts 2 new ranks (a second `launch.run`), loads the step-6 checkpoint and trains to step 12.

# %%
again = launch.run(functools.partial(resume_demo.resume_worker, job=job, path=path6),
                   job.world_size, timeout_s=120, threads_per_rank=1)
print("losses of steps 6-11 equal, bit for bit:",
      again[0]["losses"] == runs[0]["uninterrupted"][6:])
print("final weights equal, bit for bit:",
      resume_demo.same_bits(again[0]["final"]["weights"], runs[0]["weights"]))
ref = resume_job.reference_run(job)
print("and one process running the same job rank by rank ends with the same weights:",
      resume_demo.same_bits(ref["weights"], runs[0]["weights"]))

# %% [markdown]
# On CPU the same operations on the same numbers in the same order give the same bits, so the
# resumed run *is* the uninterrupted one. On GPUs several things break that:
#
# * **Non-deterministic kernels**: some CUDA kernels add with atomics in whatever order the
#   threads arrive. In an LLM the main one is attention's backward (FlashAttention's fast
#   backward; its `deterministic=True` backward, an argument of `flash_attn_func`, is slower;
#   `scaled_dot_product_attention`'s docstring says its cuDNN path may pick a
#   non-deterministic algorithm). cuBLAS matrix products were another until PyTorch gave each
#   handle and stream a workspace of its own: older releases asked for
#   `CUBLAS_WORKSPACE_CONFIG=:4096:8`, and this one's `use_deterministic_algorithms`
#   docstring no longer names it (PyTorch pull request 161749 dropped the requirement).
#   `torch.use_deterministic_algorithms(True)` makes the operations it knows deterministic or
#   refuses them: its docstring lists `scatter_add_` and `index_add` on CUDA among the first,
#   the backward of `EmbeddingBag` with `mode='max'` among the second.
# * **Autotuning**: with `torch.backends.cudnn.benchmark = True`, each new process times several
#   convolution algorithms and keeps the fastest (PyTorch's reproducibility notes), which may add
#   in another order after a restart.
# * **Collectives**: NCCL picks an algorithm (ring, tree, NVLS, CollNet, PAT), a protocol and a
#   number of channels per call from the size and the topology (`NCCL_ALGO` and `NCCL_PROTO`
#   pin the first two), so a restart on other nodes can sum in another order.
# * Not a cause: TF32 matrix products differ from fp32 ones, but the same way every run.
# * **Generators**: each GPU has its own (`torch.cuda.get_rng_state_all`); `checkpoint.save`
#   stores them when CUDA is present.
#
# Such runs resume *statistically* the same, not bit for bit: compare loss curves within a
# tolerance there. On CPU, the same number of threads matters for the same reason (a reduction
# split over more threads adds in another order): `launch.run` gives each rank one here.
#
# ## 3. Resharding: save on one mesh, load on another
#
# A checkpoint written by DP 4 must load into DP 2 x TP 2 when the job moves to other hardware,
# or into another ZeRO stage. DCP makes that a load-time question: the `.metadata` says which
# piece of which tensor each file holds, and each rank asks for the pieces that overlap what it
# holds now. `reshard.reshard_worker` saves an MLP (Linear(32, 128), ReLU, Linear(128, 32)) and
# AdamW's moments from **DP 4** (FSDP2: every tensor split by rows over 4 ranks), then loads,
# on the same 4 ranks, into
#
# * **DP 2 x TP 2**: the first layer column-parallel, the second row-parallel (DTensor), then
#   FSDP2 over the "dp" half of a 2 x 2 mesh;
# * **DP 4, ZeRO-1**: the weights whole on every rank, Adam's moments split by rows.
#
# Prediction from the layouts alone (`reshard.predicted_bytes`): a rank writes one piece per
# tensor; to load, it reads **every saved piece that overlaps a piece it holds, whole** (DCP's
# `FileSystemReader.read_data` loads the stored piece, then keeps the overlap). Each piece is
# stored as one `torch.save`d tensor: its data plus about 1.5 KB of records.

# %%
resharded = launch.run(functools.partial(reshard.reshard_worker,
                                         path=os.path.join(workdir, "mlp")), 4, timeout_s=180,
                       threads_per_rank=1)
print(reshard.table(resharded))
print("every whole weight and moment equal to the saved ones:",
      all(r[layout]["equal"] for r in resharded for layout in reshard.LAYOUTS))
print("predicted == measured on every rank:", all(
    r[lay]["read"] == reshard.predicted_bytes(lay, k)["read"] for k, r in enumerate(resharded)
    for lay in reshard.LAYOUTS[1:]) and all(r[reshard.LAYOUTS[0]]["written"] ==
                                           reshard.predicted_bytes(reshard.LAYOUTS[1], k)
                                           ["written"] for k, r in enumerate(resharded)))

# %% [markdown]
# Every rank writes 43,884 bytes: 12 pieces (4 weights, 8 moments), 25,056 bytes of data.
# Into DP 2 x TP 2 a rank keeps a quarter of each tensor (half of the last bias, which both TP
# ranks hold) but reads 18 pieces: the
# column-parallel layer's rows line up with one saved piece each, but the row-parallel weight
# keeps half the columns of two saved row blocks, and reads both blocks whole. Into ZeRO-1 a
# rank reads all 4 pieces of every weight (it holds them whole) and one piece of each moment.
# So resharding costs reads, not only bytes kept: a layout whose splits cut across the saved
# ones reads more than it keeps. And the loss of the three models on the same batch:

# %%
print({layout: f"{resharded[0][layout]['loss']:.7f}" for layout in reshard.LAYOUTS})

# %% [markdown]
# **The data reshards too, or the run changes.** DCP reshards the model and the optimizer. What
# else a checkpoint holds was made for one number of ranks: each rank's generators (saved under
# a key per rank: a new rank 3 has none to load) and the sampler's partition. torch's
# `DistributedSampler` deals each epoch's permutation out rank by rank (`indices[self.rank :
# self.total_size : self.num_replicas]` in `torch/utils/data/distributed.py`), so the rows rank
# 0 sees at step 7 depend on how many ranks there are. torchtitan's data loader stores the world
# size and refuses another ("Data loader resharding is not yet supported", its comment says).
# `resume_job.GlobalSampler` keys the position to the job instead: one permutation per epoch,
# cut into global batches of fixed size, and each rank takes its slice of the global batch; the
# input noise and the masked feature are drawn from a generator of each sample's own. Saved at
# step 6 by 4 ranks (global batch 8, no dropout: dropout draws from each rank's generator),
# resumed by 2 (`resume_demo.resized_worker`: the same global batch, `checkpoint.load(...,
# omit=checkpoint.PER_RANK)`):

# %%
print(resume_demo.resized_table(resume_demo.resized_runs(workdir, resumed_by=(2,))))

# %% [markdown]
# With torch's sampler the resumed run is another run: other rows on each rank, other noise, a
# loss up to 13 % away. With the global sampler it is the same run, up to the order in which
# floats are added (the gradients now average over 2 ranks' sums of 4 rows, not 4 ranks' sums of
# 2): a relative difference of about 1e-7. (`tests/test_checkpoint.py` checks 4 -> 2 and 4 -> 1,
# two seeds.)

# %% [markdown]
# ## 4. A lost rank
#
# `torchrun` runs an **agent** on each node that starts the ranks and watches them. With
# `--max-restarts N`, when a rank dies it stops the others (SIGTERM), forms the group again and
# starts every rank anew, up to N times; the ranks must then find their last checkpoint
# themselves. `lost_rank.run` starts torchrun's own agent (`elastic_launch`, what the `torchrun`
# command calls, with `max_restarts = 1`) in a process of its own, twice: once uninterrupted, once
# with a real `SIGKILL` of rank 1 in the middle of step 6. The job saves every 4 steps, each
# step padded to 0.1 s so that the timeline reads like a bigger model's, and on start resumes
# from `checkpoint.latest` (the newest complete checkpoint). The same job from a shell:
#
# ```bash
# torchrun --standalone --nproc-per-node 2 --max-restarts 1 -m course_utils.checkpoint.lost_rank FOLDER
# ```

# %%
plan = lost_rank.Plan()
lost = lost_rank.run(plan, timeout_s=240)
kill = lost["kill"]
print(f"rank {kill['rank']} was killed in step {kill['step']}; the agent restarted the job, which "
      f"resumed from the checkpoint of step {kill['resumed_from']}")
print("the killed run ends with the uninterrupted run's weights, bit for bit:",
      lost["killed"]["weights"] == lost["uninterrupted"]["weights"])
print("and its last losses equal:", lost["killed"]["losses"] == lost["uninterrupted"]["losses"][
    kill["resumed_from"]:])

# %%
# NBVAL_IGNORE_OUTPUT
print(f"uninterrupted: {lost['uninterrupted']['total_s']:.2f} s; with the kill: "
      f"{lost['killed']['total_s']:.2f} s")
print(f"restart (kill -> first step of the new attempt): {kill['restart_s']:.2f} s")
print(f"time lost: measured {kill['lost_s']:.2f} s, predicted "
      f"{lost_rank.predicted_lost_s(plan, kill['restart_s']):.2f} s = (6 - 4 + 0.5) steps x "
      f"{plan.step_s} s + the restart")
print("torchrun's agent:", *(line.split("] ", 1)[-1] for line in lost["agent"]
                              if "attempts left" in line))
fig, ax = plt.subplots(figsize=(8.4, 3.2))
lost_rank.draw(lost, ax)
plt.show()

# %% [markdown]
# The time lost is the work since the last checkpoint (the step-4 checkpoint was saved 2.5
# steps before the kill) plus the restart: noticing the dead rank (the agent polls every 0.05
# s here), stopping the survivor, forming the group, starting the ranks, loading.
# `tests/test_checkpoint.py` checks measured == predicted within timing noise, and runs the same
# job under the `torchrun` command.
#
# **A lost node.** Restarting every rank where it was helps when the fault was passing. At
# scale it mostly is not: of Llama 3 405B's 419 unexpected interruptions in 54 days, more than
# three quarters were confirmed or suspected hardware, faulty GPUs and their HBM3 memory nearly
# half of all (Llama Team 2024, Table 5). A restart on the same node meets the same GPU. The cure is to leave the host
# out, and torchrun does it when the job is **elastic**: `--nnodes 1:2` and a c10d rendezvous,
# one agent per node; when a node goes silent, the agents left start a new round without it,
# and the job goes on with fewer ranks. `lost_node.run` starts two agents on this machine as two
# nodes (node a hosts the rendezvous store), one rank each, and kills node b's agent and rank
# together in step 3. The job is the global-sampler run of section 3 (global batch 8), saved
# every 2 steps, so one rank resumes it with the same batches:

# %%
node = lost_node.run(lost_node.Plan(), timeout_s=240)
print(f"ranks in each attempt: {dict(node['worlds'])}; node {node['kill']['node']} was killed in "
      f"step {node['kill']['step']}; node a resumed alone from step {node['resumed_from']}")
print(f"largest loss difference from the uninterrupted run after it: "
      f"{node['largest_difference']:.0e}")

# %%
# NBVAL_IGNORE_OUTPUT
print(f"kill -> first step on one rank: {node['restart_s']:.1f} s")

# %% [markdown]
# Most of that wait is the rendezvous deciding that node b is dead: a node whose last heartbeat
# is older than `keep_alive_interval x keep_alive_max_attempt` is dropped (`_sanitize` in
# `torch/distributed/elastic/rendezvous/dynamic_rendezvous.py`), then the round waits
# `last_call_timeout` for late nodes. This run sets them to 1 s x 2 and 1 s; torchrun's defaults
# are 5 s x 3 and 30 s (`benchmarks/lost_node.py` measures both). The other half of excluding a
# bad host is not to let it back: a scheduler's job (Slurm's `--exclude`), not torchrun's.
#
# **How often to checkpoint.** Saving every `tau` seconds of work costs `delta` seconds of
# stalled training per save; a failure costs, on average, half an interval of redone work plus
# the restart `R`. With failures every `M` seconds on average, the time lost per second of
# training is, to first order, `delta / tau + (tau / 2 + R) / M`, smallest at **Young's interval**
# `tau* = sqrt(2 delta M)` (J. W. Young, 1974). "First order" carries assumptions: failures
# arrive at random at a constant rate (so when one strikes, the time since the last save is
# uniform over the interval: that gives the `tau / 2`), no failure strikes during a save or a
# restart, and `delta` and `R` are much smaller than `M`. **Daly** (2006) drops the last two:
# with failures striking at any time, an interval and its save take on average
# `M e^(R/M) (e^((tau + delta)/M) - 1)` seconds (`checkpoint_interval.expected_waste`), and his
# higher-order estimate of the best interval is
# `sqrt(2 delta M) [1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9] - delta` (for `delta < 2M`).
#
# `delta` is what the training waits for. A synchronous `dcp.save` waits for the whole write;
# `dcp.async_save` waits only while it copies the state to memory, then a thread writes it
# (its collectives on a gloo group of their own: `checkpoint.save(..., async_group=...)`).
# Measured on 2 ranks, 6 MB of state per rank (1M weights and their two moments, split):

# %%
# NBVAL_IGNORE_OUTPUT
costs = launch.run(functools.partial(checkpoint_interval.save_cost_worker,
                                     path=os.path.join(workdir, "costs")), 2, timeout_s=120,
                   threads_per_rank=1)
c = costs[0]
print(f"dcp.save: {c['sync'] * 1e3:.0f} ms stalled; dcp.async_save: {c['async_blocked'] * 1e3:.0f}"
      f" ms stalled, written after {c['async_total'] * 1e3:.0f} ms")

# %% [markdown]
# **What `async_save`'s return means.** It returns once the state is copied (staged); the
# checkpoint exists only when its future completes. Three consequences, measured by
# `checkpoint_interval.async_save_worker` on 2 ranks (12 MB of state each, written to storage
# made 0.3 s slower, so that the write is still going on when we look):
#
# * **durable late**: when `async_save` returns, `checkpoint.verify` refuses the folder (no
#   `.metadata` yet): a failure now loses this checkpoint, and the job rolls back to the one
#   before. The redone work is then `tau / 2 + write` on average, not `tau / 2`;
# * **the next save waits for this one**: each `async_save` starts a writer thread of its own
#   (`_ThreadBasedAsyncCheckpointExecutor` in `torch/distributed/checkpoint/`), so nothing
#   stops two writes running at once on one process group; torchtitan's `CheckpointManager`
#   waits for the last future before it saves again (`_async_wait`);
# * **a copy in host memory**: the staged copy is as large as the rank's state, held until the
#   write ends; training changes the weights in place meanwhile, and the checkpoint still holds
#   the values at the save.

# %%
facts = launch.run(functools.partial(checkpoint_interval.async_save_worker,
                                     path=os.path.join(workdir, "async")), 2, timeout_s=120,
                   threads_per_rank=1)
a = facts[0]
print(f"state {a['state_bytes']:,} bytes; staged copy {a['staged_bytes']:,} bytes")
print(f"durable when async_save returned: {a['durable_at_return']}; after its future: "
      f"{a['durable_after']}; holds the values at the save: {a['holds_values_at_save']}")

# %%
# NBVAL_IGNORE_OUTPUT
print(f"stalled {a['stalled_s'] * 1e3:.0f} ms; the next save waited {a['next_save_waits_s']:.2f} s "
      f"for the write; resident memory grew {a['resident_growth'] / 1e6:.1f} MB")

# %% [markdown]
# At scale: Llama 3's job lost a rank about every 3 hours (M = 54 days / 419). If a synchronous
# save stalls it for 60 s and a restart takes 10 minutes:

# %%
M, delta, R = 54 * 24 * 3600 / 419, 60.0, 600.0
tau, tau_daly = (checkpoint_interval.young_interval(delta, M),
                 checkpoint_interval.daly_interval(delta, M))
print(f"M = {M / 3600:.2f} h; Young's interval sqrt(2 x 60 s x M) = {tau / 60:.1f} min; "
      f"Daly's estimate {tau_daly / 60:.1f} min")
print(f"time lost per unit of training, first order at Young's: "
      f"{checkpoint_interval.waste(tau, delta, M, R):.1%} (saves {delta / tau:.1%}, redone work "
      f"{tau / 2 / M:.1%}, restarts {R / M:.1%}); Daly's model at his estimate: "
      f"{checkpoint_interval.expected_waste(tau_daly, delta, M, R):.1%}")
async_delta = 5.0
tau_async = checkpoint_interval.daly_interval(async_delta, M)
print(f"if only 5 s stall (async_save): every {tau_async / 60:.1f} min, "
      f"{checkpoint_interval.expected_waste(tau_async, async_delta, M, R):.1%} lost")
print(f"first order at that interval: {checkpoint_interval.waste(tau_async, async_delta, M, R):.2%}"
      f" lost if a save is durable when its stall ends, "
      f"{checkpoint_interval.waste(tau_async, async_delta, M, R, write=55):.2%} if its write "
      f"goes on 55 s more")

# %% [markdown]
# The next cell replays the job under Daly's model: failures drawn at random (the same failure
# times for every interval, so the points form a curve), striking work, saves and restarts
# alike, each one rolling back to the last completed save (`checkpoint_interval.simulate`,
# 50 million seconds of training per point).

# %%
taus = np.geomspace(120, 2 * 3600, 61)
fig, ax = plt.subplots(figsize=(7.6, 3.8))
lowest = {}
for d, name, color in ((delta, "60 s stall (dcp.save)", style.AXIS_COLORS["dp"]),
                       (async_delta, "5 s stall (async_save)", style.AXIS_COLORS["tp"])):
    exact = [checkpoint_interval.expected_waste(t, d, M, R) for t in taus]
    sim = np.array([checkpoint_interval.simulate(t, d, M, R, work=5e7, seed=1) for t in taus])
    lowest[name] = (taus[np.argmin(sim)], sim)
    ax.plot(taus / 60, exact, color=color, label=f"{name}: Daly's model")
    ax.plot(taus / 60, [checkpoint_interval.waste(t, d, M, R) for t in taus], "--", color=color,
            lw=1, label="first order")
    ax.plot(taus[::2] / 60, sim[::2], "o", ms=4, mfc="none", color=color, label="simulated")
    ax.axvline(checkpoint_interval.daly_interval(d, M) / 60, ls=":", color=color)
ax.set(xscale="log", xlabel="checkpoint interval (minutes of work; dotted: Daly's estimate)",
       ylim=(0, None), ylabel="time lost per unit of training",
       title=f"Lost time against the interval (M = {M / 3600:.1f} h, R = {R / 60:.0f} min)")
ax.legend(fontsize=8, ncol=2, loc="upper center")
plt.show()
for name, (best, sim) in lowest.items():
    near = taus[sim <= 1.01 * sim.min()] / 60
    print(f"{name}: simulated minimum at {best / 60:.1f} min; within 1 % of it from "
          f"{near[0]:.1f} to {near[-1]:.1f} min")
sim = lowest["60 s stall (dcp.save)"][1]
exact = np.array([checkpoint_interval.expected_waste(t, delta, M, R) for t in taus])
first = np.array([checkpoint_interval.waste(t, delta, M, R) for t in taus])
at = int(np.argmin(abs(taus - 90 * 60)))
print(f"60 s stall: simulated vs Daly's model at most {np.max(abs(sim / exact - 1)):.1%} apart; "
      f"at {taus[at] / 60:.0f} min the first order is {1 - first[at] / exact[at]:.0%} below it")

# %% [markdown]
# The simulated points lie on Daly's curve. The first-order curve runs below both: by about a
# tenth near the optimum, by a fifth at long intervals, where a failure during the longer
# redone work, the save or the restart is no longer rare. The minimum is flat: about two
# minutes either side of it cost under 1 % more, so Young's and Daly's intervals are both good
# choices here. An asynchronous save moves the optimum to a shorter interval and lowers the
# whole curve: less work is lost per failure for less stall. (The curves count an asynchronous
# checkpoint as done when the stall ends; it is durable only when its write ends, which adds
# the write's duration to each failure's redone work: 8.39 % becomes 8.88 % above.)
# The restarts' share is a floor no interval
# can remove: that is why production stacks work to restart in seconds (keeping checkpoints in
# the memory of other nodes, spare nodes waiting).
#
# ## 5. Module 10's trainer, saved and resumed on 8 ranks
#
# `checkpoint3d` saves module 10's DP 2 x PP 2 x TP 2 run with DCP: each rank its stage's TP
# slice (the two DP replicas hold the same bits: DCP writes one copy); Adam's moments and step
# count for each piece of its ZeRO-1 slices (`ShardedOptimizer` runs Adam on one piece per
# parameter its slices touch; with bf16 weights, the pieces' fp32 master copy too); and the
# step. The gradient buffer is zeroed after each step: nothing to save. Neither is there for
# the data: step `s` reads `MarkovCorpus.batch(s, ...)`. A first job trains 6 steps and saves
# after 3; a new job (8 new processes) loads it and trains steps 3 to 5. Its keys name mesh
# coordinates (`pp0.tp1.<name>`, `pp0.tp1.dp1.3.exp_avg`), not whole tensors with their
# placements: this checkpoint resumes on the same mesh only. Resuming it on another mesh would
# need each tensor saved under its name as a DTensor, as FSDP2's are in section 3.

# %%
plan3d = train3d.Plan(steps=6)
run3d = checkpoint3d.run(plan3d, os.path.join(workdir, "tinylm_step_3"), save_at=3)
print("all 8 ranks: losses of steps 3-5 and final weights equal the uninterrupted run's, bit for "
      "bit:", checkpoint3d.same_run(run3d["uninterrupted"], run3d["resumed"], 3))
print("resumed losses (last stage):", [f"{x:.4f}" for x in run3d["resumed"][-1]["losses"]])

# %% [markdown]
# ## 6. Checkpoints that must be refused
#
# A wrong checkpoint must stop the job with a message that says what is wrong, never resume
# something else silently. `checkpoint.verify` (which `checkpoint.load` calls first) reads only
# the `.metadata` and the files' sizes. Three cases:
#
# * **half-written**: a job killed while saving. The next cell runs a save on 2 ranks in which
#   rank 1 receives SIGKILL as it starts writing its file. DCP writes `.metadata` last, after
#   every rank's file, so a folder without one was never finished;
# * **a missing shard**: a copy of the step-6 checkpoint that lost rank 1's file;
# * **another model**: the step-6 checkpoint offered to a model of hidden width 48, not 32.

# %%
half = os.path.join(workdir, "step_9")
try:
    launch.run(functools.partial(resume_demo.killed_while_saving_worker, job=job, path=half),
               job.world_size, timeout_s=120, threads_per_rank=1, show_output=False)
except launch.RankError as error:
    print("the save:", str(error).splitlines()[0])
shutil.copytree(path6, os.path.join(workdir, "copy_of_step_6"))
os.remove(os.path.join(workdir, "copy_of_step_6", "__1_0.distcp"))
other = {"model": resume_job.build_model(resume_job.Job(hidden=48)).state_dict()}
for folder, state in ((half, None), (os.path.join(workdir, "copy_of_step_6"), None),
                      (path6, other)):
    try:
        checkpoint.verify(folder, state)
    except checkpoint.CheckpointError as error:
        print("-", error)
print("newest complete checkpoint:", checkpoint.latest(workdir)[1].name)

# %% [markdown]
# `checkpoint.latest` skips the half-written `step_9` and resumes from `step_6`: the same
# rule the lost-rank job used.

# %%
shutil.rmtree(workdir)
print("temporary checkpoints removed:", not os.path.exists(workdir))

# %% [markdown]
# ## Summary
#
# | what | predicted | measured |
# | --- | --- | --- |
# | resume with every piece | the uninterrupted run | equal, bit for bit (new processes) |
# | resume without a piece (optimizer, schedule, an RNG, data position) | departs | at the 1st or 2nd step |
# | loading before `fully_shard` | every rank reads everything | 2x the bytes; an early optimizer never moves |
# | DP 4 -> DP 2 x TP 2 and -> ZeRO-1 | bytes read, from the layouts | equal to the byte; state bit for bit |
# | SIGKILL in step 6, saves every 4 steps | resume at 4; 2.5 steps + restart lost | so; ends bit for bit the same |
# | how often to save | Young: sqrt(2 delta M) | the simulated optimum |
# | module 10's trainer, 8 ranks | resumes exactly | equal, bit for bit |
# | half-written, missing shard, other model | refused | refused, naming the problem |

# %% [markdown]
# **Next**: assignment `a12_checkpointing` (in your workspace under
# `assignments/a12_checkpointing/`): size a checkpoint and its interval for your own job, then
# write the save and the resume of a sharded run yourself; it is run on real ranks and must
# equal one process's uninterrupted run on meshes this notebook does not show. Then module 13
# turns module 11's bytes and collectives into a step's time, checks the model on real ranks and
# predicts published runs.

# %% [markdown]
# # Assignment 10: The 3-D training step (capstone)
#
# Lecture 10 trained TinyLM on a DP x PP x TP mesh with the course's own step. Here you write
# the two pieces that decide whether such a run is right: the training step every rank runs
# (Q1) and Megatron's "f" operator that tensor parallelism needs in backward (Q2). Both run on
# real gloo ranks and are compared with one process training the whole model on the whole
# batch: the loss of every step, every rank's gradients and its weights after the update.
#
# The model is a smaller TinyLM (`capstone.CFG`: 16-dimensional, 2 blocks, 5,136 parameters),
# so that every rank's tensors can be handed to the grader.
#
# **What the cells check while you practise.** Each test cell runs your code on small practice
# meshes and names the mistake it recognises (gradients D or m times too large, averaged over
# the wrong group, paired with the wrong microbatch, shards never gathered, ...); a practice
# case's right answer is one process's run, which the cell computes itself.
#
# **What grading adds.** Hidden tests run your code on other meshes (4 ranks: one axis of size
# 1 each time, so every axis is tested on its own), seeds and microbatch counts, drawn for your
# submission. A hang is stopped after a time limit and reported with each rank's stack.
#
# **Work it out yourself.** `course_utils` has the course's own versions (for example
# `train3d.train_step` and `tensor_parallel.copy_to_tp`); an answer that uses one is flagged for
# your instructor.

# %%
import torch
import torch.distributed as dist

from course_utils import capstone, checks

# %% [markdown]
# ## The scaffolding
#
# `capstone.run_step(train_step, plan)` starts `plan.world_size` ranks. Each rank builds, from
# one rank grid (module 6), a `g` (`train3d.Groups`) with
#
# * `g.dp_rank, g.pp_rank, g.tp_rank` and `g.dp_size, g.pp_size, g.tp_size`;
# * `g.dp_group` (the same (pp, tp) in every replica) and `g.tp_group` (the same (dp, pp));
# * `g.pp_prev_rank`, `g.pp_next_rank`: the global ranks of the previous and next pipeline
#   stage of the same (dp, tp), `None` at either end; `g.first` and `g.last` say which end.
#
# It also builds `stage`, this rank's pipeline stage with its blocks already split by TP (the
# TP all-reduces happen inside its layers): `stage(x)` takes token ids `(b, T)` on the first
# stage and activations `(b, T, D)` elsewhere (`D = stage.cfg.d_model`), and returns
# activations `(b, T, D)`, or logits `(b, T, V)` on the last stage. And `optimizer`, ZeRO-1's
# Adam over the DP group: `optimizer.update_shard()` applies Adam to this DP rank's shard of
# the stage's weights and returns that shard (a 1-D tensor, the same length on every DP rank);
# `optimizer.load_gathered(flat)` copies the concatenation of all DP ranks' shards, in DP-rank
# order, into the weights. (Its `step()`, which would do both and the all-gather between them,
# is switched off here.)
#
# Then, every step, it calls `train_step(stage, g, inputs, targets, m, optimizer)` with this
# DP replica's rows of the global batch (`inputs`, `targets`: `(b, T)` token ids each) and the
# number of microbatches `m`, and clears the gradients afterwards.

# %% [markdown]
# ## Q1. The training step (6 points)
#
# Write `train_step(stage, g, inputs, targets, m, optimizer)`. It must
#
# 1. cut `inputs` and `targets` into `m` microbatches of equal size (rows);
# 2. run every microbatch forward through this stage: the first stage feeds its token ids; the
#    others receive the activation `(b/m, T, D)` from `g.pp_prev_rank` (it will need a
#    gradient: `requires_grad_(True)`); every stage but the last sends its output to
#    `g.pp_next_rank`;
# 3. on the last stage, take each microbatch's mean cross-entropy
#    (`torch.nn.functional.cross_entropy` on `(b/m * T, V)` logits and `(b/m * T,)` targets)
#    and scale it so that the m backward passes add up to the gradient of the replica's mean
#    loss;
# 4. run every microbatch backward: the last stage from its scaled loss, the others from the
#    gradient received from `g.pp_next_rank`; every stage but the first sends its input's
#    gradient to `g.pp_prev_rank`. Any schedule is fine (all forwards then all backwards is
#    simplest) as long as every pair of neighbours sends and receives in the same order;
# 5. average every gradient over the data-parallel replicas;
# 6. update with ZeRO-1: `optimizer.update_shard()`, all-gather the shards over the right group,
#    `optimizer.load_gathered(...)`;
# 7. return the replica's mean loss (a float) on the last stage, `None` on the others.
#
# Use `torch.distributed` (imported as `dist`): `send`/`recv` (or `isend`/`irecv`, waiting
# for them), `all_reduce`, `all_gather`. Received tensors are float32.

# %% [answer q1]
def train_step(stage, g, inputs, targets, m, optimizer):
    """One training step of this rank: GPipe order, DP average, ZeRO-1 update; loss or None."""
    ### BEGIN SOLUTION
    x_mbs, y_mbs = inputs.chunk(m), targets.chunk(m)                  # m x (b/m, T)
    boundary = (x_mbs[0].shape[0], inputs.shape[1], stage.cfg.d_model)  # (b/m, T, D)
    saved_in, saved_out, loss = [], [], 0.0
    for i in range(m):                                                 # forwards, in order
        x = x_mbs[i]
        if not g.first:
            x = torch.empty(boundary)
            dist.recv(x, src=g.pp_prev_rank)
            x.requires_grad_(True)
        out = stage(x)
        if g.last:
            logits = out.reshape(-1, out.shape[-1])                    # (b/m * T, V)
            out = torch.nn.functional.cross_entropy(logits, y_mbs[i].reshape(-1)) / m
            loss += out.item()
        else:
            dist.send(out.detach(), dst=g.pp_next_rank)
        saved_in.append(x)
        saved_out.append(out)
    for i in range(m):                                                 # backwards, same order
        grad = None
        if not g.last:
            grad = torch.empty(boundary)
            dist.recv(grad, src=g.pp_next_rank)
        torch.autograd.backward(saved_out[i], grad_tensors=grad)
        if not g.first:
            dist.send(saved_in[i].grad, dst=g.pp_prev_rank)
    for p in stage.parameters():                                       # DP: the mean gradient
        dist.all_reduce(p.grad, group=g.dp_group)
        p.grad /= g.dp_size
    shard = optimizer.update_shard()                                   # ZeRO-1: my shard ...
    parts = [torch.empty_like(shard) for _ in range(g.dp_size)]
    dist.all_gather(parts, shard, group=g.dp_group)                    # ... everyone's
    optimizer.load_gathered(torch.cat(parts))
    return loss if g.last else None
    ### END SOLUTION

# %% [test q1_test points=6]
def _q1_practice(label, dp, pp, tp, seed, m):
    """Run train_step on a practice mesh and compare it with one process."""
    p = capstone.plan(dp, pp, tp, seed=seed, m=m)
    capstone.diagnose(p, capstone.run_step(train_step, p), label=label)


_q1_practice("practice mesh DP 2 x PP 2 x TP 1", 2, 2, 1, seed=11, m=4)
_q1_practice("practice mesh DP 1 x PP 2 x TP 2", 1, 2, 2, seed=12, m=2)
print("Q1: both practice meshes equal one process")
### BEGIN HIDDEN TESTS
from course_utils.checks import hidden_cases, submit

for _number, (_dp, _pp, _tp, _seed, _m) in enumerate(hidden_cases("q1_test"), 1):
    _p = capstone.plan(_dp, _pp, _tp, seed=_seed, m=_m)   # drawn per submission
    submit(f"hidden case {_number}", capstone.submission(capstone.run_step(train_step, _p)))
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q2. Megatron's "f" (2 points)
#
# Before each column-parallel layer, every TP rank holds the whole input `x` (the same on every
# rank of the group), and each computes only its heads or its slice of the MLP from it. So in
# forward nothing needs to be communicated, but in backward each rank's `x.grad` is only its own
# slice's share of dLoss/dx. Megatron-LM puts an operator "f" there (module 4).
#
# Write `CopyToTP`, a `torch.autograd.Function` with `forward(ctx, x, tp_group)` and
# `backward(ctx, grad)` (which returns one gradient per input of forward: `None` for the
# group). The test cell runs it on 4 ranks as two TP groups of 2 side by side (each with its own
# `x`, every rank with its own upstream gradient), then trains the practice model with
# `f = lambda x, group: CopyToTP.apply(x, group)` inside every block, on a TP-only mesh, against
# one process.

# %% [answer q2]
class CopyToTP(torch.autograd.Function):
    """Megatron's f: identity forward; all-reduce (sum) of the gradient over tp_group backward."""

    ### BEGIN SOLUTION
    @staticmethod
    def forward(ctx, x, tp_group):
        ctx.tp_group = tp_group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()           # never reduce into autograd's own buffer
        dist.all_reduce(grad, group=ctx.tp_group)  # sum of every TP rank's share
        return grad, None
    ### END SOLUTION

# %% [test q2_test points=2]
def _f(x, group):
    return CopyToTP.apply(x, group)


capstone.diagnose_f(capstone.probe_f(_f, seed=21), seed=21, label="practice probe")
_p = capstone.plan(1, 1, 2, seed=22, m=2)
capstone.diagnose(_p, capstone.run_step(None, _p, f=_f), label="practice mesh TP 2")
print("Q2: f is right on the probe and in training")
### BEGIN HIDDEN TESTS
from course_utils.checks import hidden_cases, submit

for _number, (_seed, _dp, _tp) in enumerate(hidden_cases("q2_test"), 1):
    submit(f"hidden case {_number} probe", capstone.probe_f(_f, seed=_seed))
    _p = capstone.plan(_dp, 1, _tp, seed=_seed, m=2)
    submit(f"hidden case {_number} run", capstone.submission(capstone.run_step(None, _p, f=_f)))
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q3. Reading your own run (2 points, graded by hand)
#
# Lecture 10's step-time table splits each rank's step into compute, TP all-reduces, waiting
# for a pipeline neighbour and DP. In a few sentences: (a) which of the three axes' traffic in
# your `train_step` happens once per microbatch and which once per step, and what that means
# for where you would put each axis on a cluster of 8-GPU nodes; (b) your `train_step` runs
# every forward before any backward (or 1F1B): what does that choice change for the bubble and
# for the activations a stage holds; (c) one way your step leaves communication exposed that
# lecture 10's step hides, and how the lecture's step hides it.

# %% [manual q3_explain points=2]
# ### BEGIN SOLUTION
# (a) TP's all-reduces happen inside every block, forward and backward, for every microbatch;
# the pipeline sends one activation and one gradient per microbatch per boundary; DP's
# gradient all-reduce and ZeRO-1's all-gather happen once per step. So TP goes on the fastest
# links, inside a node (NVLink), PP can span nodes (a few tensors per microbatch, only between
# neighbours), and DP goes across nodes, where its once-per-step traffic can overlap with
# backward. (b) All forwards first (GPipe) and 1F1B have the same bubble, (P-1)/(m+P-1), for
# balanced stages; GPipe holds all m microbatches' activations on every stage until the
# backwards start, 1F1B at most P - r on stage r. (c) The gradient all-reduce starts only after
# the last backward, so all of it is exposed; lecture 10 uses buckets that start all-reducing
# during the last microbatch's backward (post-accumulate-grad hooks), so only the last buckets
# are waited for. Blocking send/recv also serialise the stages where isend overlaps them.
#
# **Rubric** (2 points):
# * 1 point: (a) TP per microbatch and per block (forward and backward), PP per microbatch per
#   boundary, DP once per step; TP inside a node, DP across nodes (PP in between).
# * 1 point: (b) same bubble, different activation memory (m vs at most P - r microbatches);
#   and (c) the exposed all-reduce after backward versus buckets started during the last
#   backward (or blocking sends versus isend).
# * 0 points: says 1F1B shrinks the bubble, or places TP across nodes without a reason.
# ### END SOLUTION

# %% [markdown]
# ## Submitting
#
# Save the notebook, then hand in this file itself, **`a10_capstone.ipynb`**, with its name
# unchanged (in `make lab` it is `workspace/assignments/a10_capstone/a10_capstone.ipynb`), the
# way your instructor asks. Outputs may be cleared (*Edit > Clear Outputs of All Cells*): your
# instructor runs the whole notebook again, from the top, in a fresh kernel, to grade it, so
# first check that *Kernel > Restart Kernel and Run All Cells* meets no `NameError` (a check
# that names a mistake stops *Run All* where it is; grading runs every cell anyway). Learning on
# your own with the full repository? `make check A=a10_capstone` grades your copy the same way.

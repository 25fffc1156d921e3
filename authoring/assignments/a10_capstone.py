# %% [markdown]
# # Assignment 10: The 3-D training step (capstone)
#
# Lecture 10 trained TinyLM on a DP x PP x TP mesh with the course's own step. In part 1 you
# write the two pieces that decide whether such a run is right: the training step every rank
# runs (Q1) and Megatron's "f" operator that tensor parallelism needs in backward (Q2). Both run
# on real gloo ranks and are compared with one process training the whole model on the whole
# batch: the loss of every step, every rank's gradients and its weights after the update. In
# part 2 (Q4-Q8) you debug five short data-parallel programs, each broken by a pitfall seen in
# real training: say what is wrong, then fix it.
#
# The model is a smaller TinyLM (`capstone.CFG`: 16-dimensional, 2 blocks, 5,136 parameters),
# so that every rank's tensors can be handed to the grader.
#
# **What the cells check while you practise.** Each test cell runs your code on small practice
# meshes and names the mistake it recognises (gradients D or m times too large, averaged over
# the wrong group, paired with the wrong microbatch, shards never gathered, ...); a practice
# case's right answer is one process's run, which the cell computes itself.
#
# **What grading adds.** Hidden tests run your code on three other meshes of 4 ranks, each
# with two of the three axes (DP x PP, DP x TP and PP x TP: every pair of axes together, where
# the practice cells try DP x PP and PP x TP), and on seeds and microbatch counts drawn for your
# submission. A hang is stopped after a time limit and reported with each rank's stack.
#
# **Work it out yourself.** `course_utils` has the course's own pieces (for example
# `tensor_parallel.copy_to_tp`, and lecture 10's `train3d.train_step`, a different step: it
# reduce-scatters from its own gradient buffer and needs the optimizer's own all-gather); an
# answer that uses one is flagged for your instructor.

# %%
import torch
import torch.distributed as dist

from course_utils.assess import a10_capstone as capstone, checks

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
# activations `(b, T, D)`, or logits `(b, T, V)` on the last stage (here the embedding and the
# head are whole on every TP rank, and there is no sequence parallelism). And `optimizer`,
# ZeRO-1's Adam over the DP group (`zero1.ShardedOptimizer` around `torch.optim.Adam`,
# `lr = 1e-2`, and `eps = 1e-5` rather than torch's `1e-8`: with `1e-8`, a gradient of a few
# 1e-9 moves its weight by an amount the summation order decides, and a right step could fail
# the comparison; `capstone.ADAM_EPS` shows the case):
# `optimizer.update_shard()` applies Adam to this DP rank's shard of
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
from course_utils.assess.checks import hidden_cases, submit

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
from course_utils.assess.checks import hidden_cases, submit

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
# backwards start, 1F1B at most min(P - r, m) on stage r (r counted from 0: stage r runs
# P - r - 1 warm-up forwards and one more before its first backward, and never more than m).
# (c) The gradient all-reduce starts only after the last backward, so all of it is exposed;
# lecture 10 starts each bucket's reduce-scatter during the last microbatch's backward
# (post-accumulate-grad hooks), so only the last buckets are waited for. Blocking send/recv
# also serialise the stages where lecture 10 posts each send with the next receive.
#
# **Rubric** (2 points):
# * 1 point: (a) TP per microbatch and per block (forward and backward), PP per microbatch per
#   boundary, DP once per step; TP inside a node, DP across nodes (PP in between).
# * 1 point: (b) same bubble, different activation memory (m vs at most min(P - r, m)
#   microbatches); and (c) the exposed all-reduce after backward versus buckets started during
#   the last backward (or blocking sends versus non-blocking ones).
# * 0 points: says 1F1B shrinks the bubble, or places TP across nodes without a reason.
# ### END SOLUTION

# %% [markdown]
# ## Part 2. Debugging a broken run
#
# Most of the time spent on a distributed training job goes into finding out why it is wrong.
# Here are five short data-parallel programs, each with a pitfall seen in real training. Every
# one runs on real gloo ranks, and each is compared with the run it must equal: one process
# training the same model, with the same SGD, on the whole global batch
# (`pitfalls.one_device`). For each program:
#
# 1. read it (`pitfalls.show(name)`) and run it (`pitfalls.demo(name)`: the largest difference
#    of every rank's weights from one process's, and what the program recorded);
# 2. say what is wrong: a choice, graded (1 point);
# 3. fix it: a worker with the same signature, `fn(rank, world_size, job)`, returning what the
#    program returns (2 points). The test cell runs your fix on real ranks on the program's
#    practice job and names the mistake it recognises; grading runs it on jobs drawn for your
#    submission (other seeds, 2 or 3 ranks).
#
# `job` (a `pitfalls.Job`) gives every program the same pieces: `job.model()` (the same weights
# on every rank), `job.optimizer(model)` (SGD), `job.batch(step)` (the global batch: `x`
# `(R, T, F)` features, `y` `(R, T)` classes, `mask` `(R, T)`, 1 for a real token and 0 for
# padding), `job.shard(batch, rank)` (this rank's rows), `job.loss(model, x, y)` (the mean
# cross-entropy over every position), `job.token_losses(model, x, y)` (one per position,
# `(b, T)`), and `job.result(model, ...)`, what a program returns.

# %%
from course_utils.data_parallel import pitfalls
from course_utils.runtime import backend

# %% [markdown]
# ### Practice: reading a symptom
#
# A colleague's data-parallel program all-reduces and averages the gradients correctly, but
# calls `opt.step()` *before* the all-reduce loop instead of after it. Every rank starts from
# the same weights. Set `practice_diagnosis` to one of:
#
# * `"drift"`: each rank steps with its own gradient, so the replicas' weights drift apart, and
#   the averaged gradients (computed after the step) are thrown away by `zero_grad`;
# * `"same"`: nothing changes, since the gradients are averaged in the end;
# * `"twice"`: every rank applies the mean gradient twice.

# %% [answer q4_practice]
### BEGIN SOLUTION
practice_diagnosis = "drift"
### END SOLUTION

# %%
checks.check_choice("practice_diagnosis", practice_diagnosis, "drift", ["drift", "same", "twice"],
                    mistakes={
    "same": "the optimizer reads .grad when step() is called: before the all-reduce, that is "
            "each rank's own gradient, and the average made afterwards is cleared by zero_grad "
            "before any step uses it.",
    "twice": "step() runs once per iteration, with whatever .grad holds at that moment: the "
             "rank's own gradient, not the mean."})
print("practice: right")

# %% [markdown]
# ### Q4. Data parallelism by hand (3 points)

# %%
pitfalls.show("dp_by_hand")
_ = pitfalls.demo("dp_by_hand")


# %% [markdown]
# Set `q4_diagnosis` to what is wrong with `dp_by_hand`:
#
# * `"sum"`: `dist.all_reduce` sums by default, so every rank steps with D times the mean
#   gradient;
# * `"avg-default"`: gloo's all-reduce averages by default, so the gradients are averaged twice;
# * `"lr"`: the learning rate is too large for D replicas;
# * `"loss-mean"`: each rank's loss must be a sum over its tokens, not a mean.
#
# Then write `fixed_dp_by_hand(rank, world_size, job)`.

# %% [answer q4_diagnosis]
### BEGIN SOLUTION
q4_diagnosis = "sum"
### END SOLUTION

# %% [test q4_diagnosis_test points=1]
checks.check_choice("q4_diagnosis", q4_diagnosis, None, ["sum", "avg-default", "lr", "loss-mean"],
                    mistakes={
    "avg-default": "The default op of dist.all_reduce is ReduceOp.SUM, on gloo and NCCL alike."})
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q4_diagnosis", q4_diagnosis)
### END HIDDEN TESTS
None

# %% [answer q4_fix]
def fixed_dp_by_hand(rank, world_size, job):
    """dp_by_hand, fixed: every rank steps with one process's gradient."""
    ### BEGIN SOLUTION
    model = job.model()
    opt = job.optimizer(model)
    for step in range(job.steps):
        x, y, _ = job.shard(job.batch(step), rank)
        job.loss(model, x, y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        opt.step()
        opt.zero_grad()
    return job.result(model)
    ### END SOLUTION

# %% [test q4_fix_test points=2]
_job = pitfalls.JOBS["dp_by_hand"]
pitfalls.check("dp_by_hand", _job, pitfalls.run(fixed_dp_by_hand, _job),
               label="practice job")
print("Q4: every rank ends with one process's weights")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import hidden_cases, submit

for _number, _case in enumerate(hidden_cases("q4_fix_test"), 1):   # drawn per submission
    submit(f"hidden case {_number}", pitfalls.run(fixed_dp_by_hand, pitfalls.Job(**_case)))
### END HIDDEN TESTS
None

# %% [markdown]
# ### Q5. Sequences of different lengths (3 points)
#
# The data are padded sequences: each ends after 1 to T real tokens (`mask`), so the ranks
# hold different numbers of real tokens. One process takes the mean over every real token of
# the global batch. (You wrote the weighted average of a2 Q5; here it hides in a training
# loop.)

# %%
pitfalls.show("padded_sequences")
_ = pitfalls.demo("padded_sequences")

# %% [markdown]
# This program all-reduces with `op=dist.ReduceOp.AVG`. Is AVG what you think it is? The cell
# below all-reduces, on 3 gloo ranks, the same random float32 vectors with AVG and with SUM
# (then divides by 3), a float16 value of 40,000 on every rank (float16's largest value is
# 65,504) with AVG, and an int64 tensor with AVG. What it shows is gloo's AVG, with torch 2.13:
# the sum divided by D, equal to it bit for bit in float32; it adds first, so float16 values
# whose mean fits but whose sum does not come back `inf`; and integer tensors are refused.
# NCCL's AVG is another operation: torch hands `ReduceOp.AVG` to NCCL's `ncclAvg`
# (`torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp`), which multiplies each floating-point
# input by 1/D *before* adding (so the same float16 values come back near 40,000) and sums
# integers, then divides (NCCL's `src/enqueue.cc`, `case ncclAvg`). Where AVG divides, and which
# types it takes, depend on the backend; dividing by D yourself says the same thing on both.

# %%
pitfalls.gloo_avg(world_size=3)

# %% [markdown]
# Set `q5_diagnosis`:
#
# * `"mean-of-means"`: each rank's loss is the mean over its own real tokens, and averaging the
#   ranks' gradients weights a token on a rank with few real tokens more than one on a rank
#   with many;
# * `"padding"`: the padded positions are counted in the loss;
# * `"avg-unsupported"`: gloo has no AVG, so the gradients are summed;
# * `"sum-op"`: only the op is wrong: SUM instead of AVG gives one process's gradient;
# * `"rows"`: the ranks get different numbers of sequences.
#
# Then write `fixed_padded_sequences(rank, world_size, job)`: the loss over the global batch's
# real tokens (hint: the number of real tokens is a tensor you can all-reduce too).

# %% [answer q5_diagnosis]
### BEGIN SOLUTION
q5_diagnosis = "mean-of-means"
### END SOLUTION

# %% [test q5_diagnosis_test points=1]
checks.check_choice("q5_diagnosis", q5_diagnosis, None,
                    ["mean-of-means", "padding", "avg-unsupported", "sum-op", "rows"], mistakes={
    "padding": "Each position's loss is multiplied by the mask, and only real tokens are "
               "counted: padding adds nothing."})
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q5_diagnosis", q5_diagnosis)
### END HIDDEN TESTS
None

# %% [answer q5_fix]
def fixed_padded_sequences(rank, world_size, job):
    """padded_sequences, fixed: one process's mean over the global batch."""
    ### BEGIN SOLUTION
    model = job.model()
    opt = job.optimizer(model)
    for step in range(job.steps):
        x, y, mask = job.shard(job.batch(step), rank)
        total = mask.sum()
        dist.all_reduce(total)                      # real tokens of the whole global batch
        loss = (job.token_losses(model, x, y) * mask).sum() / total
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)                 # the ranks' shares add up to the mean
        opt.step()
        opt.zero_grad()
    return job.result(model)
    ### END SOLUTION

# %% [test q5_fix_test points=2]
_job = pitfalls.JOBS["padded_sequences"]
pitfalls.check("padded_sequences", _job, pitfalls.run(fixed_padded_sequences, _job),
               label="practice job")
print("Q5: every rank ends with one process's weights")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import hidden_cases, submit

for _number, _case in enumerate(hidden_cases("q5_fix_test"), 1):   # drawn per submission
    submit(f"hidden case {_number}", pitfalls.run(fixed_padded_sequences, pitfalls.Job(**_case)))
### END HIDDEN TESTS
None

# %% [markdown]
# ### Q6. Gradient accumulation under DDP (3 points)
#
# DDP (`torch.nn.parallel.DistributedDataParallel`) all-reduces the gradients during backward.
# `job.ddp(model)` wraps a model in DDP with a hook that counts DDP's all-reduces (this model
# is small enough for one bucket, so one all-reduce per synchronised backward), and
# `job.all_reduces(model)` reads the count.

# %%
pitfalls.show("accumulation")
_ = pitfalls.demo("accumulation")

# %% [markdown]
# Set `q6_diagnosis`:
#
# * `"both"`: the microbatches' losses are not divided by their number, so the step is that
#   many times too large, and DDP all-reduces after every microbatch's backward instead of
#   once per step;
# * `"scale"`: only the scale: the step is too large;
# * `"sync"`: only the communication: an all-reduce per microbatch;
# * `"ddp-avg"`: DDP averages over the ranks, and over the microbatches too, so nothing is
#   wrong but the learning rate.
#
# Then write `fixed_accumulation(rank, world_size, job)`: one process's weights, and one
# all-reduce per step (DDP's `model.no_sync()` context skips the all-reduce of the backward
# passes run inside it; the gradients keep adding up in `.grad`).

# %% [answer q6_diagnosis]
### BEGIN SOLUTION
q6_diagnosis = "both"
### END SOLUTION

# %% [test q6_diagnosis_test points=1]
checks.check_choice("q6_diagnosis", q6_diagnosis, None, ["both", "scale", "sync", "ddp-avg"],
                    mistakes={
    "ddp-avg": "DDP divides by the number of ranks only; the microbatches' gradients add up in "
               ".grad, as in one process."})
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q6_diagnosis", q6_diagnosis)
### END HIDDEN TESTS
None

# %% [answer q6_fix]
def fixed_accumulation(rank, world_size, job):
    """accumulation, fixed: one process's weights, one all-reduce per step."""
    ### BEGIN SOLUTION
    import contextlib

    model = job.ddp(job.model())
    opt = job.optimizer(model)
    all_reduces = []
    k = job.accumulation
    for step in range(job.steps):
        x, y, _ = job.shard(job.batch(step), rank)
        before = job.all_reduces(model)
        for i, (x_mb, y_mb) in enumerate(zip(x.chunk(k), y.chunk(k))):
            sync = contextlib.nullcontext() if i == k - 1 else model.no_sync()
            with sync:                              # all-reduce in the last backward only
                (job.loss(model, x_mb, y_mb) / k).backward()
        opt.step()
        opt.zero_grad()
        all_reduces.append(job.all_reduces(model) - before)
    return job.result(model, all_reduces=all_reduces)
    ### END SOLUTION

# %% [test q6_fix_test points=2]
_job = pitfalls.JOBS["accumulation"]
pitfalls.check("accumulation", _job, pitfalls.run(fixed_accumulation, _job),
               label="practice job")
print("Q6: one process's weights, one all-reduce per step")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import hidden_cases, submit

for _number, _case in enumerate(hidden_cases("q6_fix_test"), 1):   # drawn per submission
    submit(f"hidden case {_number}", pitfalls.run(fixed_accumulation, pitfalls.Job(**_case)))
### END HIDDEN TESTS
None

# %% [markdown]
# ### Q7. Epochs through a DistributedSampler (3 points)
#
# `job.dataset()` holds `2 * rows * world_size` sequences as `(index, x, y)` rows (two steps
# per epoch); the program trains `job.epochs` epochs and records the indices each rank read at
# each step (`seen`).

# %%
pitfalls.show("epochs")
_ = pitfalls.demo("epochs")

# %% [markdown]
# Set `q7_diagnosis`:
#
# * `"set-epoch"`: the sampler shuffles with `seed + epoch`, and its epoch stays 0 unless it is
#   told: every epoch reads the same order;
# * `"rank-seed"`: the ranks shuffle with the same seed; each needs a seed of its own
#   (`seed + rank`);
# * `"no-shuffle"`: `DistributedSampler` does not shuffle at all;
# * `"loader-shuffle"`: `shuffle=True` must be passed to the `DataLoader` as well.
#
# Then write `fixed_epochs(rank, world_size, job)`.

# %% [answer q7_diagnosis]
### BEGIN SOLUTION
q7_diagnosis = "set-epoch"
### END SOLUTION

# %% [test q7_diagnosis_test points=1]
checks.check_choice("q7_diagnosis", q7_diagnosis, None,
                    ["set-epoch", "rank-seed", "no-shuffle", "loader-shuffle"], mistakes={
    "no-shuffle": "Look at the indices of one epoch: they are not 0, 1, 2, ...: the sampler "
                  "does shuffle."})
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q7_diagnosis", q7_diagnosis)
### END HIDDEN TESTS
None

# %% [answer q7_fix]
def fixed_epochs(rank, world_size, job):
    """The epochs program, fixed."""
    ### BEGIN SOLUTION
    from torch.utils.data import DataLoader, DistributedSampler

    data = job.dataset()
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=job.seed)
    loader = DataLoader(data, batch_size=job.rows, sampler=sampler)
    model = job.model()
    opt = job.optimizer(model)
    seen = []
    for epoch in range(job.epochs):
        sampler.set_epoch(epoch)                    # before the epoch's rows are drawn
        for index, x, y in loader:
            seen.append(index.tolist())
            x, y = backend.to_device(x), backend.to_device(y)
            job.loss(model, x, y).backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world_size
            opt.step()
            opt.zero_grad()
    return job.result(model, seen=seen)
    ### END SOLUTION

# %% [test q7_fix_test points=2]
_job = pitfalls.JOBS["epochs"]
pitfalls.check("epochs", _job, pitfalls.run(fixed_epochs, _job),
               label="practice job")
print("Q7: a new order every epoch, one process's weights")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import hidden_cases, submit

for _number, _case in enumerate(hidden_cases("q7_fix_test"), 1):   # drawn per submission
    submit(f"hidden case {_number}", pitfalls.run(fixed_epochs, pitfalls.Job(**_case)))
### END HIDDEN TESTS
None

# %% [markdown]
# ### Q8. A run that hangs (3 points)
#
# This one never finishes: the demonstration stops it after 3 seconds and shows where each
# rank was waiting.

# %%
pitfalls.show("loss_logging")
_ = pitfalls.demo("loss_logging")

# %% [markdown]
# Set `q8_diagnosis`:
#
# * `"order"`: rank 0 is blocked in the metrics group's all-reduce, waiting for the others, who
#   are blocked in the gradients' all-reduce, waiting for rank 0. On each group, every rank
#   issues the same calls in the same order; what differs is how the two groups' blocking
#   calls interleave (rank 0 enters the metrics group first, the others the default group),
#   and a blocking collective returns only when its whole group has joined it;
# * `"slow"`: gloo is slow on a CPU; a longer timeout would let it finish;
# * `"group"`: a second group over the same ranks is not allowed;
# * `"barrier"`: the ranks need a `dist.barrier()` before the gradient all-reduce.
#
# Then write `fixed_loss_logging(rank, world_size, job)`: every rank logs the mean loss of
# each step, and the run ends.

# %% [answer q8_diagnosis]
### BEGIN SOLUTION
q8_diagnosis = "order"
### END SOLUTION

# %% [test q8_diagnosis_test points=1]
checks.check_choice("q8_diagnosis", q8_diagnosis, None, ["order", "slow", "group", "barrier"],
                    mistakes={
    "slow": "Look at the stacks: both ranks are blocked in an all-reduce, and neither uses any "
            "CPU. Waiting longer changes nothing."})
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("q8_diagnosis", q8_diagnosis)
### END HIDDEN TESTS
None

# %% [answer q8_fix]
def fixed_loss_logging(rank, world_size, job):
    """loss_logging, fixed: the run ends."""
    ### BEGIN SOLUTION
    metrics = backend.new_group(list(range(world_size)))
    model = job.model()
    opt = job.optimizer(model)
    logged = []
    for step in range(job.steps):
        x, y, _ = job.shard(job.batch(step), rank)
        loss = job.loss(model, x, y)
        loss.backward()
        logged.append(pitfalls.log_mean(loss, metrics))   # at the same place on every rank
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        opt.step()
        opt.zero_grad()
    return job.result(model, logged=logged)
    ### END SOLUTION

# %% [test q8_fix_test points=2]
_job = pitfalls.JOBS["loss_logging"]
pitfalls.check("loss_logging", _job, pitfalls.run(fixed_loss_logging, _job),
               label="practice job")
print("Q8: the run ends, and every rank logged the global batch's mean loss")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import hidden_cases, submit

for _number, _case in enumerate(hidden_cases("q8_fix_test"), 1):   # drawn per submission
    submit(f"hidden case {_number}", pitfalls.run(fixed_loss_logging, pitfalls.Job(**_case)))
### END HIDDEN TESTS
None

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

# %% [markdown]
# # Assignment 3: ZeRO and FSDP
#
# Lecture 3 built ZeRO-1, -2 and -3 from collectives and measured what each rank keeps. Here
# you do the memory accounting yourself, pick a stage for a device, and write the step at the
# heart of ZeRO: a rank's optimizer update from a reduce-scattered gradient, which the tests
# run on real gloo ranks.
#
# **Layout** (as in the lesson): mixed-precision Adam at 16 bytes per parameter: bf16 weights
# (2), bf16 gradients (2), fp32 master weights (4), fp32 Adam moments (8). `D` is the number of
# data-parallel ranks. **Units**: 1 GB = 10^9 bytes, 1 GiB = 2^30 bytes. "Persistent" means the
# state kept between steps, without activations or temporary buffers.
#
# Answer in the cells marked `YOUR CODE HERE`, then run the test cell below each one.
#
# **What the tests tell you while you practise.** Before each numeric or choice question there
# is a *Practice (not graded)* twin: the same reasoning with other numbers, and the cell after
# it checks your practice answer fully (the right value, or what a known wrong value means). For
# the functions (Q2, Q4) the visible test runs your code on visible cases and checks the values,
# naming the usual mistakes. For the graded numbers and choices (Q1, Q3, Q5) the visible test
# checks the type and rejects known wrong answers (another ZeRO stage's figure, for example),
# without saying what the right one is: passing it does not mean the answer is right. **Grading
# adds** the hidden tests: your functions on other cases (other N, D, seeds, 3 ranks) and the
# graded values themselves.
#
# **Your own numbers.** Q1, Q3 and Q5 use numbers drawn for you (the table the next cell
# shows, `G`): your classmates have other ones, so their answers are wrong for you. They come
# from your identity (your JupyterHub user, the name `make lab` asked for once, or, when your
# instructor grades, your student id, whatever this notebook says). Do not edit that cell.
#
# **Work the answers out yourself.** Some `course_utils` helpers compute a graded answer
# outright (here, for example, `memory.zero_state_bytes`). An answer that uses one is flagged
# for your instructor: the questions ask for the reasoning those helpers do.

# %%
import torch
import torch.distributed as dist

from course_utils.assess import (a3_zero as zero, checks,  # the harness: zero.run_shard_step
                                 variants)

G = variants.givens("a3_zero", on=True)  # your numbers (do not edit this cell)
G

# %% [markdown]
# *Practice (not graded)*: a four-rank job trains a 3B-parameter model with ZeRO-2. A colleague
# says its persistent state is 48/4 = 12 GB per GPU. Set `practice_zero2_gb` to the correct
# persistent state per GPU, in GB.

# %% [answer q1_practice]
### BEGIN SOLUTION
practice_zero2_gb = (2 + 2 / 4 + 12 / 4) * 3e9 / 1e9
### END SOLUTION

# %%
checks.check_number("practice_zero2_gb", practice_zero2_gb, 16.5, unit="GB", mistakes=[
    (12.0, "48/4 shares everything among the 4 ranks, which is ZeRO-3; under ZeRO-2 every "
           "rank still holds the whole bf16 weight buffer (2 bytes x 3B = 6 GB)"),
    (21.0, "21 GB is ZeRO-1, where each rank still keeps the full bf16 gradients; ZeRO-2 "
           "splits those among the ranks as well"),
    (48.0, "48 GB is plain data parallelism, every rank holding all 16 bytes per parameter"),
    (15.0, "the gradients are missing: ZeRO-2 keeps a quarter of the bf16 gradients on each "
           "rank (1.5 GB)"),
    (10.5, "10.5 GB is just the split part (gradients and optimizer state); add the bf16 "
           "weights every rank keeps whole (6 GB)"),
    (16.5e9 / 2**30, "a GiB figure (bytes / 2^30); GB here means bytes / 10^9"),
    (16.5e9, "a count of bytes; give it in GB (divide by 10^9)"),
])

# %% [markdown]
# ## Q1. The lesson's check-yourself question, on another job (2 points)
#
# Lecture 3 worked out the lesson's question (7B, eight ranks). Now a job of $D$ ranks trains a
# model of $N$ parameters with ZeRO-2, where `(N, D) = G.q1` (yours are in the table at the
# top). A colleague says its persistent state is $16N/D$ bytes per GPU. Set `zero2_gb` to the
# correct persistent state per GPU, in GB.

# %% [answer q1]
### BEGIN SOLUTION
n, d = G.q1
zero2_gb = (2 + 14 / d) * n / 1e9
### END SOLUTION

# %% [test q1_test points=2]
# Checks the type and rejects known wrong answers; the value itself is checked when graded.
_n, _d = G.q1
checks.check_number("zero2_gb", zero2_gb, unit="GB", variant=G.key("q1"), mistakes=[
    (16 * _n / _d / 1e9, "that is ZeRO-3: 16N/D shares every byte among the ranks, but ZeRO-2 "
                         "does not shard the bf16 weights, so each rank keeps all of them"),
    ((4 + 12 / _d) * _n / 1e9, "that is the ZeRO-1 figure, where the bf16 gradients are still "
                               "replicated on every rank; ZeRO-2 shards them too"),
    (16 * _n / 1e9, "that is replicated data parallelism (16 bytes per parameter on every "
                    "rank, nothing sharded)"),
])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("zero2_gb", zero2_gb)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q2. The formulas for any N and D (3 points)
#
# Write `zero_gb(n_params, dp, stage)`: the persistent GB per rank for `n_params` parameters in
# the 16-byte layout on `dp` ranks, for `stage` 0 (replicated data parallelism), 1, 2 or 3.
# Assume ideal sharding (`n_params / dp` per rank, no padding). Work the formulas out from what
# each stage shards; do not call `course_utils.memory` (grading flags it).

# %% [answer q2]
def zero_gb(n_params, dp, stage):
    """Persistent GB per rank (16-byte layout) for n_params parameters, dp ranks, ZeRO stage 0-3."""
    ### BEGIN SOLUTION
    weights = 2 / (dp if stage >= 3 else 1)
    grads = 2 / (dp if stage >= 2 else 1)
    optimizer = 12 / (dp if stage >= 1 else 1)
    return (weights + grads + optimizer) * n_params / 1e9
    ### END SOLUTION

# %% [test q2_test points=3]
# Two visible cases (grading uses other N and D), each stage's value checked.
_visible = {(10e9, 4): [160.0, 70.0, 55.0, 40.0], (2e9, 5): [32.0, 12.8, 9.6, 6.4]}
for (_n, _dp), _per_stage in _visible.items():
    for _stage in range(4):
        _name = f"zero_gb({_n:g}, {_dp}, {_stage})"
        _got = zero_gb(_n, _dp, _stage)
        _want = _per_stage[_stage]
        _no_master = _want - 4 * _n / 1e9 / (_dp if _stage >= 1 else 1)
        checks.check_number(_name, _got, unit="GB", mistakes=[
            *[(_per_stage[_s], f"that is what ZeRO stage {_s} keeps per rank, not stage {_stage}")
              for _s in range(4) if _s != _stage],
            (_want * 1e9 / 2**30, "a GiB figure (bytes / 2^30); return GB, bytes / 10^9"),
            (_want * 1e9, "a count of bytes; return GB (divide by 10^9)"),
            (_no_master, "the fp32 master weights (4 bytes per parameter) are missing: the "
                         "optimizer part is 12 bytes, master copy plus the two Adam moments"),
        ])
        assert abs(checks.as_number(_name, _got) - _want) <= 1e-6 * _want, (
            f"{_name} = {_got:g} GB is not right; for this visible case it should be {_want:g} GB")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import hidden_cases, submit

for _case, (_n, _dp) in enumerate(hidden_cases("q2_test"), 1):  # drawn per submission
    for _stage in range(4):
        submit(f"zero_gb on hidden case {_case}, stage {_stage}", zero_gb(_n, _dp, _stage))
### END HIDDEN TESTS
None

# %% [markdown]
# *Practice (not graded)*: an 8B-parameter model trains on 8 devices of 48 GB each, and 6 GB
# per device must stay free for activations and temporary buffers. Set
# `practice_smallest_stage` to the smallest ZeRO stage (an int: 0, 1, 2 or 3) whose persistent
# state fits in what is left.

# %% [answer q3_practice]
### BEGIN SOLUTION
practice_smallest_stage = min(s for s in range(4) if zero_gb(8e9, 8, s) <= 48 - 6)
### END SOLUTION

# %%
checks.check_choice("practice_smallest_stage", practice_smallest_stage, 2, [0, 1, 2, 3], mistakes={
    1: "ZeRO-1 needs (4 + 12/8) x 8 = 44 GB: that fits in 48 GB but not in the 42 GB left "
       "once the 6 GB reserve is kept (forgot the reserve, or compared GiB with GB?)",
    3: "ZeRO-3 fits (16 GB), but a lower stage fits as well and communicates less: the "
       "question asks for the smallest stage that fits",
    0: "replicated data parallelism needs 16 x 8 = 128 GB on every device",
})

# %% [markdown]
# ## Q3. The smallest stage that fits (2 points)
#
# A model of $N$ parameters trains on $D$ devices of $M$ GB each (1 GB = 10^9 bytes), and you
# must keep $R$ GB per device free for activations and temporary buffers, where
# `(N, D, M, R) = G.q3` (yours are in the table at the top). Set `smallest_stage` to the
# smallest ZeRO stage (an int: 0, 1, 2 or 3) whose persistent state fits in what is left.
# Stages 0, 1 and 2 send the same bytes per step and ZeRO-3 sends 1.5 times as much (Module 3):
# staying below stage 3 when a lower stage fits saves traffic, while among stages 0 to 2 the
# bytes sent do not decide.

# %% [answer q3]
### BEGIN SOLUTION
n, d, device_gb, reserve_gb = G.q3
smallest_stage = min(s for s in range(4) if zero_gb(n, d, s) <= device_gb - reserve_gb)
### END SOLUTION

# %% [test q3_test points=2]
assert type(smallest_stage) is int, f"smallest_stage should be an int (0-3), got {type(smallest_stage).__name__}"
# A stage, 0 to 3; the value itself is checked when graded. (No stage is rejected here: a check
# that rejected the stages that do not fit would accept exactly the answer and those above it,
# and the smallest it accepted would be the answer. The practice question above names each
# mistake.)
checks.check_choice("smallest_stage", smallest_stage, None, [0, 1, 2, 3])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("smallest_stage", smallest_stage)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q4. One rank's ZeRO update, on real ranks (4 points)
#
# Write `sharded_adam_step(local_grad, master, exp_avg, exp_avg_sq, step, lr, betas, eps, dp_group)`,
# run by every rank of the data-parallel group after its backward pass:
#
# * `local_grad`: shape `(P,)` fp32, this rank's gradient of the whole flat parameter buffer
#   (from its own micro-batch). `P = D * S` (already padded).
# * `master`, `exp_avg`, `exp_avg_sq`: shape `(S,)` fp32, this rank's slice of the fp32 master
#   weights and of Adam's two moments: elements `[rank * S, (rank + 1) * S)`. **Update them in
#   place.**
# * `step`: the number of this update, 1 for the first (for Adam's bias correction).
# * `lr`, `betas = (beta1, beta2)`, `eps`: Adam's hyperparameters, as in `torch.optim.Adam`.
# * `dp_group`: the process group (`None` means all ranks); pass it to your collective.
#
# The gradient to use is the **mean over ranks** of `local_grad`, but this rank needs only its
# own slice of it. Then apply Adam (no weight decay) to the slice:
#
# ```
# m = beta1 * m + (1 - beta1) * g
# v = beta2 * v + (1 - beta2) * g * g
# master -= lr * (m / (1 - beta1**step)) / (sqrt(v / (1 - beta2**step)) + eps)
# ```
#
# Return the new weight slice in bf16 (shape `(S,)`), ready to be all-gathered. The visible
# test runs your function on one small case on 2 real gloo ranks for two steps and compares
# every slice with `torch.optim.Adam` updating the whole buffer in one process, naming the usual
# mistakes; grading runs other cases on 2 and 3 ranks.

# %% [answer q4]
def sharded_adam_step(local_grad, master, exp_avg, exp_avg_sq, step, lr, betas, eps,
                      dp_group=None):
    """Adam on this rank's (S,) slice from the reduce-scattered mean of the (P,) local gradients."""
    ### BEGIN SOLUTION
    world = dist.get_world_size(dp_group)
    grad = torch.empty_like(master)                                       # (S,)
    dist.reduce_scatter_single(grad, local_grad, op=dist.ReduceOp.SUM, group=dp_group)
    grad /= world                                                         # mean over ranks
    beta1, beta2 = betas
    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = (exp_avg_sq / (1 - beta2 ** step)).sqrt_().add_(eps)
    master.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1 ** step))
    return master.to(torch.bfloat16)                                      # (S,) bf16
    ### END SOLUTION

# %% [test q4_test points=4]
# A visible case (grading runs others): D = 2 ranks, S = 3, two steps, lr = 1e-2, eps = 0.1
# (with a large eps Adam depends on the gradient's scale, so a missing 1/D shows).
_gen = torch.Generator().manual_seed(0)
_full = torch.randn(6, generator=_gen)                  # (P,) = (D * S,)
_grads = torch.randn(2, 2, 6, generator=_gen)           # (steps, D, P)
_results = zero.run_shard_step(sharded_adam_step, _full, _grads, 1e-2, (0.9, 0.999), 0.1,
                               timeout_s=50)

_w = _full.clone().requires_grad_(True)                 # torch.optim.Adam on the whole buffer
_adam = torch.optim.Adam([_w], lr=1e-2, betas=(0.9, 0.999), eps=0.1)
for _g in _grads.mean(1):                               # the mean over the 2 ranks, per step
    _w.grad = _g.clone()
    _adam.step()
_want, _want_m = _w.detach(), _adam.state[_w]["exp_avg"]


def _whole_buffer(grad_per_step, bias_correction=True):
    """The (P,) weights one process gets from these gradients (to recognise mistakes)."""
    _p, _m, _v = _full.clone(), torch.zeros(6), torch.zeros(6)
    for _t, _g in enumerate(grad_per_step, start=1):
        _m = 0.9 * _m + 0.1 * _g
        _v = 0.999 * _v + 0.001 * _g * _g
        _c1, _c2 = (1 - 0.9**_t, 1 - 0.999**_t) if bias_correction else (1.0, 1.0)
        _p = _p - 1e-2 * (_m / _c1) / ((_v / _c2).sqrt() + 0.1)
    return _p


for _rank, _r in enumerate(_results):
    _mine = slice(3 * _rank, 3 * _rank + 3)
    _out, _master = _r["returned"][-1], _r["master"]
    assert isinstance(_out, torch.Tensor), f"rank {_rank} returned {type(_out).__name__}, not a tensor"
    assert tuple(_out.shape) == (3,), f"rank {_rank} returned shape {tuple(_out.shape)}; expected its slice, (S,) = (3,)"
    assert _out.dtype == torch.bfloat16, f"rank {_rank} returned {_out.dtype}; the weight slice is bf16"
    assert tuple(_master.shape) == (3,), f"rank {_rank}: master changed shape to {tuple(_master.shape)}"
    assert _r["calls"], ("no collective was called: every rank has only its own micro-batch's "
                         "gradient, so the ranks must combine theirs (a reduce-scatter)")
    if not torch.allclose(_master, _want[_mine], rtol=1e-5, atol=1e-6):
        for _wrong, _why in [
                (_whole_buffer(_grads.sum(1)), "the ranks' gradients were summed, not "
                 "averaged: divide the reduce-scattered sum by D"),
                (_whole_buffer(_grads[:, _rank]), "this rank stepped with its own local_grad "
                 "only: combine all ranks' gradients with a reduce-scatter first"),
                (_whole_buffer(_grads.mean(1), bias_correction=False), "no bias correction: "
                 "Adam divides m by (1 - beta1**step) and v by (1 - beta2**step)"),
                (_full, "master is unchanged: update the slice in place (master.addcdiv_, "
                 "master.sub_ or master[:] = ...)")]:
            assert not torch.allclose(_master, _wrong[_mine], rtol=1e-5, atol=1e-6), (
                f"rank {_rank}: {_why}")
        torch.testing.assert_close(_master, _want[_mine], rtol=1e-5, atol=1e-6, msg=lambda m: (
            f"rank {_rank}: master differs from torch.optim.Adam on the whole buffer. {m}"))
    torch.testing.assert_close(_r["exp_avg"], _want_m[_mine], rtol=1e-5, atol=1e-6, msg=lambda m: (
        f"rank {_rank}: exp_avg (the first moment) should be updated in place to Adam's. {m}"))
    torch.testing.assert_close(_out, _want[_mine].to(torch.bfloat16), rtol=1e-5, atol=1e-6,
                               msg=lambda m: f"rank {_rank}: return the new master slice in bf16. {m}")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import hidden_cases, submit

def _submit_shard_step(number, seed, dp, s, n_steps, lr, betas, eps):
    """Run the answer on real ranks with seeded inputs; hand every rank's state to the grader."""
    gen = torch.Generator().manual_seed(seed)
    full = torch.randn(dp * s, generator=gen)                      # (P,)
    grads = torch.randn(n_steps, dp, dp * s, generator=gen)        # (steps, D, P)
    try:
        results = zero.run_shard_step(sharded_adam_step, full, grads, lr, tuple(betas), eps,
                                      timeout_s=50)
    except Exception as e:  # noqa: BLE001 - report the rank's error as feedback
        last = str(e).strip().splitlines()[0]
        raise AssertionError(f"your function failed on real ranks (hidden case {number}, "
                             f"D = {dp}): {last}") from None
    case = f"hidden case {number}"
    submit(f"{case}: collectives called", sorted({c for r in results for c in r["calls"]}))
    for rank, r in enumerate(results):
        submit(f"{case}, rank {rank}: master", r["master"])
        submit(f"{case}, rank {rank}: exp_avg", r["exp_avg"])
        submit(f"{case}, rank {rank}: returned", r["returned"][-1])


for _number, _case in enumerate(hidden_cases("q4_test"), 1):  # drawn per submission
    _submit_shard_step(_number, *_case)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q5. What sharding does not shrink (2 points)
#
# *Practice (not graded)*: a 3B-parameter model, bf16 gradients (2 bytes each), D = 4 ranks.
#
# * `practice_activation_factor`: the job switches from replicated data parallelism to ZeRO-3,
#   keeping the same micro-batch on every rank. By what factor is each rank's activation memory
#   (the tensors saved for backward) multiplied? (A float: 0.5 would mean halved.)
# * `practice_reduce_scatters`: the ZeRO-2 job accumulates gradients over 8 micro-batches per
#   optimizer step. How many times per step must each layer's gradient be reduce-scattered so
#   that no rank ever holds more than one layer's full gradient?
# * `practice_deferred_grad_gb`: if instead the job defers the reduce-scatter to the last
#   micro-batch, how many GB of gradients does each rank hold between micro-batches?

# %% [answer q5_practice]
### BEGIN SOLUTION
practice_activation_factor = 1.0
practice_reduce_scatters = 8
practice_deferred_grad_gb = 3e9 * 2 / 1e9
### END SOLUTION

# %%
checks.check_number("practice_activation_factor", practice_activation_factor, 1.0, mistakes=[
    (1 / 4, "ZeRO shards the persistent state (weights, gradients, optimizer); each rank "
            "still runs the whole model on its own micro-batch and saves all of its "
            "activations"),
    (4.0, "nothing is replicated more under ZeRO-3: each rank saves its own micro-batch's "
          "activations, as before")])
checks.check_number("practice_reduce_scatters", practice_reduce_scatters, 8, mistakes=[
    (1, "one reduce-scatter per step means the gradients of the first 7 micro-batches "
        "are summed unsharded: every rank holds the full gradient, as under ZeRO-1"),
    (4, "the count does not depend on D: it is one reduce-scatter per micro-batch")])
checks.check_number("practice_deferred_grad_gb", practice_deferred_grad_gb, 6.0, unit="GB",
                    mistakes=[
    (1.5, "that is the gradient slice (2N/D); deferring the reduce-scatter keeps the whole "
          "bf16 gradient, 2N bytes, on every rank"),
    (12.0, "the gradients are bf16 here: 2 bytes per parameter"),
    (6e9, "give GB (10^9 bytes)")])
print("practice Q5: all right")

# %% [markdown]
# Now the graded question: a model of $N$ parameters, bf16 gradients, $D$ ranks, where
# `(N, D, m) = G.q5` (yours are in the table at the top).
#
# * `activation_factor`: the job switches from ZeRO-1 to ZeRO-3 with the same micro-batch on
#   every rank. By what factor is each rank's activation memory multiplied?
# * `reduce_scatters_per_step`: the ZeRO-2 job accumulates over $m$ micro-batches per optimizer
#   step. How many times per step is each layer's gradient reduce-scattered if no rank may ever
#   hold more than one layer's full gradient?
# * `deferred_grad_gb`: GB of gradients each rank holds between micro-batches if the job
#   defers the reduce-scatter to the last micro-batch.

# %% [answer q5]
### BEGIN SOLUTION
n, d, m = G.q5
activation_factor = 1.0
reduce_scatters_per_step = m
deferred_grad_gb = n * 2 / 1e9
### END SOLUTION

# %% [test q5_test points=2]
# Checks the types and rejects known wrong answers; the values are checked when graded.
for _name in ("activation_factor", "reduce_scatters_per_step", "deferred_grad_gb"):
    checks.check_number(_name, globals()[_name], variant=G.key("q5"))
assert type(reduce_scatters_per_step) is int, "reduce_scatters_per_step should be an int"
_n, _d, _m = G.q5
checks.check_number("activation_factor", activation_factor, variant=G.key("q5"), mistakes=[
    (1 / _d, "ZeRO-3 shards the persistent state, not the activations: each rank still runs "
             "the whole model on its own micro-batch")])
checks.check_number("deferred_grad_gb", deferred_grad_gb, unit="GB", variant=G.key("q5"),
                    mistakes=[
    (_n * 2 / _d / 1e9, "that is the ZeRO-2 gradient slice, 2N/D; deferring the "
                        "reduce-scatter keeps the full gradient until the last micro-batch")])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("activation_factor", activation_factor)
submit("reduce_scatters_per_step", reduce_scatters_per_step)
submit("deferred_grad_gb", deferred_grad_gb)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q6. Why did the ZeRO-3 job run out of memory? (2 points, graded by hand)
#
# A colleague computes 16N/D = 14 GB of persistent state per rank for a ZeRO-3 job and is
# surprised that it runs out of memory on 16 GB devices, even more so after switching on
# prefetching of the next layer's parameters. In a few sentences: what else occupies memory
# during a ZeRO-3 step (use what the lecture's timeline showed), why does prefetching make it
# worse, and what would you change or measure first?

# %% [manual q6_explain points=2]
# ### BEGIN SOLUTION
# 16N/D counts only the persistent slices. During the step a ZeRO-3 rank must hold each layer
# gathered in full while it computes with it (forward, and again in backward), and in backward
# also that layer's full-size gradient until it is reduce-scattered; on top come the
# activations saved for backward, communication buffers and allocator fragmentation. So the
# peak is roughly slices + the largest gathered unit (+ its gradient) + activations.
# Prefetching starts gathering the next layer before the current one is released, so two
# gathered layers are alive at once: it trades memory for overlap, and only helps if there is
# both independent compute to hide the transfer behind and memory headroom. First I would turn
# prefetch off (or limit it), wrap smaller units so that one gathered unit is smaller, reduce
# the micro-batch or use activation checkpointing, and measure the real peak with the memory
# profiler (e.g. torch.cuda.max_memory_allocated / FSDP's memory tracker) rather than the formula.
#
# **Rubric** (2 points):
# * 1 point: names what else is in memory during a ZeRO-3 step: each layer (unit) gathered in
#   full while it computes, in forward and again in backward, its full-size gradient until it is
#   reduce-scattered, and the activations saved for backward (buffers and fragmentation may be
#   added), so the peak is about the slices + the largest gathered unit (+ its gradient) +
#   activations.
# * 1 point: explains that prefetching keeps two gathered units alive at once (memory traded for
#   overlap), and gives a first change and a measurement: prefetch off or limited, smaller wrap
#   units, a smaller micro-batch or activation checkpointing; the real peak measured with the
#   memory tracker or max_memory_allocated.
# * 0 points: repeats 16N/D, or blames fragmentation alone, with no account of the gathered
#   parameters or the activations.
# ### END SOLUTION

# %% [markdown]
# ## Submitting
#
# Save the notebook, then hand in this file itself, **`a3_zero.ipynb`**, with its name
# unchanged (in `make lab` it is `workspace/assignments/a3_zero/a3_zero.ipynb`), the way your
# instructor asks. Outputs may be cleared (*Edit > Clear Outputs of All Cells*): your instructor
# runs the whole notebook again, from the top, in a fresh kernel, to grade it, so first check
# that *Kernel > Restart Kernel and Run All Cells* meets no `NameError` (a check that names a
# mistake stops *Run All* where it is; grading runs every cell anyway). Learning on your own with
# the full repository? `make check A=a3_zero` grades your copy the same way.

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
# Answer in the cells marked `YOUR CODE HERE`, then run the test cell below each one. Visible
# tests check types and shapes; hidden tests check the values when the assignment is graded.

# %%
import torch
import torch.distributed as dist

from course_utils import checks, zero

# %% [markdown]
# ## Q1. The lesson's check-yourself question (2 points)
#
# An eight-rank job trains the 7B-parameter model with ZeRO-2. A colleague says its persistent
# state is 112/8 = 14 GB per GPU. Set `zero2_gb` to the correct persistent state per GPU, in GB.

# %% [answer q1]
### BEGIN SOLUTION
zero2_gb = (2 + 14 / 8) * 7e9 / 1e9
### END SOLUTION

# %% [test q1_test points=2]
checks.check_number("zero2_gb", zero2_gb)
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

submit("zero2_gb", zero2_gb)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q2. The formulas for any N and D (3 points)
#
# Write `zero_gb(n_params, dp, stage)`: the persistent GB per rank for `n_params` parameters in
# the 16-byte layout on `dp` ranks, for `stage` 0 (replicated data parallelism), 1, 2 or 3.
# Assume ideal sharding (`n_params / dp` per rank, no padding). Work the formulas out from what
# each stage shards; do not call `course_utils.memory`, which is how the tests check you.

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
for _stage in range(4):
    checks.check_number(f"zero_gb(13e9, 16, {_stage})", zero_gb(13e9, 16, _stage))
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

for (_n, _dp) in [(13e9, 16), (7e9, 8), (70e9, 64), (1.5e9, 3)]:
    for _stage in range(4):
        submit(f"zero_gb({_n:g}, {_dp}, {_stage})", zero_gb(_n, _dp, _stage))
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q3. The smallest stage that fits (2 points)
#
# A 13B-parameter model trains on 16 devices of 40 GB each (1 GB = 10^9 bytes). You must keep
# 4 GB per device free for activations and temporary buffers. Set `smallest_stage` to the
# smallest ZeRO stage (an int: 0, 1, 2 or 3) whose persistent state fits in what is left. The
# lower stages communicate less, so the smallest stage that fits is the one to try first.

# %% [answer q3]
### BEGIN SOLUTION
smallest_stage = min(s for s in range(4) if zero_gb(13e9, 16, s) <= 40 - 4)
### END SOLUTION

# %% [test q3_test points=2]
assert type(smallest_stage) is int, f"smallest_stage should be an int (0-3), got {type(smallest_stage).__name__}"
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

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
# Return the new weight slice in bf16 (shape `(S,)`), ready to be all-gathered. The tests run
# your function on 2 and 3 real gloo ranks for several steps and compare every slice with
# `torch.optim.Adam` updating the whole buffer in one process.

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
_gen = torch.Generator().manual_seed(0)
_results = zero.run_shard_step(sharded_adam_step, torch.randn(8, generator=_gen),
                               torch.randn(1, 2, 8, generator=_gen), timeout_s=50)
for _rank, _r in enumerate(_results):
    _out = _r["returned"][0]
    assert isinstance(_out, torch.Tensor), f"rank {_rank} returned {type(_out).__name__}, not a tensor"
    assert tuple(_out.shape) == (4,), f"rank {_rank} returned shape {tuple(_out.shape)}; expected its slice, (S,) = (4,)"
    assert _out.dtype == torch.bfloat16, f"rank {_rank} returned {_out.dtype}; the weight slice is bf16"
    assert tuple(_r["master"].shape) == (4,), f"rank {_rank}: master changed shape to {tuple(_r['master'].shape)}"
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

def _submit_shard_step(seed, dp, s, n_steps, lr, betas, eps):
    """Run the answer on real ranks with seeded inputs; hand every rank's state to the grader."""
    gen = torch.Generator().manual_seed(seed)
    full = torch.randn(dp * s, generator=gen)                      # (P,)
    grads = torch.randn(n_steps, dp, dp * s, generator=gen)        # (steps, D, P)
    try:
        results = zero.run_shard_step(sharded_adam_step, full, grads, lr, betas, eps, timeout_s=50)
    except Exception as e:  # noqa: BLE001 - report the rank's error as feedback
        last = str(e).strip().splitlines()[0]
        raise AssertionError(f"your function failed on real ranks (D = {dp}): {last}") from None
    case = f"seed {seed}, D = {dp}"
    submit(f"{case}: collectives called", sorted({c for r in results for c in r["calls"]}))
    for rank, r in enumerate(results):
        submit(f"{case}, rank {rank}: master", r["master"])
        submit(f"{case}, rank {rank}: exp_avg", r["exp_avg"])
        submit(f"{case}, rank {rank}: returned", r["returned"][-1])


# eps = 0.1 makes Adam sensitive to the gradient's scale, so a missing 1/D shows.
_submit_shard_step(1, 2, 5, 3, 1e-2, (0.9, 0.999), 0.1)
_submit_shard_step(2, 2, 4, 2, 1e-3, (0.9, 0.999), 1e-8)
_submit_shard_step(3, 3, 3, 3, 1e-2, (0.8, 0.99), 0.1)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q5. Why did the ZeRO-3 job run out of memory? (2 points, graded by hand)
#
# A colleague computes 16N/D = 14 GB of persistent state per rank for a ZeRO-3 job and is
# surprised that it runs out of memory on 16 GB devices, even more so after switching on
# prefetching of the next layer's parameters. In a few sentences: what else occupies memory
# during a ZeRO-3 step (use what the lecture's timeline showed), why does prefetching make it
# worse, and what would you change or measure first?

# %% [manual q5_explain points=2]
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
# ### END SOLUTION

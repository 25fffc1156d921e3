# %% [markdown]
# # Assignment 2: data parallelism and the all-reduce
#
# Lecture 2 followed one update across replicas, put the gradient normalization in the right
# place, weighted unequal local batches by their example counts, and counted the bytes of a
# ring all-reduce. Here you do each of these with new numbers, then write the gradient
# synchronization for unequal batches yourself: the tests run your function on real gloo ranks
# and compare it with one process that sees every example.
#
# **Units**: 1 GB = 10^9 bytes, 1 GiB = 2^30 bytes. **D** is the number of data-parallel ranks.
#
# Answer in the cells marked `YOUR CODE HERE` (delete the `raise NotImplementedError()` line),
# then run the test cell below each one. Visible tests check types and shapes; hidden tests
# check the values when the assignment is graded, and their messages name the likely mistake.

# %%
import torch
import torch.distributed as dist

from course_utils import checks, launch

# %% [markdown]
# ## Q1. One update across three replicas (2 points)
#
# Three data-parallel replicas start from weights $w = [2, 0]$. Their local batches have the
# same number of examples, and give local **mean** gradients $[1, 5]$, $[3, -1]$ and $[5, 2]$.
# The gradients are synchronized with an all-reduce, then every replica takes one SGD step with
# learning rate 0.5. Set `w_new_0` and `w_new_1` to the two components of the new weights (the
# same on every replica).

# %% [answer q1]
### BEGIN SOLUTION
_mean = [(1 + 3 + 5) / 3, (5 - 1 + 2) / 3]
w_new_0 = 2 - 0.5 * _mean[0]
w_new_1 = 0 - 0.5 * _mean[1]
### END SOLUTION

# %% [test q1_test points=2]
checks.check_number("w_new_0", w_new_0)
checks.check_number("w_new_1", w_new_1)
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

submit("w_new_0", w_new_0)
submit("w_new_1", w_new_1)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q2. Where the division goes (2 points)
#
# A job on D = 8 ranks synchronizes gradients with `dist.all_reduce`. By what factor is the
# gradient each rank then uses off from the true mean gradient (1 means correct, 2 means twice
# too large, 0.5 half as large):
#
# * `factor_sum_only`: with `op=ReduceOp.SUM` and no division afterwards;
# * `factor_avg_then_divide`: with `op=ReduceOp.AVG`, then divided by D again.

# %% [answer q2]
### BEGIN SOLUTION
factor_sum_only = 8
factor_avg_then_divide = 1 / 8
### END SOLUTION

# %% [test q2_test points=2]
checks.check_number("factor_sum_only", factor_sum_only)
checks.check_number("factor_avg_then_divide", factor_avg_then_divide)
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

submit("factor_sum_only", factor_sum_only)
submit("factor_avg_then_divide", factor_avg_then_divide)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q3. Unequal local batches (2 points)
#
# The model has one parameter. Rank 0 has 2 examples, whose gradients are 6 and 10. Rank 1 has
# 6 examples whose mean gradient is 2. The loss is the mean over **all** examples. Set
# `global_mean_grad` to the gradient a single process would compute on all 8 examples; this is
# what the synchronized gradient must equal.

# %% [answer q3]
### BEGIN SOLUTION
global_mean_grad = (6 + 10 + 6 * 2) / (2 + 6)
### END SOLUTION

# %% [test q3_test points=2]
checks.check_number("global_mean_grad", global_mean_grad)
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

submit("global_mean_grad", global_mean_grad)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q4. Bytes on the wire (2 points)
#
# A model has $1.5 \times 10^9$ parameters and its gradients are bf16 (2 bytes each). It trains
# on D = 16 ranks, which all-reduce the gradients with a ring every step. Set
# `ring_gb_per_rank` to the number of **GB** each rank sends per step.

# %% [answer q4]
### BEGIN SOLUTION
ring_gb_per_rank = 2 * (16 - 1) / 16 * 1.5e9 * 2 / 1e9
### END SOLUTION

# %% [test q4_test points=2]
checks.check_number("ring_gb_per_rank", ring_gb_per_rank)
### BEGIN HIDDEN TESTS
from course_utils.checks import submit

submit("ring_gb_per_rank", ring_gb_per_rank)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q5. Gradient averaging for unequal batches, on real ranks (4 points)
#
# Write `weighted_average_grad(local_mean_grad, n_local, group=None)`, called by every rank of
# the data-parallel group after its backward pass:
#
# * `local_mean_grad`: a float tensor of shape `(P,)`, the mean gradient over this rank's own
#   examples;
# * `n_local`: an `int`, how many examples this rank had (ranks may differ, all are >= 1);
# * `group`: the process group (`None`: all ranks); pass it to your collectives.
#
# Return, on every rank, the mean gradient over **all** examples of all ranks: a tensor of shape
# `(P,)` equal to what one process would compute on the concatenated batch. Use
# `torch.distributed` collectives; do not modify `local_mean_grad` in place. The tests run it on
# 2 and 3 real gloo ranks with unequal counts and compare with a single process.

# %% [answer q5]
def weighted_average_grad(local_mean_grad, n_local, group=None):
    """Mean gradient over all ranks' examples, shape (P,), from this rank's (P,) mean and count."""
    ### BEGIN SOLUTION
    count = torch.tensor([float(n_local)], dtype=local_mean_grad.dtype)  # (1,)
    packed = torch.cat([local_mean_grad * n_local, count])  # (P + 1,): gradient sum, count
    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
    return packed[:-1] / packed[-1]  # (P,) sum of all gradients / number of examples
    ### END SOLUTION

# %% [test q5_test points=4]
def _q5_worker(rank, world_size, fn, cases):
    """Run the student's function on this rank for each case; describe what came back."""
    import torch
    out = []
    for local_means, counts in cases:
        given = local_means[rank].clone()
        got = fn(given, counts[rank])
        out.append({"type": type(got).__name__,
                    "shape": tuple(got.shape) if isinstance(got, torch.Tensor) else None,
                    "values": got.double().tolist() if isinstance(got, torch.Tensor) else None,
                    "input_kept": bool(torch.equal(given, local_means[rank]))})
    return out


def _q5_run(cases, world_size):
    try:
        return launch.run(_q5_worker, world_size, weighted_average_grad, cases, timeout_s=50,
                          show_output=False)
    except Exception as e:  # report the rank's error as feedback, not a traceback
        last = str(e).strip().splitlines()[0]
        raise AssertionError(f"weighted_average_grad failed on {world_size} real ranks: {last}") from None


_visible = [([torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.0, 1.0, -1.0])], [1, 3])]
for _rank, _res in enumerate(_q5_run(_visible, 2)):
    assert _res[0]["type"] == "Tensor", f"rank {_rank} returned a {_res[0]['type']}, not a torch.Tensor"
    assert _res[0]["shape"] == (3,), f"rank {_rank} returned shape {_res[0]['shape']}; expected (P,) = (3,)"
### BEGIN HIDDEN TESTS
from course_utils.checks import submit


def _q5_inputs(seed, counts, p=4):
    """Each rank's local mean gradient (P = 4) over its own random examples, and the counts."""
    gen = torch.Generator().manual_seed(seed)
    per_example = [torch.randn(n, p, generator=gen, dtype=torch.float64) for n in counts]
    return [g.mean(0) for g in per_example], list(counts)


for _world_size, _specs in [(2, [(0, (1, 3)), (1, (5, 2)), (2, (4, 4))]),
                            (3, [(3, (2, 1, 5)), (4, (1, 1, 1))])]:
    _built = [_q5_inputs(_seed, _counts) for _seed, _counts in _specs]
    _results = _q5_run(_built, _world_size)
    for _i, (_seed, _counts) in enumerate(_specs):
        for _rank, _res in enumerate(_results):
            submit(f"weighted_average_grad(seed {_seed}, counts {list(_counts)}), rank {_rank}",
                   _res[_i])
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q6. Why did doubling the ranks not double the throughput? (2 points, graded by hand)
#
# A team moves a data-parallel job from 32 to 64 ranks, keeping 16 examples per rank, and
# measures only 1.3 times the examples per second. Using the lecture's measurements, give two
# different reasons this can happen, and for each one say what you would measure to confirm it
# and what you would change. Then say what happened to the global batch size, and why that may
# matter for the number of steps the job needs.

# %% [manual q6_explain points=2]
# ### BEGIN SOLUTION
# (1) Synchronization: every step each rank sends about 2(D-1)/D x the gradient bytes, almost
# twice the gradient buffer whatever D is, and the all-reduce cannot start its last bucket until
# backward finishes; with only 16 examples per rank the backward pass may be too short to hide
# it. Measure the time spent waiting inside the all-reduce per rank (profiler, or timing around
# the collective); if all ranks wait about equally, the job is communication-bound: increase the
# per-rank batch (or accumulate with no_sync), use bigger buckets / overlap, or bf16 gradients.
# (2) A straggler or slow input pipeline: every all-reduce waits for the slowest rank, and with
# 64 ranks the chance that one of them is slow in a step is higher. Measure per-rank compute and
# data-loading time and the wait per rank: one rank waiting much less than the others is the
# straggler. Fix its input pipeline (more loader workers, prefetch), or replace the slow host.
# The global batch doubled from 512 to 1024 examples. Past some size a larger batch no longer
# cuts the number of steps to reach a given loss proportionally, and learning rate and warm-up
# need retuning, so examples per second can overstate the gain in time-to-result.
# ### END SOLUTION

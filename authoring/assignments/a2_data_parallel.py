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
checks.check_number("w_new_0", w_new_0, 0.5, mistakes=[
    (-2.5, "you used the SUM of the gradients [9, 6]: an all-reduce with SUM must still be "
           "divided by D = 3 to get the mean"),
    (-0.25, "you divided the sum by 2 (the lesson had two ranks); here D = 3"),
    (1.5, "you divided twice: the mean of [1, 3, 5] is already 3 (AVG, or SUM / D), not 1"),
    (3.5, "the SGD step subtracts lr x gradient: w - 0.5 x 3, not w + 0.5 x 3"),
])
checks.check_number("w_new_1", w_new_1, -1.0, mistakes=[
    (-3.0, "you used the SUM of the gradients [9, 6]: divide by D = 3 to get the mean [3, 2]"),
    (-1.5, "you divided the sum by 2 (the lesson had two ranks); here D = 3"),
    (-1 / 3, "you divided twice: the mean gradient's second component is 2, not 2/3"),
    (1.0, "the SGD step subtracts lr x gradient: 0 - 0.5 x 2, not 0 + 0.5 x 2"),
])
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
checks.check_number("factor_sum_only", factor_sum_only, 8, mistakes=[
    (1, "SUM adds the 8 ranks' mean gradients and divides by nothing: the result is 8 x the mean"),
    (1 / 8, "that is the factor of the other bug (dividing after AVG); SUM without a division "
            "makes the gradient too large"),
    (7, "all 8 ranks' gradients are added, including this rank's own: the factor is D, not D - 1"),
])
checks.check_number("factor_avg_then_divide", factor_avg_then_divide, 0.125, mistakes=[
    (1, "AVG already divides by D; dividing again makes the gradient D times too small"),
    (8, "dividing twice makes the gradient smaller, not larger: the factor is 1/D"),
    (1 / 64, "the AVG op divides by D once and you divide once more: 1/D, not 1/D^2"),
])
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
checks.check_number("global_mean_grad", global_mean_grad, 3.5, mistakes=[
    (5.0, "that is the mean of the two ranks' means, (8 + 2) / 2: it weighs rank 0's two "
          "examples as much as rank 1's six. Weight each rank's mean by its example count"),
    (28.0, "that is the sum of all 8 gradients: divide by the number of examples, 8"),
    (10.0, "that is the sum of the two ranks' means: weight them by example count and divide "
           "by the total count"),
    (4.5, "rank 1 contributes 6 x 2 = 12 to the sum, not 2 x 6 as one example"),
])
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
checks.check_number("ring_gb_per_rank", ring_gb_per_rank, 5.625, unit="GB", mistakes=[
    (2.8125, "that counts one phase only: the ring sends (D-1)/D x N in the reduce-scatter "
             "AND again in the all-gather, 2(D-1)/D x N x 2 bytes in total"),
    (6.0, "2 x the buffer is the limit for large D; with D = 16 it is 2 x 15/16 x the buffer"),
    (3.0, "that is the gradient buffer sent once; the ring sends 2(D-1)/D times it"),
    (11.25, "bf16 gradients are 2 bytes each, not 4"),
    (5.625 * 1e9 / 2**30, "that is GiB (2^30 bytes); the question asks for GB (10^9 bytes)"),
    (5.625e9, "that is bytes; the question asks for GB"),
    (45.0, "that is every rank sending its whole buffer to each of the other 15: the ring sends "
           "each rank's data only to its neighbour, shard by shard"),
    (0.1875, "that is one rank's shard (N/D x 2 bytes); the ring sends 2(D-1) such shards"),
])
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
def _q5_cases(seed, counts, p=4):
    gen = torch.Generator().manual_seed(seed)
    per_example = [torch.randn(n, p, generator=gen, dtype=torch.float64) for n in counts]
    return [g.mean(0) for g in per_example], list(counts), torch.cat(per_example).mean(0)


def _q5_check(world_size, specs):
    built = [_q5_cases(seed, counts) for seed, counts in specs]
    results = _q5_run([(means, counts) for means, counts, _ in built], world_size)
    for i, (means, counts, expected) in enumerate(built):
        d, n_total = len(counts), sum(counts)
        wrong = [
            (torch.stack(means).mean(0), "that is the mean of the ranks' means: it gives each "
             "rank the same weight whatever its number of examples. Weight by n_local"),
            (sum(m * n for m, n in zip(means, counts)), "that is the SUM of all examples' "
             "gradients: divide by the total number of examples (all-reduce the counts too)"),
            (sum(m * n for m, n in zip(means, counts)) / d, "you divided by the number of ranks "
             "D; divide by the total number of examples instead"),
            (torch.stack(means).sum(0), "that is the plain SUM of the ranks' means, neither "
             "weighted nor divided"),
        ]
        for rank, res in enumerate(results):
            r = res[i]
            where = f"rank {rank}, counts {counts}"
            assert r["type"] == "Tensor", f"{where}: returned a {r['type']}, not a torch.Tensor"
            assert r["shape"] == tuple(expected.shape), (
                f"{where}: returned shape {r['shape']}; expected {tuple(expected.shape)}")
            got = torch.tensor(r["values"], dtype=torch.float64)
            if not torch.allclose(got, expected, rtol=1e-5, atol=1e-6):
                for value, message in wrong:
                    if torch.allclose(got, value, rtol=1e-5, atol=1e-6):
                        raise AssertionError(f"{where}: {message}.")
                if torch.allclose(got, means[rank], rtol=1e-5, atol=1e-6):
                    raise AssertionError(f"{where}: you returned this rank's own mean; the "
                                         "ranks' gradients must be combined with a collective")
                raise AssertionError(f"{where}: the result differs from the mean gradient over "
                                     f"all {n_total} examples computed in one process.")
            assert r["input_kept"], f"{where}: local_mean_grad was modified in place"


_q5_check(2, [(0, (1, 3)), (1, (5, 2)), (2, (4, 4))])
_q5_check(3, [(3, (2, 1, 5)), (4, (1, 1, 1))])
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

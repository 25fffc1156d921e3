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
# then run the cell below each one.
#
# **What the checks in this notebook tell you while you practise:**
#
# * Before each of Q1 to Q4 comes a *practice* question (not graded): the same reasoning with
#   other numbers. The cell after your practice answer checks it fully: it says whether it is
#   right, and if not, which mistake it looks like. Do it first.
# * The visible test of a graded question checks your answer's type and rejects the known wrong
#   answers that follow from the question's numbers (naming the misconception). It never tells
#   you the right value: passing it does not mean your answer is right.
# * Q5's visible test runs your function on 2 real ranks with two small cases of its own and
#   checks the results fully (values, the mistake they reveal, the input left unchanged).
#
# **When the assignment is graded**, hidden tests also run your Q5 function on other inputs, on 2
# and 3 ranks, and the grader checks the values of every graded answer; its messages name the
# likely mistake. The practice questions earn no points.
#
# **Your own numbers.** Q1 to Q4 use numbers drawn for you (the table the next cell
# shows, `G`): your classmates have other ones, so their answers are wrong for you. They come
# from your identity (your JupyterHub user, the name `make lab` asked for once, or, when your
# instructor grades, your student id, whatever this notebook says). Do not edit that cell.
#
# **Work the answers out yourself.** Some `course_utils` helpers compute a graded answer
# outright (here, for example, `data_parallel.sgd_reference`). An answer that uses one is
# flagged for your instructor: the questions ask for the reasoning those helpers do.

# %%
import torch
import torch.distributed as dist

from course_utils import launch
from course_utils.assess import checks, variants

G = variants.givens("a2_data_parallel", on=True)  # your numbers (do not edit this cell)
G

# %% [markdown]
# ## Q1. One update across three replicas (2 points)

# %% [markdown]
# *Practice (not graded)*: four data-parallel replicas start from weights $w = [3, -2]$. Their
# local batches have the same number of examples, and give local **mean** gradients $[2, 1]$,
# $[6, -3]$, $[0, 4]$ and $[2, 2]$. The gradients are synchronized with an all-reduce, then every
# replica takes one SGD step with learning rate 0.3. Set `practice_w_new_0` and
# `practice_w_new_1` to the two components of the new weights.

# %% [answer q1_practice]
### BEGIN SOLUTION
_practice_mean = [(2 + 6 + 0 + 2) / 4, (1 - 3 + 4 + 2) / 4]
practice_w_new_0 = 3 - 0.3 * _practice_mean[0]
practice_w_new_1 = -2 - 0.3 * _practice_mean[1]
### END SOLUTION

# %%
checks.check_number("practice_w_new_0", practice_w_new_0, 2.25, abs_tol=1e-9, mistakes=[
    (0.0, "you stepped with the SUM of the four gradients (10); the replicas step with their "
          "mean, the sum divided by D = 4"),
    (1.5, "you divided the sum by 2 (the lecture's two ranks); here there are D = 4 replicas"),
    (2.8125, "you divided by D twice: the mean of 2, 6, 0 and 2 is 2.5, and that is what the "
             "step uses"),
    (3.75, "SGD subtracts learning rate x gradient; you added it"),
])
checks.check_number("practice_w_new_1", practice_w_new_1, -2.3, abs_tol=1e-9, mistakes=[
    (-3.2, "you stepped with the SUM of the four gradients (4); divide it by D = 4 for the "
           "mean"),
    (-2.6, "you divided the sum by 2 (the lecture's two ranks); here there are D = 4 replicas"),
    (-2.075, "you divided by D twice: the mean of 1, -3, 4 and 2 is 1"),
    (-1.7, "SGD subtracts learning rate x gradient; you added it"),
])
print("practice answers right")

# %% [markdown]
# **Graded question.** Three data-parallel replicas start from the weights $w$ (two
# components). Their local batches have the same number of examples, and give the three local
# **mean** gradients $g_0$, $g_1$, $g_2$. The gradients are synchronized with an all-reduce, then
# every replica takes one SGD step with learning rate `lr`, where `(w, (g0, g1, g2), lr) = G.q1`
# (yours are in the table at the top). Set `w_new_0` and `w_new_1` to the two components of the
# new weights (the same on every replica).

# %% [answer q1]
### BEGIN SOLUTION
w, grads, lr = G.q1
mean_grad = [sum(g[i] for g in grads) / len(grads) for i in range(2)]
w_new_0 = w[0] - lr * mean_grad[0]
w_new_1 = w[1] - lr * mean_grad[1]
### END SOLUTION

# %% [test q1_test points=2]
# Visible: the type, and known wrong answers (the right value is checked when graded).
_w, _grads, _lr = G.q1
for _i, (_name, _value) in enumerate([("w_new_0", w_new_0), ("w_new_1", w_new_1)]):
    _sum = sum(_g[_i] for _g in _grads)
    checks.check_number(_name, _value, variant=G.key("q1"), mistakes=[
        (_w[_i] - _lr * _sum, "you used the SUM of the gradients: an all-reduce with op=SUM "
                              "adds the three replicas' gradients, and the SGD step needs their "
                              "mean"),
        (_w[_i] - _lr * _sum / 2, "you divided the summed gradient by 2, the number of ranks in "
                                  "the lecture; this job has three replicas"),
    ])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("w_new_0", w_new_0)
submit("w_new_1", w_new_1)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q2. Where the division goes (2 points)

# %% [markdown]
# *Practice (not graded)*: a job on D = 4 ranks synchronizes gradients with `dist.all_reduce`.
# By what factor is the gradient each rank then uses off from the true mean gradient (1 means
# correct, 2 means twice too large, 0.5 half as large):
#
# * `practice_factor_sum_halved`: with `op=ReduceOp.SUM`, then divided by 2 (a division
#   copied from a two-rank example);
# * `practice_factor_avg_then_divide`: with `op=ReduceOp.AVG`, then divided by D again.

# %% [answer q2_practice]
### BEGIN SOLUTION
practice_factor_sum_halved = 4 / 2
practice_factor_avg_then_divide = 1 / 4
### END SOLUTION

# %%
checks.check_number("practice_factor_sum_halved", practice_factor_sum_halved, 2, mistakes=[
    (1, "dividing by 2 is only right with 2 ranks: the SUM over 4 ranks is 4 x the mean"),
    (4, "that is SUM with no division at all; here the sum is divided by 2 afterwards"),
    (0.5, "the SUM makes the gradient too large, not too small: the factor is above 1"),
    (1.5, "the SUM adds all 4 ranks' gradients, this rank's own included: 4 / 2, not 3 / 2"),
])
checks.check_number("practice_factor_avg_then_divide", practice_factor_avg_then_divide, 0.25,
                    mistakes=[
    (1, "AVG already divides by D = 4; the second division makes the gradient 4 x too small"),
    (4, "dividing twice makes the gradient smaller, not larger: the factor is below 1"),
    (1 / 16, "AVG divides by 4 once and your code once more: the gradient is 1/4 of the mean, "
             "not 1/16"),
])
print("practice answers right")

# %% [markdown]
# **Graded question.** A job on `D = G.q2_ranks` ranks synchronizes gradients with
# `dist.all_reduce`. By what factor is the gradient each rank then uses off from the true mean gradient (1 means correct, 2
# means twice too large, 0.5 half as large):
#
# * `factor_sum_only`: with `op=ReduceOp.SUM` and no division afterwards;
# * `factor_avg_then_divide`: with `op=ReduceOp.AVG`, then divided by D again.

# %% [answer q2]
### BEGIN SOLUTION
factor_sum_only = G.q2_ranks
factor_avg_then_divide = 1 / G.q2_ranks
### END SOLUTION

# %% [test q2_test points=2]
# Visible: the type, and known wrong answers (the right value is checked when graded).
checks.check_number("factor_sum_only", factor_sum_only, mistakes=[
    (1, "op=SUM adds the ranks' gradients and nothing divides the sum afterwards, so the "
        "gradient used is not the mean"),
])
checks.check_number("factor_avg_then_divide", factor_avg_then_divide, mistakes=[
    (1, "op=AVG already divides by D; the extra division changes the gradient's scale"),
])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("factor_sum_only", factor_sum_only)
submit("factor_avg_then_divide", factor_avg_then_divide)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q3. Unequal local batches (2 points)

# %% [markdown]
# *Practice (not graded)*: the model has one parameter and three ranks. Rank 0 has 2 examples,
# whose gradients are 3 and 5. Rank 1 has 1 example, whose gradient is -2. Rank 2 has 5
# examples whose mean gradient is 3. The loss is the mean over **all** examples. Set
# `practice_global_mean_grad` to the gradient a single process would compute on all 8 examples.

# %% [answer q3_practice]
### BEGIN SOLUTION
practice_global_mean_grad = (3 + 5 - 2 + 5 * 3) / (2 + 1 + 5)
### END SOLUTION

# %%
checks.check_number("practice_global_mean_grad", practice_global_mean_grad, 2.625, mistakes=[
    (5 / 3, "that is the mean of the three ranks' means (4, -2, 3): it gives rank 1's single "
            "example as much weight as rank 2's five. Weight each mean by its count"),
    (21, "that is the sum of all 8 gradients; the loss is their mean"),
    (7, "you divided the sum by the number of ranks, 3; divide by the number of examples"),
    (5, "that is the sum of the ranks' means, neither weighted by the counts nor divided"),
    (2.25, "you counted rank 2's mean gradient as one example; it stands for 5 examples "
           "(they add 5 x 3 to the sum)"),
])
print("practice answer right")

# %% [markdown]
# **Graded question.** The model has one parameter. Rank 0 has 2 examples, whose gradients are
# $g_1$ and $g_2$. Rank 1 has $n$ examples whose mean gradient is $m$, where
# `(g1, g2, n, m) = G.q3`. The loss is the mean over **all** examples. Set `global_mean_grad` to
# the gradient a single process would compute on all $2 + n$ examples; this is what the
# synchronized gradient must equal.

# %% [answer q3]
### BEGIN SOLUTION
g1, g2, n, m = G.q3
global_mean_grad = (g1 + g2 + n * m) / (2 + n)
### END SOLUTION

# %% [test q3_test points=2]
# Visible: the type, and known wrong answers (the right value is checked when graded).
_g1, _g2, _n, _m = G.q3
checks.check_number("global_mean_grad", global_mean_grad, variant=G.key("q3"), mistakes=[
    (((_g1 + _g2) / 2 + _m) / 2, "that is the plain mean of the two ranks' means: rank 0's two "
                                 "examples weigh as much as rank 1's many. Weight each rank's "
                                 "mean by its number of examples"),
    ((_g1 + _g2) / 2 + _m, "that is the sum of the two ranks' means, neither weighted by the "
                           "counts nor divided"),
    ((_g1 + _g2 + _m) / 3, f"you counted rank 1's mean gradient as a single example; it stands "
                           f"for {_n} examples"),
])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

submit("global_mean_grad", global_mean_grad)
### END HIDDEN TESTS
None

# %% [markdown]
# ## Q4. Bytes on the wire (2 points)

# %% [markdown]
# *Practice (not graded)*: a model has $1.2 \times 10^9$ parameters and its gradients are bf16
# (2 bytes each). It trains on D = 8 ranks, which all-reduce the gradients with a ring every
# step. Set `practice_ring_gb_per_rank` to the number of **GB** each rank sends per step.

# %% [answer q4_practice]
### BEGIN SOLUTION
practice_ring_gb_per_rank = 2 * (8 - 1) / 8 * 1.2e9 * 2 / 1e9
### END SOLUTION

# %%
checks.check_number("practice_ring_gb_per_rank", practice_ring_gb_per_rank, 4.2, unit="GB",
                    mistakes=[
    (2.1, "that is one phase only: the ring sends 7/8 of the 2.4 GB buffer in the "
          "reduce-scatter and 7/8 again in the all-gather"),
    (4.8, "2 x the buffer is the limit for many ranks; with D = 8 each phase sends 7/8 of it"),
    (2.4, "that is the 2.4 GB gradient buffer sent once; the ring sends 2 x 7/8 of it"),
    (8.4, "bf16 gradients take 2 bytes each, not 4"),
    (4.2e9 / 2**30, "that is in GiB (2^30 bytes); the question asks for GB (10^9 bytes)"),
    (4.2e9, "that is in bytes; the question asks for GB"),
    (16.8, "that is each rank sending its whole buffer to each of the 7 others; in a ring each "
           "rank sends to its neighbour only, one shard at a time"),
    (0.3, "that is a single shard (the buffer split D = 8 ways); each rank sends 2 x 7 shards "
           "per step"),
])
print("practice answer right")

# %% [markdown]
# **Graded question.** A model has $N$ parameters and its gradients are bf16 (2 bytes each). It
# trains on $D$ ranks, which all-reduce the gradients with a ring every step, where
# `(N, D) = G.q4`. Set `ring_gb_per_rank` to the number of **GB** each rank sends per step.

# %% [answer q4]
### BEGIN SOLUTION
n_params, d = G.q4
ring_gb_per_rank = 2 * (d - 1) / d * n_params * 2 / 1e9
### END SOLUTION

# %% [test q4_test points=2]
# Visible: the type, and known wrong answers (the right value is checked when graded).
_n, _d = G.q4
_buffer = _n * 2 / 1e9
checks.check_number("ring_gb_per_rank", ring_gb_per_rank, unit="GB", variant=G.key("q4"),
                    mistakes=[
    (_buffer, "that is the gradient buffer sent once; a ring all-reduce has two phases, a "
              "reduce-scatter and an all-gather, and each sends part of the buffer"),
    (2 * _buffer, f"that is 2 x the buffer, the limit for very many ranks; use the ring's exact "
                  f"factor for D = {_d}"),
    ((_d - 1) * _buffer, f"that is every rank sending its whole buffer to each of the {_d - 1} "
                         "others; in a ring each rank sends only to its neighbour, one shard at "
                         "a time"),
    (_buffer / _d, "that is a single shard (1/D of the buffer); count the shards each rank sends "
                   "in both phases"),
])
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import submit

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


# Visible: two small cases on 2 real ranks, checked fully (the hidden cases are others).
_Q5_MISTAKES = {
    "mean_of_means": "that is the plain mean of the two ranks' means: a rank with few examples "
                     "weighs as much as one with many. Weight each rank's mean by its n_local",
    "sum": "that is the sum of every example's gradient; it still has to be divided by the "
           "total number of examples, which the ranks must all-reduce as well",
    "sum_over_d": "that divides the weighted sum by the number of ranks; the mean divides it by "
                  "the total number of examples",
    "sum_of_means": "that is the sum of the ranks' means, neither weighted by the counts nor "
                    "divided",
}
# (each rank's local mean gradient, each rank's count, what one process computes on all the
#  examples, and what the known mistakes return instead)
_visible = [
    ([torch.tensor([4.0, -2.0, 1.0]), torch.tensor([0.0, 2.0, 5.0])], [2, 6], [1.0, 1.0, 4.0],
     {"mean_of_means": [2.0, 0.0, 3.0], "sum": [8.0, 8.0, 32.0], "sum_over_d": [4.0, 4.0, 16.0],
      "sum_of_means": [4.0, 0.0, 6.0]}),
    ([torch.tensor([1.0, 1.0, -3.0]), torch.tensor([-3.0, 5.0, 5.0])], [5, 3], [-0.5, 2.5, 0.0],
     {"mean_of_means": [-1.0, 3.0, 1.0], "sum": [-4.0, 20.0, 0.0], "sum_over_d": [-2.0, 10.0, 0.0],
      "sum_of_means": [-2.0, 6.0, 2.0]}),
]


def _q5_close(values, target):
    return torch.allclose(torch.tensor(values, dtype=torch.float64),
                          torch.as_tensor(target, dtype=torch.float64), rtol=1e-5, atol=1e-6)


for _rank, _res in enumerate(_q5_run([(_m, _n) for _m, _n, _, _ in _visible], 2)):
    for (_means, _counts, _want, _wrong), _r in zip(_visible, _res):
        _where = f"visible case counts {_counts}, rank {_rank}"
        assert _r["type"] == "Tensor", f"{_where}: returned a {_r['type']}, not a torch.Tensor"
        assert _r["shape"] == (3,), f"{_where}: returned shape {_r['shape']}; expected (P,) = (3,)"
        if not _q5_close(_r["values"], _want):
            for _kind, _value in _wrong.items():
                if _q5_close(_r["values"], _value):
                    raise AssertionError(f"{_where}: {_Q5_MISTAKES[_kind]}.")
            if _q5_close(_r["values"], _means[_rank]):
                raise AssertionError(f"{_where}: you returned this rank's own mean; combine the "
                                     "ranks' gradients with a collective")
            raise AssertionError(f"{_where}: returned {_r['values']}; one process on all "
                                 f"{sum(_counts)} examples computes {_want}")
        assert _r["input_kept"], f"{_where}: local_mean_grad was modified in place"
print("visible cases right on 2 ranks")
### BEGIN HIDDEN TESTS
from course_utils.assess.checks import hidden_cases, submit


def _q5_inputs(seed, counts, p=4):
    """Each rank's local mean gradient (P = 4) over its own random examples, and the counts."""
    gen = torch.Generator().manual_seed(seed)
    per_example = [torch.randn(n, p, generator=gen, dtype=torch.float64) for n in counts]
    return [g.mean(0) for g in per_example], list(counts)


_number = 0
for _world_size, _specs in hidden_cases("q5_test"):  # drawn per submission
    _built = [_q5_inputs(_seed, _counts) for _seed, _counts in _specs]
    _results = _q5_run(_built, _world_size)
    for _i in range(len(_specs)):
        _number += 1
        for _rank, _res in enumerate(_results):
            submit(f"weighted_average_grad on hidden case {_number}, rank {_rank}", _res[_i])
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
#
# **Rubric** (2 points):
# * 1 point: two different reasons from the lecture, each with what to measure and what to
#   change. Communication (about 2 x the gradient bytes per rank, a ring latency that grows
#   with D, slower links between more nodes, not hidden by a 16-example backward): measure the
#   time each rank waits in the all-reduce (about equal on all ranks); change to a bigger
#   per-rank batch, `no_sync` accumulation, bigger buckets / overlap or bf16 gradients. A
#   straggler or slow input pipeline (the slowest of 64 ranks sets every step): measure
#   per-rank compute and data-loading time (one rank waits much less than the others); add
#   loader workers / prefetch or replace the slow host. Both reasons needed, each complete;
#   the global batch is not one of them (it does not lower examples per second).
# * 1 point: says the global batch doubled from 16 x 32 = 512 to 16 x 64 = 1024 examples, and
#   that past some size a larger batch no longer cuts the steps to a given loss in proportion
#   (learning rate and warm-up need retuning), so examples per second overstates the speed-up.
# * 0 points: reasons with nothing to measure or change (only "communication overhead" or
#   "Amdahl's law"), and the global batch missed or misstated (said to stay at 512, or given
#   as the reason the examples per second fell short).
# ### END SOLUTION

# %% [markdown]
# ## Submitting
#
# Save the notebook, then hand in this file itself, **`a2_data_parallel.ipynb`**, with its name
# unchanged (in `make lab` it is `workspace/assignments/a2_data_parallel/a2_data_parallel.ipynb`), the way your
# instructor asks. Outputs may be cleared (*Edit > Clear Outputs of All Cells*): your instructor
# runs the whole notebook again, from the top, in a fresh kernel, to grade it, so first check
# that *Kernel > Restart Kernel and Run All Cells* meets no `NameError` (a check that names a
# mistake stops *Run All* where it is; grading runs every cell anyway). Learning on your own with
# the full repository? `make check A=a2_data_parallel` grades your copy the same way.

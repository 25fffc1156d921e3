"""Judge of a2_data_parallel: one function per test cell, run by the grader outside the kernel.

Each function gets ``got`` and ``ref``: ``{name: value}`` that the student's and the reference
solution's hidden tests submitted (``course_utils.assess.checks.submit``), and raises AssertionError
with the message that names the mistake. See ``grading/judge.py``.
"""

import torch

from course_utils.assess.checks import check_number

# Course helpers that compute a graded answer outright, per answer cell: a submission whose
# answer cell (or any cell it added) uses one is flagged in the instructor's report
# (grading.integrity.helper_uses), since the question asks for the reasoning the helper does.
HELPERS_NOT_ALLOWED = {
    "q1": ["data_parallel.sgd_reference", "data_parallel.two_replica_update_worker"],
    "q3": ["data_parallel.weighted_train", "data_parallel.split_by_counts"],
    "q4": ["collectives.cost.ring_bytes_per_rank", "measure.predicted_allreduce_bytes",
           "measure.allreduce_bytes_sent"],
    "q5": ["data_parallel.unequal_batch_worker", "data_parallel.weighted_train"],
}


def q1_test(got, ref):
    w, grads, lr = got.givens.q1
    d = len(grads)
    for i, name in enumerate(("w_new_0", "w_new_1")):
        total = sum(g[i] for g in grads)
        mean = total / d
        sums = "[" + ", ".join(f"{sum(g[k] for g in grads):g}" for k in range(2)) + "]"
        check_number(name, got[name], w[i] - lr * mean, mistakes=[
            (w[i] - lr * total, f"you used the SUM of the gradients {sums}: an all-reduce with "
                                f"SUM must still be divided by D = {d} to get the mean"),
            (w[i] - lr * total / 2, f"you divided the sum by 2 (the lesson had two ranks); here "
                                    f"D = {d}"),
            (w[i] - lr * mean / d, f"you divided twice: the mean of component {i} is already "
                                   f"{mean:g} (AVG, or SUM / D)"),
            (w[i] + lr * mean, f"the SGD step subtracts lr x gradient: w - {lr:g} x {mean:g}, not "
                               f"w + {lr:g} x {mean:g}"),
        ])


def q2_test(got, ref):
    d = got.givens.q2_ranks
    check_number("factor_sum_only", got["factor_sum_only"], d, mistakes=[
        (1, f"SUM adds the {d} ranks' mean gradients and divides by nothing: the result is "
            f"{d} x the mean"),
        (1 / d, "that is the factor of the other bug (dividing after AVG); SUM without a "
                "division makes the gradient too large"),
        (d - 1, f"all {d} ranks' gradients are added, including this rank's own: the factor is "
                "D, not D - 1"),
    ])
    check_number("factor_avg_then_divide", got["factor_avg_then_divide"], 1 / d, mistakes=[
        (1, "AVG already divides by D; dividing again makes the gradient D times too small"),
        (d, "dividing twice makes the gradient smaller, not larger: the factor is 1/D"),
        (1 / d**2, "the AVG op divides by D once and you divide once more: 1/D, not 1/D^2"),
    ])


def q3_test(got, ref):
    g1, g2, n, m = got.givens.q3
    total, count = g1 + g2 + n * m, 2 + n
    check_number("global_mean_grad", got["global_mean_grad"], total / count, mistakes=[
        (((g1 + g2) / 2 + m) / 2, f"that is the mean of the two ranks' means, "
                                  f"({(g1 + g2) / 2:g} + {m:g}) / 2: it weighs rank 0's two "
                                  f"examples as much as rank 1's {n}. Weight each rank's mean "
                                  "by its example count"),
        (total, f"that is the sum of all {count} gradients: divide by the number of examples, "
                f"{count}"),
        ((g1 + g2) / 2 + m, "that is the sum of the two ranks' means: weight them by example "
                            "count and divide by the total count"),
        ((g1 + g2 + m) / 3, f"rank 1 contributes {n} x {m:g} = {n * m:g} to the sum, not "
                            f"{m:g} as one example"),
    ])


def q4_test(got, ref):
    n, d = got.givens.q4
    buffer = n * 2 / 1e9                                  # GB of bf16 gradients
    ring = 2 * (d - 1) / d * buffer
    check_number("ring_gb_per_rank", got["ring_gb_per_rank"], ring, unit="GB", mistakes=[
        (ring / 2, "that counts one phase only: the ring sends (D-1)/D x N in the reduce-scatter "
                   "AND again in the all-gather, 2(D-1)/D x N x 2 bytes in total"),
        (2 * buffer, f"2 x the buffer is the limit for large D; with D = {d} it is "
                     f"2 x {d - 1}/{d} x the buffer"),
        (buffer, "that is the gradient buffer sent once; the ring sends 2(D-1)/D times it"),
        (ring * 2, "bf16 gradients are 2 bytes each, not 4"),
        (ring * 1e9 / 2**30, "that is GiB (2^30 bytes); the question asks for GB (10^9 bytes)"),
        (ring * 1e9, "that is bytes; the question asks for GB"),
        ((d - 1) * buffer, f"that is every rank sending its whole buffer to each of the other "
                           f"{d - 1}: the ring sends each rank's data only to its neighbour, "
                           "shard by shard"),
        (buffer / d, "that is one rank's shard (N/D x 2 bytes); the ring sends 2(D-1) such "
                     "shards"),
    ])


def _draw_q5(rng):
    """weighted_average_grad's hidden runs, drawn per submission: (world size, [(seed,
    examples per rank), ...]). Each run has unequal counts (means of means show) and equal ones
    (every weighting agrees there: a rank that returns its own mean still shows)."""
    def unequal(d):
        while True:
            counts = [rng.randint(1, 6) for _ in range(d)]
            if len(set(counts)) > 1:
                return counts

    seeds = rng.sample(range(10_000), 5)
    return [[2, [[seeds[0], unequal(2)], [seeds[1], unequal(2)], [seeds[2], [4, 4]]]],
            [3, [[seeds[3], unequal(3)], [seeds[4], [rng.randint(1, 3)] * 3]]]]


HIDDEN_CASES = {"q5_test": _draw_q5}


def _q5_cases(seed, counts, p=4):
    """The same inputs as the hidden test's, and the mean over all examples in one process."""
    gen = torch.Generator().manual_seed(seed)
    per_example = [torch.randn(n, p, generator=gen, dtype=torch.float64) for n in counts]
    return [g.mean(0) for g in per_example], list(counts), torch.cat(per_example).mean(0)


def _shape(shape):
    """The shape as the old in-kernel test showed it (a tuple; JSON sends lists)."""
    return tuple(shape) if isinstance(shape, list) else shape


def q5_test(got, ref):
    number = 0
    for world_size, specs in got.cases:
        for seed, counts in specs:
            number += 1
            means, counts, expected = _q5_cases(seed, counts)
            d, n_total = len(counts), sum(counts)
            wrong = [
                (torch.stack(means).mean(0), "that is the mean of the ranks' means: it gives "
                 "each rank the same weight whatever its number of examples. Weight by n_local"),
                (sum(m * n for m, n in zip(means, counts)), "that is the SUM of all examples' "
                 "gradients: divide by the total number of examples (all-reduce the counts "
                 "too)"),
                (sum(m * n for m, n in zip(means, counts)) / d, "you divided by the number of "
                 "ranks D; divide by the total number of examples instead"),
                (torch.stack(means).sum(0), "that is the plain SUM of the ranks' means, neither "
                 "weighted nor divided"),
            ]
            for rank in range(world_size):
                r = got[f"weighted_average_grad on hidden case {number}, rank {rank}"]
                where = f"hidden case {number}, rank {rank}"
                keys = {"type", "shape", "values", "input_kept"}
                assert isinstance(r, dict) and keys <= set(r), (
                    f"{where}: the ranks' results did not come back")
                assert r["type"] == "Tensor", (
                    f"{where}: returned a {r['type']}, not a torch.Tensor")
                assert _shape(r["shape"]) == tuple(expected.shape), (
                    f"{where}: returned shape {_shape(r['shape'])}; expected "
                    f"{tuple(expected.shape)}")
                value = torch.tensor(r["values"], dtype=torch.float64)
                if not torch.allclose(value, expected, rtol=1e-5, atol=1e-6):
                    for wrong_value, message in wrong:
                        if torch.allclose(value, wrong_value, rtol=1e-5, atol=1e-6):
                            raise AssertionError(f"{where}: {message}.")
                    if torch.allclose(value, means[rank], rtol=1e-5, atol=1e-6):
                        raise AssertionError(f"{where}: you returned this rank's own mean; the "
                                             "ranks' gradients must be combined with a "
                                             "collective")
                    raise AssertionError(f"{where}: the result differs from the mean gradient "
                                         f"over all {n_total} examples computed in one process.")
                assert r["input_kept"], f"{where}: local_mean_grad was modified in place"

"""Data parallelism on real ranks: every number Module 2 states, against single-process references."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from course_utils.data_parallel import replicas as D
from course_utils import launch
from course_utils.runtime import clock as runtime_clock
from rank_jobs import job, run_jobs
from test_measure import _watch_clock, solo_group  # noqa: F401 (a fixture)

UNEQUAL = [(0, (1, 3)), (1, (1, 3)), (2, (2, 1, 5))]   # (seed, examples per rank)
UNEQUAL_LR, UNEQUAL_STEPS = 0.1, 40


def _update_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3, 4, generator=g).tolist(), torch.randn(4, generator=g).tolist()


def _normalization_grads(world_size):
    return torch.randn(world_size, 3, generator=torch.Generator().manual_seed(world_size)).tolist()


def _unequal_inputs(seed, counts):
    X, y = D.make_regression(seed, sum(counts))
    return X, y, D.split_by_counts(X, y, counts), torch.zeros(2, dtype=torch.float64)


@pytest.fixture(scope="module")
def ranks():
    """Every run of this file that ends on every rank and needs no printed output or timing of
    its own, one launch per world size: {key: each rank's result}."""
    jobs = {}  # key -> (world size, job)
    for seed in (0, 1):
        grads, w0 = _update_inputs(seed)
        jobs["update", seed] = 3, job(D.two_replica_update_worker, grads, w0, 0.05)
    for ws in (2, 4):
        for mode in ("sum_then_divide", "avg_op", "forgot_divide", "avg_then_divide"):
            jobs["normalization", ws, mode] = ws, job(D.normalization_worker,
                                                      _normalization_grads(ws), mode)
    jobs["lesson normalizations"] = 2, job(D.all_normalizations_worker, D.LESSON_GRADS)
    for seed, counts in UNEQUAL:
        _, _, shards, w0 = _unequal_inputs(seed, counts)
        for weighting in ("example_weighted", "mean_of_means"):
            jobs["unequal", seed, weighting] = len(counts), job(
                D.unequal_batch_worker, shards, w0, UNEQUAL_LR, UNEQUAL_STEPS, weighting)
    for seed in (0, 1, 2):
        for mode in ("scratch", "ddp"):
            jobs["dp", seed, mode] = 2, job(D.dp_train_worker, seed, mode)
    jobs["compare"] = 2, job(D.dp_compare_worker, [4, 5])
    for mode in ("scratch", "ddp"):
        jobs["dp4", mode] = 4, job(D.dp_train_worker, 3, mode)
    for seed in (0, 1):
        for use_no_sync in (False, True):
            jobs["no_sync", seed, use_no_sync] = 2, job(D.accumulation_worker, seed, 4,
                                                        use_no_sync)
    out = {}
    for ws in sorted({ws for ws, _ in jobs.values()}):
        keys = [k for k, (w, _) in jobs.items() if w == ws]
        out.update(zip(keys, run_jobs([jobs[k][1] for k in keys], ws, threads_per_rank=None)))
    return out

# ---------------------------------------------------------------------- one update, two ranks


def test_lesson_update_on_two_ranks(capsys):
    weights = launch.run(D.two_replica_update_worker, 2)
    for w in weights:
        torch.testing.assert_close(torch.tensor(w), torch.tensor([0.6, 0.8]))
    out = capsys.readouterr().out
    assert "[rank 0] local mean gradient [2, 4]" in out
    assert "[rank 1] local mean gradient [6, 0]" in out
    assert "[rank 1] after all_reduce(SUM): [8, 4]" in out
    assert "[rank 0] divided by D=2: [4, 2]; SGD lr=0.1: weights [0.6, 0.8]" in out
    mean, w = D.sgd_reference(D.LESSON_GRADS, D.LESSON_W0, D.LESSON_LR)
    assert mean == [4.0, 2.0]
    torch.testing.assert_close(torch.tensor(w), torch.tensor([0.6, 0.8]))


@pytest.mark.parametrize("seed", [0, 1])
def test_update_equals_reference_for_other_numbers(ranks, seed):
    grads, w0 = _update_inputs(seed)
    _, expected = D.sgd_reference(grads, w0, 0.05)
    for w in ranks["update", seed]:
        torch.testing.assert_close(torch.tensor(w), torch.tensor(expected))


@pytest.mark.parametrize("world_size", [2, 4])
def test_normalizations_and_their_bugs(ranks, world_size):
    mean = torch.tensor(_normalization_grads(world_size)).mean(0)
    for mode, factor in [("sum_then_divide", 1.0), ("avg_op", 1.0),
                         ("forgot_divide", world_size), ("avg_then_divide", 1 / world_size)]:
        for got in ranks["normalization", world_size, mode]:
            torch.testing.assert_close(torch.tensor(got), mean * factor, msg=mode)


def test_lesson_normalization_numbers(ranks):
    got, other = ranks["lesson normalizations"]
    assert got == other == {"sum_then_divide": [4.0, 2.0], "avg_op": [4.0, 2.0],
                   "forgot_divide": [8.0, 4.0], "avg_then_divide": [2.0, 1.0]}


# --------------------------------------------------------------------------- unequal batches


@pytest.mark.parametrize("seed, counts", UNEQUAL)
def test_example_weighted_equals_full_batch_and_mean_of_means_does_not(ranks, seed, counts):
    X, y, shards, w0 = _unequal_inputs(seed, counts)
    full = D.full_batch_train(X, y, w0, UNEQUAL_LR, UNEQUAL_STEPS)
    reweighted = D.weighted_train(shards, w0, UNEQUAL_LR, UNEQUAL_STEPS)
    weighted = torch.tensor(ranks["unequal", seed, "example_weighted"][0], dtype=torch.float64)
    naive = torch.tensor(ranks["unequal", seed, "mean_of_means"][0], dtype=torch.float64)
    torch.testing.assert_close(weighted, full)  # every step, to float rounding
    torch.testing.assert_close(naive, reweighted)  # the naive run optimizes the re-weighted loss
    assert (naive[-1] - full[-1]).abs().max() > 0.05  # ... which is a different objective


def test_minimizers_of_the_two_objectives_differ():
    X, y = D.make_regression(0, 4)
    shards = D.split_by_counts(X, y, (1, 3))
    full_min = D.least_squares_minimizer(shards, "example_weighted")
    naive_min = D.least_squares_minimizer(shards, "mean_of_means")
    torch.testing.assert_close(full_min, torch.linalg.lstsq(X, y[:, None]).solution[:, 0])
    assert (full_min - naive_min).abs().max() > 0.1
    w0 = torch.zeros(2, dtype=torch.float64)
    # long enough, each run converges to its own objective's minimum
    torch.testing.assert_close(D.full_batch_train(X, y, w0, 0.1, 400)[-1], full_min)
    torch.testing.assert_close(D.weighted_train(shards, w0, 0.1, 400)[-1], naive_min)


# ------------------------------------------------------------- DP from scratch vs DDP vs single


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scratch_dp_equals_ddp_equals_single_process(ranks, seed):
    ref_params, ref_losses = D.train_single(seed)
    for mode in ("scratch", "ddp"):
        for params, losses in ranks["dp", seed, mode]:
            torch.testing.assert_close(torch.tensor(params), ref_params, msg=mode)
            torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), msg=mode)


def test_compare_worker_runs_every_seed_and_mode(ranks):
    results = ranks["compare"]
    for seed in (4, 5):
        ref_params, _ = D.train_single(seed)
        for per_rank in results:
            for mode in ("scratch", "ddp"):
                torch.testing.assert_close(torch.tensor(per_rank[seed, mode][0]), ref_params)


def test_dp_on_four_ranks(ranks):
    ref_params, _ = D.train_single(3)
    for mode in ("scratch", "ddp"):
        for params, _ in ranks["dp4", mode]:
            torch.testing.assert_close(torch.tensor(params), ref_params, msg=mode)


@pytest.mark.parametrize("seed", [0, 1])
def test_no_sync_accumulation_equals_full_batch_with_one_allreduce_per_step(ranks, seed):
    ref, _ = D.train_single(seed, steps=2, global_batch=16)
    counts = {}
    for use_no_sync in (False, True):
        for out in ranks["no_sync", seed, use_no_sync]:
            torch.testing.assert_close(torch.tensor(out["params"]), ref)
            counts[use_no_sync] = out["allreduces"]
    assert counts == {False: 4.0, True: 1.0}


# ------------------------------------------------------------------------ what limits scaling


def test_straggler_makes_the_fast_rank_wait():
    delay = 0.15
    fast, slow = launch.run(D.straggler_worker, 2, 1, delay, show_output=False)
    assert slow["compute_s"] >= delay
    assert fast["wait_s"] >= 0.5 * delay  # the fast rank spends the delay inside all_reduce
    assert fast["wait_s"] > 5 * slow["wait_s"]
    assert fast["step_s"] >= 0.5 * delay  # so its step is as slow as the straggler's


def test_throughput_worker_returns_examples_per_second():
    (single,) = launch.run(D.throughput_worker, 1, 16, 2, 32, show_output=False)
    assert single > 0  # speed itself is measured in the notebook, never asserted here


def test_timing_workers_read_the_clock_through_runtime_clock(monkeypatch, solo_group):
    """straggler_worker and throughput_worker time with runtime.clock.clock (which synchronizes
    a CUDA device before reading perf_counter; a no-op on CPU), on the device of the timed
    tensors."""
    devices = _watch_clock(monkeypatch, runtime_clock)
    out = D.straggler_worker(0, 1, 0, 0.01, steps=3)
    assert devices == [torch.device("cpu")] * 3 * 3  # before compute, before and after the wait
    assert out["compute_s"] >= 0.01 and out["step_s"] >= out["compute_s"]
    devices.clear()
    assert D.throughput_worker(0, 1, per_rank_batch=4, steps=2, width=8) > 0
    assert devices == [torch.device("cpu")] * 2


# --------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("call, word", [
    (lambda: D.sgd_reference([], [1.0], 0.1), "local_grads"),
    (lambda: D.sgd_reference([[1.0], [1.0, 2.0]], [1.0], 0.1), "local_grads"),
    (lambda: D.sgd_reference([[1.0, 2.0]], [1.0], 0.1), "w0"),
    (lambda: D.two_replica_update_worker(0, 3), "world_size"),
    (lambda: D.normalization_worker(0, 2, D.LESSON_GRADS, "mean"), "mode"),
    (lambda: D.make_regression(0, 0), "n"),
    (lambda: D.make_regression(0, 4, dim=0), "dim"),
    (lambda: D.split_by_counts(torch.ones(4, 2), torch.ones(4), [1, 2]), "counts"),
    (lambda: D.split_by_counts(torch.ones(4, 2), torch.ones(4), [0, 4]), "counts"),
    (lambda: D.least_squares_minimizer([], "mean"), "weighting"),
    (lambda: D.unequal_batch_worker(0, 2, [], torch.zeros(2), 0.1, 1, "sum"), "weighting"),
    (lambda: D.unequal_batch_worker(0, 2, [], torch.zeros(2), 0.1, 1, "mean_of_means"),
     "shards"),
    (lambda: D.dp_train_worker(0, 2, 0, "fsdp"), "mode"),
    (lambda: D.dp_train_worker(0, 3, 0, "ddp", global_batch=8), "global_batch"),
    (lambda: D.straggler_worker(0, 2, 2, 0.1), "slow_rank"),
    (lambda: D.straggler_worker(0, 2, 1, -1.0), "delay_s"),
])
def test_bad_input_raises_value_error_naming_the_argument(call, word):
    with pytest.raises(ValueError, match=word):
        call()

"""Ring all-reduce from send/recv: equal to a sum for any size and 2-4 ranks, and its byte count."""

from __future__ import annotations

import random
import re

import pytest
import torch

from course_utils.collectives import primitives as C
from course_utils import launch
from course_utils.collectives import ring as R

# ------------------------------------------------------------------ workers (top level: picklable)


def _all_variants_worker(rank, world_size, inputs_per_size):
    """Every implementation on every input; results as lists (see course_utils.data_parallel.replicas)."""
    channels = R.open_channels(2)
    out = []
    for inputs in inputs_per_size:
        x = inputs[rank]
        row = {}
        for name, fn in [("simple", lambda t: R.ring_all_reduce_simple(t)),
                         ("fast", lambda t: R.ring_all_reduce(t)),
                         ("fast3", lambda t: R.ring_all_reduce(t, pieces=3)),
                         ("fast3x2", lambda t: R.ring_all_reduce(t, pieces=3, channels=channels))]:
            y = x.clone()
            stats = fn(y)
            row[name] = (y.tolist(), stats.bytes_sent, stats.bytes_received)
        out.append(row)
    return out


def _shaped_worker(rank, world_size):
    x = torch.full((3, 5), float(rank + 1), dtype=torch.float64)  # any shape, any float dtype
    R.ring_all_reduce(x)
    return x.tolist()


def _bad_pieces_worker(rank, world_size):
    try:
        R.ring_all_reduce(torch.ones(4), pieces=0)
    except ValueError as e:
        return str(e)
    return "no error"


# ----------------------------------------------------------------------------------- correctness


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_equals_sum_for_random_sizes(world_size):
    rng = random.Random(world_size)
    sizes = [0, 1, world_size - 1, world_size + 1, 2 * world_size] + [rng.randint(2, 300)
                                                                       for _ in range(3)]
    inputs_per_size = []
    for i, n in enumerate(sizes):
        g = torch.Generator().manual_seed(100 * world_size + i)
        inputs_per_size.append([torch.randn(n, generator=g) for _ in range(world_size)])
    results = launch.run(_all_variants_worker, world_size, inputs_per_size, timeout_s=120,
                         show_output=False)
    for i, n in enumerate(sizes):
        expected = torch.stack(inputs_per_size[i]).sum(0)  # (n,)
        for name in ("simple", "fast", "fast3", "fast3x2"):
            sent, received = [], []
            for rank in range(world_size):
                values, bytes_sent, bytes_received = results[rank][i][name]
                torch.testing.assert_close(torch.tensor(values), expected,
                                           msg=lambda m: f"{name} n={n} rank={rank}: {m}")
                sent.append(bytes_sent)
                received.append(bytes_received)
            assert sum(sent) == sum(received)  # every byte sent is received by the next rank
            # mean over ranks is exactly 2(D-1)/D x N x 4 bytes ...
            assert sum(sent) / world_size == pytest.approx(R.ring_bytes_per_rank(n, world_size))
            if n % world_size == 0:  # ... and every rank sends exactly that when D divides N
                assert set(sent) == {R.ring_bytes_per_rank(n, world_size)}


def test_phases_leave_reduced_shard_then_everything():
    world_size, n = 3, 7
    inputs = [torch.arange(n, dtype=torch.float32) * (r + 1) for r in range(world_size)]
    total = torch.stack(inputs).sum(0)
    bounds = C.shard_bounds(n, world_size)
    results = launch.run(R.ring_phases_worker, world_size, inputs, show_output=False)
    for rank, (phase1, phase2) in enumerate(results):
        lo, hi = bounds[(rank + 1) % world_size]
        torch.testing.assert_close(torch.tensor(phase1[lo:hi]), total[lo:hi])
        torch.testing.assert_close(torch.tensor(phase2), total)


def test_ring_keeps_shape_and_dtype():
    out = launch.run(_shaped_worker, 3, show_output=False)
    assert out[0] == [[6.0] * 5] * 3


def test_ring_worker_reports_bytes():
    inputs = [torch.ones(8), torch.ones(8)]
    for impl in ("fast", "simple"):
        results = launch.run(R.ring_worker, 2, inputs, impl, show_output=False)
        assert [r[0] for r in results] == [[2.0] * 8] * 2
        assert [r[1]["bytes_sent"] for r in results] == [32, 32]  # 2(2-1)/2 x 8 x 4


# ---------------------------------------------------------------------------------- byte counts


def test_ring_bytes_formula_numbers():
    assert R.ring_bytes_per_rank(10**6, 4) == 6_000_000  # 2 x 3/4 x 1e6 x 4
    assert R.ring_bytes_per_rank(10**6, 2) == 4_000_000  # D = 2: each rank sends N x 4 bytes
    assert R.ring_bytes_per_rank(16 * 2**20, 8, element_size=2) == 2 * 7 / 8 * 16 * 2**20 * 2
    # for large D each rank sends close to 2 x the buffer, never more
    assert R.ring_bytes_per_rank(1000, 1000) < 2 * 1000 * 4


def test_default_pieces_bounds():
    assert R.default_pieces(10, 2) == 1
    assert R.default_pieces(64 * 2**20 // 4, 2) == 16
    assert R.default_pieces(0, 3) == 1  # an empty tensor is a valid input to the ring


def test_default_pieces_for_the_lecture_sizes():
    """Lecture 2 times 64 KiB, 1 MiB and 4 MiB on 2 ranks: only 4 MiB is cut into pieces."""
    assert [R.default_pieces(nbytes // 4, 2) for nbytes in (2**16, 2**20, 2**22)] == [1, 1, 2]


@pytest.mark.parametrize("args, message", [
    ((-1, 2), "numel must be an int >= 0; got -1"),
    ((float("nan"), 2), "numel must be an int >= 0; got nan"),
    (("1000", 2), "numel must be an int >= 0; got '1000'"),
    ((1000.0, 2), "numel must be an int >= 0; got 1000.0"),
    ((1000, 0), "world_size must be an int >= 1; got 0"),
    ((1000, -2), "world_size must be an int >= 1; got -2"),
    ((1000, 2.5), "world_size must be an int >= 1; got 2.5"),
    ((1000, 2, 0), "element_size must be an int >= 1; got 0"),
    ((1000, 2, -4), "element_size must be an int >= 1; got -4"),
])
def test_default_pieces_rejects_bad_sizes_naming_the_argument(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        R.default_pieces(*args)


# ------------------------------------------------------------------------- alpha-beta time model


def test_ring_time_numbers():
    alpha, beta, n = 10e-6, 10e9, 10**9  # 10 us per message, 10 GB/s, 1 GB
    assert R.ring_time_s(n, 2, alpha, beta) == pytest.approx(2 * alpha + 0.1)  # 2 steps of n/2
    assert R.ring_time_s(n, 8, alpha, beta) == pytest.approx(14 * alpha + 2 * 7 / 8 * 0.1)
    assert R.ring_time_s(n, 1, alpha, beta) == 0.0  # one rank: nothing to send
    assert R.ring_time_s(0, 1, alpha, beta) == 0.0


def test_ring_time_latency_grows_with_d_bandwidth_does_not():
    alpha, beta, n = 10e-6, 10e9, 10**9
    for d in (2, 3, 8, 64, 1024, 8192):
        latency, bandwidth = R.ring_time_s(0, d, alpha, beta), R.ring_time_s(n, d, 0, beta)
        assert latency == pytest.approx(2 * (d - 1) * alpha)  # linear in D
        assert bandwidth == pytest.approx(R.ring_bytes_per_rank(n, d, element_size=1) / beta)
        assert bandwidth < 2 * n / beta  # bounded, whatever D
        assert R.ring_time_s(n, d, alpha, beta) == pytest.approx(latency + bandwidth)
    assert R.ring_time_s(0, 8192, alpha, beta) > R.ring_time_s(n, 8192, 0, beta) / 2


@pytest.mark.parametrize("args, word", [
    ((-1, 2, 1e-5, 1e10), "n_bytes must be a finite number >= 0; got -1"),
    ((float("nan"), 2, 1e-5, 1e10), "n_bytes must be a finite number >= 0; got nan"),
    (("1e9", 2, 1e-5, 1e10), "n_bytes must be a finite number >= 0; got '1e9'"),
    ((True, 2, 1e-5, 1e10), "n_bytes must be a finite number >= 0; got True"),
    ((1e9, 0, 1e-5, 1e10), "world_size must be an int >= 1; got 0"),
    ((1e9, 2.0, 1e-5, 1e10), "world_size must be an int >= 1; got 2.0"),
    ((1e9, 2, -1e-5, 1e10), "alpha_s must be a finite number >= 0; got -1e-05"),
    ((1e9, 2, float("inf"), 1e10), "alpha_s must be a finite number >= 0; got inf"),
    ((1e9, 2, 1e-5, 0), "bandwidth_bytes_per_s must be a finite number > 0; got 0"),
    ((1e9, 2, 1e-5, float("nan")), "bandwidth_bytes_per_s must be a finite number > 0; got nan"),
])
def test_ring_time_rejects_bad_input_naming_the_argument(args, word):
    with pytest.raises(ValueError, match=re.escape(word)):
        R.ring_time_s(*args)


def test_bandwidth_worker_smoke():
    times = launch.run(R.bandwidth_worker, 2, [4096, 65536], 2, None, True,
                       show_output=False)[0]
    assert set(times) == {"ring", "gloo", "simple"}
    assert all(len(v) == 2 and all(t > 0 for t in v) for v in times.values())


# --------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("call, word", [
    (lambda: R.ring_bytes_per_rank(-1, 2), "numel"),
    (lambda: R.ring_bytes_per_rank(10, 0), "world_size"),
    (lambda: R.ring_bytes_per_rank(10, 2, element_size=0), "element_size"),
    (lambda: R.ring_bytes_per_rank(10.0, 2), "numel"),
    (lambda: R.ring_all_reduce([1.0, 2.0]), "tensor"),
    (lambda: R.ring_all_reduce(torch.ones(4, 4).t()), "contiguous"),
    (lambda: R.ring_all_reduce(torch.ones(4, dtype=torch.int64)), "floating-point"),
    (lambda: R.open_channels(0), "n"),
    (lambda: R.ring_worker(0, 1, [torch.ones(2)], "fastest"), "implementation"),
])
def test_bad_input_raises_value_error_naming_the_argument(call, word):
    with pytest.raises(ValueError, match=word):
        call()


def test_bad_pieces_on_real_ranks():
    assert launch.run(_bad_pieces_worker, 2, show_output=False) == [
        "pieces must be an int >= 1; got 0"] * 2


def test_torchrun_check_worker_agrees_with_gloo():
    for out in launch.run(R.ring_check_worker, 3, 100, show_output=False):
        assert out["equal"]
        assert out["formula_mean_over_ranks"] == R.ring_bytes_per_rank(100, 3)

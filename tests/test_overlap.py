"""course_utils.data_parallel.overlap: bucketed all-reduce during backward equals DDP and one process on real
gloo ranks; the bucket assignment matches a hand count; the timing worker returns a sane table.
Speed is measured in benchmarks (benchmarks/overlap_buckets.py), not asserted here."""

from __future__ import annotations

import math

import pytest
import torch

from course_utils import launch
from course_utils.data_parallel import overlap

MIB = 2 ** 20


@pytest.mark.parametrize("seed", [0, 1])
def test_hand_made_buckets_equal_ddp_and_one_process(seed):
    """Two bucket sizes (0.01 MiB: one bucket per layer; 0.02 MiB: two layers each) and one
    all-reduce after backward; DDP with the same bucket_cap_mb; the full batch in one process."""
    sizes = (0.01, 0.02, None)
    runs = launch.run(overlap.grads_worker, 2, seed, sizes, 64, 3, 8, timeout_s=90,
                      show_output=False, backend="gloo")
    ref = overlap.reference_grads(seed, width=64, depth=3, global_batch=8)
    for run in runs:
        assert [len(b) for b in run["buckets"]] == [3, 2, 1]
        for i in range(len(sizes)):
            for kind in ("hand", "ddp"):
                assert set(run[kind][i]) == set(ref)
                for name, g in ref.items():
                    torch.testing.assert_close(torch.from_numpy(run[kind][i][name]), g)
    # the ranks saw different examples: their local gradients differ, the averaged ones do not
    local = overlap.reference_grads(seed, width=64, depth=3, global_batch=4)
    assert not torch.allclose(local["0.weight"], ref["0.weight"])


def test_check_grads_lines():
    assert overlap.check_grads(seeds=(2,), bucket_mbs=(0.01,)) == [
        "seed 2, 0.01 MiB (3 buckets): by hand == DDP == one process on every rank"]


def test_bucket_assignment_by_hand():
    # parameters in order: a 1 MiB weight, a 1 KiB bias, a 2 MiB weight, a 1 KiB bias
    sizes = [("w1", MIB), ("b1", 1024), ("w2", 2 * MIB), ("b2", 1024)]
    # reverse order b2, w2, b1, w1; a bucket closes once it reaches the cap
    assert overlap.bucket_assignment(sizes, 1.0) == [["b2", "w2"], ["b1", "w1"]]
    assert overlap.bucket_assignment(sizes, 2.0) == [["b2", "w2"], ["b1", "w1"]]
    assert overlap.bucket_assignment(sizes, 2.5) == [["b2", "w2", "b1", "w1"]]
    assert overlap.bucket_assignment(sizes, 0.0005) == [["b2"], ["w2"], ["b1"], ["w1"]]
    assert overlap.bucket_assignment(sizes, None) == [["b2", "w2", "b1", "w1"]]
    assert overlap.bucket_copy_bytes(sizes, 1.0) == [2 * MIB + 1024, MIB + 1024]


def test_bucket_assignment_of_the_lecture_model():
    """MLP 256 wide, 32 layers: each layer is 256*256*4 + 256*4 = 263,168 bytes (just over
    0.25 MiB), so 0.25 MiB buckets hold one layer, 1 MiB buckets four, 4 MiB sixteen."""
    sizes = overlap.param_sizes(overlap.make_mlp(width=256, depth=32))
    assert len(sizes) == 64 and sum(b for _, b in sizes) == 32 * 263_168
    layer = [b for _, b in sizes[:2]]
    assert layer == [256 * 256 * 4, 256 * 4]
    for mb, per_bucket in [(0.25, 1), (1.0, 4), (4.0, 16), (25.0, 32)]:
        buckets = overlap.bucket_assignment(sizes, mb)
        assert len(buckets) == 32 // per_bucket
        assert buckets[0][:2] == ["62.bias", "62.weight"]   # the last layer comes first
        assert all(len(b) == 2 * per_bucket for b in buckets)


def test_the_hooks_launch_in_bucket_order_during_backward():
    """One rank: each bucket's all-reduce starts inside backward, when its last gradient exists,
    in bucket order; with bucket_mb=None nothing starts before finish()."""
    def worker(rank, world_size):
        import torch as t

        from course_utils.data_parallel import overlap as ov

        model = ov.make_mlp(width=16, depth=3)
        x, y = ov.make_batch(4, 16)
        started = []
        out = {}
        for mb in (0.00001, None):
            reducer = ov.BucketAllReduce(model, mb)
            real = reducer._launch
            reducer._launch = lambda i, real=real: (started.append(i), real(i))
            model.zero_grad(set_to_none=True)
            t.nn.functional.mse_loss(model(x), y).backward()
            out[str(mb)] = list(started)
            reducer.finish()
            reducer.remove()
            started.clear()
        return out

    (got,) = launch.run(worker, 1, timeout_s=60, show_output=False)
    assert got == {"1e-05": [0, 1, 2, 3, 4, 5], "None": []}


def test_simulated_timeline():
    grad = [MIB] * 8                        # 8 layers of 1 MiB
    cost = dict(backward_s=8.0, latency_s=0.5, bytes_per_s=MIB)  # 1 s per MiB per all-reduce
    after = overlap.simulate(grad, bucket_mb=None, **cost)
    assert after["comm"] == [(8.0, 16.5)] and after["exposed_s"] == 8.5
    per_layer = overlap.simulate(grad, bucket_mb=1.0, **cost)
    # layer k ready at k s; each all-reduce takes 1.5 s, so they queue: the last ends at 1 + 8 x 1.5
    assert per_layer["comm"][0] == (1.0, 2.5) and per_layer["step_s"] == 13.0
    two = overlap.simulate(grad, bucket_mb=2.0, **cost)   # ready at 2, 4, 6, 8; 2.5 s each
    assert two["comm"] == [(2.0, 4.5), (4.5, 7.0), (7.0, 9.5), (9.5, 12.0)]
    assert two["exposed_s"] == 4.0
    assert overlap.simulate(grad, bucket_mb=2.0, backward_s=8.0, latency_s=0.0,
                            bytes_per_s=1e12)["exposed_s"] < 1e-5  # free network: all hidden


def test_timing_worker_returns_a_sane_table():
    rows = overlap.measure_overlap(bucket_mbs=(0.01, None), steps=2, warmup=1, width=64,
                                   depth=3, batch=8, timeout_s=90)
    assert [r["bucket_mb"] for r in rows] == [0.01, None]
    assert [r["n_buckets"] for r in rows] == [3, 1]
    for r in rows:
        for k in ("step_ms", "compute_ms", "comm_ms", "wait_ms"):
            assert math.isfinite(r[k]) and r[k] > 0, (k, r)
    table = overlap.format_table(rows).splitlines()
    assert table[0].split() == ["bucket", "buckets", "step", "compute", "comm", "wait"]
    assert table[2].split()[:3] == ["after", "backward", "1"]


@pytest.mark.parametrize("call, match", [
    (lambda: overlap.bucket_assignment([("w", 4)], 0), "bucket_mb"),
    (lambda: overlap.bucket_assignment([("w", 4)], -1.0), "bucket_mb"),
    (lambda: overlap.bucket_assignment([("w", 4)], "1"), "bucket_mb"),
    (lambda: overlap.bucket_assignment([("w", 4)], float("nan")), "bucket_mb"),
    (lambda: overlap.bucket_assignment([], 1.0), "sizes"),
    (lambda: overlap.make_mlp(width=0), "width"),
    (lambda: overlap.make_mlp(depth=2.0), "depth"),
    (lambda: overlap.make_batch(0), "n"),
    (lambda: overlap.BucketAllReduce(overlap.make_mlp(8, 1), bucket_mb=True), "bucket_mb"),
    (lambda: overlap.measure_overlap(bucket_mbs=[]), "bucket_mbs"),
    (lambda: overlap.measure_overlap(bucket_mbs=(1.0,), world_size=0), "world_size"),
    (lambda: overlap.timing_worker(0, 1, (1.0,), steps=0), "steps"),
    (lambda: overlap.simulate([4], backward_s=0.0, bucket_mb=1.0, latency_s=0.0,
                              bytes_per_s=1.0), "backward_s"),
    (lambda: overlap.simulate([4], backward_s=float("nan"), bucket_mb=1.0, latency_s=0.0,
                              bytes_per_s=1.0), "backward_s"),
    (lambda: overlap.simulate([], backward_s=1.0, bucket_mb=1.0, latency_s=0.0,
                              bytes_per_s=1.0), "grad_bytes"),
    (lambda: overlap.simulate([4, -4], backward_s=1.0, bucket_mb=1.0, latency_s=0.0,
                              bytes_per_s=1.0), "grad_bytes"),
    (lambda: overlap.simulate([4], backward_s=1.0, bucket_mb=1.0, latency_s=-1.0,
                              bytes_per_s=1.0), "latency_s"),
    (lambda: overlap.bucket_assignment([("w", -4)], 1.0), "sizes"),
    (lambda: overlap.bucket_assignment([("w", 4.5)], 1.0), "sizes"),
    (lambda: overlap.param_sizes("model"), "model"),
    (lambda: overlap.ddp_buckets((None,), steps=0), "steps"),
    (lambda: overlap.ddp_buckets([]), "bucket_mbs"),
    (lambda: overlap.ddp_buckets((None,), static_graph=True), "static_graph"),
    (lambda: overlap.ddp_buckets((None,), static_graph=()), "static_graph"),
    (lambda: overlap.ddp_buckets((None,), width=0), "width"),
    (lambda: overlap.make_mlp(seed=-1), "seed"),
    (lambda: overlap.make_batch(4, seed=2.5), "seed"),
    (lambda: overlap.reference_grads(global_batch=0), "global_batch"),
    (lambda: overlap.check_grads(width=0), "width"),          # before any rank is launched
    (lambda: overlap.check_grads(seeds=[0, -1]), "seeds"),
    (lambda: overlap.measure_overlap(steps=0), "steps"),
    (lambda: overlap.measure_overlap(warmup=-1), "warmup"),
    (lambda: overlap.measure_overlap(batch=2.5), "batch"),
    (lambda: overlap.BucketAllReduce([torch.zeros(2)], bucket_mb=1.0), "model"),
])
def test_bad_input_raises_value_error_naming_it(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_real_ddp_buckets_match_the_course_rule_after_its_first_step():
    """Real DDP's buckets, read by a comm hook on 2 gloo ranks: the first step all-reduces one
    bucket (DDP buckets by gradient-ready order only after it), then with bucket_cap_mb=1 the
    buckets are :func:`overlap.bucket_copy_bytes`'s; left unset, the first bucket is capped at
    ``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB) and the rest at 25 MiB: two buckets here."""
    import torch.distributed as dist

    got = overlap.ddp_buckets((None, 1.0), steps=3, static_graph=(False, True))
    sizes = overlap.param_sizes(overlap.make_mlp(256, 32))
    total = sum(b for _, b in sizes)
    assert got["DDP default"][0] == [total] and got["bucket_cap_mb=1"][0] == [total]
    assert got["bucket_cap_mb=1"][1] == overlap.bucket_copy_bytes(sizes, 1.0)
    assert dist._DEFAULT_FIRST_BUCKET_BYTES == overlap.MIB
    first = overlap.bucket_copy_bytes(sizes, 1.0)[0]
    assert got["DDP default"][1] == [first, total - first] == [1_052_672, 7_368_704]
    assert got["DDP default"][2] == got["DDP default"][1]
    # static_graph=True: the first step records the graph, the second still runs one bucket,
    # the buckets are rebuilt from the third step on (the lecture's figures)
    assert got["DDP default, static_graph"] == [[total], [total], [first, total - first]]
    assert got["bucket_cap_mb=1, static_graph"][2] == overlap.bucket_copy_bytes(sizes, 1.0)

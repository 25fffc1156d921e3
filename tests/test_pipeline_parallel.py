"""Tests for course_utils.pipeline.runtime: real gloo pipelines equal the unsplit model."""

from __future__ import annotations

import pytest
import torch

from course_utils.pipeline import runtime as pp
from course_utils.pipeline import schedule as ps
from rank_jobs import job, run_jobs

WIDTH, DEPTH, MB = 16, 4, 3
SCHEDULES, SEEDS, M = ("gpipe", "1f1b"), (0, 1), 4


@pytest.fixture(scope="module")
def runs():
    """Every pipeline run of this file but the timed ones, one launch per number of stages:
    {("mine" | "theirs", schedule, p, seed): each rank's result} (the from-scratch
    pipeline_worker and torch's, m = 4), ("uneven", m): 3 stages of 6 layers, and
    "torch order": torch's 1F1B for 2 steps."""
    jobs = {}  # key -> (stages, job)
    for p in (2, 4):
        for schedule in SCHEDULES:
            for seed in SEEDS:
                args = (schedule, M, seed, MB, WIDTH, DEPTH)
                jobs["mine", schedule, p, seed] = p, job(pp.pipeline_worker, *args)
                jobs["theirs", schedule, p, seed] = p, job(pp.torch_pipeline_worker, *args)
    for m in (1, 6):
        jobs["uneven", m] = 3, job(pp.pipeline_worker, "1f1b", m, 5, MB, WIDTH, 6)
    jobs["torch order"] = 2, job(pp.torch_pipeline_worker, "1f1b", M, 0, MB, WIDTH, DEPTH, 2)
    out = {}
    for p in sorted({p for p, _ in jobs.values()}):
        keys = [k for k, (stages, _) in jobs.items() if stages == p]
        out.update(zip(keys, run_jobs([jobs[k][1] for k in keys], p, threads_per_rank=None)))
    return out


def _assert_matches_reference(results, seed, p, m):
    loss, grads = pp.reference_step(seed, m * MB, WIDTH, DEPTH, p)
    assert results[-1]["loss"] == pytest.approx(loss, abs=1e-6)
    for rank in range(p - 1):
        assert results[rank]["loss"] is None
    for rank in range(p):
        assert len(results[rank]["grads"]) == len(grads[rank])
        for got, want in zip(results[rank]["grads"], grads[rank]):
            torch.testing.assert_close(torch.as_tensor(got), want, atol=1e-6, rtol=1e-5)


def test_split_stages_and_bounds():
    assert pp.stage_bounds(8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert pp.stage_bounds(5, 2) == [(0, 3), (3, 5)]
    model = pp.make_model(0, 16, 8)
    stages = pp.split_stages(model, 4)
    assert [sum(q.numel() for q in st.parameters()) for st in stages] == [544] * 4
    x, _ = pp.make_batch(0, 5, 16)
    h = x
    for st in stages:
        h = st(h)
    torch.testing.assert_close(h, model(x))  # stages in sequence = the model
    with pytest.raises(ValueError, match="p must be at most depth"):
        pp.stage_bounds(2, 3)
    with pytest.raises(ValueError, match="nn.Sequential"):
        pp.split_stages(torch.nn.Linear(2, 2), 1)
    with pytest.raises(ValueError, match="width"):
        pp.make_model(0, 0, 4)
    with pytest.raises(ValueError, match="batch"):
        pp.make_batch(0, 0)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("p", [2, 4])
def test_send_recv_pipeline_equals_unpipelined(runs, schedule, p):
    for seed in SEEDS:
        m = M
        results = runs["mine", schedule, p, seed]
        _assert_matches_reference(results, seed, p, m)
        tl = pp.records_to_timeline([r["records"][0] for r in results], schedule, m)
        tl.check()  # real timestamps: no overlap on a rank, every input before its use


def test_send_recv_pipeline_more_microbatches_than_ranks_and_single_microbatch(runs):
    for m in (1, 6):
        results = runs["uneven", m]
        loss, grads = pp.reference_step(5, m * MB, WIDTH, 6, 3)
        assert results[-1]["loss"] == pytest.approx(loss, abs=1e-6)
        for rank in range(3):
            for got, want in zip(results[rank]["grads"], grads[rank]):
                torch.testing.assert_close(torch.as_tensor(got), want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("p", [2, 4])
def test_torch_pipelining_equals_unpipelined_and_scratch(runs, schedule, p):
    for seed in SEEDS:
        m = M
        theirs = runs["theirs", schedule, p, seed]
        _assert_matches_reference(theirs, seed, p, m)
        mine = runs["mine", schedule, p, seed]
        for rank in range(p):
            for a, b in zip(mine[rank]["grads"], theirs[rank]["grads"]):
                torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b),
                                           atol=1e-6, rtol=1e-5)
        tl = pp.records_to_timeline([r["records"][0] for r in theirs], schedule, m)
        tl.check()  # torch's schedule, timestamped through the wrapped stage


def test_torch_1f1b_order_matches_simulator_order(runs):
    """The ops torch's Schedule1F1B ran on each rank come in the order schedule_order gives."""
    p, m = 2, M
    res = runs["torch order"]
    order = ps.schedule_order("1f1b", p, m)
    for rank in range(p):
        for step in range(2):
            ran = [(kind, mb, 0) for kind, mb, _, _ in res[rank]["records"][step]]
            assert ran == order[rank]


def test_workers_bad_input():
    with pytest.raises(ValueError, match="schedule"):
        pp.pipeline_worker(0, 1, "zero-bubble")
    with pytest.raises(ValueError, match="op_time_s"):
        pp.pipeline_worker(0, 1, "gpipe", 2, op_time_s=-1)
    with pytest.raises(ValueError, match="schedule"):
        pp.torch_pipeline_worker(0, 1, "interleaved")
    with pytest.raises(ValueError, match="impl"):
        pp.measure_bubble(2, [1], impl="jax")
    with pytest.raises(ValueError, match="ms"):
        pp.measure_bubble(2, [])
    with pytest.raises(ValueError, match=r"ms\[0\] must be"):
        pp.measure_bubble(2, [0])
    with pytest.raises(ValueError, match="sizes"):
        pp.matmul_throughput([])
    with pytest.raises(ValueError, match="sizes"):
        pp.run_student_pipeline(lambda *a: None, 2, 0, [])
    with pytest.raises(ValueError, match="weighting"):
        pp.microbatch_reference(0, [2, 1], weighting="mean")


def test_measured_bubble_follows_the_formula():
    """The lecture's claims: measured bubble shrinks with m and is not below the formula."""
    rows = pp.measure_bubble(2, [1, 8], op_time_s=0.01, steps=2, timeout_s=120)
    m1, m8 = rows
    assert m1["formula"] == 0.5 and m8["formula"] == pytest.approx(1 / 9)
    assert m1["measured"] > m8["measured"]
    for row in rows:
        assert row["measured"] >= row["formula"] - 0.05
        row["timeline"].check()


def test_matmul_throughput_shapes():
    out = pp.matmul_throughput([1, 64], width=64, min_time_s=0.005)
    assert len(out) == 2 and all(g > 0 for g in out)

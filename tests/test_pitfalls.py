"""Assignment a10 part 2's broken programs (an instructor's test: its fixes are a10's answers).

Each broken program misbehaves on real ranks as the assignment says: the kernel's check
(``pitfalls.check``) describes the symptom without naming the cause, and the a10 judge
(``diagnose_fix``) names it; a right fix equals one process over seeds and world sizes; each
mistake a fix can still make is named; the hang ends in bounded time with both ranks' lines
shown; and what the assignment says of gloo's AVG and of ``DataLoader`` is what torch 2.13
does."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time

import pytest
import torch
import torch.distributed as dist

from course_utils import launch
from course_utils.data_parallel import pitfalls
from grading import judge

JUDGE = judge.load("a10_capstone")


def _fix(name: str, *, scale: bool = True, sync_once: bool = True, op: str = "sum-global",
         epoch: str = "start", rank_seed: bool = False):
    """A fixed worker for program ``name``, with one of the mistakes a fix can make switched on:
    ``scale`` (accumulation: divide by k), ``sync_once`` (no_sync for all but the last),
    ``op`` (padded_sequences: "sum-global" right, "avg-global" averages the ranks' shares,
    "sum-local" sums the ranks' own means), ``epoch`` ("start", "end": set after the epoch,
    "never"), ``rank_seed`` (each rank shuffles with seed + rank)."""
    from course_utils.runtime import backend

    def average(model, world_size):
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size

    def worker(rank, world_size, job):
        model = job.model()
        extra = {}
        if name == "accumulation":
            model = job.ddp(model)
            extra["all_reduces"] = []
        opt = job.optimizer(model)
        if name == "loss_logging":
            metrics = backend.new_group(list(range(world_size)))
            extra["logged"] = []
        if name == "epochs":
            from torch.utils.data import DataLoader, DistributedSampler

            data = job.dataset()
            sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True,
                                         seed=job.seed + (rank if rank_seed else 0))
            loader = DataLoader(data, batch_size=job.rows, sampler=sampler)
            extra["seen"] = []
            for e in range(job.epochs):
                if epoch == "start":
                    sampler.set_epoch(e)
                for index, x, y in loader:
                    extra["seen"].append(index.tolist())
                    job.loss(model, x, y).backward()
                    average(model, world_size)
                    opt.step()
                    opt.zero_grad()
                if epoch == "end":
                    sampler.set_epoch(e)
            return job.result(model, **extra)
        for step in range(job.steps):
            x, y, mask = job.shard(job.batch(step), rank)
            if name == "padded_sequences":
                total = mask.sum()
                if op != "sum-local":
                    dist.all_reduce(total)
                per_token = job.token_losses(model, x, y)
                loss = (per_token * mask).sum() / (mask.sum() if op == "sum-local" else total)
                loss.backward()
                for p in model.parameters():
                    dist.all_reduce(p.grad, op=dist.ReduceOp.AVG if op == "avg-global"
                                    else dist.ReduceOp.SUM)
            elif name == "accumulation":
                before, k = job.all_reduces(model), job.accumulation
                for i, (xm, ym) in enumerate(zip(x.chunk(k), y.chunk(k))):
                    quiet = model.no_sync() if sync_once and i < k - 1 else contextlib.nullcontext()
                    with quiet:
                        (job.loss(model, xm, ym) / (k if scale else 1)).backward()
                extra["all_reduces"].append(job.all_reduces(model) - before)
            else:
                loss = job.loss(model, x, y)
                loss.backward()
                if name == "loss_logging":
                    extra["logged"].append(pitfalls.log_mean(loss, metrics))
                average(model, world_size)
            opt.step()
            opt.zero_grad()
        return job.result(model, **extra)
    return worker


BROKEN = [("dp_by_hand", "sum over the D replicas"),
          ("padded_sequences", "the ranks' means were averaged"),
          ("accumulation", "divided by their number"),
          ("epochs", "same rows in the same order in every epoch")]
# words of a cause, which the kernel's check must never print (Q4-Q8 ask for the cause)
CAUSES = ["sum", "replica", "averaged", "mean of", "divided", "no_sync", "set_epoch",
          "epoch must", "microbatch"]


@pytest.mark.parametrize("name,words", BROKEN, ids=[b[0] for b in BROKEN])
def test_each_broken_program_shows_a_symptom_and_the_judge_names_its_cause(name, words):
    job = pitfalls.JOBS[name]
    results = pitfalls.run(pitfalls.PROGRAMS[name], job)
    with pytest.raises(AssertionError) as symptom:
        pitfalls.check(name, job, results)
    assert not [w for w in CAUSES if w in str(symptom.value)], str(symptom.value)
    with pytest.raises(AssertionError, match=words):
        JUDGE.diagnose_fix(name, job, results)


def test_the_accumulation_program_all_reduces_every_microbatch():
    """The broken program's DDP all-reduces k times a step; the fix once (DDP's one bucket)."""
    job = pitfalls.JOBS["accumulation"]
    broken = pitfalls.run(pitfalls.PROGRAMS["accumulation"], job)
    assert [r["all_reduces"] for r in broken] == [[job.accumulation] * job.steps] * 2
    fixed = pitfalls.run(_fix("accumulation"), job)
    assert [r["all_reduces"] for r in fixed] == [[1] * job.steps] * 2


def test_the_hang_ends_in_bounded_time_showing_each_ranks_line(capsys):
    """loss_logging deadlocks: rank 0 in the metrics group's all-reduce, rank 1 in the
    gradients'; the demonstration (its ranks' start warmed first, then 3 s) names both ranks
    and shows the program's own lines."""
    t0 = time.monotonic()
    assert pitfalls.demo("loss_logging") is None
    assert time.monotonic() - t0 < 30
    text = capsys.readouterr().out
    assert text.startswith("loss_logging on 2 ranks: no result after 3 s."), text[:300]
    rank0, rank1 = text.split("--- rank 1 ---")
    assert "in log_mean" in rank0 and "dist.all_reduce(t, group=group)" in rank0
    assert "in log_mean" not in rank1 and "dist.all_reduce(p.grad)" in rank1
    assert "pitfalls.py" in rank1


CASES = [("dp_by_hand", {}), ("padded_sequences", {"ragged": True}),
         ("accumulation", {"accumulation": 2, "rows": 4}), ("epochs", {"epochs": 3}),
         ("loss_logging", {})]


@pytest.mark.parametrize("name,kw", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("seed,world", [(101, 3), (202, 2)])
def test_a_right_fix_equals_one_process(name, kw, seed, world):
    if name == "accumulation" and world == 2:
        kw = {"accumulation": 3, "rows": 6}
    job = pitfalls.Job(seed=seed, world_size=world, **kw)
    results = pitfalls.run(_fix(name), job)
    pitfalls.check(name, job, results)
    JUDGE.diagnose_fix(name, job, results)
    want = pitfalls.one_device(job, order=pitfalls.sampler_order(job)
                               if name == "epochs" else None)
    for r in results:
        for n, w in want["weights"].items():
            torch.testing.assert_close(torch.as_tensor(r["weights"][n]), w,
                                       rtol=pitfalls.TOLERANCE[0], atol=pitfalls.TOLERANCE[1])


FIX_MISTAKES = [
    ("padded_sequences", {"ragged": True}, dict(op="avg-global"), "1/D of the mean"),
    ("padded_sequences", {"ragged": True}, dict(op="sum-local"), "means were summed"),
    ("accumulation", {"accumulation": 3, "rows": 6}, dict(scale=False, sync_once=True),
     "divided by their number"),
    ("accumulation", {"accumulation": 3, "rows": 6}, dict(sync_once=False),
     "after every microbatch's backward"),
    ("epochs", {"epochs": 3}, dict(epoch="end"), "one epoch late"),
    ("epochs", {"epochs": 3}, dict(rank_seed=True), "a seed of its own"),
]


@pytest.mark.parametrize("name,kw,mistake,words", FIX_MISTAKES,
                         ids=[f"{m[0]}-{next(iter(m[2].items()))}" for m in FIX_MISTAKES])
def test_each_mistake_of_a_fix_is_named(name, kw, mistake, words):
    job = pitfalls.Job(seed=7, world_size=2, **kw)
    with pytest.raises(AssertionError, match=words):
        JUDGE.diagnose_fix(name, job, pitfalls.run(_fix(name, **mistake), job))


def _one_process_weights(rank, world_size, job):
    """A cheat: every rank returns one process's weights, computed on the rank, never trained."""
    return {"weights": {n: w.numpy() for n, w in pitfalls.one_device(job)["weights"].items()}}


def test_a_fix_that_never_communicates_fails_the_per_rank_check():
    job = pitfalls.JOBS["dp_by_hand"]
    results = pitfalls.run(_one_process_weights, job)
    assert results[0]["all_reduce_calls"] == 0
    with pytest.raises(AssertionError, match="called dist.all_reduce 0 times in 3 steps"):
        pitfalls.check("dp_by_hand", job, results)


def test_what_the_assignment_says_of_gloos_avg():
    """torch 2.13, gloo: AVG of float32 is SUM / D to the bit; it adds first (float16 overflows
    where the mean would fit); integer tensors are refused."""
    found = pitfalls.gloo_avg(world_size=3)
    assert found["float32 AVG == SUM / D, bit for bit"] is True
    assert found["float16 AVG of 40000 on every rank"] == float("inf")
    assert str(found["int64 AVG"]).startswith("RuntimeError: result type Float can't be cast")


def test_a_dataloader_with_a_sampler_refuses_shuffle():
    """The a10 judge's message for "loader-shuffle" says so."""
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    data = TensorDataset(torch.arange(8))
    with pytest.raises(ValueError, match="mutually exclusive with shuffle"):
        DataLoader(data, sampler=DistributedSampler(data, num_replicas=2, rank=0), shuffle=True)


def test_the_sampler_rule_is_distributed_samplers():
    """sampler_order, from the rule alone, equals DistributedSampler told each epoch."""
    from torch.utils.data import DistributedSampler

    job = pitfalls.Job(seed=9, world_size=3, epochs=2)
    data = job.dataset()
    for rank in range(3):
        sampler = DistributedSampler(data, num_replicas=3, rank=rank, seed=job.seed)
        rows = []
        for epoch in range(job.epochs):
            sampler.set_epoch(epoch)
            mine = list(sampler)
            rows += [mine[i:i + job.rows] for i in range(0, len(mine), job.rows)]
        assert pitfalls.sampler_order(job)[rank] == rows


def test_the_judge_draws_k_apart_from_d():
    for seed in range(200):
        [case] = JUDGE.HIDDEN_CASES["q6_fix_test"](random.Random(seed))
        assert case["accumulation"] != case["world_size"]
        pitfalls.Job(**case)   # a valid job


@pytest.mark.parametrize("kwargs,match", [
    (dict(rows=5, accumulation=2), "accumulation"), (dict(world_size=0), "world_size"),
    (dict(lr=-1.0), "lr"), (dict(ragged=1), "ragged"), (dict(seed=-1), "seed")])
def test_a_bad_job_is_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pitfalls.Job(**kwargs)


def test_bad_arguments_and_malformed_results_are_named():
    with pytest.raises(ValueError, match="name must be one of"):
        pitfalls.show("nope")
    with pytest.raises(ValueError, match="job must be a pitfalls.Job"):
        pitfalls.run(pitfalls.dp_by_hand, {"seed": 1})
    job = pitfalls.JOBS["dp_by_hand"]
    for bad, words in [(None, "one result per rank"), ([{}, {}], "returned no weights"),
                       ([{"weights": {"w": [1.0]}}] * 2, "not arrays")]:
        with pytest.raises(AssertionError, match=words):
            pitfalls.check("dp_by_hand", job, bad)
    results = [{"weights": {}, "all_reduce_calls": 9}] * 2
    with pytest.raises(AssertionError, match="did not return its 'seen'"):
        pitfalls.check("epochs", dataclasses.replace(job, epochs=2), results)


def _recorded_logging(rank, world_size, job):
    """loss_logging with every all-reduce recorded (group, shape) instead of run."""
    calls = []
    real = dist.all_reduce

    def record(tensor, *args, group=None, **kwargs):
        calls.append(("default" if group is None else "metrics", tuple(tensor.shape)))
    dist.all_reduce = record
    try:
        pitfalls.loss_logging(rank, world_size, job)
    finally:
        dist.all_reduce = real
    return calls


def _async_logging(rank, world_size, job):
    """loss_logging with the metrics all-reduce started asynchronously and waited for after the
    gradients' all-reduces: the same calls, in the same per-group order."""
    from course_utils.runtime import backend

    metrics = backend.new_group(list(range(world_size)))
    model = job.model()
    opt = job.optimizer(model)
    logged = []
    for step in range(job.steps):
        x, y, _ = job.shard(job.batch(step), rank)
        loss = job.loss(model, x, y)
        loss.backward()
        t = loss.detach().clone()
        work = dist.all_reduce(t, group=metrics, async_op=True) if rank == 0 else None
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        if rank != 0:
            work = dist.all_reduce(t, group=metrics, async_op=True)
        work.wait()
        logged.append(t.item() / world_size)
        opt.step()
        opt.zero_grad()
    return job.result(model, logged=logged)


def test_the_hang_is_the_interleaving_of_blocking_calls_not_each_groups_order():
    """What a10 Q8's answer says: in loss_logging every rank issues the same calls on each group
    in the same order; only the interleaving of the two groups differs (rank 0 enters the
    metrics group first). The same program with the metrics all-reduce non-blocking ends,
    and logs one process's mean losses."""
    job = pitfalls.JOBS["loss_logging"]
    calls = launch.run(_recorded_logging, 2, job, timeout_s=60)
    for group in ("default", "metrics"):
        assert [c for c in calls[0] if c[0] == group] == [c for c in calls[1] if c[0] == group]
    assert calls[0][0][0] == "metrics" and calls[1][0][0] == "default"
    pitfalls.check("loss_logging", job, pitfalls.run(_async_logging, job), label="async")

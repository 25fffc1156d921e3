"""Module 10's 3-D trainer: every rank's tensors against one process, on several meshes.

The 8-rank runs (DP 2 x PP 2 x TP 2: 20 steps fp32 and 5 steps bf16, two seeds each, and the
PyTorch-parts version beside the hand-built one) are made once per file, in one launch; the
4-rank runs (the meshes that drop one axis each, the layouts of the vocabulary and the
sequence, an uneven stage split, two wrong steps) in another. The pieces (slicing, the
meta-device build, the exchange plan, FLOPs, the statements lecture 10 makes) are tested on
their own.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import time
import weakref

import pytest
import torch

from course_utils import launch
from course_utils.assess import a10_capstone as capstone
from course_utils.memory import sizing as memory
from course_utils.trainer3d import stage_model
from course_utils.models import tiny_lm
from course_utils.trainer3d import train as train3d
from course_utils.trainer3d import check as train3d_check
from course_utils.trainer3d import comms as train3d_comms
from course_utils.trainer3d import torch_parts as train3d_torch
from course_utils.zero.grad_buffer import GradBuffer
from course_utils.models.tiny_lm import TinyLMConfig, build
from rank_jobs import job, run_jobs

SEEDS = (0, 1)
TORCH_PLAN = train3d.Plan(steps=3)   # the PyTorch-parts version's plan


@pytest.fixture(scope="module")
def runs():
    """(plan, per-rank results, reference) for fp32 (the lecture's plan, 20 steps) and bf16
    (5 steps), each seed, and for the 3-step plan the PyTorch-parts version also trains
    (key "torch": the hand-built results, then PyTorch's); one launch of 8 ranks."""
    plans = [train3d.Plan(seed=s) for s in SEEDS]
    plans += [train3d.Plan(seed=s, dtype="bf16", steps=5) for s in SEEDS]
    hand_built, torch_results = train3d_torch.run_both(plans + [TORCH_PLAN], TORCH_PLAN,
                                                       timeout_s=480)
    out = {(p.dtype, p.seed): (p, res, train3d_check.reference_train(p))
           for p, res in zip(plans, hand_built)}
    out["torch"] = hand_built[-1], torch_results
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_8_ranks_train_like_one_process(runs, seed):
    plan, results, ref = runs[("fp32", seed)]
    worst = train3d_check.check_against_reference(plan, results, ref)
    assert len(results) == 8 and sorted(r["coords"] for r in results) == sorted(
        (d, p, t) for d in range(2) for p in range(2) for t in range(2))
    assert ref["losses"][-1] < ref["losses"][0] - 1.0   # it learns: 20 steps, > 1 nat lower
    assert worst["loss"] < 1e-5 and worst["grads"] < 1e-6
    clipped = [n > plan.clip for n in ref["grad_norms"]]
    assert any(clipped) and not all(clipped)            # the clipping acts, some of the time


@pytest.mark.parametrize("seed", SEEDS)
def test_bf16_with_fp32_gradients_trains_like_one_process_in_bf16(runs, seed):
    plan, results, ref = runs[("bf16", seed)]
    train3d_check.check_against_reference(plan, results, ref)
    fp32 = dataclasses.replace(plan, dtype="fp32")
    with pytest.raises(AssertionError):          # it did compute in bf16: fp32's check fails
        train3d_check.check_against_reference(fp32, results)
    assert all(v.dtype.itemsize == 4 for r in results for v in r["grads"].values())


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("seed", SEEDS)
def test_persistent_bytes_predicted_equal_measured(runs, dtype, seed):
    plan, results, _ = runs[(dtype, seed)]
    for r in results:
        dp_rank, pp_rank, _ = r["coords"]
        assert r["state_bytes"] == train3d_check.predicted_state_bytes(plan, pp_rank, dp_rank)
    for pp_rank in range(plan.pp):   # the DP ranks' slices cover the stage once: n in all
        n = stage_model.stage_param_count(plan.cfg, pp_rank, plan.pp, plan.tp, True)
        moments = sum(r["state_bytes"]["optimizer"] for r in results
                      if r["coords"][1:] == (pp_rank, 0))
        assert moments == 8 * n
        weights = next(r["state_bytes"]["weights"] for r in results if r["coords"][1] == pp_rank)
        assert 0 <= weights - (2 if dtype == "bf16" else 4) * n < 4 * 2 * len(
            train3d_check.bucket_bytes(plan, pp_rank))          # padding: < D per bucket


def test_comms_counted_as_predicted(runs):
    plan, results, _ = runs[("fp32", 0)]
    for r in results:
        dp_rank, pp_rank, _ = r["coords"]
        want = train3d_check.predicted_tp_calls(plan, pp_rank, dp_rank)
        assert {k: r["comms"]["tp"].get(k, 0) for k in want} == want
        assert want["all_reduce"] == 1    # the sequence-split weights' gradients, coalesced
        calls = r["comms"]["calls"]
        n_buckets = len(train3d_check.bucket_bytes(plan, pp_rank))
        pred = train3d_comms.predicted_calls(pp_rank, plan.pp, plan.m, n_buckets, True)
        assert (calls["send"], calls["recv"]) == (pred["send"], pred["recv"])
        _, batches = train3d_comms.exchange_plan(pp_rank, plan.pp, plan.m)
        assert calls["p2p_batches"] == sum(1 for s, rv in batches if s or rv)
        assert calls["all_to_all_single_dp"] == calls["all_gather_single_dp"] == n_buckets >= 2
        assert calls["all_reduce_other"] == 1                    # the norm, over all 8 ranks


def test_step_breakdown_names_each_wait(runs):
    """Every rank on this mesh waits for TP, PP and DP each step; the parts add up."""
    _, results, _ = runs[("fp32", 0)]
    for r in results:
        for t in r["times"]:
            assert t["tp"] > 0 and t["dp"] > 0 and t["step"] > 0
            assert math.isclose(t["compute"] + t["tp"] + t["pp_wait"] + t["dp"], t["step"])
        assert sum(t["pp_wait"] for t in r["times"]) > 0   # 1F1B's warm-up waits at least


def test_throughput_and_mfu_from_the_run(runs):
    plan, results, _ = runs[("fp32", 0)]
    assert {r["device"] for r in results} == {"cpu"}
    got = train3d_check.throughput(plan, results, peak=1e10)
    assert math.isclose(got["tokens_per_s"], plan.batch * plan.cfg.seq_len / got["step_s"])
    flops = train3d_check.flops_per_token(plan.cfg)["total"]
    assert got["units"] == train3d_check.peak_units(8, "cpu")
    assert math.isclose(got["mfu"], got["tokens_per_s"] * flops / got["units"] / 1e10)


@pytest.mark.parametrize("cores, units", [(2, 2), (1, 1), (8, 8), (64, 8)])
def test_mfu_divides_by_the_cores_the_ranks_share(monkeypatch, cores, units):
    """On a CPU the peak is one core's per rank, up to the cores this process may run on (8
    ranks on 2 cores: 2 cores' peak, so 4 times the MFU of dividing by 8); on GPUs, one per
    rank whatever the cores."""
    plan = train3d.Plan()
    monkeypatch.setattr(train3d_check.os, "sched_getaffinity", lambda pid: set(range(cores)),
                        raising=False)
    monkeypatch.setattr(train3d_check.os, "cpu_count", lambda: 1000)   # not the cores it may use
    step = {"step": 0.25, "compute": 0.1, "tp": 0.05, "pp_wait": 0.05, "dp": 0.05}
    results = [{"times": [step] * 3, "device": "cpu"} for _ in range(8)]
    got = train3d_check.throughput(plan, results, peak=1e9)
    tokens_per_s = plan.batch * plan.cfg.seq_len / 0.25
    assert got["units"] == units and math.isclose(got["tokens_per_s"], tokens_per_s)
    assert math.isclose(got["mfu"], tokens_per_s * 663_552 / (units * 1e9))
    gpu = train3d_check.throughput(plan, [dict(r, device="cuda") for r in results], peak=1e9)
    assert gpu["units"] == 8 and math.isclose(gpu["mfu"], got["mfu"] * units / 8)
    monkeypatch.delattr(train3d_check.os, "sched_getaffinity")        # an OS without it
    monkeypatch.setattr(train3d_check.os, "cpu_count", lambda: cores)
    assert train3d_check.peak_units(8) == units


# --------------------------------------------------------------- the statements lecture 10 makes


def test_the_check_reads_every_last_stage_rank(runs):
    """A wrong loss on TP rank 1 of the last stage fails the check (it read tp_rank 0 only)."""
    plan, results, ref = runs[("fp32", 0)]
    bad = copy.deepcopy(results)
    r = next(r for r in bad if r["coords"] == (1, 1, 1))
    r["losses"][3] += 0.5
    with pytest.raises(AssertionError, match="TP ranks differ"):
        train3d_check.check_against_reference(plan, bad, ref)


def test_adams_eps_decides_whether_one_process_equals_itself():
    """Two right one-process runs that only sum in another order: with eps = 1e-8 seed 6 ends
    beyond the weights' tolerance (head.weight[30, 55]); with the plan's 1e-5, far inside."""
    plan = train3d.Plan(seed=6, eps=1e-8)
    drift = train3d_check.order_drift(plan)
    assert drift["weights"] > 2e-4 and (drift["name"], drift["index"]) == ("head.weight",
                                                                            (30, 55))
    g = abs(drift["grad"])  # about 1.3e-9: Adam's first step moves it by about an eighth of lr
    # (1.307e-9 on one CPU, 1.4e-9 on another: the last digits are the CPU's arithmetic)
    assert 1.25e-9 < g < 1.5e-9 and 7.5 < 1 / (g / (g + 1e-8)) < 9
    trace = train3d_check.reference_train(plan, trace=["head.weight"])["trace"]["head.weight"]
    first_move = float(trace["weights"][1][30, 55] - trace["weights"][0][30, 55]) / plan.lr
    assert math.isclose(abs(first_move), g / (g + 1e-8), rel_tol=1e-3)
    for seed in (6, 0):
        assert train3d_check.order_drift(train3d.Plan(seed=seed))["weights"] < 1e-6


@pytest.mark.parametrize("seed", SEEDS)
def test_adam_moves_a_noise_gradient_by_g_over_eps(seed):
    """Lecture 10's figures for the key bias (true gradient 0: rounding only) under eps = 1e-8,
    at the powers of ten the lecture rounds to: |gradient| about 1e-11, a step about 0.1 % of
    lr (medians over 128 weights x 20 steps), the largest about 1 %; the first step exactly
    lr |g| / (|g| + eps), Adam's bias-corrected first step."""
    plan = train3d.Plan(seed=seed, eps=1e-8)
    noise = train3d_check.noise_steps(plan)
    grads, moves = noise["grads"], noise["moves"]
    assert grads.shape == moves.shape == (20, 128)
    assert float(grads.max()) < 1e-9                    # all of it far below eps: noise
    power = {k: round(math.log10(float(v))) for k, v in (
        ("grad", grads.median()), ("move", moves.median()), ("largest", moves.max()))}
    assert power == {"grad": -11, "move": -3, "largest": -2}
    torch.testing.assert_close(moves[0], grads[0] / (grads[0] + 1e-8), rtol=1e-2, atol=1e-6)
    # with the plan's eps = 1e-5 the same noise moves these weights 1000 times less
    assert float(train3d_check.noise_steps(train3d.Plan(seed=seed))["moves"].max()) < 1e-4


def test_mean_over_m_is_the_replica_mean_only_for_equal_token_counts():
    """The step divides the sum of token losses by the replica's tokens. Dividing each
    microbatch's mean by m is the same only while every microbatch counts as many tokens."""
    torch.manual_seed(0)
    losses = torch.rand(4, 8)                                  # (rows, T) token losses
    mask = torch.ones(4, 8)
    mask[2:, 5:] = 0                                           # padding in the second half
    true_mean = (losses * mask).sum() / mask.sum()
    halves = [(lo * mk).sum() / mk.sum() / 2 for lo, mk in zip(losses.chunk(2), mask.chunk(2))]
    assert not math.isclose(sum(halves), true_mean, rel_tol=1e-3)
    equal = [lo.mean() / 2 for lo in losses.chunk(2)]
    assert math.isclose(sum(equal), losses.mean(), rel_tol=1e-6)


def _late_receiver(rank, world_size):
    timer = train3d.Timer()
    t = torch.ones(16)
    if rank == 0:
        timer.exchange([("send", t, 1)])
        timer.finish_sends()
    else:
        time.sleep(0.5)
        timer.exchange([("recv", t, 0)])
    return timer.pp_wait


def test_a_send_still_in_flight_is_pipeline_wait():
    """gloo's send completes only when the peer receives: the step times that wait as PP."""
    waits = launch.run(_late_receiver, 2, timeout_s=60)
    assert waits[0] > 0.3


def _library_step_as_answer(stage, g, inputs, targets, m, optimizer):
    optimizer.allow_step = True
    return train3d.train_step(stage, g, inputs, targets, m, optimizer)


def test_the_library_step_is_not_a10_q1s_answer():
    """Lecture 10's step (bucketed reduce-scatters from its own buffer, the clipped sharded
    optimizer) does not run as a10 Q1's answer: the all-reduce and the all-gather Q1 asks for
    are not in it."""
    p = capstone.plan(2, 2, 1, seed=11, m=4)
    with pytest.raises(launch.RankError, match="train_step"):
        capstone.diagnose(p, capstone.run_step(_library_step_as_answer, p))


# --------------------------------------------------------------------------- other meshes

MESHES = {"no-dp": (1, 2, 2), "no-pp": (2, 1, 2), "no-tp": (2, 2, 1)}
WRONG_STEP_PLAN = train3d.Plan(dp=2, pp=2, tp=1, steps=1, vocab_parallel=False, sp=False,
                               clip=None)


def _scaled_grads_step(stage, g, x, y, m, optimizer, factor="dp"):
    """The library's step with a wrong DP mean: the gradients D times (a sum) or m times (no
    1/m) too large."""
    grads = getattr(optimizer, "_test_grads", None)
    if grads is None:
        grads = optimizer._test_grads = GradBuffer(optimizer.params, optimizer.layout,
                                                   g.dp_group)
        optimizer.grads, optimizer.allow_step = grads, True
        finish = grads.finish
        scale = g.dp_size if factor == "dp" else m

        def wrong_finish():
            finish()
            grads.flat.mul_(scale)
        grads.finish = wrong_finish
    loss = train3d.train_step(stage, g, x, y, m, optimizer, grads)
    for p, full in zip(optimizer.params, grads.full_grads()):
        p.grad = full
    return loss


@pytest.fixture(scope="module")
def four():
    """Every 4-rank run of this file that trains to the end, in one launch: the meshes that
    drop one axis (each seed), the layouts of the vocabulary and the sequence, the uneven
    stages, and the two wrong steps. {name: (plans, [per plan: each rank's result])}."""
    cases = {name: ([train3d.Plan(dp=dp, pp=pp, tp=tp, steps=3, seed=s) for s in SEEDS], None)
             for name, (dp, pp, tp) in MESHES.items()}
    cases["layouts"] = ([train3d.Plan(dp=1, pp=2, tp=2, steps=3, seed=s, vocab_parallel=vp,
                                      sp=False) for vp in (False, True) for s in SEEDS], None)
    cases["uneven"] = ([train3d.Plan(dp=2, pp=2, tp=1, steps=2, m=8, batch=16,
                                     cfg=TinyLMConfig(n_layers=3))], None)
    for factor in ("dp", "m"):
        cases[f"wrong-{factor}"] = ([WRONG_STEP_PLAN],
                                    functools.partial(_scaled_grads_step, factor=factor))
    # (as train3d.run trains a list of plans: train_worker on each rank, one thread each)
    results = run_jobs([job(train3d.train_worker, plans, step_fn=step_fn)
                        for plans, step_fn in cases.values()], 4)
    return {name: (plans, [[r[j] for r in per_rank] for j in range(len(plans))])
            for (name, (plans, _)), per_rank in zip(cases.items(), results)}


@pytest.mark.parametrize("mesh", MESHES)
def test_4_rank_meshes_train_like_one_process(four, mesh):
    dp, pp, tp = MESHES[mesh]
    for plan, results in zip(*four[mesh]):
        train3d_check.check_against_reference(plan, results)
        for r in results:   # an axis of size 1 issues none of its communication
            for t in r["times"]:
                assert (t["tp"] > 0) == (tp > 1)
            waited = sum(t["pp_wait"] for t in r["times"])
            assert waited > 0 if pp > 1 else waited == 0


def test_vocabulary_and_sequence_layouts_train_like_one_process(four):
    """The plain stage (embedding and head whole), the vocabulary split alone, each seed."""
    for plan, results in zip(*four["layouts"]):
        train3d_check.check_against_reference(plan, results)
        heads = [r["weights"]["head.weight"].shape for r in results if r["coords"][1] == 1]
        assert heads[0] == ((64, 32) if plan.vocab_parallel else (64, 64))


def test_uneven_stages_and_more_microbatches(four):
    """3 blocks over 2 stages (2 + 1) and 8 microbatches of 1 row."""
    [plan], [results] = four["uneven"]
    train3d_check.check_against_reference(plan, results)


@pytest.mark.parametrize("factor", ["dp", "m"], ids=["dp-sum", "no-1/m"])
def test_the_check_fails_a_wrong_step(four, factor):
    [plan], [results] = four[f"wrong-{factor}"]
    with pytest.raises(AssertionError, match="grads"):
        train3d_check.check_against_reference(plan, results)


def _library_step(stage, g, inputs, targets, m, optimizer):
    optimizer.step()


def test_a_student_step_must_write_the_all_gather():
    with pytest.raises(launch.RankError, match="leaves the all-gather to you"):
        train3d.run(train3d.Plan(dp=2, pp=1, tp=1, steps=1, vocab_parallel=False, sp=False,
                                 clip=None), step_fn=_library_step)


def test_torch_parts_train_like_one_process_and_the_hand_built(runs):
    """DeviceMesh + DTensor + pipelining + FSDP2 + torchtitan's clipping; the same run also
    reports init_device_mesh's groups and the rows ColwiseParallel leaves each TP rank: rank 0
    holds rows 0-5 of a (12, 4) fused weight, all of q (0-3) and half of k."""
    plan = TORCH_PLAN
    ref = train3d_check.reference_train(plan)
    hand_built, torch_results = runs["torch"]   # (launched with the 8-rank runs)
    train3d_torch.check_against_reference(plan, torch_results, ref)
    train3d_check.check_against_reference(plan, hand_built, ref)
    ours = train3d_check.replica_losses(plan, hand_built)
    torch.testing.assert_close(torch.tensor(train3d_check.replica_losses(plan, torch_results)),
                               torch.tensor(ours), rtol=1e-5, atol=1e-5)
    for rank, r in enumerate(torch_results):
        assert r["groups"] == {axis: plan.mesh.group(rank, axis) for axis in ("dp", "pp", "tp")}
        assert r["colwise_rows"] == list(range(6 * r["coords"][2], 6 * r["coords"][2] + 6))


# ----------------------------------------------------------------------- the pieces, one process


@pytest.mark.parametrize("vocab_parallel", [False, True])
@pytest.mark.parametrize("cfg,pp,tp", [(TinyLMConfig(), 2, 2), (TinyLMConfig(n_layers=3), 2, 4),
                                       (TinyLMConfig(d_ff=128, n_heads=2), 1, 2),
                                       (TinyLMConfig(), 1, 1)])
def test_shard_state_cuts_every_tensor_once(cfg, pp, tp, vocab_parallel):
    """Every rank's slices: counts equal the pen-and-paper count; TP slices of a weight
    concatenate back to the whole; every full tensor is held by some stage."""
    full = build(cfg, 0).state_dict()
    held = set()
    for p in range(pp):
        pieces = [stage_model.shard_state(full, cfg, p, pp, t, tp, vocab_parallel)
                  for t in range(tp)]
        for t, piece in enumerate(pieces):
            assert sum(v.numel() for v in piece.values()) == \
                stage_model.stage_param_count(cfg, p, pp, tp, vocab_parallel)
            with torch.device("meta"):
                stage = stage_model.Stage(cfg, p, pp, tp, tp_rank=t,
                                          vocab_parallel=vocab_parallel)
            assert {n: tuple(v.shape) for n, v in piece.items()} == \
                {n: tuple(q.shape) for n, q in stage.named_parameters()}
            assert all(stage_model.full_name(n) in full for n in piece)
        for i in stage_model.stage_blocks(cfg, p, pp):
            held.update(k for k in full if k.startswith(f"blocks.{i}."))
            fc1 = torch.cat([pc[f"blocks.{i}.mlp.up.weight"] for pc in pieces], dim=1)
            torch.testing.assert_close(fc1, full[f"blocks.{i}.fc1.weight"].t())
            o = torch.cat([pc[f"blocks.{i}.attn.o.weight"] for pc in pieces], dim=0)
            torch.testing.assert_close(o, full[f"blocks.{i}.proj.weight"].t())
        if p == 0 and vocab_parallel:
            torch.testing.assert_close(torch.cat([pc["tok.weight"] for pc in pieces]),
                                       full["tok.weight"])
        held.update(k for k in full if not k.startswith("blocks.") and
                    k in stage_model.shard_state(full, cfg, p, pp, 0, tp))
    assert held == set(full)


@pytest.mark.parametrize("seed", SEEDS)
def test_init_tensors_equal_tiny_lm_build_one_layer_at_a_time(seed):
    cfg = TinyLMConfig()
    full = build(cfg, seed).state_dict()
    seen, alive = {}, []

    def keep(name, p):
        alive.append(sum(r() is not None for r in seen.values()))
        seen[name] = weakref.ref(p)
        assert torch.equal(p.detach(), full[name]), name
    stage_model.init_tensors(cfg, seed, keep)
    assert sorted(seen) == sorted(full)
    assert max(alive) <= 1       # when a tensor arrives, at most its layer's other is alive


def test_build_stage_never_builds_the_model(monkeypatch):
    cfg = TinyLMConfig()
    want = stage_model.shard_state(build(cfg, 3).state_dict(), cfg, 1, 2, 1, 2, True)

    def refuse(*args, **kwargs):
        raise AssertionError("the whole TinyLM was built")
    monkeypatch.setattr(tiny_lm.TinyLM, "__init__", refuse)
    stage = stage_model.build_stage(cfg, 3, 1, 2, 1, 2, vocab_parallel=True, sp=True)
    got = dict(stage.named_parameters())
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert torch.equal(got[name].detach(), value), name
    bf16 = stage_model.build_stage(cfg, 3, 1, 2, 1, 2, vocab_parallel=True,
                                   dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in bf16.parameters())


def _allocated_while(fn) -> int:
    """Bytes the CPU allocator handed out while ``fn`` ran (torch's profiler), and fn's value."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    return sum(max(e.cpu_memory_usage, 0) for e in prof.events()), out


def test_a_meta_stage_would_take_its_size_and_holds_nothing():
    """Lecture 10's meta-device cell: a stage-0 rank's Stage built on the meta device would take
    117,120 bytes (the weights of section 5's memory table) and holds 0, by count_state_bytes
    and by the allocator, which hands out nothing while it is built (the same Stage on the CPU
    takes at least its size); to_empty gives it the 117,120 bytes."""
    cfg = train3d.Plan().cfg

    def stage_on(device):
        with torch.device(device):
            return stage_model.Stage(cfg, 0, 2, 2, tp_rank=1, vocab_parallel=True, sp=True)
    allocated, shell = _allocated_while(lambda: stage_on("meta"))
    size = sum(p.numel() * p.element_size() for p in shell.parameters())
    assert size == 117_120 == sum(p.untyped_storage().nbytes() for p in shell.parameters())
    assert allocated == 0 and memory.count_state_bytes(shell)["total"] == 0
    assert _allocated_while(lambda: stage_on("cpu"))[0] >= size
    shell.to_empty(device="cpu")
    assert memory.count_state_bytes(shell) == {"weights": size, "grads": 0, "master": 0,
                                               "optimizer": 0, "other": 0, "total": size}


@pytest.mark.parametrize("pp", [1, 2, 3, 4])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8])
def test_exchange_plan_pairs_every_send_with_a_receive(pp, m):
    """Between two neighbours, the activations one sends are the ones the other receives, in
    the same order, and the same for the gradients."""
    plans = [train3d_comms.exchange_plan(r, pp, m)[1] for r in range(pp)]
    for r in range(pp - 1):
        sent = [(w, i) for s, _ in plans[r] for w, i, to in s if to == "next"]
        got = [(w, i) for _, rv in plans[r + 1] for w, i, src in rv if src == "prev"]
        assert sent == got == [("act", i) for i in range(m)]
        sent = [(w, i) for s, _ in plans[r + 1] for w, i, to in s if to == "prev"]
        got = [(w, i) for _, rv in plans[r] for w, i, src in rv if src == "next"]
        assert sent == got == [("grad", i) for i in range(m)]


def test_the_exchange_the_lecture_prints():
    assert train3d_comms.format_exchange(0, 2, 4) == (
        "F0 [send a0] F1 [send a1, recv g0] B0 F2 [send a2, recv g1] B1 F3 "
        "[send a3, recv g2] B2 [recv g3] B3")
    assert train3d_comms.format_exchange(1, 2, 4) == (
        "[recv a0] F0 B0 [send g0, recv a1] F1 B1 [send g1, recv a2] F2 B2 "
        "[send g2, recv a3] F3 B3 [send g3]")


@pytest.mark.parametrize("cfg", [TinyLMConfig(), TinyLMConfig(d_model=32, d_ff=64, n_layers=3,
                                                              vocab_size=48, seq_len=16)])
def test_the_matmul_flops_are_what_flop_counter_mode_counts(cfg):
    from torch.utils.flop_counter import FlopCounterMode

    x, y = tiny_lm.MarkovCorpus(cfg.vocab_size).batch(0, 3, cfg.seq_len)
    with FlopCounterMode(display=False) as counter:
        tiny_lm.lm_loss(build(cfg), x, y).backward()
    f = train3d_check.flops_per_token(cfg)
    assert counter.get_total_flops() == f["matmuls"] * x.numel()
    assert f["attention"] == 12 * cfg.n_layers * cfg.seq_len * cfg.d_model
    assert f["total"] == f["matmuls"] + f["attention"]


def test_qkv_reordering_round_trips():
    w = torch.randn(3 * 8, 5)
    for tp in (1, 2, 4):
        mixed = train3d_torch.qkv_for_tp(w, 8, tp)
        torch.testing.assert_close(train3d_torch._qkv_from_tp(mixed, 8, tp), w)
    torch.testing.assert_close(train3d_torch.qkv_for_tp(w, 8, 1), w)


@pytest.mark.parametrize("kwargs,match", [
    ({"dp": 0}, "dp must be an int >= 1"), ({"batch": 15}, "batch=15 must divide"),
    ({"tp": 3}, "tp_size=3 must divide n_heads=4"), ({"pp": 3}, "pp_size must be at most"),
    ({"lr": -1.0}, "lr must be a finite number"), ({"seed": -1}, "seed must be an int >= 0"),
    ({"bucket_mb": 0}, "bucket_mb must be a finite number"),
    ({"clip": 0.0}, "clip must be a finite number"), ({"dtype": "fp16"}, "dtype must be one of"),
    ({"sp": True, "vocab_parallel": False}, "sp=True needs vocab_parallel=True"),
    ({"sp": 1}, "sp must be True or False"),
])
def test_a_bad_plan_is_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        train3d.Plan(**kwargs)


def test_bad_coordinates_and_arguments_are_named():
    cfg = TinyLMConfig()
    with pytest.raises(ValueError, match="pp_rank must be an int from 0 to 1"):
        stage_model.shard_state({}, cfg, 2, 2, 0, 1)
    with pytest.raises(ValueError, match="cfg must be a TinyLMConfig"):
        stage_model.stage_param_count("big", 0, 1, 1)
    with pytest.raises(ValueError, match="tp_size=3 must divide vocab_size=64"):
        stage_model.stage_param_count(TinyLMConfig(n_heads=3, d_model=66, d_ff=66), 0, 1, 3,
                                      vocab_parallel=True)
    with pytest.raises(ValueError, match="plan must be a train3d.Plan"):
        train3d.run({"dp": 2})
    with pytest.raises(ValueError, match="the same number of ranks"):
        train3d.run([train3d.Plan(), train3d.Plan(dp=1)])
    with pytest.raises(ValueError, match="the plan needs 8 ranks"):
        train3d.train_worker(0, 4, train3d.Plan())
    with pytest.raises(ValueError, match="step_fn must be a function or None"):
        train3d.run(train3d.Plan(), step_fn="mine")
    with pytest.raises(ValueError, match="mesh must be a course_utils.mesh.grid.Mesh"):
        train3d_check.groups_table((2, 2, 2))
    with pytest.raises(ValueError, match="logits must be"):
        from course_utils.tensor_parallel.vocab import vocab_parallel_cross_entropy
        vocab_parallel_cross_entropy(torch.zeros(3, 4), torch.zeros(2, dtype=torch.long))

"""Module 10's 3-D trainer: every rank's tensors against one process, on several meshes.

The 8-rank runs (DP 2 x PP 2 x TP 2, 20 steps, two seeds) are made once per file; the 4-rank
meshes that drop one axis each, an uneven stage split, the PyTorch-parts version and the
hand-built pieces (slicing, ZeRO-1's Adam, the groups) are tested on their own.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from course_utils import launch, memory, stage_model, train3d, train3d_check, train3d_torch
from course_utils.mesh import Mesh
from course_utils.tiny_lm import TinyLMConfig, build
from course_utils.zero1 import ShardedAdam

SEEDS = (0, 1)


@pytest.fixture(scope="module")
def runs():
    """The lecture's plan (8 ranks, 20 steps) for each seed: (plan, per-rank results, reference)."""
    out = {}
    for seed in SEEDS:
        plan = train3d.Plan(seed=seed)
        out[seed] = (plan, train3d.run(plan, timeout_s=180), train3d_check.reference_train(plan))
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_8_ranks_train_like_one_process(runs, seed):
    plan, results, ref = runs[seed]
    worst = train3d_check.check_against_reference(plan, results, ref)
    assert len(results) == 8 and sorted(r["coords"] for r in results) == sorted(
        (d, p, t) for d in range(2) for p in range(2) for t in range(2))
    assert ref["losses"][-1] < ref["losses"][0] - 1.0   # it learns: 20 steps, > 1 nat lower
    assert worst["loss"] < 1e-5 and worst["grads"] < 1e-6


@pytest.mark.parametrize("seed", SEEDS)
def test_persistent_bytes_predicted_equal_measured(runs, seed):
    plan, results, _ = runs[seed]
    for r in results:
        got, want = r["state_bytes"], train3d_check.predicted_state_bytes(plan, r["coords"][1])
        assert {k: got[k] for k in want} == want, r["coords"]
        assert got["master"] == got["other"] == 0
        n = stage_model.stage_param_count(plan.cfg, r["coords"][1], plan.pp, plan.tp)
        ideal = memory.zero_state_bytes(n, plan.dp, 1, "fp32_adam")
        assert want["optimizer"] - ideal["optimizer"] < 8 * plan.dp   # padding < D elements


def test_tp_all_reduces_counted_as_predicted(runs):
    plan, results, _ = runs[0]
    for r in results:
        want = train3d_check.predicted_comms(plan, r["coords"][1])
        assert {k: r["comms"][k] for k in want} == want
        assert r["comms"]["dp_buckets"] >= 2   # more than one bucket: overlap is possible


def test_step_breakdown_names_each_wait(runs):
    """Every rank on this mesh waits for TP, PP and DP each step; the parts add up."""
    _, results, _ = runs[0]
    for r in results:
        for t in r["times"]:
            assert t["tp"] > 0 and t["dp"] > 0 and t["step"] > 0
            assert math.isclose(t["compute"] + t["tp"] + t["pp_wait"] + t["dp"], t["step"])
        assert sum(t["pp_wait"] for t in r["times"]) > 0   # 1F1B's warm-up waits at least


@pytest.mark.parametrize("degrees", [(1, 2, 2), (2, 1, 2), (2, 2, 1)],
                         ids=["no-dp", "no-pp", "no-tp"])
@pytest.mark.parametrize("seed", SEEDS)
def test_4_rank_meshes_train_like_one_process(degrees, seed):
    dp, pp, tp = degrees
    plan = train3d.Plan(dp=dp, pp=pp, tp=tp, steps=3, seed=seed)
    results = train3d.run(plan)
    train3d_check.check_against_reference(plan, results)
    for r in results:   # an axis of size 1 issues none of its communication
        for t in r["times"]:
            assert (t["tp"] > 0) == (tp > 1)
        waited = sum(t["pp_wait"] for t in r["times"])
        assert waited > 0 if pp > 1 else waited == 0


def test_uneven_stages_and_more_microbatches():
    """3 blocks over 2 stages (2 + 1) and 8 microbatches of 1 row."""
    plan = train3d.Plan(dp=2, pp=2, tp=1, steps=2, m=8, batch=16,
                        cfg=TinyLMConfig(n_layers=3))
    train3d_check.check_against_reference(plan, train3d.run(plan))


class _ScaledSync:
    """A wrong DP sync: the right average, then the gradients multiplied by ``scale`` (D: an
    all-reduce that sums; m: microbatch losses not divided by m)."""

    active = False

    def __init__(self, stage, g, scale):
        self.stage, self.g, self.scale = stage, g, scale

    def finish(self):
        for p in self.stage.parameters():
            torch.distributed.all_reduce(p.grad, group=self.g.dp_group)
            p.grad.div_(self.g.dp_size).mul_(self.scale)


def _scaled_grads_step(stage, g, x, y, m, optimizer, factor="dp"):
    optimizer.allow_step = True
    sync = _ScaledSync(stage, g, g.dp_size if factor == "dp" else m)
    return train3d.train_step(stage, g, x, y, m, optimizer, sync)


@pytest.mark.parametrize("factor", ["dp", "m"], ids=["dp-sum", "no-1/m"])
def test_the_check_fails_a_wrong_step(factor):
    plan = train3d.Plan(dp=2, pp=2, tp=1, steps=1)
    results = train3d.run(plan, step_fn=functools.partial(_scaled_grads_step, factor=factor))
    with pytest.raises(AssertionError, match="grads"):
        train3d_check.check_against_reference(plan, results)


def _library_step(stage, g, inputs, targets, m, optimizer):
    return train3d.train_step(stage, g, inputs, targets, m, optimizer)


def test_a_student_step_must_write_the_all_gather():
    with pytest.raises(launch.RankError, match="leaves the all-gather to you"):
        train3d.run(train3d.Plan(dp=2, pp=1, tp=1, steps=1), step_fn=_library_step)


def test_torch_parts_train_like_one_process_and_the_hand_built():
    plan = train3d.Plan(steps=3)
    ref = train3d_check.reference_train(plan)
    torch_results = train3d_torch.run(plan)
    train3d_torch.check_against_reference(plan, torch_results, ref)
    ours = train3d_check.replica_losses(plan, train3d.run(plan))
    torch.testing.assert_close(torch.tensor(train3d_check.replica_losses(plan, torch_results)),
                               torch.tensor(ours), rtol=1e-5, atol=1e-5)


def test_colwise_parallel_gives_a_rank_contiguous_rows():
    """Why train3d_torch reorders q/k/v: on 2 ranks rank 0 holds rows 0-5 of a (12, 4) fused
    weight: all of q (0-3) and half of k, not its heads of q, k and v."""
    rows = launch.run(functools.partial(train3d_torch.colwise_rows_worker, d=4), 2,
                      timeout_s=60)
    assert rows == [list(range(6)), list(range(6, 12))]


def test_device_mesh_builds_the_grid_groups():
    plan = train3d.Plan()
    mesh = Mesh.from_degrees(dp=2, pp=2, tp=2)
    got = launch.run(functools.partial(train3d_torch.mesh_groups_worker, plan=plan), 8,
                     timeout_s=120)
    for rank, groups in enumerate(got):
        assert groups == {axis: mesh.group(rank, axis) for axis in ("dp", "pp", "tp")}


# ----------------------------------------------------------------------- the pieces, one process


@pytest.mark.parametrize("cfg,pp,tp", [(TinyLMConfig(), 2, 2), (TinyLMConfig(n_layers=3), 2, 4),
                                       (TinyLMConfig(d_ff=128, n_heads=2), 1, 2),
                                       (TinyLMConfig(), 1, 1)])
def test_shard_state_cuts_every_tensor_once(cfg, pp, tp):
    """Every rank's slices: counts equal the pen-and-paper count; TP slices of a weight
    concatenate back to the whole; every full tensor is held by some stage."""
    full = build(cfg, 0).state_dict()
    held = set()
    for p in range(pp):
        pieces = [stage_model.shard_state(full, cfg, p, pp, t, tp) for t in range(tp)]
        for t, piece in enumerate(pieces):
            assert sum(v.numel() for v in piece.values()) == \
                stage_model.stage_param_count(cfg, p, pp, tp)
            stage = stage_model.Stage(cfg, p, pp, tp)
            assert sorted(piece) == sorted(n for n, _ in stage.named_parameters())
            assert all(stage_model.full_name(n) in full for n in piece)
        for i in stage_model.stage_blocks(cfg, p, pp):
            held.update(k for k in full if k.startswith(f"blocks.{i}."))
            fc1 = torch.cat([pc[f"blocks.{i}.mlp.up.weight"] for pc in pieces], dim=1)
            torch.testing.assert_close(fc1, full[f"blocks.{i}.fc1.weight"].t())
            o = torch.cat([pc[f"blocks.{i}.attn.o.weight"] for pc in pieces], dim=0)
            torch.testing.assert_close(o, full[f"blocks.{i}.proj.weight"].t())
        held.update(k for k in full if not k.startswith("blocks.") and
                    k in stage_model.shard_state(full, cfg, p, pp, 0, tp))
    assert held == set(full)


def test_qkv_reordering_round_trips():
    w = torch.randn(3 * 8, 5)
    for tp in (1, 2, 4):
        mixed = train3d_torch.qkv_for_tp(w, 8, tp)
        torch.testing.assert_close(train3d_torch._qkv_from_tp(mixed, 8, tp), w)
    torch.testing.assert_close(train3d_torch.qkv_for_tp(w, 8, 1), w)


def _adam_worker(rank, world_size, seed, numels):
    torch.manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(n)) for n in numels]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in params]
    ours, theirs = ShardedAdam(params, lr=1e-2), torch.optim.Adam(ref, lr=1e-2)
    for _ in range(3):
        grads = [torch.randn(n) for n in numels]
        for p, q, g in zip(params, ref, grads):
            p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    held = ours.state[0]["exp_avg"].numel()
    return [p.detach().numpy() for p in params], [q.detach().numpy() for q in ref], held


@pytest.mark.parametrize("seed", SEEDS)
def test_sharded_adam_is_torch_adam(seed):
    numels = [7, 10, 3]   # 20 elements over 3 ranks: shards of 7, the last one padded
    for got, want, held in launch.run(_adam_worker, 3, seed, numels):
        assert held == 7
        for a, b in zip(got, want):
            torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b), rtol=0, atol=1e-7)


@pytest.mark.parametrize("kwargs,match", [
    ({"dp": 0}, "dp must be an int >= 1"), ({"batch": 15}, "batch=15 must divide"),
    ({"tp": 3}, "tp_size=3 must divide n_heads=4"), ({"pp": 3}, "pp_size must be at most"),
    ({"lr": -1.0}, "lr must be a finite number"), ({"seed": -1}, "seed must be an int >= 0"),
    ({"bucket_mb": 0}, "bucket_mb must be a finite number"),
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
    with pytest.raises(ValueError, match="plan must be a train3d.Plan"):
        train3d.run({"dp": 2})
    with pytest.raises(ValueError, match="the plan needs 8 ranks"):
        train3d.train_worker(0, 4, train3d.Plan())
    with pytest.raises(ValueError, match="params must be a non-empty"):
        ShardedAdam([])
    with pytest.raises(ValueError, match="step_fn must be a function or None"):
        train3d.run(train3d.Plan(), step_fn="mine")
    with pytest.raises(ValueError, match="mesh must be a course_utils.mesh.Mesh"):
        train3d_check.groups_table((2, 2, 2))

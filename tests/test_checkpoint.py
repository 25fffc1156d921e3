"""Module 12: checkpoints on real gloo ranks (resume, resharding, a kill in the middle of a save,
a lost rank under torchrun's agent and under the torchrun command, a lost node, module 10's
trainer), and the checks, formulas and predictions at the value level."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from course_utils import launch
from course_utils.checkpoint import dcp as checkpoint
from course_utils.checkpoint import trainer3d as checkpoint3d
from course_utils.checkpoint import interval as checkpoint_interval
from course_utils.checkpoint import lost_node
from course_utils.checkpoint import lost_rank
from course_utils.checkpoint import reshard
from course_utils.checkpoint import resume_demo
from course_utils.checkpoint import resume_job
from course_utils.trainer3d import train as train3d

ROOT = Path(__file__).resolve().parent.parent
SAVE_AT = 6


# ----------------------------------------------------------------------------- real ranks


@pytest.fixture(scope="module")
def resumes(tmp_path_factory):
    """For seeds 0 and 1: the uninterrupted run saved at step 6, resumed with everything, without
    the optimizer and without torch's generator; and one process running the same job."""
    launch.preload(*checkpoint.PRELOAD)
    out = {}
    for seed in (0, 1):
        job = resume_job.Job(seed=seed)
        path = str(tmp_path_factory.mktemp(f"resume{seed}") / "step_6")
        omits = [(), ("optimizer",), ("torch RNG",)]
        ranks = launch.run(functools.partial(resume_demo.omission_worker, job=job, path=path,
                                             save_at=SAVE_AT, omits=omits), 2, timeout_s=180,
                           threads_per_rank=1)
        out[seed] = (job, path, ranks, resume_job.reference_run(job, at=SAVE_AT))
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_the_distributed_run_equals_one_process(resumes, seed):
    _, _, ranks, ref = resumes[seed]
    for r in ranks:
        torch.testing.assert_close(torch.tensor(r["uninterrupted"]), torch.tensor(ref["losses"]),
                                   rtol=1e-6, atol=1e-7)
        for name, w in ref["weights"].items():
            torch.testing.assert_close(torch.from_numpy(r["weights"][name]), torch.from_numpy(w),
                                       rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_each_piece_left_out_departs_where_it_should(resumes, seed):
    _, _, ranks, _ = resumes[seed]
    r = ranks[0]
    full, no_optimizer, no_torch_rng = (
        resume_demo.departures(r["uninterrupted"], losses, SAVE_AT, steps)
        for losses, steps in zip(r["resumed"], r["steps"]))
    assert full == {"first": None, "largest": 0.0, "steps": 12}
    assert no_optimizer["first"] == SAVE_AT + 1 and no_optimizer["largest"] > 1e-3
    assert no_torch_rng["first"] == SAVE_AT and no_torch_rng["largest"] > 1e-3


def test_a_new_job_resumes_bit_for_bit(resumes):
    job, path, ranks, ref = resumes[0]
    again = launch.run(functools.partial(resume_demo.resume_worker, job=job, path=path), 2,
                       timeout_s=120, threads_per_rank=1)
    at = ref["state_at"]
    for rank, r in enumerate(again):
        assert r["losses"] == ranks[rank]["uninterrupted"][SAVE_AT:]
        assert resume_demo.same_bits(r["final"]["weights"], ranks[rank]["weights"])
        loaded = r["loaded"]
        assert (loaded["epoch"], loaded["position"], loaded["step"]) == (
            at["epoch"], at["position"], at["step"]) == (1, 2, SAVE_AT)
        assert loaded["rng"] == at["rng"][rank]


def test_loading_before_wrapping_reads_everything_and_an_early_optimizer_never_moves(resumes):
    job, path, _, _ = resumes[1]
    out = launch.run(functools.partial(resume_demo.before_wrapping_worker, job=job, path=path),
                     2, timeout_s=120, threads_per_rank=1)
    for r in out:
        assert r["read_before"] == 2 * r["read_after"] and not r["moved"]


def test_a_kill_in_the_middle_of_a_save_leaves_a_checkpoint_that_is_refused(resumes, tmp_path):
    job, path6, _, _ = resumes[0]
    half = tmp_path / "step_9"
    with pytest.raises(launch.RankError, match="killed by SIGKILL"):
        launch.run(functools.partial(resume_demo.killed_while_saving_worker, job=job,
                                     path=str(half)), 2, timeout_s=120, show_output=False)
    with pytest.raises(checkpoint.CheckpointError, match="half-written.*__0_0.distcp"):
        checkpoint.verify(half)
    shutil.copytree(path6, tmp_path / "step_6")
    assert checkpoint.latest(tmp_path) == (6, tmp_path / "step_6")


@pytest.mark.parametrize("seed", [0, 1])
def test_a_run_resumed_on_another_dp_size_sees_the_same_samples(tmp_path, seed):
    """Saved at step 6 by 4 ranks, resumed by 2 and by 1 with the same global batch: with the
    global sampler (and draws keyed by sample) every later loss and the final weights equal the
    uninterrupted run's within float reduction order (measured: <= 1.5e-7 relative, 6e-8 on
    the weights); with torch's DistributedSampler the ranks' rows and noise change with the
    world size, and the loss departs by more than 1 %. A rank that the saving job did not have
    is told why it cannot load its generators."""
    rows = resume_demo.resized_runs(str(tmp_path), seed=seed)
    assert [(r["sampler"], r["to"]) for r in rows] == [("distributed", 2), ("distributed", 1),
                                                       ("global", 2), ("global", 1)]
    for r in rows:
        if r["sampler"] == "global":
            assert r["loss"] < 1e-6 and r["weights"] < 1e-6, r
        else:
            assert r["loss"] > 0.01, r
    job = resume_job.Job(world_size=4, rows=2, dropout=0.0, sampler="global", seed=seed)
    with pytest.raises(launch.RankError, match="holds no generators of rank [4-7]"):
        launch.run(functools.partial(resume_demo.resume_worker, job=job.resized(8),
                                     path=str(tmp_path / "global_step_6")), 8, timeout_s=120,
                   threads_per_rank=1, show_output=False)


def test_an_async_save_is_durable_only_when_its_write_ends(tmp_path):
    """2 ranks, 12 MB of state each, storage 0.3 s slow: when async_save returns, the folder is
    refused (a failure then loses it); the next save waits for the write; the staged copy is
    the rank's whole state in memory of its own; the checkpoint holds the values at the save
    although training changed them in place. First order, the write adds to the redone work."""
    out = launch.run(functools.partial(checkpoint_interval.async_save_worker,
                                       path=str(tmp_path / "async")), 2, timeout_s=120,
                     threads_per_rank=1)
    for r in out:
        assert r["staged_bytes"] == r["state_bytes"] == 3 * 1_000_000 * 4
        assert r["resident_growth"] >= 0.9 * r["state_bytes"]
        assert not r["durable_at_return"] and r["durable_after"] and r["holds_values_at_save"]
        assert r["next_save_waits_s"] >= 0.25 > r["stalled_s"]
    w = checkpoint_interval.waste
    assert w(300.0, 5.0, 1e4, 60.0, write=50.0) - w(300.0, 5.0, 1e4, 60.0) == pytest.approx(
        50.0 / 1e4)
    with pytest.raises(ValueError, match="write"):
        w(300.0, 5.0, 1e4, write=-1.0)


@pytest.mark.parametrize("world", [2, 4])
def test_resharding_reads_and_writes_the_predicted_bytes(tmp_path, world):
    out = launch.run(functools.partial(reshard.reshard_worker, path=str(tmp_path / "mlp")), world,
                     timeout_s=180, threads_per_rank=1)
    for rank, r in enumerate(out):
        want = {layout: reshard.predicted_bytes(layout, rank, world)
                for layout in reshard.LAYOUTS}
        assert r[reshard.LAYOUTS[0]]["written"] == want[reshard.LAYOUTS[0]]["written"]
        for layout in reshard.LAYOUTS[1:]:
            assert (r[layout]["read"], r[layout]["pieces"]) == (want[layout]["read"],
                                                                want[layout]["pieces"])
        assert all(v["equal"] for v in r.values())
        losses = [v["loss"] for v in r.values()]
        assert max(losses) - min(losses) < 1e-6


@pytest.mark.parametrize("seed, dp, tp, dtype", [(0, 2, 1, "fp32"), (1, 1, 2, "bf16")])
def test_module_10s_trainer_resumes_bit_for_bit(tmp_path, seed, dp, tp, dtype):
    # on 4 ranks (PP 2 with DP 2, or with TP 2 and bf16 weights over fp32 master pieces);
    # lecture 12 runs DP 2 x PP 2 x TP 2
    plan = train3d.Plan(dp=dp, pp=2, tp=tp, steps=4, batch=8, seed=seed, dtype=dtype)
    out = checkpoint3d.run(plan, str(tmp_path / "step_2"), save_at=2)
    assert checkpoint3d.same_run(out["uninterrupted"], out["resumed"], 2)
    assert all(len(r["losses"]) == 2 for r in out["resumed"])


def test_a_lost_rank_is_restarted_by_torchruns_agent_and_ends_where_it_would_have():
    plan = lost_rank.Plan()
    out = lost_rank.run(plan, timeout_s=300)
    kill = out["kill"]
    assert (kill["rank"], kill["step"], kill["resumed_from"]) == (1, 6, 4)
    assert out["killed"]["weights"] == out["uninterrupted"]["weights"]
    assert out["killed"]["losses"] == out["uninterrupted"]["losses"][4:]
    attempts = {e["attempt"] for e in out["killed"]["events"] if e["event"] == "start"}
    assert attempts == {0, 1} and any("1/1 attempts left" in line for line in out["agent"])
    predicted = lost_rank.predicted_lost_s(plan, kill["restart_s"])
    # (timing noise: another test's ranks may share the 2 cores)
    assert abs(kill["lost_s"] - predicted) < max(1.0, 0.5 * predicted), (kill, predicted)


def test_a_lost_node_is_left_out_and_the_job_goes_on_with_the_other():
    """Two torchrun agents (two "nodes", c10d rendezvous, 1 to 2 nodes); node b's agent and
    rank are killed together in step 3; node a's agent starts a round without b once b's
    heartbeat has lapsed, and its one rank resumes from step 2 with the same global batch:
    every later loss equals the uninterrupted run's within float reduction order. Nothing of
    either node is left running."""
    import psutil

    plan = lost_node.Plan()
    out = lost_node.run(plan, timeout_s=240)
    assert out["worlds"] == [(0, 2), (1, 1)]
    assert (out["kill"]["node"], out["kill"]["step"], out["resumed_from"]) == ("b", 3, 2)
    assert out["redone"] == 2 and len(out["losses"]) == plan.steps - 2
    assert out["largest_difference"] < 1e-6
    assert out["restart_s"] > plan.keep_alive_s      # (b is dead only once its heartbeat lapses)
    assert len(out["pids"]) == 5                      # 2 agents, a's 2 ranks, b's rank
    alive = [pid for pid in out["pids"] if psutil.pid_exists(pid)
             and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert alive == []


def test_the_torchrun_command_restarts_the_killed_job(tmp_path):
    """``torchrun --max-restarts 1 -m course_utils.checkpoint.lost_rank DIR``: rank 1 dies in step 6, the
    job resumes from the step-4 checkpoint and both ranks finish."""
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    out = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2",
                          "--max-restarts", "1", "-m", "course_utils.checkpoint.lost_rank", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    events = [json.loads(line) for rank in (0, 1)
              for line in (tmp_path / f"events.rank{rank}.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["event"] == "killed"] == [6]
    assert {e["step"] for e in events if e["event"] == "loaded"} == {4}
    assert sorted(re.findall(r"rank (\d) returned: (\d+)", out.stdout)) == [("0", "6"), ("1", "6")]


def test_the_torchrun_commands_leave_the_lost_node_out(tmp_path):
    """The two ``torchrun`` commands of ``lost_node``'s docstring, a second apart: node b's
    agent and rank die in step 3, node a goes on alone from the step-2 checkpoint and ends."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    conf = "last_call_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=2"
    nodes = []
    for node, host in (("a", 1), ("b", 0)):
        nodes.append(subprocess.Popen(
            [str(torchrun), "--nnodes", "1:2", "--nproc-per-node", "1", "--max-restarts", "1",
             "--rdzv-backend", "c10d", "--rdzv-id", "lost-node", "--rdzv-endpoint",
             f"127.0.0.1:{port}", "--rdzv-conf", f"is_host={host},{conf}",
             "-m", "course_utils.checkpoint.lost_node", node, str(tmp_path)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env,
            start_new_session=True))
        time.sleep(1)
    try:
        out_a, _ = nodes[0].communicate(timeout=240)
        nodes[1].wait(timeout=60)
    finally:
        for proc in nodes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    assert nodes[0].returncode == 0, out_a[-3000:]
    assert nodes[1].returncode == -signal.SIGKILL
    events = {node: [json.loads(line) for line in
                     (tmp_path / f"events.{node}.jsonl").read_text().splitlines()]
              for node in ("a", "b")}
    assert [e["step"] for e in events["b"] if e["event"] == "killed"] == [3]
    assert [(e["attempt"], e["world"]) for e in events["a"] if e["event"] == "start"] == [
        (0, 2), (1, 1)]
    assert [e["step"] for e in events["a"] if e["event"] == "loaded"] == [2]
    assert "rank 0 returned: 4" in out_a


# ----------------------------------------------------------------------------- the values


@pytest.fixture()
def saved(tmp_path):
    """A two-tensor checkpoint saved by one process, and the state dict it was saved from."""
    import torch.distributed.checkpoint as dcp

    state = {"model": {"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(3)}, "step": 5}
    dcp.save(state, checkpoint_id=str(tmp_path / "step_5"), no_dist=True)
    return tmp_path / "step_5", state


def test_verify_names_each_problem(saved, tmp_path):
    path, state = saved
    assert checkpoint.verify(path, state).state_dict_metadata["model.w"].size == (3, 4)
    with pytest.raises(checkpoint.CheckpointError, match="does not exist"):
        checkpoint.verify(tmp_path / "nowhere")
    other = {"model": {"w": torch.zeros(4, 4), "b": torch.ones(3)}}
    with pytest.raises(checkpoint.CheckpointError, match=r"'model.w' with shape \(3, 4\), this "
                                                          r"model's is \(4, 4\)"):
        checkpoint.verify(path, other)
    with pytest.raises(checkpoint.CheckpointError, match="has no 'model.gamma'"):
        checkpoint.verify(path, {"model": {"gamma": torch.zeros(3)}})
    shard = next(path.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(checkpoint.CheckpointError, match="cut short"):
        checkpoint.verify(path)
    shard.unlink()
    with pytest.raises(checkpoint.CheckpointError, match=f"missing the shard file {shard.name} "
                                                         r"\(written by rank 0\)"):
        checkpoint.verify(path)
    (path / ".metadata").write_bytes(b"not a pickle")
    with pytest.raises(checkpoint.CheckpointError, match="cannot be read"):
        checkpoint.verify(path)
    (path / ".metadata").unlink()
    with pytest.raises(checkpoint.CheckpointError, match="half-written"):
        checkpoint.verify(path)
    assert checkpoint.latest(tmp_path) is None


def test_latest_takes_the_newest_complete_checkpoint(saved, tmp_path):
    path, _ = saved
    shutil.copytree(path, checkpoint.step_folder(tmp_path, 12))
    checkpoint.step_folder(tmp_path, 20).mkdir()          # half-written: no .metadata
    (tmp_path / "notes").mkdir()
    assert checkpoint.latest(tmp_path) == (12, tmp_path / "step_000012")
    shards = {p.name for p in path.glob("*.distcp")}
    assert set(checkpoint.file_bytes(path)) == {".metadata", *shards}


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="omit must name pieces"):
        checkpoint.load(None, "x", omit=["the moon"])
    with pytest.raises(ValueError, match="dropout"):
        resume_job.Job(dropout=1.5)
    with pytest.raises(ValueError, match="fewer than rows"):
        resume_job.Job(samples=4, rows=4)
    with pytest.raises(ValueError, match="sampler must be one of"):
        resume_job.Job(sampler="random")
    with pytest.raises(ValueError, match="dropout must be 0.0 with sampler='global'"):
        resume_job.Job(sampler="global")
    with pytest.raises(ValueError, match="world_size must divide the global batch of 8"):
        resume_job.Job(world_size=2, dropout=0.0, sampler="global").resized(3)
    with pytest.raises(ValueError, match="kill_step"):
        lost_rank.Plan(kill_step=10)
    with pytest.raises(ValueError, match="kill_rank"):
        lost_rank.Plan(kill_rank=2)
    with pytest.raises(ValueError, match="kill_step must be a step from 1 to 5"):
        lost_node.Plan(kill_step=6)
    with pytest.raises(ValueError, match="keep_alive_s must be an int"):
        lost_node.Plan(keep_alive_s=0)
    with pytest.raises(ValueError, match="timeout_s must be a finite number > 0"):
        lost_node.run(timeout_s=0)
    with pytest.raises(ValueError, match="layout must be one of"):
        reshard.boxes("DP 8", "0.weight", 0)
    with pytest.raises(ValueError, match="save_at"):
        checkpoint3d.run(train3d.Plan(steps=4), "x", save_at=4)
    with pytest.raises(ValueError, match="delta"):
        checkpoint_interval.daly_interval(-1.0, 15.0)
    with pytest.raises(ValueError, match="modules must be module names"):
        launch.preload("", "torch")


def test_a_departure_is_a_differing_loss_and_a_longer_run_is_its_own_column():
    ref = [4.0, 3.0, 2.0, 1.0]
    assert resume_demo.departures(ref, [2.0, 1.0, 0.5, 0.2], 2, 6) == {
        "first": None, "largest": 0.0, "steps": 6}
    assert resume_demo.departures(ref, [2.0, 1.5], 2, 4) == {
        "first": 3, "largest": 0.5, "steps": 4}


def test_the_schedule_and_the_shards():
    s = resume_job.Schedule(warmup=3, steps=12)
    assert [s(i) for i in range(3)] == [1 / 3, 2 / 3, 1.0]
    assert s(3) == 1.0 and s(12) == pytest.approx(0.1) and s(100) == pytest.approx(0.1)
    assert resume_job.shard_rows(32, 3) == [(0, 11), (11, 22), (22, 32)]
    assert resume_job.shard_rows(4, 3) == [(0, 2), (2, 4), (4, 4)]
    assert resume_job.Job(world_size=3, samples=30, rows=2).steps_per_epoch == 5


def test_resharding_predictions_follow_the_layouts():
    """DP 4: every rank writes 12 pieces; DP 2 x TP 2 keeps a quarter of a tensor and reads 18
    pieces (the row-parallel weight's half columns cut two saved row blocks); ZeRO-1 reads every
    piece of every weight (4 each) and one of each moment."""
    for rank in range(4):
        tp = reshard.predicted_bytes(reshard.LAYOUTS[1], rank)
        zero1 = reshard.predicted_bytes(reshard.LAYOUTS[2], rank)
        assert (tp["pieces"], zero1["pieces"]) == (18, 24)
        total = 4 * sum(np.prod(s) for s in reshard.SIZES.values()) * 3
        # a quarter of every tensor, but half of the last bias (whole on both TP ranks)
        assert tp["kept"] == total // 4 + 3 * 4 * 8 and tp["read"] > tp["written"]
    for shape in [(8, 16), (32, 32), (128,)]:      # "the data plus about 1.5 KB of records"
        assert 1400 < reshard.serialized_bytes(shape) - 4 * int(np.prod(shape)) < 1700


def test_youngs_interval_minimizes_the_first_order_waste_and_the_simulation():
    delta, mtbf, restart = 60.0, 3 * 3600.0, 600.0
    tau = checkpoint_interval.young_interval(delta, mtbf)
    grid = np.linspace(0.3 * tau, 3 * tau, 301)
    waste = [checkpoint_interval.waste(t, delta, mtbf, restart) for t in grid]
    assert abs(grid[int(np.argmin(waste))] - tau) < grid[1] - grid[0]
    assert checkpoint_interval.waste(tau, delta, mtbf) == pytest.approx(np.sqrt(2 * delta / mtbf))
    for seed in (0, 1):   # failures at random: the simulated optimum sits near Young's
        taus = tau * np.array([0.35, 0.6, 1.0, 1.6, 2.8])
        simulated = [checkpoint_interval.simulate(t, delta, mtbf, restart, work=4e6, seed=seed)
                     for t in taus]
        assert int(np.argmin(simulated)) == 2, simulated


def test_what_lecture_12_says_of_use_deterministic_algorithms_is_this_torchs_docstring():
    """Lecture 12 and a12 Q5's rubric: EmbeddingBag's backward is listed only with
    mode='max', and this torch no longer asks for CUBLAS_WORKSPACE_CONFIG."""
    doc = torch.use_deterministic_algorithms.__doc__
    at = doc.index("torch.nn.EmbeddingBag")
    assert "mode='max'" in doc[at:at + 120]
    assert "CUBLAS_WORKSPACE_CONFIG" not in doc and "cuBLAS" not in doc
    for name in ("scatter_add_", "index_add"):
        assert name in doc


def test_dalys_estimate_and_his_model():
    """Daly (2006): his example (delta 5 min, M 24 h) gives 116.7 min; past delta = 2M, M. His
    estimate sits at the exact model's minimum where Young's first order drifts off it, and the
    exact model tends to the first-order one when delta, R and tau are small beside M."""
    assert checkpoint_interval.daly_interval(5.0, 24 * 60.0) == pytest.approx(116.69, abs=0.01)
    assert checkpoint_interval.daly_interval(30.0, 10.0) == 10.0
    for delta, mtbf in ((60.0, 11_136.0), (600.0, 3_600.0), (300.0, 1_000.0)):
        grid = np.linspace(0.2, 3.0, 28_001) * checkpoint_interval.young_interval(delta, mtbf)
        best = grid[np.argmin([checkpoint_interval.expected_waste(t, delta, mtbf) for t in grid])]
        daly = checkpoint_interval.daly_interval(delta, mtbf)
        young = checkpoint_interval.young_interval(delta, mtbf)
        assert abs(daly - best) / best < 0.01 and abs(daly - best) < abs(young - best)
    exact = checkpoint_interval.expected_waste(50.0, 1.0, 1e5, 1.0)
    assert exact == pytest.approx(checkpoint_interval.waste(50.0, 1.0, 1e5, 1.0), rel=2e-3)


@pytest.mark.parametrize("tau", [300.0, 700.0])
def test_the_simulation_follows_dalys_model_failures_strike_restarts_too(tau):
    """R = 800 s, M = 1,000 s: a restart fails 55 % of the time. The simulation (4 seeds) meets
    Daly's expected waste within 2 %; a model whose restarts cannot fail is 20 % and more off."""
    delta, mtbf, restart = 10.0, 1000.0, 800.0
    sims = [checkpoint_interval.simulate(tau, delta, mtbf, restart, work=2e7, seed=s)
            for s in range(4)]
    exact = checkpoint_interval.expected_waste(tau, delta, mtbf, restart)
    assert np.mean(sims) == pytest.approx(exact, rel=0.02), (sims, exact)
    unfailing = (mtbf + restart) * np.expm1((tau + delta) / mtbf) / tau - 1
    assert abs(np.mean(sims) - unfailing) > 0.2 * exact


def test_the_time_lost_is_the_work_since_the_checkpoint_plus_the_restart():
    plan = lost_rank.Plan(steps=12, every=4, kill_step=9, step_s=0.2)
    assert lost_rank.predicted_lost_s(plan, 1.0) == pytest.approx(1.5 * 0.2 + 1.0)

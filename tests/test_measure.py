"""course_utils.measure: the verification checks (they must catch injected scaling bugs), the
measurement helpers, and every claim notebook 07 makes about timings, memory and bytes.

Distributed runs go through launch.run on real gloo ranks and are compared with a single-process
reference over more than one seed. Timing claims use generous margins: the machine is shared.
"""

from __future__ import annotations

import math
import os
import types
from dataclasses import asdict, replace
from datetime import timedelta

import matplotlib
import pytest
import torch
import torch.distributed as dist

from course_utils import launch, measure, style
from course_utils.measure import step as measure_step
from course_utils.measure.spec import RunSpec, corpus
from course_utils.memory import sizing as memory
from course_utils.models import tiny_lm
from course_utils.runtime import clock as runtime_clock

matplotlib.use("Agg")
N = 110_400
SPEC = RunSpec()
HAS_PROC_IO = measure.bytes_written() is not None


def _run(fn, world_size, *args):
    return launch.run(fn, world_size, *args, timeout_s=240, threads_per_rank=1, show_output=False)


def _t(a):
    return torch.from_numpy(a) if not isinstance(a, torch.Tensor) else a


# ------------------------------------------------------------------------------ verification


@pytest.mark.parametrize("seed", [0, 1])
def test_dp_gradients_equal_reference_and_bugs_are_caught(seed):
    spec = replace(SPEC, seed=seed, data_seed=seed + 5)
    variants = [("manual", "mean"), ("ddp", "mean"), ("manual", "sum"),
                ("manual", "double_mean"), ("ddp", "sum"), ("ddp", "double_mean")]
    specs = [replace(spec, engine=e, scaling=s) for e, s in variants]
    ref = measure.reference_gradients(spec)
    outs = _run(measure.dp_gradients_each, 2, specs)
    for rank_out in outs:
        for (engine, scaling), out in zip(variants, rank_out):
            assert out["loss"] == pytest.approx(ref["loss"], abs=1e-5)  # logged loss is blind
            report = measure.check_gradient_scaling(out["grad"], ref["grad"], 2)
            if scaling == "mean":
                torch.testing.assert_close(_t(out["grad"]), ref["grad"], rtol=1e-4, atol=1e-6)
                assert report.ok and report.diagnosis.startswith("gradients match")
                continue
            assert not report.ok, (engine, scaling)
            with pytest.raises(AssertionError):
                torch.testing.assert_close(_t(out["grad"]), ref["grad"], rtol=1e-4, atol=1e-6)
            assert report.cosine == pytest.approx(1.0, abs=1e-6)
            if scaling == "sum":
                assert report.norm_ratio == pytest.approx(2.0, rel=1e-5)
                assert "never divided by 2" in report.diagnosis
            else:
                assert report.norm_ratio == pytest.approx(0.5, rel=1e-5)
                assert "twice" in report.diagnosis
    # both ranks hold the same reduced gradient; manual == DDP
    torch.testing.assert_close(_t(outs[0][0]["grad"]), _t(outs[1][0]["grad"]))
    torch.testing.assert_close(_t(outs[0][0]["grad"]), _t(outs[0][1]["grad"]), rtol=1e-5,
                               atol=1e-7)


def test_scaling_check_names_the_world_size_on_four_ranks():
    specs = [replace(SPEC, scaling=s) for s in ("mean", "sum", "double_mean")]
    ref = measure.reference_gradients(SPEC)
    outs = _run(measure.dp_gradients_each, 4, specs)[0]
    reports = [measure.check_gradient_scaling(o["grad"], ref["grad"], 4) for o in outs]
    assert reports[0].ok
    assert reports[1].norm_ratio == pytest.approx(4.0, rel=1e-5)
    assert "never divided by 4" in reports[1].diagnosis
    assert reports[2].norm_ratio == pytest.approx(0.25, rel=1e-5)
    assert "twice" in reports[2].diagnosis


def test_check_gradient_scaling_unit():
    g = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    assert measure.check_gradient_scaling(g.clone(), g, 3).ok
    r = measure.check_gradient_scaling(3 * g, g, 3)
    assert not r.ok and "never divided by 3" in r.diagnosis and r.max_abs_diff > 0
    assert "twice" in measure.check_gradient_scaling(g / 3, g, 3).diagnosis
    assert "normalization factor" in measure.check_gradient_scaling(1.5 * g, g, 3).diagnosis
    other = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    assert "point elsewhere" in measure.check_gradient_scaling(other, g, 3).diagnosis
    assert measure.check_gradient_scaling(g.numpy(), g.numpy(), 1).ok  # numpy arrays accepted
    with pytest.raises(ValueError, match="dp_grad"):
        measure.check_gradient_scaling(g.view(10, 100), g, 2)
    with pytest.raises(ValueError, match="same shape"):
        measure.check_gradient_scaling(g[:10], g, 2)
    with pytest.raises(ValueError, match="world_size"):
        measure.check_gradient_scaling(g, g, 0)
    with pytest.raises(ValueError, match="all zeros"):
        measure.check_gradient_scaling(g, torch.zeros(1000), 2)


def test_check_losses_unit():
    assert measure.check_losses([1.0, 2.0], [1.0, 2.00001]) == pytest.approx(1e-5)
    with pytest.raises(AssertionError, match="at step 2"):
        measure.check_losses([1.0, 1.9], [1.0, 2.0])
    with pytest.raises(ValueError, match="equally long"):
        measure.check_losses([1.0], [1.0, 2.0])


def test_loss_curves_adam_hides_the_bug_sgd_shows_it():
    """The notebook's claims: with AdamW the 'sum' bug leaves the loss curve unchanged; with SGD
    it changes it (the loss falls faster); DDP and ZeRO-1 match the single-process run."""
    specs = [replace(SPEC, steps=4, optimizer=o, lr=lr, scaling=s)
             for o, lr in (("adamw", 3e-3), ("sgd", 0.5)) for s in ("mean", "sum")]
    specs += [replace(SPEC, steps=4, engine="ddp"), replace(SPEC, steps=4, optimizer="zero1_adamw")]
    runs = _run(measure.dp_train_each, 2, specs)
    ref_adam = measure.reference_losses(specs[0])
    ref_sgd = measure.reference_losses(specs[2])
    assert runs[0][0]["losses"] == runs[1][0]["losses"]  # every rank logs the same global loss
    adam_mean, adam_sum, sgd_mean, sgd_sum, ddp, zero = runs[0]
    assert measure.check_losses(adam_mean["losses"], ref_adam, atol=1e-4) < 1e-4
    assert measure.check_losses(adam_sum["losses"], ref_adam, atol=1e-4) < 1e-4  # blind
    assert measure.check_losses(sgd_mean["losses"], ref_sgd, atol=1e-4) < 1e-4
    with pytest.raises(AssertionError, match="at step 2"):
        measure.check_losses(sgd_sum["losses"], ref_sgd, atol=1e-4)
    assert all(b < a for a, b in zip(ref_sgd[1:], sgd_sum["losses"][1:]))  # "looks better"
    assert measure.check_losses(ddp["losses"], ref_adam, atol=1e-4) < 1e-4
    assert measure.check_losses(zero["losses"], ref_adam, atol=1e-4) < 1e-4


# ------------------------------------------------------------------------- measured run claims


@pytest.fixture(scope="module")
def balanced_run():
    spec = replace(SPEC, steps=4, track_memory=True, log_every=2)
    return spec, launch.run(measure.dp_train, 2, spec, timeout_s=240, threads_per_rank=1,
                            show_output=False)


def test_run_records_and_summary(balanced_run):
    spec, results = balanced_run
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        assert len(r["steps"]) == spec.steps and len(r["losses"]) == spec.steps
        for rec in r["steps"]:
            phases = sum(rec[p] for p in measure.PHASES)
            assert 0 < phases <= rec["step_s"] * 1.001 + 1e-4
            assert rec["local_tokens"] == 8 * 32
    rows = measure.summarize(results)
    assert [row["rank"] for row in rows] == [0, 1]
    for row in rows:
        assert row["tokens_per_s"] == pytest.approx(256 / (row["step_ms"] / 1e3))
        assert row["wait_fraction"] == pytest.approx(row["wait_ms"] / row["step_ms"])
        assert 0 <= row["wait_fraction"] < 1 and row["idle_ms"] >= 0
        assert row["global_tokens_per_s"] == pytest.approx(
            512 / (max(r["step_ms"] for r in rows) / 1e3))
    assert min(row["idle_ms"] for row in rows) >= 0


def test_state_bytes_match_the_prediction(balanced_run):
    _, results = balanced_run
    lay = memory.layout("fp32_adam")
    n_tensors = len(list(tiny_lm.build().parameters()))
    for r in results:
        sb = r["state_bytes"]
        assert (sb["weights"], sb["grads"], sb["optimizer"]) == (
            N * lay.weights, N * lay.grads, N * lay.optimizer)
        assert sb["other"] == 4 * n_tensors == 120
        assert sb["total"] == memory.state_bytes(N, "fp32_adam") + 120 == 1_766_520


def test_peak_memory_claims(balanced_run):
    """Notebook: activations are the largest item at the peak; peak > 2x persistent state."""
    _, results = balanced_run
    for r in results:
        peak = r["peak_bytes"]
        assert peak["total"] > 2 * r["state_bytes"]["total"]
        items = {k: v for k, v in peak.items() if k != "total"}
        assert max(items, key=items.get) == "activation"
        assert peak["activation"] > peak["parameter"] + peak["gradient"] + peak["optstate"]
        assert peak["parameter"] == 4 * N


@pytest.mark.skipif(not HAS_PROC_IO, reason="needs /proc/self/io (Linux)")
def test_bytes_sent_match_ring_formula(balanced_run):
    _, results = balanced_run
    pred2 = measure.predicted_allreduce_bytes(4 * N, 2)
    for r in results:
        for rec in r["steps"]:
            assert 1.0 <= rec["bytes_sent"] / pred2 < 1.003
    four = _run(measure.allreduce_bytes_sent, 4, N)
    pred4 = measure.predicted_allreduce_bytes(4 * N, 4)
    for r in four:
        assert r["payload_bytes"] == 4 * N
        assert 1.0 <= r["bytes_sent"] / pred4 < 1.005


def test_zero1_state_per_rank():
    """Notebook: ZeRO-1 moments 442,368 / 440,832 B per rank, sum = 8N."""
    res = _run(measure.dp_train, 2, replace(SPEC, steps=2, optimizer="zero1_adamw"))
    opt = [r["state_bytes"]["optimizer"] for r in res]
    assert opt == [442_368, 440_832]
    assert sum(opt) == 8 * N
    assert sum(r["state_bytes"]["other"] for r in res) == 120
    pred = memory.zero_state_bytes(N, dp=2, stage=1, layout_name="fp32_adam")["optimizer"]
    assert pred == 441_600 and all(abs(o - pred) / pred < 0.01 for o in opt)


def test_straggler_moves_the_wait_to_the_fast_rank():
    delay = 0.1
    spec = replace(SPEC, steps=4, straggler_rank=1, straggler_delay_s=delay)
    rows = measure.summarize(_run(measure.dp_train, 2, spec))
    fast, slow = rows
    assert slow["forward_ms"] >= 1e3 * delay
    assert fast["wait_ms"] - slow["wait_ms"] >= 0.5e3 * delay
    assert fast["idle_ms"] >= 0.5e3 * delay
    assert fast["idle_ms"] > slow["idle_ms"]
    assert fast["step_ms"] >= 1e3 * delay and slow["step_ms"] >= 1e3 * delay  # both slowed


def test_profile_rows_show_phases_and_the_wait():
    delay = 0.1
    spec = replace(SPEC, steps=3, straggler_rank=1, straggler_delay_s=delay, profile=True)
    res = _run(measure.dp_train, 2, spec)
    for r in res:
        rows = r["profile"]
        phases = [row for row in rows if row["kind"] == "phase"]
        assert [row["name"] for row in phases] == list(measure.PHASES)
        assert all(row["calls"] == 1 for row in phases)
        ops = [row for row in rows if row["kind"] == "op"]
        assert 1 <= len(ops) <= 6 and all(not row["name"].startswith("phase:") for row in ops)
        assert any(row["name"].startswith("aten::") for row in ops)
    fast = {row["name"]: row["ms_per_step"] for row in res[0]["profile"]}
    slow = {row["name"]: row["ms_per_step"] for row in res[1]["profile"]}
    assert slow["forward"] >= 1e3 * delay
    assert fast["wait"] >= 0.5e3 * delay
    assert fast["wait"] > slow["wait"]
    text = measure.format_table(res[0]["profile"])
    assert "ms_per_step" in text.splitlines()[0]


def test_torchrun_demo_entry_runs_on_two_ranks():
    out = _run(measure.demo, 2, 3)
    assert all(set(o) == {"step_ms", "wait_ms"} and o["step_ms"] > 0 for o in out)


# ------------------------------------------------------------------------------ pure helpers


def test_throughput_wait_fraction_and_prediction():
    assert measure.throughput(512, 0.025) == pytest.approx(20_480)
    assert measure.throughput(256, 0.025) == pytest.approx(10_240)
    assert measure.wait_fraction(0.005, 0.025) == pytest.approx(0.2)
    assert measure.predicted_allreduce_bytes(441_600, 1) == 0
    assert measure.predicted_allreduce_bytes(441_600, 2) == 441_600
    assert measure.predicted_allreduce_bytes(441_600, 4) == 662_400
    assert measure.predicted_allreduce_bytes(1.0, 1000) == pytest.approx(1.998)
    for bad in (0, -1, "1", True):
        with pytest.raises(ValueError, match="tokens"):
            measure.throughput(bad, 1.0)
        with pytest.raises(ValueError, match="seconds"):
            measure.throughput(1, bad)
    with pytest.raises(ValueError, match="wait_s"):
        measure.wait_fraction(-1, 1)
    with pytest.raises(ValueError, match="wait_s <= step_s"):
        measure.wait_fraction(2, 1)
    for bad in (math.nan, math.inf, -math.inf):  # nan used to come back as the fraction
        with pytest.raises(ValueError, match="wait_s"):
            measure.wait_fraction(bad, 1.0)
        with pytest.raises(ValueError, match="step_s"):
            measure.wait_fraction(0.5, bad)
    with pytest.raises(ValueError, match="n_bytes"):
        measure.predicted_allreduce_bytes(-1, 2)
    with pytest.raises(ValueError, match="world_size"):
        measure.predicted_allreduce_bytes(1, 0)


def _fake_result(rank, waits, steps_s):
    spec = asdict(replace(SPEC, steps=len(waits)))
    recs = [{"data": 0.001, "forward": 0.002, "backward": 0.003, "wait": w, "optimizer": 0.001,
             "step_s": s, "bytes_sent": 100.0, "local_tokens": 256} for w, s in zip(waits, steps_s)]
    return {"rank": rank, "spec": spec, "steps": recs}


def test_summarize_unit():
    # warm-up step 0 is dropped; idle = wait - fastest wait in the same step
    r0 = _fake_result(0, [9.0, 0.010, 0.030], [9.0, 0.020, 0.040])
    r1 = _fake_result(1, [9.0, 0.002, 0.004], [9.0, 0.020, 0.040])
    rows = measure.summarize([r0, r1])
    assert rows[0]["wait_ms"] == pytest.approx(20.0)
    assert rows[0]["idle_ms"] == pytest.approx(((0.010 - 0.002) + (0.030 - 0.004)) / 2 * 1e3)
    assert rows[1]["idle_ms"] == pytest.approx(0.0)
    assert rows[0]["step_ms"] == pytest.approx(30.0)
    assert rows[0]["tokens_per_s"] == pytest.approx(256 / 0.030)
    assert rows[0]["global_tokens_per_s"] == pytest.approx(512 / 0.030)
    assert rows[0]["wait_fraction"] == pytest.approx(20 / 30)
    assert rows[0]["bytes_sent"] == 100.0
    with pytest.raises(ValueError, match="results"):
        measure.summarize([])
    with pytest.raises(ValueError, match="results"):
        measure.summarize([{"rank": 0}])


def test_format_table_and_plot():
    rows = [{"rank": 0, "x_ms": 1.234567, "name": "a"}, {"rank": 1, "x_ms": float("nan"),
                                                        "name": "bb"}]
    text = measure.format_table(rows, digits=1)
    lines = text.splitlines()
    assert lines[0].split() == ["rank", "x_ms", "name"]
    assert lines[1].split() == ["0", "1.2", "a"] and "nan" in lines[2]
    with pytest.raises(ValueError, match="columns not in rows"):
        measure.format_table(rows, ["nope"])
    with pytest.raises(ValueError, match="rows"):
        measure.format_table([])
    assert measure.format_table(rows, ["rank", "x_ms"], headers={"x_ms": "x"}).splitlines()[
        0].split() == ["rank", "x"]
    r0 = _fake_result(0, [0.0, 0.010], [0.0, 0.020])
    ax = measure.plot_step_breakdown(measure.summarize([r0]), "t")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(measure.PHASES)
    assert style.problems(ax.figure) == []
    assert measure.plot_step_breakdown(measure.summarize([r0]), legend=False).get_legend() is None
    with pytest.raises(ValueError, match="rows"):
        measure.plot_step_breakdown([])
    ax = measure.plot_loss_curves([3.0, 2.0, 1.5], {"averaged": [3.0, 2.0, 1.5],
                                                    "summed": [3.0, 1.5, 1.0]}, "t")
    ax.legend()
    assert [line.get_label() for line in ax.get_lines()] == ["one process", "averaged", "summed"]
    assert style.problems(ax.figure) == []
    with pytest.raises(ValueError, match="equal length"):
        measure.plot_loss_curves([1.0, 2.0], {"a": [1.0]})
    import matplotlib.pyplot as plt

    plt.close("all")


def test_profile_table_sets_ranks_side_by_side():
    def prof(rank, ops):
        rows = [{"name": p, "kind": "phase", "calls": 1, "ms_per_step": 1.0 + rank}
                for p in measure.PHASES]
        return {"rank": rank, "profile": rows + [{"name": n, "kind": "op", "calls": 1,
                                                  "ms_per_step": v} for n, v in ops]}

    text = measure.profile_table([prof(0, [("mm", 3.0), ("index", 2.0), ("lerp", 0.5)]),
                                  prof(1, [("lerp", 4.0), ("mm", 1.0)])], top=2)
    lines = text.splitlines()
    assert lines[0].split() == ["ms", "per", "step", "rank", "0", "rank", "1"]
    assert [ln.split()[0] for ln in lines[1:6]] == list(measure.PHASES)
    assert lines[6] == "operators (self time)"
    assert [ln.split() for ln in lines[7:]] == [["lerp", "0.50", "4.00"], ["mm", "3.00", "1.00"],
                                                ["index", "2.00", "-"]]
    with pytest.raises(ValueError, match="profile=True"):
        measure.profile_table([{"rank": 0, "profile": None}])


@pytest.mark.parametrize("kwargs, word", [
    ({"global_batch": 0}, "global_batch"), ({"steps": 1}, "warmup_steps"),
    ({"lr": 0}, "lr"), ({"optimizer": "adam"}, "optimizer"), ({"scaling": "avg"}, "scaling"),
    ({"engine": "fsdp"}, "engine"), ({"straggler_rank": -1}, "straggler_rank"),
    ({"straggler_delay_s": 60}, "straggler_delay_s"), ({"cfg": {}}, "cfg"),
    ({"profile": True, "track_memory": True}, "profile and track_memory"),
    ({"seed": 1.0}, "seed"),
])
def test_runspec_rejects_bad_values(kwargs, word):
    with pytest.raises(ValueError, match=word):
        RunSpec(**kwargs)


def test_workers_reject_bad_world_and_inputs():
    # checked before any collective, so they can be called in-process
    with pytest.raises(ValueError, match="divide evenly"):
        measure.dp_train(0, 3, SPEC)
    with pytest.raises(ValueError, match="straggler_rank"):
        measure.dp_gradients(0, 2, replace(SPEC, straggler_rank=2))
    with pytest.raises(ValueError, match="n_elements"):
        measure.allreduce_bytes_sent(0, 2, 0)
    with pytest.raises(ValueError, match="scaling"):
        measure.allreduce_gradients(tiny_lm.build(), 2, "avg")
    with pytest.raises(ValueError, match="spec"):
        measure.reference_gradients({})
    with pytest.raises(ValueError, match="n_steps"):
        measure.profile_rows(None, 0)


@pytest.mark.skipif(not HAS_PROC_IO, reason="needs /proc/self/io (Linux)")
def test_bytes_written_counts_writes(tmp_path):
    before = measure.bytes_written()
    with open(tmp_path / "f", "wb") as f:
        f.write(b"x" * 10_000)
    assert measure.bytes_written() - before >= 10_000
    assert isinstance(os.getpid(), int) and not math.isnan(before)


# ---------------------------------------------------------------------------------- clocks


def test_synchronize_waits_for_cuda_only(monkeypatch):
    """CPU: nothing to wait for. CUDA: torch.cuda.synchronize(device), before the clock read."""
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(
        ("cuda", device)))
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda device=None: events.append(
        ("accelerator", device)))
    for device in ("cpu", torch.device("cpu"), torch.ones(2), torch.device("meta")):
        measure.synchronize(device)
    assert events == []  # a no-op on CPU
    measure.synchronize("cuda:1")
    measure.synchronize("mps")
    assert events == [("cuda", torch.device("cuda:1")), ("accelerator", torch.device("mps"))]
    with pytest.raises(ValueError, match="device"):
        measure.synchronize(1.5)
    with pytest.raises(ValueError, match="device"):
        measure.synchronize("gpu")
    # clock: on CPU it is perf_counter; on CUDA it waits for the device, then reads the clock
    events.clear()
    t0 = measure.clock()
    assert measure.clock(torch.ones(1)) >= t0 and events == []
    monkeypatch.setattr(runtime_clock, "time", types.SimpleNamespace(
        perf_counter=lambda: events.append("clock") or 12.5))
    assert measure.clock("cuda") == 12.5
    assert events == [("cuda", torch.device("cuda")), "clock"]


@pytest.fixture
def solo_group():
    """A one-rank gloo group in this process, so that a worker's clock readings can be watched."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=timedelta(seconds=60))
    yield
    dist.destroy_process_group()


def _watch_clock(monkeypatch, where=None):
    """Replace the clock the timers of module ``where`` read (``where.clock``; default
    measure.step, the step's timers) by a wrapper that records the device of every reading."""
    where = measure_step if where is None else where
    devices, real = [], measure.clock

    def watched(device="cpu"):
        devices.append(torch.device(device.device if isinstance(device, torch.Tensor)
                                    else device))
        return real(device)

    monkeypatch.setattr(where, "clock", watched)
    return devices


def test_every_timer_reads_the_clock_of_its_tensors(monkeypatch, solo_group):
    """The timers go through runtime.clock's clock (so they synchronize on CUDA) with the
    device the timed work runs on: twice per all-reduce, twice per phase and twice per step."""
    devices = _watch_clock(monkeypatch)
    model = tiny_lm.build()
    x, y = corpus(SPEC).batch(0, 2, SPEC.cfg.seq_len)
    tiny_lm.lm_loss(model, x, y).backward()
    comm = measure.allreduce_gradients(model, 1)
    assert devices == [torch.device("cpu")] * 2 and comm["wait_s"] >= 0
    devices.clear()
    spec = replace(SPEC, steps=2, global_batch=2)
    out = measure.dp_train(0, 1, spec)
    assert devices == [torch.device("cpu")] * spec.steps * (2 + 2 * len(measure.PHASES) + 2)
    assert all(rec["step_s"] >= rec["wait"] >= 0 for rec in out["steps"])
    devices.clear()
    measure.dp_train(0, 1, replace(spec, engine="ddp"))  # DDP: the comm hook reads it too
    per_step = 2 + 2 * len(measure.PHASES)
    assert len(devices) >= spec.steps * (per_step + 2) and set(devices) == {torch.device("cpu")}


def test_busy_reason_names_a_busy_machine_and_a_starved_process(monkeypatch):
    """Timings warn when they cannot be trusted: load above the cores, or a compute-bound
    measurement that got well under its share of a core."""
    import os

    cores = len(os.sched_getaffinity(0))
    monkeypatch.setattr(os, "getloadavg", lambda: (cores + 2.0, 0.0, 0.0))
    assert "busy" in measure.busy_reason() and f"on {cores} cores" in measure.busy_reason()
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.0, 0.0))
    assert measure.busy_reason() is None
    assert measure.busy_reason(wall_s=1.0, cpu_s=0.95) is None
    assert "ran 30%" in measure.busy_reason(wall_s=1.0, cpu_s=0.3)
    assert measure.busy_reason(wall_s=1.0, cpu_s=1.5, threads=2) is None


def test_warn_if_busy_prints_one_line(monkeypatch, capsys):
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (99.0, 0.0, 0.0))
    assert measure.warn_if_busy("bucket") is not None
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("note: the bucket timings are unreliable")

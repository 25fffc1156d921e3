"""Module 11: real PyTorch sharding on a fake process group, against the course's formulas,
against exact counts, and against real gloo ranks; the lecture's stated figures."""

from __future__ import annotations

import warnings

import pytest
import torch

from course_utils import style
from course_utils.runtime import backend
from course_utils.models import llama_shapes
from course_utils.memory import sizing as memory
from course_utils.scale import check as scale_check
from course_utils.scale import comms as scale_comms
from course_utils.scale import memory as scale_memory
from course_utils.scale import tables as scale_tables
from course_utils.zero import sizes as zero_sizes

N7, N70, N405 = (llama_shapes.param_count(m) for m in ("7B", "70B", "405B"))


# ------------------------------------------------------------------------------ shapes


def test_param_counts_are_the_published_models_and_the_meta_models_agree():
    assert (N7, N70, N405) == (6_738_415_616, 68_976_648_192, 405_853_388_800)
    for name in ("7B", "tiny"):
        assert sum(p.numel() for p in llama_shapes.build(name).parameters()) == \
            llama_shapes.param_count(name)
    stages = [llama_shapes.build("70B", pp=2, stage=s) for s in (0, 1)]
    assert sum(p.numel() for m in stages for p in m.parameters()) == N70
    assert all(p.is_meta for p in stages[0].parameters())


@pytest.mark.parametrize("layers,pp", [(126, 16), (80, 3), (32, 8), (32, 4), (4, 4), (7, 1)])
def test_stage_layers_cover_every_layer_once_under_both_splits(layers, pp):
    """Even: the first stages take the extra layers. Balanced (torchtitan's
    generate_llm_fqn_per_model_part, Llama 3): with the embedding and the output weighing a
    layer each, every stage's effective count differs by at most one, and the first stages take
    the extra; Llama 3 405B on 16 stages: 7, 8 x 14, 7."""
    for split in llama_shapes.SPLITS:
        stages = [llama_shapes.stage_layers(layers, pp, s, split) for s in range(pp)]
        assert [i for r in stages for i in r] == list(range(layers))
        sizes = [len(r) for r in stages]
        if split == "balanced" and pp > 1:
            sizes = [n + (k == 0) + (k == pp - 1) for k, n in enumerate(sizes)]
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True), split
    assert [len(llama_shapes.stage_layers(126, 16, s)) for s in range(16)] == [7] + [8] * 14 + [7]
    assert [len(llama_shapes.stage_layers(32, 4, s)) for s in range(4)] == [8, 9, 8, 7]
    with pytest.raises(ValueError, match="pp"):
        llama_shapes.stage_layers(4, 5, 0, "even")
    with pytest.raises(ValueError, match="pp"):
        llama_shapes.stage_layers(4, 7, 0)
    with pytest.raises(ValueError, match="split must be one of"):
        llama_shapes.stage_layers(4, 2, 0, "uneven")


def test_fake_job_checks_its_arguments_and_reraises():
    with pytest.raises(ValueError, match="rank"):
        backend.fake_job(4, 4, print)
    with pytest.raises(ZeroDivisionError):
        backend.fake_job(0, 2, lambda: 1 / 0)
    assert backend.fake_job(1, 2, lambda: torch.distributed.get_rank()) == 1
    assert not torch.distributed.is_initialized()
    with pytest.warns(UserWarning, match="a rank's own warning"):   # nothing silenced on the way
        backend.fake_job(0, 2, warnings.warn, "a rank's own warning")


# ------------------------------------------------------------------------------ memory


def test_7b_on_8_ranks_is_16n_over_8_exactly_and_ddp_16n():
    fsdp = scale_memory.rank_state("7B", dp=8, rank=3)
    assert fsdp["params"] == fsdp["padded"] == N7 // 8 == 842_301_952
    assert (fsdp["weights"], fsdp["grads"], fsdp["optimizer"]) == (4 * N7 // 8, 4 * N7 // 8,
                                                                   8 * N7 // 8)
    assert fsdp["total"] == memory.zero_state_bytes(N7, 8, 3)["total"]
    ddp = scale_memory.rank_state("7B", dp=8, rank=3, strategy="ddp")
    assert ddp["total"] == 16 * N7 == memory.zero_state_bytes(N7, 8, 0)["total"]


def test_course_zero_equals_the_formula_when_everything_divides():
    for stage in (0, 1, 2, 3):
        assert scale_memory.course_zero("7B", 8, stage)["total"] == \
            memory.zero_state_bytes(N7, 8, stage)["total"]
    # 12 ranks: per-tensor padding adds what the ideal formula leaves out
    ideal = memory.zero_state_bytes(N7, 12, 3)["total"]
    assert scale_memory.course_zero("7B", 12, 3)["total"] > ideal


def test_uneven_shards_sum_to_the_model_and_every_rank_allocates_the_padded_chunk():
    states = [scale_memory.rank_state("tiny", dp=8, rank=r) for r in range(8)]
    assert sum(s["params"] for s in states) == llama_shapes.param_count("tiny")
    assert len({s["padded"] for s in states}) == 1
    assert states[0]["params"] > states[7]["params"]          # vocabulary 100 over 8
    assert all(s["optimizer"] == 8 * s["params"] for s in states)
    assert all(s["weights"] == s["grads"] == 4 * s["padded"] for s in states)
    r0, r11 = (scale_memory.rank_state("7B", dp=12, rank=r) for r in (0, 11))
    assert r0["padded"] == r11["padded"] == r0["params"] == 562_296_534
    assert r11["params"] == 553_153_742
    assert round(r0["total"] / 1e9, 3) == 8.997 and round(r11["total"] / 1e9, 3) == 8.924


def test_70b_stages_exceed_16n_over_32_by_the_norms_tp_keeps_whole():
    s0, s1 = (scale_memory.rank_state("70B", 4, 2, 4, r) for r in (0, 31))
    assert (s0["coords"]["pp"], s1["coords"]["pp"]) == (0, 1)
    shape = llama_shapes.shape("70B")
    h, L = shape.hidden, shape.layers
    layer = sum(llama_shapes.layer_params(shape).values()) - 2 * h
    # stage 0: 40 layers' matrices over TP x DP, their 2 norms over DP only, the embedding
    expect0 = L // 2 * (layer // 16 + 2 * h // 4) + shape.vocab * h // 16
    assert s0["params"] == expect0 and s1["params"] == expect0 + h // 4
    assert s1["total"] - s0["total"] == 32_768
    assert s0["total"] == 34_490_286_080 and 16 * N70 // 32 == 34_488_324_096
    assert scale_memory.course_formula("70B", 4, 2, 4) == 16 * N70 / 32


@pytest.mark.parametrize("model,tp,pp,dp,rank,strategy", [
    ("tiny", 2, 2, 3, 5, "fsdp2"), ("7B", 1, 1, 8, 3, "ddp"), ("7B", 1, 1, 12, 11, "fsdp2"),
    ("7B", 2, 4, 5, 37, "fsdp2"), ("70B", 8, 3, 7, 121, "fsdp2"), ("70B", 4, 2, 4, 31, "fsdp2")])
def test_one_layer_counted_per_layer_equals_the_whole_stage(model, tp, pp, dp, rank, strategy):
    """rank_state builds one layer of the stage and counts it once per layer: the same bytes,
    elements and padding as building every layer (uneven stages, padded chunks, TP, DDP)."""
    short = scale_memory.rank_state(model, tp, pp, dp, rank, strategy)
    full = scale_memory.rank_state(model, tp, pp, dp, rank, strategy, full=True)
    for key in ("weights", "grads", "optimizer", "total", "params", "padded", "layers"):
        assert short[key] == full[key], key
    assert short["layers"] > 1


# ------------------------------------------------------------------------------ collectives


@pytest.mark.parametrize("model,tp,pp,dp,rank", [("tiny", 2, 1, 2, 1), ("7B", 2, 8, 1, 15),
                                                 ("tiny", 1, 2, 2, 0)])
def test_extending_one_and_two_layers_equals_the_full_trace(model, tp, pp, dp, rank):
    kw = dict(batch=1, seq=16)
    full = scale_comms.trace_step(model, tp, pp, dp, rank, full=True, **kw)
    short = scale_comms.trace_step(model, tp, pp, dp, rank, **kw)
    assert full["layers_traced"] == full["layers"] and short["layers_traced"] <= 2
    assert short["rows"] == full["rows"]


def test_70b_step_against_the_course_formulas():
    trace = scale_comms.trace_step("70B", 4, 2, 4, 0)
    course = scale_comms.course_comms("70B", 4, 2, 4, 0)
    rows, shape = trace["rows"], llama_shapes.shape("70B")
    n, act = 40, 4096 * shape.hidden * 2
    assert rows[("dp", "reduce_scatter")]["sent"] == course[("dp", "reduce_scatter")]
    assert rows[("dp", "reduce_scatter")]["calls"] == n + 1
    # FSDP2 keeps the root (the embedding, TP-sharded) gathered from forward to backward
    root = shape.vocab * shape.hidden // 4
    assert rows[("dp", "all_gather")]["calls"] == 2 * n + 1
    assert rows[("dp", "all_gather")]["sent"] == pytest.approx(
        course[("dp", "all_gather")] - 3 / 4 * root * 2, rel=1e-12)
    # TP: 2 forward + 5 backward all-reduces per layer, and the embedding's forward one
    assert rows[("tp", "all_reduce")]["calls"] == 7 * n + 1
    assert rows[("tp", "all_reduce")]["sent"] == (7 * n + 1) * 2 * 3 / 4 * act
    assert course[("tp", "all_reduce")] == 4 * n * 2 * 3 / 4 * act
    assert course[("pp", "send")] == act and ("pp", "send") not in rows


def test_three_tp_plans_traced_per_layer():
    """70B on TP 4 x PP 2 x DP 4, rank 0 (40 layers and the embedding): the per-linear plan
    all-reduces 2 + 5 times a layer; one DTensor input per half-layer gives Megatron's 2 + 2;
    sequence parallelism turns each all-reduce into an all-gather and a reduce-scatter (the
    same bytes in all, as a ring all-reduce is those two), plus the norms' small weight
    gradients. The DP rows are the same under every plan."""
    n, act = 40, 4096 * llama_shapes.shape("70B").hidden * 2
    rows = {plan: scale_comms.trace_step("70B", 4, 2, 4, 0, tp_plan=plan)["rows"]
            for plan in llama_shapes.TP_PLANS}
    calls = {plan: {k: v["calls"] for k, v in r.items() if k[0] == "tp"}
             for plan, r in rows.items()}
    assert calls["per_linear"] == {("tp", "all_reduce"): 7 * n + 1}
    assert calls["block"] == {("tp", "all_reduce"): 4 * n + 1}
    assert calls["sequence"] == {("tp", "all_gather"): 4 * n + 1,
                                 ("tp", "reduce_scatter"): 4 * n + 1,
                                 ("tp", "all_reduce"): 2 * n}
    assert rows["block"][("tp", "all_reduce")]["sent"] == (4 * n + 1) * 2 * 3 / 4 * act
    sp = rows["sequence"]
    assert sp[("tp", "all_gather")]["sent"] + sp[("tp", "reduce_scatter")]["sent"] == (
        rows["block"][("tp", "all_reduce")]["sent"])
    assert sp[("tp", "all_reduce")]["sent"] < 1e-3 * rows["block"][("tp", "all_reduce")]["sent"]
    for plan in ("block", "sequence"):
        assert {k: v for k, v in rows[plan].items() if k[0] == "dp"} == {
            k: v for k, v in rows["per_linear"].items() if k[0] == "dp"}


def test_fp32_gradient_reduction_sends_twice_the_bf16_reduce_scatter():
    """torchtitan's default and Llama 3's: the DP reduce-scatter in fp32, the gathers still
    bf16."""
    bf16, fp32 = (scale_comms.trace_step("7B", 2, 2, 2, 0, reduce_dtype=r)["rows"]
                  for r in ("bf16", "fp32"))
    assert fp32[("dp", "reduce_scatter")]["sent"] == 2 * bf16[("dp", "reduce_scatter")]["sent"]
    assert fp32[("dp", "all_gather")] == bf16[("dp", "all_gather")]
    with pytest.raises(ValueError, match="reduce_dtype must be one of"):
        scale_comms.trace_step("tiny", 1, 1, 2, 0, reduce_dtype="fp16")
    with pytest.raises(ValueError, match="tp_plan must be one of"):   # even with no TP
        scale_comms.trace_step("tiny", 1, 1, 2, 0, tp_plan="megatron")


@pytest.mark.parametrize("m", [1, 2, 5])
def test_a_step_of_m_microbatches_repeats_tp_and_reduces_dp_once(m):
    """70B on TP 4 x PP 2 x DP 4, rank 0 (40 layers and the root's embedding): a step of m
    microbatches all-reduces over TP m times as often as one microbatch, reduce-scatters over
    DP once, and all-gathers 41 + 40 m times under FSDP2's default (every backward gathers the
    layers again) or 41 times, for any m, when the layers stay gathered (torchtitan under PP).
    The extension from one and two layers agrees with tracing all of a 7B stage."""
    one = scale_comms.trace_step("70B", 4, 2, 4, 0)["rows"]
    n = 40
    for reshard, gathers in ((True, n + 1 + n * m), (False, n + 1)):
        rows = scale_comms.trace_step("70B", 4, 2, 4, 0, microbatches=m,
                                      reshard_after_forward=reshard)["rows"]
        assert rows[("tp", "all_reduce")]["calls"] == m * one[("tp", "all_reduce")]["calls"]
        assert rows[("tp", "all_reduce")]["sent"] == m * one[("tp", "all_reduce")]["sent"]
        assert rows[("dp", "reduce_scatter")] == one[("dp", "reduce_scatter")]
        assert rows[("dp", "all_gather")]["calls"] == gathers
    kw = dict(batch=1, seq=16, microbatches=m, reshard_after_forward=True)
    assert (scale_comms.trace_step("7B", 2, 8, 1, 15, **kw)["rows"]
            == scale_comms.trace_step("7B", 2, 8, 1, 15, full=True, **kw)["rows"])
    with pytest.raises(ValueError, match="microbatches must be"):
        scale_comms.trace_step("tiny", 1, 1, 2, 0, microbatches=0)
    with pytest.raises(ValueError, match="reshard_after_forward must be True or False"):
        scale_comms.trace_step("tiny", 1, 1, 2, 0, reshard_after_forward="no")


def test_ring_bytes_per_rank():
    assert scale_comms.sent_bytes("all_reduce", 800, 4) == 1200
    assert scale_comms.sent_bytes("all_gather", 800, 4) == 600
    assert zero_sizes.expected_comm_bytes([8, 8], 2, 3, "fp32")["reduce_scatter"] == 32


# ------------------------------------------------------------------------------ real ranks


def test_each_tp_plan_on_real_ranks_equals_one_process():
    """2 real gloo ranks, the tiny Llama whole on each: under every plan the loss and every
    gradient (gathered whole) equal one process's, two seeds; the collectives counted on the
    real ranks are the plan's (4 layers, the embedding's forward and the head's backward)."""
    from rank_jobs import job, run_jobs

    plans = [(plan, seed) for plan in llama_shapes.TP_PLANS for seed in (0, 1)]
    results = run_jobs([job(scale_check.tp_plan_worker, tp_plan=plan, seed=seed)
                        for plan, seed in plans], 2, timeout_s=180)
    want = {"per_linear": {"all_reduce": 7 * 4 + 2}, "block": {"all_reduce": 4 * 4 + 2},
            "sequence": {"all_gather": 4 * 4 + 2, "reduce_scatter": 4 * 4 + 2}}
    for (plan, seed), ranks in zip(plans, results):
        for r in ranks:
            torch.testing.assert_close(*r["loss"], rtol=1e-6, atol=1e-7)
            for name, (got, ref) in r["grads"].items():
                torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6, msg=f"{plan} {name}")
            assert r["collectives"] == want[plan], (plan, r["collectives"])


@pytest.mark.parametrize("tp,pp,dp,step", [(2, 2, 2, {}), (1, 1, 8, {}), (2, 2, 3, {}),
                                           (2, 2, 2, {"microbatches": 3}),
                                           (2, 2, 2, {"microbatches": 3,
                                                      "reshard_after_forward": False})])
def test_real_gloo_ranks_equal_the_simulation(tp, pp, dp, step):
    """8 or 12 real ranks: each rank's weights, measured gradients, AdamW state and collectives
    (count and bytes per axis) equal the fake process group's for that rank, for one microbatch
    and for a step of three (gradients accumulated, with and without resharding after
    forward); DP 3 and DP 8 make the shards uneven."""
    real, sims, differences = scale_check.check(tp, pp, dp, **step)
    assert differences == []
    assert len(real) == tp * pp * dp and all(r["rows"] for r in real)
    if dp == 8:  # vocabulary 100 over 8 ranks: the last ranks hold less
        assert real[0]["optimizer"] > real[7]["optimizer"]
        assert real[0]["weights"] == real[7]["weights"]


# ------------------------------------------------------------------------------ the lecture


def test_the_lesson_table_the_lecture_states():
    rows = {r["key"]: r for r in scale_tables.lesson_rows()}
    gb = {k: (round(r["formula"] / 1e9, 2), round(r["simulated"] / 1e9, 2))
          for k, r in rows.items()}
    assert gb == {"DDP": (107.81, 107.81), "ZeRO-1": (37.06, 37.06), "ZeRO-2": (25.27, 25.27),
                  "ZeRO-3": (13.48, 13.48), "70B 3-D": (34.49, 34.49)}
    assert [r["lesson"] for r in rows.values()] == [112, 38.5, 26.25, 14, 35]
    assert 7e9 * 16 / 1e9 == 112 and (4 + 12 / 8) * 7 == 38.5 and (2 + 14 / 8) * 7 == 26.25
    # the figure stacks each row's parts: they add up to its total; FSDP2 keeps 4 + 4 + 8 bytes
    for r in rows.values():
        assert sum(r["parts"].values()) == r["simulated"]
    n = llama_shapes.param_count("7B")
    assert [rows["ZeRO-3"]["parts"][k] * 8 / n for k in ("weights", "grads", "optimizer")] == [
        4, 4, 8]
    fig = scale_tables.draw_lesson(list(rows.values()))
    assert not style.problems(fig) and len(fig.axes[0].patches) == 3 * len(rows)


def test_the_jobs_the_lecture_states():
    rows = scale_tables.job_rows(scale_tables.PUBLISHED[1:])
    got = [(r["ranks"], round(r["min"] / 1e9, 2), round(r["max"] / 1e9, 2),
            round(r["formula"] / 1e9, 2)) for r in rows]
    assert got == [(1024, 6.10, 6.38, 6.34), (16384, 0.37, 0.40, 0.40)]
    assert round(rows[1]["max"] / 1e9, 3) == 0.398
    # the even split puts 8 layers and the embedding on stage 0: the largest rank, 6.90 GB
    even = scale_memory.rank_state("405B", 8, 16, 8, 0, split="even")["total"]
    assert round(even / 1e9, 2) == 6.90 and even > rows[0]["max"]
    # every rank's bytes are one of the representative ranks': check a middle rank directly
    middle = scale_memory.rank_state("405B", 8, 16, 8, 5 * 64 + 3 * 8 + 5)["total"]
    assert middle in rows[0]["by_rank"].values()

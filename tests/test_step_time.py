"""Module 13: the step-time model term by term, against the simulator, hand counts and the
papers' own formulas; the published runs' table and the lecture's statements about it; the
calibration's fit and its cached check on module 10's trainer."""

from __future__ import annotations

import functools
import math

import pytest

from course_utils.collectives.cost import ring_time_s
from course_utils.models import llama_shapes
from course_utils.pipeline.schedule import bubble_fraction
from course_utils.step_time import calibrate, hardware, published, terms, transformer
from course_utils.step_time.hardware import Hardware, Link

# a device whose memory is never the limit, so that every matmul sits on the compute side
FLAT = Hardware("flat", 1e12, 1e18, Link(1e-6, 1e11), Link(1e-5, 1e10), efficiency=0.5)
SMALL = transformer.Arch("small", layers=4, hidden=256, ffn=768, heads=8, kv_heads=4,
                         vocab=1000)


# ------------------------------------------------------------------------------ hardware


def test_matmul_roofline_takes_the_larger_side():
    # compute-bound: 2mkn at the achieved rate
    assert hardware.matmul_s(4096, 4096, 4096, FLAT) == 2 * 4096 ** 3 / 0.5e12
    # memory-bound: a thin matmul on a device with little bandwidth
    slow_memory = FLAT.but(mem_bytes_per_s=1e9)
    moved = (1 * 4096 + 4096 * 4096 + 1 * 4096) * 2
    assert hardware.matmul_s(1, 4096, 4096, slow_memory) == pytest.approx(moved / 1e9)
    assert hardware.H100.achieved_flops == pytest.approx(794.5e12)
    assert hardware.A100.achieved_flops == pytest.approx(271.2e12)


@pytest.mark.parametrize("bad, name", [(dict(peak_flops=0), "peak_flops"),
                                       (dict(efficiency=1.5), "efficiency"),
                                       (dict(gpus_per_node=0), "gpus_per_node")])
def test_hardware_names_a_bad_figure(bad, name):
    with pytest.raises(ValueError, match=name):
        FLAT.but(**bad)
    with pytest.raises(ValueError, match="alpha_s"):
        Link(-1.0, 1e9)


# ------------------------------------------------------------------------------ terms


@pytest.mark.parametrize("p, m", [(2, 2), (4, 8), (8, 16), (3, 5)])
def test_1f1b_without_sends_has_the_bubble_formula(p, m):
    f, b = 0.3, 0.6
    t = terms.assemble(pp=p, m=m, forward_s=f, backward_s=b)
    assert t.total == pytest.approx((m + p - 1) * (f + b))
    assert t.bubble / t.total == pytest.approx(bubble_fraction(p, m))
    assert t.compute == pytest.approx(m * (f + b))


def test_tp_adds_inside_the_microbatch_and_hidden_dp_is_shown_not_added():
    t = terms.assemble(pp=1, m=3, forward_s=1.0, backward_s=2.0, tp_forward_s=0.25,
                       tp_backward_s=0.5, dp=((4.0, 2.0), (1.0, 0.0), (0.5, 1.0)),
                       optimizer_s=0.1)
    assert t.compute == 9.0 and t.tp == 2.25 and t.bubble == pytest.approx(0.0)
    assert t.dp_exposed == 3.0                   # 4 - 2, 1 - 0, nothing of the third
    assert t.dp_hidden == pytest.approx(2.5)
    assert t.total == pytest.approx(9.0 + 2.25 + 3.0 + 0.1)
    assert "not added" in terms.format_terms(t)


@pytest.mark.parametrize("kw, name", [(dict(pp=0), "pp"), (dict(forward_s=0.0), "forward_s"),
                                      (dict(dp=((-1.0, 0.0),)), r"dp\[0\] seconds"),
                                      (dict(schedule="zb"), "schedule")])
def test_assemble_names_a_bad_argument(kw, name):
    args = dict(pp=2, m=4, forward_s=1.0, backward_s=2.0) | kw
    with pytest.raises(ValueError, match=name):
        terms.assemble(**args)


# ------------------------------------------------------------------------------ transformer


@pytest.mark.parametrize("name", ["7B", "70B", "405B", "tiny"])
def test_param_count_equals_module_11s(name):
    assert transformer.param_count(transformer.Arch.llama(name)) == \
        llama_shapes.param_count(name)


@pytest.mark.parametrize("arch", [published.GPT_1T, published.GPT_145B, published.MEGASCALE_175B])
@pytest.mark.parametrize("seq", [2048, 8192])
def test_megatrons_equation_is_the_attention_count_with_a_recomputed_forward(arch, seq):
    # Narayanan et al.'s 96 L h^2 (1 + s/6h + V/16Lh) = 4/3 of every layer's FLOPs (three
    # passes and a recomputed forward) plus the logits' 6 V h (not recomputed)
    logits = 6 * arch.vocab * arch.hidden
    want = 4 / 3 * (transformer.flops_per_token(arch, seq) - logits) + logits
    assert transformer.flops_per_token(arch, seq, "megatron") == pytest.approx(want, rel=1e-12)


def test_attention_share_the_lecture_states():
    big, small = published.LLAMA3_405B, published.LLAMA3_8B
    share = [12 * a.layers * 8192 * a.hidden / transformer.flops_per_token(a, 8192)
             for a in (big, small)]
    assert round(100 * share[0]) == 8             # "8 % of the total"
    assert 0.19 < share[1] < 0.23                 # "a fifth of an 8B model's FLOPs"


@pytest.mark.parametrize("tp, pp, dp, m", [(1, 1, 2, 1), (2, 1, 2, 2), (2, 2, 1, 4),
                                            (4, 2, 2, 4)])
def test_predict_equals_a_hand_count(tp, pp, dp, m):
    job = transformer.Job(SMALL, tp=tp, pp=pp, dp=dp, global_batch=m * dp, seq=128)
    p = transformer.predict(job, FLAT)
    a, n = SMALL, 128
    kv = a.kv_heads * a.head_dim
    layer = 2 * n * (a.hidden * a.hidden // tp * 2 + 2 * a.hidden * kv // tp
                     + 3 * a.hidden * a.ffn // tp)
    layer += 2 * 2 * n * a.head_dim * 128 * (a.heads // tp)
    forward = (a.layers * layer + 2 * n * a.hidden * a.vocab // tp) / 0.5e12 / pp
    assert p.parts["forward_s"] == pytest.approx(forward)
    assert p.terms.compute == pytest.approx(m * 3 * forward)
    one = ring_time_s(n * a.hidden * 2, tp, 1e-6, 1e11) if tp > 1 else 0.0
    assert p.terms.tp == pytest.approx(m * a.layers / pp * 4 * one)
    shard = transformer.param_count(a) / (tp * pp)
    link = FLAT.intra if job.gpus <= 8 else FLAT.inter
    rs = ring_time_s(4 * shard, dp, link.alpha_s, link.bytes_per_s, "reduce_scatter") \
        if dp > 1 else 0.0
    ag = ring_time_s(2 * shard, dp, link.alpha_s, link.bytes_per_s, "all_gather") \
        if dp > 1 else 0.0
    assert p.terms.dp_exposed == pytest.approx(max(0, rs - 2 * forward) + max(0, ag - forward))
    assert p.terms.optimizer == pytest.approx(shard / dp * 30 / 1e18)
    if pp == 1:
        assert p.terms.bubble == pytest.approx(0.0, abs=1e-15)


def test_tp_beyond_a_node_goes_on_the_network():
    job = transformer.Job(published.GPT_1T, tp=16, pp=1, dp=1, global_batch=1, seq=4096)
    inside = job.but(tp=8)
    one = transformer.predict(job, hardware.H100).terms.tp
    assert one > 5 * transformer.predict(inside, hardware.H100).terms.tp


@pytest.mark.parametrize("kw, name", [(dict(tp=3), "heads"), (dict(cp=5), "seq"),
                                      (dict(pp=200), "pp"), (dict(global_batch=7), "global_batch"),
                                      (dict(recompute="some"), "recompute")])
def test_job_names_a_bad_plan(kw, name):
    with pytest.raises(ValueError, match=name):
        transformer.Job(SMALL, tp=2, pp=2, dp=2, global_batch=8, seq=128).but(**kw)


def test_predict_refuses_what_is_not_a_job():
    with pytest.raises(ValueError, match="job must be"):
        transformer.predict({"tp": 8}, hardware.H100)


# ------------------------------------------------------------------------------ published runs


@functools.lru_cache(maxsize=None)
def _rows():
    return published.rows()


def test_the_figures_are_the_papers():
    rows = _rows()
    got = {(r["label"], r["kind"]): r["published"] for r in rows}
    assert got[("Llama 3 405B, 8,192 H100", "tflops_per_gpu")] == 430
    assert got[("Llama 3 405B, 16,384 H100, CP 16", "mfu")] == 0.38
    assert got[("Megatron GPT 1T, 3,072 A100", "mfu")] == 0.52
    assert got[("MegaScale 175B, 12,288 A100", "step_s")] == 6.34
    assert got[("torchtitan Llama 3 70B, 256 H100", "tokens_per_s_per_gpu")] == 829
    for run in published.RUNS:      # the plan adds up to the paper's GPUs and tokens
        j = run.job
        gpus = {"8,192": 8192, "16,384": 16384, "3,072": 3072, "1,536": 1536, "12,288": 12288,
                " 8 H100": 8, "256": 256}
        assert any(k in run.label and j.gpus == v for k, v in gpus.items()), run.label
    assert published.RUNS[0].job.tokens == published.RUNS[2].job.tokens == 2048 * 8192


def test_the_model_is_optimistic_by_what_the_lecture_says():
    rows = _rows()
    # "more throughput, or a shorter step, by 12 % to 54 % on the big runs and by 136 % on
    # torchtitan's 8B"
    faster = {}
    for r in rows:
        over = -r["error"] / (1 + r["error"]) if r["kind"] == "step_s" else r["error"]
        faster.setdefault(r["label"], []).append(over)
    small = faster.pop("torchtitan Llama 3 8B, 8 H100")
    assert round(100 * small[0]) == 136
    every = [x for v in faster.values() for x in v]
    assert round(100 * min(every)) == 12 and round(100 * max(every)) == 54


def test_closing_efficiencies_meet_the_figures_and_are_what_the_lecture_says():
    rows = _rows()
    for run in published.RUNS:
        e = published.closing_efficiency(run)
        kind = next(iter(run.published))
        got = published.published_value(
            transformer.predict(run.job, run.hw.but(efficiency=e)), kind, run.count)
        assert got == pytest.approx(run.published[kind], rel=1e-3)
    big = [r["closing"] for r in rows if not r["label"].startswith("torchtitan")]
    assert round(min(big), 2) == 0.54 and round(max(big), 2) == 0.74
    assert round(next(r["closing"] for r in rows if "8B" in r["label"]), 2) == 0.34


def test_leave_one_out_is_what_the_lecture_says():
    rows = _rows()
    closing = [next(r["closing"] for r in rows if r["label"] == run.label)
               for run in published.RUNS]
    loo = {r["label"]: r["error"] for r in published.leave_one_out(closing=closing)}
    assert round(100 * loo.pop("torchtitan Llama 3 8B, 8 H100")) == 76
    assert max(abs(e) for e in loo.values()) <= 0.21
    assert abs(loo["torchtitan Llama 3 70B, 256 H100"]) < 0.10


def test_plain_1f1b_at_the_best_matmul_rate_gives_the_published_43_percent():
    run = published.RUNS[0]
    one_f = transformer.predict(run.job.but(schedule="1f1b", v=1), run.hw)
    assert abs(one_f.mfu() - 0.43) < 0.005
    peak = transformer.predict(run.job, run.hw.but(efficiency=1.0))
    assert peak.step_s < transformer.predict(run.job, run.hw).step_s


# ------------------------------------------------------------------------------ calibration


@pytest.mark.parametrize("g, op", [(2, "all_reduce"), (4, "all_reduce"), (4, "all_gather"),
                                   (1, "p2p")])
def test_fit_link_recovers_alpha_and_beta(g, op):
    sizes = [4, 4096, 65536, 1 << 20]
    alpha, beta = 3e-4, 2e9
    if op == "p2p":
        seconds = [alpha + s / beta for s in sizes]
    else:
        seconds = [ring_time_s(s, g, alpha, beta, op) for s in sizes]
    fit = calibrate.fit_link(sizes, seconds, g, op)
    assert fit["alpha_s"] == pytest.approx(alpha, rel=1e-6)
    assert fit["bytes_per_s"] == pytest.approx(beta, rel=1e-6)


def test_fit_link_names_bad_input():
    with pytest.raises(ValueError, match="same length"):
        calibrate.fit_link([4, 8], [1.0], 2)
    with pytest.raises(ValueError, match="op"):
        calibrate.fit_link([4, 8], [1.0, 2.0], 2, "broadcast")


def _synthetic_calibration(rate=5e10, contention=2.0, alpha=1e-4, beta=1e9):
    shapes = calibrate._all_shapes()
    links = {f"all_reduce_{g}": {"alpha_s": alpha, "bytes_per_s": beta} for g in (2, 4)}
    links["p2p"] = {"alpha_s": alpha, "bytes_per_s": beta}
    by_world = {}
    for w, slow in (("1", 1.0), ("2", 1.0), ("4", contention)):
        by_world[w] = {"rates": {f"{m}x{k}x{n}": rate / slow for m, k, n in shapes},
                       "links": links, "adam_s_per_element": 1e-9}
    return {"by_world": by_world}


def test_predict_trainer_counts_the_trainers_matmuls_and_collectives():
    cal = _synthetic_calibration()
    cfg = calibrate.CONFIG
    plan = calibrate.trainer_plan(1, 1, 1)
    t = calibrate.predict_trainer(plan, cal)
    flops = sum(c * 2 * m * k * n for m, k, n, c in calibrate.block_matmuls(cfg, 4, 1))
    flops = cfg.n_layers * flops + 2 * 4 * cfg.seq_len * cfg.d_model * cfg.vocab_size
    assert t.compute == pytest.approx(plan.m * 3 * flops / 5e10)
    # 4 ranks on shared cores with every rank busy: twice as slow (the synthetic contention)
    dp4 = calibrate.predict_trainer(calibrate.trainer_plan(4, 1, 1), cal)
    assert dp4.compute == pytest.approx(t.compute / 4 * 2)
    tp2 = calibrate.predict_trainer(calibrate.trainer_plan(1, 1, 2), cal)
    assert tp2.tp > 0 and tp2.bubble == pytest.approx(0.0, abs=1e-12)
    pp2 = calibrate.predict_trainer(calibrate.trainer_plan(1, 2, 1), cal)
    assert pp2.bubble > 0
    with pytest.raises(ValueError, match="no job of 8 ranks"):
        calibrate.predict_trainer(calibrate.trainer_plan(2, 2, 2), cal)


def test_miss_term_names_the_part_furthest_off():
    pred = terms.StepTerms(compute=0.2, tp=0.1, bubble=0.05, dp_exposed=0.0, optimizer=0.01)
    part, gap = calibrate.miss_term(pred, {"compute": 0.2, "tp": 0.3, "pp_wait": 0.04,
                                           "dp": 0.0, "step": 0.55})
    assert part == "tp" and gap == pytest.approx(-0.2)


def test_the_cached_run_holds_every_mesh_and_the_lecture_reads_it():
    cached = calibrate.load()
    cal, measured = cached["calibration"], cached["measured"]
    assert set(cal["by_world"]) == {"1", "2", "4"}
    meshes = [calibrate.CALIBRATION_MESH, *calibrate.MESHES]
    assert set(measured) == {calibrate._key(m) for m in meshes}
    assert len(calibrate.MESHES) >= 6 and calibrate.CALIBRATION_MESH not in calibrate.MESHES
    rows = calibrate.compare(cal, measured)
    for r in rows:
        assert r["predicted"]["total"] == pytest.approx(sum(r["predicted"][t]
                                                           for t in terms.TERMS))
        assert math.isfinite(r["error"])
    # the stated bound holds on the cached run (the benchmark re-measures it)
    assert max(abs(r["error"]) for r in rows) <= calibrate.BOUND


def test_calibration_worker_on_two_real_ranks():
    from course_utils import launch

    res = launch.run(calibrate.calibration_worker, 2, [(64, 64, 64)], [4, 65536], 3,
                     timeout_s=60, threads_per_rank=1, show_output=False)
    for r in res:
        assert r["rates"]["64x64x64"] > 1e7
        assert len(r["all_reduce"][2]) == 2 and all(t > 0 for t in r["all_reduce"][2])
        assert r["adam_s_per_element"] > 0
    assert len(res[0]["p2p"]) == 2 and res[0]["p2p"][1] > 0

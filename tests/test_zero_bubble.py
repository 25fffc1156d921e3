"""Zero-bubble pipelines: the backward split in two (by hand, with autograd, as torch splits it)
equals the full backward; the split schedules' orders are torch's; the simulator against the
papers' formulas (Qi et al. 2023; DeepSeek's DualPipe), where they hold and where they do not;
on real gloo ranks each schedule equals one process, holds the activations the simulator
predicts, and the optimizer's global check by post-validation equals the check in order."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.pipelining import _backward
from torch.distributed.pipelining import schedules as torch_schedules

from course_utils.pipeline import backward_split as bs
from course_utils import launch
from course_utils.pipeline import runtime as pp
from course_utils.pipeline import schedule as ps
from course_utils.pipeline import zero_bubble as zb
from course_utils.pipeline import zero_bubble_runtime as zbp

SEEDS = (0, 1)
# (F, I, W) per stage: the papers' equal times, then unequal ones with W no longer than F or I
EQUAL = (1.0, 1.0, 1.0)
W_SHORTEST = [EQUAL, (1.0, 1.5, 0.5), (1.0, 2.0, 1.0), (1.0, 0.5, 0.5), (2.0, 1.5, 1.5)]


def _sim(schedule, p, m, f, i, w, **kw):
    """simulate() with one stage's F, I, W times."""
    return ps.simulate(schedule, p, m, forward_time=f, backward_ratio=(i + w) / f,
                       weight_share=w / (i + w), **kw)


def _idle_per_rank(tl, sync=True):
    return [tl.period(sync) - tl.busy(r) for r in range(tl.p)]


# ------------------------------------------------------------------------ the backward split


@pytest.mark.parametrize("seed", SEEDS)
def test_linear_input_and_weight_grads_equal_the_full_backward(seed):
    gen = torch.Generator().manual_seed(seed)
    for n, d_in, d_out in ((4, 5, 3), (1, 8, 8), (7, 3, 6)):
        layer = torch.nn.Linear(d_in, d_out)
        with torch.no_grad():
            for q in layer.parameters():
                q.copy_(torch.randn(q.shape, generator=gen))
        x, g = torch.randn(n, d_in, generator=gen), torch.randn(n, d_out, generator=gen)
        dx, (dw, db) = bs.full_backward(layer, x, g)
        by_hand = (bs.linear_input_grad(g, layer.weight), *bs.linear_weight_grad(g, x))
        autograd = bs.autograd_split(layer, x, g)
        for got in (by_hand, (autograd[0], *autograd[1])):
            for a, b in zip(got, (dx, dw, db)):
                torch.testing.assert_close(a, b)
    assert bs.matmul_flops(4, 5, 3) == {"F": 120, "I": 120, "W": 120}
    with pytest.raises(ValueError, match="d_in"):
        bs.matmul_flops(4, 0, 3)


@pytest.mark.parametrize("seed", SEEDS)
def test_split_stage_by_hand_equals_autograd_and_keeps_what_w_needs(seed):
    depth, width, n = 3, 8, 5
    model, twin = pp.make_model(seed, width, depth), pp.make_model(seed, width, depth)
    x, g = pp.make_batch(seed, n, width)
    stage = bs.SplitStage(model)
    one = n * width * 4  # bytes of one (n, width) float32 tensor
    out = stage.forward(0, x)
    assert stage.held_bytes() == (depth + 1) * one  # the input and each block's output
    dx = stage.backward_input(0, g)
    assert stage.held_bytes() == 2 * depth * one  # each linear's input and its output's grad
    assert all(q.grad is None for q in model.parameters())  # W has not run: no weight grad yet
    stage.backward_weight(0)
    assert stage.held_bytes() == 0 and stage.peak_bytes == 2 * depth * one
    xr = x.clone().requires_grad_(True)
    twin_out = twin(xr)
    twin_out.backward(g)
    torch.testing.assert_close(out, twin_out.detach())
    torch.testing.assert_close(dx, xr.grad)
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    with pytest.raises(ValueError, match="Linear, Tanh"):
        bs.SplitStage(torch.nn.Sequential(torch.nn.Linear(2, 2)))


@pytest.mark.parametrize("seed", SEEDS)
def test_torchs_stage_backward_input_then_weight_equals_the_full_backward(seed):
    """What torch.distributed.pipelining runs for I and W (``_backward.stage_backward_input``
    keeps the graph, ``stage_backward_weight`` walks it from the saved intermediates)."""
    model, twin = pp.make_model(seed, 8, 3), pp.make_model(seed, 8, 3)
    x, g = pp.make_batch(seed, 4, 8)
    xa = x.clone().requires_grad_(True)
    out = model(xa)
    (dx,), groups = _backward.stage_backward_input([out], [g], [xa], model.parameters())
    assert all(q.grad is None for q in model.parameters())
    _backward.stage_backward_weight(model.parameters(), groups)
    xr = x.clone().requires_grad_(True)
    twin(xr).backward(g)
    torch.testing.assert_close(dx, xr.grad)
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


# ------------------------------------------------------------------------ the orders


def _torch_order(cls, p, m, rank):
    """The order torch's schedule class computes for one rank, as (kind, microbatch, chunk)."""
    class Stub:
        pp_group_size, _n_microbatches, num_stages = p, m, 2 * p

    ops = []
    for action in cls._calculate_single_rank_operations(Stub(), rank):
        if action is None:
            continue
        for a in action.sub_actions or (action,):  # an overlapped pair: its two ops in turn
            ops.append((a.computation_type.value, a.microbatch_index,
                        0 if a.stage_index == rank else 1))
    return ops


@pytest.mark.parametrize("schedule,cls", [("zbv", torch_schedules.ScheduleZBVZeroBubble),
                                          ("dualpipev", torch_schedules.ScheduleDualPipeV)])
def test_v_orders_are_torchs(schedule, cls):
    for p in (1, 2, 3, 4, 5, 8):
        for m in range(2 * p if schedule == "dualpipev" else 1, 3 * p + 3):
            order = ps.schedule_order(schedule, p, m)
            for rank in range(p):
                assert order[rank] == _torch_order(cls, p, m, rank), (schedule, p, m, rank)
    # the overlapped pairs are torch's OVERLAP_F_B actions
    class Stub:
        pp_group_size, _n_microbatches, num_stages = 4, 10, 8

    for rank in range(4):
        actions = torch_schedules.ScheduleDualPipeV._calculate_single_rank_operations(Stub(),
                                                                                     rank)
        starts, k = [], 0
        for a in actions:
            if a.sub_actions:
                starts.append(k)
            k += len(a.sub_actions or (a,))
        assert zb.overlapped_pairs(4, 10, rank) == starts


def test_zb_h1_is_1f1b_with_w_held_back():
    """F and I come in 1F1B's order of F and B; a W follows its I and is held back until P
    microbatches are in flight (or the forwards are done)."""
    for p in (1, 2, 3, 4, 8):
        for m in (1, 2, 3, p, 2 * p + 1, 16):
            for rank, (zb_ops, ofob) in enumerate(zip(ps.schedule_order("zb-h1", p, m),
                                                      ps.schedule_order("1f1b", p, m))):
                assert [(("B" if k == "I" else k), i) for k, i, _ in zb_ops if k != "W"] == [
                    (k, i) for k, i, _ in ofob]
                assert [i for k, i, _ in zb_ops if k == "W"] == list(range(m))
                assert ps.simulate("zb-h1", p, m).peak_activations()[rank] == min(p, m)


# ------------------------------------------------------------------------ against the papers


def test_every_split_timeline_is_consistent():
    for schedule in zb.SPLIT_SCHEDULES:
        for p in (1, 2, 3, 4, 6):
            for m in (2 * p, 2 * p + 3) if schedule == "dualpipev" else (1, 2, p, 3 * p):
                for f, i, w in (EQUAL, (1.0, 1.5, 0.5), (1.0, 0.5, 1.5)):
                    for kw in ({}, {"comm_time": 0.2}, {"stage_times": [1 + r / 4 for r in
                                                                        range(p)]}):
                        tl = _sim(schedule, p, m, f, i, w, **kw)
                        tl.check()
                        assert len(tl.ops) >= 3 * m * p * tl.v - m * p * tl.v  # F + (B or I, W)


@pytest.mark.parametrize("f,i,w", W_SHORTEST)
def test_zb_h1_bubble_is_qis_when_w_is_shortest_and_m_at_least_p(f, i, w):
    """Qi et al. Table 2: (p-1)(T_F + T_B - T_W) per rank (their T_B is the input half I),
    with or without the optimizer's global check, as long as W takes no longer than F or I
    and m >= p; 1F1B's (p-1)(T_F + T_B + T_W)."""
    for p in (2, 3, 4, 6, 8):
        for m in (p, p + 1, 2 * p, 24):
            tl = _sim("zb-h1", p, m, f, i, w)
            want = zb.paper_bubble("zb-h1", p, f, i, w)
            for sync in (True, False):
                assert _idle_per_rank(tl, sync) == pytest.approx([want] * p)
            assert tl.idle_fraction() == pytest.approx(
                zb.paper_bubble_fraction("zb-h1", p, m, f, i, w))
            ofob = _sim("1f1b", p, m, f, i, w)
            assert _idle_per_rank(ofob) == pytest.approx([zb.paper_bubble("1f1b", p, f, i, w)] * p)
            assert ofob.idle_fraction() == pytest.approx(ps.bubble_fraction(p, m))
    assert zb.paper_bubble("zb-h1", 4, *EQUAL) == zb.paper_bubble("1f1b", 4, *EQUAL) / 3


def test_where_zb_h1_does_not_reach_its_formula():
    # W longer than F: the formula would promise zero; the simulation keeps a bubble
    p, m = 4, 16
    f, i, w = 1.0, 0.5, 1.5
    assert zb.paper_bubble("zb-h1", p, f, i, w) == 0
    assert min(_idle_per_rank(_sim("zb-h1", p, m, f, i, w))) == pytest.approx(3.0)
    # W longer than I: a W cannot fill the gap between two I's without delaying the next
    for f, i, w in ((2.0, 1.0, 1.5), (1.0, 0.5, 1.0)):
        assert min(_idle_per_rank(_sim("zb-h1", p, m, f, i, w))) > (
            zb.paper_bubble("zb-h1", p, f, i, w) + 0.4)
    # fewer microbatches than stages: not enough W to fill the wait
    for m in (1, 2, 3):
        tl = _sim("zb-h1", p, m, *EQUAL)
        bubble = zb.paper_bubble("zb-h1", p, *EQUAL)
        assert tl.idle_fraction() > bubble / (bubble + m * sum(EQUAL)) + 0.05
        assert tl.peak_activations() == [m] * p


def test_zbv_reaches_zero_only_at_equal_times_and_without_the_global_check():
    """Qi et al. section 6; torch's ScheduleZBVZeroBubble docstring: zero bubble only if
    time forward == time backward input == time backward weights."""
    for p in (2, 3, 4, 8):
        for m in (2 * p, 2 * p + 5, 32):
            tl = _sim("zbv", p, m, *EQUAL)
            assert _idle_per_rank(tl, sync=False) == pytest.approx([0.0] * p)
            assert tl.idle_fraction(sync=True) > 0  # steps wait for the slowest rank's end
            assert tl.peak_activations() == [zb.paper_peak_activations("zbv", p)] * p
            for times in ((1.0, 1.5, 0.5), (1.0, 0.5, 1.5), (1.0, 0.5, 0.5)):
                if p > 2:  # (with two ranks a W longer than F and I still fits: P = 2, m = 4)
                    assert min(_idle_per_rank(_sim("zbv", p, m, *times), sync=False)) > 0.1
    assert _sim("zbv", 4, 2, *EQUAL).idle_fraction(sync=False) > 0.4  # m < P
    with pytest.raises(ValueError, match="only for f == i == w"):
        zb.paper_bubble("zbv", 4, 1.0, 1.5, 0.5)


def test_zbvs_zero_needs_2p_minus_1_microbatches_and_each_formula_says_its_bound():
    """Torch's ScheduleZBVZeroBubble plans max(2P - 1, m) microbatches and leaves the missing
    ones' slots empty: at F = I = W the bubble is 2P - 1 - m forward times per rank below the
    bound (P = 4: m = 4, 5, 6, 7 idle 20.0, 11.8, 5.3, 0 %), and zero from it on (P = 2 from
    m = 3). Below its bound, each paper's fraction refuses, naming it."""
    for p in (2, 3, 4, 5, 6):
        for m in range(1, 2 * p + 2):
            idle = _idle_per_rank(_sim("zbv", p, m, *EQUAL), sync=False)
            assert idle == pytest.approx([max(0, 2 * p - 1 - m) * EQUAL[0]] * p), (p, m)
    assert [f"{_sim('zbv', 4, m, *EQUAL).idle_fraction(sync=False):.1%}" for m in (4, 5, 6, 7)
            ] == ["20.0%", "11.8%", "5.3%", "0.0%"]
    assert zb.paper_bubble_fraction("zbv", 2, 3, *EQUAL) == 0
    assert [zb.min_microbatches(s, 4) for s in ("1f1b", "zb-h1", "zbv", "dualpipev")] == [
        1, 4, 7, 8]
    for schedule, m in (("zb-h1", 3), ("zbv", 6), ("dualpipev", 7)):
        with pytest.raises(ValueError, match=f"holds for m >= {m + 1} on p=4"):
            zb.paper_bubble_fraction(schedule, 4, m, *EQUAL)
    assert zb.paper_bubble_fraction("1f1b", 4, 1, *EQUAL) == pytest.approx(
        _sim("1f1b", 4, 1, *EQUAL).idle_fraction())


def test_dualpipev_against_deepseeks_formula():
    """DualPipe's README: (PP/2 - 1)(F&B + B - 3W) per device, PP = 2P stages, B the whole
    backward. Run as DeepSeek does (a pair starts when both inputs are there and lasts F&B,
    here F + B) the simulation gives it exactly at equal times, and at most it otherwise;
    torch's runtime (the pair's halves one after the other) idles less still."""
    for p in (2, 3, 4, 8):
        for m in (2 * p, 2 * p + 3, 24):
            paired = _sim("dualpipev", p, m, *EQUAL, pair_time=1.0)
            want = zb.paper_bubble("dualpipev", p, *EQUAL)
            assert _idle_per_rank(paired) == pytest.approx([want] * p)
            torch_run = _sim("dualpipev", p, m, *EQUAL)
            assert max(_idle_per_rank(torch_run)) < want
            assert torch_run.peak_activations() == [zb.paper_peak_activations("dualpipev", p)] * p
            for times in W_SHORTEST[1:3]:
                assert max(_idle_per_rank(_sim("dualpipev", p, m, *times, pair_time=1.0))) <= (
                    zb.paper_bubble("dualpipev", p, *times) + 1e-9)
    with pytest.raises(ValueError, match="m must be at least 2p = 8"):
        ps.simulate("dualpipev", 4, 7)


def test_lecture_5s_stated_figures():
    """What lecture 5 says in words about P = 4, m = 8, F = I = W = 1."""
    def idle(name, **kw):
        return _idle_per_rank(ps.simulate(name, 4, 8, backward_ratio=2.0, **kw))

    assert idle("1f1b") == pytest.approx([9.0] * 4) and idle("zb-h1") == pytest.approx([3.0] * 4)
    assert ps.simulate("zb-h1", 4, 8).peak_activations() == [4.0] * 4
    dualpipev = ps.simulate("dualpipev", 4, 8, backward_ratio=2.0)
    assert dualpipev.peak_activations() == [4.5] * 4  # 9 chunks = 2P + 1
    paired = ps.simulate("dualpipev", 4, 8, backward_ratio=2.0, pair_time=1.0)
    assert dualpipev.idle_fraction() < paired.idle_fraction()
    assert max(idle("dualpipev")) == pytest.approx(max(idle("dualpipev", pair_time=1.0)) / 2)
    zbv = ps.simulate("zbv", 4, 8, backward_ratio=2.0)
    assert f"{zbv.idle_fraction():.1%}" == "5.9%" and zbv.idle_fraction(sync=False) == 0
    long_w = ps.simulate("zb-h1", 4, 8, backward_ratio=2.0, weight_share=0.75)
    assert zb.paper_bubble("zb-h1", 4, 1, 0.5, 1.5) == 0
    assert f"{long_w.idle_fraction(sync=False):.1%}" == "5.9%"  # the table without the check


@pytest.mark.parametrize("call,words", [
    (lambda: zb.split_order("zb-h2", 4, 8, 0), "schedule must be one of"),
    (lambda: zb.min_microbatches("gpipe", 4), "schedule must be one of"),
    (lambda: zb.held_for_w("block", None), "block must be a torch.nn.Module"),
    (lambda: zb.held_for_w(torch.nn.Linear(2, 2), torch.ones(2)), "x must be a tensor that "
                                                                  "requires grad"),
    (lambda: zb.split_order("zb-h1", 4, 8, 4), "rank must be an int from 0 to 3"),
    (lambda: ps.simulate("zbv", 4, 8, v=1), "v .chunks per rank. must be 2"),
    (lambda: ps.simulate("zb-h1", 4, 8, v=2), "v .chunks per rank. must be 1"),
    (lambda: ps.simulate("zb-h1", 4, 8, weight_share=1.0), "weight_share"),
    (lambda: ps.simulate("zb-h1", 4, 8, pair_time=1.0), "pair_time is for schedule"),
    (lambda: ps.simulate("dualpipev", 4, 8, pair_time=0), "pair_time"),
    (lambda: zb.paper_bubble("gpipe", 4, 1, 1, 1), "schedule must be one of"),
    (lambda: zb.paper_bubble("zb-h1", 4, 1, -1, 1), "i must be"),
    (lambda: zb.paper_peak_activations("zb-h2", 4), "schedule must be one of"),
])
def test_bad_input(call, words):
    with pytest.raises(ValueError, match=words):
        call()


# ------------------------------------------------------------------------ on real ranks


def _worst(per_rank, seed, p, m, depth, n_stages, microbatch=3, width=16):
    """Largest |difference| of loss and every gradient from one process."""
    loss, grads = pp.reference_step(seed, m * microbatch, width, depth, n_stages)
    got_loss = [r["loss"] for r in per_rank if r["loss"] is not None]
    assert len(got_loss) == 1
    worst = abs(got_loss[0] - loss)
    for rank, res in enumerate(per_rank):
        by_stage = res["grads"] if isinstance(res["grads"], dict) else {rank: res["grads"]}
        assert sorted(by_stage) == ([rank, 2 * p - 1 - rank] if n_stages == 2 * p else [rank])
        for s, got in by_stage.items():
            for a, b in zip(got, grads[s]):
                worst = max(worst, (torch.as_tensor(a) - b).abs().max().item())
    return worst


@pytest.mark.parametrize("p", [2, 4])
def test_every_split_schedule_equals_one_process_on_real_ranks(p):
    m = 2 * p  # DualPipeV needs a microbatch per stage
    jobs = [(zbp.split_pipeline_worker, dict(schedule=s, m=m, seed=seed, depth=p))
            for seed in SEEDS for s in zbp.SCRATCH]
    jobs += [(zbp.torch_split_worker, dict(schedule=s, m=m, seed=seed, depth=2 * p))
             for seed in SEEDS for s in zbp.TORCH]
    results = launch.run(pp.jobs_worker, p, jobs, timeout_s=120, show_output=False)
    for k, (fn, kw) in enumerate(jobs):
        per_rank = [results[r][k] for r in range(p)]
        v = 2 if kw["schedule"] in zbp.TORCH else 1
        assert _worst(per_rank, kw["seed"], p, m, kw["depth"], v * p) < 1e-6, kw
        order = ps.schedule_order(kw["schedule"], p, m)
        for rank, res in enumerate(per_rank):  # the ops ran in the simulator's order
            assert [(k_, i, c) for k_, i, c, _, _ in res["records"][0]] == order[rank]
        tl = pp.records_to_timeline([res["records"][0] for res in per_rank], kw["schedule"], m,
                                    v)
        tl.check()  # real timestamps: no overlap on a rank, every input before its use
        # activations held: one block per stage, so a microbatch keeps the same bytes after F
        # and after I and the bytes count microbatches
        held = [res["peak_bytes"][0] / res["microbatch_bytes"] for res in per_rank]
        predicted = ps.simulate(kw["schedule"], p, m).peak_activations()
        assert held[:-1] == predicted[:-1], kw
        if kw["schedule"] in zbp.TORCH:  # the last rank's two chunks are neighbours: stage
            assert held[-1] < predicted[-1]  # P-1's output is stage P's input, kept once
        else:
            assert held[-1] == predicted[-1]


@pytest.mark.parametrize("seed", SEEDS)
def test_post_validation_equals_the_global_check_in_order(seed):
    p = 4
    norm = None
    for max_norm, rollbacks in ((1e6, [False] * p), (1e-3, [True] * (p - 1) + [False])):
        res = launch.run(zbp.post_validation_worker, p, seed, max_norm, timeout_s=60,
                         show_output=False)
        want = zbp.post_validation_reference(seed, max_norm, p=p)
        assert [r["rolled_back"] for r in res] == rollbacks
        norm = norm or res[0]["norm"]
        assert all(r["norm"] == pytest.approx(norm) for r in res)  # the last stage's, sent back
        assert [r["partial_norm"] for r in res] == sorted(r["partial_norm"] for r in res)
        for rank, r in enumerate(res):
            for key in ("sync", "validated"):
                for a, b in zip(r[key], want[rank]):
                    torch.testing.assert_close(torch.as_tensor(a), torch.as_tensor(b),
                                               atol=1e-6, rtol=1e-5)


def test_measured_bubble_follows_the_simulation():
    """The lecture's claims: on real ranks ZB-H1 idles less than 1F1B, no schedule (the V ones,
    ZB-V and DualPipeV, too) idles less than its simulation on any rank, and each rank holds
    the activations predicted (a V's last rank, which turns the V, at most that)."""
    schedules = ("1f1b", "zb-h1", "zbv", "dualpipev")
    rows = zbp.measure_schedules(2, 4, schedules, op_time_s=0.01, steps=2)
    sim = {s: ps.simulate(s, 2, 4, backward_ratio=2.0) for s in rows}
    assert rows["zb-h1"]["idle"] < rows["1f1b"]["idle"]
    for s, row in rows.items():
        row["timeline"].check()
        assert row["idle"] >= sim[s].idle_fraction() - 0.03, s
        for measured, simulated in zip(row["rank_idle"], sim[s].rank_idle_fractions()):
            assert measured >= simulated - 0.03, (s, row["rank_idle"])
        predicted = sim[s].peak_activations()
        if s in zbp.TORCH:
            assert max(row["peak"]) == max(predicted), (s, row["peak"], predicted)
            assert all(m <= p for m, p in zip(row["peak"], predicted)), (s, row["peak"])
        else:
            assert row["peak"] == predicted, (s, row["peak"], predicted)
    with pytest.raises(ValueError, match="schedule must be one of"):
        zbp.measure_schedules(2, 4, ("gpipe",))


def test_what_waits_for_w_is_the_linears_inputs_and_output_gradients():
    """One Llama-shaped layer: W needs each linear's input (q, k, v share theirs, as w1 and w3
    do: 3 hidden + ffn values a token) and its output's gradient (hidden + 2 kv + hidden + 2
    ffn + hidden); the forward saves more than the inputs; torch's own I keeps all of it."""
    from course_utils.models import llama_shapes

    for seed, (h, f, seq) in enumerate([(64, 160, 32), (128, 352, 16)]):
        torch.manual_seed(seed)
        s = llama_shapes.Shape("t", 10, h, 1, f, 4, 2)
        kv = s.kv_heads * s.head_dim
        held = zb.held_for_w(llama_shapes.Block(s), torch.randn(2, seq, h, requires_grad=True))
        tokens = 2 * seq
        assert held["inputs"] == 4 * tokens * (3 * h + f)
        assert held["output_grads"] == 4 * tokens * (3 * h + 2 * kv + 2 * f)
        assert held["inputs"] < held["saved"] == held["torch_after_i"]

"""F, I and W of a transformer layer (course_utils.pipeline.fiw_times): the hand count is torch's flop
counter's, attention makes I > F > W and a pure MLP F = I = W; the schedules' idle shares at
F = I = W are the simulator's and the papers'; a measured run times torch's own split backward
and, where the FLOPs say I is well over W, I takes longer; bad arguments are named."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
from torch.utils.flop_counter import FlopCounterMode

from course_utils.pipeline import fiw_times as ft
from course_utils.pipeline import schedule as ps
from course_utils.pipeline import zero_bubble as zb


def _counted(layer, x):
    """FLOPs torch.utils.flop_counter counts in the layer's F, torch's I and torch's W."""
    counts = {}
    with FlopCounterMode(display=False) as fc:
        y = layer(x)
    counts["F"] = fc.get_total_flops()
    with FlopCounterMode(display=False) as fc:
        _, groups = stage_backward_input([y], [torch.ones_like(y)], [x], layer.parameters())
    counts["I"] = fc.get_total_flops()
    assert all(q.grad is None for q in layer.parameters())  # I computed no weight gradient
    with FlopCounterMode(display=False) as fc:
        stage_backward_weight(layer.parameters(), groups)
    counts["W"] = fc.get_total_flops()
    return counts


@pytest.mark.parametrize("hidden,seq,heads,batch,ffn,attention", [
    (16, 8, 2, 3, None, True), (32, 64, 4, 1, 48, True), (8, 5, 1, 2, None, False),
    (24, 40, 3, 2, 40, False)])
def test_hand_count_is_torchs_flop_counter(hidden, seq, heads, batch, ffn, attention):
    torch.manual_seed(0)
    layer = ft.Layer(hidden, heads, ffn, attention)
    x = torch.randn(batch, seq, hidden, requires_grad=True)
    assert _counted(layer, x) == ft.layer_flops(hidden, seq, heads, batch, ffn, attention)


def test_attention_makes_i_above_f_above_w_and_a_pure_mlp_equal():
    for hidden, seq in ((64, 512), (256, 4096), (128, 128)):
        fl = ft.layer_flops(hidden, seq, heads=4)
        assert fl["I"] > fl["F"] > fl["W"]
        # the s^2 terms: F gets 4 b s^2 h, I twice that, W none
        assert fl["I"] - fl["W"] == 2 * (fl["F"] - fl["W"]) == 8 * seq * seq * hidden
    long = ft.layer_flops(64, 4096)
    assert long["I"] / long["W"] > 10  # seq >> hidden: attention dominates
    for hidden, seq, ffn in ((64, 512, None), (100, 7, 30), (1, 1, 1)):
        fl = ft.layer_flops(hidden, seq, ffn=ffn, attention=False, batch=3)
        assert fl["F"] == fl["I"] == fl["W"] == 2 * 3 * seq * 2 * hidden * (ffn or 4 * hidden)
    # heads do not change the count, the batch scales it
    assert ft.layer_flops(64, 32, heads=1) == ft.layer_flops(64, 32, heads=8)
    assert ft.layer_flops(64, 32, batch=2) == {k: 2 * v for k, v in
                                               ft.layer_flops(64, 32).items()}


def test_split_backward_of_the_layer_equals_one_backward():
    torch.manual_seed(1)
    layer, twin = ft.Layer(16, 2), ft.Layer(16, 2)
    twin.load_state_dict(layer.state_dict())
    x, g = torch.randn(2, 12, 16), torch.randn(2, 12, 16)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y = layer(xa)
    (dx,), groups = stage_backward_input([y], [g], [xa], layer.parameters())
    stage_backward_weight(layer.parameters(), groups)
    twin(xb).backward(g)
    torch.testing.assert_close(dx, xb.grad)
    for a, b in zip(layer.parameters(), twin.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


# ------------------------------------------------------------------------ schedules


def test_equal_times_give_the_simulators_and_papers_figures():
    for p, m in ((2, 4), (4, 8), (4, 16), (3, 9)):
        assert ft.schedule_idle("1f1b", p, m, 1, 1, 1) == pytest.approx(
            ps.bubble_fraction(p, m))  # (P - 1) / (m + P - 1)
        for s in ("1f1b", "zb-h1", "zbv"):
            assert ft.schedule_idle(s, p, m, 1, 1, 1) == pytest.approx(
                zb.paper_bubble_fraction(s, p, m, 1, 1, 1))
        for s in ft.SCHEDULES:  # the unit does not matter; sync as Timeline.idle_fraction
            for sync in (True, False):
                assert ft.schedule_idle(s, p, m, 3, 3, 3, sync) == pytest.approx(
                    ps.simulate(s, p, m, backward_ratio=2.0).idle_fraction(sync))
    assert ft.schedule_idle("zbv", 4, 8, 1, 1, 1) == 0
    assert f"{ft.schedule_idle('zbv', 4, 8, 1, 1, 1, sync=True):.1%}" == "5.9%"  # lecture 5
    assert ft.schedule_idle("zb-h1", 4, 8, 1, 1, 1) == pytest.approx(3 / 27)  # 3 of 24 + 3
    # DeepSeek's formula is for their overlapped pairs; torch's run idles less
    assert ft.schedule_idle("dualpipev", 4, 8, 1, 1, 1) < zb.paper_bubble_fraction(
        "dualpipev", 4, 8, 1, 1, 1)


def test_unequal_times_move_the_split_schedules_only():
    f, i, w = 1.0, 1.7, 0.7  # I > F > W, as a layer with a long sequence
    assert ft.schedule_idle("1f1b", 4, 8, f, i, w) == pytest.approx(ps.bubble_fraction(4, 8))
    assert ft.schedule_idle("zb-h1", 4, 8, f, i, w) == pytest.approx(
        zb.paper_bubble_fraction("zb-h1", 4, 8, f, i, w))  # W shortest: Qi et al.'s formula
    assert ft.schedule_idle("zb-h1", 4, 8, f, i, w) > ft.schedule_idle("zb-h1", 4, 8, 1, 1, 1)
    assert ft.schedule_idle("zbv", 4, 8, f, i, w) > 0.05
    rows = {r["schedule"]: r for r in ft.compare_rows({"F": 2.0, "I": 3.4, "W": 1.4})}
    assert list(rows) == list(ft.SCHEDULES)
    assert rows["zbv"]["paper_measured"] is None and rows["zbv"]["paper_equal"] == 0
    assert rows["zb-h1"]["measured"] == pytest.approx(ft.schedule_idle("zb-h1", 4, 8, f, i, w))
    assert [rows["1f1b"]["equal"], rows["1f1b"]["measured"]] == pytest.approx([3 / 11] * 2)
    text = ft.compare_table({"F": 2.0, "I": 3.4, "W": 1.4})
    assert "measured F:I:W = 1.43 : 2.43 : 1" in text
    assert len(text.splitlines()) == 2 + len(ft.SCHEDULES) + 1
    assert "FLOPs F:I:W" in ft.compare_table({"F": 2.0, "I": 3.4, "W": 1.4}, label="FLOPs")
    with pytest.raises(ValueError, match="label must be"):
        ft.compare_table({"F": 2.0, "I": 3.4, "W": 1.4}, label="")


# ------------------------------------------------------------------------ measured


def test_measured_run_times_each_part_and_long_sequences_make_i_slower_than_w():
    threads = torch.get_num_threads()
    res = ft.measure_fiw(hidden=64, seq=512, heads=2, repeats=3, warmup=1)
    assert torch.get_num_threads() == threads
    assert all(res[k] > 0 for k in "FIW")
    assert res["flops"] == ft.layer_flops(64, 512, 2)
    assert res["flops"]["I"] / res["flops"]["W"] > 3  # I's FLOPs 3.7 x W's: robust on a load
    assert res["I"] > res["W"]
    mlp = ft.measure_fiw(hidden=32, seq=16, heads=1, repeats=1, warmup=0, attention=False)
    assert mlp["flops"]["F"] == mlp["flops"]["I"] == mlp["flops"]["W"] and mlp["W"] > 0


@pytest.mark.parametrize("call,words", [
    (lambda: ft.layer_flops(0, 8), "hidden must be an int >= 1"),
    (lambda: ft.layer_flops(64, 8, heads=3), "heads must divide hidden = 64"),
    (lambda: ft.layer_flops(64, 8, attention=1), "attention must be True or False"),
    (lambda: ft.layer_flops(64, 8, ffn=0), "ffn must be an int >= 1"),
    (lambda: ft.measure_fiw(64, 8, 2, repeats=0), "repeats must be an int >= 1"),
    (lambda: ft.measure_fiw(64, 8.0, 2), "seq must be an int"),
    (lambda: ft.measure_fiw(64, 8, 2, warmup=-1), "warmup must be an int >= 0"),
    (lambda: ft.schedule_idle("gpipe", 4, 8, 1, 1, 1), "schedule must be one of"),
    (lambda: ft.schedule_idle("zb-h1", 4, 8, 1, 0, 1), "i must be a finite number > 0"),
    (lambda: ft.schedule_idle("zb-h1", 0, 8, 1, 1, 1), "p must be an int >= 1"),
    (lambda: ft.schedule_idle("dualpipev", 4, 7, 1, 1, 1), "m must be at least 2p = 8"),
    (lambda: ft.schedule_idle("zbv", 4, 8, 1, 1, 1, sync="no"), "sync must be True or False"),
    (lambda: ft.compare_table({"F": 1, "I": 1}), "times must be a mapping"),
    (lambda: ft.compare_rows({"F": 1, "I": -1, "W": 1}), "times\\['I'\\] must be"),
])
def test_bad_input(call, words):
    with pytest.raises(ValueError, match=words):
        call()

"""Sequence parallelism (course_utils.sequence_parallel): TP+SP against one device and TP, the
saved bytes per rank against the prediction, the collectives, and lecture 9's figures."""

from __future__ import annotations

import pickle

import pytest
import torch

from course_utils import launch
from course_utils.memory import activations
from course_utils import sequence_parallel as sp
from course_utils import tensor_parallel as tp
from course_utils.sequence_parallel import comparison as sp_comparison
from course_utils.tensor_parallel.one_device import layer_config

SEEDS = (0, 1)
CFG = {"b": 2, "s": 4, "h": 16, "ffn": 32, "n_heads": 4}   # module 4's block


@pytest.fixture(scope="module")
def runs() -> dict[tuple[int, bool], sp.SPComparison]:
    """TP and TP+SP on 2 and 4 gloo ranks (Megatron's re-gather), and on 2 without it."""
    out = {(t, True): sp.compare(t, seeds=SEEDS, cfg=CFG) for t in (2, 4)}
    out[(2, False)] = sp.compare(2, seeds=SEEDS, cfg=CFG, regather=False)
    return out


# ----------------------------------------------------------------- equal to one device


@pytest.mark.parametrize("key", [(2, True), (4, True), (2, False)])
def test_tp_and_sp_equal_one_device(runs, key):
    run = runs[key]
    assert run.equal  # compare() assert_closes every tensor to one device, TP+SP to TP
    assert run.seeds == SEEDS and len(run.names) == 2 + 16
    assert {"y", "x.grad", "ln1.weight.grad", "attn.q.weight.grad", "mlp.down.bias.grad"} <= set(
        run.names)
    assert max(run.max_abs_diff.values()) < 1e-5


def test_sp_without_the_grad_sync_would_differ():
    """The LayerNorm gradients of one rank cover only its tokens: the sync is needed."""
    def worker(rank, world_size):
        block, x, dy = sp_comparison._build(0, layer_config(CFG))
        par = sp.SequenceParallelBlock(block)
        tokens = slice(*tp.shard_range(CFG["s"], world_size, rank))
        x = x[:, tokens].clone().requires_grad_(True)
        (par(x) * dy[:, tokens]).sum().backward()
        return pickle.dumps(par.ln1.weight.grad.clone())

    local = [pickle.loads(b) for b in launch.run(worker, 2, timeout_s=60)]
    want = sp.reference(0, CFG)["ln1.weight.grad"]
    assert not torch.allclose(local[0], want, atol=1e-4)
    torch.testing.assert_close(local[0] + local[1], want)


@pytest.mark.parametrize("seed", SEEDS)
def test_conjugates_are_each_others_backward(seed):
    """g = all-gather forward, reduce-scatter backward; g-bar the other way round."""
    t, shape = 2, (2, 3, 5)
    per_rank = [pickle.loads(b) for b in launch.run(sp.conjugate_worker, t, seed, shape,
                                                    timeout_s=60)]
    gathered_x = torch.cat([r["g.x"] for r in per_rank], dim=1)
    summed_gbar_x = sum(r["gbar.x"] for r in per_rank)
    gathered_gbar_dy = torch.cat([r["gbar.dy"] for r in per_rank], dim=1)
    summed_g_dy = sum(r["g.dy"] for r in per_rank)
    for rank, r in enumerate(per_rank):
        torch.testing.assert_close(r["g.out"], gathered_x)
        torch.testing.assert_close(r["g.grad"], summed_g_dy[:, 3 * rank:3 * (rank + 1)])
        torch.testing.assert_close(r["gbar.out"], summed_gbar_x[:, 3 * rank:3 * (rank + 1)])
        torch.testing.assert_close(r["gbar.grad"], gathered_gbar_dy)
        assert r["g.comms"] == [("all_gather", "forward"), ("reduce_scatter", "backward")]
        assert r["gbar.comms"] == [("reduce_scatter", "forward"), ("all_gather", "backward")]


# ---------------------------------------------------------------- saved bytes, per rank


@pytest.mark.parametrize("cfg", [CFG, {"b": 1, "s": 8, "h": 32, "ffn": 64, "n_heads": 8},
                                 {"b": 3, "s": 6, "h": 12, "ffn": 24, "n_heads": 2}])
def test_one_device_block_saves_the_prediction(cfg):
    c = layer_config(cfg)
    block, x, _ = sp_comparison._build(0, c)
    x.requires_grad_(True)
    measured, _ = activations.saved_bytes(lambda: block(x), exclude=block.parameters())
    assert measured == sp.predicted_saved_bytes(**c, tp=1)


@pytest.mark.parametrize("key", [(2, True), (4, True), (2, False)])
def test_measured_bytes_per_rank_equal_the_prediction(runs, key):
    run = runs[key]
    for mode in sp.MODES:
        assert run.saved_bytes[mode] == [run.predicted_bytes[mode]] * run.tp_size, mode
    assert run.saved_bytes["one"] == [run.predicted_bytes["one"]]


@pytest.mark.parametrize("t", [2, 4])
def test_sp_splits_the_layernorm_part_by_tp(runs, t):
    run, c = runs[(t, True)], CFG
    b, s, h, f, a = c["b"], c["s"], c["h"], c["ffn"], c["n_heads"]
    terms = {m: sp.saved_terms(**CFG, tp=t, mode=m) for m in sp.MODES}
    ln = {m: 4 * sp.layernorm_part(terms[m]) for m in sp.MODES}
    assert ln["tp"] == 4 * (4 * b * s * h + 4 * b * s) and ln["sp"] * t == ln["tp"]
    # the rest is split by TP alone already: the same in both
    assert run.predicted_bytes["tp"] - ln["tp"] == run.predicted_bytes["sp"] - ln["sp"]
    # measured: TP+SP saves exactly (1 - 1/t) of TP's LayerNorm part less
    assert run.saved_bytes["tp"][0] - run.saved_bytes["sp"][0] == ln["tp"] - ln["tp"] // t
    # and the whole block per rank is one device's / t
    assert run.saved_bytes["sp"][0] * t == sp.predicted_saved_bytes(b, s, h, f, a, tp=1)


def test_korthikanti_has_the_same_structure():
    """Korthikanti's TP keeps 10 s b h whole (LayerNorm inputs 4, outputs 4, dropout masks 2);
    SP divides it by t. This block, in fp32 without dropout: 4 B T C elements whole."""
    s, b, h, a, t = 2048, 1, 1024, 16, 4
    whole = activations.korthikanti_bytes(s, b, h, a, tp=t) - activations.korthikanti_bytes(
        s, b, h, a, tp=t, sp=True)
    assert whole == pytest.approx(10 * s * b * h * (1 - 1 / t))
    terms = sp.saved_terms(b=1, s=8, h=16, ffn=64, n_heads=4, tp=4)
    assert sp.layernorm_part(terms) == 4 * 8 * 16 + 4 * 8


# ------------------------------------------------------------------------ the collectives


@pytest.mark.parametrize("t", [2, 4])
def test_all_reduce_becomes_reduce_scatter_plus_all_gather(runs, t):
    run = runs[(t, True)]
    n = CFG["b"] * CFG["s"] * CFG["h"] * 4      # one (B, T, C) fp32 activation
    tp_fwd = [(e.op, e.nbytes) for e in run.comms["tp"] if e.phase == "forward"]
    sp_fwd = [(e.op, e.nbytes) for e in run.comms["sp"] if e.phase == "forward"]
    assert tp_fwd == [("all_reduce", n)] * 2
    assert sp_fwd == [("all_gather", n), ("reduce_scatter", n // t)] * 2
    summary = {m: sp.comm_summary(run.comms[m], t) for m in sp.MODES}
    ring = 2 * 2 * (t - 1) / t * n               # two ring all-reduces of n bytes
    assert summary["tp"]["forward"]["ring_bytes"] == summary["sp"]["forward"]["ring_bytes"] == ring
    assert summary["tp"]["backward"]["ring_bytes"] == ring
    # Megatron's re-gather of the two LayerNorm outputs: two more all-gathers in backward
    assert summary["sp"]["backward"]["ops"] == {"all_gather": 4, "reduce_scatter": 2}
    assert summary["sp"]["backward"]["ring_bytes"] == pytest.approx(1.5 * ring)
    # the small gradient sync of the parameters used on sequence slices
    assert summary["sp"]["grad sync"]["ops"] == {"all_reduce": 6}
    assert "all_reduce" not in summary["sp"]["forward"]["ops"]
    assert all(c == run.comms["sp"] for c in run.all_comms["sp"])  # every rank the same


def test_without_regather_backward_bytes_equal_too(runs):
    run, t = runs[(2, False)], 2
    summary = {m: sp.comm_summary(run.comms[m], t) for m in sp.MODES}
    for phase in ("forward", "backward"):
        assert summary["sp"][phase]["ring_bytes"] == summary["tp"][phase]["ring_bytes"]
    assert summary["sp"]["backward"]["ops"] == {"reduce_scatter": 2, "all_gather": 2}


def test_lecture_report(runs):
    """The table lecture 9 prints (2 ranks, seeds 0 and 1, module 4's block)."""
    text = sp.report(runs[(2, True)])
    assert text.splitlines()[2:5] == [
        "one device                         6,400     6,400           2,176",
        "TP (LayerNorm replicated)          4,288     4,288           2,176",
        "TP + SP                            3,200     3,200           1,088"]
    assert "forward SP   2 all-gather + 2 reduce-scatter           ring sends   1,024 B" in text
    assert "backward SP  4 all-gather + 2 reduce-scatter           ring sends   1,536 B" in text
    assert text.endswith("outputs/grads equal to one device (seeds [0, 1]): True")
    assert len(text.splitlines()) <= 12


def test_lecture_korthikanti_figures():
    """Lecture 9 section 4: the 7B model (32 layers, s = 4096, b = 1) with tp = 8."""
    seven_b = dict(s=4096, b=1, h=4096, a=32, layers=32, tp=8)
    gb = {(r, s): activations.korthikanti_bytes(**seven_b, recompute=r, sp=s) / 1e9
          for r in ("none", "attention") for s in (False, True)}
    assert {k: round(v, 2) for k, v in gb.items()} == {
        ("none", False): 17.72, ("none", True): 13.02,
        ("attention", False): 6.98, ("attention", True): 2.28}


# ------------------------------------------------------------------------ bad arguments


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="s = 6 .*sequence length.* tp_size = 4"):
        sp.compare(4, cfg={**CFG, "s": 6})
    with pytest.raises(ValueError, match="n_heads = 4 .*tp_size = 3"):
        sp.saved_terms(b=1, s=6, h=16, ffn=36, n_heads=4, tp=3)
    with pytest.raises(ValueError, match="mode must be one of"):
        sp.saved_terms(**CFG, tp=2, mode="cp")
    with pytest.raises(ValueError, match="seeds"):
        sp.compare(2, seeds=())
    with pytest.raises(ValueError, match="regather must be a bool"):
        sp.compare(2, regather="yes")
    with pytest.raises(ValueError, match="tp_size"):
        sp.compare(0)
    with pytest.raises(ValueError, match="unknown config key"):
        sp.compare(2, cfg={"seq": 4})
    with pytest.raises(ValueError, match="event must be"):
        sp.ring_bytes_sent(("all_reduce", 8), 2)
    with pytest.raises(ValueError, match="run must be an SPComparison"):
        sp.report(None)
    with pytest.raises(ValueError, match="events must hold only CommEvent"):
        sp.comm_summary([("all_reduce", "forward")], 2)
    with pytest.raises(ValueError, match="events must be"):
        sp.comm_summary(5, 2)
    with pytest.raises(ValueError, match="numel"):
        sp.reduce_scatter_bytes(2, numel=7)
    with pytest.raises(ValueError, match="world_size"):
        sp.reduce_scatter_bytes(1)
    with pytest.raises(ValueError, match="block must be"):
        sp.TensorParallelBlock(tp.MLP(4, 8))


@pytest.mark.parametrize("world_size", [2, 4])
def test_gloo_reduce_scatter_sends_an_all_reduce_and_the_course_form_a_ring(world_size):
    """Bytes each rank wrote to its sockets (measure.bytes_written), as a fraction of the
    tensor: gloo's own reduce-scatter 2(t-1)/t (an all-reduce's), the course's all_to_all_single
    form (t-1)/t (a ring reduce-scatter's); headers add well under 1%."""
    got = sp.reduce_scatter_bytes(world_size)
    if any(v != v for v in got.values()):
        pytest.skip("this host does not show a process's socket bytes (/proc/self/io)")
    t = world_size
    assert got["gloo reduce-scatter"] == pytest.approx(2 * (t - 1) / t, rel=1e-2)
    assert got["course (all_to_all_single)"] == pytest.approx((t - 1) / t, rel=1e-2)

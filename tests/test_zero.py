"""course_utils.zero (sizes, engine, training, timeline) and a3's harness: the lesson's ZeRO
table, from-scratch ZeRO-1/2/3 on real gloo ranks against an unsharded single-process reference,
measured bytes == formula, communication volumes, the ZeRO-2 and ZeRO-3 memory timelines, bf16
against fp32 gradient sums, and bad inputs (a3's feedback: tests/test_reference_answers.py)."""

from __future__ import annotations

import warnings

import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_utils import launch
from course_utils.memory import sizing as memory
from course_utils import zero
from course_utils.assess import a3_zero

SIZES = [16, 32, 32, 8]          # the lecture's model: units of 544, 1056 and 264 elements
UNITS = zero.unit_sizes(SIZES)
GB = 1e9


# ------------------------------------------------------------------------------ the package


FORMER_NAMES = [
    "STAGES", "STAGE_NAMES", "REDUCE_DTYPES", "LAYOUT", "make_mlp", "unit_sizes", "shard_numel",
    "make_batches", "padded_state_bytes", "expected_comm_bytes", "CommLog", "ZeroDP",
    "train_worker", "all_stages_worker", "run_all_stages", "reference_train",
    "sum_rounding_error", "max_abs_diff", "TIMELINE_KINDS", "TIMELINE_KEY", "short_event",
    "timeline_peak", "draw_memory_timeline", "draw_memory_timelines"]


def test_the_former_module_names_are_still_the_package_names():
    missing = [n for n in FORMER_NAMES if not hasattr(zero, n)]
    assert not missing
    assert callable(a3_zero.shard_step_harness) and callable(a3_zero.run_shard_step)


# ------------------------------------------------------------------------------ the formulas


def test_lesson_table_at_7b_and_8_ranks():
    totals = [memory.zero_state_bytes(7e9, 8, s)["total"] / GB for s in zero.STAGES]
    assert totals == pytest.approx([112.0, 38.5, 26.25, 14.0])
    assert memory.to_gib(memory.zero_state_bytes(7e9, 8, 2)["total"]) == pytest.approx(24.45, abs=5e-3)
    assert memory.to_gib(memory.zero_state_bytes(7e9, 8, 0)["total"]) == pytest.approx(104.31, abs=5e-3)


def test_check_yourself_decomposition():
    b = memory.zero_state_bytes(7e9, 8, 2)
    assert b["weights"] / GB == pytest.approx(14.0)                     # replicated bf16 weights
    assert (b["grads"] + b["optimizer"]) / GB == pytest.approx(12.25)   # 7B x 14/8
    assert 112 / 8 == memory.zero_state_bytes(7e9, 8, 3)["total"] / GB  # 14 GB is ZeRO-3


def test_lecture_model_units_and_padding():
    assert UNITS == [544, 1056, 264] and sum(UNITS) == 1864
    assert [zero.shard_numel(n, 2) for n in UNITS] == [272, 528, 132]
    assert [zero.shard_numel(n, 3) for n in UNITS] == [182, 352, 88]   # unit 0 padded by 2


@pytest.mark.parametrize("dp", [1, 2, 4, 8])
@pytest.mark.parametrize("stage", zero.STAGES)
def test_padded_formula_equals_lesson_formula_when_divisible(stage, dp):
    got = zero.padded_state_bytes(UNITS, dp, stage)
    want = memory.zero_state_bytes(sum(UNITS), dp, stage)
    assert {k: float(v) for k, v in got.items()} == pytest.approx(want)


def test_padding_bytes_at_three_ranks():
    extra = [zero.padded_state_bytes(UNITS, 3, s)["total"]
             - memory.zero_state_bytes(sum(UNITS), 3, s)["total"] for s in zero.STAGES]
    assert extra == pytest.approx([0, 8.0, 28 / 3, 32 / 3])  # 12, 14, 16 B x 2/3 element


def test_expected_communication_volumes():
    units = [7_000_000_000]
    totals = [zero.expected_comm_bytes(units, 8, s)["total"] / GB for s in zero.STAGES]
    assert totals == pytest.approx([24.5, 24.5, 24.5, 36.75])
    small = [zero.expected_comm_bytes(UNITS, 2, s)["total"] for s in zero.STAGES]
    assert small == [3728.0, 3728.0, 3728.0, 5592.0]
    assert small[3] / small[0] == 1.5
    fp32 = zero.expected_comm_bytes(UNITS, 2, 1, reduce_dtype="fp32")
    assert fp32["reduce_scatter"] == 2 * fp32["all_gather"]


def test_comm_log_ring_bytes():
    log = zero.CommLog(4)
    log.record("all_gather", 100, 2)
    log.record("reduce_scatter", 100, 4)
    log.record("all_reduce", 10, 2)
    assert log.counts() == {"all_reduce": 1, "reduce_scatter": 1, "all_gather": 1}
    assert log.ring_bytes() == {"all_reduce": 30.0, "reduce_scatter": 300.0, "all_gather": 150.0,
                                "total": 480.0}
    log.clear()
    assert log.ring_bytes()["total"] == 0


# ------------------------------------------------------------------------------ bad inputs


@pytest.mark.parametrize("call, words", [
    (lambda: zero.make_mlp([16]), "sizes"),
    (lambda: zero.make_mlp([16, 0]), "sizes[1]"),
    (lambda: zero.shard_numel(10, 0), "dp"),
    (lambda: zero.shard_numel(0, 2), "n must"),
    (lambda: zero.unit_sizes("16,32"), "sizes"),
    (lambda: zero.padded_state_bytes(UNITS, 2, 4), "stage"),
    (lambda: zero.padded_state_bytes([], 2, 1), "units"),
    (lambda: zero.padded_state_bytes(UNITS, 0, 1), "dp"),
    (lambda: zero.expected_comm_bytes(UNITS, 2, 1, reduce_dtype="fp16"), "reduce_dtype"),
    (lambda: zero.expected_comm_bytes(UNITS, 2, True), "stage"),
    (lambda: zero.make_batches(SIZES, 0, 0, 2, 4), "n_steps"),
    (lambda: zero.reference_train(SIZES, reduce_dtype="int8"), "reduce_dtype"),
    (lambda: zero.run_all_stages(0, SIZES), "dp"),
    (lambda: zero.ZeroDP(zero.make_mlp(SIZES), 5), "stage"),
    (lambda: zero.ZeroDP(zero.make_mlp(SIZES).float(), 1), "bf16"),
    (lambda: zero.ZeroDP(torch.nn.Linear(2, 2).bfloat16(), 1), "nn.Sequential"),
    (lambda: zero.ZeroDP(torch.nn.Sequential(torch.nn.LayerNorm(4)).bfloat16(), 1), "only nn.Linear"),
    (lambda: zero.ZeroDP(zero.make_mlp(SIZES), 1, lr=0), "lr"),
    (lambda: zero.ZeroDP(zero.make_mlp(SIZES), 1, reduce_dtype="fp64"), "reduce_dtype"),
    (lambda: zero.max_abs_diff([torch.zeros(2)], []), "same length"),
    (lambda: a3_zero.run_shard_step(None, torch.zeros(4), torch.zeros(1, 2, 4)), "fn"),
    (lambda: a3_zero.run_shard_step(print, torch.zeros(4), torch.zeros(1, 2, 3)), "local_grads"),
])
def test_bad_input_raises_value_error(call, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        call()


def test_make_mlp_is_deterministic_and_bf16():
    a, b = zero.make_mlp(SIZES, 3), zero.make_mlp(SIZES, 3)
    for p, q in zip(a.parameters(), b.parameters()):
        assert p.dtype == torch.bfloat16
        assert torch.equal(p, q)
    assert sum(p.numel() for p in a.parameters()) == 1864


# ------------------------------------------------------------------------------ on real ranks


@pytest.fixture(scope="module")
def runs():
    """All stages at D = 2 (bf16 reduction) and D = 3 (fp32 reduction), two seeds each."""
    out = {}
    for dp, reduce in ((2, "bf16"), (3, "fp32")):
        for seed in (0, 1):
            out[dp, seed] = (zero.run_all_stages(dp, SIZES, seed=seed, reduce_dtype=reduce,
                                                 timeout_s=240),
                             zero.reference_train(SIZES, seed=seed, dp=dp, reduce_dtype=reduce))
    return out


@pytest.mark.parametrize("dp, seed", [(2, 0), (2, 1), (3, 0), (3, 1)])
@pytest.mark.parametrize("stage", list(zero.STAGES) + ["3+prefetch"])
def test_every_stage_equals_the_unsharded_reference(runs, dp, seed, stage):
    results, reference = runs[dp, seed]
    for rank, r in enumerate(results[stage]):
        torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(reference["losses"]),
                                   rtol=1e-6, atol=0)
        for mine, ref in zip(r["params"], reference["params"]):
            torch.testing.assert_close(torch.from_numpy(mine).bfloat16(), ref, rtol=0, atol=0,
                                       msg=lambda m, rank=rank: f"stage {stage} rank {rank}: {m}")


@pytest.mark.parametrize("dp", [2, 3])
@pytest.mark.parametrize("stage", zero.STAGES)
def test_measured_bytes_equal_formula(runs, dp, stage):
    results, _ = runs[dp, 0]
    want = zero.padded_state_bytes(UNITS, dp, stage)
    for r in results[stage]:
        assert {k: r["bytes"][k] for k in want} == want
        assert r["bytes"]["other"] == 12  # three Adam step counters, outside the layout
    if dp == 2:  # divisible: exactly the lesson's formula
        assert results[stage][0]["bytes"]["total"] == \
            memory.zero_state_bytes(sum(UNITS), 2, stage)["total"]


def test_measured_bytes_stated_in_the_lecture(runs):
    at2 = [runs[2, 0][0][s][0]["bytes"]["total"] for s in zero.STAGES]
    at3 = [runs[3, 0][0][s][0]["bytes"]["total"] for s in zero.STAGES]
    assert at2 == [29824, 18640, 16776, 14912]
    assert at3 == [29824, 14920, 12436, 9952]
    assert runs[3, 0][0][1][2]["padding"] == [2, 0, 0]
    assert runs[3, 0][0][3][0]["shards"] == [182, 352, 88]


@pytest.mark.parametrize("dp, reduce", [(2, "bf16"), (3, "fp32")])
@pytest.mark.parametrize("stage", zero.STAGES)
def test_communication_per_step(runs, dp, reduce, stage):
    results, _ = runs[dp, 0]
    want = zero.expected_comm_bytes(UNITS, dp, stage, reduce_dtype=reduce)
    counts = {0: (3, 0, 0), 1: (0, 3, 3), 2: (0, 3, 3), 3: (0, 3, 6)}[stage]
    for r in results[stage]:
        assert r["comm"] == pytest.approx(want)
        assert tuple(r["comm_counts"].values()) == counts
    if dp == 2:
        dp_total = results[0][0]["comm"]["total"]
        assert results[stage][0]["comm"]["total"] / dp_total == (1.5 if stage == 3 else 1.0)


def test_zero3_timeline_peak_and_prefetch(runs):
    results, _ = runs[2, 0]
    persistent = zero.padded_state_bytes(UNITS, 2, 3)["total"]
    for key, extra_layer in ((3, 0), ("3+prefetch", 1)):
        rows = results[key][0]["timeline"]
        assert {r["persistent"] for r in rows} == {persistent}
        assert rows[0]["gathered weights"] == rows[-1]["gathered weights"] == 0
        totals = [r["persistent"] + r["gathered weights"] + r["unsharded grads"] for r in rows]
        events = [r["event"] for r in rows]
        assert len([e for e in events if "gather L" in e]) == 6  # each unit: forward, backward
        assert len([e for e in events if "prefetch L" in e]) == 4 * extra_layer
        peak = max(totals)
        assert peak > persistent
        if key == 3:  # slices + the largest gathered unit (bf16) + its unsharded bf16 gradient
            assert peak == persistent + max(2 * zero.shard_numel(n, 2) * 2 + 2 * n for n in UNITS)
            assert (persistent, peak) == (14912, 19136)
        else:         # ... plus the next unit, prefetched
            assert (persistent, peak) == (14912, 20224)


@pytest.mark.parametrize("dp", [2, 3])
def test_zero2_peak_holds_one_layer_of_full_gradients_not_all(runs, dp):
    """ZeRO-2 reduce-scatters each layer in backward, as soon as its gradient is accumulated:
    its peak is the persistent state plus the largest layer's full bf16 gradient, below the
    persistent state plus every full gradient at once (reduce-scattering after backward)."""
    results, _ = runs[dp, 0]
    persistent = zero.padded_state_bytes(UNITS, dp, 2)["total"]
    all_full_grads = 2 * sum(UNITS)
    for r in results[2]:
        rows = r["timeline"]
        assert rows is not None
        # measured: the p.grad storages alive at each event; none outside the one layer held
        assert {row["persistent"] for row in rows} == {persistent}
        assert [row["event"] for row in rows] == [
            "step start", "loss", "backward: grads of L2", "backward: reduce-scatter L2",
            "backward: grads of L1", "backward: reduce-scatter L1", "backward: grads of L0",
            "backward: reduce-scatter L0", "optimizer step"]
        assert max(row["unsharded grads"] for row in rows) == 2 * max(UNITS)
        assert all(row["gathered weights"] == 0 for row in rows)
        _, peak = zero.timeline_peak(rows)
        total = sum(peak[k] for k in zero.TIMELINE_KINDS)
        assert total < persistent + all_full_grads
        assert (peak["event"], total) == ("backward: grads of L1", persistent + 2 * 1056)
    if dp == 2:  # the figures lecture 3 prints
        assert (persistent, total, persistent + all_full_grads) == (16776, 18888, 20504)


def test_sum_rounding_error_bf16_grows_with_ranks_fp32_does_not():
    bf16 = [zero.sum_rounding_error(d, "bf16") for d in (2, 8, 64)]
    fp32 = [zero.sum_rounding_error(d, "fp32") for d in (2, 8, 64)]
    assert bf16[0] == fp32[0]                    # two ranks: one rounding either way
    assert bf16[0] < bf16[1] < bf16[2] and bf16[2] > 3 * fp32[2]
    assert max(fp32) < 2 ** -8 and max(fp32) < 1.3 * min(fp32)  # one final bf16 rounding
    for seed in (1, 2):
        assert zero.sum_rounding_error(64, "bf16", seed=seed) > 3 * zero.sum_rounding_error(
            64, "fp32", seed=seed)
    with pytest.raises(ValueError, match="reduce_dtype"):
        zero.sum_rounding_error(4, "fp16")


def test_bf16_arithmetic_stated_in_the_lecture():
    assert torch.finfo(torch.bfloat16).eps == 2 ** -7  # 8 significant bits
    assert torch.finfo(torch.float32).eps == 2 ** -23  # 24
    assert (torch.tensor(256.0, dtype=torch.bfloat16) + 1).item() == 256.0


def test_timeline_peak_and_short_events(runs):
    results, _ = runs[2, 0]
    i, row = zero.timeline_peak(results[3][0]["timeline"])
    assert row["event"] == "backward: grads of L1" and results[3][0]["timeline"][i] is row
    events = ("step start", "forward: gather L0", "forward: prefetch L1", "forward: release L2",
              "loss", "backward: grads of L1", "backward: reduce-scatter L0", "optimizer step")
    assert [zero.short_event(e) for e in events] == [
        "start", "g0", "p1", "r2", "loss", "∇1", "rs0", "Adam"]


def test_memory_timelines_figure_passes_the_course_check(runs):
    """The lecture's figure: gathers visible above the persistent state, no clipped, overlapping
    or tiny text (course_utils.style's check)."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course_utils import style

    results, _ = runs[2, 0]
    with matplotlib.rc_context():
        style.use()
        fig = zero.draw_memory_timelines({
            "ZeRO-2": results[2][0]["timeline"], "ZeRO-3": results[3][0]["timeline"],
            "ZeRO-3 + prefetch": results["3+prefetch"][0]["timeline"]})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fig.canvas.draw()
        assert [str(w.message) for w in caught if issubclass(w.category, style.FigureWarning)] == []
        for ax in fig.axes:
            # the axis starts near the slices (drawn above the break: tick labels say bytes)
            real = [float(t.get_text()) * 1e3 for t in ax.get_yticklabels() if t.get_text()]
            assert 0 < min(real) <= 14912 and 14912 - min(real) < 0.5 * (max(real) - min(real))
            assert ax.get_ylim()[0] == 0
            assert all(t.get_rotation() == 0 and t.get_fontsize() >= 9
                       for t in ax.get_xticklabels())
        plt.close(fig)


@pytest.mark.parametrize("call, words", [
    (lambda: zero.draw_memory_timeline([]), "non-empty"),
    (lambda: zero.draw_memory_timeline([{"event": "loss"}]), "persistent"),
    (lambda: zero.draw_memory_timelines({}), "non-empty"),
])
def test_timeline_drawing_rejects_bad_rows(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_bf16_reduction_at_four_ranks_is_close_not_exact():
    """With D > 2 a bf16 sum's order depends on the ring chunk: close, not bitwise."""
    from course_utils import launch

    reference = zero.reference_train(SIZES, seed=1, dp=4, reduce_dtype="bf16")
    results = launch.run(zero.train_worker, 4, 2, SIZES, 1, timeout_s=240)
    for r in results:
        for mine, ref in zip(r["params"], reference["params"]):
            torch.testing.assert_close(torch.from_numpy(mine).bfloat16(), ref, atol=4e-3, rtol=0)


# ---------------------------------------------- ZeRO-3 as a module wrapper (course_utils.zero.zero3)


class _RMSNorm(nn.Module):
    """RMSNorm computed in fp32 whatever the input's dtype, the result in the input's dtype."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(d))

    def forward(self, x):
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight).to(x.dtype)


class _Toy(nn.Module):
    """Embedding, RMSNorm and Linear layers, as in CS336's FSDP test."""

    def __init__(self, vocab=20, d=8, ff=12):
        super().__init__()
        self.embedding, self.norm1 = nn.Embedding(vocab, d), _RMSNorm(d)
        self.up, self.norm2, self.down = nn.Linear(d, ff), _RMSNorm(ff), nn.Linear(ff, d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        h = torch.relu(self.up(self.norm1(self.embedding(ids))))
        return self.head(self.down(self.norm2(h)))


class _OwnLinear(nn.Module):
    """A Linear of the model's own class (not nn.Linear): weight and bias, F.linear."""

    def __init__(self, d_in, d_out):
        super().__init__()
        k = d_in ** -0.5                        # nn.Linear's initialization
        self.weight = nn.Parameter(torch.empty(d_out, d_in).uniform_(-k, k))
        self.bias = nn.Parameter(torch.empty(d_out).uniform_(-k, k))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class _ToyOwnLinear(_Toy):
    """_Toy with its up and down projections of the model's own Linear class."""

    def __init__(self, vocab=20, d=8, ff=12):
        super().__init__(vocab, d, ff)
        self.up, self.down = _OwnLinear(d, ff), _OwnLinear(ff, d)


_SHARDED = ("embedding.weight", "up.weight", "up.bias", "down.weight", "down.bias",
            "head.weight")
_TOYS = {"nn.Linear": _Toy, "own Linear": _ToyOwnLinear}


def _zero3_worker(rank, world_size, seed, dtype, opt_name, toy="nn.Linear"):
    """One process on the whole batch (its sharded layers computing in ``dtype`` too) against
    the wrapper on this rank's rows; the largest weight difference after 3 steps, and what the
    wrapper kept."""
    import copy

    from course_utils.zero.zero3 import ShardedModule

    torch.manual_seed(seed)
    base = _TOYS[toy]()
    ref = copy.deepcopy(base)
    model = ShardedModule(copy.deepcopy(base), compute_dtype=dtype)
    assert sorted(n for n, p in model.module.named_parameters()
                  if all(p is not q for q in model.replicated)) == sorted(_SHARDED)
    make = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
            "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1)}[opt_name]
    ref_opt, opt = make(ref.parameters()), make(model.parameters())
    gen = torch.Generator().manual_seed(100 + seed)
    alive, gathers = [], []
    for _ in range(3):
        x = torch.randint(0, 20, (4 * world_size, 6), generator=gen)
        y = torch.randint(0, 20, (4 * world_size, 6), generator=gen)
        cast = {n: p.to(dtype) for n, p in ref.named_parameters() if n in _SHARDED} if dtype \
            else {}
        logits = torch.func.functional_call(ref, cast, (x,), strict=False) if cast else ref(x)
        F.cross_entropy(logits.float().flatten(0, 1), y.flatten()).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        rows = slice(4 * rank, 4 * rank + 4)
        before = model.gathers
        logits = model(x[rows])
        alive.append(model.gathered_alive())
        F.cross_entropy(logits.float().flatten(0, 1), y[rows].flatten()).backward()
        model.finish_gradient_synchronization()
        gathers.append(model.gathers - before)
        grads_ok = all(p.grad is not None and p.grad.shape == p.shape
                       and p.grad.dtype == torch.float32 for p in model.parameters())
        opt.step()
        opt.zero_grad()
    full = model.gather_full_params()
    diff = max(float((full[n] - p.detach()).abs().max()) for n, p in ref.named_parameters())
    norm_grad = [float(p.detach().sum()) for p in model.replicated]
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        ShardedModule(copy.deepcopy(base), shard_types=(nn.Linear, nn.Embedding))
    return diff, alive, gathers, grads_ok, norm_grad, [str(w.message) for w in warned]


@pytest.mark.parametrize("toy,opt_name,dtype", [
    ("nn.Linear", "sgd", None), ("nn.Linear", "adamw", None),
    ("nn.Linear", "sgd", torch.float16), ("nn.Linear", "adamw", torch.float16),
    ("own Linear", "adamw", None), ("own Linear", "sgd", torch.float16)],
    ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("seed", [0, 1])
def test_zero3_module_wrapper_equals_one_process(seed, dtype, opt_name, toy):
    """ZeRO-3 as CS336's FSDP test drives it: a module wrapper, an outside optimizer, fp32 and
    fp16 compute. After forward no gathered weight is left; each step gathers the 6 sharded
    tensors for forward and the 3 Linear weights again for backward. Layers are sharded by
    their parameters: a Linear of the model's own class is sharded and cast as nn.Linear is
    (by class, it would be left whole: the wrapper says so)."""
    tol = 1e-6 if dtype is None else (1e-4 if opt_name == "sgd" else 1e-3)
    results = launch.run(functools.partial(_zero3_worker, seed=seed, dtype=dtype,
                                           opt_name=opt_name, toy=toy), 2, timeout_s=90)
    for diff, alive, gathers, grads_ok, norms, warned in results:
        assert diff < tol
        assert alive == [0, 0, 0] and gathers == [9, 9, 9] and grads_ok
        assert norms == results[0][4]          # the replicated norms stay equal on every rank
        assert warned == ([] if toy == "nn.Linear" else [
            "ShardedModule keeps these weight matrices whole on every rank (not of "
            "shard_types): up.weight, down.weight"])

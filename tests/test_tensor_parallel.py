"""Tensor parallelism (course_utils.tensor_parallel): split layers against one device, and the
figures lecture 4 states; assignment a4's harness (course_utils.assess.a4_tensor_parallel)."""

from __future__ import annotations

import pickle

import matplotlib
import pytest
import torch
import torch.distributed as dist

from course_utils import launch
from course_utils import tensor_parallel as tp
from course_utils.assess import a4_tensor_parallel as harness
from course_utils.tensor_parallel import one_device

matplotlib.use("Agg")

SEEDS = (0, 1)


# ------------------------------------------------------------------------------ pure sharding


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("t", [1, 2, 4])
def test_column_shards_compute_disjoint_output_features(seed, t):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(3, 5, 8, generator=g), torch.randn(8, 12, generator=g)
    pieces = [x @ tp.column_shard(w, r, t) for r in range(t)]  # each (3, 5, 12/t)
    assert all(p.shape == (3, 5, 12 // t) for p in pieces)
    torch.testing.assert_close(torch.cat(pieces, dim=-1), x @ w)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("t", [1, 2, 4])
def test_row_shards_compute_partial_sums_of_full_shape(seed, t):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(3, 5, 8, generator=g), torch.randn(8, 12, generator=g)
    partials = []
    for r in range(t):
        rows = slice(*tp.shard_range(8, t, r))
        partials.append(x[..., rows] @ tp.row_shard(w, r, t))
    assert all(p.shape == (3, 5, 12) for p in partials)
    torch.testing.assert_close(sum(partials), x @ w)
    if t > 1:  # concatenating partial sums is not the answer
        assert torch.cat(partials, -1).shape != (x @ w).shape


def test_shard_range_covers_in_order():
    assert [tp.shard_range(12, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 12)]


@pytest.mark.parametrize("call, word", [
    (lambda: tp.shard_range(10, 4, 0), "divisible"),
    (lambda: tp.shard_range(8, 0, 0), "tp_size"),
    (lambda: tp.shard_range(8, 2, 2), "tp_rank"),
    (lambda: tp.shard_range(8, 2, -1), "tp_rank"),
    (lambda: tp.shard_range(8, True, 0), "tp_size"),
    (lambda: tp.column_shard(torch.zeros(4), 0, 2), "w"),
    (lambda: tp.row_shard("W", 0, 2), "w"),
    (lambda: tp.column_shard(torch.zeros(4, 6), 0, 4), "divisible"),
    (lambda: tp.tp_comm_bytes(0, 1, 1, 1), "b"),
    (lambda: tp.tp_comm_bytes(1, 1, 1, 2, layer="ffn"), "layer"),
    (lambda: tp.tp_comm_bytes(1, 1, 1, 2, dtype="int8"), "dtype"),
    (lambda: tp.dtype_bytes(torch.int32), "dtype"),
    (lambda: tp.ring_all_reduce_bytes_per_rank(-1, 2), "nbytes"),
    (lambda: tp.mlp_comm_to_compute(64, 2, "bf16", 0, 1e9), "flops_per_s"),
    (lambda: tp.mlp_comm_to_compute(64, 2, "bf16", 1e9, -1), "link_bytes_per_s"),
    (lambda: tp.mlp_param_count(0, 4), "h"),
    (lambda: tp.compare("conv", 2), "kind"),
    (lambda: tp.compare("mlp", 0), "tp_size"),
    (lambda: tp.compare("mlp", 2, seeds=()), "seeds"),
    (lambda: tp.compare("mlp", 2, cfg={"width": 3}), "width"),
    (lambda: tp.compare("attention", 4, cfg={"n_heads": 2}), "n_heads"),
    (lambda: tp.compare("attention", 2, cfg={"h": 10, "n_heads": 4}), "n_heads"),
    (lambda: tp.compare("mlp", 3), "ffn"),
    (lambda: tp.layer_plan("dtensor_mlp", 2), "kind"),
    (lambda: tp.layer_plan("mlp", 3), "ffn"),
    (lambda: tp.layer_plan("attention", 3), "n_heads"),
    (lambda: tp.layer_plan("mlp", 2, dtype="int8"), "dtype"),
    (lambda: tp.time_comm_vs_matmul(0, 2, [(4, 4, 3)]), "sizes"),
    (lambda: tp.time_comm_vs_matmul(0, 2, []), "sizes"),
    (lambda: tp.time_comm_vs_matmul(0, 2, [(4, 4, 4)], repeats=0), "repeats"),
    (lambda: tp.Attention(10, 4), "n_heads"),
    (lambda: tp.ColumnParallelLinear.from_linear(torch.nn.Linear(4, 4)), "process group"),
    (lambda: harness.run_row_parallel(lambda *a: None, 2, [], torch.zeros(4, 2), torch.zeros(2)),
     "xs"),
])
def test_bad_input_raises_value_error_naming_it(call, word):
    with pytest.raises(ValueError, match=word):
        call()


# ---------------------------------------------------------------------- counted communication


def test_comm_bytes_are_activation_sized():
    c = tp.tp_comm_bytes(2, 4, 16, 4, torch.float32, "mlp")
    assert c == {"all_reduces_forward": 1, "all_reduces_backward": 1, "payload_bytes": 512,
                 "forward_bytes": 512, "backward_bytes": 512, "ring_bytes_sent_per_rank": 1536.0}
    block = tp.tp_comm_bytes(2, 4, 16, 4, "fp32", "block")
    assert (block["all_reduces_forward"], block["all_reduces_backward"]) == (2, 2)
    assert tp.tp_comm_bytes(2, 4, 16, 1)["ring_bytes_sent_per_rank"] == 0  # tp = 1: no comm
    # doubling b, s or h doubles the bytes; dtype scales them
    base = tp.tp_comm_bytes(2, 4, 16, 4, "bf16")["payload_bytes"]
    assert base == 2 * 4 * 16 * 2
    for kwargs in ({"b": 4, "s": 4, "h": 16}, {"b": 2, "s": 8, "h": 16}, {"b": 2, "s": 4, "h": 32}):
        assert tp.tp_comm_bytes(tp=4, dtype="bf16", **kwargs)["payload_bytes"] == 2 * base
    assert tp.tp_comm_bytes(2, 4, 16, 4, "fp32")["payload_bytes"] == 2 * base


def test_dtype_bytes_and_ring_factor():
    assert [tp.dtype_bytes(d) for d in ("fp32", "bf16", "fp16", torch.float64)] == [4, 2, 2, 8]
    assert tp.ring_all_reduce_bytes_per_rank(800, 8) == 1400
    assert tp.ring_all_reduce_bytes_per_rank(800, 2) == 800
    assert tp.mlp_param_count(16, 32) == 1072 and tp.mlp_param_count(16, 128) == 4240


def test_lecture_figures_for_a_7b_class_block():
    """The numbers lecture 4 prints for h = s = 4096, b = 1, t = 8, bf16, 32 blocks."""
    block = tp.tp_comm_bytes(1, 4096, 4096, 8, "bf16", layer="block")
    assert block["payload_bytes"] == 32 * 2**20
    assert round(block["ring_bytes_sent_per_rank"] / 1e6, 1) == 234.9
    assert round(32 * block["ring_bytes_sent_per_rank"] / 1e9, 2) == 7.52
    assert 32 * (block["all_reduces_forward"] + block["all_reduces_backward"]) == 128


def test_comm_to_compute_model():
    fast = tp.mlp_comm_to_compute(4096, 8, "bf16", 1e15, 450e9)
    slow = tp.mlp_comm_to_compute(4096, 8, "bf16", 1e15, 50e9)
    assert round(fast, 2) == 0.95 and round(slow, 2) == 8.54
    # closed form for ffn = 4h: (t-1) * bytes * F / (8 h B)
    assert fast == pytest.approx(7 * 2 * 1e15 / (8 * 4096 * 450e9))
    # larger h hides communication better; a larger t makes it worse
    assert tp.mlp_comm_to_compute(8192, 8, "bf16", 1e15, 450e9) < fast
    assert tp.mlp_comm_to_compute(4096, 16, "bf16", 1e15, 450e9) > fast


# ------------------------------------------------------------------- real ranks vs one device


def _events(c: tp.Comparison) -> list[tuple[str, str, int]]:
    return [(e.op, e.phase, e.nbytes) for e in c.comms[0]]


def _planned(c: tp.Comparison, cfg: dict | None = None) -> bool:
    """Whether :func:`tp.layer_plan` (what module 4's widget shows) predicted the run: every
    rank's parameter shapes and the collectives it recorded, in order, with their bytes."""
    plan = tp.layer_plan(c.kind, c.tp_size, cfg)
    return all(shapes == plan.shapes for shapes in c.shapes) and \
        all(comms == plan.comms for comms in c.comms)


@pytest.mark.parametrize("t", [2, 4])
def test_column_parallel_matches_one_device(t):
    c = tp.compare("column", t, SEEDS)
    assert c.names == ["y", "x.grad", "y_local", "weight.grad", "bias.grad"]
    assert c.shapes[0] == {"weight": (16, 32 // t), "bias": (32 // t,)}
    # forward: all-gather of (2, 4, 32) fp32; backward: f's all-reduce of dL/dX (2, 4, 16)
    assert _events(c) == [("all_gather", "forward", 1024), ("all_reduce", "backward", 512)]
    assert _planned(c)


@pytest.mark.parametrize("t", [2, 4])
def test_row_parallel_matches_one_device(t):
    c = tp.compare("row", t, SEEDS)
    assert "partial" in c.names and c.specs["partial"].startswith("partial sums")
    assert c.shapes[0] == {"weight": (32 // t, 16), "bias": (16,)}
    assert _events(c) == [("all_reduce", "forward", 512)]
    assert _planned(c)


@pytest.mark.parametrize("t", [2, 4])
def test_megatron_mlp_matches_one_device_with_one_all_reduce_each_way(t):
    c = tp.compare("mlp", t, SEEDS)
    assert len(c.names) == 6
    assert c.shapes[0] == {"up.weight": (16, 32 // t), "up.bias": (32 // t,),
                           "down.weight": (32 // t, 16), "down.bias": (16,)}
    payload = tp.tp_comm_bytes(2, 4, 16, t, torch.float32)["payload_bytes"]
    for rank_comms in c.comms:  # every rank, not just rank 0
        assert [(e.op, e.phase, e.nbytes) for e in rank_comms] == [
            ("all_reduce", "forward", payload), ("all_reduce", "backward", payload)]
    assert _planned(c)


@pytest.mark.parametrize("t", [2, 4])
def test_attention_split_by_heads_matches_one_device(t):
    c = tp.compare("attention", t, SEEDS, cfg={"h": 16, "n_heads": 4})
    assert len(c.names) == 10
    assert c.shapes[0]["qkv.weight"] == (16, 3 * 16 // t)
    assert c.shapes[0]["o.weight"] == (16 // t, 16)
    assert [(e.op, e.phase) for e in c.comms[0]] == [("all_reduce", "forward"),
                                                     ("all_reduce", "backward")]
    assert _planned(c, {"h": 16, "n_heads": 4})


@pytest.mark.parametrize("t", [2, 4])
def test_dtensor_parallelize_module_matches_one_device_and_from_scratch(t):
    dt = tp.compare("dtensor_mlp", t, SEEDS)
    scratch = tp.compare("mlp", t, (0,))
    assert dt.names == scratch.names
    assert dt.extra["placements"] == {"up.weight": "Shard(dim=0)", "up.bias": "Shard(dim=0)",
                                      "down.weight": "Shard(dim=1)", "down.bias": "Replicate()"}
    assert dt.extra["comm_counts"] == {"forward": {"all_reduce": 1},
                                       "backward": {"all_reduce": 1}}
    for name in ("up.weight", "down.weight"):  # DTensor shards = from-scratch shards transposed
        assert dt.shapes[0][name] == scratch.shapes[0][name][::-1]


def test_comm_grows_with_activations_not_parameters():
    sent = {}
    for key, cfg in {"base": {"b": 2, "ffn": 32}, "4x params": {"b": 2, "ffn": 128},
                     "2x batch": {"b": 4, "ffn": 32}}.items():
        sent[key] = sum(e.nbytes for e in tp.compare("mlp", 2, (0,), cfg=cfg).comms[0])
    assert sent == {"base": 1024, "4x params": 1024, "2x batch": 2048}


def _comparison(t: int, kind: str = "mlp") -> tp.Comparison:
    """A synthetic :class:`Comparison` shaped like compare("mlp", t) (no ranks started)."""
    names = ["y", "x.grad", "up.weight.grad", "up.bias.grad", "down.weight.grad",
             "down.bias.grad"]
    specs = dict(zip(names, ["same full tensor on every rank"] * 2
                     + ["slices: concatenated along dim 1", "slices: concatenated along dim 0"]
                     + ["slices: concatenated along dim 0", "same full tensor on every rank"]))
    shapes = {"up.weight": (16, 32 // t), "up.bias": (32 // t,), "down.weight": (32 // t, 16),
              "down.bias": (16,)}
    comms = [tp.CommEvent("all_reduce", phase, (2, 4, 16), 512)
             for phase in ("forward", "backward")]
    return tp.Comparison(kind, t, (0, 1), names, specs, 0.0, [shapes] * t, [comms] * t)


def test_comparison_table_puts_degrees_side_by_side():
    table = tp.comparison_table([_comparison(2), _comparison(4)])
    lines = table.splitlines()
    assert len(lines) <= 12
    assert lines[0].startswith("Megatron MLP: all 6 tensors match one device")
    assert lines[1].split()[:2] == ["weights", "in"] and "Y = X W layout" in lines[1]
    assert lines[2].split() == ["t", "=", "2", "t", "=", "4"]
    up = next(line for line in lines if line.startswith("rank 0 up.weight"))
    assert "(16, 16)" in up and "(16, 8)" in up
    backward = next(line for line in lines if line.startswith("backward collectives"))
    assert backward.count("all_reduce (2, 4, 16) 512 B") == 2
    assert any(line.startswith("concatenated along dim 1") and line.split()[-1] == "up.weight.grad"
               for line in lines)
    assert any(line.startswith("concatenated along dim 0") and "up.bias.grad, down.weight.grad"
               in line for line in lines)
    assert any(line.startswith("same on every rank") and "down.bias.grad" in line
               for line in lines)


@pytest.mark.parametrize("kind, split_dims", [
    ("column", {"weight": 1}), ("row", {"weight": 0}),
    ("mlp", {"up.weight": 1, "down.weight": 0}),
    ("dtensor_mlp", {"up.weight": 0, "down.weight": 1})])
def test_weight_shapes_and_gradient_dims_share_one_layout(kind, split_dims):
    """The table gives rank 0's weight shapes and the dim its weight gradients are concatenated
    along in the same layout (Y = X W from scratch, nn.Linear for DTensor), and says which: the
    dim a rank's weight is cut along is the dim the gradient slices are concatenated along."""
    c = tp.compare(kind, 4, (0,))
    layout = "nn.Linear layout" if kind == "dtensor_mlp" else "Y = X W layout"
    assert layout in tp.comparison_table([c]).splitlines()[1]
    for name, dim in split_dims.items():
        assert c.shapes[0][name][dim] == 8  # 32 / 4 (h = 16, ffn = 32): the cut dim
        assert c.specs[name + ".grad"] == f"slices: concatenated along dim {dim}"


def test_comparison_table_rejects_mixed_layers():
    with pytest.raises(ValueError, match="same layer"):
        tp.comparison_table([_comparison(2), _comparison(4, kind="column")])
    with pytest.raises(ValueError, match="Comparison"):
        tp.comparison_table([])


def test_compare_detects_a_wrong_layer(monkeypatch):
    """The comparison is not vacuous: a reference that differs makes it fail."""
    real = one_device.reference

    def off_by_a_bit(kind, seed, cfg=None):
        out = real(kind, seed, cfg)
        out["y"] = out["y"] + 1e-3
        return out

    monkeypatch.setattr(one_device, "reference", off_by_a_bit)
    with pytest.raises(AssertionError, match="y"):
        tp.compare("mlp", 2, (0,))


# ------------------------------------------------------------------- the conjugate operators


@pytest.mark.parametrize("t", [2, 4])
@pytest.mark.parametrize("seed", SEEDS)
def test_conjugate_operators_forward_and_backward(t, seed):
    ranks = [pickle.loads(b) for b in launch.run(tp.conjugate_worker, t, seed, timeout_s=120)]
    xs = [r["x"] for r in ranks]
    for r, out in enumerate(ranks):
        # f: identity forward, all-reduce backward
        torch.testing.assert_close(out["f.out"], xs[r])
        torch.testing.assert_close(out["f.grad"], sum(o["f.dy"] for o in ranks))
        # g: all-reduce forward, identity backward
        torch.testing.assert_close(out["g.out"], sum(xs))
        torch.testing.assert_close(out["g.grad"], out["g.dy"])
        # gather: concatenate forward, own slice backward
        torch.testing.assert_close(out["gather.out"], torch.cat(xs, -1))
        width = xs[0].shape[-1]
        torch.testing.assert_close(out["gather.grad"],
                                   out["gather.dy"][..., r * width:(r + 1) * width])
        # scatter: own slice forward, all-gather backward
        lo, hi = tp.shard_range(width, t, r)
        torch.testing.assert_close(out["scatter.out"], xs[r][..., lo:hi])
        torch.testing.assert_close(out["scatter.grad"],
                                   torch.cat([o["scatter.dy"] for o in ranks], -1))
        assert out["f.comms"] == [("all_reduce", "backward")]
        assert out["g.comms"] == [("all_reduce", "forward")]
        assert out["gather.comms"] == [("all_gather", "forward")]
        assert out["scatter.comms"] == [("all_gather", "backward")]


# ---------------------------------------------------------------- the assignment's harness


def _good_row_parallel(x_local, w_local, bias, tp_group=None):
    partial = x_local @ w_local
    dist.all_reduce(partial, group=tp_group)
    return partial + bias


def _world_row_parallel(x_local, w_local, bias, tp_group=None):
    partial = x_local @ w_local
    dist.all_reduce(partial)  # forgets the group
    return partial + bias


@pytest.mark.parametrize("seed", SEEDS)
def test_row_parallel_harness_two_tp_groups(seed):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(2, 3, 8, generator=g) for _ in range(2)]
    w, bias = torch.randn(8, 4, generator=g), torch.randn(4, generator=g)
    runs = harness.run_row_parallel(_good_row_parallel, 2, xs, w, bias, timeout_s=120)
    assert len(runs) == 4
    for rank, run in enumerate(runs):
        torch.testing.assert_close(run["y"], xs[rank // 2] @ w + bias)
        assert run["calls"] == [("all_reduce", 2)]
    wrong = harness.run_row_parallel(_world_row_parallel, 2, xs, w, bias, timeout_s=120)
    assert all(run["calls"] == [("all_reduce", 4)] for run in wrong)
    assert not torch.allclose(wrong[0]["y"], xs[0] @ w + bias)


def test_spy_leaves_torch_distributed_as_it_was():
    """However the spy listens (wrappers or the dispatcher), torch.distributed is unchanged
    after the block, and a block without collectives records none."""
    original = dist.all_reduce
    with tp.spy_collectives() as calls:
        pass
    assert dist.all_reduce is original and calls == []


# --------------------------------------------------------------------------------- pictures


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("draw", ["draw_column_split", "draw_row_split", "draw_megatron_mlp"])
def test_pictures_pass_the_course_figure_check(draw, t):
    """Readable at a notebook's width: no clipped, overlapping or tiny text (course style)."""
    import matplotlib.pyplot as plt

    from course_utils import style
    from course_utils.tensor_parallel import pictures as tp_pictures

    with matplotlib.rc_context():
        style.use()
        fig = getattr(tp_pictures, draw)(tp=t)
        fig.canvas.draw()
        assert style.problems(fig, fig.canvas.get_renderer()) == []
        assert fig.get_size_inches()[0] <= 9
        drawn = {text.get_text() for text in fig.axes[0].texts}
        if t <= 4:  # every block keeps its label at the sizes the lecture draws
            assert {"W0", "X @ W1[:, r]\n(b, s, ffn/t)"} & drawn, drawn
        plt.close(fig)


def test_rank_colours_are_shades_of_the_tp_colour():
    from course_utils import style
    from course_utils.tensor_parallel import pictures as tp_pictures

    assert tp_pictures.rank_colour(0, 1) != tp_pictures.rank_colour(0, 2)
    shades = [tp_pictures.rank_colour(r, 4) for r in range(4)]
    assert len(set(shades)) == 4 and style.AXIS_COLORS["tp"] not in ("", None)


def test_timing_picture_checks_its_rows_and_passes_the_figure_check():
    import matplotlib.pyplot as plt

    from course_utils import style
    from course_utils.tensor_parallel import pictures as tp_pictures

    rows = [{"tokens": 256, "h": h, "ffn": 4 * h, "tp": 2, "matmul_s": m, "all_reduce_s": a}
            for h, m, a in ((128, 4e-4, 1e-3), (256, 2e-3, 4e-4), (512, 1e-2, 5e-4))]
    with matplotlib.rc_context():
        style.use()
        fig = tp_pictures.draw_comm_vs_matmul(rows)
        fig.canvas.draw()
        assert style.problems(fig, fig.canvas.get_renderer()) == []
        assert "ffn = 4h, 256 tokens, 2 ranks" in fig.axes[0].get_xlabel()
        plt.close(fig)
    with pytest.raises(ValueError, match="timings"):
        tp_pictures.draw_comm_vs_matmul([{"h": 128}])


@pytest.mark.parametrize("draw", ["draw_column_split", "draw_row_split", "draw_megatron_mlp"])
def test_pictures_draw_and_reject_bad_sizes(draw):
    import matplotlib.pyplot as plt

    from course_utils.tensor_parallel import pictures as tp_pictures

    fig = getattr(tp_pictures, draw)(tp=4)
    assert fig.axes
    plt.close(fig)
    with pytest.raises(ValueError, match="tp"):
        getattr(tp_pictures, draw)(tp=0)
    with pytest.raises(ValueError, match="divisible"):
        getattr(tp_pictures, draw)(tp=3)


# ------------------------------------------------------------------------------ timing worker


def test_timing_worker_reports_positive_times_and_counted_work():
    """Only the structure: speed is measured in benchmarks/, never asserted in tests."""
    rows = launch.run(tp.time_comm_vs_matmul, 2, [(8, 16, 64)], 2, timeout_s=120,
                      threads_per_rank=1)
    for rank_rows in rows:
        (row,) = rank_rows
        assert row["matmul_s"] > 0 and row["all_reduce_s"] > 0
        assert row["matmul_flops"] == 2 * 2 * 8 * 16 * 32  # two matmuls with ffn/t = 32
        assert row["all_reduce_bytes"] == 8 * 16 * 4
        assert row["threads"] == 1  # what the lecture prints beside the machine's core count

"""Memory accounting: the lesson's figures, layouts, units, real byte counts, bad inputs."""

from __future__ import annotations

import math

import pytest
import torch

from course_utils import launch
from course_utils.memory import sizing as memory


def test_lesson_figures():
    total = memory.state_bytes(7e9, "mixed_adam16")
    assert total == 112e9
    assert memory.to_gb(total) == 112.0
    assert round(memory.to_gib(total), 2) == 104.31
    assert memory.format_bytes(total) == "112.00 GB"
    assert memory.format_bytes(total, "GiB") == "104.31 GiB"
    assert not memory.fits(total, 64)
    assert memory.layout("mixed_adam16").optimizer_bucket == 12


def test_lecture_1_exercise_answers():
    """The answers lecture 1 states in its Exercises cell, recomputed."""
    from pathlib import Path

    state = memory.state_bytes(30e9, "mixed_adam16")
    fp32_grads = memory.state_bytes(30e9, "mixed_adam_fp32_grads")
    line = (f"1. 30e9 x 16 = {memory.to_gb(state):.0f} GB = {memory.to_gib(state):.1f} GiB. "
            f"2. 2 + 4 + 4 + 8 = {memory.layout('mixed_adam_fp32_grads').total} B/param "
            f"({memory.to_gb(fp32_grads):.0f} GB).")
    assert line == ("1. 30e9 x 16 = 480 GB = 447.0 GiB. 2. 2 + 4 + 4 + 8 = 18 B/param (540 GB).")
    import nbformat

    lecture = Path(__file__).resolve().parent.parent / "notebooks" / "01_training_state.ipynb"
    text = "\n".join(c.source for c in nbformat.read(lecture, as_version=4).cells
                     if c.cell_type == "markdown")
    assert line in text.splitlines()


@pytest.mark.parametrize("name, total", [("mixed_adam16", 16), ("mixed_adam_fp32_grads", 18),
                                         ("bf16_adam_no_master", 12), ("fp32_adam", 16),
                                         ("fp32_sgd", 8)])
def test_layout_totals(name, total):
    assert memory.layout(name).total == total
    assert sum(memory.layout(name).parts().values()) == total


def test_zero_table_at_7b_d8():
    got = {s: memory.zero_state_bytes(7e9, 8, s)["total"] / 1e9 for s in memory.ZERO_STAGES}
    assert got == pytest.approx({0: 112.0, 1: 38.5, 2: 26.25, 3: 14.0})
    z2 = memory.zero_state_bytes(7e9, 8, 2)
    assert z2["weights"] / 1e9 == pytest.approx(14.0)
    assert (z2["grads"] + z2["optimizer"]) / 1e9 == pytest.approx(12.25)


@pytest.mark.parametrize("call, word", [
    (lambda: memory.state_bytes(-1), "n_params"),
    (lambda: memory.state_bytes("7e9"), "n_params"),
    (lambda: memory.state_bytes(float("nan")), "n_params"),
    (lambda: memory.state_bytes(10, "adamw_magic"), "layout"),
    (lambda: memory.to_gb(-5), "n_bytes"),
    (lambda: memory.format_bytes(10, "GiGa"), "unit"),
    (lambda: memory.fits(10, 0), "device_gb"),
    (lambda: memory.zero_state_bytes(7e9, 0, 1), "dp"),
    (lambda: memory.zero_state_bytes(7e9, 8, 4), "stage"),
    (lambda: memory.tiny_mlp((64,)), "widths"),
    (lambda: memory.count_state_bytes("model"), "model"),
])
def test_bad_arguments_name_the_argument(call, word):
    with pytest.raises(ValueError, match=word):
        call()


def test_mixed_precision_adam_rejects_fp32_model():
    with pytest.raises(ValueError, match="bf16"):
        memory.MixedPrecisionAdam(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("widths", [(8, 16, 4), (64, 256, 64), (5, 3)])
def test_measured_bytes_equal_16_per_param(seed, widths):
    model = memory.tiny_mlp(widths, seed)
    opt = memory.MixedPrecisionAdam(model)
    model(torch.randn(3, widths[0]).bfloat16()).float().sum().backward()
    opt.step()
    counts = memory.count_state_bytes(model, opt)
    n = sum(p.numel() for p in model.parameters())
    assert (counts["weights"], counts["grads"], counts["master"], counts["optimizer"]) == (
        2 * n, 2 * n, 4 * n, 8 * n)
    n_tensors = len(list(model.parameters()))
    assert counts["other"] == 4 * n_tensors  # Adam's fp32 step counters
    assert counts["total"] == 16 * n + 4 * n_tensors


def test_mixed_precision_adam_follows_fp32_adam():
    """The master weights follow plain fp32 Adam given the same (bf16) gradients."""
    model = memory.tiny_mlp((6, 5, 3), seed=3)
    ref = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
    ref_opt = torch.optim.Adam(ref, lr=1e-2)
    opt = memory.MixedPrecisionAdam(model, lr=1e-2)
    for step in range(3):
        model(torch.randn(4, 6, generator=torch.Generator().manual_seed(step)).bfloat16()
              ).float().sum().backward()
        for r, p in zip(ref, model.parameters()):
            r.grad = p.grad.float()
        ref_opt.step()
        opt.step()
        opt.zero_grad()
        for r, m, p in zip(ref, opt.master_params, model.parameters()):
            torch.testing.assert_close(m, r.detach())
            torch.testing.assert_close(p, r.detach().bfloat16())


def test_shared_storage_is_counted_once():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight  # tied weights
    model = torch.nn.ModuleList([emb, head])
    assert memory.count_state_bytes(model)["weights"] == 10 * 4 * 4


def test_fp32_adam_counts():
    model = torch.nn.Linear(10, 10)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 10)).sum().backward()
    opt.step()
    counts = memory.count_state_bytes(model, opt)
    n = 110
    assert (counts["weights"], counts["grads"], counts["master"], counts["optimizer"]) == (
        4 * n, 4 * n, 0, 8 * n)


def test_replicas_each_hold_the_full_state():
    results = launch.run(memory.replica_state_bytes, 2, (16, 32, 8), 0, show_output=False)
    n = results[0]["n_params"]
    assert n == 16 * 32 + 32 + 32 * 8 + 8
    for counts in results:
        assert counts["total"] - counts["other"] == 16 * n
    assert results[0] == results[1]


def test_gib_conversion_is_exact():
    assert memory.to_gib(2**30) == 1.0
    assert math.isclose(memory.to_gib(112e9), 104.3081283569336)


def test_layout_words_for_legends():
    assert memory.layout("mixed_adam16").label == "mixed-precision Adam (16 B/param)"
    assert all(lay.words and "_" not in lay.words for lay in memory.LAYOUTS.values())


@pytest.mark.parametrize("draw", [
    lambda: memory.plot_layouts(n_params=7e9),
    lambda: memory.plot_state_vs_size({"24 GB": 24, "64 GB (lesson)": 64, "80 GB": 80,
                                       "141 GB": 141}, mark_params=7e9),
])
def test_figures_pass_the_course_check(draw):
    """The lecture's figures: no clipped, overlapping or tiny text, legends in words."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course_utils import style

    with matplotlib.rc_context():
        style.use()
        fig = draw()
        fig.canvas.draw()
        try:
            assert style.problems(fig) == []
            legend_texts = [t.get_text() for ax in fig.axes if ax.get_legend()
                            for t in ax.get_legend().get_texts()]
            assert legend_texts and not any("_" in t for t in legend_texts), legend_texts
        finally:
            plt.close(fig)

"""course_utils.playground: the plan() arithmetic, its warnings, the figure and the widget wiring.

Every number the lecture states about the playground is asserted here too.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from course_utils import memory  # noqa: E402
from course_utils.playground import (DEFAULTS, OMITTED, Playground, collectives,  # noqa: E402
                                     figure, plan, summary)

LESSON = dict(model_params_b=70, tp=4, pp=2, dp=4, zero_stage=3, devices=32)
ZERO3_PP = ("ZeRO-3 with PP = 2: each layer is all-gathered in the forward and the backward of "
            "every microbatch (32 times per step). DeepSpeed's pipeline engine refuses ZeRO-2/3; "
            "torchtitan keeps them gathered between microbatches, which needs more than this "
            "estimate.")


def test_lesson_70b_example():
    p = plan(**LESSON)
    assert p.devices_needed == 32 and p.replica_devices == 8
    assert p.params_per_shard == pytest.approx(8.75e9)
    assert p.gb["total"] == pytest.approx(35.0)              # 8.75 x 16 / 4
    assert p.gb["weights"] == pytest.approx(8.75 * 2 / 4)
    assert p.gb["optimizer"] == pytest.approx(8.75 * 12 / 4)
    assert p.fits and p.warnings == [ZERO3_PP]                # the only warning: ZeRO-3 x PP
    # the two likely mistakes give other numbers
    assert 70 / 32 * 16 / 4 == pytest.approx(8.75)           # DP counted in the shard
    assert 8.75 * 16 / 32 == pytest.approx(4.375)            # ZeRO-3 over all 32 devices
    text = summary(p)
    assert "= 35.00 GB of 80 GB -> fits" in text and "4 x 2 x 4 = 32 (8 per model replica)" in text


def test_zero_stages_match_the_lesson_table():
    """7B, D = 8: replicated 112, ZeRO-1 38.5, ZeRO-2 26.25, ZeRO-3 14 GB per rank."""
    p = plan(model_params_b=7, tp=1, pp=1, dp=8, zero_stage=2)
    got = [p.bytes_by_stage[s]["total"] / memory.GB for s in range(4)]
    assert got == pytest.approx([112, 38.5, 26.25, 14])
    assert p.gb["total"] == pytest.approx(26.25)
    assert p.bytes == memory.zero_state_bytes(7e9, 8, 2)


def test_bubble_and_effective_batch():
    assert plan(pp=4, microbatches=8, accumulation_steps=8).bubble == pytest.approx(3 / 11)
    assert plan(pp=4, microbatches=32, accumulation_steps=32).bubble == pytest.approx(3 / 35)
    assert plan(pp=1).bubble == 0
    p = plan(microbatch_size=2, accumulation_steps=16, dp=4, microbatches=16)
    assert p.effective_batch == 128
    assert plan(tp=8, pp=4, dp=4, microbatch_size=2, accumulation_steps=16,
                microbatches=16).effective_batch == 128  # TP and PP do not change it


def test_defaults_are_the_lesson_plan():
    p = plan(**{k: v for k, v in DEFAULTS.items()})
    assert p.gb["total"] == pytest.approx(35.0) and p.bubble == pytest.approx(1 / 17)
    assert p.effective_batch == 128 and p.warnings == [ZERO3_PP]


@pytest.mark.parametrize("change, needle", [
    (dict(device_memory_gb=30), "Does not fit: 35.00 GB"),
    (dict(device_memory_gb=38), "under 10% headroom"),
    (dict(devices_per_node=2), "A TP group crosses a node boundary: 8 of 8"),
    (dict(axis_order=("tp", "pp", "dp")), "A TP group crosses a node boundary"),
    (dict(dp=8), "TP x PP x DP = 4 x 2 x 8 = 64, but 32 devices"),
    (dict(pp=3, num_layers=80), "PP = 3 does not divide the model's 80 layers"),
    (dict(tp=3, num_heads=64), "TP = 3 does not divide the model's 64 attention heads"),
    (dict(microbatches=8), "8 microbatches vs 16 accumulation steps"),
    (dict(pp=4, microbatches=2, accumulation_steps=2), "Fewer microbatches (2) than stages (4)"),
])
def test_each_warning(change, needle):
    p = plan(**{**LESSON, "microbatches": 16, "accumulation_steps": 16, **change})
    assert sum(needle in w for w in p.warnings) == 1, p.warnings


@pytest.mark.parametrize("change, times", [
    (dict(), 32), (dict(microbatches=4, accumulation_steps=4), 8), (dict(pp=4, num_layers=80), 32)])
def test_zero3_with_pipeline_warns_about_gathers_per_microbatch(change, times):
    """ZeRO-3 gathers each layer for every microbatch's forward and backward when PP > 1."""
    p = plan(**{**LESSON, **change})
    found = [w for w in p.warnings if w.startswith("ZeRO-3 with PP")]
    assert len(found) == 1 and f"({times} times per step)" in found[0]
    assert "DeepSpeed's pipeline engine refuses ZeRO-2/3" in found[0]
    assert "torchtitan keeps them gathered between microbatches" in found[0]
    assert f"{times} all-gathers of every layer per step" in p.collectives["dp"]


@pytest.mark.parametrize("change", [
    dict(zero_stage=2), dict(zero_stage=1), dict(zero_stage=0, device_memory_gb=200),
    dict(pp=1, tp=8, devices=32),                      # ZeRO-3 without PP: gathered per step
    dict(model_params_b=1, dp=1, devices=8),           # ZeRO-3 over one DP rank shards nothing
])
def test_no_zero3_pipeline_warning_otherwise(change):
    p = plan(**{**LESSON, **change})
    assert not any(w.startswith("ZeRO-3 with PP") for w in p.warnings), p.warnings
    assert "all-gathers of every layer per step" not in p.collectives["dp"]


def test_no_false_warnings():
    assert plan(**{**LESSON, "zero_stage": 1}, num_layers=80, num_heads=64).warnings == []
    assert plan(tp=8, pp=1, dp=1, devices_per_node=8).crossing["tp"] == []
    assert plan(model_params_b=1, tp=1, pp=1, dp=1, microbatches=1,
                accumulation_steps=3).warnings == []


def test_collectives_name_each_axis():
    c = collectives(4, 2, 4, 3)
    assert c["dp"].endswith("reduce-scatter of its gradients, over 4 ranks")  # one microbatch
    assert "in each of the 16 microbatches: 32 all-gathers" in collectives(
        4, 2, 4, 3, microbatches=16)["dp"]
    assert "all-reduce of activations" in c["tp"]
    assert "send/recv" in c["pp"]
    assert "all-gather" in c["dp"] and "reduce-scatter" in c["dp"]
    assert collectives(4, 2, 4, 0)["dp"].startswith("all-reduce of all gradients")
    assert all(v == "none (degree 1)" for v in collectives(1, 1, 1, 2).values())


def test_omitted_lists_the_lessons_five_gaps():
    words = ["sequence length", "activation checkpointing", "layer balance", "collective time",
             "peak allocations"]
    assert len(OMITTED) == 5 and all(w in o for w, o in zip(words, OMITTED))
    assert plan().omitted == OMITTED


@pytest.mark.parametrize("kwargs, name", [
    (dict(model_params_b=0), "model_params_b"),
    (dict(model_params_b="70"), "model_params_b"),
    (dict(layout="fp8"), "layout"),
    (dict(tp=0), "tp"), (dict(pp=1.5), "pp"), (dict(dp=True), "dp"),
    (dict(zero_stage=4), "zero_stage"),
    (dict(microbatches=0), "microbatches"), (dict(microbatch_size=-1), "microbatch_size"),
    (dict(accumulation_steps=0), "accumulation_steps"),
    (dict(device_memory_gb=0), "device_memory_gb"),
    (dict(device_memory_gb=float("nan")), "device_memory_gb"),
    (dict(devices_per_node=0), "devices_per_node"), (dict(devices=0), "devices"),
    (dict(num_layers=0), "num_layers"), (dict(num_heads=0), "num_heads"),
    (dict(axis_order=("dp", "tp")), "axis_order"),
])
def test_bad_input_raises_value_error_naming_it(kwargs, name):
    with pytest.raises(ValueError, match=name):
        plan(**kwargs)


def test_figure_has_bars_and_three_grids():
    import matplotlib.pyplot as plt

    fig = figure(plan(**LESSON))
    axes = fig.get_axes()
    assert len(axes) == 4
    assert len(axes[0].patches) == 4 * 3                     # 4 stages x 3 stacked parts
    assert all(len(ax.patches) == 32 for ax in axes[1:])      # one square per device
    plt.close(fig)
    big = figure(plan(tp=8, pp=8, dp=64))                     # 4096 devices: not drawn
    assert "too many to draw" in big.get_axes()[1].texts[0].get_text()
    plt.close(big)


def test_widget_wires_controls_to_plan():
    pg = Playground(draw=False)
    assert set(pg.controls) == set(DEFAULTS) - {"axis_order"}
    assert pg.plan.gb["total"] == pytest.approx(35.0)
    assert '<b class="pg-total">35.00</b>' in pg.summary.value
    pg.controls["zero_stage"].value = 1
    assert pg.plan == plan(**{**DEFAULTS, "zero_stage": 1})
    assert '<b class="pg-total">61.25</b>' in pg.summary.value
    pg.controls["dp"].value = 2
    assert "Does not fit" in pg.summary.value and "pg-warning" in pg.summary.value
    pg.controls["layout"].value = "fp32_sgd"
    assert pg.plan.gb["total"] == pytest.approx(8.75 * 8)
    with pytest.raises(ValueError, match="unknown playground inputs"):
        Playground(tensor_parallel=4)


def test_widget_redraws_on_each_change(monkeypatch):
    """Outside a kernel the Output widget captures nothing; count the figures drawn instead."""
    import course_utils.playground as pg_mod

    drawn = []
    real = pg_mod.figure
    monkeypatch.setattr(pg_mod, "figure", lambda p: drawn.append(p) or real(p))
    pg = Playground(tp=2, pp=1, dp=2, devices=4)
    pg.controls["tp"].value = 1
    assert [p.inputs["tp"] for p in drawn] == [2, 1]


def _figure_problems(fig) -> list[str]:
    """The course figure check (``course_utils.style``) on a drawn figure."""
    from course_utils import style

    fig.canvas.draw()
    return style.problems(fig, fig.canvas.get_renderer())


@pytest.mark.parametrize("kwargs", [
    LESSON,
    dict(model_params_b=70, tp=8, pp=3, dp=2, zero_stage=1, devices_per_node=4),  # the lecture's
    dict(tp=8, pp=1, dp=8, devices_per_node=16, devices=64),     # too narrow for numbers
    dict(tp=2, pp=4, dp=8, devices_per_node=1, devices=64),      # one device per node
    dict(tp=1, pp=1, dp=1, devices=1),
    dict(tp=8, pp=8, dp=64),                                     # too many to draw
])
def test_figure_passes_the_course_check_and_uses_the_course_colours(kwargs):
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from course_utils import style

    with matplotlib.rc_context():
        style.use()
        p = plan(**kwargs)
        fig = figure(p)
        assert _figure_problems(fig) == []
        bars = fig.get_axes()[0]
        chosen = [patch for patch in bars.patches
                  if patch.get_y() < p.inputs["zero_stage"] < patch.get_y() + 1]
        assert [to_hex(patch.get_facecolor()) for patch in chosen] == [
            style.STATE_COLORS[part] for part in ("weights", "grads", "optimizer")]
        assert [t.get_text() for t in bars.get_legend().get_texts()][:3] == [
            "weights", "gradients", "optimizer state"]
        if p.devices_needed <= 256:
            for ax, axis in zip(fig.get_axes()[1:], ("tp", "pp", "dp")):
                shades = {to_hex(patch.get_facecolor()) for patch in ax.patches}
                assert style.AXIS_COLORS[axis] in shades or len(shades) == 1
        plt.close(fig)


def test_summary_is_a_short_table():
    text = summary(plan(**LESSON))
    assert len(text.splitlines()) == 6 and text.splitlines()[-1] == f"{'WARNING':18s}{ZERO3_PP}"
    text = summary(plan(**{**LESSON, "zero_stage": 1}))
    assert len(text.splitlines()) == 6 and text.splitlines()[-1].split() == ["warnings", "none"]
    bad = summary(plan(**LESSON, devices_per_node=2))
    assert "WARNING" in bad and "crosses a node boundary" in bad


def test_torch_pipeline_stage_keeps_fsdp_parameters_gathered_between_microbatches():
    """Lecture 6's claim about the installed torch (2.13): a pipeline stage that wraps an FSDP
    module turns off the reshard after each microbatch's backward and reshards (and reduces the
    gradients) once, after all microbatches."""
    import inspect

    import torch
    from torch.distributed.pipelining import stage

    assert torch.__version__.startswith("2.13")
    backward = inspect.getsource(stage._PipelineStageBase.backward_maybe_with_nosync)
    assert "FSDPModule" in backward and "set_reshard_after_backward(False)" in backward
    assert "set_reshard_after_backward(True)" in inspect.getsource(stage)

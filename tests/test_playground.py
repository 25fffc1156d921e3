"""course_utils.mesh.playground: the plan() arithmetic, its warnings, the figure and the widget wiring.

Every number the lecture states about the playground is asserted here too.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from course_utils.memory import sizing as memory  # noqa: E402
from course_utils.mesh.playground import (DEFAULTS, OMITTED, Playground, collectives,  # noqa: E402
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
    """The widget's defaults: the lesson's plan, with its activations at 4096 tokens and no
    recomputation (they do not fit: 40 layers x 2 microbatches x 56 s b h, see below)."""
    p = plan(**{k: v for k, v in DEFAULTS.items()})
    assert p.gb["total"] == pytest.approx(35.0) and p.bubble == pytest.approx(1 / 17)
    assert p.effective_batch == 128
    assert p.peak_gb["peak"] == pytest.approx(336.08521072)
    assert p.warnings == [PEAK_DEFAULTS, ZERO3_PP]


# ------------------------------------------------------------------ activations and the peak
# Korthikanti et al. (2022), Table 2, bytes per layer of a GPT layer in 16-bit with dropout:
#   none:      s b h (10 + 24/t + 5 a s / (h t))     with SP: s b h (34 + 5 a s / h) / t
#   selective: s b h (10 + 24/t)                     with SP: s b h 34 / t
#   full:      2 s b h
# The first 1F1B stage holds ceil(L / P) layers with min(P, m) microbatches in flight.

SEVENTY_B = dict(num_layers=80, num_heads=64, hidden=8192, seq_len=4096)
SBH = 4096 * 2 * 8192                                   # s b h at the lesson's microbatch size 2
PEAK_DEFAULTS = ("Peak does not fit: 35.00 GB persistent + 300.65 activations + 0.44 gathered "
                 "layer = 336.09 GB > 80 GB device. Recomputation, sequence parallelism or a "
                 "smaller microbatch shrink the activations.")


def test_activations_no_recompute_by_hand():
    """Lesson plan, TP = 4, PP = 2, m = 16: 40 layers x 2 in flight = 80 layer-microbatches."""
    p = plan(**LESSON, **SEVENTY_B)
    per_layer = SBH * (10 + 24 / 4 + 5 * 64 * 4096 / (8192 * 4))       # 56 s b h
    assert 10 + 24 / 4 + 5 * 64 * 4096 / (8192 * 4) == 56
    assert p.layer_microbatches == 40 * 2
    assert p.activation_bytes == pytest.approx(80 * per_layer)          # 300.65 GB
    assert p.activation_bytes == pytest.approx(300_647_710_720)
    gathered = 70e9 / (80 * 4) * 2                  # one layer of the TP shard, bf16 weights
    assert p.gathered_bytes == pytest.approx(gathered) == pytest.approx(437.5e6)
    assert p.peak_bytes == pytest.approx(35e9 + 300_647_710_720 + 437.5e6)
    assert p.fits and not p.peak_fits                # the state fits, the peak does not
    assert p.warnings == [PEAK_DEFAULTS, ZERO3_PP]


def test_activations_selective_with_and_without_sp_by_hand():
    sel = plan(**LESSON, **SEVENTY_B, recompute="selective")
    assert sel.activation_bytes == pytest.approx(80 * SBH * (10 + 24 / 4))   # 85.90 GB
    sp = plan(**LESSON, **SEVENTY_B, recompute="selective", sp=True)
    assert sp.activation_bytes == pytest.approx(80 * SBH * 34 / 4)           # 45.63 GB
    assert sp.peak_gb["peak"] == pytest.approx(35 + 45.63402752 + 0.4375)  # 81.07: just over
    assert not sp.peak_fits and "= 81.07 GB > 80 GB" in sp.warnings[0]
    one = plan(**{**LESSON, "microbatch_size": 1}, **SEVENTY_B, recompute="selective", sp=True)
    assert one.activation_bytes == pytest.approx(sp.activation_bytes / 2)  # linear in b
    assert one.peak_fits and one.warnings == [ZERO3_PP]
    # without recomputation SP also splits the quadratic term: (34 + 5 a s / h) / t
    none_sp = plan(**LESSON, **SEVENTY_B, sp=True)
    assert none_sp.activation_bytes == pytest.approx(80 * SBH * (34 + 5 * 64 * 4096 / 8192) / 4)


def test_activations_full_recompute_and_pipeline_stages_by_hand():
    full = plan(**LESSON, **SEVENTY_B, recompute="full")
    assert full.activation_bytes == pytest.approx(80 * 2 * SBH)               # 10.74 GB
    assert full.peak_gb["peak"] == pytest.approx(35 + 10.73741824 + 0.4375)   # 46.17 GB
    # PP = 4, DP = 2 (still 32 devices): 20 layers x 4 microbatches in flight = 80 again
    p4 = plan(**{**LESSON, "pp": 4, "dp": 2}, **SEVENTY_B, recompute="full")
    assert p4.layer_microbatches == 20 * 4 and p4.activation_bytes == full.activation_bytes
    # PP = 3: the first stage holds ceil(80 / 3) = 27 layers, 3 microbatches in flight
    p3 = plan(**{**LESSON, "pp": 3}, **SEVENTY_B, recompute="full")
    assert p3.layer_microbatches == 27 * 3 and p3.activation_bytes == pytest.approx(81 * 2 * SBH)
    # fewer microbatches than stages: only m = 2 are ever in flight
    m2 = plan(**{**LESSON, "pp": 4, "microbatches": 2, "accumulation_steps": 2}, **SEVENTY_B,
              recompute="full")
    assert m2.layer_microbatches == 20 * 2
    # no PP: one microbatch at a time, all 80 layers; TP = 8, ZeRO-3 over DP = 4
    flat = plan(**{**LESSON, "tp": 8, "pp": 1}, **SEVENTY_B, recompute="selective")
    assert flat.activation_bytes == pytest.approx(80 * SBH * (10 + 24 / 8))  # 69.79 GB
    assert flat.gathered_bytes == pytest.approx(70e9 / (80 * 8) * 2)          # 218.75 MB


def test_the_gathered_layer_is_zero3_with_dp_only():
    assert plan(**{**LESSON, "zero_stage": 1}, **SEVENTY_B).gathered_bytes == 0
    assert plan(**{**LESSON, "zero_stage": 2}, **SEVENTY_B).gathered_bytes == 0
    assert plan(**{**LESSON, "dp": 1, "devices": 8}, **SEVENTY_B).gathered_bytes == 0  # no shard
    fp32 = plan(**{**LESSON, "layout": "fp32_adam"}, **SEVENTY_B)     # 4-byte weights
    assert fp32.gathered_bytes == pytest.approx(70e9 / (80 * 4) * 4)


def test_korthikanti_matches_lecture_9_for_the_7b_model():
    """7B, h = 4096, a = 32, 32 layers, s = 4096, b = 1, no TP/PP: about 104 GB (lecture 9)."""
    p = plan(model_params_b=7, tp=1, pp=1, dp=8, microbatch_size=1, num_layers=32, num_heads=32,
             hidden=4096, seq_len=4096)
    assert p.activation_bytes == pytest.approx(32 * 4096 * 1 * 4096 * (34 + 5 * 32 * 4096 / 4096))
    assert round(p.activation_bytes / 1e9) == 104


def test_old_arguments_give_the_old_plan():
    """Without seq_len nothing new is computed, and seq_len changes none of the old numbers."""
    old = plan(**LESSON, num_layers=80, num_heads=64)
    assert old.activation_bytes is None and old.peak_bytes is None and old.peak_gb is None
    assert old.peak_fits is None and old.warnings == [ZERO3_PP]
    new = plan(**LESSON, **SEVENTY_B)
    for name in ("devices_needed", "replica_devices", "params_per_shard", "bytes",
                 "bytes_by_stage", "budget_bytes", "fits", "bubble", "effective_batch",
                 "crossing", "collectives"):
        assert getattr(new, name) == getattr(old, name), name
    # the persistent headroom warning is the old one without seq_len, the peak's with it
    tight = dict(**LESSON, device_memory_gb=38)
    assert any("activations and buffers will not fit" in w for w in plan(**tight).warnings)
    assert any(w.startswith("Peak does not fit") for w in plan(**tight, **SEVENTY_B).warnings)


@pytest.mark.parametrize("memory_gb, needle", [
    (40, "Peak does not fit: 35.00 GB persistent + 10.74 activations + 0.44 gathered layer"),
    (50, "Peak within 10% of the device (46.17 of 50 GB)"),
    (30, "Does not fit: 35.00 GB of persistent state"),       # then no second memory warning
])
def test_peak_warnings(memory_gb, needle):
    p = plan(**{**LESSON, "device_memory_gb": memory_gb}, **SEVENTY_B, recompute="full")
    memory_warnings = [w for w in p.warnings if not w.startswith("ZeRO-3 with PP")]
    assert len(memory_warnings) == 1 and memory_warnings[0].startswith(needle), p.warnings
    assert plan(**{**LESSON, "device_memory_gb": 60}, **SEVENTY_B,
                recompute="full").warnings == [ZERO3_PP]


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


def test_omitted_lists_what_is_still_left_out():
    """Activations and recomputation are modelled now; three gaps remain."""
    words = ["layer balance", "collective time", "peak allocations beyond one gathered layer"]
    assert len(OMITTED) == 3 and all(w in o for w, o in zip(words, OMITTED))
    assert not any("sequence length" in o or "checkpointing" in o for o in OMITTED)
    assert "fragmentation" in OMITTED[2] and "outside the transformer layers" in OMITTED[0]
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
    (dict(**SEVENTY_B, recompute="attention"), "recompute"),       # the plan's word: selective
    (dict(**SEVENTY_B, sp=1), "sp"),
    (dict(recompute="full"), "recompute"), (dict(sp=True), "sp"),   # act only with seq_len
    (dict(hidden=8192), "hidden"),
    (dict(**{**SEVENTY_B, "seq_len": 0}), "seq_len"),
    (dict(**{**SEVENTY_B, "seq_len": 4096.0}), "seq_len"),
    (dict(**{**SEVENTY_B, "hidden": None}), "hidden"),
    (dict(**{**SEVENTY_B, "num_layers": None}), "num_layers"),
    (dict(**{**SEVENTY_B, "num_heads": None}), "num_heads"),
    (dict(**{**SEVENTY_B, "hidden": 8200}), "hidden"),              # not a multiple of 64 heads
    (dict(**SEVENTY_B, sp=True, tp=1), "sp"),                      # SP splits over TP ranks
    (dict(**{**SEVENTY_B, "seq_len": 4098}, sp=True, tp=4), "seq_len"),  # 4098 % 4 != 0
])
def test_bad_input_raises_value_error_naming_it(kwargs, name):
    with pytest.raises(ValueError, match=name):
        plan(**kwargs)


def test_sequence_length_needs_no_multiple_of_tp_without_sp():
    p = plan(**LESSON, **{**SEVENTY_B, "seq_len": 4098})
    assert p.activation_bytes == pytest.approx(
        80 * 4098 * 2 * 8192 * (10 + 24 / 4 + 5 * 64 * 4098 / (8192 * 4)))


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
    fig = figure(plan(**LESSON, **SEVENTY_B))
    bars = fig.get_axes()[0]
    assert len(bars.patches) == 4 * 3 + 4 + 1      # + activations on each, gathered on ZeRO-3
    assert [t.get_text() for t in bars.texts] == ["440.65 GB", "361.90 GB", "348.77 GB",
                                                  "336.09 GB"]    # each stage's peak
    assert "peak 336.09 GB of 80 GB per device, does not fit" in bars.get_title()
    plt.close(fig)


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
    assert '<b class="pg-activations">300.65</b>' in pg.summary.value
    assert "A teaching model, not a measured peak." in pg.summary.value
    pg.controls["seq_len"].value = 2048          # s b h halves and so does a s / h: 18 s b h
    assert pg.plan.activation_bytes == pytest.approx(80 * SBH / 2 * (10 + 6 + 20))
    pg.controls["recompute"].value = "full"
    assert pg.plan.activation_bytes == pytest.approx(80 * 2 * SBH / 2)
    pg.controls["recompute"].value = "selective"
    pg.controls["sp"].value = True
    assert pg.plan.activation_bytes == pytest.approx(80 * SBH / 2 * 34 / 4)
    assert pg.plan == plan(**pg.values())
    pg.controls["tp"].value = 1                   # SP needs TP > 1: the error names it
    assert pg.plan is None and "sp=True needs tp &gt; 1" in pg.summary.value
    with pytest.raises(ValueError, match="unknown playground inputs"):
        Playground(tensor_parallel=4)


def test_widget_redraws_on_each_change(monkeypatch):
    """Outside a kernel the Output widget captures nothing; count the figures drawn instead."""
    import course_utils.mesh.playground as pg_mod

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
    {**LESSON, **SEVENTY_B},                                     # with activations
    {**LESSON, **SEVENTY_B, "recompute": "full", "zero_stage": 1},
    {**DEFAULTS, "tp": 8, "pp": 3, "dp": 2, "zero_stage": 1, "devices_per_node": 4},
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
        parts = ["weights", "grads", "optimizer"]
        words = ["weights", "gradients", "optimizer state"]
        if p.peak_bytes is not None:
            parts += ["activations"] + (["buffers"] if p.gathered_bytes else [])
            words += ["activations", "gathered layer\n(ZeRO-3)"]
        assert [to_hex(patch.get_facecolor()) for patch in chosen] == [
            style.STATE_COLORS[part] for part in parts]
        assert [t.get_text() for t in bars.get_legend().get_texts()][:-1] == words
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
    lines = summary(plan(**LESSON, **SEVENTY_B, recompute="full")).splitlines()
    assert len(lines) == 8
    assert lines[3] == (f"{'activations':18s}s=4096, b=2, recompute full: 40 layers x 2 in "
                        "flight (1F1B) = 10.74 GB")
    assert lines[4] == (f"{'peak per device':18s}35.00 + 10.74 + gathered layer 0.44 = 46.17 GB "
                        "of 80 GB -> fits")


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


def test_the_lectures_widget_starts_from_a_peak_that_does_not_fit():
    """Lecture 6's playground: the broken plan, at 4096 tokens without recomputation. The first
    stage holds ceil(80 / 3) = 27 layers x 3 microbatches; TP = 8: 10 + 3 + 5 a s / (8 h) = 33."""
    pg = Playground(tp=8, pp=3, dp=2, zero_stage=1, devices_per_node=4, draw=False)
    assert pg.plan.activation_bytes == pytest.approx(81 * SBH * 33)
    assert f"{pg.plan.peak_gb['peak']:.2f}" == "208.55" and not pg.plan.peak_fits


def test_one_view_holds_the_table_and_the_figure_of_one_plan():
    """Every change writes the table and the figure together, from one plan: the figure's
    ``data-plan`` names the inputs the table shows; an invalid combination shows a message in
    the widget and the last valid figure greyed, never a bare error."""
    import json
    import re

    pg = Playground()
    pg.controls["recompute"].value = "selective"
    pg.controls["tp"].value = 8
    drawn = json.loads(re.search(r'data-plan="([^"]+)"', pg.summary.value).group(1)
                       .replace("&quot;", '"'))
    assert drawn["recompute"] == "selective" and drawn["tp"] == 8
    assert drawn == json.loads(json.dumps(pg.values(), sort_keys=True, default=str))
    assert pg.summary.value.count("<img") == 1 and 'class="pg-total"' in pg.summary.value
    pg.controls["sp"].value = True
    pg.controls["tp"].value = 7                      # 4096 tokens do not split over 7 ranks
    assert pg.plan is None
    assert "Not a plan that can run" in pg.summary.value and "multiple of tp=7" in pg.summary.value
    assert "pg-stale" in pg.summary.value and pg.summary.value.count("<img") == 1
    assert 'class="pg-total"' not in pg.summary.value  # no numbers of a plan that is not
    pg.controls["tp"].value = 8
    assert pg.plan is not None and "pg-stale" not in pg.summary.value

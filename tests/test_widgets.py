"""The lectures' widgets (course_utils.widgets): each shows what its tested function computes, one
state drives its numbers and its figure, a setting that does not work becomes a message, and
its figures pass the course's figure check.

The sharding widget (JAX) is tested in ``tests/test_widgets_sharding.py``, the recorded ring in
``tests/test_ring_trace.py``, the browser side in ``tests/test_browser_widgets.py``.
"""

from __future__ import annotations

import base64
import html
import json
import re
import struct
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from course_utils import style  # noqa: E402
from course_utils.memory import activations  # noqa: E402
from course_utils.memory import sizing as memory  # noqa: E402
from course_utils.pipeline import schedule as ps  # noqa: E402
from course_utils.memory import precision  # noqa: E402
from course_utils.collectives import ring as ring_allreduce  # noqa: E402
from course_utils.collectives import ring_trace  # noqa: E402
from course_utils import tensor_parallel as tp  # noqa: E402
from course_utils.zero import sizes as zero  # noqa: E402
from course_utils.pipeline import zero_bubble as zb  # noqa: E402
from course_utils.widgets import (activation_memory, number_formats,  # noqa: E402
                                  pipeline_timeline, ring_steps, tp_layout, training_state,
                                  zero_shards)
from course_utils.widgets import base  # noqa: E402
from course_utils.widgets import step_time  # noqa: E402
from course_utils.step_time import hardware as step_hardware  # noqa: E402
from course_utils.step_time import published as step_published  # noqa: E402
from course_utils.step_time import terms as step_terms  # noqa: E402
from course_utils.step_time import transformer as step_transformer  # noqa: E402
from course_utils.widgets.base import Explorer  # noqa: E402


@pytest.fixture(autouse=True)
def _course_style():
    with matplotlib.rc_context():
        style.use()
        yield


def shown(w: Explorer) -> dict[str, str]:
    """The numbers the widget's HTML view shows, by their class (``<prefix>-<key>``)."""
    cells = re.findall(rf'<td class="{w.prefix}-([\w-]+)"[^>]*>(.*?)</td>', w.view.value)
    return {key: html.unescape(value) for key, value in cells}


def drawn(w: Explorer) -> dict:
    """The inputs the view's figure was drawn from (its ``data-state``)."""
    m = re.search(r'data-state="([^"]*)"', w.view.value)
    return json.loads(html.unescape(m.group(1)))


def no_problems(w: Explorer) -> None:
    """The course's figure check passes, and no text reaches past the figure's edges (the
    check looks inside axes; a widget draws much of its text in figure space)."""
    fig = w.figure(w.state)
    assert style.problems(fig) == [], f"{type(w).__name__} {w.values()}: {style.problems(fig)}"
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    for text in style._visible_texts(fig):
        ext = text.get_window_extent(renderer)
        assert (ext.x0 >= box.x0 - 1 and ext.x1 <= box.x1 + 1 and ext.y0 >= box.y0 - 1
                and ext.y1 <= box.y1 + 1), f"{type(w).__name__}: {text.get_text()!r} is cut"


# ------------------------------------------------------------------------------ the base


def test_one_state_drives_numbers_figure_and_text():
    w = training_state.TrainingState()
    w.controls["params_b"].value = 70.0
    assert shown(w)["gb"] == "1120.00 GB" and drawn(w)["params_b"] == 70.0
    assert "state in GB (10^9 B)   1120.00 GB" in w.text()
    bundle = w._repr_mimebundle_()
    assert bundle["text/plain"] == w.text()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert base64.b64decode(bundle["image/png"]) == w._png and w._png[:4] == b"\x89PNG"
    # until the cell runs, JupyterLab shows the HTML: the picture under a line saying so
    assert base.PICTURE_HINT in bundle["text/html"] and "run this cell" in base.PICTURE_HINT
    assert f'src="data:image/png;base64,{bundle["image/png"]}"' in bundle["text/html"]
    assert w.redraw_s > 0


def test_an_invalid_setting_is_a_message_not_a_traceback():
    w = training_state.TrainingState()
    figure = w._figure
    w.controls["params_b"].value = -7.0
    assert w.state is None
    assert 'class="ts-error"' in w.view.value and "n_params must be non-negative" in w.view.value
    assert 'ts-figure ts-stale' in w.view.value and "<table" not in w.view.value
    assert w.text().endswith("Not a setting that works: n_params must be non-negative; got "
                             "-7000000000.0.")
    assert w._repr_mimebundle_()["text/plain"] == w.text()
    w.controls["params_b"].value = 7.0
    assert w.state is not None and w._figure == figure and "ts-error" not in w.view.value


def test_constructor_arguments_are_checked():
    with pytest.raises(ValueError, match=r"unknown TrainingState inputs \['params'\]; allowed"):
        training_state.TrainingState(params=7)
    with pytest.raises(ValueError, match="ranks must be from 1 to 64; got 100"):
        zero_shards.ZeroShards(ranks=100)
    with pytest.raises(ValueError, match="layout='fp64' is not one of the control's choices"):
        training_state.TrainingState(layout="fp64")


# ----------------------------------------------------------------- module 1: training state


@pytest.mark.parametrize("params_b", [7.0, 0.35, 30.0, 1000.0])
@pytest.mark.parametrize("layout", list(memory.LAYOUTS))
def test_training_state_is_memorys(params_b, layout):
    w = training_state.TrainingState(params_b=params_b, layout=layout)
    total = memory.state_bytes(params_b * 1e9, layout)
    got = shown(w)
    assert got["gb"] == memory.format_bytes(total, "GB")
    assert got["gib"] == memory.format_bytes(total, "GiB")
    fits = [k for k, gb in training_state.BUDGETS_GB.items() if memory.fits(total, gb)]
    assert got["fits"] == (", ".join(fits) if fits else "none of 24 GB, 64 GB, 80 GB, 141 GB")
    assert got["per-param"].startswith(f"{memory.layout(layout).total} B (")


def test_training_state_lecture_numbers_and_figure():
    w = training_state.TrainingState()
    assert shown(w) == {"params": "7 billion", "per-param": "16 B (2 + 2 + 4 + 8)",
                        "gb": "112.00 GB", "gib": "104.31 GiB", "fits": "141 GB"}
    for layout in memory.LAYOUTS:
        w.controls["layout"].value = layout
        no_problems(w)
    w.controls["params_b"].value = 1000.0
    no_problems(w)


# ---------------------------------------------------------------- module 2: the ring stepper


def test_ring_stepper_replays_the_recording():
    w = ring_steps.RingSteps(collective="all_reduce", ranks=4)
    t = ring_trace.trace("all_reduce", 4)
    assert w.controls["step"].max == len(t.steps) == 6
    for k in range(len(t.steps) + 1):
        w.controls["step"].value = k
        assert w.state["holds"] == t.holds(k)
        assert shown(w)["sent"] == f"{t.sent_so_far(k)[0]:,} B"
    assert t.sent_so_far(6) == [ring_allreduce.ring_bytes_per_rank(840, 4)] * 4  # 5,040 B
    assert shown(w)["formula"].startswith("5,040 B per rank")
    assert "Done: every rank holds the sum of every shard." in w.text()
    no_problems(w)


def test_ring_stepper_step_range_follows_the_collective_and_d():
    w = ring_steps.RingSteps(collective="all_reduce", ranks=8, step=14)
    assert w.controls["step"].value == 14
    w.controls["collective"].value = "reduce_scatter"  # 7 steps: the step comes down to 7
    assert (w.controls["step"].max, w.controls["step"].value) == (7, 7)
    assert shown(w)["step"] == "7 of 7 (reduce-scatter)"
    w.controls["ranks"].value = 2
    assert (w.controls["step"].max, w.controls["step"].value) == (1, 1)
    for name in ring_trace.COLLECTIVES:
        w.controls["collective"].value = name
        w.controls["ranks"].value = 5
        w.controls["step"].value = 2
        assert w.state["holds"] == ring_trace.trace(name, 5).holds(2)
        no_problems(w)


# ------------------------------------------------------------------------ module 3: ZeRO


@pytest.mark.parametrize("stage", memory.ZERO_STAGES)
@pytest.mark.parametrize("ranks", [1, 3, 8, 64])
def test_zero_view_is_the_lectures_formulas(stage, ranks):
    w = zero_shards.ZeroShards(params_b=7.0, ranks=ranks, stage=stage)
    b = memory.zero_state_bytes(7e9, dp=ranks, stage=stage)
    sent = zero.expected_comm_bytes([7_000_000_000], dp=ranks, stage=stage)
    got = shown(w)
    assert got["total"] == f"{b['total'] / 1e9:.2f} GB"
    assert got["sent"] == f"{sent['total'] / 1e9:.2f} GB (ring, bf16)"
    for part in ("weights", "grads", "optimizer"):  # the figure's sharded strips
        sharded = zero_shards._is_sharded(part, stage)
        full = memory.zero_state_bytes(7e9, dp=1, stage=stage)[part]
        assert b[part] == pytest.approx(full / ranks if sharded else full)


def test_zero_view_lecture_numbers_and_messages():
    w = zero_shards.ZeroShards()  # 7B, D = 8, ZeRO-2: lecture 3's check-yourself answer
    assert shown(w)["total"] == "26.25 GB" and shown(w)["sharded"] == "gradients, optimizer"
    no_problems(w)
    w.controls["stage"].value = 3
    w.controls["ranks"].value = 64
    assert shown(w)["total"] == "1.75 GB"
    no_problems(w)
    w.controls["params_b"].value = 0.0
    assert "params_b must be a positive number of billions; got 0.0" in w.view.value


# ---------------------------------------------------------------- module 4: TP layouts


@pytest.mark.parametrize("layer", tp.PLAN_KINDS)
def test_tp_view_is_layer_plan(layer):
    w = tp_layout.TPLayout(layer=layer, tp=4)
    sizes = dict(b=1, s=4096, h=4096, ffn=16384, n_heads=32)
    p = tp_layout._plan(layer, 4, sizes, "bf16")
    assert w.state == p
    got = shown(w)
    assert got["forward"] == tp_layout._comm(p.comms, "forward")
    if layer in ("mlp", "attention"):  # the lecture's tp_comm_bytes
        counted = tp.tp_comm_bytes(1, 4096, 4096, 4, "bf16", layer=layer)
        assert p.ring_bytes_sent_per_rank == counted["ring_bytes_sent_per_rank"]
        assert got["forward"] == got["backward"] == "1 all-reduce of (1, 4096, 4096) = 32.00 MiB"
    no_problems(w)


def test_tp_view_messages():
    w = tp_layout.TPLayout(layer="attention", tp=8)
    w.controls["tp"].value = 3
    assert "n_heads = 32 must be divisible by tp_size = 3" in w.view.value
    w.controls["layer"].value = "mlp"
    assert "ffn = 16384 (the split dimension) must be divisible by tp_size = 3" in w.view.value
    w.controls["tp"].value = 1
    assert shown(w)["forward"] == "none" and "t = 1" in w.text()


# ---------------------------------------------------------------- module 5: pipelines


@pytest.mark.parametrize("schedule,p,m,v", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1),
                                            ("interleaved", 4, 8, 2), ("1f1b", 8, 32, 1)])
def test_pipeline_view_is_the_simulator(schedule, p, m, v):
    w = pipeline_timeline.PipelineTimeline(schedule=schedule, stages=p, microbatches=m,
                                           chunks=v)
    tl = ps.simulate(schedule, p=p, m=m, v=v)
    got = shown(w)
    assert got["bubble"] == f"{tl.idle_fraction():.1%}"
    formula = (ps.interleaved_bubble_fraction(p=p, m=m, v=v) if schedule == "interleaved"
               else ps.bubble_fraction(p, m))
    assert got["formula"] == f"{formula:.1%}" == got["bubble"] == got["nosync"]  # balanced
    assert got["in-flight"] == ", ".join(f"{x:g}" for x in tl.peak_activations()) + \
        " microbatches"
    no_problems(w)


@pytest.mark.parametrize("schedule", ["zb-h1", "zbv", "dualpipev"])
def test_pipeline_view_draws_the_zero_bubble_schedules(schedule):
    """The split schedules at the papers' F = I = W: the simulated bubble beside Qi et al.'s
    and DeepSeek's formulas, with and without the optimizer's global check."""
    w = pipeline_timeline.PipelineTimeline(schedule=schedule, stages=4, microbatches=8,
                                           op_times="1:1:1")
    tl = ps.simulate(schedule, p=4, m=8, backward_ratio=2.0)
    got = shown(w)
    assert got["bubble"] == f"{tl.idle_fraction():.1%}"
    assert got["nosync"] == f"{tl.idle_fraction(sync=False):.1%}"
    assert got["formula"] == f"{zb.paper_bubble_fraction(schedule, 4, 8, 1, 1, 1):.1%}"
    assert w.controls["chunks"].value == (2 if schedule in zb.V_SCHEDULES else 1)
    assert w.controls["chunks"].disabled == (schedule in zb.V_SCHEDULES)
    no_problems(w)
    kinds = {o.kind for o in tl.ops}
    assert kinds == ({"F", "I", "W", "B"} if schedule == "dualpipev" else {"F", "I", "W"})
    w.controls["op_times"].value = "1:1.5:0.5"  # ZBV: no formula but for F = I = W
    assert (shown(w)["formula"] == "none for these times") == (schedule == "zbv")
    if schedule != "dualpipev":   # ZB-H1's formula holds from m = P = 4, ZBV's from 2P - 1 = 7
        w.controls["op_times"].value = "1:1:1"
        w.controls["microbatches"].value = 6
        assert (shown(w)["formula"] == "holds for m >= 7 only") == (schedule == "zbv")
    w.controls["schedule"].value = "1f1b"  # leaving a V: one chunk again, no message
    assert w.state is not None and w.controls["chunks"].value == 1


def test_pipeline_view_numbers_are_rounded_and_labels_fit():
    """Issue 36: '65.3333 units' and '5, 4.33333, 3.66667' were printed raw, and a checkbox's
    words were cut by its 140 px label."""
    w = pipeline_timeline.PipelineTimeline(schedule="interleaved", stages=8, microbatches=16,
                                           chunks=3)
    tl = ps.simulate("interleaved", 8, 16, v=3)
    assert tl.makespan == pytest.approx(36 + 2 / 3)
    assert shown(w)["makespan"] == "36.67 units (one forward = 1)"
    assert shown(w)["in-flight"] == ("10.33, 9.67, 9, 8.33, 7.67, 7, 6.33, 5.67 microbatches")
    assert "36.67 units" in w.text()
    assert pipeline_timeline.number(5.0) == "5" and pipeline_timeline.number(4.5) == "4.5"
    for control in w.controls.values():  # no checkbox whose words the label's 140 px cut
        assert type(control).__name__ != "Checkbox"


def test_pipeline_view_slow_stage_and_messages():
    w = pipeline_timeline.PipelineTimeline()
    w.controls["slow_stage"].value = 2
    tl = ps.simulate("1f1b", p=4, m=8, stage_times=[1, 1, 2, 1])
    assert shown(w)["bubble"] == f"{tl.idle_fraction():.1%}" == "44.4%"
    assert shown(w)["formula"] == "27.3% (balanced ranks only)"
    no_problems(w)
    # only the ranks that exist are offered (issue 36: ranks 4-7 at P = 4)
    assert [v for _, v in w.controls["slow_stage"].options] == [-1, 0, 1, 2, 3]
    w.controls["stages"].value = 2  # the slow rank is gone: balanced again
    assert [v for _, v in w.controls["slow_stage"].options] == [-1, 0, 1]
    assert w.controls["slow_stage"].value == -1 and w.state["balanced"]
    w.controls["stages"].value = 8
    assert [v for _, v in w.controls["slow_stage"].options] == [-1] + list(range(8))
    with pytest.raises(ValueError, match="slow_stage must be a rank from 0 to 3"):
        w.compute("1f1b", 4, 8, 1, 5, 2.0, "1:1:1")
    w.controls["stages"].value = 2
    w.controls["chunks"].value = 2
    assert "v (chunks per rank) must be 1 for schedule &#x27;1f1b&#x27;" in w.view.value
    w.controls["schedule"].value = "interleaved"
    w.controls["microbatches"].value = 7
    assert "m must be a multiple of p for the interleaved schedule" in w.view.value
    w.controls["schedule"].value = "dualpipev"
    w.controls["microbatches"].value = 3
    assert "m must be at least 2p = 4" in w.view.value


# ------------------------------------------------------------ module 9: number formats


@pytest.mark.parametrize("x", [1.0, 0.02, 3.0, 1e-3, 250.0, 1e-30])
def test_bf16_gap_is_the_lectures(x):
    assert precision.represent(x, "bf16")["gap"] == precision.bf16_gap(x)


def test_formats_at_one_and_their_bits():
    for fmt, dtype in precision.FORMATS.items():
        r = precision.represent(1.0, fmt)
        assert r["gap"] == torch.finfo(dtype).eps and r["stored"] == 1.0
        assert len(r["sign"] + r["exponent"] + r["fraction"]) == 8 * dtype.itemsize
    f32 = precision.represent(0.1, "fp32")
    bits = format(struct.unpack(">I", struct.pack(">f", 0.1))[0], "032b")
    assert f32["sign"] + f32["exponent"] + f32["fraction"] == bits
    assert precision.represent(1e6, "fp16")["stored"] == float("inf")
    assert precision.represent(1e6, "fp8 e4m3")["stored"] == 448.0  # torch saturates e4m3
    assert precision.represent(448.0, "fp8 e4m3")["gap"] is None
    assert precision.represent(1e6, "bf16")["overflow"] is False


def test_an_update_is_lost_as_repeated_update_loses_it():
    assert precision.update_lost(1.0, 1e-3, "bf16")["lost"]        # the lecture's example
    assert precision.repeated_update(1.0, 1e-3, 1)["bf16 only"] == 1.0
    assert not precision.update_lost(1.0, 1e-3, "fp32")["lost"]
    for x in (1.0, 0.02, 7.5):  # round to nearest: lost below half the gap, kept above it
        half = precision.represent(x, "bf16")["gap"] / 2
        assert precision.update_lost(x, 0.9 * half, "bf16")["lost"]
        assert not precision.update_lost(x, 1.1 * half, "bf16")["lost"]
    with pytest.raises(ValueError, match="update must be a finite number; got inf"):
        precision.update_lost(1.0, float("inf"))


def test_number_format_view():
    w = number_formats.NumberFormats(value=1.0)
    got = shown(w)
    assert got["bf16"] == "stores 1, gap 0.0078125; w + u lost"
    assert got["fp32"] == "stores 1, gap 1.19209e-07; w + u -> 1.001"
    no_problems(w)
    w.controls["value"].value = 0.02
    assert not shown(w)["bf16"].endswith("lost")  # half of 2^-13 is under 1e-3
    w.controls["update"].value = 1e-5
    assert shown(w)["bf16"].endswith("lost") and not shown(w)["fp32"].endswith("lost")
    w.controls["value"].value = 1e6
    assert shown(w)["fp16"] == "stores inf: w is past its largest number, 65504"
    assert shown(w)["fp8-e4m3"] == "stores 448: w is past its largest number, 448"
    no_problems(w)


# ------------------------------------------------------- module 9: activation calculator


def test_activation_view_is_korthikanti():
    w = activation_memory.ActivationMemory()
    seven_b = dict(s=4096, b=1, h=4096, a=32, layers=32)
    assert shown(w)["activations"] == "18.27 GB"  # lecture 9, fused attention
    assert w.state["bytes"] == activations.korthikanti_bytes(**seven_b, attention="fused")
    w.controls["attention"].value = "math"
    w.controls["tp"].value = 8
    w.controls["recompute"].value = "attention"
    assert shown(w)["activations"] == "6.98 GB"   # lecture 9: tp = 8, selective
    w.controls["sp"].value = True
    assert shown(w)["activations"] == "2.28 GB"   # ... and with SP
    assert w.state["bytes"] == activations.korthikanti_bytes(**seven_b, recompute="attention",
                                                             tp=8, sp=True)
    no_problems(w)
    w.controls["tp"].value = 1
    assert "sp=True needs tp &gt; 1" in w.view.value
    w.controls["sp"].value = False
    w.controls["tp"].value = 3
    assert "tp must divide the 32 attention heads of the 7B model" in w.view.value


def test_every_lecture_widget_output_carries_its_picture_with_the_hint():
    """The committed lectures' widget outputs (built before issue 36, they had the PNG alone:
    JupyterLab showed it with no word on how to get the controls)."""
    import nbformat

    root = Path(__file__).resolve().parent.parent
    found = 0
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            for out in cell.get("outputs", []):
                data = out.get("data", {})
                if "image/png" in data and "application/vnd.jupyter.widget-view+json" in data:
                    found += 1
                    assert base.PICTURE_HINT in data.get("text/html", ""), path.name
    assert found >= 8  # (one per widget of course_utils.widgets)


# ------------------------------------------------------------ module 13: a step's time


def _seconds_shown(value: str) -> float:
    """The seconds a row shows ("3.41 s (57.5%)" -> 3.41)."""
    return float(value.split(" s")[0])


@pytest.mark.parametrize("values,model,hw", [
    ({}, step_published.LLAMA3_405B, step_hardware.H100),
    (dict(model="70B", hardware="A100", tp=4, pp=4, dp=8, global_batch=256, seq_len=4096,
          schedule="interleaved v=2", efficiency=0.5, recompute="full"),
     step_published.LLAMA3_70B, step_hardware.A100),
    (dict(model="8B", tp=1, pp=1, dp=8, global_batch=64, schedule="zbv"),
     step_published.LLAMA3_8B, step_hardware.H100),
    (dict(model="70B", tp=8, pp=8, dp=32, global_batch=1024, seq_len=16384, schedule="zbv",
          efficiency=0.65), step_published.LLAMA3_70B, step_hardware.H100),
    (dict(model="405B", pp=4, dp=32, global_batch=512, schedule="1f1b", efficiency=1.0),
     step_published.LLAMA3_405B, step_hardware.H100)])
def test_step_time_view_is_predict(values, model, hw):
    w = step_time.StepTime(**values)
    v = {**step_time.StepTime.defaults, **values}
    if "hardware" in values and "efficiency" not in values:
        v["efficiency"] = hw.efficiency  # a new device brings its preset
    schedule, chunks = {"1f1b": ("1f1b", 1), "interleaved v=2": ("interleaved", 2),
                        "interleaved v=4": ("interleaved", 4), "zbv": ("zbv", 1)}[v["schedule"]]
    job = step_transformer.Job(model, tp=v["tp"], pp=v["pp"], dp=v["dp"],
                               global_batch=v["global_batch"], seq=v["seq_len"],
                               schedule=schedule, v=chunks, recompute=v["recompute"])
    p = step_transformer.predict(job, hw.but(efficiency=v["efficiency"]))
    peak = step_transformer.predict(job, hw.but(efficiency=1.0))
    assert w.state["plan"].terms == p.terms and w.state["peak"].terms == peak.terms
    got = shown(w)
    for t in step_terms.TERMS:
        assert _seconds_shown(got[t]) == pytest.approx(getattr(p.terms, t), rel=5e-3, abs=1e-6)
        assert got[t].split(" (")[1].startswith(f"{getattr(p.terms, t) / p.step_s:.1%})")
    assert _seconds_shown(got["step"]) == pytest.approx(p.step_s, rel=5e-3)
    assert got["mesh"] == f"{job.gpus:,}, m = {job.m}"
    assert float(got["tokens"].replace(",", "")) == pytest.approx(p.tokens_per_s_per_gpu(),
                                                                   abs=0.5)
    assert got["mfu"] == f"{p.mfu('attention'):.1%}" and got["mfu-6n"] == f"{p.mfu('6N'):.1%}"
    assert _seconds_shown(got["peak"]) == pytest.approx(peak.step_s, rel=5e-3)
    assert got["peak"].endswith(f"MFU {peak.mfu('attention'):.1%}")
    # the figure's alt text says what it shows, with the numbers shown above it
    assert f"{got['step'].split(' (')[0]} (compute " in w.alt
    assert html.escape(w.alt, quote=True) in w.view.value
    assert w._repr_mimebundle_()["text/plain"] == w.text()
    no_problems(w)


def test_step_time_default_is_llama3s_published_plan():
    """The lecture's setting is Llama 3 405B on 16,384 H100 (Table 4, row 2) at the H100's
    measured matmul rate: published.rows' prediction of that run."""
    run = step_published.RUNS[1]
    w = step_time.StepTime()
    assert w.state["job"] == run.job and w.controls["efficiency"].value == run.hw.efficiency
    assert w.state["plan"].terms == step_transformer.predict(run.job, run.hw).terms
    assert w.text().count("\n") <= 14


def test_step_time_peak_bar_and_efficiency():
    w = step_time.StepTime(model="70B", pp=4, dp=32, global_batch=512)
    plan, peak = w.state["plan"].terms, w.state["peak"].terms
    # compute scales as 1 / efficiency, less the matmuls on the memory side of the roofline
    # (TP 8's thin K and V projections); the collectives stay as they are
    slower = plan.compute / peak.compute
    assert 1.15 < slower <= 1 / step_hardware.H100.efficiency + 1e-9
    assert plan.tp == peak.tp and plan.total > peak.total
    assert "at the peak (efficiency 1)" in w.alt and "this plan (efficiency 0.80)" in w.alt
    w.controls["efficiency"].value = 0.4
    assert slower < w.state["plan"].terms.compute / peak.compute <= 2.5 + 1e-9
    assert w.state["peak"].terms == peak
    w.controls["efficiency"].value = 1.0
    assert w.state["plan"].terms == w.state["peak"].terms
    assert "At efficiency 1 both bars" in w.text()
    # another device brings its own preset; a value given beside it is kept
    w.controls["hardware"].value = "A100"
    assert w.controls["efficiency"].value == step_hardware.A100.efficiency
    assert w.state["plan"].terms == step_transformer.predict(
        w.state["job"], step_hardware.A100).terms
    assert step_time.StepTime(hardware="A100", efficiency=0.5).values()["efficiency"] == 0.5
    with pytest.raises(ValueError, match="efficiency must be from 0.3 to 1.0; got 0.2"):
        step_time.StepTime(efficiency=0.2)


def test_step_time_messages():
    w = step_time.StepTime()
    w.controls["global_batch"].value = 64   # 64 sequences over dp = 128 replicas
    with pytest.raises(ValueError) as job_error:
        step_transformer.Job(step_published.LLAMA3_405B, tp=8, pp=16, dp=128, global_batch=64,
                             seq=8192, schedule="interleaved", v=4)
    assert w.state is None and 'class="st-error"' in w.view.value
    assert html.escape(str(job_error.value).rstrip(".")) in w.view.value
    assert w.text().endswith(f"Not a setting that works: {str(job_error.value).rstrip('.')}.")
    w.controls["global_batch"].value = 1024  # m = 8 microbatches: interleaving needs m % pp = 0
    with pytest.raises(ValueError) as schedule_error:
        ps.simulate("interleaved", 16, 8, v=4)
    assert html.escape(str(schedule_error.value), quote=True) in w.view.value
    w.controls["schedule"].value = "1f1b"
    assert w.state is not None and w.state["job"].m == 8
    # the schedule is played op by op: a cap on its ops keeps a redraw quick
    w.controls["dp"].value = 64              # 16 x 2 x 16 = 512 forwards and as many backwards
    w.controls["schedule"].value = "interleaved v=2"
    assert w.state is not None and w.state["job"].m == 16
    w.controls["schedule"].value = "zbv"     # each backward two ops: 1,536
    assert w.state is not None
    w.controls["dp"].value = 32              # m = 32: 3,072 ops; interleaved v = 2: 2,048
    assert w.state is None and "makes 3,072: raise dp or lower the global batch" in w.view.value
    assert f"at most {step_time.MAX_PIPELINE_OPS:,} ops" in w.view.value
    w.controls["schedule"].value = "interleaved v=2"
    assert w.state is not None and w.state["job"].m == 32
    w.controls["dp"].value = 4               # 16 x 2 x 256 forwards: 16,384 ops
    assert w.state is None and "makes 16,384" in w.view.value
    w.controls["pp"].value = 1               # no schedule to play: any m
    assert w.state is not None and w.state["job"].m == 256
    assert "With one pipeline stage there is no bubble" in w.text()
    assert w.state["plan"].terms.bubble == pytest.approx(0, abs=1e-9)  # the sum's rounding
    assert shown(w)["bubble"] == "0 s (0.0%)"

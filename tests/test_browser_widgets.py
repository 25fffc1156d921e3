"""The lectures' widgets (course_utils.widgets) in a real JupyterLab (Chromium + Playwright).

One JupyterLab and one notebook for the whole file: its first cell imports the widgets, then
each widget's cell is the lecture's own (read from the committed lecture notebook), and Run All
runs them once. Each test then works one widget as a student would: it checks that the
widget's plain-text output, the one nbval compares, is the committed one; that the page shows
the numbers of the lecture's setting; then it moves every control (dropdowns, sliders with the
keyboard, text boxes, checkboxes) and after each move waits until the page shows what a twin
of the widget, built and moved the same way in this process from the same tested function,
shows: the same numbers, a figure drawn from the same inputs (its ``data-state``) and redrawn
(a new image) when the picture changes. A few moves are checked against the functions'
numbers directly; a setting that does not work must show its message, never a traceback.
Screenshots: ``test-artifacts/widget-<name>.png``, each widget after its moves.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import nbformat
import pytest
from jupyterlab_harness import (ARTIFACTS, LabServer, error_outputs, lab_browser,  # noqa: F401
                                open_notebook, require_chromium, run_all)

from course_utils.widgets import sharding  # noqa: I001  (first: JAX with 8 CPU devices)
from course_utils.memory import sizing as memory
from course_utils.pipeline import schedule as ps
from course_utils.collectives import ring as ring_allreduce
from course_utils.zero import sizes as zero
from course_utils.widgets import (activation_memory, number_formats, pipeline_timeline,
                                  ring_steps, step_time, tp_layout, training_state, zero_shards)

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
CLASSES = {"TrainingState": ("01_training_state", training_state.TrainingState),
           "RingSteps": ("02_data_parallel", ring_steps.RingSteps),
           "ZeroShards": ("03_zero_fsdp", zero_shards.ZeroShards),
           "TPLayout": ("04_tensor_parallel", tp_layout.TPLayout),
           "PipelineTimeline": ("05_pipeline_parallel", pipeline_timeline.PipelineTimeline),
           "Sharding": ("08_jax_sharding", sharding.Sharding),
           "ActivationMemory": ("09_activations", activation_memory.ActivationMemory),
           "NumberFormats": ("09_activations", number_formats.NumberFormats),
           "StepTime": ("13_time_at_scale", step_time.StepTime)}
SETUP = ("from course_utils.widgets.sharding import Sharding  # first: JAX with 8 CPU devices\n"
         "from course_utils import style\n"
         + "".join(f"from {cls.__module__} import {name}\n" for name, (_, cls) in CLASSES.items()
                   if name != "Sharding") + "style.use()")


def lecture_cell(name: str) -> tuple[str, str]:
    """The lecture's cell that shows widget ``name``: its source and its committed plain text."""
    lecture, _ = CLASSES[name]
    nb = nbformat.read(ROOT / "notebooks" / f"{lecture}.ipynb", as_version=4)
    [cell] = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(f"{name}(")]
    [out] = [o for o in cell.outputs if "text/plain" in o.get("data", {})]
    return cell.source, out.data["text/plain"]


_SERVER: list[LabServer] = []  # the module's JupyterLab, for tests that open another notebook


@pytest.fixture(scope="module")
def lab(lab_browser):  # noqa: F811
    """One JupyterLab, one page, the notebook of every widget run once; fails the module if a
    kernel survives the server's shutdown."""
    require_chromium()
    server = LabServer(windowing=False)   # ten widgets: more than a page shows
    with server:
        _SERVER[:] = [server]
        nb = server.add_notebook("widgets.ipynb", [SETUP] + [lecture_cell(n)[0] for n in CLASSES])
        context = lab_browser.new_context(viewport={"width": 1400, "height": 1300})
        page = context.new_page()
        try:
            open_notebook(page, server, nb)
            page.keyboard.press("Control+b")  # hide the file browser: room for the widgets
            run_all(page, timeout_s=300)
            assert error_outputs(page) == []
            yield page
        finally:
            context.close()
    assert not server.survivors, f"processes survived the server's shutdown: {server.survivors}"
    assert server.returncode == 0, f"jupyter lab exited with {server.returncode}"


# ---------------------------------------------------------------------------- reading the page

READ = """p => {
    const view = document.querySelector(`.${p}-view`);
    if (!view) return null;
    const numbers = {};
    for (const td of view.querySelectorAll('td')) numbers[td.className] = td.textContent;
    const img = view.querySelector(`.${p}-figure img`);
    const error = view.querySelector(`.${p}-error`);
    return {numbers, error: error ? error.textContent : null,
            stale: !!view.querySelector(`.${p}-stale`),
            state: img ? img.getAttribute('data-state') : null,
            src: img ? img.getAttribute('src') : null,
            ready: img ? img.complete && img.naturalWidth > 0 : false};
}"""


def expected(twin) -> dict:
    """What the page must show: the twin's numbers, or its message."""
    if twin.state is None:
        return {"numbers": {}, "error": twin._message}
    return {"numbers": {f"{twin.prefix}-{r.key}": r.value for r in twin.rows(twin.state)},
            "error": None}


def wait_for(page, twin, timeout_s: float = 60) -> dict:
    """Poll until the page shows the twin's numbers (or message) and a figure drawn from its
    inputs; fail with what differs."""
    want = expected(twin)
    inputs = json.loads(json.dumps(twin.values(), sort_keys=True, default=str))
    deadline = time.monotonic() + timeout_s
    got = None
    while time.monotonic() < deadline:
        got = page.evaluate(READ, twin.prefix)
        if got and got["ready"]:
            numbers_ok = got["numbers"] == want["numbers"]
            error_ok = (got["error"] is None if want["error"] is None
                        else want["error"] in (got["error"] or "") and got["stale"])
            drawn = json.loads(got["state"]) if got["state"] else None
            if numbers_ok and error_ok and (twin.state is None or drawn == inputs):
                return got
        time.sleep(0.25)
    raise AssertionError(f"{type(twin).__name__} on the page: {got}; expected {want} drawn "
                         f"from {inputs}")


# ---------------------------------------------------------------------------- moving controls


def _press(page, selector: str, key: str) -> None:
    """One key press on a slider, waiting until the slider shows a new value (a press landing
    while the kernel redraws was once lost in the playground's test)."""
    handle = page.locator(selector)
    before = handle.get_attribute("aria-valuenow")
    handle.focus()
    handle.press(key)
    page.wait_for_function(
        "([sel, v]) => document.querySelector(sel).getAttribute('aria-valuenow') !== v",
        arg=[selector, before], timeout=15_000)


def move(page, twin, name: str, value) -> dict:
    """Set control ``name`` as a student would, the twin's the same way; wait until the page
    shows the twin's state, and check the figure was redrawn if the twin's picture changed.
    ``value="End"`` sends a slider to its end with one key press."""
    control, prefix = twin.controls[name], twin.prefix
    where = f".{prefix}-in-{name}"
    before, old_png = page.evaluate(READ, prefix), twin._png
    kind = type(control).__name__
    if value == "End":
        _press(page, f"{where} [role=slider]", "End")
        value = control.max
    elif kind == "Dropdown":
        label = dict(zip(control._options_values, control._options_labels))[value]
        page.locator(f"{where} select").select_option(label=label)
    elif kind in ("IntSlider", "SelectionSlider"):  # one press a step, the twin stepping
        slider = f"{where} [role=slider]"  # with it (the kernel redraws at every step)
        steps = list(control.options) if kind == "SelectionSlider" else None
        while control.value != value:
            up = (steps.index(value) > steps.index(control.value) if steps
                  else value > control.value)
            _press(page, slider, "ArrowRight" if up else "ArrowLeft")
            old_png = twin._png
            if steps:
                control.value = steps[steps.index(control.value) + (1 if up else -1)]
            else:
                control.value += 1 if up else -1
    elif kind in ("FloatText", "IntText"):
        box = page.locator(f"{where} input")
        box.fill(str(value))
        box.press("Enter")
    elif kind == "Checkbox":
        page.locator(f"{where} input[type=checkbox]").set_checked(value)
    else:
        raise AssertionError(f"no way to move a {kind}")
    twin.controls[name].value = value
    got = wait_for(page, twin)
    if twin.state is not None and twin._png != old_png:
        assert got["src"] != before["src"], f"{name}={value!r}: the figure was not redrawn"
    return got


def start(page, name: str):
    """The twin of widget ``name`` at the lecture's setting, after checking the committed
    plain text (nbval's) and the page."""
    source, committed = lecture_cell(name)
    twin = eval(source, {n: cls for n, (_, cls) in CLASSES.items()})  # the lecture's call
    assert twin.text() == committed, f"{name}: the lecture's output is not the widget's"
    page.locator(f".{twin.prefix}-widget").scroll_into_view_if_needed()
    wait_for(page, twin)
    return twin


def shot(page, twin, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"widget-{name}.png"
    widget = page.locator(f".{twin.prefix}-widget")
    widget.scroll_into_view_if_needed()
    page.locator(f".{twin.prefix}-figure img").evaluate("i => i.decode()")
    widget.screenshot(path=str(path))
    assert path.stat().st_size > 10_000
    return path


# ------------------------------------------------------------------------------- the widgets


def test_training_state(lab):
    twin = start(lab, "TrainingState")
    assert expected(twin)["numbers"]["ts-gb"] == "112.00 GB"
    move(lab, twin, "layout", "bf16_adam_no_master")  # 12 B/param
    assert twin.state["gb"] == memory.format_bytes(
        memory.state_bytes(7e9, "bf16_adam_no_master")) == "84.00 GB"
    move(lab, twin, "params_b", 30.0)
    assert expected(twin)["numbers"]["ts-gib"] == memory.format_bytes(30e9 * 12, "GiB")
    move(lab, twin, "params_b", -1.0)                  # a message, not a traceback
    assert "n_params must be non-negative" in expected(twin)["error"]
    move(lab, twin, "params_b", 5.0)
    move(lab, twin, "layout", "mixed_adam16")
    assert expected(twin)["numbers"]["ts-fits"] == "80 GB, 141 GB"
    shot(lab, twin, "training_state")


def test_ring_steps(lab):
    twin = start(lab, "RingSteps")
    for step in (1, 3):
        move(lab, twin, "step", step)
    move(lab, twin, "step", "End")                      # done: the ring's bytes
    assert twin.state["sent"] == [ring_allreduce.ring_bytes_per_rank(840, 4)] * 4
    move(lab, twin, "ranks", 8)
    move(lab, twin, "step", 14)  # (End, after D changed the range, was not heard here)
    move(lab, twin, "collective", "reduce_scatter")     # the step comes down to its 7
    assert twin.controls["step"].value == 7 and lab.locator(
        ".rs-in-step [role=slider]").get_attribute("aria-valuenow") in ("7", "7.0")
    move(lab, twin, "collective", "all_to_all")
    move(lab, twin, "step", 3)
    shot(lab, twin, "ring_steps")


def test_zero_shards(lab):
    twin = start(lab, "ZeroShards")
    move(lab, twin, "ranks", 16)
    assert twin.state["bytes"] == memory.zero_state_bytes(7e9, dp=16, stage=2)
    move(lab, twin, "stage", 3)
    assert twin.state["sent"] == zero.expected_comm_bytes([7_000_000_000], dp=16, stage=3)
    move(lab, twin, "params_b", 0.0)
    assert "params_b must be a positive number" in expected(twin)["error"]
    move(lab, twin, "params_b", 70.0)
    shot(lab, twin, "zero_shards")


def test_tp_layout(lab):
    twin = start(lab, "TPLayout")
    move(lab, twin, "ffn", 32768)                       # the bytes do not change
    move(lab, twin, "layer", "column")
    assert expected(twin)["numbers"]["tl-forward"].startswith("1 all-gather of (1, 4096, 32768)")
    move(lab, twin, "tp", 3)                            # 32768 does not split over 3
    assert "must be divisible by tp_size = 3" in expected(twin)["error"]
    move(lab, twin, "tp", 4)
    move(lab, twin, "layer", "attention")
    move(lab, twin, "dtype", "fp32")
    move(lab, twin, "s", 2048)
    shot(lab, twin, "tp_layout")


CUT = """p => {
    // words a control shows that do not fit: a label wider than its box, or a dropdown option
    // wider than the select (each option measured in the select's font, less its arrow)
    const widget = document.querySelector(`.${p}-widget`);
    const cut = [];
    for (const el of widget.querySelectorAll('.widget-label, .widget-label-basic')) {
        if (el.offsetParent && el.scrollWidth > el.clientWidth + 1) cut.push(el.textContent);
    }
    const ctx = document.createElement('canvas').getContext('2d');
    for (const select of widget.querySelectorAll('select')) {
        const style = getComputedStyle(select);
        ctx.font = `${style.fontSize} ${style.fontFamily}`;
        const room = select.clientWidth - parseFloat(style.paddingLeft)
                     - parseFloat(style.paddingRight) - 16;
        for (const option of select.options) {
            if (ctx.measureText(option.text).width > room) cut.push(option.text);
        }
    }
    return cut;
}"""


PLANT = """([p, words]) => {
    // a label and a dropdown too narrow for their words, as the old checkbox's was
    const widget = document.querySelector(`.${p}-widget`);
    const box = document.createElement('div');
    box.id = 'planted';
    box.innerHTML = `<label class="widget-label" style="display:inline-block;width:140px;
        overflow:hidden;white-space:nowrap;text-overflow:ellipsis">${words}</label>
        <select style="width:120px"><option>${words}</option></select>`;
    widget.appendChild(box);
}"""


def test_pipeline_timeline(lab):
    twin = start(lab, "PipelineTimeline")
    lab.evaluate(PLANT, [twin.prefix, "backward = 2 x forward, I = W"])  # the check sees a cut
    assert lab.evaluate(CUT, twin.prefix) == ["backward = 2 x forward, I = W"] * 2
    lab.evaluate("() => document.getElementById('planted').remove()")
    assert lab.evaluate(CUT, twin.prefix) == []  # issue 36: "backward = 2 x for..." was cut
    move(lab, twin, "microbatches", 16)
    assert twin.state["timeline"].idle_fraction() == pytest.approx(ps.bubble_fraction(4, 16))
    ranks = ("(sel) => [...document.querySelector(sel).options]"
             ".map(o => o.text.replace(/\\u00a0/g, ' '))")
    where = f".{twin.prefix}-in-slow_stage select"
    assert lab.evaluate(ranks, where)[-1] == "rank 3"  # issue 36: ranks 4-7 offered at P = 4
    move(lab, twin, "slow_stage", 2)
    move(lab, twin, "op_times", "1:1:1")
    move(lab, twin, "chunks", 2)                        # 1F1B has no chunks: a message
    assert "v (chunks per rank) must be 1" in expected(twin)["error"]
    move(lab, twin, "schedule", "interleaved")
    move(lab, twin, "slow_stage", -1)
    move(lab, twin, "stages", 2)
    assert lab.evaluate(ranks, where) == ["none (balanced)", "rank 0", "rank 1"]
    move(lab, twin, "slowdown", 3.0)
    move(lab, twin, "schedule", "dualpipev")            # two chunks in a V, the slider fixed
    assert twin.state["timeline"].v == 2 and twin.controls["chunks"].disabled
    move(lab, twin, "op_times", "1:0.5:1.5")
    assert lab.evaluate(CUT, twin.prefix) == []
    move(lab, twin, "schedule", "zb-h1")                # out of the V: one chunk, no message
    assert twin.state is not None and twin.controls["chunks"].value == 1
    shot(lab, twin, "pipeline_timeline")


def test_sharding(lab):
    twin = start(lab, "Sharding")
    assert [c.op for c in twin.state["collectives"]] == ["all-reduce"]
    move(lab, twin, "y", "P('model', None)")
    move(lab, twin, "mesh", "2 x 4")
    move(lab, twin, "x", "P('data', None)")
    move(lab, twin, "w", "P(None, 'model')")
    move(lab, twin, "y", sharding.AUTO)
    assert twin.state["collectives"] == []              # data x model: nothing to send
    shot(lab, twin, "sharding")


def test_activation_memory(lab):
    twin = start(lab, "ActivationMemory")
    assert expected(twin)["numbers"]["am-activations"] == "18.27 GB"
    move(lab, twin, "seq_len", 8192)
    move(lab, twin, "attention", "math")
    move(lab, twin, "tp", 8)
    move(lab, twin, "recompute", "attention")
    move(lab, twin, "seq_len", 4096)
    assert expected(twin)["numbers"]["am-activations"] == "6.98 GB"   # lecture 9's
    move(lab, twin, "sp", True)
    assert expected(twin)["numbers"]["am-activations"] == "2.28 GB"
    move(lab, twin, "tp", 1)                            # SP without TP: a message
    assert "sp=True needs tp > 1" in expected(twin)["error"]
    move(lab, twin, "tp", 4)
    move(lab, twin, "batch", 2)
    move(lab, twin, "model", "13B")
    shot(lab, twin, "activation_memory")


def test_number_formats(lab):
    twin = start(lab, "NumberFormats")
    assert not expected(twin)["numbers"]["nf-bf16"].endswith("lost")
    move(lab, twin, "update", 1e-05)
    assert expected(twin)["numbers"]["nf-bf16"].endswith("lost")
    move(lab, twin, "value", 1000.0)
    assert expected(twin)["numbers"]["nf-fp8-e4m3"].startswith("stores 448: w is past")
    move(lab, twin, "value", 0.02)
    shot(lab, twin, "number_formats")
    assert error_outputs(lab) == []


def test_step_time(lab):
    twin = start(lab, "StepTime")                     # Llama 3 405B on 16,384 H100s
    bubble = twin.state["plan"].terms.bubble
    move(lab, twin, "schedule", "1f1b")               # the same plan without interleaving:
    assert twin.state["plan"].terms.bubble > 1.5 * bubble    # a bigger bubble
    move(lab, twin, "pp", 8)                          # a slider, by arrow keys
    move(lab, twin, "global_batch", 4096)
    move(lab, twin, "efficiency", "End")              # peak for achieved: the two bars agree
    assert twin.state["plan"].step_s == pytest.approx(twin.state["peak"].step_s)
    move(lab, twin, "hardware", "A100")               # a device brings its own efficiency
    assert twin.controls["efficiency"].value == pytest.approx(271.2 / 312, abs=0.005)
    move(lab, twin, "model", "70B")
    move(lab, twin, "global_batch", 16)               # 16 sequences cannot split over DP 128
    assert "global_batch" in expected(twin)["error"]
    move(lab, twin, "global_batch", 1024)
    shot(lab, twin, "step_time")


def test_a_widget_that_has_not_run_says_its_picture_is_one(lab):
    """A widget's saved output, opened before its cell runs (a lecture opened from the
    workspace): its picture under the line that says running the cell gives the controls;
    once the cell runs, the live widget and no such line."""
    from course_utils.widgets.base import PICTURE_HINT

    server, front = _SERVER[0], ".jp-NotebookPanel:not(.lm-mod-hidden)"
    twin = training_state.TrainingState()
    saved = nbformat.v4.new_code_cell(lecture_cell("TrainingState")[0], execution_count=2)
    saved.outputs = [nbformat.v4.new_output("execute_result", twin._repr_mimebundle_(),
                                            execution_count=2)]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from course_utils.widgets.training_state import TrainingState"), saved])
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python",
                                 "name": "python3"}
    nbformat.write(nb, server.root_dir / "saved.ipynb")
    page = lab.context.new_page()
    try:
        open_notebook(page, server, "saved.ipynb")
        output = page.locator(f"{front} .jp-CodeCell").nth(1).locator(".jp-OutputArea")
        output.locator(".ts-picture img").wait_for(timeout=30_000)
        assert PICTURE_HINT in output.inner_text()
        assert page.locator(".ts-widget").count() == 0
        page.screenshot(path=str(ARTIFACTS / "widget-saved-picture.png"))
        run_all(page, timeout_s=120)
        page.locator(".ts-widget").wait_for(timeout=60_000)
        assert PICTURE_HINT not in output.inner_text() and error_outputs(page) == []
    finally:
        page.close()

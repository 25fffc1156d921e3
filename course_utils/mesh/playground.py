"""The device-mesh playground: size a TP x PP x DP plan and see what it costs (lecture 6).

:func:`plan` does all the arithmetic (:mod:`course_utils.mesh.plan_costs`, tested in
``tests/test_playground.py``; its docstring says what the estimate covers and leaves out);
:func:`summary` and :func:`figure` show a plan (:mod:`course_utils.mesh.plan_view`);
:class:`Playground`, here, only wires ipywidgets controls to them. In a notebook::

    from course_utils.mesh.playground import Playground
    Playground(tp=4, pp=2, dp=4).widget      # the last expression of a cell displays it

The names of the former ``course_utils.playground`` (``plan``, ``Plan``, ``collectives``,
``figure``, ``summary``, ``OMITTED``, ``DEFAULTS``, ``RECOMPUTES``, ``TEACHING_NOTE``) are bound
here.
"""

from __future__ import annotations

from typing import Any

from course_utils.memory import sizing as memory
from course_utils.mesh.plan_costs import (  # noqa: F401 - the former playground's names
    DEFAULTS, OMITTED, RECOMPUTES, TEACHING_NOTE, Plan, collectives, plan,
)
from course_utils.mesh.plan_view import figure, plan_html, summary
from course_utils.style import error_html, figure_html, png

__all__ = ["Plan", "plan", "collectives", "figure", "summary", "Playground", "OMITTED",
           "DEFAULTS", "RECOMPUTES", "TEACHING_NOTE"]


def _figure_html(p: Plan, values: dict) -> str:
    """The plan's figure as an ``<img>`` (PNG, inline) whose ``data-plan`` names the inputs it
    was drawn from."""
    import matplotlib.pyplot as plt

    fig = figure(p)
    image = png(fig)
    plt.close(fig)
    return figure_html("pg", image, values, "the plan's memory and device mesh",
                       attribute="data-plan")


class Playground:
    """ipywidgets controls wired to :func:`plan`; ``.widget`` is what a cell displays.

    ``.controls`` maps each input name to its widget, ``.plan`` is the latest :class:`Plan`
    (None while the inputs are invalid), ``.summary`` the one view (HTML: the table and the
    figure, written together by each change; while the inputs are invalid, a message and the
    last figure greyed), ``.redraw_s`` how long the last change took.
    """

    def __init__(self, **values: Any):
        import ipywidgets as w

        unknown = set(values) - set(DEFAULTS) - {"draw"}
        if unknown:
            raise ValueError(f"unknown playground inputs {sorted(unknown)}; "
                             f"allowed: {sorted(DEFAULTS)}")
        self.draw = values.pop("draw", True)
        v = {**DEFAULTS, **values}
        style = {"description_width": "150px"}
        lay = w.Layout(width="auto")

        def slider(desc, value, lo, hi):
            return w.IntSlider(value=value, min=lo, max=max(hi, value), description=desc,
                               style=style, layout=lay, continuous_update=False)

        self.controls = {
            "model_params_b": w.BoundedFloatText(value=v["model_params_b"], min=0.01, max=10000,
                                                 step=1, description="model (B params)",
                                                 style=style, layout=lay),
            "layout": w.Dropdown(options=list(memory.LAYOUTS), value=v["layout"],
                                 description="bytes/param layout", style=style, layout=lay),
            "tp": slider("TP degree", v["tp"], 1, 16),
            "pp": slider("PP degree", v["pp"], 1, 16),
            "dp": slider("DP degree", v["dp"], 1, 64),
            "zero_stage": w.Dropdown(options=[(f"ZeRO-{s}", s) for s in memory.ZERO_STAGES],
                                     value=v["zero_stage"], description="ZeRO stage (over DP)",
                                     style=style, layout=lay),
            "microbatches": slider("microbatches m", v["microbatches"], 1, 64),
            "microbatch_size": slider("microbatch size", v["microbatch_size"], 1, 64),
            "accumulation_steps": slider("accumulation steps", v["accumulation_steps"], 1, 64),
            "device_memory_gb": w.BoundedFloatText(value=v["device_memory_gb"], min=1, max=10000,
                                                   description="device memory (GB)",
                                                   style=style, layout=lay),
            "devices_per_node": slider("devices per node", v["devices_per_node"], 1, 16),
            "devices": w.BoundedIntText(value=v["devices"], min=1, max=100000,
                                        description="devices available", style=style, layout=lay),
            "num_layers": w.BoundedIntText(value=v["num_layers"], min=1, max=10000,
                                           description="model layers", style=style, layout=lay),
            "num_heads": w.BoundedIntText(value=v["num_heads"], min=1, max=10000,
                                          description="attention heads", style=style, layout=lay),
            "hidden": w.BoundedIntText(value=v["hidden"], min=1, max=10**6,
                                       description="hidden size", style=style, layout=lay),
            "seq_len": w.BoundedIntText(value=v["seq_len"], min=1, max=10**7,
                                        description="sequence length", style=style, layout=lay),
            "recompute": w.Dropdown(options=list(RECOMPUTES), value=v["recompute"],
                                    description="recomputation", style=style, layout=lay),
            "sp": w.Checkbox(value=v["sp"], description="sequence parallel",
                             style=style, layout=lay),
        }
        self.axis_order = tuple(v["axis_order"])
        for name, control in self.controls.items():
            control.add_class(f"pg-in-{name}")
            control.observe(self._update, names="value")
        # One view for the table and the figure: every change writes both at once, from one
        # plan, so they can never disagree (two Output widgets could, after quick changes).
        self.summary = w.HTML()
        self.summary.add_class("pg-summary")
        names = list(self.controls)  # three groups: mesh, batch and device, model
        columns = [w.VBox([self.controls[n] for n in names[k:k + 6]]) for k in (0, 6, 12)]
        grid = w.GridBox(columns, layout=w.Layout(
            grid_template_columns="repeat(auto-fit, minmax(300px, 1fr))", grid_gap="0 12px"))
        self.widget = w.VBox([grid, self.summary])
        self.widget.add_class("pg-playground")
        self.plan: Plan | None = None
        self._figure = ""  # the last valid plan's figure (shown greyed while inputs are invalid)
        self.redraw_s = 0.0  # how long the last change took to redraw
        self._update()

    def values(self) -> dict:
        """The current inputs, as :func:`plan` takes them."""
        return {**{n: c.value for n, c in self.controls.items()}, "axis_order": self.axis_order}

    def _update(self, change: Any = None) -> None:
        import time

        start = time.perf_counter()
        values = self.values()
        try:
            self.plan = plan(**values)
        except ValueError as err:
            self.plan = None
            self.summary.value = error_html("pg", str(err), self._figure,
                                            heading="Not a plan that can run")
            self.redraw_s = time.perf_counter() - start
            return
        self._figure = _figure_html(self.plan, values) if self.draw else ""
        self.summary.value = plan_html(self.plan) + self._figure
        self.redraw_s = time.perf_counter() - start

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

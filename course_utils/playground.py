"""The device-mesh playground: size a TP x PP x DP plan and see what it costs.

:func:`plan` does all the arithmetic (tested in ``tests/test_playground.py``); :func:`figure`
draws a plan; :class:`Playground` only wires ipywidgets controls to them. In a notebook::

    from course_utils.playground import Playground
    Playground(tp=4, pp=2, dp=4).widget      # the last expression of a cell displays it

What the estimate covers: persistent training state per device (weights, gradients,
optimizer state) with ideal TP/PP sharding and ZeRO over the DP ranks, the idealized pipeline
bubble, the effective batch, where the groups fall on nodes, and the collectives each axis
needs. What it leaves out is listed in :data:`OMITTED` and shown beside every plan.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from course_utils import memory
from course_utils.mesh import AXES, Mesh
from course_utils.pipeline_schedule import bubble_fraction, effective_batch
from course_utils.validate import check_int as _int

__all__ = ["Plan", "plan", "collectives", "figure", "summary", "Playground", "OMITTED",
           "DEFAULTS"]

OMITTED = (
    "sequence length and activations (saved for backward; often the largest term)",
    "activation checkpointing (trades recomputation for activation memory)",
    "layer balance (embeddings, the output layer and uneven stages)",
    "collective time (bandwidth, latency, overlap with compute)",
    "peak allocations (gathered parameters, communication buffers, workspaces, fragmentation)",
)

DEFAULTS: dict[str, Any] = dict(
    model_params_b=70.0, layout="mixed_adam16", tp=4, pp=2, dp=4, zero_stage=3,
    microbatches=16, microbatch_size=2, accumulation_steps=16, device_memory_gb=80.0,
    devices_per_node=8, devices=32, num_layers=80, num_heads=64, axis_order=AXES)

_PARTS = ("weights", "grads", "optimizer")


@dataclass(frozen=True)
class Plan:
    """Everything the playground shows for one configuration (bytes are per device)."""

    inputs: dict
    mesh: Mesh
    devices_needed: int            # tp x pp x dp
    replica_devices: int           # tp x pp: the devices holding one copy of the model
    params_per_shard: float        # parameters each device's TP/PP shard holds
    bytes: dict                    # {"weights", "grads", "optimizer", "total"} in bytes
    bytes_by_stage: dict           # {stage: {...}} for ZeRO stages 0-3 (same TP/PP split)
    budget_bytes: float
    fits: bool
    bubble: float                  # idle fraction (p-1)/(m+p-1)
    effective_batch: int           # examples per optimizer step
    crossing: dict                 # {axis: [groups that span more than one node]}
    collectives: dict              # {axis: what that axis sends}
    warnings: list = field(default_factory=list)
    omitted: tuple = OMITTED

    @property
    def gb(self) -> dict:
        """Per-device persistent state in GB (10**9 bytes)."""
        return {k: v / memory.GB for k, v in self.bytes.items()}


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or value != value or value == float("inf"):
        raise ValueError(f"{name} must be a positive number; got {value!r}")
    return float(value)


def collectives(tp: int, pp: int, dp: int, zero_stage: int,
                microbatches: int = 1) -> dict[str, str]:
    """What each axis communicates, for these degrees, ZeRO stage and microbatches per step.

    ZeRO-3 gathers a layer's parameters for each forward and each backward that uses them: with
    PP that is every microbatch, ``2 * microbatches`` all-gathers of each layer per step.
    """
    out = {}
    out["tp"] = ("none (degree 1)" if tp == 1 else
                 f"all-reduce of activations inside every layer, forward and backward, over {tp} "
                 "ranks (or all-gather + reduce-scatter with sequence parallelism)")
    out["pp"] = ("none (degree 1)" if pp == 1 else
                 "send/recv of boundary activations forward and of their gradients backward, "
                 f"between neighbouring stages of {pp}, once per microbatch")
    zero3 = ("all-gather of each layer's parameters before its forward and again before its "
             "backward, reduce-scatter of its gradients")
    if pp > 1 and microbatches > 1:
        zero3 = (f"{zero3}, in each of the {microbatches} microbatches: {2 * microbatches} "
                 "all-gathers of every layer per step")
    dp_text = {
        0: "all-reduce of all gradients once per step",
        1: "reduce-scatter of gradients, then all-gather of the updated parameters, once per step",
        2: "reduce-scatter of gradients (during backward), then all-gather of the updated "
           "parameters, once per step",
        3: zero3,
    }[zero_stage]
    out["dp"] = "none (degree 1)" if dp == 1 else f"{dp_text}, over {dp} ranks"
    return out


def plan(model_params_b: float = DEFAULTS["model_params_b"], layout: str = DEFAULTS["layout"],
         tp: int = DEFAULTS["tp"], pp: int = DEFAULTS["pp"], dp: int = DEFAULTS["dp"],
         zero_stage: int = DEFAULTS["zero_stage"], microbatches: int = DEFAULTS["microbatches"],
         microbatch_size: int = DEFAULTS["microbatch_size"],
         accumulation_steps: int = DEFAULTS["accumulation_steps"],
         device_memory_gb: float = DEFAULTS["device_memory_gb"],
         devices_per_node: int = DEFAULTS["devices_per_node"], devices: int | None = None,
         num_layers: int | None = None, num_heads: int | None = None,
         axis_order: tuple[str, ...] = AXES) -> Plan:
    """Size a TP x PP x DP plan: per-device persistent bytes, bubble, batch, groups, warnings.

    ``model_params_b``: parameters in billions; ``layout``: a :data:`course_utils.memory.LAYOUTS`
    name; ``zero_stage`` shards over the DP ranks only; ``device_memory_gb`` in GB (10**9 B);
    ``devices``: GPUs available (default: tp x pp x dp); ``num_layers``/``num_heads``: checked
    against PP/TP when given; ``axis_order``: mesh axes outermost first (last = innermost).
    """
    n_params = _positive("model_params_b", model_params_b) * 1e9
    lay = memory.layout(layout)
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp), ("microbatches", microbatches),
                        ("microbatch_size", microbatch_size),
                        ("accumulation_steps", accumulation_steps),
                        ("devices_per_node", devices_per_node)):
        _int(name, value)
    if zero_stage not in memory.ZERO_STAGES or isinstance(zero_stage, bool):
        raise ValueError(f"zero_stage must be one of {memory.ZERO_STAGES}; got {zero_stage!r}")
    budget = _positive("device_memory_gb", device_memory_gb) * memory.GB
    if devices is not None:
        _int("devices", devices)
    if num_layers is not None:
        _int("num_layers", num_layers)
    if num_heads is not None:
        _int("num_heads", num_heads)
    if sorted(axis_order) != sorted(AXES):
        raise ValueError(f"axis_order must list each of {list(AXES)} once; got {axis_order!r}")

    mesh = Mesh.from_degrees(tuple(axis_order), dp=dp, pp=pp, tp=tp)
    needed = tp * pp * dp
    shard = n_params / (tp * pp)
    by_stage = {s: memory.zero_state_bytes(shard, dp, s, lay) for s in memory.ZERO_STAGES}
    state = by_stage[zero_stage]
    fits = state["total"] <= budget
    crossing = {axis: mesh.groups_crossing_nodes(axis, devices_per_node) for axis in AXES}

    warnings = []
    if not fits:
        warnings.append(f"Does not fit: {state['total'] / memory.GB:.2f} GB of persistent state "
                        f"per device > {device_memory_gb:g} GB device, before any activations.")
    elif state["total"] > 0.9 * budget:
        warnings.append(f"Fits with under 10% headroom ({state['total'] / memory.GB:.2f} of "
                        f"{device_memory_gb:g} GB): activations and buffers will not fit.")
    if crossing["tp"]:
        g = crossing["tp"][0]
        warnings.append(f"A TP group crosses a node boundary: {len(crossing['tp'])} of "
                        f"{len(mesh.groups('tp'))} TP groups span nodes (e.g. ranks {g}); "
                        f"TP talks every layer and wants the fast links inside a node.")
    if devices is not None and needed != devices:
        warnings.append(f"The axes do not multiply to the device count: TP x PP x DP = "
                        f"{tp} x {pp} x {dp} = {needed}, but {devices} devices are available.")
    if num_layers is not None and num_layers % pp:
        warnings.append(f"PP = {pp} does not divide the model's {num_layers} layers: "
                        "stages are unequal and the slowest sets the pace.")
    if num_heads is not None and num_heads % tp:
        warnings.append(f"TP = {tp} does not divide the model's {num_heads} attention heads: "
                        "heads cannot be split evenly.")
    if pp > 1 and microbatches != accumulation_steps:
        warnings.append(f"With PP > 1 a step's microbatches are its accumulation steps "
                        f"({microbatches} microbatches vs {accumulation_steps} accumulation "
                        "steps): the bubble uses the first, the effective batch the second.")
    if pp > 1 and microbatches < pp:
        warnings.append(f"Fewer microbatches ({microbatches}) than stages ({pp}): the pipeline "
                        "never fills.")
    if zero_stage == 3 and pp > 1 and dp > 1:
        warnings.append(f"ZeRO-3 with PP = {pp}: each layer is all-gathered in the forward and "
                        f"the backward of every microbatch ({2 * microbatches} times per step). "
                        "DeepSpeed's pipeline engine refuses ZeRO-2/3; torchtitan keeps them "
                        "gathered between microbatches, which needs more than this estimate.")

    inputs = dict(model_params_b=model_params_b, layout=lay.name, tp=tp, pp=pp, dp=dp,
                  zero_stage=zero_stage, microbatches=microbatches,
                  microbatch_size=microbatch_size, accumulation_steps=accumulation_steps,
                  device_memory_gb=device_memory_gb, devices_per_node=devices_per_node,
                  devices=devices, num_layers=num_layers, num_heads=num_heads,
                  axis_order=tuple(axis_order))
    return Plan(inputs=inputs, mesh=mesh, devices_needed=needed, replica_devices=tp * pp,
                params_per_shard=shard, bytes=state, bytes_by_stage=by_stage,
                budget_bytes=budget, fits=fits, bubble=bubble_fraction(pp, microbatches),
                effective_batch=effective_batch(microbatch_size, accumulation_steps, dp),
                crossing=crossing,
                collectives=collectives(tp, pp, dp, zero_stage, microbatches=microbatches),
                warnings=warnings)


# --------------------------------------------------------------------------------- presenting


def summary(p: Plan) -> str:
    """The plan as a short aligned table (what the notebook prints); the widget adds what each
    axis sends (:data:`Plan.collectives`)."""
    gb = p.gb
    i = p.inputs
    rows = [
        ("devices", f"TP x PP x DP = {i['tp']} x {i['pp']} x {i['dp']} = {p.devices_needed} "
                    f"({p.replica_devices} per model replica)"),
        ("shard", f"{p.params_per_shard / 1e9:.4g} B parameters per TP/PP shard"),
        ("state per device", f"ZeRO-{i['zero_stage']} over DP={i['dp']}: weights "
                             f"{gb['weights']:.2f} + grads {gb['grads']:.2f} + optimizer "
                             f"{gb['optimizer']:.2f} = {gb['total']:.2f} GB of "
                             f"{i['device_memory_gb']:g} GB -> "
                             f"{'fits' if p.fits else 'does NOT fit'}"),
        ("bubble fraction", f"{p.bubble:.4f} (P={i['pp']}, m={i['microbatches']})"),
        ("effective batch", f"{i['microbatch_size']} x {i['accumulation_steps']} x {i['dp']} = "
                            f"{p.effective_batch} examples"),
    ]
    rows += [("WARNING", w) for w in p.warnings] or [("warnings", "none")]
    return "\n".join(f"{name:18s}{text}" for name, text in rows)


def _html(p: Plan) -> str:
    gb = p.gb
    i = p.inputs
    esc = html.escape
    rows = [
        ("devices", "pg-devices", f"{p.devices_needed}",
         f"= {i['tp']} x {i['pp']} x {i['dp']}; {p.replica_devices} per model replica"),
        ("parameters per TP/PP shard", "pg-shard", f"{p.params_per_shard / 1e9:.4g}", "billion"),
        ("weights", "pg-weights", f"{gb['weights']:.2f}", "GB per device"),
        ("gradients", "pg-grads", f"{gb['grads']:.2f}", "GB per device"),
        ("optimizer state", "pg-optimizer", f"{gb['optimizer']:.2f}", "GB per device"),
        ("total persistent", "pg-total", f"{gb['total']:.2f}",
         f"GB of {i['device_memory_gb']:g} GB: {'fits' if p.fits else 'does NOT fit'}"),
        ("bubble fraction", "pg-bubble", f"{p.bubble:.4f}",
         f"(P-1)/(m+P-1) with P={i['pp']}, m={i['microbatches']}"),
        ("effective batch", "pg-batch", f"{p.effective_batch}",
         f"= {i['microbatch_size']} x {i['accumulation_steps']} x {i['dp']} examples"),
    ]
    out = []
    if p.warnings:
        out.append('<div class="pg-warnings" style="color:#b00020">')
        out += [f'<div class="pg-warning">&#9888; {esc(w)}</div>' for w in p.warnings]
        out.append("</div>")
    else:
        out.append('<div class="pg-ok" style="color:#1b5e20">No warnings.</div>')
    out.append('<div style="display:flex; gap:24px; align-items:flex-start">')
    out.append('<table class="pg-table" style="flex:none">')
    for label, cls, value, note in rows:
        out.append(f'<tr><td>{esc(label)}</td><td><b class="{cls}">{esc(value)}</b></td>'
                   f'<td>{esc(note)}</td></tr>')
    out.append('</table><div style="flex:1; line-height:1.3"><b>Collectives each axis needs</b>')
    out += [f'<div class="pg-coll-{a}"><b>{a.upper()}</b>: {esc(t)}</div>'
            for a, t in p.collectives.items()]
    out.append('<div class="pg-omitted" style="margin-top:6px"><i>This estimate leaves out: '
               + "; ".join(esc(o) for o in p.omitted) + ".</i></div></div></div>")
    return "\n".join(out)


_MAX_DRAWN = 256
_PART_WORDS = {"weights": "weights", "grads": "gradients", "optimizer": "optimizer state"}
_GRID_TITLES = {"tp": "TP groups", "pp": "PP stages", "dp": "DP groups"}


def _shades(colour: str, k: int) -> list[str]:
    """``k`` shades of one axis colour, light to dark (at most 4: they repeat beyond)."""
    from matplotlib.colors import to_hex, to_rgb

    base = to_rgb(colour)
    mix = [0.6, 0.3, 0.0, -0.3][-min(k, 4):] if k > 1 else [0.0]
    return [to_hex(tuple(c + f * (1 - c) if f >= 0 else c * (1 + f) for c in base))
            for f in mix]


def _count(k: int, noun: str) -> str:
    return f"{k} {noun}" + ("" if k == 1 else "s")


def _text_colour(colour: str) -> str:
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(colour)
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.55 else "black"


def _memory_bars(ax, p: Plan) -> None:
    """One horizontal stacked bar per ZeRO stage (the chosen one solid), the budget dashed."""
    from matplotlib.colors import to_rgba
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from course_utils.style import STATE_COLORS

    stages = list(p.bytes_by_stage)
    chosen = p.inputs["zero_stage"]
    lefts = [0.0] * len(stages)
    for part in _PARTS:
        widths = [p.bytes_by_stage[s][part] / memory.GB for s in stages]
        ax.barh(stages, widths, left=lefts, height=0.68,
                color=[to_rgba(STATE_COLORS[part], 1.0 if s == chosen else 0.4) for s in stages])
        lefts = [a + w for a, w in zip(lefts, widths)]
    budget = p.budget_bytes / memory.GB
    right = max(max(lefts), budget)
    for s, total in zip(stages, lefts):
        _ = ax.text(total + 0.01 * right, s, f"{total:.2f} GB", va="center", zorder=3,
                    fontweight="bold" if s == chosen else "normal",
                    bbox=dict(facecolor="white", edgecolor="none", pad=1))
    ax.axvline(budget, color="black", linestyle="--", linewidth=1.2)
    _ = ax.set_yticks(stages, [f"ZeRO-{s}" for s in stages])
    for s, tick in zip(stages, ax.get_yticklabels()):
        tick.set_fontweight("bold" if s == chosen else "normal")
    ax.invert_yaxis()
    _ = ax.set_xlim(0, right * 1.2)
    _ = ax.set_xlabel("persistent GB per device")
    _ = ax.set_title(f"ZeRO-{chosen}: {p.gb['total']:.2f} GB of {budget:g} GB per device, "
                     f"{'fits' if p.fits else 'does not fit'}")
    handles = [Patch(color=STATE_COLORS[part], label=_PART_WORDS[part]) for part in _PARTS]
    handles.append(Line2D([], [], color="black", linestyle="--",
                          label=f"device memory\n({budget:g} GB)"))
    _ = ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5),
                  frameon=False)


def _device_grid(ax, p: Plan, axis: str) -> None:
    from matplotlib.patches import Rectangle

    from course_utils.style import AXIS_COLORS

    n = p.devices_needed
    per_node = p.inputs["devices_per_node"]
    ax.set_axis_off()
    title = _GRID_TITLES[axis]  # used when there are too many devices to draw
    if n > _MAX_DRAWN:
        _ = ax.set_title(title)
        _ = ax.text(0.5, 0.5, f"{n} devices:\ntoo many to draw", ha="center", va="center")
        return
    if axis == "pp":  # colour PP by stage: the same colour is the same layers
        index = {r: p.mesh.coords(r)["pp"] for r in range(n)}
        count = p.mesh.size("pp")
    else:
        index = {r: gi for gi, ranks in enumerate(p.mesh.groups(axis)) for r in ranks}
        count = len(p.mesh.groups(axis))
    shades = _shades(AXIS_COLORS[axis], count)
    cols = min(per_node, n)
    rows = -(-n // cols)
    size_pt = 9 if cols > 8 or rows > 8 else 10  # a panel is about 190 x 170 pt
    numbered = (190 / cols >= 0.65 * size_pt * len(str(n - 1)) + 3
                and 170 / rows >= 1.25 * size_pt)
    for r in range(n):
        y, x = divmod(r, cols)
        colour = shades[index[r] % len(shades)]
        ax.add_patch(Rectangle((x + 0.04, -y + 0.06), 0.92, 0.88, facecolor=colour,
                               edgecolor="none"))
        if numbered:
            _ = ax.text(x + 0.5, -y + 0.5, str(r), ha="center", va="center",
                        color=_text_colour(colour), fontsize=size_pt)
    for node in range(1, rows):  # node boundaries: one row of devices_per_node per node
        ax.plot([0, cols], [-node + 1.0, -node + 1.0], color="black", linewidth=1.5)
    _ = ax.set_xlim(0, cols)
    _ = ax.set_ylim(-rows + 1, 1)
    size, groups = p.mesh.size(axis), len(p.mesh.groups(axis))
    first = (f"PP: {_count(size, 'stage')}, {_count(groups, 'pipeline')}" if axis == "pp"
             else f"{axis.upper()}: {_count(groups, 'group')} of {size}")
    crossing, unit = len(p.crossing[axis]), "pipeline" if axis == "pp" else "group"
    second = ("all inside a node" if not crossing else f"every {unit} spans nodes"
              if crossing == groups else f"{crossing} of {groups} span nodes")
    _ = ax.set_title(f"{first}\n{second}", fontsize=11)


def figure(p: Plan):
    """Memory per device for ZeRO 0-3 against the budget (the course's state colours), and the
    devices, one row per node, shaded by TP group, PP stage and DP group (each axis's colour)."""
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(9, 6.4), layout="constrained")
    grid = fig.add_gridspec(2, 3, height_ratios=[1, 1.45])
    _memory_bars(fig.add_subplot(grid[0, :]), p)
    for k, axis in enumerate(("tp", "pp", "dp")):
        _device_grid(fig.add_subplot(grid[1, k]), p, axis)
    if p.devices_needed <= _MAX_DRAWN:
        _ = fig.supxlabel(f"Squares: the {p.devices_needed} devices, one row per node of "
                          f"{p.inputs['devices_per_node']}; shades tell the groups apart.")
    return fig


# ------------------------------------------------------------------------------------- widget


class Playground:
    """ipywidgets controls wired to :func:`plan`; ``.widget`` is what a cell displays.

    ``.controls`` maps each input name to its widget, ``.plan`` is the latest :class:`Plan`
    (None while the inputs are invalid), ``.summary`` (HTML) and ``.output`` (figure) the views.
    """

    def __init__(self, **values: Any):
        import ipywidgets as w

        unknown = set(values) - set(DEFAULTS) - {"draw"}
        if unknown:
            raise ValueError(f"unknown playground inputs {sorted(unknown)}; allowed: {sorted(DEFAULTS)}")
        self.draw = values.pop("draw", True)
        v = {**DEFAULTS, **values}
        style = {"description_width": "150px"}
        lay = w.Layout(width="340px")

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
        }
        self.axis_order = tuple(v["axis_order"])
        for name, control in self.controls.items():
            control.add_class(f"pg-in-{name}")
            control.observe(self._update, names="value")
        self.summary = w.HTML()
        self.summary.add_class("pg-summary")
        self.output = w.Output()
        self.output.add_class("pg-figure")
        names = list(self.controls)
        left = w.VBox([self.controls[n] for n in names[:7]])
        right = w.VBox([self.controls[n] for n in names[7:]])
        self.widget = w.VBox([w.HBox([left, right]), self.summary, self.output])
        self.widget.add_class("pg-playground")
        self.plan: Plan | None = None
        self._update()

    def values(self) -> dict:
        """The current inputs, as :func:`plan` takes them."""
        return {**{n: c.value for n, c in self.controls.items()}, "axis_order": self.axis_order}

    def _update(self, change: Any = None) -> None:
        import matplotlib.pyplot as plt
        from IPython.display import display

        try:
            self.plan = plan(**self.values())
        except ValueError as err:
            self.plan = None
            self.summary.value = f'<p class="pg-error" style="color:#b00020">{html.escape(str(err))}</p>'
            return
        self.summary.value = _html(self.plan)
        if self.draw:
            fig = figure(self.plan)
            with self.output:
                self.output.clear_output(wait=True)
                display(fig)
            plt.close(fig)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

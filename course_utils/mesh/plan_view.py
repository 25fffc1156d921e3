"""The device-mesh playground's view of a plan: its table, its HTML and its figure (lecture 6).

:func:`summary` is the short aligned table a notebook prints, :func:`plan_html` the table the
widget shows (with what each axis sends, the warnings and what the estimate leaves out), and
:func:`figure` the memory per device for ZeRO 0-3 against the budget beside the devices shaded
by TP group, PP stage and DP group. Each draws a :class:`course_utils.mesh.plan_costs.Plan`;
nothing here computes a cost.
"""

from __future__ import annotations

import html

from course_utils.memory import sizing as memory
from course_utils.mesh.plan_costs import (TEACHING_NOTE, Plan, first_stage,
                                          gathered_layer_bytes)

__all__ = ["summary", "plan_html", "figure"]

_PARTS = ("weights", "grads", "optimizer")


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
    if p.peak_gb is not None:
        pk = p.peak_gb
        rows[3:3] = [
            ("activations", f"s={i['seq_len']}, b={i['microbatch_size']}, recompute "
                            f"{i['recompute']}{', SP' if i['sp'] else ''}: "
                            f"{_in_flight(p)} = {pk['activations']:.2f} GB"),
            ("peak per device", f"{gb['total']:.2f} + {pk['activations']:.2f} + gathered layer "
                                f"{pk['gathered']:.2f} = {pk['peak']:.2f} GB of "
                                f"{i['device_memory_gb']:g} GB -> "
                                f"{'fits' if p.peak_fits else 'does NOT fit'}"),
        ]
    rows += [("WARNING", w) for w in p.warnings] or [("warnings", "none")]
    return "\n".join(f"{name:18s}{text}" for name, text in rows)


def _in_flight(p: Plan) -> str:
    """What the activations hold: the first stage's layers times the 1F1B microbatches in flight."""
    i = p.inputs
    layers, flight = first_stage(i["num_layers"], i["pp"], i["microbatches"])
    return f"{_count(layers, 'layer')} x {flight} in flight (1F1B)"


def plan_html(p: Plan) -> str:
    """The plan as the widget shows it (HTML): the warnings, the table of numbers, what each
    axis sends and what the estimate leaves out."""
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
    if p.peak_gb is not None:
        pk = p.peak_gb
        sp = ", sequence parallel" if i["sp"] else ""
        rows[6:6] = [
            ("activations", "pg-activations", f"{pk['activations']:.2f}",
             f"GB: s={i['seq_len']}, b={i['microbatch_size']}, recomputation {i['recompute']}"
             f"{sp}; first stage: {_in_flight(p)}"),
            ("gathered layer", "pg-gathered", f"{pk['gathered']:.2f}",
             "GB: one layer gathered whole (ZeRO-3 with DP > 1)"),
            ("peak", "pg-peak", f"{pk['peak']:.2f}",
             f"GB of {i['device_memory_gb']:g} GB: {'fits' if p.peak_fits else 'does NOT fit'}"),
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
    out.append(f'<div class="pg-omitted" style="margin-top:6px"><b>{esc(TEACHING_NOTE)}</b> '
               '<i>This estimate leaves out: '
               + "; ".join(esc(o) for o in p.omitted) + ".</i></div></div></div>")
    return "\n".join(out)


_MAX_DRAWN = 256
_PART_WORDS = {"weights": "weights", "grads": "gradients", "optimizer": "optimizer state",
               "activations": "activations", "gathered": "gathered layer\n(ZeRO-3)"}
_COLOUR = {"weights": "weights", "grads": "grads", "optimizer": "optimizer",
           "activations": "activations", "gathered": "buffers"}
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
    """One horizontal stacked bar per ZeRO stage (the chosen one solid), the budget dashed; with
    ``seq_len``, each bar adds the activations and (ZeRO-3) the gathered layer: it ends at the
    peak."""
    from matplotlib.colors import to_rgba
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from course_utils.style import STATE_COLORS

    stages = list(p.bytes_by_stage)
    chosen = p.inputs["zero_stage"]
    lefts = [0.0] * len(stages)
    parts = _PARTS if p.peak_bytes is None else _PARTS + ("activations", "gathered")
    for part in parts:
        widths = [_bar_bytes(p, s, part) / memory.GB for s in stages]
        shown = [k for k, w in enumerate(widths) if w > 0 or part in _PARTS]
        ax.barh([stages[k] for k in shown], [widths[k] for k in shown],
                left=[lefts[k] for k in shown], height=0.68,
                color=[to_rgba(STATE_COLORS[_COLOUR[part]], 1.0 if stages[k] == chosen else 0.4)
                       for k in shown])
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
    if p.peak_bytes is None:
        _ = ax.set_xlabel("persistent GB per device")
        _ = ax.set_title(f"ZeRO-{chosen}: {p.gb['total']:.2f} GB of {budget:g} GB per device, "
                         f"{'fits' if p.fits else 'does not fit'}")
    else:
        _ = ax.set_xlabel("GB per device at the peak (a teaching model, not a measurement)")
        _ = ax.set_title(f"ZeRO-{chosen}: peak {p.peak_gb['peak']:.2f} GB of {budget:g} GB per "
                         f"device, {'fits' if p.peak_fits else 'does not fit'} (s = "
                         f"{p.inputs['seq_len']}, recomputation {p.inputs['recompute']})")
    handles = [Patch(color=STATE_COLORS[_COLOUR[part]], label=_PART_WORDS[part])
               for part in parts]
    handles.append(Line2D([], [], color="black", linestyle="--",
                          label=f"device memory\n({budget:g} GB)"))
    _ = ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5),
                  frameon=False)


def _bar_bytes(p: Plan, stage: int, part: str) -> float:
    """Bytes of one part of ZeRO ``stage``'s bar: the gathered layer only under ZeRO-3."""
    if part == "activations":
        return p.activation_bytes
    if part == "gathered":
        i = p.inputs
        return gathered_layer_bytes(i["model_params_b"] * 1e9, i["num_layers"], i["tp"],
                                     memory.layout(i["layout"])) \
            if stage == 3 and i["dp"] > 1 else 0.0
    return p.bytes_by_stage[stage][part]


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

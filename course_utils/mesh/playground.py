"""The device-mesh playground: size a TP x PP x DP plan and see what it costs.

:func:`plan` does all the arithmetic (tested in ``tests/test_playground.py``); :func:`figure`
draws a plan; :class:`Playground` only wires ipywidgets controls to them. In a notebook::

    from course_utils.mesh.playground import Playground
    Playground(tp=4, pp=2, dp=4).widget      # the last expression of a cell displays it

What the estimate covers: persistent training state per device (weights, gradients,
optimizer state) with ideal TP/PP sharding and ZeRO over the DP ranks, the idealized pipeline
bubble, the effective batch, where the groups fall on nodes, and the collectives each axis
needs. Given a sequence length (``seq_len``), also the activations saved for backward and a
peak per device:

* **Activations** (Korthikanti et al. 2022, Table 2, through
  :func:`course_utils.memory.activations.korthikanti_bytes`: 16-bit, with dropout, whatever the
  layout): a GPT layer of hidden size h = ``hidden`` and a = ``num_heads`` heads saves
  s b h (34 + 5 a s / h) bytes for a microbatch of b = ``microbatch_size`` sequences of
  s = ``seq_len`` tokens, less with TP, sequence parallelism (``sp``) and recomputation
  (``recompute``: "none", "selective" = the attention core, "full" = only each layer's input).
  The pipeline runs **1F1B**: its first stage, the fullest, holds ceil(L / P) of the L =
  ``num_layers`` layers and keeps min(P, m) microbatches in flight, so it saves
  ceil(L / P) x min(P, m) layer-microbatches; with P dividing L and m >= P that is all L layers
  of one microbatch, whatever P (as Korthikanti et al. note). Interleaved schedules keep more;
  embeddings, logits and loss are left out.
* **Gathered layer**: under ZeRO-3 with DP > 1 each layer's parameters are all-gathered before
  its forward and backward: one layer of this device's TP shard, N / (L x TP) parameters in the
  weights' dtype (``layout.weights`` bytes each), is held whole on top of the persistent shard.
* **Peak** = persistent state + activations + gathered layer, against ``device_memory_gb``.

What it leaves out is listed in :data:`OMITTED` and shown beside every plan: it is a teaching
model, not a measured peak.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from course_utils.memory import sizing as memory
from course_utils.memory.activations import korthikanti_bytes
from course_utils.mesh.grid import AXES, Mesh
from course_utils.pipeline.schedule import bubble_fraction, effective_batch
from course_utils.runtime.validate import check_int as _int

__all__ = ["Plan", "plan", "collectives", "figure", "summary", "Playground", "OMITTED",
           "DEFAULTS", "RECOMPUTES", "TEACHING_NOTE"]

OMITTED = (
    "layer balance (embeddings, the output layer and uneven stages) and the activations outside "
    "the transformer layers (embeddings, logits, loss)",
    "collective time (bandwidth, latency, overlap with compute)",
    "peak allocations beyond one gathered layer (prefetched layers, communication buffers, "
    "workspaces, the layer being recomputed, allocator caching and fragmentation)",
)
TEACHING_NOTE = "A teaching model, not a measured peak."

RECOMPUTES = ("none", "selective", "full")
_KORTHIKANTI = {"none": "none", "selective": "attention", "full": "full"}  # activations' names

DEFAULTS: dict[str, Any] = dict(
    model_params_b=70.0, layout="mixed_adam16", tp=4, pp=2, dp=4, zero_stage=3,
    microbatches=16, microbatch_size=2, accumulation_steps=16, device_memory_gb=80.0,
    devices_per_node=8, devices=32, num_layers=80, num_heads=64, hidden=8192, seq_len=4096,
    recompute="none", sp=False, axis_order=AXES)

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
    # with seq_len given (else None): bytes per device, first pipeline stage
    activation_bytes: float | None = None  # saved for backward, 1F1B microbatches in flight
    layer_microbatches: int | None = None  # ceil(L / P) x min(P, m): what those bytes hold
    gathered_bytes: float | None = None    # one layer gathered whole under ZeRO-3 (else 0)
    peak_bytes: float | None = None        # persistent + activations + gathered
    peak_fits: bool | None = None

    @property
    def gb(self) -> dict:
        """Per-device persistent state in GB (10**9 bytes)."""
        return {k: v / memory.GB for k, v in self.bytes.items()}

    @property
    def peak_gb(self) -> dict | None:
        """Activations, gathered layer and peak per device in GB; None without ``seq_len``."""
        if self.peak_bytes is None:
            return None
        return {"activations": self.activation_bytes / memory.GB,
                "gathered": self.gathered_bytes / memory.GB, "peak": self.peak_bytes / memory.GB}


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


def _first_stage(num_layers: int, pp: int, microbatches: int) -> tuple[int, int]:
    """1F1B's fullest stage, the first: its ceil(L / P) layers and the min(P, m) microbatches
    it keeps in flight."""
    return -(-num_layers // pp), min(pp, microbatches)


def _gathered_layer_bytes(n_params: float, num_layers: int, tp: int,
                          lay: memory.Layout) -> float:
    """One layer of a device's TP shard, gathered whole by ZeRO-3: N / (L x TP) parameters in
    the weights' dtype."""
    return n_params / (num_layers * tp) * lay.weights


def plan(model_params_b: float = DEFAULTS["model_params_b"], layout: str = DEFAULTS["layout"],
         tp: int = DEFAULTS["tp"], pp: int = DEFAULTS["pp"], dp: int = DEFAULTS["dp"],
         zero_stage: int = DEFAULTS["zero_stage"], microbatches: int = DEFAULTS["microbatches"],
         microbatch_size: int = DEFAULTS["microbatch_size"],
         accumulation_steps: int = DEFAULTS["accumulation_steps"],
         device_memory_gb: float = DEFAULTS["device_memory_gb"],
         devices_per_node: int = DEFAULTS["devices_per_node"], devices: int | None = None,
         num_layers: int | None = None, num_heads: int | None = None,
         axis_order: tuple[str, ...] = AXES, seq_len: int | None = None,
         hidden: int | None = None, recompute: str = DEFAULTS["recompute"],
         sp: bool = DEFAULTS["sp"]) -> Plan:
    """Size a TP x PP x DP plan: per-device persistent bytes, bubble, batch, groups, warnings.

    ``model_params_b``: parameters in billions; ``layout``: a :data:`course_utils.memory.sizing.LAYOUTS`
    name; ``zero_stage`` shards over the DP ranks only; ``device_memory_gb`` in GB (10**9 B);
    ``devices``: GPUs available (default: tp x pp x dp); ``num_layers``/``num_heads``: checked
    against PP/TP when given; ``axis_order``: mesh axes outermost first (last = innermost).
    ``seq_len`` (tokens) adds the activations of ``microbatch_size`` sequences and the peak (see
    the module docstring); it needs ``hidden``, ``num_layers`` and ``num_heads``, and
    ``recompute`` (one of :data:`RECOMPUTES`) and ``sp`` (sequence parallelism, TP > 1) act only
    with it. Without ``seq_len`` the plan is persistent state only, as before.
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
    if recompute not in RECOMPUTES:
        raise ValueError(f"recompute must be one of {list(RECOMPUTES)}; got {recompute!r}")
    if not isinstance(sp, bool):
        raise ValueError(f"sp must be a bool; got {sp!r}")
    if seq_len is None:
        for name, value, off in (("hidden", hidden, None), ("recompute", recompute, "none"),
                                 ("sp", sp, False)):
            if value != off:
                raise ValueError(f"{name}={value!r} needs seq_len: activations are modelled "
                                 "only when seq_len (tokens per sequence) is given")
    else:
        _int("seq_len", seq_len)
        for name, value in (("hidden", hidden), ("num_layers", num_layers),
                            ("num_heads", num_heads)):
            if value is None:
                raise ValueError(f"{name} is needed with seq_len (the activations depend on it)")
        _int("hidden", hidden)
        if hidden % num_heads:
            raise ValueError(f"hidden must be a multiple of num_heads={num_heads}; got {hidden}")
        if sp and tp == 1:
            raise ValueError("sp=True needs tp > 1: sequence parallelism splits the sequence "
                             "over the TP ranks")
        if sp and seq_len % tp:
            raise ValueError(f"seq_len must be a multiple of tp={tp} with sp=True (each TP rank "
                             f"holds seq_len / tp tokens); got {seq_len}")

    mesh = Mesh.from_degrees(tuple(axis_order), dp=dp, pp=pp, tp=tp)
    needed = tp * pp * dp
    shard = n_params / (tp * pp)
    by_stage = {s: memory.zero_state_bytes(shard, dp, s, lay) for s in memory.ZERO_STAGES}
    state = by_stage[zero_stage]
    fits = state["total"] <= budget
    crossing = {axis: mesh.groups_crossing_nodes(axis, devices_per_node) for axis in AXES}

    act = gathered = peak = layer_mb = None
    if seq_len is not None:
        layers, in_flight = _first_stage(num_layers, pp, microbatches)
        layer_mb = layers * in_flight
        act = korthikanti_bytes(seq_len, microbatch_size, hidden, num_heads, layers=layer_mb,
                                recompute=_KORTHIKANTI[recompute], tp=tp, sp=sp)
        gathered = _gathered_layer_bytes(n_params, num_layers, tp, lay) \
            if zero_stage == 3 and dp > 1 else 0.0
        peak = state["total"] + act + gathered

    warnings = []
    if not fits:
        warnings.append(f"Does not fit: {state['total'] / memory.GB:.2f} GB of persistent state "
                        f"per device > {device_memory_gb:g} GB device, before any activations.")
    elif peak is None and state["total"] > 0.9 * budget:
        warnings.append(f"Fits with under 10% headroom ({state['total'] / memory.GB:.2f} of "
                        f"{device_memory_gb:g} GB): activations and buffers will not fit.")
    elif peak is not None and peak > budget:
        warnings.append(f"Peak does not fit: {state['total'] / memory.GB:.2f} GB persistent + "
                        f"{act / memory.GB:.2f} activations + {gathered / memory.GB:.2f} "
                        f"gathered layer = {peak / memory.GB:.2f} GB > {device_memory_gb:g} GB "
                        "device. Recomputation, sequence parallelism or a smaller microbatch "
                        "shrink the activations.")
    elif peak is not None and peak > 0.9 * budget:
        warnings.append(f"Peak within 10% of the device ({peak / memory.GB:.2f} of "
                        f"{device_memory_gb:g} GB): buffers and fragmentation may not fit.")
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
                  axis_order=tuple(axis_order), seq_len=seq_len, hidden=hidden,
                  recompute=recompute, sp=sp)
    return Plan(inputs=inputs, mesh=mesh, devices_needed=needed, replica_devices=tp * pp,
                params_per_shard=shard, bytes=state, bytes_by_stage=by_stage,
                budget_bytes=budget, fits=fits, bubble=bubble_fraction(pp, microbatches),
                effective_batch=effective_batch(microbatch_size, accumulation_steps, dp),
                crossing=crossing,
                collectives=collectives(tp, pp, dp, zero_stage, microbatches=microbatches),
                warnings=warnings, activation_bytes=act, layer_microbatches=layer_mb,
                gathered_bytes=gathered, peak_bytes=peak,
                peak_fits=None if peak is None else peak <= budget)


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
    layers, flight = _first_stage(i["num_layers"], i["pp"], i["microbatches"])
    return f"{_count(layers, 'layer')} x {flight} in flight (1F1B)"


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
        return _gathered_layer_bytes(i["model_params_b"] * 1e9, i["num_layers"], i["tp"],
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


# ------------------------------------------------------------------------------------- widget


def _figure_html(p: Plan, values: dict) -> str:
    """The plan's figure as an ``<img>`` (PNG, inline) whose ``data-plan`` names the inputs it
    was drawn from."""
    import matplotlib.pyplot as plt

    from course_utils.widgets.base import figure_html, png

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
            raise ValueError(f"unknown playground inputs {sorted(unknown)}; allowed: {sorted(DEFAULTS)}")
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

        from course_utils.widgets.base import error_html

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
        self.summary.value = _html(self.plan) + self._figure
        self.redraw_s = time.perf_counter() - start

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

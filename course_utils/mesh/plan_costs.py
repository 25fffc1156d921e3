"""What a TP x PP x DP plan costs: the device-mesh playground's arithmetic (lecture 6).

:func:`plan` sizes one configuration into a :class:`Plan` (tested in
``tests/test_playground.py``); :func:`collectives` says what each axis sends. The view is
:mod:`course_utils.mesh.plan_view`, the widget :mod:`course_utils.mesh.playground`.

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

from dataclasses import dataclass, field
from typing import Any

from course_utils.memory import sizing as memory
from course_utils.memory.activations import korthikanti_bytes
from course_utils.mesh.grid import AXES, Mesh
from course_utils.pipeline.schedule import bubble_fraction, effective_batch
from course_utils.runtime.validate import check_int, check_real

__all__ = ["Plan", "plan", "collectives", "first_stage", "gathered_layer_bytes",
           "OMITTED", "DEFAULTS", "RECOMPUTES", "TEACHING_NOTE"]

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


def first_stage(num_layers: int, pp: int, microbatches: int) -> tuple[int, int]:
    """1F1B's fullest stage, the first: its ceil(L / P) layers and the min(P, m) microbatches
    it keeps in flight."""
    return -(-num_layers // pp), min(pp, microbatches)


def gathered_layer_bytes(n_params: float, num_layers: int, tp: int,
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

    ``model_params_b``: parameters in billions; ``layout``: a
    :data:`course_utils.memory.sizing.LAYOUTS` name; ``zero_stage`` shards over the DP ranks
    only; ``device_memory_gb`` in GB (10**9 B);
    ``devices``: GPUs available (default: tp x pp x dp); ``num_layers``/``num_heads``: checked
    against PP/TP when given; ``axis_order``: mesh axes outermost first (last = innermost).
    ``seq_len`` (tokens) adds the activations of ``microbatch_size`` sequences and the peak (see
    the module docstring); it needs ``hidden``, ``num_layers`` and ``num_heads``, and
    ``recompute`` (one of :data:`RECOMPUTES`) and ``sp`` (sequence parallelism, TP > 1) act only
    with it. Without ``seq_len`` the plan is persistent state only, as before.
    """
    n_params = check_real("model_params_b", model_params_b) * 1e9
    lay = memory.layout(layout)
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp), ("microbatches", microbatches),
                        ("microbatch_size", microbatch_size),
                        ("accumulation_steps", accumulation_steps),
                        ("devices_per_node", devices_per_node)):
        check_int(name, value)
    if zero_stage not in memory.ZERO_STAGES or isinstance(zero_stage, bool):
        raise ValueError(f"zero_stage must be one of {memory.ZERO_STAGES}; got {zero_stage!r}")
    budget = check_real("device_memory_gb", device_memory_gb) * memory.GB
    if devices is not None:
        check_int("devices", devices)
    if num_layers is not None:
        check_int("num_layers", num_layers)
    if num_heads is not None:
        check_int("num_heads", num_heads)
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
        check_int("seq_len", seq_len)
        for name, value in (("hidden", hidden), ("num_layers", num_layers),
                            ("num_heads", num_heads)):
            if value is None:
                raise ValueError(f"{name} is needed with seq_len (the activations depend on it)")
        check_int("hidden", hidden)
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
        layers, in_flight = first_stage(num_layers, pp, microbatches)
        layer_mb = layers * in_flight
        act = korthikanti_bytes(seq_len, microbatch_size, hidden, num_heads, layers=layer_mb,
                                recompute=_KORTHIKANTI[recompute], tp=tp, sp=sp)
        gathered = gathered_layer_bytes(n_params, num_layers, tp, lay) \
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

"""What the compiled collectives cost, and when a plan's communication hides behind its matmul.

Module 2's alpha-beta ring model applied to the collectives read from the HLO.

:func:`ring_cost` times one :class:`~course_utils.jax_sharding.hlo.Collective` on a ring of its
group (the factors and the time come from :mod:`course_utils.collectives.cost`, their one
home); :func:`cost_table` prints it for every collective of several programs;
:func:`hides_behind_matmul` says whether FSDP's all-gather or TP's all-reduce fits in its local
matmul's time, with published accelerator figures in :data:`ACCELERATORS`. Lecture 8 (JAX),
section 7.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Sequence

from course_utils.collectives.cost import ring_bytes, ring_factor, ring_steps, ring_time_s
from course_utils.jax_sharding.hlo import Collective
from course_utils.runtime.validate import check_int, check_real, one_of

__all__ = ["RING_OPS", "ring_cost", "cost_table", "ACCELERATORS", "hides_behind_matmul"]

RING_OPS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute")


def ring_cost(c: Collective, alpha_s: float, bandwidth_bytes_per_s: float) -> dict:
    """Module 2's alpha-beta time of one compiled collective on a ring of its group.

    Units: seconds; bytes. ``alpha_s`` is the fixed latency of each message, and
    ``bandwidth_bytes_per_s`` (beta) what one device's link sends per second. An all-reduce of
    n bytes over D devices is ``collectives.cost.ring_time_s``: 2(D - 1) steps of n / D bytes.
    An all-gather (n = its result) and a reduce-scatter (n = its input, D x its result) are
    one of that ring's two phases, D - 1 steps of n / D: half of it. A collective-permute
    sends its buffer once: alpha + n / beta. Returns the steps, the bytes each device sends,
    and the latency, bandwidth and total time.
    """
    if not isinstance(c, Collective):
        raise TypeError(f"c must be a Collective (from js.collectives(hlo)); got "
                        f"{type(c).__name__}")
    if c.op not in RING_OPS:
        raise ValueError(f"c.op must be one of {list(RING_OPS)} (the ring model has no "
                         f"all-to-all); got {c.op!r}")
    alpha = check_real("alpha_s", alpha_s, 0, strict=False)
    beta = check_real("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
    if c.op == "collective-permute":
        steps, sent, group = 1, float(c.nbytes), c.group_size
        total = alpha + c.nbytes / beta
    else:
        if c.group_size is None:
            raise ValueError(f"c.group_size is unknown for this {c.op}: the ring model needs D")
        group, op = c.group_size, c.op.replace("-", "_")   # the cost module's op names
        n = c.nbytes * group if c.op == "reduce-scatter" else c.nbytes
        steps, sent = ring_steps(op, group), ring_bytes(op, n, group)
        total = ring_time_s(n, group, alpha_s=alpha, bandwidth_bytes_per_s=beta, op=op)
    return {"op": c.op, "group": group, "steps": steps, "sent_bytes": sent,
            "latency_s": steps * alpha, "bandwidth_s": total - steps * alpha, "time_s": total}


def cost_table(programs: Mapping[str, Sequence[Collective]], alpha_s: float,
               bandwidth_bytes_per_s: float) -> str:
    """One line per collective of each program: bytes in the HLO, bytes each device sends, and
    :func:`ring_cost`'s latency, bandwidth and total time (microseconds)."""
    if not isinstance(programs, Mapping) or not programs or not all(
            isinstance(k, str) and isinstance(v, Sequence) for k, v in programs.items()):
        raise ValueError("programs must map a program's name to its list of Collectives "
                         "(js.collectives(hlo))")
    lines = [f"{'program':<22} {'collective':<19} {'D':>2} {'HLO bytes':>9} {'sent/device':>11} "
             f"{'latency':>9} {'bandwidth':>10} {'total':>9}"]
    for name, found in programs.items():
        for c in found:
            r = ring_cost(c, alpha_s, bandwidth_bytes_per_s)
            group = "-" if r["group"] is None else r["group"]
            lines.append(f"{name:<22} {c.op:<19} {group:>2} {c.nbytes:>9} "
                         f"{r['sent_bytes']:>11.0f} {r['latency_s'] * 1e6:>6.2f} us "
                         f"{r['bandwidth_s'] * 1e6:>7.3f} us {r['time_s'] * 1e6:>6.2f} us")
    return "\n".join(lines)


# Published figures, as stated by their sources (per chip; bytes/s one way per link).
ACCELERATORS: dict[str, dict[str, Any]] = {
    "TPU v5e": {"flops_per_s": 1.97e14, "link_bytes_per_s": 4.5e10,
                "source": "HTSYM tpus.md (jax-ml/scaling-book 0819a7d, lines 182, 192): "
                          "1.97e14 bf16 FLOP/s per chip; 4.5e10 B/s one way per ICI link "
                          "(9e10 bidirectional)"},
    "H100": {"flops_per_s": 9.9e14, "link_bytes_per_s": 4.5e11,
             "source": "HTSYM gpus.md (jax-ml/scaling-book 1a55377): 9.9e14 bf16 FLOP/s; "
                       "NVLink 4, 18 links x 25 GB/s = 450 GB/s each way per GPU"},
}
_PLANS = {"fsdp": "tokens per device", "tp": "d_ff per device"}


def hides_behind_matmul(plan: str, tokens_per_device: int, d_model: int, d_ff: int,
                        devices: int, flops_per_s: float, link_bytes_per_s: float,
                        itemsize: int = 2) -> dict:
    """Does the plan's collective fit in its local matmul's time (FLOPs / C vs bytes sent / W)?

    Units: seconds; FLOP/s; bytes/s (one device's link, one way, a one-way ring); itemsize in
    bytes (2: bf16). ``"fsdp"``: ``(tokens_per_device, d_model) @ (d_model, d_ff)`` needs the
    whole W all-gathered over ``devices``, (D - 1)/D x d_model d_ff itemsize bytes sent per
    device; the FLOPs grow with the tokens, the bytes do not. ``"tp"``: the Megatron pair
    ``(tokens, d_model) @ (d_model, d_ff / D) @ (d_ff / D, d_model)`` all-reduces its
    ``(tokens, d_model)`` output, 2 (D - 1)/D x tokens d_model itemsize bytes; the FLOPs grow
    with d_ff / D, the bytes do not. Both fit when that width (tokens per device, d_ff per
    device) is at least ``threshold`` = C / W x itemsize / 2 x (D - 1)/D, about C / W in bf16.
    The backward pass doubles both sides, so the rule holds for a training step. Latency
    (alpha) is left out: these messages are large.
    """
    width_name = one_of("plan", plan, _PLANS)
    for name, value in (("tokens_per_device", tokens_per_device), ("d_model", d_model),
                        ("d_ff", d_ff), ("devices", devices), ("itemsize", itemsize)):
        check_int(name, value)
    c = check_real("flops_per_s", flops_per_s)
    w = check_real("link_bytes_per_s", link_bytes_per_s)
    if plan == "tp" and d_ff % devices:
        raise ValueError(f"d_ff = {d_ff} must be divisible by devices = {devices} (tensor "
                         "parallelism splits it)")
    if plan == "fsdp":
        flops = 2 * tokens_per_device * d_model * d_ff          # (T, d) @ (d, f)
        comm = ring_time_s(d_model * d_ff * itemsize, devices, 0.0, w, op="all_gather")  # W
        width = tokens_per_device
    else:
        flops = 2 * 2 * tokens_per_device * d_model * (d_ff // devices)   # two matmuls
        comm = ring_time_s(tokens_per_device * d_model * itemsize, devices, 0.0, w)  # all-reduce
        width = d_ff // devices
    # compute = comm at width = C / W x itemsize / 2 x (D - 1)/D (the all-gather's factor)
    threshold = c / w * itemsize / 2 * ring_factor("all_gather", devices)
    compute = flops / c
    return {"plan": plan, "width_name": width_name, "width": width, "threshold": threshold,
            "compute_s": compute, "comm_s": comm, "hidden": compute >= comm}

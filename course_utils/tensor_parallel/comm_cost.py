"""What tensor parallelism communicates, counted from the sizes alone (nothing is run).

:func:`tp_comm_bytes`: the bytes a Megatron MLP, attention or block all-reduces per pass (one
activation-sized (b, s, h) tensor each time, whatever the FFN width or parameter count);
:func:`layer_plan`: the shards and the :class:`~course_utils.tensor_parallel.recording.CommEvent`
list one rank of :func:`~course_utils.tensor_parallel.comparison.compare`'s layers records;
:func:`mlp_comm_to_compute`: the idealised all-reduce time over matmul time of a TP MLP.
What a ring sends comes from :mod:`course_utils.collectives.cost`. Serves lecture 4 (and its
widget, :mod:`course_utils.widgets.tp_layout`, and assignment a4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from course_utils.collectives.cost import ring_bytes
from course_utils.runtime.validate import check_int, check_real
from course_utils.tensor_parallel.one_device import check_split, layer_config
from course_utils.tensor_parallel.recording import CommEvent

__all__ = ["dtype_bytes", "ring_all_reduce_bytes_per_rank", "tp_comm_bytes", "LayerPlan",
           "PLAN_KINDS", "layer_plan", "mlp_param_count", "format_comms", "mlp_comm_to_compute"]


def dtype_bytes(dtype: torch.dtype | str) -> int:
    """Bytes per element: torch.bfloat16 / "bf16" -> 2, torch.float32 / "fp32" -> 4, ..."""
    names = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
             "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
             "fp8": torch.float8_e4m3fn}
    if isinstance(dtype, str):
        if dtype not in names:
            raise ValueError(f"dtype must be a torch floating dtype or one of {sorted(names)}; "
                             f"got {dtype!r}")
        dtype = names[dtype]
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a torch floating dtype or one of {sorted(names)}; "
                         f"got {dtype!r}")
    return torch.empty((), dtype=dtype).element_size()


_ALL_REDUCES = {"mlp": (1, 1), "attention": (1, 1), "block": (2, 2)}


def ring_all_reduce_bytes_per_rank(nbytes: float, tp: int) -> float:
    """Bytes each rank sends in a ring all-reduce of an ``nbytes`` tensor: 2 (t-1)/t x nbytes
    (:func:`course_utils.collectives.cost.ring_bytes`)."""
    check_real("nbytes", nbytes, 0, strict=False)
    check_int("tp", tp)
    return ring_bytes("all_reduce", nbytes, tp)


def tp_comm_bytes(b: int, s: int, h: int, tp: int, dtype: torch.dtype | str = "bf16",
                  layer: str = "mlp") -> dict[str, float]:
    """Bytes a Megatron tensor-parallel ``layer`` all-reduces per forward and backward pass.

    Every all-reduce is of one activation-shaped tensor (b, s, h): ``payload_bytes`` =
    b * s * h * bytes(dtype). ``layer`` is "mlp" or "attention" (one all-reduce forward, one
    backward) or "block" (both: two and two). The FFN width, the number of heads and the
    parameter count do not appear. ``ring_bytes_sent_per_rank`` is what each rank sends for
    forward plus backward with a ring all-reduce. With tp = 1 nothing is communicated.
    """
    for name, value in (("b", b), ("s", s), ("h", h), ("tp", tp)):
        check_int(name, value)
    if layer not in _ALL_REDUCES:
        raise ValueError(f"layer must be one of {sorted(_ALL_REDUCES)}; got {layer!r}")
    fwd, bwd = _ALL_REDUCES[layer] if tp > 1 else (0, 0)
    payload = b * s * h * dtype_bytes(dtype)
    return {"all_reduces_forward": fwd, "all_reduces_backward": bwd,
            "payload_bytes": payload, "forward_bytes": fwd * payload,
            "backward_bytes": bwd * payload,
            "ring_bytes_sent_per_rank": ring_all_reduce_bytes_per_rank((fwd + bwd) * payload, tp)}


@dataclass(frozen=True)
class LayerPlan:
    """What every rank of a tensor-parallel layer holds and sends (:func:`layer_plan`)."""

    kind: str
    tp_size: int
    cfg: dict
    full_shapes: dict    # parameter name -> unsplit shape, in the Y = X W layout
    shapes: dict         # parameter name -> each rank's shape (equal shards)
    split: dict          # parameter name -> the dim it is cut along (None: whole on every rank)
    comms: list          # the CommEvents one rank issues, in order (forward, then backward)
    ring_bytes_sent_per_rank: float


PLAN_KINDS = ("column", "row", "mlp", "attention")


def layer_plan(kind: str, tp_size: int, cfg: dict | None = None,
               dtype: torch.dtype | str = "fp32") -> LayerPlan:
    """The shards and collectives of :func:`compare`'s ``kind`` on ``tp_size`` ranks, without
    running it: the from-scratch layers' parameter shapes (``weight`` (h_in, h_out)) and the
    :class:`CommEvent` list a rank records, for ``cfg`` (b, s, h, ffn, n_heads) in ``dtype``.
    ``column`` is nn.Linear(h, ffn) with its output gathered, ``row`` nn.Linear(ffn, h) on split
    input; the MLP's and attention's bytes are :func:`tp_comm_bytes`'s. A ring sends
    2 (t-1)/t of an all-reduce's bytes and (t-1)/t of an all-gather's."""
    if kind not in PLAN_KINDS:
        raise ValueError(f"kind must be one of {PLAN_KINDS}; got {kind!r}")
    check_int("tp_size", tp_size)
    c = layer_config(cfg)
    check_split(kind, c, tp_size)
    b, s, h, ffn, t, e = c["b"], c["s"], c["h"], c["ffn"], tp_size, dtype_bytes(dtype)
    col = lambda n_in, n_out: {"weight": ((n_in, n_out), 1), "bias": ((n_out,), 0)}  # noqa: E731
    row = lambda n_in, n_out: {"weight": ((n_in, n_out), 0), "bias": ((n_out,), None)}  # noqa
    params = {"column": col(h, ffn), "row": row(ffn, h),
              "mlp": {**{f"up.{k}": v for k, v in col(h, ffn).items()},
                      **{f"down.{k}": v for k, v in row(ffn, h).items()}},
              "attention": {**{f"qkv.{k}": v for k, v in col(h, 3 * h).items()},
                            **{f"o.{k}": v for k, v in row(h, h).items()}}}[kind]
    full = {name: shape for name, (shape, _) in params.items()}
    split = {name: dim for name, (_, dim) in params.items()}
    shapes = {name: tuple(n // t if d == split[name] else n for d, n in enumerate(shape))
              for name, shape in full.items()}
    act = lambda width: ((b, s, width), b * s * width * e)  # noqa: E731  (shape, bytes)
    comms: list[CommEvent] = []
    if t > 1 and kind == "column":
        comms = [CommEvent("all_gather", "forward", *act(ffn)),
                 CommEvent("all_reduce", "backward", *act(h))]
    elif t > 1 and kind == "row":
        comms = [CommEvent("all_reduce", "forward", *act(h))]
    elif kind in ("mlp", "attention"):
        counted = tp_comm_bytes(b, s, h, t, dtype, layer=kind)
        comms = ([CommEvent("all_reduce", "forward", (b, s, h), counted["payload_bytes"])]
                 * counted["all_reduces_forward"]
                 + [CommEvent("all_reduce", "backward", (b, s, h), counted["payload_bytes"])]
                 * counted["all_reduces_backward"])
    sent = sum(ring_bytes(ev.op, ev.nbytes, t) for ev in comms)
    return LayerPlan(kind, t, c, full, shapes, split, comms, sent)


def mlp_param_count(h: int, ffn: int) -> int:
    """Parameters of the :class:`~course_utils.tensor_parallel.one_device.MLP`: 2 * h * ffn
    weights + ffn + h biases."""
    check_int("h", h)
    check_int("ffn", ffn)
    return 2 * h * ffn + ffn + h


def format_comms(events: Sequence[CommEvent]) -> str:
    """One line per collective: phase, op, result shape and bytes."""
    if not events:
        return "  (no collectives)"
    return "\n".join(f"  {e.phase:<8} {e.op:<10} shape {str(e.shape):<12} {e.nbytes:>8,} bytes"
                     for e in events)


def mlp_comm_to_compute(h: int, tp: int, dtype: torch.dtype | str, flops_per_s: float,
                        link_bytes_per_s: float, ffn: int | None = None) -> float:
    """Idealised (all-reduce time) / (matmul time) for one rank's forward TP MLP.

    Per token, the rank's matmuls cost 4 * h * ffn / tp FLOPs and its ring all-reduce sends
    2 (tp-1)/tp * h * bytes(dtype) bytes, so the batch and sequence length cancel. With
    ffn = 4h this is (tp-1) * bytes * flops_per_s / (8 * h * link_bytes_per_s). Ignores latency,
    overlap and contention: a model to reason with, not a measurement.
    """
    check_int("h", h)
    check_int("tp", tp)
    ffn = 4 * h if ffn is None else check_int("ffn", ffn)
    check_real("flops_per_s", flops_per_s)
    check_real("link_bytes_per_s", link_bytes_per_s)
    comm_s = ring_all_reduce_bytes_per_rank(h * dtype_bytes(dtype), tp) / link_bytes_per_s
    matmul_s = 4 * h * ffn / tp / flops_per_s
    return comm_s / matmul_s

"""Module 4's tensor-parallel layout explorer: a column- or row-parallel linear, the Megatron MLP
or attention split by heads, on t ranks: each weight cut into t blocks, the shapes a rank holds,
and the collectives of one forward and backward with their bytes.

Everything comes from :func:`course_utils.tensor_parallel.comm_cost.layer_plan`, which gives the shapes
and the :class:`~course_utils.tensor_parallel.recording.CommEvent` list that :func:`~course_utils.
tensor_parallel.compare` records on real ranks (``tests/test_tensor_parallel.py`` checks them
equal), with the MLP's and attention's bytes from ``tp_comm_bytes``, the function lecture 4
asserts::

    from course_utils.widgets.tp_layout import TPLayout
    TPLayout(layer="mlp", tp=8)
"""

from __future__ import annotations

from typing import Any

from course_utils.tensor_parallel import comm_cost as tp
from course_utils.widgets.base import Explorer, Row, dropdown, integer, slider

__all__ = ["TPLayout", "WORDS"]

WORDS = {"column": "column-parallel linear (h -> ffn)", "row": "row-parallel linear (ffn -> h)",
         "mlp": "Megatron MLP (column, GELU, row)", "attention": "attention, split by heads"}
_WEIGHT_WORDS = {"weight": "W", "up.weight": "W1 (up)", "down.weight": "W2 (down)",
                 "qkv.weight": "W_qkv", "o.weight": "W_o"}
_HOW = {
    "column": "Each rank computes its own ffn/t output features; the all-gather concatenates "
              "them. Backward: each rank's dL/dX is a partial sum, so they are all-reduced.",
    "row": "Each rank reads its h_in/t input features and computes a partial sum of the whole "
           "output; the all-reduce adds them (the bias once, after). Backward needs nothing.",
    "mlp": "GELU runs on each rank's own features (no collective); g all-reduces the output "
           "forward, f all-reduces dL/dX backward.",
    "attention": "Each rank runs n_heads/t whole heads; the output projection's partial sums "
                 "are all-reduced forward, dL/dX backward.",
}


def _mib(n: float) -> str:
    return f"{n / 2**20:,.2f} MiB" if n >= 2**20 else f"{n / 2**10:,.2f} KiB"


def _comm(events: list, phase: str) -> str:
    mine = [e for e in events if e.phase == phase]
    if not mine:
        return "none"
    first = mine[0]
    return (f"{len(mine)} {first.op.replace('_', '-')} of {first.shape} = {_mib(first.nbytes)}"
            if all(e == first for e in mine) else
            ", ".join(f"{e.op.replace('_', '-')} of {e.shape} = {_mib(e.nbytes)}" for e in mine))


class TPLayout(Explorer):
    """A layer, t and the sizes -> each rank's weight shapes and the collectives of a forward
    and backward (:func:`course_utils.tensor_parallel.comm_cost.layer_plan`)."""

    prefix = "tl"
    title = "Tensor parallelism: what each rank holds and sends"
    defaults = {"layer": "mlp", "tp": 8, "b": 1, "s": 4096, "h": 4096, "ffn": 16384,
                "n_heads": 32, "dtype": "bf16"}
    figsize = (9.0, 3.3)
    alt = "each weight cut into t blocks, one colour per rank"

    def _controls(self, v: dict[str, Any]) -> dict[str, Any]:
        return {"layer": dropdown("layer", [(w, k) for k, w in WORDS.items()], v["layer"]),
                "tp": slider("TP degree t", v["tp"], 1, 8),
                "dtype": dropdown("activations", [("bf16 (2 B)", "bf16"), ("fp32 (4 B)", "fp32")],
                                  v["dtype"]),
                "b": integer("batch b", v["b"]),
                "s": integer("tokens s", v["s"]),
                "h": integer("hidden h", v["h"]),
                "ffn": integer("MLP width ffn", v["ffn"]),
                "n_heads": integer("attention heads", v["n_heads"])}

    def compute(self, layer: str, tp: int, dtype: str, b: int, s: int, h: int, ffn: int,
                n_heads: int) -> Any:
        return _plan(layer, tp, dict(b=b, s=s, h=h, ffn=ffn, n_heads=n_heads), dtype)

    def rows(self, p: Any) -> list[Row]:
        weights = [n for n in p.shapes if n.endswith("weight")]
        held = sum(_count(p.shapes[n]) for n in p.shapes)
        whole = sum(_count(p.full_shapes[n]) for n in p.full_shapes)
        return [Row("shapes", "rank's weights", ", ".join(
                    f"{_WEIGHT_WORDS[n]} {p.shapes[n]}" for n in weights)),
                Row("params", "parameters per rank", f"{held:,} of {whole:,} "
                    f"({held / whole:.1%})"),
                Row("forward", "forward", _comm(p.comms, "forward")),
                Row("backward", "backward", _comm(p.comms, "backward")),
                Row("sent", "a ring sends per rank", f"{_mib(p.ring_bytes_sent_per_rank)} "
                    "(forward + backward)")]

    def notes(self, p: Any) -> list[str]:
        if p.tp_size == 1:
            return ["t = 1: one rank holds everything and sends nothing."]
        return [_HOW[p.kind]]

    def draw(self, p: Any, fig: Any) -> None:
        from matplotlib.collections import PolyCollection

        from course_utils.tensor_parallel.pictures import rank_colour

        weights = [n for n in p.full_shapes if n.endswith("weight")]
        ax = fig.add_axes((0.01, 0.02, 0.98, 0.82))
        t = p.tp_size
        biggest = max(max(p.full_shapes[n]) for n in weights)
        boxes, colours, x = [], [], 0.0
        for k, name in enumerate(weights):
            rows_, cols = p.full_shapes[name]
            height, width = max(2.4 * rows_ / biggest, 0.3), max(2.4 * cols / biggest, 0.3)
            y0 = 1.4 - height / 2
            parts = 3 if name == "qkv.weight" else 1  # W_q | W_k | W_v, each cut by columns
            for part in range(parts):
                px, pw = x + width * part / parts, width / parts
                for r in range(t):
                    if p.split[name] == 1:   # columns: rank r's block of columns
                        x0, x1 = px + pw * r / t, px + pw * (r + 1) / t
                        ya, yb = y0, y0 + height
                    else:                    # rows: rank r's block of rows, rank 0 on top
                        x0, x1 = px, px + pw
                        ya, yb = y0 + height * (t - 1 - r) / t, y0 + height * (t - r) / t
                    boxes.append([(x0, ya), (x1, ya), (x1, yb), (x0, yb)])
                    colours.append(rank_colour(r, t))
            cut = "columns" if p.split[name] == 1 else "rows"
            _ = ax.text(x + width / 2, y0 - 0.1, f"{_WEIGHT_WORDS[name]} {p.full_shapes[name]}"
                        f"\nby {cut}: each rank {p.shapes[name]}", ha="center", va="top",
                        fontsize=9)
            if k + 1 < len(weights):
                between = "GELU\n(local)" if p.kind == "mlp" else "heads\n(local)"
                _ = ax.annotate(between, xy=(x + width + 1.1, 1.4), xytext=(x + width + 0.1, 1.4),
                                va="center", fontsize=9,
                                arrowprops={"arrowstyle": "->", "lw": 1.2})
            x += width + 1.4
        ax.add_collection(PolyCollection(boxes, facecolors=colours, edgecolors="black",
                                         linewidths=0.5))
        fwd, bwd = _comm(p.comms, "forward"), _comm(p.comms, "backward")
        _ = ax.text(x - 0.9, 1.4, f"forward: {fwd}\nbackward: {bwd}\nring sends "
                    f"{_mib(p.ring_bytes_sent_per_rank)} per rank", va="center", fontsize=10)
        _ = ax.set_xlim(-0.2, x + 4.4)
        _ = ax.set_ylim(-0.45, 2.7)
        ax.set_aspect("equal")
        ax.set_axis_off()
        _ = fig.suptitle(f"{WORDS[p.kind]} on t = {t}: colour = rank (rank 0 darkest)",
                         x=0.02, ha="left", fontsize=12)


def _plan(layer: str, t: int, sizes: dict[str, int], dtype: str) -> Any:
    """:func:`~course_utils.tensor_parallel.comm_cost.layer_plan` for the widget's sizes: the config keys
    it does not use for ``layer`` are left out of the checks (heads matter only to attention)."""
    if layer != "attention":
        sizes = {**sizes, "n_heads": 1}
    elif "ffn" in sizes:
        sizes = {**sizes, "ffn": t}
    return tp.layer_plan(layer, t, sizes, dtype)


def _count(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n

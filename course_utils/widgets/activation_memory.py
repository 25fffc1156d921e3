"""Module 9's activation calculator: the activations a GPT model keeps for backward, per GPU, for a
sequence length, micro-batch, recomputation, attention kernel, tensor parallelism and sequence
parallelism, against the model's training state.

The bytes are :func:`course_utils.memory.activations.korthikanti_bytes` (Korthikanti et al. 2022,
Table 2; the fused-attention variant as lecture 9 measures it), the function lecture 9
asserts; the state is :func:`course_utils.memory.sizing.state_bytes` (16 B/param), split over the TP
ranks::

    from course_utils.widgets.activation_memory import ActivationMemory
    ActivationMemory(model="7B", seq_len=4096)
"""

from __future__ import annotations

from typing import Any

from course_utils.memory import activations
from course_utils.memory import sizing as memory
from course_utils.widgets.base import Explorer, Row, checkbox, dropdown, key, plain_axes, slider

__all__ = ["ActivationMemory", "MODELS", "SEQ_LENS"]

# GPT-style models (multi-head attention): parameters, hidden h, heads a, layers L
MODELS = {"7B": (7e9, 4096, 32, 32), "13B": (13e9, 5120, 40, 40), "70B": (70e9, 8192, 64, 80)}
SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
_RECOMPUTE = {"none": "none", "selective (attention core)": "attention", "full (each layer)": "full"}
_WORDS = {v: k for k, v in _RECOMPUTE.items()}


class ActivationMemory(Explorer):
    """A model, s, b, recomputation, attention kernel, t and SP -> activation bytes per GPU
    (``korthikanti_bytes``), beside the training state per GPU; the figure plots them against
    the sequence length for the three recomputation modes."""

    prefix = "am"
    title = "Activations kept for backward, per GPU (Korthikanti et al., 16-bit)"
    defaults = {"model": "7B", "seq_len": 4096, "batch": 1, "recompute": "none",
                "attention": "fused", "tp": 1, "sp": False}
    figsize = (9.0, 3.3)
    alt = "activation GB per GPU against the sequence length, for each recomputation mode"

    def _controls(self, v: dict[str, Any]) -> dict[str, Any]:
        return {"model": dropdown("model (GPT-style)", list(MODELS), v["model"]),
                "seq_len": dropdown("sequence length s", list(SEQ_LENS), v["seq_len"]),
                "batch": slider("micro-batch b", v["batch"], 1, 16),
                "recompute": dropdown("recomputation", list(_RECOMPUTE.items()),
                                      v["recompute"]),
                "attention": dropdown("attention kernel",
                                      [("fused (flash)", "fused"), ("math (unfused)", "math")],
                                      v["attention"]),
                "tp": slider("tensor parallel t", v["tp"], 1, 8),
                "sp": checkbox("sequence parallel", v["sp"])}

    def compute(self, model: str, seq_len: int, batch: int, recompute: str, attention: str,
                tp: int, sp: bool) -> dict[str, Any]:
        if model not in MODELS:
            raise ValueError(f"model must be one of {list(MODELS)}; got {model!r}")
        n, h, a, layers = MODELS[model]
        if a % tp:
            raise ValueError(f"tp must divide the {a} attention heads of the {model} model "
                             f"(TP splits whole heads); got {tp}")
        kw = dict(b=batch, h=h, a=a, layers=layers, tp=tp, sp=sp, attention=attention)
        act = activations.korthikanti_bytes(seq_len, recompute=recompute, **kw)
        curves = {mode: [activations.korthikanti_bytes(s, recompute=mode, **kw)
                         for s in SEQ_LENS] for mode in activations.RECOMPUTES}
        return {"model": model, "seq_len": seq_len, "recompute": recompute, "tp": tp, "sp": sp,
                "attention": attention, "batch": batch, "bytes": act, "curves": curves,
                "state": memory.state_bytes(n) / tp, "layers": layers}

    def rows(self, s: dict[str, Any]) -> list[Row]:
        gb = s["bytes"] / memory.GB
        per_layer = s["bytes"] / s["layers"] / memory.GB
        return [Row("activations", "activations per GPU", f"{gb:.2f} GB"),
                Row("per-layer", f"per layer ({s['layers']} layers)", f"{per_layer:.3f} GB"),
                Row("state", "training state per GPU (16 B/param / t)",
                    f"{s['state'] / memory.GB:.2f} GB"),
                Row("ratio", "activations / state", f"{s['bytes'] / s['state']:.2f}")]

    def notes(self, s: dict[str, Any]) -> list[str]:
        if s["sp"]:
            return ["Sequence parallelism splits the LayerNorm and dropout activations that "
                    "tensor parallelism leaves whole on every rank: every term is divided by t."]
        if s["tp"] > 1:
            return ["Tensor parallelism splits the matmuls' activations over t; the "
                    "LayerNorm and dropout ones (10 s b h per layer) stay whole on every rank."]
        return ["Double s and the s b h terms double; with math attention the a s^2 term "
                "quadruples."]

    def draw(self, s: dict[str, Any], fig: Any) -> None:
        import math

        from course_utils.style import STATE_COLORS

        # log scales drawn on linear axes with fixed ticks: a log axis costs ~50 ms a redraw
        ax = fig.add_axes((0.09, 0.17, 0.6, 0.68))
        xs = [math.log2(x) for x in SEQ_LENS]
        gb = {mode: [v / memory.GB for v in values] for mode, values in s["curves"].items()}
        state = s["state"] / memory.GB
        everything = [v for values in gb.values() for v in values] + [state]
        lo, hi = math.floor(math.log10(min(everything))), math.ceil(math.log10(max(everything)))
        looks = {"none": "-", "attention": "--", "full": ":"}
        entries = []
        for mode, values in gb.items():
            width = 2.4 if mode == s["recompute"] else 1.2
            ax.plot(xs, [math.log10(v) for v in values], looks[mode], linewidth=width,
                    color=STATE_COLORS["activations"])
            entries.append((f"recompute {_WORDS[mode].split(' (')[0]}",
                            STATE_COLORS["activations"], looks[mode]))
        ax.plot([math.log2(s["seq_len"])], [math.log10(s["bytes"] / memory.GB)], "o",
                color="black", markersize=7, clip_on=False, zorder=4)
        ax.plot([xs[0] - 0.4, xs[-1] + 0.4], [math.log10(state)] * 2, linewidth=1.2,
                color=STATE_COLORS["optimizer"])
        entries += [("state per GPU", STATE_COLORS["optimizer"], "-")]
        _ = ax.set_xlim(xs[0] - 0.4, xs[-1] + 0.4)
        _ = ax.set_ylim(lo - 0.1, hi + 0.1)
        plain_axes(ax, [(x, f"{n // 1024}K" if n >= 1024 else str(n))
                        for x, n in zip(xs, SEQ_LENS)],
                   [(k, f"{10.0 ** k:g}") for k in range(lo, hi + 1)],
                   xlabel="sequence length s (tokens, log scale)",
                   ylabel="GB per GPU (log scale)")
        key(fig, entries, x=0.73, top=0.75, step=0.1)
        _ = fig.text(0.73, 0.75 - len(entries) * 0.1, "dot: this setting", va="center",
                     fontsize=9)
        par = f", t = {s['tp']}" + (" + SP" if s["sp"] else "") if s["tp"] > 1 else ""
        _ = fig.suptitle(f"{s['model']}, b = {s['batch']}, {s['attention']} attention{par}: "
                         f"{s['bytes'] / memory.GB:.2f} GB of activations at s = {s['seq_len']}",
                         x=0.02, ha="left", fontsize=12)

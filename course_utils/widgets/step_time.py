"""Module 13's step-time explorer: one training step of a Llama 3 model, term by term, for a plan
the student changes (model, hardware, TP, PP, DP, global batch, sequence length, pipeline
schedule, achieved efficiency, recomputation), beside the same plan at the datasheet peak.

Every number is :func:`course_utils.step_time.transformer.predict`'s, the function lecture 13
asserts: the terms (:class:`~course_utils.step_time.terms.StepTerms`), the step, tokens per
second per GPU and MFU counted both ways (attention scores included, PaLM's count, and 6N). The
figure is :func:`course_utils.step_time.pictures.draw_terms`' stacked bars: this plan at the
achieved efficiency, and the same plan at efficiency 1, which is what "peak instead of
achieved" does to a prediction. A microbatch is one sequence; the pipeline schedule (ZBV too) is
played op by op (:func:`course_utils.pipeline.schedule.simulate`), so the widget refuses plans
of more than :data:`MAX_PIPELINE_OPS` ops (a redraw must stay fast)::

    from course_utils.widgets.step_time import StepTime
    StepTime(model="70B", tp=8, pp=4, dp=32, global_batch=512, schedule="1f1b")
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from course_utils.step_time import published, transformer
from course_utils.step_time.hardware import A100, H100, Hardware
from course_utils.step_time.pictures import SHORT, draw_terms
from course_utils.step_time.terms import TERMS, WORDS
from course_utils.widgets.base import (Explorer, Row, choice_slider, dropdown, nice_ticks,
                                       plain_axes)

__all__ = ["StepTime", "MODELS", "HARDWARE", "SCHEDULES", "TPS", "PPS", "DPS", "BATCHES",
           "SEQ_LENS", "MAX_PIPELINE_OPS"]

MODELS = {"405B": ("Llama 3 405B", published.LLAMA3_405B),
          "70B": ("Llama 3 70B", published.LLAMA3_70B),
          "8B": ("Llama 3 8B", published.LLAMA3_8B)}
HARDWARE = {"H100": H100, "A100": A100}
# name -> (words, the simulator's schedule, chunks per rank v)
SCHEDULES = {"1f1b": ("1F1B", "1f1b", 1),
             "interleaved v=2": ("interleaved, v = 2", "interleaved", 2),
             "interleaved v=4": ("interleaved, v = 4", "interleaved", 4),
             "zbv": ("ZBV (zero bubble, 2 chunks in a V)", "zbv", 2)}
TPS = (1, 2, 4, 8)
PPS = (1, 2, 4, 8, 16)
DPS = (1, 2, 4, 8, 16, 32, 64, 128)
BATCHES = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
SEQ_LENS = (2048, 4096, 8192, 16384, 32768)
EFFICIENCY = (0.3, 1.0)
MAX_PIPELINE_OPS = 2048
"""At most this many ops, pp x v x m forwards and as many backwards (ZBV splits each backward
into two ops), in a schedule played op by op (pp > 1): Llama 3 405B's plan on 16,384 GPUs (PP
16, v = 4, m = 16) has 2,048. The simulator takes about 5 us an op and the widget plays the
schedule twice (this plan and the peak's; moving the efficiency replays only this plan's),
then draws (about 55 ms): at 2,048 ops, both played anew, a redraw took 76-113 ms (median per
schedule and pp) on the course's 2-core machine under a load of 2; twice the ops took
120-165 ms, over the 150 ms a redraw may take (``benchmarks/widget_redraw.py``)."""


@lru_cache(maxsize=64)
def _predict(job: transformer.Job, hw: Hardware) -> transformer.Prediction:
    """:func:`transformer.predict`, remembered: moving the efficiency leaves the peak's bar and
    going back to a plan redraws it without playing its schedule again."""
    return transformer.predict(job, hw)


def _seconds(x: float) -> str:
    """Three significant figures (5.94 s, 10.0 s, 0.000222 s), whole seconds from 100 s, and
    0 for what is below a nanosecond (a bubble of 3e-14 s is the sum's rounding)."""
    if abs(x) < 1e-9:
        return "0 s"
    return f"{x:.0f} s" if x >= 100 else f"{x:#.3g} s"


def _efficiency_slider(value: float) -> Any:
    """A FloatSlider from 0.3 to 1 (the preset's value kept exact, shown to two decimals)."""
    import ipywidgets as w

    return w.FloatSlider(value=value, min=EFFICIENCY[0], max=EFFICIENCY[1], step=0.01,
                         readout_format=".2f", description="achieved efficiency",
                         style={"description_width": "140px"}, layout=w.Layout(width="auto"),
                         continuous_update=False)


class StepTime(Explorer):
    """A Llama 3 model, hardware, TP, PP, DP, global batch, sequence length, schedule, achieved
    efficiency and recomputation -> the step's terms (``predict``), throughput and MFU; the
    figure stacks the terms for this plan and for the same plan at the peak."""

    prefix = "st"
    title = "One training step, term by term (lecture 13's model)"
    defaults = {"model": "405B", "hardware": "H100", "tp": 8, "pp": 16, "dp": 128,
                "global_batch": 2048, "seq_len": 8192, "schedule": "interleaved v=4",
                "efficiency": H100.efficiency, "recompute": "none"}
    figsize = (9.0, 3.2)
    alt = "one training step's time as stacked bars by term, this plan and at the peak"

    def _controls(self, v: dict[str, Any]) -> dict[str, Any]:
        self._hardware_seen = v["hardware"]
        return {"model": dropdown("model", [(w, k) for k, (w, _) in MODELS.items()],
                                  v["model"]),
                "hardware": dropdown("hardware", [(hw.name, k) for k, hw in HARDWARE.items()],
                                     v["hardware"]),
                "tp": choice_slider("tensor parallel tp", TPS, v["tp"]),
                "pp": choice_slider("pipeline stages pp", PPS, v["pp"]),
                "dp": choice_slider("data parallel dp", DPS, v["dp"]),
                "global_batch": choice_slider("global batch (seqs)", BATCHES,
                                              v["global_batch"]),
                "seq_len": choice_slider("sequence length", SEQ_LENS, v["seq_len"]),
                "schedule": dropdown("schedule", [(w, k) for k, (w, _, _) in SCHEDULES.items()],
                                     v["schedule"]),
                "efficiency": _efficiency_slider(v["efficiency"]),
                "recompute": dropdown("recomputation", [("none", "none"),
                                                        ("full (forward again)", "full")],
                                      v["recompute"])}

    def _adjust(self) -> None:
        """A new device brings the efficiency to its preset (the matmul rate measured on it)."""
        name = self.controls["hardware"].value
        if name != self._hardware_seen:
            self._hardware_seen = name
            self.controls["efficiency"].value = HARDWARE[name].efficiency

    def compute(self, model: str, hardware: str, tp: int, pp: int, dp: int, global_batch: int,
                seq_len: int, schedule: str, efficiency: float,
                recompute: str) -> dict[str, Any]:
        for name, value, allowed in (("model", model, MODELS), ("hardware", hardware, HARDWARE),
                                     ("schedule", schedule, SCHEDULES)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}; got {value!r}")
        if not EFFICIENCY[0] <= efficiency <= EFFICIENCY[1]:
            raise ValueError(f"efficiency must be from {EFFICIENCY[0]} to {EFFICIENCY[1]}; got "
                             f"{efficiency!r}")
        words, kind, v = SCHEDULES[schedule]
        job = transformer.Job(MODELS[model][1], tp=tp, pp=pp, dp=dp, global_batch=global_batch,
                              seq=seq_len, schedule=kind, v=v if kind == "interleaved" else 1,
                              recompute=recompute)
        ops = pp * v * job.m * (3 if kind == "zbv" else 2)
        if pp > 1 and ops > MAX_PIPELINE_OPS:
            raise ValueError(
                f"this widget plays schedules of at most {MAX_PIPELINE_OPS:,} ops (a forward "
                f"and a backward per stage, chunk and microbatch; ZBV's backward is two) to "
                f"stay quick; pp={pp} x v={v} x m={job.m} microbatches (global_batch / dp) "
                f"makes {ops:,}: raise dp or lower the global batch")
        hw = HARDWARE[hardware]
        plan = _predict(job, hw.but(efficiency=efficiency))
        peak = _predict(job, hw.but(efficiency=1.0))
        return {"model": model, "hardware": hw.name, "hardware_key": hardware,
                "schedule": words, "job": job, "efficiency": efficiency, "plan": plan,
                "peak": peak}

    def rows(self, s: dict[str, Any]) -> list[Row]:
        p, job = s["plan"], s["job"]
        terms = p.terms
        out = []
        for t in TERMS:
            value = f"{_seconds(getattr(terms, t))} ({getattr(terms, t) / terms.total:.1%})"
            if t == "dp_exposed":
                value += f"; {_seconds(terms.dp_hidden)} hidden"
            out.append(Row(t, WORDS[t], value))
        return out + [
            Row("step", "step (the terms' sum)", _seconds(terms.total)),
            Row("mesh", "GPUs (tp x pp x dp), microbatches per replica",
                f"{job.gpus:,}, m = {job.m}"),
            Row("tokens", "tokens/s per GPU", f"{p.tokens_per_s_per_gpu():,.0f}"),
            Row("mfu", "MFU (attention scores counted)", f"{p.mfu('attention'):.1%}"),
            Row("mfu-6n", "MFU (6N: parameters only)", f"{p.mfu('6N'):.1%}"),
            Row("peak", "the same plan at the peak (efficiency 1)",
                f"{_seconds(s['peak'].step_s)}, MFU {s['peak'].mfu('attention'):.1%}")]

    def notes(self, s: dict[str, Any]) -> list[str]:
        p, job = s["plan"], s["job"]
        hw = HARDWARE[s["hardware_key"]]
        if s["efficiency"] < 1:
            out = ["At the datasheet peak only the compute, and the bubble it makes, shrink; the "
                   "collectives do not, and less compute hides less of DP's: a plan priced at "
                   "the peak, not the achieved rate, looks faster than any run of it."]
        else:
            out = ["At efficiency 1 both bars are the plan priced at the datasheet peak, which "
                   f"no real matmul reaches ({hw.name}: {hw.efficiency:.2f} of it, measured)."]
        if job.pp == 1:
            out.append("With one pipeline stage there is no bubble: the schedule changes "
                       "nothing.")
        else:
            out.append(f"The bubble is {p.terms.bubble / p.step_s:.1%} of the step: more "
                       f"microbatches (a larger global batch or a smaller dp) or more chunks "
                       f"per rank shrink it.")
        return out

    def draw(self, s: dict[str, Any], fig: Any) -> None:
        plan, peak = s["plan"], s["peak"]
        bars = {f"this plan\n(efficiency {s['efficiency']:.2f})": plan.terms,
                "at the peak\n(efficiency 1)": peak.terms}
        ax = fig.add_axes((0.15, 0.25, 0.8, 0.45))
        job = s["job"]
        title = (f"{MODELS[s['model']][0]} on {job.gpus:,} {s['hardware_key']}: TP {job.tp}, "
                 f"PP {job.pp}" + (f" ({s['schedule'].split(' (')[0]})" if job.pp > 1 else "")
                 + f", DP {job.dp}" + (", full recompute" if job.recompute == "full" else ""))
        draw_terms(bars, ax=ax, unit="s", title=title)
        # matplotlib's own ticks are rebuilt at every redraw: the same axes as plain artists
        xlabel = ax.get_xlabel()
        ax.set_xlabel("")
        ax.set_yticks([])
        plain_axes(ax, nice_ticks(0, ax.get_xlim()[1]),
                   [(i, label) for i, label in enumerate(bars)], xlabel=xlabel)
        self.alt = (f"Stacked bars of one training step's time by term for {title}: "
                    + "; ".join(f"{label.replace(chr(10), ' ')} {_seconds(t.total)} ("
                                + ", ".join(f"{SHORT[k]} {_seconds(getattr(t, k))}"
                                            for k in TERMS) + ")"
                                for label, t in bars.items()) + ".")

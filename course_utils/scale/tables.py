"""Module 11's tables: the lesson's configurations, one step's traffic, whole jobs at scale.

Each function computes its figures (``scale_memory``, ``scale_comms``) and returns them with a
fixed-width text table the lecture prints; ``tests/test_scale.py`` checks the figures.
"""

from __future__ import annotations

import resource
import time
from typing import Any

from course_utils.models import llama_shapes
from course_utils.memory import sizing as memory
from course_utils.scale import comms as scale_comms
from course_utils.scale import memory as scale_memory

__all__ = ["LESSON", "PUBLISHED", "lesson_rows", "lesson_table", "draw_lesson", "comm_rows",
           "comm_table", "plan_rows", "plan_table", "STEP_SETTINGS", "step_rows", "step_table",
           "job_rows", "job_table", "rss_mb"]

# The lesson's figures (GB), for N = 7e9 on 8 GPUs and 70e9 on TP 4 x PP 2 x DP 4.
LESSON = {"DDP": 112.0, "ZeRO-1": 38.5, "ZeRO-2": 26.25, "ZeRO-3": 14.0, "70B 3-D": 35.0}

# Published configurations: (label, model, tp, pp, dp, source).
PUBLISHED = (
    ("lesson's 70B", "70B", 4, 2, 4, "the lesson"),
    ("405B, 1,024 ranks", "405B", 8, 16, 8, "Llama 3's TP and PP, DP 8"),
    ("Llama 3 405B", "405B", 8, 16, 128,
     "Llama Team 2024, Table 4: TP 8, PP 16, DP 128 on 16,384 GPUs (8K context)"),
)

_WHY = {
    "DDP": "N = 6.74e9, not 7e9",
    "ZeRO-1": "N = 6.74e9, not 7e9",
    "ZeRO-2": "N = 6.74e9, not 7e9",
    "ZeRO-3": "N = 6.74e9; FSDP2 keeps 4+4+8 B, not 2+2+12",
    "70B 3-D": "N = 68.98e9 (8 KV heads); norms whole under TP",
}


_PARTS = {"weights": "weights", "grads": "gradients", "optimizer": "optimizer state"}


def _gb(n: float) -> str:
    return f"{n / memory.GB:.2f}"


def lesson_rows() -> list[dict[str, Any]]:
    """One row per lesson configuration: lesson, course formula, simulated (bytes), why."""
    rows = []
    zero = {"DDP": 0, "ZeRO-1": 1, "ZeRO-2": 2, "ZeRO-3": 3}
    for name, stage in zero.items():
        formula = memory.zero_state_bytes(llama_shapes.param_count("7B"), 8, stage)["total"]
        if stage in (0, 3):
            sim = scale_memory.rank_state("7B", 1, 1, 8, 3, "ddp" if stage == 0 else "fsdp2")
            how = "replicas" if stage == 0 else "FSDP2"
        else:
            sim, how = scale_memory.course_zero("7B", 8, stage), "course"
        rows.append({"config": f"7B {name}, 8 ranks", "key": name, "lesson": LESSON[name],
                     "formula": formula, "simulated": sim["total"], "how": how,
                     "parts": {k: sim[k] for k in _PARTS}})
    stages = [scale_memory.rank_state("70B", 4, 2, 4, r) for r in (0, 31)]
    largest = max(stages, key=lambda st: st["total"])
    rows.append({"config": "70B TP4xPP2xDP4", "key": "70B 3-D", "lesson": LESSON["70B 3-D"],
                 "formula": scale_memory.course_formula("70B", 4, 2, 4, 3),
                 "simulated": largest["total"], "how": "FSDP2+TP",
                 "stages": [s["total"] for s in stages],
                 "parts": {k: largest[k] for k in _PARTS}})
    for row in rows:
        row["why"] = _WHY[row["key"]]
    return rows


def lesson_table(rows: list[dict[str, Any]]) -> str:
    """The closing note's table (GB per rank)."""
    lines = [f"{'configuration':<20}{'lesson':>8}{'formula':>9}{'simulated':>10}  "
             f"{'by':<9}why they differ"]
    for r in rows:
        lines.append(f"{r['config']:<20}{r['lesson']:>8.2f}{_gb(r['formula']):>9}"
                     f"{_gb(r['simulated']):>10}  {r['how']:<9}{r['why']}")
    return "\n".join(lines)


def draw_lesson(rows: list[dict[str, Any]], ax: Any = None) -> Any:
    """Figure: each configuration's simulated bytes on its largest rank, stacked by state
    (weights, gradients, optimizer state; GB), with the lesson's figure marked. Returns it."""
    import matplotlib.pyplot as plt

    from course_utils.style import STATE_COLORS

    if ax is None:
        _, ax = plt.subplots(figsize=(8.4, 0.5 * len(rows) + 1.5), layout="constrained")
    for y, row in enumerate(rows):
        left = 0.0
        for part, words in _PARTS.items():
            gb = row["parts"][part] / memory.GB
            ax.barh(y, gb, left=left, height=0.6, color=STATE_COLORS[part],
                    label=words if y == 0 else None)
            left += gb
        ax.text(max(left, row["lesson"]) + 1.5, y, f"{left:.2f} GB ({row['how']})",
                va="center", fontsize=8)
        ax.plot([row["lesson"]] * 2, [y - 0.38, y + 0.38], color="black", lw=2,
                label="the lesson's figure" if y == 0 else None)
    ax.set_yticks(range(len(rows)), [r["config"] for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, max(r["lesson"] for r in rows) * 1.4)
    ax.set(xlabel="GB on the rank that holds the most",
           title="Simulated bytes per rank by state, beside the lesson's figure")
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    return ax.figure


def comm_rows(model: str, tp: int, pp: int, dp: int, rank: int = 0, batch: int = 1,
              seq: int = 4096) -> tuple[list[tuple], dict[str, Any]]:
    """(axis, kind, calls, simulated GB sent, course GB sent) for ``rank``; and the trace."""
    trace = scale_comms.trace_step(model, tp, pp, dp, rank, batch, seq)
    course = scale_comms.course_comms(model, tp, pp, dp, rank, batch, seq)
    keys = sorted(set(trace["rows"]) | set(course))
    rows = [(axis, kind, trace["rows"].get((axis, kind), {}).get("calls", 0),
             trace["rows"].get((axis, kind), {}).get("sent", 0.0) / memory.GB,
             course.get((axis, kind), 0.0) / memory.GB) for axis, kind in keys]
    return rows, trace


def plan_rows(model: str, tp: int, pp: int, dp: int, rank: int = 0, batch: int = 1,
              seq: int = 4096) -> list[tuple[str, str, int, float]]:
    """(TP plan, collective, calls, GB sent) of one step's TP traffic on ``rank``, traced under
    each of ``llama_shapes.TP_PLANS``."""
    rows = []
    for plan in llama_shapes.TP_PLANS:
        trace = scale_comms.trace_step(model, tp, pp, dp, rank, batch, seq, tp_plan=plan)
        rows += [(plan, kind, v["calls"], v["sent"] / memory.GB)
                 for (axis, kind), v in sorted(trace["rows"].items()) if axis == "tp"]
    return rows


def plan_table(rows: list[tuple[str, str, int, float]]) -> str:
    """:func:`plan_rows` as text, with each plan's total."""
    lines = [f"{'TP plan':<12}{'collective':<16}{'calls':>6}{'GB sent':>9}"]
    for plan in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == plan]
        lines += [f"{plan if k == 0 else '':<12}{kind:<16}{calls:>6}{gb:>9.2f}"
                  for k, (_, kind, calls, gb) in enumerate(mine)]
        lines.append(f"{'':<12}{'in all':<16}{sum(r[2] for r in mine):>6}"
                     f"{sum(r[3] for r in mine):>9.2f}")
    return "\n".join(lines)


STEP_SETTINGS = (("one microbatch", 1, True), ("step, FSDP2 default", None, True),
                 ("step, torchtitan PP", None, False))


def step_rows(model: str, tp: int, pp: int, dp: int, rank: int = 0, microbatches: int = 4,
              batch: int = 1, seq: int = 4096) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(axis, kind) -> ``[(calls, GB sent)]`` for each of :data:`STEP_SETTINGS`: one
    microbatch; a step of ``microbatches`` with FSDP2 resharding each layer after forward;
    the same step with no reshard after forward (torchtitan's ``not pp_enabled``). The PP
    sends are the course's count (one activation each way per microbatch: not traced)."""
    pp_sent = scale_comms.course_comms(model, tp, pp, dp, rank, batch, seq).get(("pp", "send"))
    stage = scale_memory.mesh_coords(rank, tp, pp, dp)["pp"]
    sends = (stage > 0) + (stage < pp - 1)           # activations out, gradients back
    out: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for k, (_, m, reshard) in enumerate(STEP_SETTINGS):
        m = m or microbatches
        rows = dict(scale_comms.trace_step(model, tp, pp, dp, rank, batch, seq, microbatches=m,
                                           reshard_after_forward=reshard)["rows"])
        if pp_sent:
            rows[("pp", "send")] = {"calls": m * sends, "sent": m * pp_sent}
        for key, v in rows.items():
            out.setdefault(key, [(0, 0.0)] * len(STEP_SETTINGS))[k] = (v["calls"],
                                                                       v["sent"] / memory.GB)
    return dict(sorted(out.items()))


def step_table(rows: dict[tuple[str, str], list[tuple[int, float]]]) -> str:
    """:func:`step_rows` as text: calls and GB sent under each setting."""
    lines = [f"{'':<21}" + "".join(f"{label:>22}" for label, _, _ in STEP_SETTINGS),
             f"{'axis':<5}{'collective':<16}" + f"{'calls':>12}{'GB sent':>10}" * 3]
    for (axis, kind), cells in rows.items():
        lines.append(f"{axis:<5}{kind:<16}" + "".join(f"{calls:>12}{gb:>10.2f}"
                                                      for calls, gb in cells))
    return "\n".join(lines)


def comm_table(rows: list[tuple]) -> str:
    lines = [f"{'axis':<5}{'collective':<16}{'calls':>6}{'simulated GB':>14}{'course GB':>11}"]
    for axis, kind, calls, sim, course in rows:
        traced = f"{sim:.3f}" if calls else "not traced"
        lines.append(f"{axis:<5}{kind:<16}{calls:>6}{traced:>14}{course:>11.3f}")
    return "\n".join(lines)


def rss_mb() -> float:
    """This process's peak resident memory so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


def job_rows(configs=PUBLISHED) -> list[dict[str, Any]]:
    """Per-rank state of whole jobs: min and max over ranks, the course formula, the time."""
    rows = []
    for label, model, tp, pp, dp, source in configs:
        start = time.perf_counter()
        job = scale_memory.job_table(model, tp, pp, dp)
        rows.append({"label": label, "model": model, "mesh": (tp, pp, dp),
                     "ranks": tp * pp * dp, "min": job["min"], "max": job["max"],
                     "formula": job["formula"], "by_rank": job["ranks"], "source": source,
                     "seconds": time.perf_counter() - start})
    return rows


def job_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'job':<19}{'TPxPPxDP':>11}{'ranks':>7}{'min GB':>8}{'max GB':>8}"
             f"{'formula':>9}"]
    for r in rows:
        mesh = "x".join(str(v) for v in r["mesh"])
        lines.append(f"{r['label']:<19}{mesh:>11}{r['ranks']:>7,}{_gb(r['min']):>8}"
                     f"{_gb(r['max']):>8}{_gb(r['formula']):>9}")
    return "\n".join(lines)

"""What a measured run comes to: per-rank rows, tokens/s, wait share, predicted bytes, tables.

Lecture 7, step 2 (measure): the share of a step spent waiting, the bytes a ring all-reduce
should send, and a plain text table.

:func:`summarize` turns :func:`course_utils.measure.step.dp_train` results into one row per
rank; :func:`format_table` prints such rows. :func:`predicted_allreduce_bytes` is the prediction
to set beside the bytes measured (a ring all-reduce sends ``2 (D-1)/D x bytes`` per rank:
:func:`course_utils.collectives.cost.ring_bytes`), with :mod:`course_utils.memory.sizing`
(``state_bytes``, ``zero_state_bytes``) for memory.
"""

from __future__ import annotations

from typing import Any, Sequence

from course_utils.collectives import cost
from course_utils.measure.spec import PHASES
from course_utils.runtime import validate

__all__ = ["predicted_allreduce_bytes", "throughput", "wait_fraction", "summarize",
           "format_table"]


def predicted_allreduce_bytes(n_bytes: float, world_size: int) -> float:
    """Bytes each rank sends in a ring all-reduce of ``n_bytes``: 2 (D-1)/D x n_bytes."""
    validate.check_real("n_bytes", n_bytes, 0, strict=False)
    validate.check_int("world_size", world_size)
    return cost.ring_bytes("all_reduce", n_bytes, world_size)


def throughput(tokens: float, seconds: float) -> float:
    """Tokens per second: tokens / seconds."""
    for name, value in (("tokens", tokens), ("seconds", seconds)):
        validate.check_real(name, value, 0)
    return tokens / seconds


def wait_fraction(wait_s: float, step_s: float) -> float:
    """Fraction of a step spent inside collectives: wait_s / step_s, from 0 to 1."""
    for name, value in (("wait_s", wait_s), ("step_s", step_s)):
        validate.check_real(name, value, 0, strict=False)
    if step_s == 0 or wait_s > step_s:
        raise ValueError(f"need 0 <= wait_s <= step_s and step_s > 0; got wait_s={wait_s}, "
                         f"step_s={step_s}")
    return wait_s / step_s


def summarize(results: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
    """One row per rank from :func:`course_utils.measure.step.dp_train` results (warm-up steps
    left out).

    Columns: ``rank``, mean milliseconds per phase and per step (``step_ms``), ``tokens_per_s``
    (this rank's tokens / its mean step time), ``global_tokens_per_s`` (global batch tokens /
    the slowest rank's mean step time), ``wait_fraction``, ``idle_ms`` (wait beyond the
    fastest rank's wait in the same step: time spent waiting for a peer rather than moving
    bytes), ``bytes_sent`` per step.
    """
    if not results or not all(isinstance(r, dict) and "steps" in r for r in results):
        raise ValueError("results must be the list dp_train returns from launch.run (one per rank)")
    skip = results[0]["spec"]["warmup_steps"]
    steps = [r["steps"][skip:] for r in results]
    n = len(steps[0])
    min_wait = [min(s[i]["wait"] for s in steps) for i in range(n)]
    mean_step = [sum(rec["step_s"] for rec in s) / n for s in steps]
    global_tokens = results[0]["spec"]["global_batch"] * results[0]["spec"]["cfg"]["seq_len"]
    rows = []
    for r, s in zip(results, steps):
        row: dict[str, float] = {"rank": r["rank"]}
        for phase in PHASES:
            row[f"{phase}_ms"] = 1e3 * sum(rec[phase] for rec in s) / n
        row["step_ms"] = 1e3 * sum(rec["step_s"] for rec in s) / n
        row["tokens_per_s"] = s[0]["local_tokens"] / (row["step_ms"] / 1e3)
        row["global_tokens_per_s"] = global_tokens / max(mean_step)
        row["wait_fraction"] = row["wait_ms"] / row["step_ms"]
        row["idle_ms"] = 1e3 * sum(rec["wait"] - m for rec, m in zip(s, min_wait)) / n
        row["bytes_sent"] = sum(rec["bytes_sent"] for rec in s) / n
        rows.append(row)
    return rows


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None,
                 digits: int = 2, headers: dict[str, str] | None = None) -> str:
    """Rows of dicts as an aligned text table (floats with ``digits`` decimals).

    ``headers`` maps a column to the words shown above it (``{"forward_ms": "forward"}``), to
    keep a table narrow; a column it leaves out shows its own name.
    """
    if not rows:
        raise ValueError("rows must be a non-empty list of dicts")
    columns = list(columns or rows[0].keys())
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise ValueError(f"columns not in rows: {missing}; available: {list(rows[0])}")
    headers = headers or {}

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "nan" if v != v else f"{v:,.{digits}f}"
        return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)

    names = [str(headers.get(c, c)) for c in columns]
    body = [[cell(r[c]) for c in columns] for r in rows]
    widths = [max(len(n), *(len(b[i]) for b in body)) for i, n in enumerate(names)]
    lines = ["  ".join(n.rjust(w) for n, w in zip(names, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(b, widths)) for b in body]
    return "\n".join(lines)

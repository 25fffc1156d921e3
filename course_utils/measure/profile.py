"""What ``torch.profiler`` saw on each rank: phase totals and the top operators.

As rows and as one table with the ranks side by side (lecture 7, step 3: profile).

:func:`profile_rows` summarises one rank's profile (:func:`course_utils.measure.step.dp_train`
calls it with ``RunSpec(profile=True)``); :func:`profile_table` sets the ranks' rows side by
side. The wait for a gloo collective shows up as *self time* of the enclosing ``wait`` region,
not under an operator.
"""

from __future__ import annotations

from typing import Any, Sequence

from course_utils.measure.spec import PHASES
from course_utils.runtime import validate

__all__ = ["profile_rows", "profile_table"]


def profile_rows(prof: Any, n_steps: int = 1, top: int = 6) -> list[dict[str, Any]]:
    """``torch.profiler`` results as rows ``{"name", "kind", "calls", "ms_per_step"}``.

    Phase regions (``kind="phase"``, total time, self time inside ``wait`` is the blocking wait)
    come first, then the ``top`` operators by self CPU time (``kind="op"``).
    """
    validate.check_int("n_steps", n_steps)
    events = list(prof.key_averages())
    rows = []
    for phase in PHASES:
        for e in events:
            if e.key == f"phase:{phase}":
                rows.append({"name": phase, "kind": "phase", "calls": e.count // n_steps,
                             "ms_per_step": e.cpu_time_total / 1e3 / n_steps})
    ops = sorted((e for e in events if not e.key.startswith(("phase:", "ProfilerStep"))),
                 key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    for e in ops:
        rows.append({"name": e.key, "kind": "op", "calls": e.count // n_steps,
                     "ms_per_step": e.self_cpu_time_total / 1e3 / n_steps})
    return rows


def profile_table(results: Sequence[dict[str, Any]], top: int = 3, digits: int = 2) -> str:
    """The profiles of all ranks side by side: milliseconds per step, one column per rank.

    ``results`` is what :func:`course_utils.measure.step.dp_train` with ``RunSpec(profile=True)``
    returns (one per rank). The phase rows come first (total time of each phase), then the
    operators among the ``top`` by self time on any rank; ``-`` where that operator is not among
    a rank's recorded ones.
    """
    if not results or not all(isinstance(r, dict) and r.get("profile") for r in results):
        raise ValueError("results must be the list dp_train returns with RunSpec(profile=True)")
    validate.check_int("top", top, 0)
    by_rank = [{(row["kind"], row["name"]): row["ms_per_step"] for row in r["profile"]}
               for r in results]
    ops: list[str] = []
    for r in results:
        for row in [row for row in r["profile"] if row["kind"] == "op"][:top]:
            if row["name"] not in ops:
                ops.append(row["name"])
    ops.sort(key=lambda name: -max(t.get(("op", name), 0.0) for t in by_rank))
    keys = [("phase", p) for p in PHASES if any(("phase", p) in t for t in by_rank)]
    keys += [("op", name) for name in ops]
    first = "ms per step"
    names = [first] + [f"rank {r['rank']}" for r in results]
    body = [[name] + [f"{t[(kind, name)]:,.{digits}f}" if (kind, name) in t else "-"
                      for t in by_rank] for kind, name in keys]
    widths = [max(len(names[0]), len("operators (self time)"), *(len(b[0]) for b in body))]
    widths += [max(len(n), *(len(b[i]) for b in body)) for i, n in enumerate(names) if i]
    lines = ["  ".join([names[0].ljust(widths[0])] + [n.rjust(w) for n, w in
                                                      zip(names[1:], widths[1:])])]
    for i, b in enumerate(body):
        if ops and i == len(keys) - len(ops):
            lines.append("operators (self time)")
        lines.append("  ".join([b[0].ljust(widths[0])] + [v.rjust(w) for v, w in
                                                          zip(b[1:], widths[1:])]))
    return "\n".join(lines)

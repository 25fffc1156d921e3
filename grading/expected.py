"""What a judge expects, per variant (issue 26): read from the judge functions themselves.

A judge function of numbers and choices calls ``check_number`` / ``check_choice`` with the
expected value and the known mistakes it computes from the student's givens. Run with
stand-ins that record those calls instead of deciding (:func:`checked`), it says what a variant
expects: the tests go through every variant a test cell can meet (:func:`variant_tour`) to
check that each known mistake stays wrong and named, the synthetic class copies a peer's right
values (:func:`right_values`), and the report asks whether an answer is worth comparing across
the class. Judge functions of real-rank cells or hidden cases are not of this kind.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from grading.judge import Values


class _Recorder:
    """Stands in for a judge module's check_number / check_choice: records each call."""

    def __init__(self):
        self.calls: list[dict] = []

    def number(self, name, value, expected=None, *, mistakes=(), rel=1e-3, abs_tol=0.0, **kw):
        self.calls.append(dict(kind="number", name=name, expected=expected,
                               mistakes=list(mistakes), rel=rel, abs_tol=abs_tol))

    def choice(self, name, value, expected, allowed, *, mistakes=None, **kw):
        self.calls.append(dict(kind="choice", name=name, expected=expected,
                               mistakes=list((mistakes or {}).items()), allowed=list(allowed)))


class _Anything(Values):
    """A ``got`` whose every name reads as 0 (the stand-ins ignore the values)."""

    def __missing__(self, name):
        return 0.0


class _Checks:
    """A judge's ``checks`` module with the two check functions recording."""

    def __init__(self, module, rec: _Recorder):
        self._module, self.check_number, self.check_choice = module, rec.number, rec.choice

    def __getattr__(self, name):
        return getattr(self._module, name)


def checked(rules: ModuleType, grade_id: str, givens: Any) -> list[dict]:
    """What the judge function ``grade_id`` checks for these ``givens``: one record per
    ``check_number`` / ``check_choice`` call (``name``, ``expected``, ``mistakes``, the
    tolerances), read by running it with stand-ins that record instead of deciding (the judge
    module's own ``check_number`` / ``check_choice`` and its ``checks.*``). For the judge
    functions of numbers and choices (not those of real-rank cells or hidden cases)."""
    rec = _Recorder()
    saved = {n: getattr(rules, n) for n in ("check_number", "check_choice", "checks")
             if hasattr(rules, n)}
    stand_ins = {"check_number": rec.number, "check_choice": rec.choice}
    if "checks" in saved:
        stand_ins["checks"] = _Checks(saved["checks"], rec)
    for n in saved:
        setattr(rules, n, stand_ins[n])
    try:
        got = _Anything()
        got.givens = givens
        getattr(rules, grade_id)(got, got)
    finally:
        for n, v in saved.items():
            setattr(rules, n, v)
    return rec.calls


def _number_cells(rules: ModuleType) -> list[str]:
    return [g for g in dir(rules) if g.endswith("_test") and callable(getattr(rules, g))
            and g not in getattr(rules, "HIDDEN_CASES", {})]


def givens_read(rules: ModuleType, assignment: str, grade_id: str) -> set[str] | None:
    """The names of the givens the judge function ``grade_id`` reads (None: not a judge of
    checks alone)."""
    from course_utils.assess import variants

    read: set = set()

    class Tracked(variants.Givens):
        def __getattr__(self, key):
            if not key.startswith("_"):
                read.add(key)
            return super().__getattr__(key)

        def __getitem__(self, key):
            read.add(key)
            return super().__getitem__(key)

    try:
        checked(rules, grade_id, Tracked(assignment, variants.base(assignment), "any"))
    except Exception:  # noqa: BLE001 - a judge that reads more than checks: not this kind
        return None
    return read


def variant_tour(rules: ModuleType, assignment: str) -> list[tuple[str, Any]]:
    """``(grade_id, Givens)`` for every test cell judged by checks alone and every combination
    of the givens that cell's judge reads, the other givens at their base (the whole space a
    cell can meet, without the product over unrelated questions)."""
    from course_utils.assess import variants

    base = variants.base(assignment)
    out = []
    for gid in _number_cells(rules):
        read = givens_read(rules, assignment, gid)
        if read is None:
            continue
        for values in variants.every_variant(assignment, sorted(read)):
            out.append((gid, variants.Givens(assignment, {**base, **values}, "any")))
    return out


def right_values(rules: ModuleType, givens: Any) -> dict[str, dict[str, Any]]:
    """``{grade_id: {name: right value}}`` of every test cell judged by checks alone, for these
    givens (what one student's variant expects: the synthetic class copies a peer's)."""
    out = {}
    for gid in _number_cells(rules):
        try:
            calls = checked(rules, gid, givens)
        except Exception:  # noqa: BLE001 - a judge that reads more than checks: not this kind
            continue
        if calls:
            out[gid] = {c["name"]: c["expected"] for c in calls}
    return out

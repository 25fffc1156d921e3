"""Every visible check of every assignment, for every variant it is sealed for (issue 35):
the right answer passes, and no check is an oracle. Value level: the release's sealed tables
and the judge's own expectations, no kernel.

A visible check rejects, without an expected value, the known mistakes of the student's own
numbers (sealed per variant by the release). Two ways it could fail a student, both once seen:

* it rejects a right answer: a7's seals were built from the base tables for every variant
  (the reference run re-ran the answer cells but not the cell that builds ``RUN_A`` from
  ``G``), so 3 of its 8 ``run_a`` tables told a right q5 "that rank waits the longest";
* it singles out the answer: a3 Q3's check rejected every stage that does not fit, so the
  smallest stage it accepted *was* the answer, for all 8 variants.

The right answer of each variant comes from the judge (``grading.expected``), independently
of the reference run that built the seals.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from course_utils.assess import givens as assignment_givens
from course_utils.assess import checks
from course_utils.assess import variants
from grading import expected, integrity, judge, visible

ROOT = Path(__file__).resolve().parent.parent
ASSIGNMENTS = sorted(p.stem for p in (ROOT / "authoring" / "assignments").glob("*.py"))


def _base(assignment: str) -> variants.Givens:
    values = variants.base(assignment) if assignment in assignment_givens.GIVENS else {}
    return variants.Givens(assignment, values, "any")


def _givens_of(assignment: str, key: str) -> variants.Givens | None:
    """The givens whose ``key(...)`` is ``key`` (the other givens at their base)."""
    names = [part.split("=", 1)[0] for part in key.split(";")]
    base = _base(assignment)
    for values in variants.every_variant(assignment, names):
        g = base.replaced(**values)
        if g.key(*names) == key:
            return g
    return None


def _cells(assignment: str):
    """``(grade_id, {name@variant: Sealed})`` of each released test cell with sealed mistakes."""
    release = nbformat.read(ROOT / "assignments" / assignment / f"{assignment}.ipynb",
                            as_version=4)
    for cell in release.cells:
        if integrity.is_test_cell(cell):
            table = visible.sealed_tables(cell.source)
            if table:
                yield integrity._meta(cell)["grade_id"], table


def _passes(name: str, value, sealed: checks.Sealed, variant: str, allowed=None) -> bool:
    try:
        if sealed.grid == "choice":
            checks.check_choice(name, value, None, allowed or [value], variant=variant)
        else:
            checks.check_number(name, value, variant=variant)
    except AssertionError:
        return False
    return True


def _tour(assignment: str):
    """``(grade_id, name, variant, Givens, Sealed)`` for every sealed entry with a variant."""
    for gid, table in _cells(assignment):
        for entry, sealed in table.items():
            name, _, key = entry.partition("@")
            givens = _givens_of(assignment, key) if key else _base(assignment)
            yield gid, name, key, givens, sealed


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_every_variants_right_answer_passes_its_visible_check(name):
    """For every sealed (question, variant): the judge's right value for that variant's
    numbers passes the visible check of the release."""
    rules = judge.load(name)
    checked, refused = 0, []
    try:
        for gid, vname, key, givens, sealed in _tour(name):
            assert givens is not None, f"{name} {gid}: no variant has the key {key!r}"
            right = expected.right_values(rules, givens).get(gid, {})
            if vname not in right:
                continue  # (judged on hidden cases or real ranks: no single right value)
            checks._SEALED.clear()
            checks.sealed_mistakes({f"{vname}@{key}" if key else vname: sealed})
            if not _passes(vname, right[vname], sealed, key):
                refused.append(f"{gid} {vname} = {right[vname]!r} for {key or 'the base'}")
            checked += 1
    finally:
        checks._SEALED.clear()
    assert refused == [], f"{name}: visible checks reject right answers: {refused}"
    if integrity.givens_for(name, None) is not None and any(True for _ in _cells(name)):
        assert checked > 0


def _domain(call: dict) -> list | None:
    """The values a student can try for one checked answer: a choice's allowed list, or the
    integers up to just past the answer and its known mistakes (a rank, a stage, a count)."""
    if call["kind"] == "choice":
        return list(call["allowed"] or [])
    values = [call["expected"], *(w for w, _ in call["mistakes"])]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer()
           and 0 <= v < 64 for v in values):
        return list(range(int(max(values)) + 2))
    return None


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_no_visible_check_singles_out_the_answer(name):
    """Where a student can try every value (a choice, a small integer), the values a visible
    check accepts must not give the answer away: more than one is accepted, and the answer is
    not always the smallest, nor always the largest, of those accepted (while it varies)."""
    rules = judge.load(name)
    seen: dict[tuple[str, str], list[tuple]] = {}
    try:
        for gid, vname, key, givens, sealed in _tour(name):
            if givens is None:
                continue
            try:
                calls = [c for c in expected.checked(rules, gid, givens) if c["name"] == vname]
            except Exception:  # noqa: BLE001 - a judge that reads more than checks: not this kind
                continue
            domain = _domain(calls[0]) if calls else None
            if not domain:
                continue
            checks._SEALED.clear()
            checks.sealed_mistakes({f"{vname}@{key}" if key else vname: sealed})
            accepted = [v for v in domain if _passes(vname, v, sealed, key, domain)]
            seen.setdefault((gid, vname), []).append((calls[0]["expected"], accepted))
    finally:
        checks._SEALED.clear()
    oracles = []
    for (gid, vname), rows in seen.items():
        if any(len(accepted) < 2 for _, accepted in rows):
            oracles.append(f"{gid} {vname}: accepts only one value")
        varies = len({repr(answer) for answer, _ in rows}) > 1
        for end in (min, max):
            if varies and all(answer == end(accepted) for answer, accepted in rows):
                oracles.append(f"{gid} {vname}: the {end.__name__} value it accepts is the "
                               f"answer, for all {len(rows)} variants")
    assert oracles == [], f"{name}: visible checks that give the answer away: {oracles}"


def test_the_committed_sealer_keeps_a_table_only_when_it_is_the_same(tmp_path):
    """``visible.committed_sealer`` (the release-in-sync test's cheap path) returns a committed
    table only when sealing would make the same: a changed message, a mistake moved to another
    bin, a mistake more or a grid changed all give a fresh seal, which then differs."""
    wrongs = [(26.25 * 1.07, "that is GiB"), (52.5, "that counts the gradients twice")]
    table = {"q2_gb": checks.seal("q2_gb", "log:0.001", wrongs)}
    (tmp_path / "a0.json").write_text(visible.tables_json({"q2_test": table}))
    cell = nbformat.v4.new_code_cell(visible._sealed_head("a0", "q2_test") + "check(q2_gb)\n")
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": "q2_test", "points": 1,
                                 "locked": True, "solution": False, "schema_version": 3}
    committed = nbformat.v4.new_notebook(cells=[cell])
    assert visible.sealed_tables(cell.source, tmp_path)["q2_gb"].entries == \
        table["q2_gb"].entries
    sealer = visible.committed_sealer(committed, tmp_path)
    kept = sealer("q2_gb", "log:0.001", wrongs)
    assert kept.entries == table["q2_gb"].entries
    for name, grid, changed in [
            ("q2_gb", "log:0.001", [wrongs[0], (52.5, "that counts the weights twice")]),
            ("q2_gb", "log:0.001", [wrongs[0], (53.5, wrongs[1][1])]),
            ("q2_gb", "log:0.001", wrongs + [(13.125, "that is half")]),
            ("q2_gb", "log:0.01", wrongs), ("q3_gb", "log:0.001", wrongs)]:
        fresh = sealer(name, grid, changed)
        assert fresh.entries == checks.seal(name, grid, changed).entries
        assert fresh.entries != table["q2_gb"].entries

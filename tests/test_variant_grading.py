"""Per-student variants (issue 26), the grader's side: the kernel gets the student id; every
variant of every assignment with givens keeps its known mistakes wrong, apart from its answer
and named by their own messages; the reference solution, run with 20 students' numbers,
passes its judge for each. (The class graded on its own numbers, copies and typed identities
named: tests/test_grading_integrity.py, on the shared autograde.)"""

from __future__ import annotations

import pytest

from conftest import numbers_in
from course_utils.assess import givens as assignment_givens
from course_utils.assess import variants
from course_utils.assess.checks import CheckFailed
from grading import expected, judge

WITH_GIVENS = sorted(assignment_givens.GIVENS)


def test_the_grader_hands_the_student_to_the_kernel_environment():
    """The sandbox's environment carries COURSE_STUDENT only when the grader sets it (the
    kernel's whole environment is ENVIRONMENT's names: its allowlist says why this one is)."""
    from grading import sandbox

    assert "COURSE_STUDENT" not in sandbox.environment()
    env = sandbox.environment(student="alice")
    assert env["COURSE_STUDENT"] == "alice" and "COURSE_STUDENT" in sandbox.ENVIRONMENT
    assert sandbox.environment(student="")["COURSE_STUDENT"] == ""   # variants off: base


def _got(calls, givens, replace=None) -> judge.Values:
    values = {c["name"]: c["expected"] for c in calls}
    values.update(replace or {})
    got = judge.Values(values.items())
    got.givens = givens
    return got


def _close(call):
    if call["kind"] == "choice":
        return lambda a, b: a == b
    return lambda a, b: abs(a - b) <= max(call["rel"] * max(abs(a), abs(b)), call["abs_tol"])


@pytest.mark.parametrize("name", WITH_GIVENS)
def test_every_variant_keeps_its_mistakes_wrong_and_apart(name):
    """For every test cell judged on the givens and every combination of the givens its judge
    reads (``judge.variant_tour``): the right values pass the judge; each known mistake is
    outside the answer's tolerance and apart from every other mistake of the same check; and
    submitting it fails with its own message (so the misconception is named exactly for every
    variant). Every given is read by some judge function (a given that changes nothing would be
    a variant in name only)."""
    rules = judge.load(name)
    tour = expected.variant_tour(rules, name)
    judged, cells = 0, set()
    for gid, givens in tour:
        calls = expected.checked(rules, gid, givens)
        getattr(rules, gid)(_got(calls, givens), None)  # the right values pass
        for call in calls:
            close, where = _close(call), f"{name} {gid} {call['name']} with {dict(givens)}"
            wrongs = [w for w, _ in call["mistakes"]]
            for i, (wrong, message) in enumerate(call["mistakes"]):
                assert not close(wrong, call["expected"]), f"{where}: {message!r} = answer"
                for other in wrongs[i + 1:]:
                    assert not close(wrong, other), f"{where}: two mistakes coincide ({wrong})"
                with pytest.raises(CheckFailed) as failed:
                    getattr(rules, gid)(_got(calls, givens, {call["name"]: wrong}), None)
                assert message in str(failed.value), (where, str(failed.value))
                judged += 1
        cells.add(gid)
    varied = {n for _, g in tour for n in g if g[n] != variants.base(name)[n]}
    assert varied == set(variants.givens_of(name)), (
        f"givens no judge reads: {set(variants.givens_of(name)) - varied}")
    assert judged > len(tour) > len(cells)


@pytest.mark.slow
@pytest.mark.parametrize("name", WITH_GIVENS)
def test_the_reference_passes_its_judge_for_20_students(name, reference):
    """The reference solution's run goes on to 20 students' numbers (20 distinct variants, as
    the grader's kernel draws them: ``grading.reference.judge_tour``), re-running every cell
    that reads the givens (or what a cell built from them) and every test cell of numbers; each
    test cell's values pass its judge for every student: the solution notebook and the judge
    agree on every variant, and the base numbers' answers are wrong for a student wherever
    that student's answers differ."""
    from grading import reference as ref_run

    [run] = reference(name).values()
    students = run["tour"]["students"]
    assert list(students) == ref_run.tour_students(name) and len(students) == 20
    rules = judge.load(name)
    drawn = set(getattr(rules, "HIDDEN_CASES", {}))
    tested = {g for g in run["submissions"] if g not in drawn}
    assert tested, f"{name}: no test cell of numbers"
    changed = 0
    for student, cells in students.items():
        g = variants.givens(name, student=student)
        assert set(cells) == tested, (student, set(cells) ^ tested)
        for gid, (subs, error) in cells.items():
            subs = [tuple(p) for p in subs]
            verdict = judge.judge_cell(rules, gid, subs, subs, error and tuple(error), givens=g)
            assert verdict.passed, (student, dict(g), gid, verdict.message)
            base = [tuple(p) for p in run["submissions"][gid]]
            if subs != base:  # the base numbers' values are wrong for this student
                changed += 1
                assert not judge.judge_cell(rules, gid, base, base, givens=g).passed, (
                    student, gid)
    assert changed, f"{name}: no student's answers differ from the base numbers'"


def test_the_identity_shown_is_read_from_hostile_outputs_without_failing():
    """The report reads whose numbers a submission showed from its own outputs (hostile): any
    shape of output or source gives an identity, the base numbers or nothing, never an error."""
    import nbformat

    from grading import integrity

    def nb(source, outputs):  # (as read from a submission: not validated)
        cell = {"cell_type": "code", "source": source, "outputs": outputs, "metadata": {}}
        first = {"cell_type": "code", "source": "x = 1", "outputs": [], "metadata": {}}
        return nbformat.from_dict({"cells": [first, cell], "metadata": {}, "nbformat": 4,
                                   "nbformat_minor": 5})

    shown = 'G = variants.givens("a3_zero", on=True)'
    good = {"output_type": "execute_result", "execution_count": 1, "metadata": {},
            "data": {"text/plain": "Your numbers for a3_zero (student bob): q1 = 6e9, 16"}}
    assert integrity.worked_as(nb(shown, [good])) == "bob"
    base = dict(good, data={"text/plain": ["Your numbers for a3_zero ", "(the base numbers): "]})
    assert integrity.worked_as(nb(shown, [base])) == ""
    for outputs in ([], [{"data": ["x"]}], [{"data": {"text/plain": 7}}], ["text"], None, 3,
                    [{"data": {"text/plain": [1, None]}}]):
        assert integrity.worked_as(nb(shown, outputs)) is None, outputs
    assert integrity.worked_as(nb('G = variants.givens("a3_zero", on=ON)', [good])) is None
    assert integrity.worked_as(nb("G = 1", [good])) is None
    weird = nb(shown, [good])
    weird.cells[1]["source"] = 42
    assert integrity.worked_as(weird) is None


UNIT_FACTORS = (1, 60, 3600, 100, 1e3, 1e6, 1e9, 2**20, 2**30)  # (and their inverses)


def _numbers(value) -> list[float]:
    """The numbers in a submitted (encoded) value or a given."""
    return numbers_in(value if isinstance(value, tuple) else judge.decode(value))


@pytest.mark.slow
@pytest.mark.parametrize("name", WITH_GIVENS)
def test_no_released_test_cell_leaves_a_graded_value_in_the_kernel(name, reference):
    """Issue 50, finding 2: each released test cell of numbers, run with the student's answers
    made wrong (the base numbers and 20 students' numbers, in the reference's own kernel:
    ``grading.reference.judge_tour``'s ``left``), leaves no name of its own holding a right
    answer of that student, or one in another unit (a12's ``_tau`` was the interval in
    seconds: ``_tau / 60`` the graded answer), unless it is one of the student's own givens
    (which the notebook shows anyway). Not scanned: an answer the student measures (the
    judge's ``MEASURED``: what the cell derives from it is the student's own), and whole
    numbers up to 64 (a loop's index equals a count as often as not). The static side: every
    private name a released test cell binds is read by that cell
    (``grading.visible.without_dead_names``, applied when the release is sealed)."""
    import nbformat

    from grading import visible
    from grading.course import ROOT, is_test_cell

    for path in sorted((ROOT / "assignments" / name).glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if is_test_cell(cell):
                assert visible.without_dead_names(cell.source) == cell.source, path
    [run] = reference(name).values()
    tour = run["tour"]
    assert set(tour["left"]) == {"", *tour["students"]}
    measured = set(getattr(judge.load(name), "MEASURED", set()))
    leaks = []
    for student, cells in tour["left"].items():
        tested = tour["students"][student] if student else {
            gid: [subs, None] for gid, subs in run["submissions"].items()}
        right = {x for subs, _ in tested.values() for _, v in subs for x in _numbers(v)}
        g = variants.givens(name, student=student or None)
        given = {x for v in g.values() for x in _numbers(v)}
        for gid, names in cells.items():
            if {n for n, _ in tested.get(gid, [[]])[0]} & measured:
                continue
            for var, values in names.items():
                for x in values:
                    if x in given or (x.is_integer() and abs(x) <= 64):
                        continue
                    for want in right - {0.0}:
                        if any(abs(x * f - want) <= 1e-9 * abs(want)
                               or abs(x / f - want) <= 1e-9 * abs(want) for f in UNIT_FACTORS):
                            leaks.append((student or "(base)", gid, var, x, want))
    assert leaks == []


def test_a_dead_helper_value_is_cut_from_a_released_cell():
    from grading import visible

    source = ("_n, _m, _delta, _r = G.q2\n_tau = math.sqrt(2 * _delta * _m / _n * 3600)\n"
              "_k = 3\ncheck(q2, unit='min', k=_k)\n_job = run()\n")
    assert visible.without_dead_names(source) == ("_k = 3\ncheck(q2, unit='min', k=_k)\n"
                                                  "_job = run()\n")  # (a call is kept)

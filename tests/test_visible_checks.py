"""The visible checks students get show no answer, and reject the unit mistakes (issue 24).

For every assignment, from the release (``assignments/``) and the reference run (its visible
checks' traces, ``grading.visible``):

* no graded test cell contains a number, or an expression of numbers, equal to a graded answer
  or to a known mistake of one (the judge's own and the visible checks'), unless the question
  states it: a student who reads the cell learns nothing;
* every visible check of a number with a unit (``unit=`` or the answer's name: ``_gb``,
  ``_gib``, ``_bytes``, ...) rejects the answer in the wrong unit (GiB for GB and the reverse,
  bytes, element counts for bytes, seconds for ms) with a message that names it, and passes the
  right answer; every choice check rejects the choices it lists, sealed;
* the sealed mistakes cannot be read from the cell: its messages are not in it in any form.

Instructor-only: it reads the reference solutions' runs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

from conftest import numbers_in
from course_utils.assess import checks
from grading import integrity, judge, visible

ROOT = Path(__file__).resolve().parent.parent
ASSIGNMENTS = sorted(p.stem for p in (ROOT / "authoring" / "assignments").glob("*.py"))
pytestmark = pytest.mark.slow


def _release(name: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "assignments" / name / f"{name}.ipynb", as_version=4)


def _judge_mistakes(name: str, submissions: dict) -> tuple[list[float], list[str]]:
    """The values and messages of every known mistake the judge checks, found by running each
    judge function on the reference's values with recording check functions."""
    from unittest import mock

    rules = judge.load(name)
    values, messages = [], []

    def number(n, value, expected=None, *, mistakes=(), **kw):
        for w, m in mistakes:
            values.extend(numbers_in(w))
            messages.append(m)

    def choice(n, value, expected, allowed, *, mistakes=None, **kw):
        messages.extend((mistakes or {}).values())

    cases = judge.hidden_cases(rules, judge.REFERENCE_KEY)
    with mock.patch.object(rules, "check_number", number, create=True), \
            mock.patch.object(rules, "check_choice", choice, create=True), \
            mock.patch.object(checks, "check_number", number), \
            mock.patch.object(checks, "check_choice", choice):
        for gid, subs in submissions.items():
            fn = getattr(rules, gid, None)
            got = judge._values(subs, cases.get(gid))
            try:
                fn(got, judge._values(subs, cases.get(gid)))
            except Exception:  # noqa: BLE001 - judges that use checks.* directly: traced below
                pass
    return values, messages


def _cell_numbers(source: str) -> list[float]:
    """Every number a cell writes: constants, constant expressions (folded), and numbers
    inside its strings."""
    out = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Constant)):
            try:
                value = eval(compile(ast.Expression(node), "<cell>", "eval"), {"__builtins__": {}})
            except Exception:  # noqa: BLE001 - not a constant expression
                continue
            if (isinstance(value, (int, float)) and not isinstance(value, bool)
                    and abs(value) < 1e300):
                out.append(float(value))
            elif isinstance(value, str):
                out += [float(x.replace(",", "")) for x in
                        re.findall(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?", value)
                        if x.replace(",", "").replace(".", "").isdigit() or "e" in x]
    return out


def _small_int(x: float) -> bool:
    return abs(x) < 100 and x == int(x)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-3 * max(abs(a), abs(b))


def _without_sealed(source: str) -> str:
    """A test cell's source without its sealed-mistakes block (hex, not numbers)."""
    tree = ast.parse(source)
    keep = [ast.get_source_segment(source, stmt) for stmt in tree.body
            if "sealed_mistakes" not in ast.get_source_segment(source, stmt)]
    return "\n".join(keep)


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_no_visible_check_shows_an_answer(name, reference):
    """Graded answers: the reference's submissions (not a function's outputs on inputs drawn
    per submission, not the student's own timings); their known mistakes: the judge's, and
    the visible checks' own for those answers."""
    run = reference(name)[f"{name}.ipynb"]
    release = _release(name)
    text = "\n".join(c.source for c in release.cells if c.cell_type == "markdown")
    givens = {float(x) for x in re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?:e[+-]?\d+)?", text)}
    rules = judge.load(name)
    measured = set(getattr(rules, "MEASURED", set()))
    drawn = set(getattr(rules, "HIDDEN_CASES", {}))
    graded = {gid: [(n, v) for n, v in subs if n.split("[")[0] not in measured]
              for gid, subs in run["submissions"].items() if gid not in drawn}
    answers = [x for subs in graded.values() for _, v in subs for x in numbers_in(v)]
    names = {n for subs in graded.values() for n, _ in subs}
    wrong, _ = _judge_mistakes(name, graded)
    wrong += [x for traces in run["visible"].values() for t in traces if t["name"] in names
              for w, _ in t["mistakes"] for x in numbers_in(judge.decode(w))]
    secret = [x for x in answers + wrong if abs(x) < 1e300
              and not _small_int(x) and not any(_close(x, g) for g in givens)]
    leaks = []
    for cell in release.cells:
        if integrity.is_test_cell(cell):
            for x in _cell_numbers(_without_sealed(cell.source)):
                if any(_close(x, s) for s in secret) and not _small_int(x):
                    leaks.append(f"{integrity._meta(cell)['grade_id']}: {x:g}")
    assert leaks == [], f"{name}: visible test cells show graded answers or their mistakes"


# the word that names each unit's mistakes, in the derived messages and the authors' own
_UNIT_WORDS = {"GB": "GiB|bytes", "GiB": "GB|bytes", "MB": "MiB|bytes", "MiB": "MB|bytes",
               "bytes": "element", "ms": "second", "s": "milli"}


def _sealed_registry(cell_source: str) -> None:
    """Register the cell's sealed mistakes, as the cell's first lines do when it runs."""
    checks._SEALED.clear()
    tree, scope = ast.parse(cell_source), {}
    for stmt in tree.body:
        segment = ast.get_source_segment(cell_source, stmt)
        if "sealed_mistakes" in segment or segment.startswith("from course_utils import checks"):
            exec(compile(ast.Module([stmt], []), "<cell>", "exec"), scope)


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_visible_checks_reject_wrong_units_and_pass_the_answer(name, reference):
    run = reference(name)[f"{name}.ipynb"]
    cells = {integrity._meta(c)["grade_id"]: c for c in _release(name).cells
             if integrity.is_test_cell(c)}
    measured = set(getattr(judge.load(name), "MEASURED", set()))
    try:
        for gid, traces in run["visible"].items():
            if any(t["name"].split("[")[0] in measured for t in traces):
                continue  # (the student's own timings: nothing sealed, see grading.visible)
            _sealed_registry(cells[gid].source)
            sealed_text = cells[gid].source
            for trace in traces:  # (every variant's, where the numbers vary per student)
                value, tname = judge.decode(trace["value"]), trace["name"]
                variant = trace.get("variant", "")
                if trace["kind"] == "choice":
                    checks.check_choice(tname, value, None, [value], variant=variant)
                    for w, message in trace["mistakes"]:
                        assert message not in sealed_text
                        w = judge.decode(w)
                        with pytest.raises(AssertionError, match=re.escape(message[:30])):
                            checks.check_choice(tname, w, None, [w], variant=variant)
                    continue
                kw = {"unit": trace.get("unit", ""), "rel": trace.get("rel", 1e-3),
                      "abs_tol": trace.get("abs_tol", 0.0), "variant": variant}
                checks.check_number(tname, value, **kw)  # the right answer passes
                for w, message in trace["mistakes"]:
                    assert message not in sealed_text, f"{gid}: a mistake's message in the clear"
                for w, message in visible.unit_mistakes(tname, float(value), kw["unit"]):
                    if any(b in visible.checks._neighbours(checks._seal_bin(value, visible._grid(
                            trace))) for b in checks._neighbours(checks._seal_bin(w, visible._grid(
                                trace)))):
                        continue  # the wrong unit gives (nearly) the same number
                    # (the author's own message for the same mistake may come first)
                    with pytest.raises(AssertionError, match=_UNIT_WORDS[
                            visible.unit_of(tname, kw["unit"])]):
                        checks.check_number(tname, w, **kw)
    finally:
        checks._SEALED.clear()


def test_sealed_mistakes_match_within_tolerance_and_hide_their_message():
    sealed = checks.seal("x_gb", "log:0.001", [(303.1, "that is GiB")])
    assert "that is GiB" not in repr(sealed.entries) and "303" not in repr(sealed.entries)
    checks._SEALED.clear()
    try:
        checks.sealed_mistakes({"x_gb": sealed})
        for v in (303.1, 303.4, 302.8):
            with pytest.raises(AssertionError, match="that is GiB"):
                checks.check_number("x_gb", v, unit="GB")
        for v in (325.5, 306.0, 300.0):
            checks.check_number("x_gb", v, unit="GB")
        checks.check_number("y_gb", 303.1)  # another check's name: its own mistakes only
    finally:
        checks._SEALED.clear()


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_a_released_test_cell_shows_its_checks_not_its_sealed_tables(name):
    """Issue 50, finding 8: the sealed tables (hex: 83 % of a11's and a12's lines) are in
    ``course_utils/data/sealed/<assignment>.json``; a released test cell holds no hex, and the
    notebook's test cells are a small part of it."""
    import re

    cells, lines, hex_lines = 0, 0, []
    nb = _release(name)
    for cell in nb.cells:
        if integrity.is_test_cell(cell):
            cells += len(cell.source.splitlines())
            gid = integrity._meta(cell)["grade_id"]
            hex_lines += [gid for line in cell.source.splitlines()
                          if re.search(r"[0-9a-f]{32}", line)]
        lines += len(cell.source.splitlines())
    assert hex_lines == []
    assert cells <= 0.4 * lines, f"{name}: test cells are {cells} of {lines} lines"


def test_the_tables_file_unseals_what_was_sealed(tmp_path, monkeypatch):
    """What sealing writes (``visible.tables_json``) is what a released cell's first lines
    load (``checks.sealed_for``) and what the release-in-sync test reads back
    (``visible.sealed_tables``): the same entries, the same message unsealed."""
    sealed = checks.seal("x_gb", "log:0.001", [(303.1, "that is GiB: " + "a long message " * 9)])
    name = "x_gb@job=(1100000000.0, 12.0, 16, 2048);run_a=(0, 240, 372)"
    (tmp_path / "data" / "sealed").mkdir(parents=True)
    (tmp_path / "data" / "sealed" / "a0.json").write_text(
        visible.tables_json({"q1_test": {"x_gb": sealed, name: sealed}}))
    head = visible._sealed_head("a0", "q1_test")
    assert visible.sealed_tables(head, tmp_path / "data" / "sealed")[name].entries == \
        sealed.entries
    monkeypatch.setattr(checks, "__file__", str(tmp_path / "assess" / "checks.py"))  # data: tmp_path
    checks._SEALED.clear()
    try:
        exec(compile(head, "<cell>", "exec"), {})
        assert checks._SEALED["x_gb"][0].entries == sealed.entries
        with pytest.raises(AssertionError, match="a long message a long"):
            checks.check_number("x_gb", 303.1, unit="GB")
        assert checks.sealed_for("a0", "no_such_test") == {}
        assert checks.sealed_for("no_such_assignment", "q1_test") == {}
    finally:
        checks._SEALED.clear()

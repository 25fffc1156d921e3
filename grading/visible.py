"""The release's visible checks, sealed: no test cell students get shows a value from which a
graded answer follows.

In ``solutions/`` (instructor-only) a visible check lists its known mistakes readably::

    checks.check_number("q1_gpt_gb", q1_gpt_gb, unit="GB", mistakes=[
        (4096 * 2 * 5120 * 34 * 40 / 1e9, "that leaves out the attention term ...")])

Doubling such a mistake can give the answer. :func:`seal_release` rewrites every graded test
cell of the release (``assignments/``): the ``mistakes=`` arguments of its visible checks are
removed, and the cell's first lines register the same mistakes sealed
(``_checks.sealed_mistakes(_checks.sealed_for("a9_activations", "q1_test"))``: the tables, hex,
live in ``course_utils/data/sealed/<assignment>.json``, out of the student's sight; see
``course_utils.assess.checks.seal``), with the unit mistakes of the check's unit added (:func:`unit_mistakes`: a GB answer's GiB and
bytes values, a bytes answer's element counts, ...). The values come from the reference run,
whose visible checks publish what they saw (``COURSE_TRACE_CHECKS``): every call, in loops too,
with the reference's answer and its mistakes evaluated. A mistake that depends on the
student's other answers (a4 Q3's ring bytes from the student's own payload) is sealed at the
reference's value of those answers.

Grading is not affected: nbgrader restores test cells from ``solutions/``, and the judge
decides outside the kernel.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import nbformat

from course_utils.assess import checks
from grading import judge
from grading.course import ROOT, _meta, is_test_cell

# unit -> [(factor applied to the right answer, the message naming the mistake)]
_UNIT_MISTAKES = {
    "GB": [(1e9 / 2**30, "that is GiB (2^30 bytes); the question asks for GB (10^9 bytes)"),
           (1e9, "that is bytes; the question asks for GB")],
    "GiB": [(2**30 / 1e9, "that is GB (10^9 bytes); the question asks for GiB (2^30 bytes)"),
            (2**30, "that is bytes; the question asks for GiB")],
    "MB": [(1e6 / 2**20, "that is MiB (2^20 bytes); the question asks for MB (10^6 bytes)"),
           (1e6, "that is bytes; the question asks for MB")],
    "MiB": [(2**20 / 1e6, "that is MB (10^6 bytes); the question asks for MiB (2^20 bytes)"),
            (2**20, "that is bytes; the question asks for MiB")],
    "bytes": [(1 / 2, "that counts elements (of 2 bytes each); the question asks for bytes"),
              (1 / 4, "that counts elements (of 4 bytes each); the question asks for bytes")],
    "ms": [(1e-3, "that is seconds; the question asks for milliseconds")],
    "s": [(1e3, "that is milliseconds; the question asks for seconds")],
}
_SUFFIXES = {"gb": "GB", "gib": "GiB", "mb": "MB", "mib": "MiB", "bytes": "bytes", "ms": "ms"}


def unit_of(name: str, declared: str = "") -> str:
    """The unit of a check: its ``unit=``, else the answer name's suffix (``q2_state_gib``)."""
    if declared in _UNIT_MISTAKES:
        return declared
    tail = name.lower().rsplit("_", 1)[-1].strip("]) ")
    return _SUFFIXES.get(tail, "")


def unit_mistakes(name: str, value: float, unit: str) -> list[tuple[float, str]]:
    """The wrong-unit values of a right answer ``value`` in ``unit`` (element counts only where
    they are whole numbers)."""
    out = []
    for factor, message in _UNIT_MISTAKES.get(unit_of(name, unit), []):
        wrong = value * factor
        if unit_of(name, unit) == "bytes" and wrong != int(wrong):
            continue
        out.append((wrong, message))
    return out


def _grid(trace: dict) -> str:
    if trace["kind"] == "choice":
        return "choice"
    rel, abs_tol = float(trace.get("rel", 1e-3)), float(trace.get("abs_tol", 0.0))
    if rel == 0.0 and abs_tol > 0:
        return f"step:{2 * abs_tol:g}"
    return f"log:{rel:g}"


def sealed_table(traces: list[dict], sealer=checks.seal) -> dict[str, checks.Sealed]:
    """``{check name: Sealed}`` of one test cell, from its reference run's traces: the given
    mistakes and, for numbers, the unit mistakes. A unit mistake that falls next to the
    answer is left out (it would reject the answer); a given one raises ValueError.
    ``sealer(name, grid, mistakes)`` seals one check (default ``checks.seal``; see
    :func:`committed_sealer`)."""
    given: dict[tuple[str, str], list] = {}
    derived: dict[tuple[str, str], list] = {}
    answers: dict[tuple[str, str], set] = {}
    for trace in traces:  # a check of a question whose numbers vary: one key per variant
        key = (checks.sealed_name(trace["name"], trace.get("variant", "")), _grid(trace))
        value = judge.decode(trace["value"])
        for w, m in trace["mistakes"]:
            if (judge.decode(w), m) not in given.setdefault(key, []):
                given[key].append((judge.decode(w), m))
        if trace["kind"] == "number":
            for item in unit_mistakes(trace["name"], float(value), trace.get("unit", "")):
                if item not in derived.setdefault(key, []):
                    derived[key].append(item)
        answers.setdefault(key, set()).update(checks._neighbours(checks._seal_bin(value, key[1])))
    table = {}
    for key in sorted(set(given) | set(derived)):
        name, grid = key
        near = lambda w: bool(set(checks._neighbours(checks._seal_bin(w, grid))) & answers[key])
        bad = [m for w, m in given.get(key, []) if near(w)]
        if bad:
            raise ValueError(f"{name}: the known mistake {bad[0]!r} falls next to the "
                             "reference's answer")
        kept = given.get(key, []) + [(w, m) for w, m in derived.get(key, []) if not near(w)]
        if kept:
            table[name] = sealer(name, grid, kept)
    return table


class _DropMistakes(ast.NodeVisitor):
    """Source spans of the ``mistakes=`` keywords of visible checks (no expected value)."""

    def __init__(self):
        self.spans: list[tuple[int, int, int, int]] = []

    def visit_Call(self, node):
        fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if fn in ("check_number", "check_choice"):
            expected = node.args[2] if len(node.args) > 2 else next(
                (k.value for k in node.keywords if k.arg == "expected"), None)
            visible = expected is None or (isinstance(expected, ast.Constant)
                                           and expected.value is None)
            for kw in node.keywords:
                if kw.arg == "mistakes" and visible:
                    self.spans.append((kw.lineno, kw.col_offset, kw.end_lineno,
                                       kw.end_col_offset))
        self.generic_visit(node)


def _without_mistakes(source: str) -> str:
    """``source`` with the ``mistakes=...`` keyword (and its comma) of every visible check cut."""
    visitor = _DropMistakes()
    visitor.visit(ast.parse(source))
    lines = source.split("\n")
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    cuts = sorted(((offsets[a - 1] + b, offsets[c - 1] + d) for a, b, c, d in visitor.spans),
                  reverse=True)
    for start, end in cuts:
        before = source[:start].rstrip()
        if before.endswith(","):
            before = before[:-1]
        after = source[end:]
        stripped = after.lstrip()
        if stripped.startswith(","):
            after = stripped[1:]
        source = before + after
    ast.parse(source)  # still Python
    return source


def _reads(node) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Load)}


_PURE_CALLS = {"len", "abs", "min", "max", "sum", "float", "int", "round"}
_PURE_MODULES = {"math", "llama_shapes"}  # (the standard library's math; course_utils' tables)


def _pure(expr) -> bool:
    """Does computing ``expr`` do nothing but compute it (arithmetic, names, attributes, and
    calls of :data:`_PURE_CALLS` and of :data:`_PURE_MODULES`' functions only)?"""
    for node in ast.walk(expr):
        if isinstance(node, ast.Call):
            fn = node.func
            root = fn
            while isinstance(root, ast.Attribute):
                root = root.value
            if not ((isinstance(fn, ast.Name) and fn.id in _PURE_CALLS)
                    or (isinstance(fn, ast.Attribute) and isinstance(root, ast.Name)
                        and root.id in _PURE_MODULES)):
                return False
        elif isinstance(node, (ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr, ast.Lambda)):
            return False
    return True


def without_dead_names(source: str) -> str:
    """``source`` without each top-level assignment of private names (``_tau = ...``) that
    nothing after it reads and whose value is only computed (:func:`_pure`): once its
    ``mistakes=`` are sealed, a visible check's helper value is dead, and left in the released
    cell it stays in the student's kernel (a12's ``_tau``: ``_tau / 60`` was the graded
    interval). Repeated until none is left."""
    while True:
        tree = ast.parse(source)
        dead = None
        for i, stmt in enumerate(tree.body):
            if not isinstance(stmt, ast.Assign):
                continue
            names = {n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            later = set().union(*(_reads(s) for s in tree.body[i + 1:]))
            if names and all(n.startswith("_") for n in names) and not names & later \
                    and _pure(stmt.value):
                dead = stmt
                break
        if dead is None:
            return source
        lines = source.split("\n")
        source = "\n".join(lines[:dead.lineno - 1] + lines[dead.end_lineno:])


SEALED_DIR = ROOT / "course_utils" / "data" / "sealed"  # <assignment>.json: the tables


def _sealed_head(assignment: str, gid: str) -> str:
    """The first lines of a released test cell: it loads its sealed tables from the course's
    data (the tables themselves, hex, are out of the student's sight)."""
    return (f"# Known wrong answers, sealed (course_utils/data/sealed/{assignment}.json): a wrong\n"
            f"# value unlocks the message that names it.\n"
            f"from course_utils import checks as _checks\n"
            f"_checks.sealed_mistakes(_checks.sealed_for({assignment!r}, {gid!r}))\n")


def tables_json(tables: dict[str, dict[str, checks.Sealed]]) -> str:
    """``{grade_id: {check name: Sealed}}`` as the data file holds it (sorted: a rebuild that
    seals the same writes the same bytes)."""
    return json.dumps({gid: {name: [s.grid, sorted(f"{d}:{c}" for d, c in s.entries.items())]
                             for name, s in sorted(table.items())}
                       for gid, table in sorted(tables.items())}, indent=1, sort_keys=True) + "\n"


def seal_release(release: nbformat.NotebookNode, traces: dict[str, list[dict]],
                 measured: set[str] | frozenset = frozenset(), sealer=checks.seal,
                 assignment: str = "", tables: dict | None = None) -> list[str]:
    """Seal the visible checks of every graded test cell of ``release`` in place (see the module
    doc); ``traces``: the reference run's ``visible`` record. Each cell's tables go into
    ``tables`` (``{grade_id: {check name: Sealed}}``, for ``course_utils/data/sealed/
    <assignment>.json``: :func:`seal_release_file` writes it), the cell's first lines load
    them. A cell that checks a ``measured`` answer (the judge's ``MEASURED``: each student's own
    timings) is left as it is: its known mistakes come from the student's own measurement, not
    from an answer. Returns the test cells sealed."""
    from nbgrader.utils import compute_checksum

    done = []
    for cell in release.cells:
        if not is_test_cell(cell):
            continue
        gid = _meta(cell)["grade_id"]
        if any(t["name"].split("[")[0] in measured for t in traces.get(gid, [])):
            continue
        table = sealed_table(traces.get(gid, []), sealer)
        source = without_dead_names(_without_mistakes(cell.source))
        if table:
            source = _sealed_head(assignment, gid) + source
            if tables is not None:
                tables[gid] = table
        if source != cell.source:
            cell.source = source
            cell.metadata["nbgrader"]["checksum"] = compute_checksum(cell)
            done.append(gid)
    return done


def sealed_tables(source: str, tables_dir=None) -> dict[str, checks.Sealed]:
    """The ``{check name: Sealed}`` table a released test cell registers, read from the data
    file its first lines name (``tables_dir``, default :data:`SEALED_DIR`; nothing run)."""
    for stmt in ast.parse(source).body:
        call = getattr(stmt, "value", None)
        if not (isinstance(call, ast.Call) and getattr(call.func, "attr", None) ==
                "sealed_mistakes" and call.args and isinstance(call.args[0], ast.Call)):
            continue
        assignment, gid = (ast.literal_eval(a) for a in call.args[0].args)
        path = Path(tables_dir or SEALED_DIR) / f"{assignment}.json"
        if not path.exists():
            return {}
        cell = json.loads(path.read_text()).get(gid, {})
        return {name: checks.Sealed(grid, entries) for name, (grid, entries) in cell.items()}
    return {}


def committed_sealer(release: nbformat.NotebookNode, tables_dir=None):
    """A ``sealer`` for :func:`seal_release` that checks a release's sealed tables instead of
    sealing again (the release-in-sync test): a check whose committed table has the grid, the
    number of entries that sealing makes (one per distinct bin: each mistake's bin and its
    neighbours) and, in each mistake's own bin, that mistake's message is returned as it is
    (2 key derivations per mistake instead of 6); any other is sealed anew, so a stale table
    still differs from the committed one."""
    committed = {}
    for cell in release.cells:
        if is_test_cell(cell):
            committed.update(sealed_tables(cell.source, tables_dir))

    def sealer(name: str, grid: str, wrongs) -> checks.Sealed:
        wrongs = list(wrongs)
        old = committed.get(name)
        bins = {b for w, _ in wrongs for b in checks._neighbours(checks._seal_bin(w, grid))}
        if (old is not None and old.grid == grid and len(old.entries) == len(bins)
                and all(old.message(name, w) == str(m) for w, m in wrongs)):
            return old
        return checks.seal(name, grid, wrongs)

    return sealer


def seal_release_file(assignment: str, release_dir=None, cache=None, tables_dir=None) -> list[str]:
    """Seal ``<release_dir>/<assignment>/*.ipynb`` (default ``assignments/``) from the reference
    run (cached in ``cache``, default the repository's ``.cache/reference``; run if missing,
    from the working tree), and write its tables to ``<tables_dir>/<assignment>.json``
    (default :data:`SEALED_DIR`)."""
    from grading.reference import reference_run

    release_dir = Path(release_dir or ROOT / "assignments")
    cache = Path(cache or ROOT / ".cache" / "reference")
    run = reference_run(assignment, cache=cache, committed=False)
    measured = set(getattr(judge.load(assignment), "MEASURED", set()))
    done, tables = [], {}
    for name, record in run.items():
        path = release_dir / assignment / name
        nb = nbformat.read(path, as_version=4)
        done += seal_release(nb, record["visible"], measured, assignment=assignment,
                             tables=tables)
        nbformat.write(nb, path)
    folder = Path(tables_dir or SEALED_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{assignment}.json").write_text(tables_json(tables))
    return done


__all__ = ["SEALED_DIR", "committed_sealer", "seal_release", "seal_release_file",
           "sealed_table", "sealed_tables", "tables_json", "unit_mistakes", "unit_of",
           "without_dead_names"]

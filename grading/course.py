"""What the course is to the grader: its folders, its notebooks' cells, the release's metadata.

The first stage every other grading module stands on (no other ``grading`` module is imported
here but the file and text helpers): where the repository and the course data are
(:data:`ROOT`, :func:`data_dir`), an assignment's notebooks, which cells are tests and answers,
reading a submitted notebook safely (:func:`read_notebook`), the committed release
(:func:`release_notebook`), the student's own numbers (:func:`givens_for`) and putting the
release's nbgrader metadata back into a submission (:func:`restore_metadata`).
"""

from __future__ import annotations

import copy
import csv
import io
import os
import re
from pathlib import Path

import nbformat

from grading.files import entry_kind, read_regular
from grading.inert import one_line

ROOT = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """The course data folder (``$COURSE_DATA``, default ``.course_data/``)."""
    return Path(os.environ.get("COURSE_DATA", ROOT / ".course_data")).expanduser().resolve()


def notebook_names(assignment: str) -> list[str]:
    """Notebook file names of an assignment, from ``solutions/<assignment>/``."""
    return sorted(p.name for p in (ROOT / "solutions" / assignment).glob("*.ipynb"))


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def is_test_cell(cell) -> bool:
    """An autograded test cell: a graded code cell that is not an answer."""
    m = _meta(cell)
    return cell.get("cell_type") == "code" and bool(m.get("grade")) and not m.get("solution")


def is_answer_cell(cell) -> bool:
    """A code cell the student writes (nbgrader ``solution``)."""
    return cell.get("cell_type") == "code" and bool(_meta(cell).get("solution"))


def visible_traces(nb) -> dict[str, list[dict]]:
    """``{grade_id: [trace, ...]}``: what each visible check of each test cell saw in a run with
    ``COURSE_TRACE_CHECKS`` set (``course_utils.assess.checks._trace``): the name, the reference's
    value, the unit and tolerance, the known mistakes it was given."""
    from course_utils.assess.checks import TRACE_MIME

    return {_meta(cell)["grade_id"]: [o["data"][TRACE_MIME] for o in cell.get("outputs", [])
                                      if TRACE_MIME in o.get("data", {})]
            for cell in nb.cells if is_test_cell(cell)}


# ------------------------------------------------------------------------------ metadata

MAX_NOTEBOOK_BYTES = 50_000_000  # a submitted or autograded notebook the grader will read
_NBGRADER_CELL_KEYS = ("deletable", "editable")


def read_notebook(path: Path):
    """An nbformat notebook from a regular file of at most ``MAX_NOTEBOOK_BYTES`` (a link, a
    named pipe or a huge file is refused: ``grading.files.NotRegular``)."""
    return nbformat.reads(read_regular(path, MAX_NOTEBOOK_BYTES).decode("utf-8"), as_version=4)


MAX_NOTEBOOK_ITEMS = 200_000  # JSON items of a submitted notebook (the course's: 800-4,000)
MAX_COLLECTED_ITEMS = 5_000_000  # what collect parses to drop unknown metadata (at most 210 MB)
# the metadata a submitted notebook keeps (everything else is dropped at collect: a key of a
# million empty objects costs every later reader gigabytes)
NOTEBOOK_METADATA = ("kernelspec", "language_info")
CELL_METADATA = ("nbgrader", "tags", "editable", "deletable", "collapsed", "scrolled",
                 "jupyter")


class NotebookTooComplex(ValueError):
    """A submitted notebook with more JSON items than the grader parses."""


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # (unrolled: linear, runs matched in C)


def json_items(raw: bytes) -> int:
    """JSON items in ``raw``, counted without parsing it: its commas and brackets outside
    strings (an over-count of at most twice: ``{},`` counts 2)."""
    bare = _JSON_STRING.sub(b'""', raw)
    return bare.count(b",") + bare.count(b"[") + bare.count(b"{")


def check_items(raw: bytes, most: int = MAX_NOTEBOOK_ITEMS) -> None:
    """Raise :class:`NotebookTooComplex` if a notebook's bytes hold more than ``most`` JSON
    items (:func:`json_items`)."""
    items = json_items(raw)
    if items > most:
        raise NotebookTooComplex(f"a notebook of {items:,} JSON items (the grader reads at "
                                 f"most {most:,}; the course's have 800-4,000)")


def submitted_notebook(raw: bytes) -> bytes:
    """What collect keeps of a submitted notebook's bytes: every metadata key but
    :data:`NOTEBOOK_METADATA` and :data:`CELL_METADATA` dropped, then refused
    (:class:`NotebookTooComplex`) if what is left has more than ``MAX_NOTEBOOK_ITEMS`` JSON
    items, the number every later step parses. Items are counted on the bytes
    (:func:`json_items`); a file of more than
    ``MAX_COLLECTED_ITEMS`` is refused before it is parsed. A file that is not a notebook's JSON
    is kept as it is, within the same limit (grading says what is wrong with it)."""
    import json

    check_items(raw, MAX_COLLECTED_ITEMS)
    try:
        nb = json.loads(raw)
    except (ValueError, RecursionError):
        nb = None
    if isinstance(nb, dict) and isinstance(nb.get("cells"), list):
        holders = [(nb, NOTEBOOK_METADATA)] + [(c, CELL_METADATA) for c in nb["cells"]
                                               if isinstance(c, dict)]
        unknown = [(h, keys) for h, keys in holders if isinstance(h.get("metadata"), dict)
                   and set(h["metadata"]) - set(keys)]
        for holder, keys in unknown:
            holder["metadata"] = {k: v for k, v in holder["metadata"].items() if k in keys}
        if unknown:  # (an honest notebook is kept byte for byte)
            raw = json.dumps(nb, ensure_ascii=False, indent=1).encode("utf-8")
    check_items(raw)
    return raw


def bound_names(source: str) -> list[str]:
    """The names a cell binds at its top level, imports included, in order (none if it is not
    Python)."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out: list[str] = []
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [stmt.name]
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            names = [a.asname or a.name.split(".")[0] for a in stmt.names]
        else:
            names = [n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)
                     and isinstance(n.ctx, ast.Store)]
        out += [n for n in names if n not in out]
    return out


def unreadable(path: Path, err: Exception) -> str:
    """Why a submitted notebook cannot be read, for the report: for JSON that is invalid or cut
    short, where it goes wrong and how long the file is (nbformat says only that it "does not
    appear to be JSON")."""
    import json

    if type(err).__name__ == "NotJSONError":
        try:
            text = read_regular(path, MAX_NOTEBOOK_BYTES).decode("utf-8", "replace")
            json.loads(text)
        except json.JSONDecodeError as bad:
            end = "truncated JSON: it ends" if bad.pos >= len(text.rstrip()) else \
                "invalid JSON"
            return (f"{end} at line {bad.lineno}, column {bad.colno} (character "
                    f"{bad.pos:,} of {len(text):,}): {bad.msg}")
        except Exception:  # noqa: BLE001 - what nbformat said, then
            pass
    return one_line(err, 80)


def release_notebook(assignment: str | None, notebook: str | None):
    """The committed release of one notebook (``assignments/<a>/<notebook>.ipynb``), or None."""
    if not assignment or not notebook:
        return None
    path = ROOT / "assignments" / assignment / f"{Path(notebook).stem}.ipynb"
    return nbformat.read(path, as_version=4) if path.exists() else None


def variants_on(assignment: str) -> bool | None:
    """The instructor's switch for ``assignment``'s per-student numbers, read from the committed
    release (the ``on=`` of its ``variants.givens(...)`` cell, never from a submission); None
    when the assignment has no givens."""
    from course_utils.assess import variants

    for name in notebook_names(assignment):
        release = release_notebook(assignment, name)
        if release is None:  # building the first release: the solution holds the same cell
            release = nbformat.read(ROOT / "solutions" / assignment / name, as_version=4)
        for cell in release.cells:
            if cell.cell_type == "code":
                switch = variants.switch_of(cell.source)
                if switch is not None:
                    return switch
    return None


VARIANTS_ENV = "COURSE_VARIANTS"  # "off": everyone on the base numbers (make check, no identity)


def givens_for(assignment: str, student: str | None):
    """The numbers ``student`` is judged on (``course_utils.assess.variants.Givens``): drawn here from
    nbgrader's student id, with the release's switch; the base numbers for no student or with
    variants off (the release's switch, or ``COURSE_VARIANTS=off``: a self-learner's ``make
    check`` without an identity); None for an assignment without givens."""
    from course_utils.assess import variants

    switch = variants_on(assignment)
    if switch is None:
        return None
    if os.environ.get(VARIANTS_ENV, "on").lower() == "off":  # make check without an identity
        switch = False
    return variants.givens(assignment, on=switch, student=student) if student else \
        variants.givens(assignment, on=False)


def restore_metadata(nb, release) -> list[str]:
    """Put back, in ``nb``, the nbgrader metadata and the type of every cell the release marks
    (graded, answer or locked), from the release; strip nbgrader metadata the release does not
    have. A submitted cell is the release's cell with the same grade id, else the one with the
    same cell id. Returns what was changed, one line per cell (empty: nothing was)."""
    wanted = {_meta(c)["grade_id"]: c for c in release.cells if _meta(c).get("grade_id")}
    by_id = {c.get("id"): gid for gid, c in wanted.items() if c.get("id")}
    matched: set[str] = set()
    changes: list[str] = []
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader")
        gid = meta.get("grade_id") if isinstance(meta, dict) else None
        if gid not in wanted or gid in matched:
            gid = by_id.get(cell.get("id")) if by_id.get(cell.get("id")) not in matched else None
        if gid is None:
            if meta:
                cell.setdefault("metadata", {}).pop("nbgrader", None)
                changes.append("a cell claimed nbgrader metadata the release does not have "
                               "(removed)")
            continue
        matched.add(gid)
        source = wanted[gid]
        want = copy.deepcopy(source.metadata["nbgrader"])
        if meta != want:
            fields = sorted(one_line(k, 40) for k in
                            set(want) | set(meta if isinstance(meta, dict) else {})
                            if not isinstance(meta, dict) or meta.get(k) != want.get(k))
            changes.append(f"cell {gid}: nbgrader metadata edited ({', '.join(fields[:10])}"
                           + (", ..." if len(fields) > 10 else "") + ")")
        cell.setdefault("metadata", {})["nbgrader"] = want
        for key in _NBGRADER_CELL_KEYS:
            if key in source.metadata:
                cell.metadata[key] = source.metadata[key]
            else:
                cell.metadata.pop(key, None)
        if cell.get("cell_type") != source.cell_type:
            changes.append(f"cell {gid}: type changed to {cell.get('cell_type')}")
            cell["cell_type"] = source.cell_type
            if source.cell_type == "code":
                cell["outputs"], cell["execution_count"] = [], None
            else:
                cell.pop("outputs", None)
                cell.pop("execution_count", None)
    return changes


# ------------------------------------------------------------------------------ roster

ROSTER = "roster.csv"


def roster(data: Path) -> dict[str, dict[str, str]]:
    """``{student id: {first_name, last_name, email}}`` from ``$COURSE_DATA/roster.csv``."""
    path = data / ROSTER
    if entry_kind(path) != "file":
        return {}
    rows = csv.DictReader(io.StringIO(read_regular(path, 10_000_000).decode("utf-8-sig")))
    return {r["id"].strip(): {k: (r.get(k) or "").strip() for k in
                              ("first_name", "last_name", "email")}
            for r in rows if (r.get("id") or "").strip()}


def name_students(data: Path, students: list[str] | None = None) -> None:
    """Give the gradebook's students their names: the roster's, else the id as the last name
    (the formgrader shows "last, first")."""
    from nbgrader.api import Gradebook

    db = data / "gradebook.db"
    if not db.exists():
        return
    names = roster(data)
    with Gradebook(f"sqlite:///{db}") as gb:
        present = {s.id for s in gb.students}  # (a student nbgrader did not record stays out)
        for student in students if students is not None else sorted(present):
            if student not in present:
                continue
            known = names.get(student, {})
            gb.update_or_create_student(student, first_name=known.get("first_name", ""),
                                        last_name=known.get("last_name") or student,
                                        email=known.get("email") or None)

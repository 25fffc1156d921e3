"""The per-assignment report: the judge's verdicts, the reference run, scans and digests.

The trust model (``grading/judge.py``): every test cell is decided by the judge, outside the
student's sandboxed kernel, from the values the cell submitted and the reference solution's.
This module adds what the report needs around it:

1. **The reference run** (:func:`reference_run`): the solution notebook run once, its
   submissions recorded per test cell (the judge's expected values) and judged by the judge
   itself (a reference that fails its own judge stops grading). Cached by content hash.
2. **Verdicts** (:func:`verify_student`): the score is the judge log's. nbgrader's own score
   (from the outputs the judge wrote) must agree; a disagreement, or a test cell the judge never
   saw, is flagged and scored 0.
3. **Static scan** (:func:`scan_source`): answer cells that patch modules, touch
   ``builtins``/``sys.modules``, define ``__eq__`` and so on. The score does not depend on it
   (a patched kernel still cannot submit a right value it did not compute); the flags tell the
   instructor who tried.
4. **Status apart from score:** "not submitted", "notebook missing", "not a valid notebook"
   and "autograde failed" are never written as a 0.
5. **Results fixed when grading ends:** :func:`record_digests` keeps the SHA-256 of every
   autograded notebook and judge log; :func:`report` refuses (:class:`ResultsChanged`, naming the
   students) if one changed afterwards. How the kernels were isolated heads the report.

:func:`report` writes ``reports/<assignment>.csv`` and ``.txt`` under the course data folder.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import csv
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from course_utils.checks import SUBMIT_MIME
from grading import expected, judge
from grading.files import NotRegular, entry_kind, read_regular, write_private
from grading.inert import lines as inert_lines
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
    ``COURSE_TRACE_CHECKS`` set (``course_utils.checks._trace``): the name, the reference's
    value, the unit and tolerance, the known mistakes it was given."""
    from course_utils.checks import TRACE_MIME

    return {_meta(cell)["grade_id"]: [o["data"][TRACE_MIME] for o in cell.get("outputs", [])
                                      if TRACE_MIME in o.get("data", {})]
            for cell in nb.cells if is_test_cell(cell)}


def submissions_by_cell(nb) -> dict[str, list]:
    """``{grade_id: [[name, value], ...]}`` submitted by every test cell of an executed notebook."""
    return {_meta(cell)["grade_id"]: [list(pair) for pair in judge.submissions(cell)]
            for cell in nb.cells if is_test_cell(cell)}


# ------------------------------------------------------------------------------ metadata

MAX_NOTEBOOK_BYTES = 50_000_000  # a submitted or autograded notebook the grader will read
_NBGRADER_CELL_KEYS = ("deletable", "editable")


def read_notebook(path: Path):
    """An nbformat notebook from a regular file of at most ``MAX_NOTEBOOK_BYTES`` (a link, a
    named pipe or a huge file is refused: ``grading.files.NotRegular``)."""
    return nbformat.reads(read_regular(path, MAX_NOTEBOOK_BYTES).decode("utf-8"), as_version=4)


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
    from course_utils import variants

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
    """The numbers ``student`` is judged on (``course_utils.variants.Givens``): drawn here from
    nbgrader's student id, with the release's switch; the base numbers for no student or with
    variants off (the release's switch, or ``COURSE_VARIANTS=off``: a self-learner's ``make
    check`` without an identity); None for an assignment without givens."""
    from course_utils import variants

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


# ------------------------------------------------------------------------------ reference run


def run_key(*paths: Path) -> str:
    """A short content hash of files, the Python version and the pinned packages' versions."""
    import sys
    from importlib.metadata import version

    h = hashlib.sha256(sys.version.encode())
    for pkg in ("torch", "nbclient", "ipykernel"):
        h.update(version(pkg).encode())
    for p in paths:
        h.update(p.as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def reference_cache_path(assignment: str, notebook: str, cache: Path) -> Path:
    """Where the reference run of one notebook is cached: the name carries its content key."""
    src = ROOT / "solutions" / assignment / notebook
    key = run_key(src, judge.JUDGES / f"{assignment}.py", ROOT / "grading" / "judge.py",
                  ROOT / "grading" / "integrity.py",
                  *sorted((ROOT / "course_utils").rglob("*.py")))
    return cache / assignment / f"{Path(notebook).stem}.{key}.json"


SOLUTIONS_CHECK_ENV = "COURSE_SOLUTIONS_CHECK"  # "off": run a reference not in git's HEAD


def check_committed(assignment: str) -> None:
    """Refuse to run the reference of ``assignment`` (RuntimeError naming each file) unless its
    solution notebooks and its judge file are exactly as committed (git's ``HEAD``): a changed
    ``solutions/`` would otherwise set every student's expected values.
    ``COURSE_SOLUTIONS_CHECK=off`` skips the check (the instructor's own, unfinished edits)."""
    import subprocess

    if os.environ.get(SOLUTIONS_CHECK_ENV, "on").lower() in ("off", "0", "no"):
        return
    files = [ROOT / "solutions" / assignment / n for n in notebook_names(assignment)]
    files.append(judge.JUDGES / f"{assignment}.py")

    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""

    if git("rev-parse", "--is-inside-work-tree") != "true":
        raise RuntimeError(
            f"cannot check that solutions/{assignment} is the committed version: {ROOT} is not a "
            f"git checkout (set {SOLUTIONS_CHECK_ENV}=off to grade with it anyway)")
    changed = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if entry_kind(path) != "file":
            changed.append(f"{rel} ({entry_kind(path)})")
        elif git("rev-parse", f"HEAD:{rel}") != git("hash-object", "--", rel):
            changed.append(rel)
    if changed:
        raise RuntimeError(
            f"refusing to grade {assignment}: {', '.join(changed)} differ(s) from the committed "
            f"version (git diff shows how); commit or restore it, or set "
            f"{SOLUTIONS_CHECK_ENV}=off to grade with it anyway")


def reference_run(assignment: str, data: Path | None = None, timeout: int = 600,
                  cache: Path | None = None, committed: bool = True) -> dict[str, dict]:
    """Run the reference solution once and record what each test cell submits; cached.

    Returns ``{notebook: {"submissions": {grade_id: [[name, value], ...]}, "max_cell_s":
    seconds, "problems": [...]}}``, where ``problems`` lists every error output and every
    stderr text of a test cell. The reference runs in the same sandbox as every submission,
    with the hidden cases drawn for the key ``"reference"``, and only once
    :func:`check_committed` agrees that the solution and its judge are the committed ones.
    Raises RuntimeError if the judge does not pass every test cell of the reference (a judge
    file whose expected values disagree with the solution). The cache (``cache``, default
    ``$COURSE_DATA/reference``) is keyed by the solution notebook, its judge file, every
    ``course_utils`` source and the versions of Python, torch and the kernel: change any of them
    and the reference runs again. ``committed=False`` (building the release from the author's
    own edits) skips :func:`check_committed`.
    """
    data = data or data_dir()
    cache = cache or data / "reference"
    out = {}
    for name in notebook_names(assignment):
        path = reference_cache_path(assignment, name, cache)
        if entry_kind(path) == "file":
            out[name] = json.loads(read_regular(path, MAX_NOTEBOOK_BYTES))
            continue
        if committed:
            check_committed(assignment)
        out[name] = _run_reference(assignment, name, timeout)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, json.dumps(out[name], indent=1))  # a reader sees all of it or none
    return out


def sandboxed_client(nb, hidden_cases: dict | None = None, student: str | None = None, **kw):
    """An nbclient ``NotebookClient`` for ``nb`` whose kernel runs in the grading sandbox with
    ``hidden_cases`` (``{grade_id: cases}``) as the submission's hidden inputs and ``student``
    as its ``COURSE_STUDENT`` (the givens it draws; None: not set)."""
    from nbclient import NotebookClient

    from grading import sandbox

    sandbox.require()

    class SandboxedClient(NotebookClient):
        def create_kernel_manager(self):
            km = super().create_kernel_manager()
            km.hidden_cases = json.dumps(hidden_cases or {})
            km.student = student
            return km

    return SandboxedClient(nb, kernel_manager_class=sandbox.SandboxedKernelManager, **kw)


def launch_preload(assignment: str) -> str:
    """What the forkserver of the ranks imports in ``assignment``'s grading kernels
    (``COURSE_LAUNCH_PRELOAD``): "light" (torch and torch.distributed: enough for plain
    collectives, and the forkserver starts about 1 s sooner), unless the judge module says
    ``LAUNCH_PRELOAD = "full"``: a rank that builds a ``torch.optim`` optimizer or DDP imports
    ``torch._dynamo`` first (1.35 s, each rank of each launch), which the full preload does once."""
    preload = getattr(judge.load(assignment), "LAUNCH_PRELOAD", "light")
    if preload not in ("light", "full"):
        raise ValueError(f"{assignment}'s judge: LAUNCH_PRELOAD must be 'light' or 'full', got "
                         f"{preload!r}")
    return preload


def _run_reference(assignment: str, name: str, timeout: int) -> dict:
    """Execute one solution notebook in the sandbox and judge it (see :func:`reference_run`)."""
    rules = judge.load(assignment)
    cases = judge.hidden_cases(rules, judge.REFERENCE_KEY)
    nb = nbformat.read(ROOT / "solutions" / assignment / name, as_version=4)
    # the kernel's environment as nbgrader_config.py gives it
    # (and the visible checks say what they saw: the release's sealed mistakes come from it)
    with _environ({"COURSE_LAUNCH_PRELOAD": launch_preload(assignment),
                   "COURSE_TRACE_CHECKS": "1"}):
        with tempfile.TemporaryDirectory() as tmp:
            client = sandboxed_client(nb, cases, student="", timeout=timeout,
                                      kernel_name="python3", allow_errors=True,
                                      resources={"metadata": {"path": tmp}})
            with client.setup_kernel():
                for index, cell in enumerate(nb.cells):
                    client.execute_cell(cell, index)
                visible = visible_traces(nb)
                for gid, traces in variant_traces(client, nb, assignment).items():
                    visible[gid] += traces
    subs = submissions_by_cell(nb)
    failed = []
    for cell in nb.cells:
        if is_test_cell(cell):
            gid = _meta(cell)["grade_id"]
            v = judge.judge_cell(rules, gid, [tuple(p) for p in subs[gid]],
                                 [tuple(p) for p in subs[gid]], judge.kernel_error(cell),
                                 cases.get(gid), cases.get(gid), givens_for(assignment, None))
            if not v.passed:
                failed.append(f"{gid}: {v.message}")
    if failed:
        raise RuntimeError(f"the reference solution of {assignment} fails its judge: "
                           + "; ".join(failed))
    return {"submissions": subs, "max_cell_s": _max_cell_seconds(nb), "problems": _problems(nb),
            "visible": visible}


def variant_traces(client, nb, assignment: str) -> dict[str, list[dict]]:
    """The visible checks' traces under every other variant of each check's givens (issue 26):
    for a test cell whose checks name a ``variant=`` (``G.key(...)``), every combination of
    those givens' options (``variants.every_variant``) is set as ``G`` in the reference's
    kernel, then the cell's answer cells and the cell itself run again. The release seals each
    variant's mistakes under its own key, so a student meets those of their own numbers."""
    saved = list(nb.cells)  # nbclient puts each cell it runs into nb.cells[index]: restored
    try:
        return _variant_traces(client, nb, assignment)
    finally:
        nb.cells = saved


def follows_the_givens(cells) -> list[bool]:
    """Per cell: whether its code reads ``G`` or a name that an earlier such cell assigned (a7's
    answers read ``RUN_A``, which the tables cell builds from ``G``): what must run again with
    another student's numbers. The cell that makes ``G`` itself is not one."""
    from course_utils import variants

    tainted, out = {"G"}, []
    for cell in cells:
        try:
            tree = ast.parse(cell.source) if cell.cell_type == "code" else None
        except SyntaxError:
            tree = None
        if tree is None:
            out.append(False)
            continue
        names = [n for n in ast.walk(tree) if isinstance(n, ast.Name)]
        bound = {n.id for n in names if not isinstance(n.ctx, ast.Load)}
        bound |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments)
                  for a in n.posonlyargs + n.args + n.kwonlyargs}
        bound |= {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                  if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        # what the cell reads from earlier cells: names it loads and never binds itself
        reads = any(isinstance(n.ctx, ast.Load) and n.id in tainted - bound for n in names)
        reads = reads and variants.switch_of(cell.source) is None
        if reads:
            tainted |= {n.id for n in names if isinstance(n.ctx, ast.Store)}
        out.append(reads)
    return out


def _variant_traces(client, nb, assignment: str) -> dict[str, list[dict]]:
    from course_utils import variants

    done = visible_traces(nb)
    follows = follows_the_givens(nb.cells)
    # before each test cell, its answer cells run again with the variant's numbers, and so does
    # every earlier cell (not an answer or a test) that reads the givens or what a cell built
    # from them: a7's RUN_A, which its tables cell builds from G (issue 35: without it every
    # variant's seals were the base tables', and rejected right answers)
    answers_of: dict[str, list[int]] = {}
    setup: list[int] = []
    pending: list[int] = []
    for index, cell in enumerate(nb.cells):
        if is_answer_cell(cell):
            pending.append(index)
        elif is_test_cell(cell):
            answers_of[_meta(cell)["grade_id"]] = setup + pending
            pending = []
        elif follows[index]:
            setup.append(index)
    out: dict[str, list[dict]] = {}
    for index, cell in enumerate(nb.cells):
        gid = _meta(cell).get("grade_id")
        if not is_test_cell(cell):
            continue
        keys = {t.get("variant", "") for t in done.get(gid, [])} - {""}
        groups = sorted({tuple(part.split("=", 1)[0] for part in key.split(";")) for key in keys})
        if not groups:
            continue
        # each check's own givens vary, the others stay at their base
        tour = [v for names in groups for v in variants.every_variant(assignment, names)[1:]]
        for values in tour:
            setup = nbformat.v4.new_code_cell(f"G = G.replaced(**{values!r})")
            client.execute_cell(setup, index)
            for a in answers_of[gid]:  # (outputs not kept: a copy runs)
                client.execute_cell(nbformat.from_dict(copy.deepcopy(nb.cells[a])), a)
            again = nbformat.from_dict(copy.deepcopy(cell))
            client.execute_cell(again, index)
            out.setdefault(gid, []).extend(visible_traces(
                nbformat.v4.new_notebook(cells=[again]))[gid])
        client.execute_cell(nbformat.v4.new_code_cell(
            f"G = G.replaced(**{variants.base(assignment)!r})"), index)
    return out


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    """Set environment variables (seen by kernels started inside), then restore them."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _problems(nb) -> list[str]:
    """Error outputs anywhere, and stderr text in test cells, of an executed notebook."""
    found = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                found.append(f"{o.get('ename')}: {o.get('evalue')}")
            elif (is_test_cell(cell) and o.get("output_type") == "stream"
                  and o.get("name") == "stderr"):
                found.append(f"test cell {_meta(cell)['grade_id']} wrote to stderr: "
                             f"{o.get('text', '')[:300]}")
    return found


def _max_cell_seconds(nb) -> float:
    """The longest cell of an executed notebook, in seconds (from nbclient's timing)."""
    from datetime import datetime

    longest = 0.0
    for cell in nb.cells:
        ex = cell.get("metadata", {}).get("execution", {})
        try:
            t0 = datetime.fromisoformat(ex["iopub.execute_input"].replace("Z", "+00:00"))
            t1 = datetime.fromisoformat(ex["shell.execute_reply"].replace("Z", "+00:00"))
        except (KeyError, ValueError):
            continue
        longest = max(longest, (t1 - t0).total_seconds())
    return longest


# ------------------------------------------------------------------------------ static scan

_SUSPECT_MODULES = {"importlib": "imports importlib (can reload or replace modules)",
                    "ctypes": "imports ctypes (can rewrite interpreter memory)",
                    "builtins": "imports builtins",
                    "gc": "imports gc (can reach and change other objects)",
                    "signal": "imports signal (can ignore the grader's interrupt)",
                    "inspect": "imports inspect (can read the test code or frames)",
                    "nbgrader": "imports nbgrader"}
_DUNDERS = {"__eq__", "__ne__", "__float__", "__int__", "__index__", "__bool__", "__abs__",
            "__round__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__instancecheck__",
            "__subclasscheck__", "__getattr__", "__getattribute__", "__class__", "__mro__"}
_BUILTIN_TYPES = {"float", "int", "str", "bool", "list", "tuple", "dict", "complex"}
_FILE_WRITERS = {"open", "write_text", "write_bytes", "mkdir", "makedirs", "copy", "copytree",
                 "symlink_to", "rename", "replace"}


def _dotted(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif isinstance(node, ast.Call):
        parts.append(_dotted(node.func) + "()")
    elif isinstance(node, ast.Subscript):
        parts.append(_dotted(node.value) + "[]")
    else:
        parts.append("?")
    return ".".join(reversed(parts))


def _python_source(source: str) -> str:
    """Cell source as plain Python (IPython magics and shell escapes translated)."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(source)
    except Exception:
        return source


def _parse(source: str):
    """The AST of a cell, or None for a syntax error (that only costs the student the
    question). Anything else the parser raises on hostile code (RecursionError on a chain
    100,000 deep, MemoryError) propagates to :func:`scan_source`'s caller's guard."""
    try:
        return ast.parse(_python_source(source))
    except SyntaxError:
        return None


def scan_source(source: str) -> list[str]:
    """Tampering flags for one answer cell's code (empty list: nothing suspicious). Code the
    scanner cannot parse for another reason than a syntax error is itself a flag."""
    try:
        return _scan_source(source)
    except Exception as err:  # noqa: BLE001 - RecursionError, MemoryError
        return [f"line ?: could not be scanned ({type(err).__name__}): review this cell by hand"]


def _scan_source(source: str) -> list[str]:
    tree = _parse(source)
    if tree is None:
        return []
    flags: list[str] = []
    modules: set[str] = {"math", "sys", "builtins", "course_utils", "checks", "torch", "numpy",
                         "np", "os", "IPython", "nbgrader", "importlib", "dist"}

    def flag(node, text):
        flags.append(f"line {getattr(node, 'lineno', '?')}: {text}")

    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for a in node.names:
                modules.add((a.asname or a.name).split(".")[0])
            for name in names:
                top = name.split(".")[0]
                if top in _SUSPECT_MODULES:
                    flag(node, _SUSPECT_MODULES[top])
                if top == "course_utils" or top == "IPython":
                    if isinstance(node, ast.ImportFrom) and top == "IPython":
                        flag(node, f"imports from {name} (can publish fake check records)")
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, (ast.Attribute, ast.Subscript)):
                    dotted = _dotted(t)
                    root = dotted.split(".")[0].split("[")[0]
                    if root in modules or "sys.modules" in dotted or "__builtins__" in dotted:
                        flag(t, f"assigns to {dotted} (changes a module the tests use)")
                elif isinstance(t, ast.Name) and t.id in {"check_number", "check_choice",
                                                          "check_sequence", "checks",
                                                          "__builtins__"}:
                    flag(t, f"rebinds {t.id} (a name the test cells use)")
        if isinstance(node, ast.Call):
            func = _dotted(node.func)
            last = func.split(".")[-1]
            if last in {"setattr", "delattr"} and node.args:
                target = _dotted(node.args[0])
                if target.split(".")[0] in modules:
                    flag(node, f"calls {last} on {target}")
            if func in {"__import__", "exec", "eval", "compile", "globals", "sys._getframe",
                        "vars"} or (func == "get_ipython" and "get_ipython" in source):
                flag(node, f"calls {func}()")  # (magics become get_ipython() calls: not those)
            if func.startswith("sys.path.") or func.startswith("sys.modules"):
                flag(node, f"calls {func}() (changes where modules are imported from)")
            if func.startswith("os.environ") or func in {"os.putenv", "os.unsetenv"}:
                flag(node, f"calls {func}() (changes the grading environment)")
            if last in {"publish_display_data", "display", "publish"} or func.endswith("display_pub.publish"):
                for arg in ast.walk(node):
                    if isinstance(arg, ast.Constant) and arg.value == SUBMIT_MIME:
                        flag(node, "publishes a fake submission")
            if last in _FILE_WRITERS and any(
                    isinstance(a, ast.Constant) and isinstance(a.value, str)
                    and ("course_utils" in a.value or a.value.endswith(".py"))
                    for a in ast.walk(node)):
                flag(node, f"writes Python files or a course_utils folder ({func})")
        if isinstance(node, ast.Constant) and node.value == SUBMIT_MIME:
            flag(node, "mentions the submission type")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in _DUNDERS:
            flag(node, f"defines {node.name} (an object that can lie to comparisons)")
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                if isinstance(base, ast.Name) and base.id in _BUILTIN_TYPES:
                    flag(node, f"class {node.name} subclasses {base.id}")
            if any(k.arg == "metaclass" for k in node.keywords):
                flag(node, f"class {node.name} sets a metaclass")
        if isinstance(node, ast.Attribute) and node.attr in {"__builtins__", "__globals__",
                                                             "__code__", "__dict__", "f_globals",
                                                             "__subclasses__"}:
            flag(node, f"uses .{node.attr}")
        if isinstance(node, ast.Name) and node.id == "__builtins__":
            flag(node, "uses __builtins__")
    return sorted(set(flags), key=flags.index)


def _course_modules() -> list[str]:
    return sorted(p.stem for p in (ROOT / "course_utils").glob("*.py") if p.stem != "__init__")


def _fold(node) -> str | None:
    """The string an expression always evaluates to, if it is built from constants only
    (``"state" + "_bytes"``, ``f"zero_{'state'}"``, ``"".join(["a", "b"])``), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _fold(node.left), _fold(node.right)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.JoinedStr):
        parts = [_fold(v.value if isinstance(v, ast.FormattedValue) else v) for v in node.values]
        return None if None in parts else "".join(parts)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "join" and len(node.args) == 1
            and isinstance(node.args[0], (ast.List, ast.Tuple))):
        sep = _fold(node.func.value)
        parts = [_fold(e) for e in node.args[0].elts]
        return None if sep is None or None in parts else sep.join(parts)
    return None


_DYNAMIC_IMPORTS = {"importlib.import_module", "import_module", "__import__",
                    "importlib.__import__", "sys.modules.get"}


def helper_uses(source: str, helpers: list[str], setup: str = "") -> list[str]:
    """Which of ``helpers`` (``"memory.zero_state_bytes"``: a ``course_utils`` function, or
    ``"widgets.*"``: anything in that subpackage) the
    code in ``source`` refers to, whatever the spelling: called or named through any import
    alias, named in a string or in a string built from constants
    (``getattr(memory, "state" + "_bytes")``), or possibly reached by a name computed at run
    time (``getattr(memory, name)``, ``vars(memory)``, ``memory.__dict__``,
    ``importlib.import_module(...)``, ``sys.modules[...]``): those are reported as
    ``"<helper> (through a computed name)"``. ``setup``: code that ran before it (the
    release's import cells), whose import aliases count too."""
    wanted = {h: h.split(".") for h in helpers if not h.endswith(".*")}
    packages = {h: h[:-2].split(".") for h in helpers if h.endswith(".*")}  # "widgets.*"
    aliases = {m: m for m in _course_modules()} | {"course_utils": ""}
    star: set[str] = set()
    found: list[str] = []

    def add(h: str) -> None:
        plain = h.split(" ")[0]
        if h == plain and f"{h} (through a computed name)" in found:
            found[found.index(f"{h} (through a computed name)")] = h
        elif h not in found and plain not in found:
            found.append(h)

    def module_of(node) -> str | None:
        """The course_utils module (``"memory"``, or ``""`` for the package) an expression
        names, if it is one."""
        if not isinstance(node, (ast.Name, ast.Attribute)):
            return None
        dotted = _dotted(node).split(".")
        head = aliases.get(dotted[0])
        if head is None:
            return None
        path = [x for x in head.split(".") if x] + dotted[1:]
        name = ".".join(path)
        return name if name == "" or name in _course_modules() else None

    def computed(module: str | None) -> None:
        for h, parts in wanted.items():
            if module is None or module == "" or parts[0] == module:
                add(f"{h} (through a computed name)")

    trees = [t for t in (_parse(setup), _parse(source)) if t is not None]
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "course_utils":
                        inner = a.name.partition(".")[2]
                        aliases[a.asname or "course_utils"] = inner if a.asname else ""
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "course_utils":
                inner = node.module.partition(".")[2]
                for a in node.names:
                    if a.name == "*":
                        star.add(inner)
                    else:
                        aliases[a.asname or a.name] = f"{inner}.{a.name}".strip(".")
    tree = _parse(source)
    for node in ast.walk(tree) if tree is not None else []:
        if isinstance(node, (ast.Attribute, ast.Name)):
            dotted = _dotted(node).split(".")
            head = aliases.get(dotted[0])
            if head is None:
                if not (isinstance(node, ast.Name) and star):
                    continue
                resolved = [[m, node.id] for m in star]
            else:
                resolved = [[x for x in head.split(".") if x] + dotted[1:]]
            for path in resolved:
                for h, parts in wanted.items():
                    if path == parts:
                        add(h)
                for h, parts in packages.items():
                    if path[:len(parts)] == parts and len(path) > len(parts):
                        add(h)
            if isinstance(node, ast.Attribute) and node.attr == "__dict__":
                computed(module_of(node.value))
        elif isinstance(node, ast.Subscript) and _dotted(node.value) == "sys.modules":
            computed(None)
        elif isinstance(node, ast.Call):
            func = _dotted(node.func)
            if func in ("getattr", "operator.attrgetter", "attrgetter") and node.args:
                target = node.args[0] if func == "getattr" else None
                name = node.args[1] if func == "getattr" and len(node.args) > 1 else node.args[0]
                if _fold(name) is None and (target is None or module_of(target) is not None):
                    computed(module_of(target) if target is not None else None)
            elif func in ("vars", "dir", "inspect.getmembers") and node.args:
                module = module_of(node.args[0])
                if module is not None:
                    computed(module)
            elif func in _DYNAMIC_IMPORTS and node.args:
                name = _fold(node.args[0])
                if name is None or name.startswith("course_utils"):
                    computed(name.partition(".")[2] if name else None)
        if isinstance(node, (ast.Constant, ast.BinOp, ast.JoinedStr, ast.Call)):
            text = _fold(node)
            if text is not None:
                for h, parts in wanted.items():
                    if text in (parts[-1], h):
                        add(h)
    return found


def _walk(folder: Path) -> list[tuple[str, str]]:
    """``(relative path, entry kind)`` of everything under ``folder``, from ``lstat`` (a link
    to a folder is a link, not walked into)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            out.append((path.relative_to(folder).as_posix(), entry_kind(path)))
    return sorted(out)


def scan_files(submission: Path, notebooks: list[str]) -> list[str]:
    """Flags for files in the submission folder beside the notebooks (shadowing attempts)."""
    flags = []
    for rel, kind in _walk(submission):
        if rel.startswith(".ipynb_checkpoints") or rel in notebooks or rel == "timestamp.txt":
            continue
        top, suffix = rel.split("/")[0], Path(rel).suffix
        if kind not in ("file", "dir"):
            flags.append(f"submitted {rel}, a {kind} (not read by the grader)")
        elif rel == "course_utils" and kind == "dir":
            flags.append("submitted a course_utils/ folder (would shadow the course's library)")
        elif suffix in {".py", ".pth", ".so"} and not rel.startswith("course_utils/"):
            flags.append(f"submitted a Python file {rel}")
        elif top in {"sitecustomize.py", "usercustomize.py", "math.py", "numpy", "torch"}:
            flags.append(f"submitted {rel} (would shadow a module)")
    return flags


WIDGETS = "widgets.*"
"""The lectures' widgets (``course_utils.widgets``): each shows what a tested function computes,
so an answer cell that may not call the function may not read a widget either."""


def scan_notebook(nb, release, not_allowed: dict[str, list[str]] | None = None) -> list[str]:
    """Flags for one submitted notebook: tampering in its code, edited/deleted test cells, and
    course helpers an answer may not use (``not_allowed``: answer grade_id -> helpers, the
    judge's ``HELPERS_NOT_ALLOWED``; an added cell may use none of them)."""
    flags = []
    not_allowed = not_allowed or {}
    release_tests = {_meta(c)["grade_id"]: c for c in release.cells if is_test_cell(c)}
    setup = "\n".join(c.source for c in release.cells  # the release's own locked code cells
                      if c.get("cell_type") == "code" and not is_test_cell(c)
                      and not is_answer_cell(c))
    flags += restore_metadata(copy.deepcopy(nb), release)
    # the lectures' widgets compute what the helpers do: not allowed where a helper is not
    not_allowed = {gid: hs + [WIDGETS] for gid, hs in not_allowed.items()}
    every_helper = sorted({h for hs in not_allowed.values() for h in hs})
    seen = {}
    for cell in nb.cells:
        m = _meta(cell)
        gid = m.get("grade_id")
        if gid in release_tests:
            seen[gid] = cell
            continue
        if cell.get("cell_type") != "code":
            continue
        where = f"cell {gid}" if gid else "an added cell"
        flags += [f"{where}, {f}" for f in scan_source(cell.source)]
        helpers = not_allowed.get(gid, []) if gid else every_helper
        try:
            used = helper_uses(cell.source, helpers, setup)
        except Exception as err:  # noqa: BLE001 - RecursionError on hostile code
            flags.append(f"{where}, could not be checked for course helpers "
                         f"({type(err).__name__}): review it by hand")
            used = []
        for h in used:
            flags.append(f"{where}, uses course_utils.{h}, which computes a graded answer "
                         f"(the question asks for the reasoning: review it)")
    for gid, cell in release_tests.items():
        if gid not in seen:
            flags.append(f"test cell {gid} was deleted (restored by the grader)")
        elif seen[gid].source.strip() != cell.source.strip():
            flags.append(f"test cell {gid} was edited (restored by the grader)")
    return flags


# ------------------------------------------------------------------------------ digests


class ResultsChanged(RuntimeError):
    """An autograded notebook changed after grading ended: the report refuses to go on."""


def _digests_path(assignment: str, data: Path) -> Path:
    return data / "digests" / f"{assignment}.json"


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(read_regular(path, MAX_NOTEBOOK_BYTES)).hexdigest()
    except OSError as err:
        return f"unreadable ({err})"


def record_digests(assignment: str, students: list[str], data: Path,
                   finished: list[str] | None = None) -> Path:
    """When grading ends: the SHA-256 of each graded student's autograded notebooks, and how
    the kernels were isolated. :func:`report` refuses to run if any of them changes later.
    ``finished``: the students whose grading ran to its end (whatever nbgrader made of their
    notebook): the digest of the submission graded is kept for them (:func:`graded_submissions`),
    so a re-run can grade only the submissions not yet graded."""
    from grading import sandbox

    path = _digests_path(assignment, data)
    book = (json.loads(read_regular(path, MAX_NOTEBOOK_BYTES)) if entry_kind(path) == "file"
            else {"students": {}})
    book["isolation"] = sandbox.description()
    submitted = book.setdefault("submitted", {})
    for student in students:
        auto = data / "autograded" / student / assignment
        files = {n: auto / n for n in notebook_names(assignment)}
        files.update({f"judge log {n}": judge.log_path(data, assignment, student, n)
                      for n in notebook_names(assignment)})
        book["students"][student] = {n: _sha256(f) for n, f in files.items()
                                     if entry_kind(f) == "file"}
        submitted.pop(student, None)
    for student in finished or []:
        submitted[student] = submission_digest(assignment, student, data)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, json.dumps(book, indent=1, sort_keys=True))
    return path


def submission_digest(assignment: str, student: str, data: Path) -> str | None:
    """SHA-256 over the names and contents of the regular files of
    ``submitted/<student>/<assignment>/`` (None: no such folder). The folder is the grader's own
    copy (``collect``); no link is followed."""
    top = data / "submitted" / student / assignment
    if entry_kind(top) != "dir":
        return None
    h = hashlib.sha256()
    for folder, dirs, files in os.walk(top):  # (os.walk follows no link to a folder)
        dirs.sort()
        for name in sorted(files):
            path = Path(folder) / name
            if entry_kind(path) == "file":
                h.update(path.relative_to(top).as_posix().encode() + b"\0")
                h.update(_sha256(path).encode() + b"\0")
    return h.hexdigest()


def graded_submissions(assignment: str, data: Path) -> dict[str, str]:
    """``{student: digest of the submission graded}`` for every student whose grading ran to
    its end and whose recorded results are all still there (see :func:`record_digests`)."""
    path = _digests_path(assignment, data)
    if entry_kind(path) != "file":
        return {}
    book = json.loads(read_regular(path, MAX_NOTEBOOK_BYTES))
    out = {}
    for student, digest in book.get("submitted", {}).items():
        files = book["students"].get(student, {})
        present = all(entry_kind(
            judge.log_path(data, assignment, student, name.removeprefix("judge log "))
            if name.startswith("judge log ") else data / "autograded" / student / assignment / name)
            == "file" for name in files)
        if present and digest:
            out[student] = digest
    return out


def _not_graded_path(assignment: str, data: Path) -> Path:
    return data / "logs" / f"not-graded-{assignment}.json"


def record_not_graded(assignment: str, data: Path, reasons: dict[str, str | None]) -> None:
    """Keep why each student's grading did not finish (a worker or a Slurm task stopped), for
    the report's "not graded (why)"; a None reason forgets the student's earlier one."""
    path = _not_graded_path(assignment, data)
    book = not_graded_reasons(assignment, data)
    for student, why in reasons.items():
        if why is None:
            book.pop(student, None)
        else:
            book[student] = why
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, json.dumps(book, indent=1, sort_keys=True), mode=0o644)


def not_graded_reasons(assignment: str, data: Path) -> dict[str, str]:
    """``{student: why their grading did not finish}`` (see :func:`record_not_graded`)."""
    path = _not_graded_path(assignment, data)
    if entry_kind(path) != "file":
        return {}
    return {str(k): str(v) for k, v in json.loads(read_regular(path, 50_000_000)).items()}


def check_digests(assignment: str, data: Path) -> dict:
    """The recorded digests (see :func:`record_digests`); raises :class:`ResultsChanged`
    naming each student whose autograded notebook is no longer what grading wrote."""
    path = _digests_path(assignment, data)
    if entry_kind(path) != "file":
        return {"students": {}, "isolation": "unknown (no record of the autograde run)"}
    book = json.loads(read_regular(path, MAX_NOTEBOOK_BYTES))
    changed = []
    for student, files in sorted(book["students"].items()):
        for name, digest in files.items():
            f = (judge.log_path(data, assignment, student, name.removeprefix("judge log "))
                 if name.startswith("judge log ") else data / "autograded" / student / assignment / name)
            if _sha256(f) != digest:
                changed.append(f"{student} ({name})")
    if changed:
        raise ResultsChanged(
            f"report refused: the autograded results of {', '.join(changed)} changed after "
            f"grading ended (digests in {path}); autograde them again")
    return book


# ------------------------------------------------------------------------------ verdicts


@dataclass
class CellResult:
    """One test cell of one student: the judge's verdict and nbgrader's score."""

    grade_id: str
    max_score: float
    kernel_score: float      # what nbgrader saved (from the outputs the judge wrote)
    score: float             # the judge's
    message: str = ""        # the mistake the judge named
    problems: list[str] = field(default_factory=list)


@dataclass
class StudentResult:
    """One student's result for one assignment."""

    student: str
    status: str              # "graded" or "not graded: <reason>"
    score: float | None = None
    kernel_score: float | None = None
    max_score: float = 0.0
    manual_pending: float = 0.0
    cells: list[CellResult] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    limits: list[str] = field(default_factory=list)  # grading limits that fired (judge log)
    seconds: float | None = None  # running and judging its notebooks took (judge log)

    @property
    def graded(self) -> bool:
        return self.status == "graded"

    @property
    def failed_cells(self) -> list[CellResult]:
        return [c for c in self.cells if c.score < c.max_score]


def verify_cell(cell, verdict: judge.Verdict | None) -> CellResult:
    """One autograded test cell: the judge's verdict, checked against what nbgrader scored."""
    from nbgrader.utils import determine_grade

    kernel, max_score = determine_grade(cell)
    kernel, max_score = float(kernel or 0.0), float(max_score)
    gid = _meta(cell)["grade_id"]
    if verdict is None:
        return CellResult(gid, max_score, kernel, 0.0, "the judge never saw this cell",
                          ["the judge never saw this cell (not graded through the judge?)"])
    result = CellResult(gid, max_score, kernel, max_score if verdict.passed else 0.0,
                        verdict.message)
    if result.score != kernel:
        result.problems.append(f"nbgrader scored {kernel:g}, the judge {result.score:g}")
    return result


def _roster(assignment: str, data: Path) -> list[str]:
    students = {p.name for p in (data / "submitted").glob("*") if entry_kind(p) == "dir"}
    db = data / "gradebook.db"
    if db.exists():
        from nbgrader.api import Gradebook

        with Gradebook(f"sqlite:///{db}") as gb:
            students |= {s.id for s in gb.students}
    return sorted(students)


def verify_student(assignment: str, student: str, data: Path) -> StudentResult:
    """The verified result of one student (see the module doc for the rules). Whatever the
    submission holds, this returns a result: a failure of the grader itself on it is that
    student's 0, with the reason as a flag (never a crash of the report for everyone)."""
    try:
        return _inert(_verify_student(assignment, student, data))
    except Exception as err:  # noqa: BLE001 - RecursionError, MemoryError, a broken file
        release = nbformat.read(ROOT / "assignments" / assignment /
                                notebook_names(assignment)[0], as_version=4)
        points = sum(float(_meta(c).get("points", 0)) for c in release.cells if is_test_cell(c))
        return StudentResult(student, "graded", score=0.0, kernel_score=None,
                             max_score=points, flags=[
                                 f"the grader failed on this submission ({type(err).__name__}: "
                                 f"{str(err)[:200]}); scored 0: review it by hand"])


def _inert(result: StudentResult) -> StudentResult:
    """``result`` with every text a student could have written into it (an exception's name
    and message, a file or metadata name, a flagged line) as one line, control characters
    escaped: no report line can be forged or hidden (``grading.inert.one_line``)."""
    result.status = one_line(result.status)
    result.flags = [one_line(f) for f in result.flags]
    result.limits = [one_line(x) for x in result.limits]
    for cell in result.cells:
        cell.message = one_line(cell.message)
        cell.problems = [one_line(p) for p in cell.problems]
    return result


def collect_log(assignment: str, data: Path | None = None) -> dict[str, list[str]]:
    """What the last ``collect`` of ``assignment`` skipped, per student (empty if none)."""
    path = (data or data_dir()) / "logs" / f"collect-{assignment}.json"
    if entry_kind(path) != "file":
        return {}
    return json.loads(read_regular(path, 10_000_000))


def _verify_student(assignment: str, student: str, data: Path) -> StudentResult:
    names = notebook_names(assignment)
    sub = data / "submitted" / student / assignment
    auto = data / "autograded" / student / assignment
    result = StudentResult(student, "graded")
    if entry_kind(sub) != "dir":
        result.status = "not graded: no submission"
        return result
    result.flags += scan_files(sub, names)
    result.flags += [f"collect skipped {line}" for line in
                     collect_log(assignment, data).get(student, [])]
    rules = judge.load(assignment)
    for name in names:
        release = nbformat.read(ROOT / "assignments" / assignment / name, as_version=4)
        if entry_kind(sub / name) == "missing":
            others = sorted(p.name for p in sub.glob("*.ipynb"))
            result.status = (f"not graded: notebook {name} missing"
                             + (f" (found {', '.join(others)})" if others else ""))
            return result
        try:
            submitted = read_notebook(sub / name)
        except Exception as err:  # malformed JSON, not a notebook, not a regular file
            result.status = f"not graded: {name} is not a valid notebook ({str(err)[:80]})"
            return result
        result.flags += scan_notebook(submitted, release,
                                      getattr(rules, "HELPERS_NOT_ALLOWED", {}))
        result.flags += identity_flags(assignment, student, submitted)
        if entry_kind(auto / name) != "file":
            why = not_graded_reasons(assignment, data).get(student)
            result.status = f"not graded: {why or 'autograde failed (see the autograde log)'}"
            return result
        graded = read_notebook(auto / name)
        log = judge.log_path(data, assignment, student, name)
        verdicts = judge.read_log(log) if entry_kind(log) == "file" else {}
        result.limits += judge.read_limits(log) if entry_kind(log) == "file" else []
        took = judge.read_seconds(log) if entry_kind(log) == "file" else None
        if took is not None:
            result.seconds = (result.seconds or 0.0) + took
        for cell in graded.cells:
            m = _meta(cell)
            if is_test_cell(cell):
                res = verify_cell(cell, verdicts.get(m["grade_id"]))
                result.cells.append(res)
                result.flags += [f"{res.grade_id}: {p}" for p in res.problems]
            elif m.get("grade") and m.get("solution"):
                result.manual_pending += float(m.get("points", 0))
    result.max_score = sum(c.max_score for c in result.cells)
    result.kernel_score = sum(c.kernel_score for c in result.cells)
    result.score = sum(c.score for c in result.cells)
    return result


def verify_assignment(assignment: str, data: Path | None = None,
                      students: list[str] | None = None) -> list[StudentResult]:
    """Verified results of every student on the roster (or of ``students``), with the
    copied-answer evidence (:func:`copied_answers`) among them."""
    data = data or data_dir()
    results = [verify_student(assignment, s, data) for s in (students or _roster(assignment, data))]
    for result, flags in zip(results, copied_answers(assignment, results, data)):
        result.flags += flags
    return results


# ------------------------------------------------------------------------------ variants

_WORKED_AS = re.compile(r"Your numbers for \S+ \((?:student (?P<who>[A-Za-z0-9][A-Za-z0-9._@+-]"
                        r"{0,99})|(?P<base>the base numbers))\)")


def worked_as(nb) -> str | None:
    """Whose numbers the submitted notebook showed when the student ran it, read from the
    output of its ``variants.givens`` cell: an identity, ``""`` for the base numbers, None when
    the cell has no such output (outputs cleared). Hostile text: only this pattern is read."""
    from course_utils import variants

    for cell in nb.cells:
        source = cell.get("source", "") if isinstance(cell, dict) else ""
        try:
            givens_cell = (cell.get("cell_type") == "code" and isinstance(source, str)
                           and variants.switch_of(source) is not None)
        except ValueError:  # its on= edited into a non-literal: not the released cell
            givens_cell = False
        if not givens_cell:
            continue
        outputs = cell.get("outputs")
        for out in outputs[:5] if isinstance(outputs, list) else []:
            data = out.get("data") if isinstance(out, dict) else None
            text = data.get("text/plain", "") if isinstance(data, dict) else ""
            text = "".join(t for t in text if isinstance(t, str))[:500] \
                if isinstance(text, list) else text[:500] if isinstance(text, str) else ""
            m = _WORKED_AS.match(text)
            if m:
                return m.group("who") or ""
        return None
    return None


def identity_flags(assignment: str, student: str, submitted) -> list[str]:
    """A flag when the submitted notebook was worked with numbers other than the student's own
    (another identity typed, or none set); the grade is on the student's own either way."""
    own = givens_for(assignment, student)
    if own is None or own.student is None:
        return []  # no givens, or variants off: everyone has the base numbers
    shown = worked_as(submitted)
    if shown is None or shown == student:
        return []
    whose = f"{shown}'s numbers (the identity it ran under)" if shown else \
        "the base numbers (no identity was set where it ran)"
    return [f"the notebook was worked with {whose}, not {student}'s own; graded on "
            f"{student}'s own numbers"]


def _informative(rules, assignment: str, samples: int = 100) -> dict[str, bool]:
    """Per test cell judged by checks alone: whether its right answer takes at least 5 values
    over ``samples`` students' numbers (a True/False or a stage number does not: matching
    another student's variant there is chance, not evidence)."""
    from course_utils import variants

    seen: dict[str, set] = {}
    for i in range(samples):
        g = variants.givens(assignment, student=f"sample{i:03d}")
        for gid, values in expected.right_values(rules, g).items():
            seen.setdefault(gid, set()).add(repr(sorted(values.items())))
    return {gid: len(answers) >= 5 for gid, answers in seen.items()}


def copied_answers(assignment: str, results: list[StudentResult],
                   data: Path) -> list[list[str]]:
    """Per student (in ``results``' order): the evidence that an answer was copied, one line per
    failed test cell whose values, wrong for the student's own numbers, pass that cell's judge
    with another student's numbers ("q1_test: the answer is right for bob's numbers, not
    carol's own"). Evidence for the instructor, never a score. Left out: cells whose right
    answer takes few values (:func:`_informative`) and cells with hidden cases drawn per
    submission (a copied function is not a copied number)."""
    if givens_for(assignment, None) is None or len(results) < 2:
        return [[] for _ in results]
    rules = judge.load(assignment)
    skip = set(getattr(rules, "HIDDEN_CASES", {}))
    skip |= {gid for gid, yes in _informative(rules, assignment).items() if not yes}
    own = {r.student: givens_for(assignment, r.student) for r in results if r.graded}
    reference = {gid: pairs for run in reference_run(assignment, data).values()
                 for gid, pairs in run["submissions"].items()}
    failed: dict[str, dict[str, list]] = {}
    for r in results:
        if not r.graded:
            continue
        for name in notebook_names(assignment):
            path = judge.log_path(data, assignment, r.student, name)
            if entry_kind(path) == "file":
                failed.setdefault(r.student, {}).update(judge.read_values(path)[1])
    out = []
    for r in results:
        try:
            out.append(_copied_by(r, failed.get(r.student, {}), skip, own, reference, rules))
        except Exception as err:  # noqa: BLE001 - one student's evidence never stops the report
            out.append([f"could not compare this student's answers with the class "
                        f"({type(err).__name__}): review by hand"])
    return out


def _copied_by(r: StudentResult, failed: dict, skip: set, own: dict, reference: dict,
               rules) -> list[str]:
    """One student's lines of :func:`copied_answers` (``failed``: their failed cells' values)."""
    lines = []
    for gid, pairs in failed.items():
        if gid in skip or not any(c.grade_id == gid for c in r.failed_cells):
            continue
        mine = own[r.student]
        ref = [tuple(p) for p in reference.get(gid, [])]
        peers = [p for p, g in own.items() if p != r.student and dict(g) != dict(mine)
                 and judge.judge_cell(rules, gid, pairs, ref, givens=g).passed]
        if peers:
            shown = peers[:3] + ([f"{len(peers) - 3} more"] if len(peers) > 3 else [])
            named = " and ".join(shown) if len(shown) < 3 else \
                ", ".join(shown[:-1]) + " and " + shown[-1]
            lines.append(f"{gid}: the answer is right for the numbers of {named}, not "
                         f"{r.student}'s own (evidence of a copied answer, not a score: "
                         "docs/instructor.md)")
    return lines


def report(assignment: str, data: Path | None = None,
           students: list[str] | None = None) -> tuple[list[StudentResult], Path]:
    """Write ``reports/<assignment>.csv``, ``.txt`` (the class summary, then every student) and
    ``.html`` (the class report as a page: ``grading.class_report``); returns the results and
    the CSV path."""
    data = data or data_dir()
    book = check_digests(assignment, data)
    results = verify_assignment(assignment, data, students)
    out = data / "reports"
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / f"{assignment}.csv"
    import io

    with io.StringIO(newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "status", "score", "max_score", "nbgrader_score",
                    "manual_points_pending", "failed_cells", "mistakes", "flags", "limits"])
        for r in results:
            w.writerow([r.student, r.status,
                        "" if r.score is None else f"{r.score:g}",
                        f"{r.max_score:g}" if r.graded else "",
                        "" if r.kernel_score is None else f"{r.kernel_score:g}",
                        f"{r.manual_pending:g}" if r.graded else "",
                        " ".join(c.grade_id for c in r.failed_cells),
                        " | ".join(f"{c.grade_id}: {c.message}" for c in r.failed_cells
                                   if c.message),
                        " | ".join(condense(r.flags)), " | ".join(r.limits)])
        write_private(csv_path, f.getvalue(), mode=0o644)
    from grading import class_report

    summary = class_report.summarize(assignment, results)
    write_private(out / f"{assignment}.txt",
                  render_text(assignment, results, book["isolation"],
                              class_summary=class_report.render_text(summary)), mode=0o644)
    write_private(out / f"{assignment}.html",
                  class_report.render_html(summary, results, book["isolation"]), mode=0o644)
    return results, csv_path


def condense(flags: list[str]) -> list[str]:
    """Merge flags that differ only by cell and line: "cells q1, q2: assigns to math.isclose"."""
    import re

    groups: dict[str, list[str]] = {}
    for flag in flags:
        m = re.match(r"cell (\S+), line \S+: (.*)", flag)
        if m:
            groups.setdefault(m.group(2), [])
            if m.group(1) not in groups[m.group(2)]:
                groups[m.group(2)].append(m.group(1))
        else:
            groups.setdefault(flag, [])
    return [f"{text} (cells {', '.join(cells)})" if cells else text
            for text, cells in groups.items()]


def render_text(assignment: str, results: list[StudentResult], isolation: str = "",
                class_summary: str = "") -> str:
    """The report as plain text, one block per student (after ``class_summary``, the class
    report's text, when given: ``grading.class_report``)."""
    lines = [f"Assignment {assignment}: {len(results)} students", ""]
    if isolation:
        lines += [f"grading kernels: {isolation}", ""]
    graded = [r for r in results if r.graded]
    not_graded = [r for r in results if not r.graded]
    flagged = [r for r in results if r.flags]
    lines.append(f"graded {len(graded)}, NOT graded {len(not_graded)}, flagged {len(flagged)}")
    lines.append("(score = autograded points as the judge decided them outside the kernels; "
                 "manual questions are graded in the formgrader)")
    lines.append("")
    if class_summary:
        lines += [class_summary.rstrip("\n"), "", "EVERY STUDENT", ""]
    for r in results:
        if not r.graded:
            lines.append(f"{r.student}: NOT GRADED ({r.status.split(': ', 1)[-1]})")
        else:
            note = "" if r.score == r.kernel_score else f" (nbgrader said {r.kernel_score:g})"
            lines.append(f"{r.student}: {r.score:g} / {r.max_score:g}{note}"
                         + (f", {r.manual_pending:g} manual points to grade"
                            if r.manual_pending else ""))
            for c in r.failed_cells:
                lines.append(f"    failed {c.grade_id} ({c.score:g}/{c.max_score:g}): "
                             f"{c.message or 'no message'}")
        for flag in condense(r.flags):
            lines.append(f"    FLAG {flag}")
        for limit in r.limits:
            lines.append(f"    LIMIT {limit}")
        lines.append("")
    # every line is one line, whatever a student wrote into it (the class summary's own lines
    # were assembled the same way); the report's own line breaks are the only ones
    return inert_lines("\n".join(lines))

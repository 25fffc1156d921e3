"""The reference run: the solution notebook run once in the sandbox, its submissions recorded.

Each test cell's submissions are the judge's expected values (``grading.judge``); the run also
records what each visible check saw under every variant of the givens it names (the release
seals each variant's known mistakes under its own key: ``grading.visible``). The reference must
pass its own judge, and runs only when the solution and its judge are git's ``HEAD``
(:func:`check_committed`). Cached by content hash (:func:`reference_cache_path`).

With ``tour=True`` the same kernel then goes on a judge tour (:func:`judge_tour`): the cells
that follow the givens and the test cells again with 20 other students' numbers, and the test
cells with hidden inputs on two other keys' draws, their submissions recorded for the tests to
judge at value level (one kernel per assignment serves the reference and these checks).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import hashlib
import json
import os
import tempfile
from pathlib import Path

import nbformat

from grading import judge
from grading.course import (
    MAX_NOTEBOOK_BYTES,
    ROOT,
    _meta,
    bound_names,
    data_dir,
    givens_for,
    is_answer_cell,
    is_test_cell,
    notebook_names,
    release_notebook,
    visible_traces,
)
from grading.files import entry_kind, read_regular, write_private


def submissions_by_cell(nb) -> dict[str, list]:
    """``{grade_id: [[name, value], ...]}`` submitted by every test cell of an executed notebook."""
    return {_meta(cell)["grade_id"]: [list(pair) for pair in judge.submissions(cell)]
            for cell in nb.cells if is_test_cell(cell)}


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
                  ROOT / "grading" / "reference.py", ROOT / "grading" / "course.py",
                  *sorted((ROOT / "course_utils").rglob("*.py")))
    return cache / assignment / f"{Path(notebook).stem}.{key}.json"


CACHE_ENV = "COURSE_REFERENCE_CACHE"  # where reference runs are cached, when not said otherwise
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


TOUR_ENV = "COURSE_REFERENCE_TOUR"  # "1": reference runs go on the judge tour (the test suite)


def reference_run(assignment: str, data: Path | None = None, timeout: int = 600,
                  cache: Path | None = None, committed: bool = True,
                  tour: bool | None = None) -> dict[str, dict]:
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
    and the reference runs again (``$COURSE_REFERENCE_CACHE``, where set, is the cache when none
    is given: the grading workers and the report share it). ``committed=False`` (building the
    release from the author's own edits) skips :func:`check_committed`. ``tour``: the run also
    holds ``"tour"`` (:func:`judge_tour`); default: ``$COURSE_REFERENCE_TOUR`` is "1". Two
    processes asking for the same run wait for one to make it (a lock beside the cache entry).
    """
    data = data or data_dir()
    shared = os.environ.get(CACHE_ENV)
    cache = cache or (Path(shared) if shared else data / "reference")
    tour = os.environ.get(TOUR_ENV) == "1" if tour is None else tour
    out = {}
    for name in notebook_names(assignment):
        path = reference_cache_path(assignment, name, cache)
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path.with_suffix(".lock")):
            if entry_kind(path) == "file":
                out[name] = json.loads(read_regular(path, MAX_NOTEBOOK_BYTES))
                toured = out[name].get("tour", {})
                if not tour or toured.get("release") == _release_digest(assignment, name):
                    continue  # (a tour is of the release as it is: its leak scan runs its cells)
            if committed:
                check_committed(assignment)
            out[name] = _run_reference(assignment, name, timeout, tour)
            write_private(path, json.dumps(out[name], indent=1))  # a reader: all of it or none
    return out


@contextlib.contextmanager
def _locked(path: Path):
    """Hold an exclusive lock on ``path`` (made if missing) while the block runs."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


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
    # read from the judge's source, not imported: a judge imports torch (2 s of CPU), and the
    # grader only needs this one constant before its workers start
    import ast

    preload = "light"
    for node in ast.parse((judge.JUDGES / f"{assignment}.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "LAUNCH_PRELOAD"
                                                for t in node.targets):
            preload = ast.literal_eval(node.value)
    if preload not in ("light", "full"):
        raise ValueError(f"{assignment}'s judge: LAUNCH_PRELOAD must be 'light' or 'full', got "
                         f"{preload!r}")
    return preload


def _run_reference(assignment: str, name: str, timeout: int, tour: bool = False) -> dict:
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
                                      shutdown_kernel="immediate",  # as nbgrader_config.py
                                      resources={"metadata": {"path": tmp}})
            with client.setup_kernel():
                for index, cell in enumerate(nb.cells):
                    client.execute_cell(cell, index)
                visible = visible_traces(nb)
                for gid, traces in variant_traces(client, nb, assignment).items():
                    visible[gid] += traces
                toured = (judge_tour(client, nb, assignment, rules, cases, notebook=name)
                          if tour else None)
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
    out = {"submissions": subs, "max_cell_s": _max_cell_seconds(nb), "problems": _problems(nb),
           "visible": visible}
    if toured is not None:
        out["tour"] = toured
    return out


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
    from course_utils.assess import variants

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
    from course_utils.assess import variants

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
                _rerun(client, nb.cells[a], a)
            again = _rerun(client, cell, index)
            out.setdefault(gid, []).extend(visible_traces(
                nbformat.v4.new_notebook(cells=[again]))[gid])
        client.execute_cell(nbformat.v4.new_code_cell(
            f"G = G.replaced(**{variants.base(assignment)!r})"), index)
    return out


TOUR_STUDENTS = 20  # students with distinct numbers on the judge tour
TOUR_KEYS = ("student-a", "student-b")  # two more draws beside the reference's own


def tour_students(assignment: str, n: int = TOUR_STUDENTS) -> list[str]:
    """The first ``n`` ids ``student000``, ``student001``, ... whose numbers (variants) differ
    from every earlier one's; [] for an assignment without givens."""
    from course_utils.assess import variants

    if givens_for(assignment, None) is None:
        return []
    out, seen = [], set()
    for i in range(50 * n):
        g = variants.givens(assignment, student=f"student{i:03d}")
        if g.variant not in seen:
            seen.add(g.variant)
            out.append(g.student)
            if len(out) == n:
                return out
    raise RuntimeError(f"{assignment}: fewer than {n} distinct variants among {50 * n} ids")


def judge_tour(client, nb, assignment: str, rules, cases: dict,
               notebook: str | None = None) -> dict:
    """In the reference's kernel after its run: ``{"students": {student: {grade_id:
    [submissions, kernel error]}}, "draws": {key: {grade_id: [submissions, kernel error]}},
    "left": {student or "": {grade_id: {name: numbers}}}}``.

    *students* (:func:`tour_students`): ``G`` set to the student's numbers, then every cell
    that follows the givens (:func:`follows_the_givens`) and every test cell whose inputs are
    not drawn, run again in order; *draws*: with the base numbers back (and the cells that
    follow them run again), for each of :data:`TOUR_KEYS` the hidden inputs of that key set in
    the kernel and each test cell with drawn inputs run again. The reference's own draw
    (``cases``) is put back after; ``nb`` is left as it was. *left*: after the base run and
    each student's, each released test cell of numbers of ``notebook`` run with its answers
    made wrong, and the numbers its own names then hold (:func:`_left`, for the leak scan)."""
    saved = list(nb.cells)  # (nbclient puts each cell it runs into nb.cells[index])
    try:
        return _judge_tour(client, nb, assignment, rules, cases, notebook)
    finally:
        nb.cells = saved


def _rerun(client, cell, index: int):
    """A copy of ``cell`` run again at ``index``: the copy, with its outputs."""
    again = nbformat.from_dict(copy.deepcopy(cell))
    client.execute_cell(again, index)
    return again


def _recorded(cell) -> list:
    """``[submissions, kernel error]`` of a test cell that ran."""
    return [[list(p) for p in judge.submissions(cell)], judge.kernel_error(cell)]


def _judge_tour(client, nb, assignment: str, rules, cases: dict,
                notebook: str | None = None) -> dict:
    def run(code: str) -> None:
        client.execute_cell(nbformat.v4.new_code_cell(code), 0)

    drawn = set(getattr(rules, "HIDDEN_CASES", {}))
    out: dict[str, dict] = {"students": {}, "draws": {}}
    follows = follows_the_givens(nb.cells)
    cells = [(i, c) for i, c in enumerate(nb.cells)
             if (follows[i] and not (is_test_cell(c) and _meta(c)["grade_id"] in drawn))
             or (is_test_cell(c) and _meta(c)["grade_id"] not in drawn)]
    students = tour_students(assignment)
    released = _released_tests(assignment, notebook or notebook_names(assignment)[0])
    answers = {_meta(c)["grade_id"]: [n for n, _ in judge.submissions(c)]
               for _, c in cells if is_test_cell(c)}  # (the tests of numbers, not drawn)
    out["left"] = {"": _left(client, released, answers)}
    out["release"] = _release_digest(assignment, notebook or notebook_names(assignment)[0])
    if students:
        run("_tour_base_G = G")
    for student in students:
        run(f"G = variants.givens({assignment!r}, student={student!r})")
        seen = out["students"][student] = {}
        for index, cell in cells:
            again = _rerun(client, cell, index)
            if is_test_cell(cell):
                seen[_meta(cell)["grade_id"]] = _recorded(again)
        out["left"][student] = _left(client, released, answers)
    if students:  # the base numbers back, and what the cells built from them
        run("G = _tour_base_G\ndel _tour_base_G")
        for index, cell in cells:
            if not is_test_cell(cell):
                _rerun(client, cell, index)
    tests = {_meta(c)["grade_id"]: (i, c) for i, c in enumerate(nb.cells) if is_test_cell(c)}
    for key in TOUR_KEYS if drawn else ():
        run(_set_cases(judge.hidden_cases(rules, key)))
        out["draws"][key] = {gid: _recorded(_rerun(client, tests[gid][1], tests[gid][0]))
                             for gid in sorted(drawn)}
    if drawn:
        run(_set_cases(cases))
    return out


def _release_digest(assignment: str, notebook: str) -> str:
    """A short hash of the release's test cells of this notebook ("" before the first)."""
    h = hashlib.sha256()
    for gid, source in sorted(_released_tests(assignment, notebook).items()):
        h.update(f"{gid}\0{source}\0".encode())
    return h.hexdigest()[:16]


def _released_tests(assignment: str, notebook: str) -> dict[str, str]:
    """``{grade_id: source}`` of the release's test cells of this notebook (none before the
    first release)."""
    release = release_notebook(assignment, notebook)
    return {_meta(c)["grade_id"]: c.source for c in (release.cells if release else [])
            if is_test_cell(c)}


_LEFT = """import json as _course_json
def _course_numbers(v):
    if isinstance(v, bool):
        return []
    if isinstance(v, (int, float)):
        return [float(v)]
    if getattr(v, "ndim", None) == 0 and hasattr(v, "item"):
        return _course_numbers(v.item())
    if isinstance(v, (list, tuple)) and len(v) <= 64:
        return [x for e in v if not isinstance(e, (list, tuple)) for x in _course_numbers(e)]
    return []
def _course_wrong(v):
    if isinstance(v, (list, tuple)):
        return type(v)(_course_wrong(e) for e in v)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return v
    return type(v)(v * 37 + 11) if isinstance(v, int) else v * 1.37 + 0.11
_course_saved = {n: globals()[n] for n in %(answers)r if n in globals()}
globals().update({n: _course_wrong(v) for n, v in _course_saved.items()})
try:
    exec(compile(%(source)r, "<released test cell>", "exec"), globals())
except Exception:
    pass
print("COURSE-LEFT " + _course_json.dumps({n: _course_numbers(globals()[n]) for n in %(names)r
                                           if n in globals()}))
globals().update(_course_saved)
del _course_json, _course_numbers, _course_wrong, _course_saved
"""


def _left(client, released: dict[str, str], answers: dict[str, list[str]]) -> dict:
    """``{grade_id: {name: numbers}}``: each released test cell run in the kernel now with its
    answers made wrong (``answers``: the names it checks), and the numbers then held by the
    names it binds (an int or float, a 0-d array, a short list of them). A value that equals a
    right answer there came from the cell, not from the student: the leak scan of
    ``tests/test_variant_grading.py``. The answers are put back after."""
    out = {}
    for gid, source in released.items():
        if gid not in answers:
            continue
        cell = nbformat.v4.new_code_cell(_LEFT % {
            "answers": answers[gid], "source": source,
            "names": [n for n in bound_names(source) if n.startswith("_")]})
        client.execute_cell(cell, 0)
        for output in cell.get("outputs", []):
            for line in str(output.get("text", "")).splitlines():
                if line.startswith("COURSE-LEFT "):
                    out[gid] = json.loads(line[len("COURSE-LEFT "):])
    return out


def _set_cases(cases: dict) -> str:
    """Kernel code that makes ``cases`` the hidden inputs its checks read."""
    return (f"import os as _os\n_os.environ['COURSE_HIDDEN_CASES'] = "
            f"{json.dumps(json.dumps(cases))}\ndel _os")


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

"""How a failure reaches the student in a notebook: one short block that says what to do.

Importing ``course_utils`` in an IPython kernel calls :func:`install`, which registers
:func:`show` as the shell's handler for the errors below (``InteractiveShell.set_custom_exc``)
and notes which cell is running (its id: what the notebook file names it by):

* a failed check, in the kernel or on a rank: one line, ``Not right yet: <the message>``. A
  check is ``checks.CheckFailed``, or an ``assert`` with a message raised by the cell itself
  (a visible test's) or by the course's own code (``capstone.diagnose``, ``pitfalls.check``);
  an ``assert`` inside the student's own function keeps its traceback;
* a question not answered yet: one line, ``Not answered yet: ...``, naming the code cell that
  still holds nbgrader's placeholder (``raise NotImplementedError()``): the placeholder raised
  in the cell, in a function the student was to write (in the kernel or on a rank), or a name
  no cell defines while an answer cell still holds the placeholder;
* a name an earlier cell defines, used in the cell, in a function a cell defined, on a rank, or
  read as ``globals()[name]`` (after a kernel restart): one line naming the code cell that
  defines it (the notebook is the session's file, ``JPY_SESSION_NAME``) and saying to run the
  cells above;
* a rank that raised (``launch.RankError``): the rank's error and the student's own frames
  (notebook cells as IPython names them, ``Cell In[5]``), never the launcher's; a job that ran
  out of time: where each rank was;
* everything else gets IPython's usual traceback (a ``NameError`` no cell explains keeps the
  hint to run the cells above).

The error output keeps its name and message (``ename``/``evalue``), so the grader and nbgrader
read it as before (the grader says "not answered" from the notebook itself: ``grading.judge``).
"""

from __future__ import annotations

import ast
import json
import os
import re
from typing import Any

_RED, _RESET = "\x1b[0;31m", "\x1b[0m"
PLACEHOLDER = "raise NotImplementedError"
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # course_utils/
_RUN_ABOVE = "run the cells above first (Run > Run All Above Selected Cell)"


def _frames(tb) -> list:
    """The frames of a traceback IPython hands over, its own ``run_code`` left out."""
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    while frames and os.sep + "IPython" + os.sep in frames[0].f_code.co_filename:
        frames.pop(0)
    return frames


def _only_this_cell(tb) -> bool:
    """Was the exception raised by the cell's own code (no deeper frame)?"""
    return len(_frames(tb)) == 1


def _is_course_code(filename: str) -> bool:
    return os.path.dirname(os.path.abspath(filename)).startswith(_HERE)


def _is_notebook_code(frame, shell) -> bool:
    """Code of the notebook: a cell, or a function a cell defined (its globals are the
    notebook's)."""
    return frame.f_globals is getattr(shell, "user_ns", None)


# ------------------------------------------------------------------------------- the notebook


def _code_cells(path: str | None = None) -> list[tuple[int, dict]]:
    """``(n, cell)`` of each code cell of the session's notebook, ``n`` its place among all
    its cells counted from 1, as JupyterLab numbers them ("Cell 17/20" in its status bar);
    ``[]`` if there is none to read."""
    path = path or os.environ.get("JPY_SESSION_NAME")
    if not path or not os.path.isfile(path) or not path.endswith(".ipynb"):
        return []
    try:
        with open(path, encoding="utf-8") as f:
            cells = json.load(f).get("cells", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [(n, c) for n, c in enumerate(cells, 1)
            if isinstance(c, dict) and c.get("cell_type") == "code"]


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def defining_cell(name: str, path: str | None = None) -> tuple[int, str] | None:
    """``(n, line)`` of the first code cell of the session's notebook (``n`` as JupyterLab
    numbers it) that assigns, imports or defines ``name``, and the line that does, or None."""
    for n, cell in _code_cells(path):
        source = _source(cell)
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in _global_nodes(tree):
            names = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [(a.asname or a.name).split(".")[0] for a in node.names]
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names = [node.id]
            if name in names:
                return n, source.splitlines()[node.lineno - 1].strip()
    return None


def _global_nodes(tree: ast.AST):
    """The nodes of a cell that run at its top level: not the bodies of its functions, lambdas
    and classes (their names are local), but their own definitions."""
    todo = [tree]
    while todo:
        node = todo.pop(0)
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        todo.extend(ast.iter_child_nodes(node))


def _placeholder_cell(path: str | None = None, at: tuple | None = None) -> tuple[int, str] | None:
    """``(n, first line)`` of the code cell that still holds nbgrader's placeholder and that
    the running cell ``at`` (its id and source, found by either) reads: the answer cell of its
    question when it is a test cell (grade id ``q4`` for ``q4_test``), else the nearest one
    above it; the first one when ``at`` is not in the notebook; None if none."""
    cells = _code_cells(path)
    stubs = [(n, c) for n, c in cells if PLACEHOLDER in _source(c)]
    cell_id, source = at or (None, None)
    here = next((n for n, c in cells if cell_id is not None
                 and c.get("id") == cell_id), None) or next(
        (n for n, c in cells if source and _source(c).strip() == source.strip()), None)
    if here is not None:
        grade_id = str((dict(cells)[here].get("metadata") or {}).get("nbgrader", {}).get(
            "grade_id") or "")
        mine = [(n, c) for n, c in stubs if grade_id.endswith("_test") and (
            c.get("metadata") or {}).get("nbgrader", {}).get("grade_id") == grade_id[:-5]]
        stubs = mine or [(n, c) for n, c in stubs if n < here][-1:]
    return (stubs[0][0], _source(stubs[0][1]).strip().splitlines()[0]) if stubs else None


def _frame_cell(filename: str) -> tuple[int, str] | None:
    """``(n, first line)`` of the notebook's code cell whose text is that of a frame's file (a
    cell IPython ran), or None."""
    import linecache

    source = "".join(linecache.getlines(filename)).strip()
    for n, cell in _code_cells():
        if source and _source(cell).strip() == source:
            return n, source.splitlines()[0]
    return None


def _not_answered(where: tuple[int, str] | None, what: str = "") -> str:
    """The line for nbgrader's placeholder still in code cell ``where`` (``(n, first line)``)."""
    cell = f"cell {where[0]} (`{where[1][:60]}`)" if where else "its answer cell"
    return (f"{_RED}Not answered yet{_RESET}: {what}{cell} still holds the placeholder "
            f"`raise NotImplementedError()`: replace it with your answer, then run that cell.")


def _missing_name(name: str, shell) -> str | None:
    """The line for a name no cell has run: which cell defines it, or that its answer cell is
    not answered yet; None when the notebook says neither."""
    found = defining_cell(name)
    if found is not None:
        n, line = found
        source = _source(dict(_code_cells())[n]).strip()
        if PLACEHOLDER in source:  # (a10's `class CopyToTP`, its body the placeholder)
            return _not_answered((n, source.splitlines()[0]), f"`{name}` is not defined: ")
        if source in {str(text).strip() for text in shell.user_ns.get("_ih", [])}:
            return None  # (it ran: something else is wrong, the traceback says what)
        return (f"{_RED}NameError{_RESET}: `{name}` is not defined in this kernel: cell {n} "
                f"(`{line[:60]}`) defines it and has not run since the kernel started: "
                f"{_RUN_ABOVE}.")
    stub = _placeholder_cell(at=getattr(shell, "_course_cell", None))
    if stub is not None:
        return _not_answered(stub, f"`{name}` is not defined: ")
    return None


# ------------------------------------------------------------------------------------- ranks


_CELL_FILE = re.compile(r'^(\s*)File "([^"]+)", line (\d+), in (.+)$')


def _cell_names(text: str, shell) -> str:
    """``File "/tmp/ipykernel_1/123.py", line 5, in f`` as IPython shows a cell's frame:
    ``Cell In[7], line 5, in f``."""
    compiler = getattr(shell, "compile", None)
    out = []
    for line in text.splitlines():
        m = _CELL_FILE.match(line)
        named = None
        if m and compiler is not None and hasattr(compiler, "format_code_name"):
            try:
                named = compiler.format_code_name(m.group(2))
            except Exception:  # noqa: BLE001 - a name IPython cannot place: left as it is
                named = None
        out.append(f"{m.group(1)}{named[0]} {named[1]}, line {m.group(3)}, in {m.group(4)}"
                   if named else line)
    return "\n".join(out)


def _rank_lines(shell, error) -> list[str]:
    """What a notebook shows for a ``launch.RankError`` (or its ``LaunchTimeout``)."""
    failure = getattr(error, "failure", None) or {}
    kind, frame = failure.get("type"), failure.get("frame")
    if kind == "NotImplementedError" and failure.get("raised_in") is None and frame:
        function = frame[2]
        where = _frame_cell(frame[0])
        what = f"`{function}` raises NotImplementedError on rank {error.rank}: " \
            if function != "<module>" else ""
        return [_not_answered(where, what)]
    if kind == "NameError" and failure.get("name"):
        line = _missing_name(failure["name"], shell)
        if line is not None:
            return [line]
    course = str(failure.get("raised_in") or "").startswith("course_utils")
    if kind in ("AssertionError", "CheckFailed") and course and failure.get("message"):
        return [f"{_RED}Not right yet{_RESET}: rank {error.rank}: {failure['message']}"]
    name = type(error).__name__
    return f"{_RED}{name}{_RESET}: {_cell_names(getattr(error, 'short', str(error)), shell)}" \
        .splitlines()


# ----------------------------------------------------------------------------------- showing


def _course_lines(shell, etype, value, tb) -> list[str] | None:
    """The short block for the errors this module explains (module doc), else None."""
    from course_utils.assess.checks import CheckFailed

    frames = _frames(tb)
    last = frames[-1] if frames else None
    if hasattr(value, "rank_traceback") and hasattr(value, "outputs"):  # launch.RankError
        return _rank_lines(shell, value)
    if issubclass(etype, AssertionError) and str(value) and (
            isinstance(value, CheckFailed) or len(frames) == 1
            or (last is not None and _is_course_code(last.f_code.co_filename))):
        return [f"{_RED}Not right yet{_RESET}: {value}"]
    if last is None or not _is_notebook_code(last, shell):
        return None
    if issubclass(etype, NotImplementedError):
        function = last.f_code.co_name
        what = f"`{function}` raises NotImplementedError: " if function != "<module>" else ""
        return [_not_answered(_frame_cell(last.f_code.co_filename), what)]
    if issubclass(etype, NameError) and isinstance(getattr(value, "name", None), str):
        line = _missing_name(value.name, shell)
        return [line] if line is not None else None
    if issubclass(etype, KeyError) and _global_lookup(value, tb, shell):  # globals()[name]
        line = _missing_name(value.args[0], shell)
        return [line] if line is not None else None
    return None


def _global_lookup(value, tb, shell) -> bool:
    """Is this KeyError ``globals()[name]`` of a name the notebook has not defined (a test cell
    that reads several answers by name)?"""
    import linecache

    key = value.args[0] if len(value.args) == 1 else None
    if not isinstance(key, str) or not key.isidentifier() or key in shell.user_ns:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno)
    return "globals()[" in line


def traceback_lines(shell, etype, value, tb, tb_offset=None) -> list[str]:
    """The structured traceback the student sees (see the module doc)."""
    try:
        lines = _course_lines(shell, etype, value, tb)
    except Exception:  # noqa: BLE001 - never hide the student's error behind one of ours
        lines = None
    if lines is not None:
        return lines
    stb = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
    frames = _frames(tb)
    if issubclass(etype, NameError) and isinstance(getattr(value, "name", None), str) and frames \
            and _is_notebook_code(frames[-1], shell) and defining_cell(value.name) is None:
        stb = list(stb) + [f"{_RED}Hint{_RESET}: if a cell above defines `{value.name}`, it has "
                           f"not run in this kernel (after a restart, every cell must run "
                           f"again): {_RUN_ABOVE}."]
    return list(stb)


def show(shell, etype, value, tb, tb_offset=None) -> list[str]:
    """IPython's custom exception handler: show :func:`traceback_lines` (IPython 9 leaves the
    showing to the handler) and return them."""
    stb = traceback_lines(shell, etype, value, tb, tb_offset)
    shell._showtraceback(etype, value, stb)
    return stb


def _note_cell(info) -> None:
    """``pre_run_cell``: keep the id (JupyterLab sends it) and the source of the cell that
    runs."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is not None:
        shell._course_cell = (getattr(info, "cell_id", None), getattr(info, "raw_cell", None))


def install(shell: Any = None) -> bool:
    """Register :func:`show` in the running IPython shell (once); False outside IPython."""
    if shell is None:
        import sys

        if "IPython" not in sys.modules:
            return False
        from IPython import get_ipython

        shell = get_ipython()
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return False
    if getattr(shell, "_course_messages", False):
        return True
    # (RuntimeError: launch.RankError and NotImplementedError are; KeyError: globals()[name];
    # every other kind gets IPython's own traceback)
    shell.set_custom_exc((AssertionError, NameError, KeyError, RuntimeError), show)
    if hasattr(shell, "events"):
        shell.events.register("pre_run_cell", _note_cell)
    shell._course_messages = True
    return True


__all__ = ["PLACEHOLDER", "defining_cell", "install", "show", "traceback_lines"]

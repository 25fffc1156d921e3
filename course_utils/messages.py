"""How a failure reaches the student in a notebook: a check that fails is one short block, and
a name that an earlier cell defines says which cell to run.

Importing ``course_utils`` in an IPython kernel calls :func:`install`, which registers
:func:`show` as the shell's handler for ``AssertionError`` and ``NameError``
(``InteractiveShell.set_custom_exc``):

* a failed check (``checks.CheckFailed``), or an ``assert`` with a message that failed in the
  cell itself (a visible test's), shows as one line: ``Not right yet: <the message>``, with no
  traceback of the check's own code;
* a ``NameError`` raised in the cell itself adds which code cell of the notebook defines the
  name (the notebook is the session's file, ``JPY_SESSION_NAME``), and that it has not run in
  this kernel: after a restart, run the cells above first;
* everything else gets IPython's usual traceback.

The error output keeps its name and message (``ename``/``evalue``), so the grader and nbgrader
read it as before.
"""

from __future__ import annotations

import ast
import json
import os
from typing import Any

_RED, _RESET = "\x1b[0;31m", "\x1b[0m"


def _only_this_cell(tb) -> bool:
    """Was the exception raised by the cell's own code (no deeper frame)? The traceback
    IPython hands over starts in its own ``run_code``."""
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    while frames and os.sep + "IPython" + os.sep in frames[0]:
        frames.pop(0)
    return len(frames) == 1


def defining_cell(name: str, path: str | None = None) -> tuple[int, str] | None:
    """``(n, line)`` of the first code cell (counted from 1) of the session's notebook that
    assigns, imports or defines ``name``, and the line that does, or None."""
    path = path or os.environ.get("JPY_SESSION_NAME")
    if not path or not os.path.isfile(path) or not path.endswith(".ipynb"):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            cells = [c for c in json.load(f).get("cells", []) if c.get("cell_type") == "code"]
    except (OSError, ValueError):
        return None
    for n, cell in enumerate(cells, 1):
        source = "".join(cell.get("source", []))
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
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


def name_hint(name: str) -> str:
    """What to do about ``NameError: name '<name>' is not defined`` in a notebook."""
    found = defining_cell(name)
    if found is None:
        return ("If a cell above defines it, it has not run in this kernel (after a restart, "
                "every cell must run again): run the cells above first (Run > Run All Above "
                "Selected Cell).")
    n, line = found
    return (f"`{name}` is defined by code cell {n} (`{line[:60]}`), which has not run in this "
            "kernel (after a restart, every cell must run again): run the cells above first "
            "(Run > Run All Above Selected Cell).")


def traceback_lines(shell, etype, value, tb, tb_offset=None) -> list[str]:
    """The structured traceback the student sees (see the module doc)."""
    from course_utils.checks import CheckFailed

    if issubclass(etype, AssertionError) and str(value) and (
            isinstance(value, CheckFailed) or _only_this_cell(tb)):
        return [f"{_RED}Not right yet{_RESET}: {value}"]
    stb = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
    if issubclass(etype, NameError) and getattr(value, "name", None) and _only_this_cell(tb):
        stb = list(stb) + [f"{_RED}Hint{_RESET}: {name_hint(value.name)}"]
    return list(stb)


def show(shell, etype, value, tb, tb_offset=None) -> list[str]:
    """IPython's custom exception handler: show :func:`traceback_lines` (IPython 9 leaves the
    showing to the handler) and return them."""
    stb = traceback_lines(shell, etype, value, tb, tb_offset)
    shell._showtraceback(etype, value, stb)
    return stb


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
    shell.set_custom_exc((AssertionError, NameError), show)
    shell._course_messages = True
    return True


__all__ = ["defining_cell", "install", "name_hint", "show", "traceback_lines"]

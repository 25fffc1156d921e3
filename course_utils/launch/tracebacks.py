"""What a student reads when a rank fails or hangs: their frames, library frames folded.

Their own frames with source lines, each run of library frames folded to one line, the
launcher's own frames left out (every lecture that starts ranks, 2 to 12; assignment a10 debugs
broken programs with them).

:func:`student_traceback` and :func:`failure_info` describe what a rank raised (the short text
and the data of :class:`course_utils.launch.reports.RankError`); :func:`trim_stack` reads a hung
rank's faulthandler dump; :func:`code_origins` gathers, on the launching side, the text of
notebook cells that code sent by value came from (a cell is not a file the ranks could read).
:func:`library_name` says which library a file belongs to, None for the student's own code.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import traceback
from typing import Any

__all__ = ["LIBRARY_ROOTS", "DEBUGGED_MODULES", "library_name", "is_launcher_code",
           "student_traceback", "failure_info", "code_origins", "trim_stack"]

_LAUNCH_DIR = os.path.dirname(os.path.abspath(__file__))  # course_utils/launch
_COURSE_DIR = os.path.dirname(_LAUNCH_DIR)  # course_utils

LIBRARY_ROOTS = tuple({os.path.dirname(os.__file__), sys.prefix, sys.base_prefix, _COURSE_DIR})
"""Folders whose files are library code: the standard library, the installed packages, the
course's own helpers."""

# Course modules whose functions are programs a student reads and debugs (assignment a10's
# broken programs): their frames are shown with their lines, like the student's own.
DEBUGGED_MODULES = (os.path.join("data_parallel", "pitfalls.py"),)
"""Course modules (paths under ``course_utils``) shown as the student's own code."""


def library_name(filename: str) -> str | None:
    """``torch.distributed`` for a file of an installed or standard library (or the course's
    own helpers), None for the student's code (notebook cells, their own files, and the course's
    programs to debug)."""
    path = os.path.abspath(filename)
    if not path.startswith(LIBRARY_ROOTS) or not os.path.exists(path):
        return None
    here = _COURSE_DIR
    if os.path.relpath(path, here) in DEBUGGED_MODULES:
        return None
    parts = path.split(os.sep)
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts:
            rest = parts[parts.index(anchor) + 1:]
            return ".".join(p.removesuffix(".py") for p in rest[:2])
    if path.startswith(here + os.sep):
        return "course_utils." + os.path.relpath(path, here).removesuffix(".py").replace(
            os.sep, ".").removesuffix(".__init__")
    return os.path.basename(path).removesuffix(".py")


def is_launcher_code(code: Any) -> bool:
    """Whether ``code`` (a code object) is the launcher's own (a module of
    :mod:`course_utils.launch`, the rank's body that calls ``fn`` included)."""
    return os.path.dirname(os.path.abspath(code.co_filename)) == _LAUNCH_DIR


def student_traceback(exc: BaseException, origins: dict) -> str:
    """The traceback of ``exc`` as a student needs it: their frames with source lines, each run
    of library frames folded to one line, the launcher's own frames left out.

    ``origins`` maps (qualname, first line) of code sent by value to the file (notebook cell) it
    came from: cloudpickle renames such code ``<dynamic-code>``.
    """
    lines = ["Traceback (most recent call last):"]
    folded: list[str] = []

    def fold() -> None:
        if folded:
            names = ", ".join(dict.fromkeys(folded))
            lines.append(f"  ... {len(folded)} frame(s) in {names}")
            folded.clear()

    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        code = frame.f_code
        if is_launcher_code(code):
            continue  # the launcher's own frames, whatever calls fn
        filename = origins.get((code.co_qualname, code.co_firstlineno), code.co_filename)
        library = library_name(filename)
        if library is not None:
            folded.append(library)
            continue
        fold()
        lines.append(f'  File "{filename}", line {lineno}, in {code.co_name}')
        source = linecache.getline(filename, lineno).strip()
        if source:
            lines.append(f"    {source}")
    fold()
    only = traceback.TracebackException.from_exception(exc).format_exception_only()
    return "\n".join(lines + [line.rstrip("\n") for line in only])


def failure_info(exc: BaseException, origins: dict) -> dict:
    """What a rank raised, as plain data (see :class:`course_utils.launch.reports.RankError`'s
    ``failure``)."""
    raised_in, frame = None, None
    for tb_frame, lineno in traceback.walk_tb(exc.__traceback__):
        code = tb_frame.f_code
        if is_launcher_code(code):
            continue
        filename = origins.get((code.co_qualname, code.co_firstlineno), code.co_filename)
        raised_in = library_name(filename)
        if raised_in is None:
            frame = (filename, lineno, code.co_name)
    name = getattr(exc, "name", None) if isinstance(exc, NameError) else None
    return {"type": type(exc).__name__, "message": str(exc)[:2000], "raised_in": raised_in,
            "name": name if isinstance(name, str) else None, "frame": frame}


def code_origins(*objects: Any) -> tuple[dict, dict]:
    """For functions sent by value (defined in a notebook): ``{(qualname, first line): file}``
    of their code and of the notebook functions they call, and those files' text from
    ``linecache`` (a cell is not a file the ranks could read)."""
    import functools
    import types

    origins: dict = {}
    seen: set[int] = set()

    def visit_code(code: types.CodeType) -> None:
        if id(code) in seen:
            return
        seen.add(id(code))
        origins[(code.co_qualname, code.co_firstlineno)] = code.co_filename
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                visit_code(const)

    def visit(obj: Any, depth: int) -> None:
        if depth > 3:
            return
        if isinstance(obj, (list, tuple)):
            for item in obj[:50]:
                visit(item, depth + 1)
        elif isinstance(obj, functools.partial):
            visit([obj.func, *obj.args, *obj.keywords.values()], depth + 1)
        elif isinstance(obj, types.FunctionType) and id(obj.__code__) not in seen:
            visit_code(obj.__code__)
            for name in obj.__code__.co_names:  # the notebook functions it calls
                other = obj.__globals__.get(name)
                if isinstance(other, types.FunctionType) and other.__module__ == obj.__module__:
                    visit(other, depth + 1)

    visit(objects, 0)
    sources = {}
    for filename in set(origins.values()):
        entry = linecache.cache.get(filename)
        if entry is not None and len(entry) == 4 and not os.path.exists(filename):
            sources[filename] = (entry[0], None, entry[2], entry[3])  # mtime None: kept
    origins = {k: f for k, f in origins.items() if f in sources}
    return origins, sources


def trim_stack(text: str, body: str) -> str:
    """Where a rank was, from its faulthandler dump (all threads): the thread that runs ``fn``
    (the one under the rank's body, the function named ``body``), the body's own frame
    dropped, each run of library frames folded to one line, as in :func:`student_traceback`."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x|Stack \(most recent)", text)
    mine = ([b for b in blocks if f"in {body}" in b]
            or sorted(blocks, key=lambda b: b.count('File "'))[-1:])  # (fn not called yet)
    lines: list[str] = []
    folded: list[tuple[str, str]] = []

    def fold() -> None:  # (most recent first: the last folded frames are the calls fn made)
        if folded:
            names = ", ".join(dict.fromkeys(lib for lib, _ in folded))
            calls = " > ".join(name for _, name in reversed(folded[-2:]))
            lines.append(f"  ... {len(folded)} frame(s) in {names} ({calls})")
            folded.clear()

    for line in "\n".join(mine).splitlines():
        m = re.match(r'\s*File "(.+)", line (\d+) in (.+)', line)
        if m is None:
            if line.strip():
                fold()
                lines.append("Stack (most recent call first):" if "thread 0x" in line.lower()
                             else line)
            continue
        filename, name = m.group(1), m.group(3)
        if "multiprocessing/" in filename or filename == "<string>" or name == body:
            continue
        library = "importlib" if filename.startswith("<frozen ") else library_name(filename)
        if library is not None:
            folded.append((library, name.strip()))
            continue
        fold()
        lines.append(line.rstrip())
        source = linecache.getline(filename, int(m.group(2))).strip()
        if source:
            lines.append(f"    {source}")
    fold()
    return "\n".join(lines)

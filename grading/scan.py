"""What a submission's code and folder say about it: tampering, helpers, whose numbers.

Static scans, outside every kernel: :func:`scan_source` (answer cells that patch modules, touch
``builtins``/``sys.modules``, define ``__eq__``...), :func:`helper_uses` (a course helper that
computes a graded answer, however it is named), :func:`scan_files` (what else the folder
holds), :func:`scan_notebook` (edited or deleted test cells, edited metadata) and
:func:`identity_flags` (the identity the notebook was worked under). A flag never changes a
score: the judge already decided without trusting the kernel.
"""

from __future__ import annotations

import ast
import copy
import os
import re
from pathlib import Path

from course_utils.assess.checks import SUBMIT_MIME
from grading.course import ROOT, _meta, givens_for, is_answer_cell, is_test_cell, restore_metadata
from grading import names
from grading.files import entry_kind

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
    ``"widgets.*"``: anything in that subpackage) the code in ``source`` refers to, whatever
    the spelling: called or named through any import alias, any package path, re-export or old
    module name that leads to the same definition (:mod:`grading.names`), named in a string or
    in a string built from constants (``getattr(memory, "state" + "_bytes")``), or possibly
    reached by a name computed at run time (``getattr(memory, name)``, ``vars(memory)``,
    ``memory.__dict__``, ``importlib.import_module(...)``, ``sys.modules[...]``): those are
    reported as ``"<helper> (through a computed name)"``. ``setup``: code that ran before it
    (the release's import cells), whose import aliases count too."""
    library = names.index()
    wanted = {h: library.resolve(h.split(".")) for h in helpers if not h.endswith(".*")}
    packages = {h: library.resolve(h[:-2].split(".")) for h in helpers if h.endswith(".*")}
    # a bare module name counts as the course's module (the release's cells import them)
    aliases: dict[str, list[str]] = {m: [m] for m in library.top_level()} | {"course_utils": []}
    star: set[str] = set()
    found: list[str] = []

    def add(h: str) -> None:
        plain = h.split(" ")[0]
        if h == plain and f"{h} (through a computed name)" in found:
            found[found.index(f"{h} (through a computed name)")] = h
        elif h not in found and plain not in found:
            found.append(h)

    def path_of(node) -> list[str] | None:
        """The ``course_utils``-relative path an expression names, if it starts at the
        library (``getattr(module, "constant")`` counts as an attribute)."""
        if isinstance(node, ast.Call) and _dotted(node.func) == "getattr" and len(node.args) > 1:
            inner, attr = path_of(node.args[0]), _fold(node.args[1])
            return None if inner is None or attr is None else inner + attr.split(".")
        if isinstance(node, ast.Attribute):
            inner = path_of(node.value)
            return None if inner is None else inner + [node.attr]
        return aliases.get(node.id) if isinstance(node, ast.Name) else None

    def module_of(node) -> str | None:
        """The course_utils module (``"memory"``, or ``""`` for the package) an expression
        names, if it is one."""
        path = path_of(node)
        target = library.resolve(path) if path is not None else None
        return target if isinstance(target, str) else None

    def match(target) -> None:
        for h, site in wanted.items():
            if site is not None and target == site:
                add(h)
        for h, package in packages.items():
            if not isinstance(package, str) or target is None:
                continue
            where = target if isinstance(target, str) else target[0]
            if where.startswith(package + ".") or (where == package and isinstance(target, tuple)):
                add(h)

    def computed(module: str | None) -> None:
        reach = None if module in (None, "") else library.reachable(module)
        for h, site in wanted.items():
            if reach is None or site in reach:
                add(f"{h} (through a computed name)")

    trees = [t for t in (_parse(setup), _parse(source)) if t is not None]
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "course_utils":
                        inner = [x for x in a.name.split(".")[1:]]
                        aliases[a.asname or "course_utils"] = inner if a.asname else []
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "course_utils":
                inner = node.module.split(".")[1:]
                for a in node.names:
                    if a.name == "*":
                        star.add(".".join(inner))
                    else:
                        aliases[a.asname or a.name] = inner + [a.name]
    tree = _parse(source)
    for node in ast.walk(tree) if tree is not None else []:
        if isinstance(node, (ast.Attribute, ast.Name)) or (
                isinstance(node, ast.Call) and _dotted(node.func) == "getattr"):
            path = path_of(node)
            if path is not None:
                match(library.resolve(path))
            elif isinstance(node, ast.Name) and star:
                for m in star:
                    match(library.resolve([x for x in m.split(".") if x] + [node.id]))
            if isinstance(node, ast.Attribute) and node.attr == "__dict__":
                computed(module_of(node.value))
        if isinstance(node, ast.Subscript) and _dotted(node.value) == "sys.modules":
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
                    computed(module_of_name(name) if name else None)
        if isinstance(node, (ast.Constant, ast.BinOp, ast.JoinedStr, ast.Call)):
            text = _fold(node)
            if text is not None:
                for h, site in wanted.items():
                    if text in (h.split(".")[-1], h) or (
                            site is not None and text.split(".")[-1] == site[1]):
                        add(h)
    return found


def module_of_name(name: str) -> str | None:
    """``"course_utils.zero1"`` -> the module it names now (old names too), else None."""
    target = names.index().resolve(name.split(".")[1:]) if name.split(".")[0] == "course_utils" \
        else None
    return target if isinstance(target, str) else None


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


# ------------------------------------------------------------------------------ variants

_WORKED_AS = re.compile(r"Your numbers for \S+ \((?:student (?P<who>[A-Za-z0-9][A-Za-z0-9._@+-]"
                        r"{0,99})|(?P<base>the base numbers))\)")


def worked_as(nb) -> str | None:
    """Whose numbers the submitted notebook showed when the student ran it, read from the
    output of its ``variants.givens`` cell: an identity, ``""`` for the base numbers, None when
    the cell has no such output (outputs cleared). Hostile text: only this pattern is read."""
    from course_utils.assess import variants

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

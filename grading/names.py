"""Where a ``course_utils`` name leads: a static index of the library's packages, modules,
re-exports and old names, read from the source (nothing of it is imported or run).

The integrity scan (:func:`grading.scan.helper_uses`) asks it where a dotted name a student
wrote ends up: ``zero.memory.zero_state_bytes``, ``memory.zero_state_bytes``,
``memory.sizing.zero_state_bytes`` and an old flat name kept as an alias
(``course_utils/_aliases.py``) all end at the one function's definition, so a helper is found
however it is reached. :func:`source_file` finds a module's file under any of its names.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from grading.course import ROOT

LIBRARY = ROOT / "course_utils"
ALIASES = "_aliases.py"  # the table of old names: OLD_NAMES = {"zero1": "zero.optimizer", ...}
FORWARD = "FORMER"  # a lazy package's __getattr__ forwards to the module(s) this names
_MAX_HOPS = 50  # a re-export chain longer than this (or a loop) resolves to nothing


@dataclass
class Index:
    """``files``: module (``"zero.training"``; ``""`` is the package) -> its file.
    ``bound``: module -> {name: ("module", module) | ("name", module, name) | ("def",)}."""

    files: dict[str, Path] = field(default_factory=dict)
    bound: dict[str, dict[str, tuple]] = field(default_factory=dict)

    def resolve(self, path: list[str]) -> tuple[str, str] | str | None:
        """Where ``course_utils.<path>`` leads: a module's name (``"zero.training"``), a
        ``(module, name)`` definition, or None when the index cannot tell (not a name the
        library binds). Attributes after a definition are attributes of that object."""
        module: str = ""
        for part in path:
            target = self._follow(module, part)
            if target is None:
                return None
            if isinstance(target, tuple):
                return target
            module = target
        return module

    def _follow(self, module: str, name: str, hops: int = 0):
        if hops > _MAX_HOPS:
            return None
        kind = self.bound.get(module, {}).get(name)
        if kind is None:
            sub = f"{module}.{name}".strip(".")
            if sub in self.files:
                return sub
            for key, target in self.bound.get(module, {}).items():  # a lazy package's FORMER
                if key.startswith(FORWARD + "#") and name in self.bound.get(target[1], {}):
                    return self._follow(target[1], name, hops + 1)
            return None
        if kind[0] == "module":
            return kind[1] if kind[1] in self.files else None
        if kind[0] == "name":
            return self._follow(kind[1], kind[2], hops + 1)
        return (module, name)

    def top_level(self) -> set[str]:
        """The names ``course_utils.<name>`` that are modules: packages, modules, old names."""
        return {m for m in self.files if m and "." not in m} | {
            n for n, kind in self.bound.get("", {}).items() if kind[0] == "module"}

    def reachable(self, module: str) -> set[tuple[str, str]]:
        """Every definition a chain of attributes from ``module`` can reach (what
        ``getattr(module, computed_name)`` could return, repeated)."""
        seen, stack, found = {module}, [module], set()
        while stack:
            current = stack.pop()
            names = set(self.bound.get(current, {}))
            for key, target in self.bound.get(current, {}).items():
                if key.startswith(FORWARD + "#") and target[1] not in seen:
                    seen.add(target[1])
                    stack.append(target[1])
            names |= {m.rpartition(".")[2] for m in self.files
                      if m.rpartition(".")[0] == current and m != current}
            for name in names:
                target = self._follow(current, name)
                if isinstance(target, tuple):
                    found.add(target)
                elif isinstance(target, str) and target not in seen:
                    seen.add(target)
                    stack.append(target)
        return found


def module_name(path: Path, library: Path) -> str:
    """The name of the module at ``path`` relative to the package ``library`` (``"zero.sizes"``;
    a package's ``__init__`` is the package, the library's own ``""``)."""
    parts = list(path.relative_to(library).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def absolute_module(module: str, is_package: bool, node: ast.ImportFrom) -> str | None:
    """The ``course_utils``-relative module an ``ImportFrom`` names, or None if outside."""
    if node.level:
        base = module.split(".") if module else []
        if not is_package:
            base = base[:-1]
        base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
        return ".".join(base + ([node.module] if node.module else []))
    name = node.module or ""
    if name == "course_utils":
        return ""
    if name.startswith("course_utils."):
        return name[len("course_utils."):]
    return None


def _bindings(module: str, path: Path, tree: ast.Module, modules: set[str]) -> dict[str, tuple]:
    """What each top-level name of a module is bound to (the last binding wins, as at run time;
    imports inside functions bind nothing at module level)."""
    out: dict[str, tuple] = {}
    is_package = path.name == "__init__.py"

    def statements(body):
        for node in body:
            if isinstance(node, (ast.If, ast.Try)):  # TYPE_CHECKING blocks, optional imports
                yield from statements(node.body)
                yield from statements(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    yield from statements(handler.body)
            else:
                yield node

    for node in statements(tree.body):
        if isinstance(node, ast.ImportFrom):
            source = absolute_module(module, is_package, node)
            if source is None:
                for a in node.names:
                    out[a.asname or a.name] = ("def",)
                continue
            for a in node.names:
                if a.name == "*":
                    continue
                sub = f"{source}.{a.name}".strip(".")
                out[a.asname or a.name] = ("module", sub) if sub in modules \
                    else ("name", source, a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                inner = a.name[len("course_utils."):] if a.name.startswith("course_utils.") \
                    else "" if a.name == "course_utils" else None
                if a.asname:
                    out[a.asname] = ("module", inner) if inner is not None else ("def",)
                else:
                    top = a.name.split(".")[0]
                    out[top] = ("module", "") if inner is not None else ("def",)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = ("def",)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out[n.id] = ("def",)
            value = getattr(node, "value", None)
            if len(targets) == 1 and isinstance(targets[0], ast.Name) and targets[0].id == FORWARD:
                values = value.elts if isinstance(value, (ast.Tuple, ast.List)) else [value]
                for i, v in enumerate(values):
                    if isinstance(v, ast.Constant) and str(v.value).startswith("course_utils."):
                        out[f"{FORWARD}#{i}"] = ("module", v.value[len("course_utils."):])
    return out


def _table(library: Path, name: str) -> dict:
    """A literal table of ``_aliases.py``, read without running it ({} if absent)."""
    path = library / ALIASES
    if not path.exists():
        return {}
    for node in ast.parse(path.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else \
            node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id == name:
            return dict(ast.literal_eval(node.value))
    return {}


def old_names(library: Path = LIBRARY) -> dict[str, str]:
    """The alias table: an old module name -> the module it is now (both relative to
    ``course_utils``)."""
    return _table(library, "OLD_NAMES")


@lru_cache(maxsize=4)
def index(library: Path = LIBRARY) -> Index:
    """The index of the library at ``library`` (the course's own by default)."""
    found = Index()
    for path in sorted(library.rglob("*.py")):
        if "__pycache__" not in path.parts:
            found.files[module_name(path, library)] = path
    modules = set(found.files)
    for module, path in list(found.files.items()):
        found.bound[module] = _bindings(module, path, ast.parse(path.read_text()), modules)
    for old, new in old_names(library).items():  # an old name is an attribute of its parent
        parent, _, leaf = old.rpartition(".")
        if new in found.files and old not in found.files:
            found.bound.setdefault(parent, {})[leaf] = ("module", new)
    for package, moved in _table(library, "OLD_ATTRIBUTES").items():  # names that left
        for name, home in moved.items():
            found.bound.setdefault(package, {}).setdefault(name, ("name", home, name))
    return found


def source_file(module: str, library: Path = LIBRARY) -> Path:
    """The file of ``course_utils.<module>``, under its name now or an old one."""
    found = index(library)
    target = found.resolve(module.split(".")) if module else ""
    if not isinstance(target, str) or target not in found.files:
        raise ValueError(f"module={module!r} is not a module of course_utils")
    return found.files[target]

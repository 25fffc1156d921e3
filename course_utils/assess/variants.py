"""Per-student variants: every student's own givens, drawn from who they are (issue 26).

A question whose givens can vary without changing what it teaches (model size, D, P and m,
budgets, ...) takes them from :func:`givens`, so that one shared answer sheet is worth nothing
to another student. The draw is seeded by the assignment and the student's identity
(:func:`seed`), within the options its author states (:mod:`course_utils.assess.givens`, which
also defines :func:`given` and :class:`Given`, bound here), and the same identity always gets
the same numbers.

Where the identity comes from (:func:`identity`), first match wins:

1. ``COURSE_STUDENT``: the grader sets it, in the sandboxed kernel, to nbgrader's student id.
   It is authoritative at grading: whatever the notebook says, the grader's kernel draws that
   student's numbers, and the reference answers for them are computed outside the kernel.
2. ``JUPYTERHUB_USER``: the hub's user, on a JupyterHub.
3. The file ``make lab`` writes once (``workspace/.course/identity``, or
   ``COURSE_IDENTITY_FILE``), after asking the student.
4. None: the base numbers (the lesson's own), as self-study learners of the full repository
   get them unless they set an identity.

The instructor turns variants off per assignment by releasing it with ``on=False`` in its
first (locked) cell: everyone then gets the base numbers.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from course_utils.assess.givens import GIVENS, Given, given  # noqa: F401 - Given, given: bound here

__all__ = ["IDENTITY_ENV", "HUB_ENV", "IDENTITY_FILE_ENV", "identity", "check_identity", "seed",
           "Given", "given", "givens_of", "base", "draw", "every_variant", "Givens", "givens",
           "switch_of"]

IDENTITY_ENV = "COURSE_STUDENT"
HUB_ENV = "JUPYTERHUB_USER"
IDENTITY_FILE_ENV = "COURSE_IDENTITY_FILE"
_DEFAULT_FILE = Path(__file__).resolve().parents[2] / "workspace" / ".course" / "identity"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,99}")


def check_identity(name: Any, where: str = "identity") -> str:
    """``name`` if it is a student identity: 1 to 100 letters, digits and ``._@+-``, starting
    with a letter or digit (the student ids ``collect`` accepts, and hub user names); else
    ValueError."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{where} must be 1 to 100 letters, digits or ._@+- (starting with a "
                         f"letter or digit), like a student id; got {name!r}")
    return name


def _identity_file() -> Path:
    return Path(os.environ.get(IDENTITY_FILE_ENV) or _DEFAULT_FILE)


def identity() -> str | None:
    """The student these numbers are for (see the module docstring), or None (base numbers).

    An identity set but malformed raises ValueError naming where it came from."""
    for var in (IDENTITY_ENV, HUB_ENV):
        value = os.environ.get(var)
        if value is not None:
            return check_identity(value, f"${var}") if value else None
    path = _identity_file()
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return check_identity(text, str(path)) if text else None


def seed(assignment: str, student: str) -> int:
    """The 64-bit seed of one student's variant of one assignment (sha256 of both names)."""
    if not isinstance(assignment, str) or not assignment:
        raise ValueError(f"assignment must be an assignment name (a non-empty str); got "
                         f"{assignment!r}")
    check_identity(student, "student")
    digest = hashlib.sha256(f"{assignment}\0{student}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


# ------------------------------------------------------------------------------- drawing


def givens_of(assignment: str) -> dict[str, Given]:
    """The stated givens of ``assignment`` (``{name: Given}``, in the order drawn)."""
    if assignment not in GIVENS:
        raise ValueError(f"assignment {assignment!r} has no givens; those with givens: "
                         f"{sorted(GIVENS)}")
    return GIVENS[assignment]


def base(assignment: str) -> dict[str, Any]:
    """The base numbers of ``assignment``: every given's first option."""
    return {name: g.options[0] for name, g in givens_of(assignment).items()}


def draw(assignment: str, student: str) -> dict[str, Any]:
    """One student's givens for ``assignment``: each drawn from its options, in order, by a
    ``random.Random`` seeded with :func:`seed`."""
    rng = random.Random(seed(assignment, student))
    return {name: rng.choice(g.options) for name, g in givens_of(assignment).items()}


def every_variant(assignment: str, names: Iterable[str]) -> list[dict[str, Any]]:
    """Every combination of the options of the givens ``names`` (the base first): what the
    release's sealed checks are built for."""
    import itertools

    table = givens_of(assignment)
    names = list(names)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"{assignment} has no given {unknown[0]!r}; its givens: {sorted(table)}")
    return [dict(zip(names, combo)) for combo in
            itertools.product(*(table[n].options for n in names))]


def _shown(value: Any) -> str:
    """A given as the question text would write it: 13e9, not 13000000000.0."""
    if isinstance(value, tuple):
        return ", ".join(_shown(v) for v in value)
    if isinstance(value, float) and abs(value) >= 1e9:
        return f"{value / 1e9:g}e9"
    return repr(value)


class Givens(Mapping):
    """One student's givens: read as ``G["n_params"]`` or ``G.n_params``; ``student`` is whom
    they were drawn for (None: the base numbers); ``variant`` a short name of the values."""

    def __init__(self, assignment: str, values: Mapping[str, Any], student: str | None) -> None:
        self.assignment, self.student = assignment, student
        self._values = dict(values)
        text = repr(sorted(self._values.items())).encode()
        self.variant = "base" if student is None else hashlib.sha256(text).hexdigest()[:10]

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(f"{self.__dict__.get('assignment')} has no given {name!r}; "
                                 f"its givens: {sorted(self.__dict__.get('_values', {}))}") \
                from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def key(self, *names: str) -> str:
        """The values of the givens ``names`` as one string (``"n_params=13e9"``): a visible
        check's ``variant=``, which selects the known mistakes sealed for these numbers."""
        missing = [n for n in names if n not in self._values]
        if not names or missing:
            raise ValueError(f"key needs the names of givens of {self.assignment} "
                             f"({sorted(self._values)}); got {names!r}")
        return ";".join(f"{n}={self._values[n]!r}" for n in names)

    def replaced(self, **values: Any) -> "Givens":
        """The same givens with some replaced (the release builder's tour of every variant)."""
        unknown = [n for n in values if n not in self._values]
        if unknown:
            raise ValueError(f"{self.assignment} has no given {unknown[0]!r}")
        return Givens(self.assignment, {**self._values, **values}, self.student)

    def __repr__(self) -> str:
        who = "the base numbers" if self.student is None else f"student {self.student}"
        items = ", ".join(f"{k} = {_shown(v)}" for k, v in self._values.items())
        return f"Your numbers for {self.assignment} ({who}): {items}"

    def _repr_markdown_(self) -> str:
        who = ("the base numbers (no identity set: see the top of the notebook)"
               if self.student is None else f"drawn for **{self.student}**")
        labels = {n: g.label for n, g in givens_of(self.assignment).items()}
        rows = "".join(f"| `G.{n}` | {labels.get(n, '')} | **{_shown(v)}** |\n"
                       for n, v in self._values.items())
        return (f"**Your numbers** for {self.assignment}, {who}:\n\n"
                f"| name | what it is | yours |\n|---|---|---|\n{rows}")


def givens(assignment: str, on: bool = True, student: str | None = None) -> Givens:
    """The givens of ``assignment`` for ``student`` (default: :func:`identity`); the base
    numbers when ``on`` is False (the instructor's switch) or when there is no identity."""
    if not isinstance(on, bool):
        raise ValueError(f"on must be a bool (the instructor's switch); got {on!r}")
    givens_of(assignment)
    who = identity() if student is None else check_identity(student, "student")
    if not on or who is None:
        return Givens(assignment, base(assignment), None)
    return Givens(assignment, draw(assignment, who), who)


def switch_of(source: str) -> bool | None:
    """The instructor's switch read from a notebook cell's source: the ``on=`` of its
    ``variants.givens(...)`` call (True when not given), or None when the cell has no such call.
    Read by the grader from the committed release, never from a submission."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "givens"):
            for kw in node.keywords:
                if kw.arg == "on":
                    if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, bool):
                        return kw.value.value
                    raise ValueError("variants.givens(on=...) must be a literal True or False in "
                                     "the released cell (the grader reads it without running it)")
            return True
    return None

"""Checks used by assignment test cells: each failure names the likely misconception.

Two sides of one test cell:

* **In the student's kernel** the visible tests call ``check_number(name, value)`` (type only,
  no expected value) and the hidden tests call :func:`submit`, which hands a value to the grader
  as data and judges nothing. No expected value, tolerance or known mistake ever runs in, or is
  sent to, the student's kernel.
* **In the grader** (``grading/judge.py``, outside the kernel's sandbox) the same
  ``check_number`` / ``check_choice`` / ``check_sequence`` functions judge the submitted values
  against the reference solution's, with the known mistakes of ``authoring/judges/<a>.py``. The
  message of the AssertionError they raise is the feedback that names the misconception.

The helpers return ``None`` and write nothing to stderr (nbgrader scores a test cell by its
outputs). A visible check that passes says, once at the end of its cell, what it checked
(:func:`_visible_passed`): the type and the known mistakes, never whether the value is right
(the same line for a right value and for a wrong one it does not know). They read numbers
through ``float``'s own slot and use no name an answer cell can replace, which matters for the
visible tests that run beside the student's code.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import hashlib as _hashlib
import math as _math

import numpy as _np

__all__ = ["CheckFailed", "SUBMIT_MIME", "Sealed", "TRACE_MIME", "as_number", "check_number",
           "check_choice", "check_sequence", "checked_line", "encode", "hidden_cases", "seal",
           "sealed_for", "sealed_mistakes", "sealed_name", "submit"]

SUBMIT_MIME = "application/vnd.course.submission+json"
TRACE_MIME = "application/vnd.course.check-trace+json"  # what a visible check saw (release build)

class CheckFailed(AssertionError):
    """A check found a wrong answer; the message names the mistake (a notebook shows it as one
    short block: ``course_utils.assess.messages``)."""


# Types taken from literals: an answer cell can rebind the builtin names, not these.
_float, _int, _bool, _str = (0.0).__class__, (0).__class__, True.__class__, "".__class__
_list, _tuple, _type = [].__class__, ().__class__, (0).__class__.__class__
_NUMPY_REALS = (_np.float16, _np.float32, _np.float64, _np.int8, _np.int16, _np.int32,
                _np.int64, _np.uint8, _np.uint16, _np.uint32, _np.uint64)


def _is_sub(value: Any, cls: type) -> bool:
    """``isinstance`` without the builtin (an answer cell may have replaced it)."""
    for base in _type.__getattribute__(_type(value), "__mro__"):
        if base is cls:
            return True
    return False


def _one_of(value: Any, classes: Iterable[type]) -> bool:
    """``type(value)`` is exactly one of ``classes`` (identity, no ``==``)."""
    t = _type(value)
    for cls in classes:
        if t is cls:
            return True
    return False


def as_number(name: str, value: Any) -> float:
    """The true numeric value of ``value``, or AssertionError if it is not a plain real number."""
    if _type(value) is _bool:
        raise CheckFailed(f"{name} should be a number, not the boolean {value}.")
    if _is_sub(value, _float):
        result = _float.__float__(value)  # the stored double, whatever the subclass claims
    elif _is_sub(value, _int):
        result = _float(_int.__int__(value))
    elif _one_of(value, _NUMPY_REALS):
        result = _float(value)
    else:
        raise CheckFailed(
            f"{name} should be a plain number (int or float), got {_type(value).__name__}. "
            "If you computed it with torch or numpy, convert it with float(...) or .item().")
    if not result - result == 0.0:  # inf - inf and nan - nan are nan
        raise CheckFailed(f"{name} should be a finite number, got {result}.")
    return result


# ------------------------------------------------------------------------------ sealed mistakes
#
# A visible check rejects known wrong answers without writing them out: each wrong value is
# stored as a digest of the tolerance bin it falls in, and its message encrypted with a key
# derived from the same bin (PBKDF2-SHA256, ``_SEAL_ITERATIONS``). Reading the test cell shows
# neither the values nor the messages; a value in a sealed bin unlocks its message. The bins
# of a "log:r" grid are ``floor(ln|x| / ln(1 + 2r))``; sealing stores the wrong value's bin and
# both neighbours, so any value within about 2r of it (and none farther than 4r) matches.
# Enumerating bins to find the sealed ones is possible (about a minute per decade of values):
# a speed bump for someone who wants the answer without the work, as asking a friend is; the
# grade is judged outside the kernel either way.

_SEAL_ITERATIONS = 50_000
_SEAL_SALT = "course-sealed-mistake/1/"
_pbkdf2, _log, _floor = _hashlib.pbkdf2_hmac, _math.log, _math.floor


def _seal_bin(value: Any, grid: str) -> str:
    """The bin of ``value`` on ``grid`` ("log:<rel>", "step:<width>" or "choice")."""
    kind, _, param = _str.partition(grid, ":")
    if kind == "choice":
        return "c:" + repr(_choice_key(value))
    x = _float(value)
    if kind == "step":
        return "s:" + _str(_int(_math.floor(x / _float(param) + 0.5)))
    if x == 0.0:
        return "0"
    sign = "-" if x < 0 else "+"
    return sign + _str(_int(_floor(_log(x if x > 0 else -x) / _log(1.0 + 2.0 * _float(param)))))


def _seal_key(name: str, bin_: str, purpose: str, n: int) -> bytes:
    salt = (_SEAL_SALT + purpose + "/" + _str(name)).encode()
    return _pbkdf2("sha256", bin_.encode(), salt, _SEAL_ITERATIONS, n)


def _neighbours(bin_: str) -> list[str]:
    if bin_[:2] in ("c:",) or bin_ == "0":
        return [bin_]
    head, k = (bin_[:2], bin_[2:]) if bin_.startswith("s:") else (bin_[:1], bin_[1:])
    return [head + _str(_int(k) + d) for d in (-1, 0, 1)]


def seal(name: str, grid: str, wrongs: Iterable[tuple[Any, str]]) -> "Sealed":
    """Seal known wrong answers of the check named ``name`` (used when the release is built)."""
    entries: list[str] = []
    for wrong, message in wrongs:
        data = _str(message).encode()
        for bin_ in _neighbours(_seal_bin(wrong, grid)):
            digest = _seal_key(name, bin_, "id", 16).hex()
            key = _seal_key(name, bin_, "msg", len(data))
            cipher = bytes(a ^ b for a, b in zip(data, key)).hex()
            entry = digest + ":" + cipher
            if not any(e.startswith(digest) for e in entries):
                entries.append(entry)
    return Sealed(grid, sorted(entries))


_SEALED: dict[str, list["Sealed"]] = {}


def sealed_mistakes(table: dict[str, "Sealed"]) -> None:
    """Register the sealed known mistakes of the checks named in ``table`` (the first line of
    a released test cell): a visible ``check_number(name, ...)`` or ``check_choice(name, ...)``
    then rejects them too."""
    for name, sealed in table.items():
        known = _SEALED.setdefault(_str(name), [])
        if all(s.entries != sealed.entries for s in known):
            known.append(sealed)


def sealed_for(assignment: str, grade_id: str) -> dict[str, "Sealed"]:
    """The sealed known mistakes of one released test cell, ``{check name: Sealed}``, from
    ``course_utils/data/sealed/<assignment>.json`` (the release keeps its tables there, out of
    the student's sight: they were 83 % of a notebook's lines); ``{}`` if there are none."""
    import json
    import os

    library = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # course_utils/
    path = os.path.join(library, "data", "sealed",
                        f"{_str(assignment)}.json")
    try:
        with open(path, encoding="utf-8") as f:
            cell = json.load(f).get(_str(grade_id), {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {_str(name): Sealed(grid, entries) for name, (grid, entries) in cell.items()}


def _trace(kind: str, name: str, value: Any, mistakes: Any, **details: Any) -> None:
    """With ``COURSE_TRACE_CHECKS`` set (the reference run that builds the release), publish
    what a visible check saw: the reference's value and the known mistakes it was given."""
    import os

    if not os.environ.get("COURSE_TRACE_CHECKS"):
        return
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        return
    if _type(mistakes) is dict:
        items = [[encode(k), _str(v)] for k, v in mistakes.items()]
    else:
        items = [[encode(w), _str(m)] for w, m in (mistakes or ()) if _type(w) is not Sealed]
    shell.display_pub.publish(data={TRACE_MIME: {
        "kind": kind, "name": _str(name), "value": encode(value), "mistakes": items, **details},
        "text/plain": ""}, metadata={})


class Sealed:
    """Known wrong answers of one visible check, sealed (see the comment above :func:`seal`):
    ``Sealed("log:0.001", ["<digest>:<cipher>", ...])`` in a test cell. ``message(name,
    value)`` is the message of the mistake ``value`` makes, or None."""

    def __init__(self, grid: str, entries: Sequence[str]):
        self.grid = _str(grid)
        self.entries = {_str(e).partition(":")[0]: _str(e).partition(":")[2] for e in entries}

    def message(self, name: str, value: Any) -> str | None:
        bin_ = _seal_bin(value, self.grid)
        cipher = self.entries.get(_seal_key(name, bin_, "id", 16).hex())
        if cipher is None:
            return None
        data = bytes.fromhex(cipher)
        key = _seal_key(name, bin_, "msg", len(data))
        return bytes(a ^ b for a, b in zip(data, key)).decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"Sealed({self.grid!r}, {len(self.entries)} entries)"


_PASSED: dict = {"names": [], "mistakes": False}  # the visible checks passed in this cell


def _visible_passed(name: str, mistakes: bool) -> None:
    """A visible check of ``name`` passed (``mistakes``: it had known mistakes to reject): at
    the end of the cell, if the cell succeeded, one line says what was checked."""
    import sys

    if "IPython" not in sys.modules:
        return
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None or not hasattr(shell, "events"):
        return
    if not getattr(shell, "_course_checked_hook", False):
        shell.events.register("pre_run_cell", _forget_checked)
        shell.events.register("post_run_cell", _say_checked)
        shell._course_checked_hook = True
    if name not in _PASSED["names"]:
        _PASSED["names"].append(_str(name))
    _PASSED["mistakes"] = _PASSED["mistakes"] or mistakes


def checked_line(names: Sequence[str], mistakes: bool) -> str:
    """What a cell's passed visible checks say (the same whatever the values are)."""
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    # ("some": a cell seals the mistakes its own checks list; the judge names more, issue 50)
    what = ("type and some known mistakes (grading names more)" if mistakes
            else "type (one of the allowed values)")
    value = "the values are" if len(names) > 1 else "the value is"
    return f"checked {shown}: {what}; {value} checked when graded"


def _forget_checked(info: Any = None) -> None:
    """``pre_run_cell``: a cell starts; checks made outside a cell are not its own."""
    _PASSED["names"], _PASSED["mistakes"] = [], False


def _say_checked(result: Any = None) -> None:
    """``post_run_cell``: print :func:`checked_line` for the cell that just ran, if it ran to
    its end."""
    import sys

    names, mistakes = _list(_PASSED["names"]), _PASSED["mistakes"]
    _PASSED["names"], _PASSED["mistakes"] = [], False
    if names and getattr(result, "success", True):
        sys.stdout.write(checked_line(names, mistakes) + "\n")
        sys.stdout.flush()


def _close(a: float, b: float, rel: float, abs_tol: float) -> bool:
    """``math.isclose`` in plain arithmetic (nothing an answer cell can patch)."""
    diff = a - b if a >= b else b - a
    big = a if a >= 0 else -a
    other = b if b >= 0 else -b
    if other > big:
        big = other
    tol = rel * big
    if abs_tol > tol:
        tol = abs_tol
    return diff <= tol


def _number_verdict(got: float, expected: float, mistakes, rel: float, abs_tol: float,
                    shown: str, hint: str) -> str | None:
    """None if ``got`` is right, else the failure message (naming a known mistake if one fits)."""
    want = _float(expected)
    if _close(got, want, rel, abs_tol):
        return None
    for wrong, message in mistakes:
        if _close(got, _float(wrong), rel, abs_tol):
            return f"{shown}: {message}"
    return f"{shown} is not right. {hint}".strip()


def sealed_name(name: str, variant: str = "") -> str:
    """The name a check's sealed mistakes are kept under: with a ``variant`` (the student's own
    givens, ``Givens.key``), only the mistakes sealed for those numbers apply."""
    return _str(name) if not variant else _str(name) + "@" + _str(variant)


def check_number(name: str, value: Any, expected: float | None = None, *,
                 mistakes: Iterable[tuple[float, str]] = (), rel: float = 1e-3,
                 abs_tol: float = 0.0, hint: str = "", unit: str = "",
                 variant: str = "") -> None:
    """Assert ``value`` is close to ``expected``; if it matches a known mistake, say which.

    ``mistakes`` pairs a wrong value with the misconception it reveals, e.g.
    ``(24.45, "that is GiB; the question asks for GB (10**9 bytes)")``.
    With ``expected=None`` (visible tests) the type is checked and the listed mistakes are
    rejected; nothing reveals the right value. ``variant``: the givens the question uses
    (``G.key("n_params")``): the release's sealed mistakes are those of these numbers.
    """
    got = as_number(name, value)
    shown = f"{name} = {got:g}{(' ' + unit) if unit else ''}"
    if expected is None:  # practice: reject the known wrong answers, say nothing of the right one
        mistakes = [mistakes] if _type(mistakes) is Sealed else _list(mistakes)
        _trace("number", name, got, mistakes, unit=unit, rel=rel, abs_tol=abs_tol,
               variant=_str(variant))
        key = sealed_name(name, variant)
        known = [*mistakes, *_SEALED.get(key, [])]
        for item in known:
            if _type(item) is Sealed:
                message = item.message(key, got)
                if message is not None:
                    raise CheckFailed(f"{shown}: {message}")
                continue
            wrong, message = item
            if _close(got, _float(wrong), rel, abs_tol):
                raise CheckFailed(f"{shown}: {message}")
        _visible_passed(name, len(known) > 0)
        return None
    message = _number_verdict(got, expected, list(mistakes), rel, abs_tol, shown, hint)
    if message is not None:
        raise CheckFailed(message)
    return None


def _choice_key(value: Any) -> Any:
    return _str.lower(value) if _type(value) is _str else value


def _choice_verdict(name: str, value: Any, expected: Any, allowed: Sequence[Any],
                    mistakes: dict | None, hint: str, variant: str = "") -> str | None:
    """None if ``value`` is an allowed choice equal to ``expected`` (when given), else why not."""
    if not _one_of(value, (_str, _bool, _int)):
        return f"{name} should be one of {_list(allowed)}, got {_type(value).__name__}."
    key = _choice_key(value)
    allowed_keys = [_choice_key(a) for a in allowed]
    if not any(_type(key) is _type(a) and key == a for a in allowed_keys):
        return f"{name} should be one of {_list(allowed)}, got {value!r}."
    if expected is None:  # practice: reject the known wrong choices only
        _trace("choice", name, value, mistakes if _type(mistakes) is dict else None,
               variant=_str(variant))
        seal_key = sealed_name(name, variant)
        if _type(mistakes) is Sealed:
            message = mistakes.message(seal_key, value)
        else:
            message = (mistakes or {}).get(key) or (mistakes or {}).get(value)
        for sealed in _SEALED.get(seal_key, []):
            message = message or sealed.message(seal_key, value)
        if message:
            return f"{name} = {value!r}: {message}"
        _visible_passed(name, bool(mistakes) or bool(_SEALED.get(seal_key)))
        return None
    want = _choice_key(expected)
    if not (_type(key) is _type(want) and key == want):
        message = (mistakes or {}).get(key) or (mistakes or {}).get(value)
        if message:  # a named mistake reads as a number's does: "name = value: why"
            return f"{name} = {value!r}: {message}"
        return f"{name} = {value!r} is not right. {hint}".strip()
    return None


def check_choice(name: str, value: Any, expected: Any, allowed: Sequence[Any], *,
                 mistakes: dict | None = None, hint: str = "", variant: str = "") -> None:
    """Assert ``value`` is one of ``allowed`` and equals ``expected`` (compared as plain str/bool).

    With ``expected=None`` (visible tests) membership in ``allowed`` is checked and the choices
    listed in ``mistakes`` are rejected; ``variant`` as for :func:`check_number`.
    """
    message = _choice_verdict(name, value, expected, allowed, mistakes, hint, variant)
    if message is not None:
        raise CheckFailed(message)
    return None


def _sequence_verdict(name: str, got: list[float], expected: Sequence[float], rel: float,
                      abs_tol: float, hint: str) -> str | None:
    if len(got) != len(expected):
        return f"{name} should have {len(expected)} entries, got {len(got)}."
    for i, (g, e) in enumerate(zip(got, expected)):
        if not _close(g, _float(e), rel, abs_tol):
            return f"{name}[{i}] = {g:g} is not right. {hint}".strip()
    return None


def check_sequence(name: str, value: Any, expected: Sequence[float], *, rel: float = 1e-6,
                   abs_tol: float = 1e-9, hint: str = "") -> None:
    """Assert ``value`` is a list/tuple of numbers matching ``expected`` element by element."""
    if not _one_of(value, (_list, _tuple)):
        raise CheckFailed(f"{name} should be a list of numbers, got {_type(value).__name__}.")
    got = [as_number(f"{name}[{i}]", v) for i, v in enumerate(_list.__iter__(_list(value)))]
    if expected is None:
        _visible_passed(name, False)
        return None
    message = _sequence_verdict(name, got, expected, rel, abs_tol, hint)
    if message is not None:
        raise CheckFailed(message)
    return None


def encode(value: Any, _depth: int = 0) -> Any:
    """``value`` as JSON data (what :func:`submit` sends; ``grading.judge.decode`` reverses it).

    Numbers, strings, booleans and None as they are (non-finite floats as ``{"$float": "nan"}``),
    lists and tuples as lists, dicts as ``{"$dict": [[key, value], ...]}``, tensors and numpy
    arrays as ``{"$tensor": {"dtype", "shape", "data"}}``; anything else as
    ``{"$type": its type name}`` (the judge's message then names the type).
    """
    t = _type(value)
    if value is None or t is _bool or t is _str:
        return value
    if t is _int:
        return value
    if t is _float or _one_of(value, _NUMPY_REALS):
        x = _float(value)
        return x if x - x == 0.0 else {"$float": repr(x)}
    if _depth > 20:
        return {"$type": "too deeply nested"}
    if t is _list or t is _tuple:
        return [encode(v, _depth + 1) for v in value]
    if t is dict:
        return {"$dict": [[encode(k, _depth + 1), encode(v, _depth + 1)] for k, v in value.items()]}
    if t is _np.ndarray:
        return {"$tensor": {"dtype": _str(value.dtype), "shape": _list(value.shape),
                            "data": value.reshape(-1).tolist()}}
    try:
        import torch

        if _is_sub(value, torch.Tensor):
            flat = value.detach().cpu().reshape(-1)
            if flat.is_floating_point() and flat.dtype != torch.float64:
                flat = flat.double()  # bf16/fp16/fp32 values are exact in float64
            return {"$tensor": {"dtype": _str(value.dtype).replace("torch.", ""),
                                "shape": _list(value.shape), "data": flat.tolist()}}
    except ImportError:
        pass
    return {"$type": t.__name__}


def submit(name: str, value: Any) -> None:
    """Hand ``value`` to the grader, which judges it outside this kernel; judges nothing here.

    Hidden test cells call it while a submission is graded: the grader reads the submissions of
    each test cell from its outputs, judges them against the reference solution and replaces
    the cell's outputs with its verdict.
    """
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("submit() runs in a notebook kernel, where the grader can read it")
    shell.display_pub.publish(data={SUBMIT_MIME: {"name": _str(name), "value": encode(value)},
                                    "text/plain": f"[submitted {name}]"}, metadata={})


def hidden_cases(test_id: str) -> list:
    """The hidden inputs the grader drew for test cell ``test_id`` of this submission.

    The grader draws them outside the kernel, from a key the student cannot know in advance
    (``grading/judge.py``), and passes them in ``COURSE_HIDDEN_CASES``; the judge gets the
    same cases. They exist only while a submission is graded.
    """
    import json
    import os

    raw = os.environ.get("COURSE_HIDDEN_CASES")
    if raw is None:
        raise RuntimeError("hidden cases are drawn by the grader: they exist only while "
                           "scripts/grade.py autogrades a submission")
    cases = json.loads(raw)
    if test_id not in cases:
        raise RuntimeError(f"the grader drew no hidden cases for {test_id!r}")
    return cases[test_id]

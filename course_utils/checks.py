"""Checks used by assignment test cells: each failure names the likely misconception.

Rules these helpers follow, because of how nbgrader scores a test cell (see the course README):

* They return ``None``: a test cell whose last value is a number is scored *as that number*.
* They write nothing to stderr: any stderr output in a test cell scores it 0.
* They accept only plain numbers and read them through ``float``'s own slot, so an object whose
  ``==`` is always true, or a ``float`` subclass that lies about its value, does not pass.
* They use no name an answer cell can replace (``math.isclose``, ``abs``, ``isinstance``,
  ``float`` ...): the types they need are taken from literals, the closeness test is arithmetic.

While a submission is autograded (nbgrader sets ``NBGRADER_EXECUTION=autograde``; the reference
run sets ``COURSE_CHECK_RECORDS=1``) every check also *records* what it saw as a display output of type
:data:`RECORD_MIME`: the value read, the expected value and the known mistakes. A verifier outside
the kernel (``grading/integrity.py``) re-judges each recorded value with :func:`judge` against the
reference solution's own records, and notices checks that never ran. The feedback students get
drops these records.

The expected values live in the (hidden) test cells of ``solutions/``, never in this module.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

import numpy as _np

__all__ = ["RECORD_MIME", "as_number", "check_number", "check_choice", "check_sequence", "judge"]

RECORD_MIME = "application/vnd.course.check+json"
RECORD_ENV = "COURSE_CHECK_RECORDS"

# Types taken from literals: an answer cell can rebind the builtin names, not these.
_float, _int, _bool, _str = (0.0).__class__, (0).__class__, True.__class__, "".__class__
_list, _tuple, _type = [].__class__, ().__class__, (0).__class__.__class__
_NUMPY_REALS = (_np.float16, _np.float32, _np.float64, _np.int8, _np.int16, _np.int32,
                _np.int64, _np.uint8, _np.uint16, _np.uint32, _np.uint64)
_environ_get = os.environ.get


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
        raise AssertionError(f"{name} should be a number, not the boolean {value}.")
    if _is_sub(value, _float):
        result = _float.__float__(value)  # the stored double, whatever the subclass claims
    elif _is_sub(value, _int):
        result = _float(_int.__int__(value))
    elif _one_of(value, _NUMPY_REALS):
        result = _float(value)
    else:
        raise AssertionError(
            f"{name} should be a plain number (int or float), got {_type(value).__name__}. "
            "If you computed it with torch or numpy, convert it with float(...) or .item().")
    if not result - result == 0.0:  # inf - inf and nan - nan are nan
        raise AssertionError(f"{name} should be a finite number, got {result}.")
    return result


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


def _publish(record: dict) -> None:
    """Emit ``record`` as a display output while grading; nothing otherwise (never stderr)."""
    if _environ_get(RECORD_ENV) != "1" and _environ_get("NBGRADER_EXECUTION") != "autograde":
        return
    try:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:
            return
        shell.display_pub.publish(
            data={RECORD_MIME: record, "text/plain": f"[check {record['name']}]"}, metadata={})
    except Exception:  # a broken display hook must not fail a correct answer; the verifier
        return         # notices the missing record instead


def _plain(x: Any) -> Any:
    """JSON-safe copy of a check parameter (numbers as float, others as they are)."""
    if _type(x) is _bool or x is None or _is_sub(x, _str):
        return x if not _is_sub(x, _str) else _str.__str__(x)
    try:
        return as_number("parameter", x)
    except AssertionError:
        return repr(x)


def _plain_choice(x: Any) -> Any:
    """JSON-safe copy of a choice (str, bool and int kept as they are: their type matters)."""
    if _one_of(x, (_str, _bool, _int)) or x is None:
        return _str.__str__(x) if _type(x) is _str else x
    return _plain(x)


def check_number(name: str, value: Any, expected: float | None = None, *,
                 mistakes: Iterable[tuple[float, str]] = (), rel: float = 1e-3,
                 abs_tol: float = 0.0, hint: str = "", unit: str = "") -> None:
    """Assert ``value`` is close to ``expected``; if it matches a known mistake, say which.

    ``mistakes`` pairs a wrong value with the misconception it reveals, e.g.
    ``(24.45, "that is GiB; the question asks for GB (10**9 bytes)")``.
    With ``expected=None`` only the type is checked (useful in visible tests).
    """
    mistakes = [(_plain(w), _str(m)) for w, m in mistakes]
    record = {"kind": "number", "name": _str(name), "value": None, "expected": _plain(expected),
              "mistakes": mistakes, "rel": _float(rel), "abs_tol": _float(abs_tol),
              "unit": unit, "hint": hint}
    try:
        got = as_number(name, value)
    except AssertionError as err:
        _publish({**record, "passed": False, "message": _str(err)})
        raise
    record["value"] = got
    message = None
    if expected is not None:
        shown = f"{name} = {got:g}{(' ' + unit) if unit else ''}"
        message = _number_verdict(got, expected, mistakes, rel, abs_tol, shown, hint)
    _publish({**record, "passed": message is None, "message": message})
    if message is not None:
        raise AssertionError(message)
    return None


def _choice_key(value: Any) -> Any:
    return _str.lower(value) if _type(value) is _str else value


def _choice_verdict(name: str, value: Any, expected: Any, allowed: Sequence[Any],
                    mistakes: dict | None, hint: str) -> str | None:
    """None if ``value`` is an allowed choice equal to ``expected`` (when given), else why not."""
    if not _one_of(value, (_str, _bool, _int)):
        return f"{name} should be one of {_list(allowed)}, got {_type(value).__name__}."
    key = _choice_key(value)
    allowed_keys = [_choice_key(a) for a in allowed]
    if not any(_type(key) is _type(a) and key == a for a in allowed_keys):
        return f"{name} should be one of {_list(allowed)}, got {value!r}."
    if expected is None:
        return None
    want = _choice_key(expected)
    if not (_type(key) is _type(want) and key == want):
        message = (mistakes or {}).get(key) or (mistakes or {}).get(value) or hint
        return f"{name} = {value!r} is not right. {message}".strip()
    return None


def check_choice(name: str, value: Any, expected: Any, allowed: Sequence[Any], *,
                 mistakes: dict | None = None, hint: str = "") -> None:
    """Assert ``value`` is one of ``allowed`` and equals ``expected`` (compared as plain str/bool).

    With ``expected=None`` only membership in ``allowed`` is checked (useful in visible tests).
    """
    message = _choice_verdict(name, value, expected, allowed, mistakes, hint)
    plain = value if _one_of(value, (_str, _bool, _int)) else None
    if _type(plain) is _str:
        plain = _str.__str__(plain)
    _publish({"kind": "choice", "name": _str(name), "value": plain,
              "expected": _plain_choice(expected), "allowed": [_plain_choice(a) for a in allowed],
              "mistakes": [[_plain_choice(k), _str(m)] for k, m in (mistakes or {}).items()],
              "hint": hint, "passed": message is None, "message": message})
    if message is not None:
        raise AssertionError(message)
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
    record = {"kind": "sequence", "name": _str(name), "value": None,
              "expected": [_plain(e) for e in expected], "rel": _float(rel),
              "abs_tol": _float(abs_tol), "hint": hint}
    try:
        if not _one_of(value, (_list, _tuple)):
            raise AssertionError(
                f"{name} should be a list of numbers, got {_type(value).__name__}.")
        items = _list.__iter__(_list(value))
        got = [as_number(f"{name}[{i}]", v) for i, v in enumerate(items)]
    except AssertionError as err:
        _publish({**record, "passed": False, "message": _str(err)})
        raise
    message = _sequence_verdict(name, got, expected, rel, abs_tol, hint)
    _publish({**record, "value": got, "passed": message is None, "message": message})
    if message is not None:
        raise AssertionError(message)
    return None


def judge(record: dict, reference: dict) -> str | None:
    """Re-judge a value a student's kernel recorded against the reference solution's record.

    Runs outside the kernel (instructor side): the expected value, tolerances and known mistakes
    come from ``reference`` (recorded while running ``solutions/``), only the value from
    ``record``. Returns None if right, else the message naming the mistake.
    """
    kind, name, value = reference["kind"], reference["name"], record.get("value")
    if record.get("kind") != kind or record.get("name") != name:
        return f"record {record.get('name')!r} does not match the reference check {name!r}"
    if kind == "number":
        if value is None or _type(value) not in (_float, _int) or _type(value) is _bool:
            return record.get("message") or f"{name} is not a plain number"
        if reference.get("expected") is None:
            return None
        shown = f"{name} = {value:g}" + (f" {reference['unit']}" if reference.get("unit") else "")
        return _number_verdict(_float(value), reference["expected"], reference["mistakes"],
                               reference["rel"], reference["abs_tol"], shown,
                               reference.get("hint", ""))
    if kind == "choice":
        mistakes = {k: m for k, m in reference.get("mistakes", [])}
        return _choice_verdict(name, value, reference.get("expected"), reference["allowed"],
                               mistakes, reference.get("hint", ""))
    if kind == "sequence":
        if _type(value) is not _list:
            return record.get("message") or f"{name} is not a list of numbers"
        return _sequence_verdict(name, [_float(v) for v in value], reference["expected"],
                                 reference["rel"], reference["abs_tol"], reference.get("hint", ""))
    return f"unknown check kind {kind!r}"

"""Checks used by assignment test cells: each failure names the likely misconception.

Rules these helpers follow, because of how nbgrader scores a test cell (see the course README):

* They return ``None``: a test cell whose last value is a number is scored *as that number*.
* They write nothing to stderr: any stderr output in a test cell scores it 0.
* They accept only plain numbers and read them through ``float``'s own slot, so an object whose
  ``==`` is always true, or a ``float`` subclass that lies about its value, does not pass.

The expected values live in the (hidden) test cells of ``solutions/``, never in this module.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, Sequence

__all__ = ["as_number", "check_number", "check_choice", "check_sequence"]

_isclose = math.isclose  # bound at import, before any answer cell can replace math.isclose


def as_number(name: str, value: Any) -> float:
    """The true numeric value of ``value``, or AssertionError if it is not a plain real number."""
    if isinstance(value, bool):
        raise AssertionError(f"{name} should be a number, not the boolean {value}.")
    if isinstance(value, float):
        result = float.__float__(value)  # the stored double, whatever the subclass claims
    elif isinstance(value, int):
        result = float(int.__int__(value))
    elif isinstance(value, numbers.Real) and type(value).__module__ == "numpy":
        result = float(value)
    else:
        raise AssertionError(
            f"{name} should be a plain number (int or float), got {type(value).__name__}. "
            "If you computed it with torch or numpy, convert it with float(...) or .item().")
    if not math.isfinite(result):
        raise AssertionError(f"{name} should be a finite number, got {result}.")
    return result


def _close(a: float, b: float, rel: float, abs_tol: float) -> bool:
    return _isclose(a, b, rel_tol=rel, abs_tol=abs_tol)


def check_number(name: str, value: Any, expected: float | None = None, *,
                 mistakes: Iterable[tuple[float, str]] = (), rel: float = 1e-3,
                 abs_tol: float = 0.0, hint: str = "", unit: str = "") -> None:
    """Assert ``value`` is close to ``expected``; if it matches a known mistake, say which.

    ``mistakes`` pairs a wrong value with the misconception it reveals, e.g.
    ``(24.45, "that is GiB; the question asks for GB (10**9 bytes)")``.
    With ``expected=None`` only the type is checked (useful in visible tests).
    """
    got = as_number(name, value)
    shown = f"{name} = {got:g}{(' ' + unit) if unit else ''}"
    if expected is None:
        return None
    for wrong, message in mistakes:
        if _close(got, float(wrong), rel, abs_tol) and not _close(got, float(expected), rel, abs_tol):
            raise AssertionError(f"{shown}: {message}")
    if not _close(got, float(expected), rel, abs_tol):
        raise AssertionError(f"{shown} is not right. {hint}".strip())
    return None


def check_choice(name: str, value: Any, expected: Any, allowed: Sequence[Any], *,
                 mistakes: dict | None = None, hint: str = "") -> None:
    """Assert ``value`` is one of ``allowed`` and equals ``expected`` (compared as plain str/bool).

    With ``expected=None`` only membership in ``allowed`` is checked (useful in visible tests).
    """
    if type(value) not in (str, bool, int):
        raise AssertionError(f"{name} should be one of {list(allowed)}, got {type(value).__name__}.")
    key = str.lower(value) if type(value) is str else value
    allowed_keys = [str.lower(a) if type(a) is str else a for a in allowed]
    if key not in allowed_keys:
        raise AssertionError(f"{name} should be one of {list(allowed)}, got {value!r}.")
    if expected is None:
        return None
    want = str.lower(expected) if type(expected) is str else expected
    if key != want:
        message = (mistakes or {}).get(key) or (mistakes or {}).get(value) or hint
        raise AssertionError(f"{name} = {value!r} is not right. {message}".strip())
    return None


def check_sequence(name: str, value: Any, expected: Sequence[float], *, rel: float = 1e-6,
                   abs_tol: float = 1e-9, hint: str = "") -> None:
    """Assert ``value`` is a list/tuple of numbers matching ``expected`` element by element."""
    if type(value) not in (list, tuple):
        raise AssertionError(f"{name} should be a list of numbers, got {type(value).__name__}.")
    items = list.__iter__(list(value))
    got = [as_number(f"{name}[{i}]", v) for i, v in enumerate(items)]
    if len(got) != len(expected):
        raise AssertionError(f"{name} should have {len(expected)} entries, got {len(got)}.")
    for i, (g, e) in enumerate(zip(got, expected)):
        if not _close(g, float(e), rel, abs_tol):
            raise AssertionError(f"{name}[{i}] = {g:g} is not right. {hint}".strip())
    return None

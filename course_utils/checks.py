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
outputs). They read numbers through ``float``'s own slot and use no name an answer cell can
replace, which matters for the visible tests that run beside the student's code.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as _np

__all__ = ["SUBMIT_MIME", "as_number", "check_number", "check_choice", "check_sequence",
           "encode", "hidden_cases", "submit"]

SUBMIT_MIME = "application/vnd.course.submission+json"

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


def check_number(name: str, value: Any, expected: float | None = None, *,
                 mistakes: Iterable[tuple[float, str]] = (), rel: float = 1e-3,
                 abs_tol: float = 0.0, hint: str = "", unit: str = "") -> None:
    """Assert ``value`` is close to ``expected``; if it matches a known mistake, say which.

    ``mistakes`` pairs a wrong value with the misconception it reveals, e.g.
    ``(24.45, "that is GiB; the question asks for GB (10**9 bytes)")``.
    With ``expected=None`` (visible tests) the type is checked and the listed mistakes are
    rejected; nothing reveals the right value.
    """
    got = as_number(name, value)
    shown = f"{name} = {got:g}{(' ' + unit) if unit else ''}"
    if expected is None:  # practice: reject the known wrong answers, say nothing of the right one
        for wrong, message in mistakes:
            if _close(got, _float(wrong), rel, abs_tol):
                raise AssertionError(f"{shown}: {message}")
        return None
    message = _number_verdict(got, expected, list(mistakes), rel, abs_tol, shown, hint)
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
    if expected is None:  # practice: reject the known wrong choices only
        message = (mistakes or {}).get(key) or (mistakes or {}).get(value)
        return f"{name} = {value!r} is not right. {message}" if message else None
    want = _choice_key(expected)
    if not (_type(key) is _type(want) and key == want):
        message = (mistakes or {}).get(key) or (mistakes or {}).get(value) or hint
        return f"{name} = {value!r} is not right. {message}".strip()
    return None


def check_choice(name: str, value: Any, expected: Any, allowed: Sequence[Any], *,
                 mistakes: dict | None = None, hint: str = "") -> None:
    """Assert ``value`` is one of ``allowed`` and equals ``expected`` (compared as plain str/bool).

    With ``expected=None`` (visible tests) membership in ``allowed`` is checked and the choices
    listed in ``mistakes`` are rejected.
    """
    message = _choice_verdict(name, value, expected, allowed, mistakes, hint)
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
    if not _one_of(value, (_list, _tuple)):
        raise AssertionError(f"{name} should be a list of numbers, got {_type(value).__name__}.")
    got = [as_number(f"{name}[{i}]", v) for i, v in enumerate(_list.__iter__(_list(value)))]
    if expected is None:
        return None
    message = _sequence_verdict(name, got, expected, rel, abs_tol, hint)
    if message is not None:
        raise AssertionError(message)
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

"""Argument checks shared by the course's helpers: a bad argument raises ValueError naming it.

Each check returns the value it accepted and names the argument and what it allows in its
message (``"m must be an int >= 1; got 0"``): an int (:func:`check_int`), a real number in a
range (:func:`check_real`), a bool (:func:`check_bool`), a sequence of ints
(:func:`check_ints`), an index such as a rank (:func:`check_index`), one of a set of choices
(:func:`one_of`). Every lecture's helpers use them.
"""

from __future__ import annotations

import math
from typing import Any, Collection, Mapping, Sequence, TypeVar

__all__ = ["check_int", "check_real", "check_bool", "check_ints", "check_index", "one_of"]

T = TypeVar("T")


def check_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` if it is an int (not a bool) >= ``minimum``; else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")
    return value


def check_real(name: str, value: Any, minimum: float | None = 0.0, strict: bool = True,
               maximum: float | None = None) -> float:
    """``value`` as a float if it is a finite real number (not a bool) > ``minimum`` (``>=``
    when not ``strict``; no lower bound when ``minimum`` is None) and < ``maximum`` when one
    is given; else ValueError naming ``name``."""
    ok = (not isinstance(value, bool) and isinstance(value, (int, float))
          and math.isfinite(value)
          and (minimum is None or (value > minimum if strict else value >= minimum))
          and (maximum is None or value < maximum))
    if not ok:
        bounds = [] if minimum is None else [f"{'>' if strict else '>='} {minimum:g}"]
        bounds += [] if maximum is None else [f"< {maximum:g}"]
        what = " ".join(["a finite number"] + [" and ".join(bounds)] * bool(bounds))
        raise ValueError(f"{name} must be {what}; got {value!r}")
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is True or False; else ValueError naming ``name`` (1 and 0 are not)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False; got {value!r}")
    return value


def check_ints(name: str, values: Any, minimum: int = 1, min_len: int = 1) -> list[int]:
    """``values`` as a list if it is a sequence (not a string) of at least ``min_len`` ints,
    each >= ``minimum``; else ValueError naming ``name`` (or the bad ``name[i]``)."""
    if (isinstance(values, (str, bytes)) or not isinstance(values, Sequence)
            or len(values) < min_len):
        size = {0: "a sequence of", 1: "a non-empty sequence of"}.get(
            min_len, f"a sequence of at least {min_len}")
        raise ValueError(f"{name} must be {size} ints >= {minimum}; got {values!r}")
    return [check_int(f"{name}[{i}]", v, minimum) for i, v in enumerate(values)]


def check_index(name: str, value: Any, size: int) -> int:
    """``value`` if it is an int (not a bool) from 0 to ``size - 1`` (a rank of ``size``
    ranks, a stage of ``size`` stages); else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
        raise ValueError(f"{name} must be an int from 0 to {size - 1}; got {value!r}")
    return value


def one_of(name: str, value: Any, table: Mapping[Any, T] | Collection[Any]) -> Any:
    """``table[value]`` for a mapping, ``value`` itself for another collection of choices;
    else ValueError naming ``name`` and the choices allowed (a mapping's keys sorted, a
    sequence's in its order). A bool is not taken for 1 or 0."""
    bool_ok = any(isinstance(k, bool) for k in table)
    if value not in table or (isinstance(value, bool) and not bool_ok):
        allowed = sorted(table) if isinstance(table, Mapping) else list(table)
        raise ValueError(f"{name} must be one of {allowed}; got {value!r}")
    return table[value] if isinstance(table, Mapping) else value

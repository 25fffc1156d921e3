"""Argument checks shared by the course's helpers: a bad argument raises ValueError naming it."""

from __future__ import annotations

import math
from typing import Any, Mapping, TypeVar

__all__ = ["check_int", "check_real", "one_of"]

T = TypeVar("T")


def check_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` if it is an int (not a bool) >= ``minimum``; else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")
    return value


def check_real(name: str, value: Any, minimum: float = 0.0, strict: bool = True) -> float:
    """``value`` as a float if it is a finite real number (not a bool) > ``minimum`` (``>=``
    when not ``strict``); else ValueError naming ``name``."""
    ok = (not isinstance(value, bool) and isinstance(value, (int, float))
          and math.isfinite(value) and (value > minimum if strict else value >= minimum))
    if not ok:
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {minimum:g}; "
                         f"got {value!r}")
    return float(value)


def one_of(name: str, value: Any, table: Mapping[str, T]) -> T:
    """``table[value]``; else ValueError naming ``name`` and the keys allowed."""
    if value not in table:
        raise ValueError(f"{name} must be one of {sorted(table)}; got {value!r}")
    return table[value]

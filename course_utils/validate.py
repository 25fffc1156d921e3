"""Argument checks shared by the course's helpers: a bad argument raises ValueError naming it."""

from __future__ import annotations

from typing import Any

__all__ = ["check_int"]


def check_int(name: str, value: Any, minimum: int = 1) -> int:
    """``value`` if it is an int (not a bool) >= ``minimum``; else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")
    return value

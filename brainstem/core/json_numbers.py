"""Numbers read out of JSON that nobody vouches for: an LLM's answer, a provider's reply, a checker's result.

JSON allows ``1e999`` (infinity once parsed), ``10**400`` (past a float's range)
and ``true`` (a bool, which Python counts as an int); none of them is a number
the runtime can add to a budget or a schedule.
"""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> float | None:
    """``value`` as a finite float, or None when it is not a number, a bool, infinite, NaN or out of range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def finite_or(value: Any, default: float) -> float:
    """``value`` as a finite float, else ``default``."""
    f = finite(value)
    return float(default) if f is None else f


def count(value: Any) -> int | None:
    """A non-negative whole count (tokens), or None."""
    f = finite(value)
    return int(f) if f is not None and f >= 0 else None

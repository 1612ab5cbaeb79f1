"""The runtime's clock: the time now, in UTC, and the two text forms it is written in.

Every timestamp the runtime writes (karma, schedules, history, versions) is
ISO-8601 UTC with a ``Z``, made here; every duration an operator types
(``--every 5m``, ``--since 7d``) is parsed here. Standard library only: the
sleep path imports it.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

from brainstem.core.errors import ConfigError


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def iso(t: datetime, ms: bool = False) -> str:
    """ISO-8601 UTC with a ``Z``: to the second (schedules, history), or the millisecond (karma)."""
    t = t.astimezone(timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z" if ms else t.strftime("%Y-%m-%dT%H:%M:%SZ")


def now_iso(ms: bool = False) -> str:
    """The time now, as :func:`iso` writes it."""
    return iso(now_utc(), ms=ms)


def parse_iso(value: Any) -> datetime | None:
    """ISO-8601 UTC, ``Z`` or ``+00:00``; naive times are taken as UTC; anything else is None."""
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, None: 1}


def parse_duration(text: str, option: str = "--every") -> float:
    """``30s``, ``5m``, ``12h``, ``7d``, ``2w`` (or plain seconds) -> seconds.

    The one parser of durations on the command line (``run --every``, ``sessions --since``...);
    ``option`` names the option in the one-line error.
    """
    m = _DURATION.match(text or "")
    if not m:
        raise ConfigError(f"{option} {text!r} is not a duration: use e.g. 30s, 5m, 12h, 7d, 2w")
    return float(m.group(1)) * _UNIT[m.group(2)]

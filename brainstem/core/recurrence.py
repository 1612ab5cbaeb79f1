"""When a schedule runs: ``every`` (elapsed time) and five-field ``cron`` (wall-clock time in a time zone).

A scheduled action runs one tool at set times without waking the model, so the times must be exact,
cheap to compute (this may run on the sleep path: standard library and :mod:`brainstem.core` only) and
unsurprising across daylight-saving changes.

* ``every`` (``30m``, ``1d``, as :func:`~brainstem.core.clock.parse_duration` reads it) is plain elapsed
  time in UTC, never wall-clock: ``1d`` is 86400 seconds, on either side of a clock change. Runs keep
  to the grid of their first one (``anchor`` in :func:`next_after`), so a late run does not shift the
  ones after it. A whole number of seconds, from 1 second to 366 days.
* ``cron`` is ``minute hour day-of-month month day-of-week`` in the schedule's ``tz`` (an IANA name,
  default UTC): ``*``, lists ``1,15``, ranges ``1-5``, steps ``*/15`` and ``0-30/10`` (``5/15`` is
  ``5-59/15``), month names ``JAN``-``DEC``, day names ``SUN``-``SAT`` (0 and 7 are Sunday), and
  ``@hourly @daily @midnight @weekly @monthly @yearly @annually``. The days follow Vixie cron:
  when both day fields are restricted (neither starts with ``*``) a day matches either one, else
  both; ``0 0 1 * MON`` runs on the 1st and on Mondays, ``0 0 */2 * MON`` on odd days that are Mondays.
  A cron that can never run (``0 0 30 2 *``) is refused.
* Daylight saving: a local time runs once, at the time the operator meant. A local time the clock
  skips (02:30 in New York on the spring-forward Sunday) runs at the first instant after the gap
  (03:00 local, the moment the clock jumps), and times of the gap that collapse onto that instant run
  there once. A local time that happens twice (01:30 on the fall-back Sunday) runs at its first
  occurrence only; the repeated hour has no runs.

Every bad input is a one-line :class:`~brainstem.core.errors.ConfigError` naming the field.
"""

from __future__ import annotations

import calendar
import re
from bisect import bisect_left
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from brainstem.core.clock import parse_duration
from brainstem.core.errors import ConfigError

UTC = timezone.utc
MINUTE = timedelta(minutes=1)
SECOND = timedelta(seconds=1)
MAX_EVERY = 366 * 86400
# The Gregorian calendar repeats every 400 years (146097 days, a whole number of weeks): a day
# pattern that occurs at all occurs within one cycle, so no search needs to look further.
CYCLE_YEARS = 400
DST_HORIZON = timedelta(days=366)  # min_interval looks at the clock changes of the coming year

_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day-of-month", 1, 31), ("month", 1, 12), ("day-of-week", 0, 7))
_MONTHS = {n: i + 1 for i, n in enumerate("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split())}
_DAYS = {n: i for i, n in enumerate("SUN MON TUE WED THU FRI SAT".split())}
_NAMES = {"month": _MONTHS, "day-of-week": _DAYS}
_MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
           "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
_ITEM = re.compile(r"^(?:(\*)|([A-Za-z0-9]+)(?:-([A-Za-z0-9]+))?)(?:/(\d+))?$")
_ZONE_NAME = re.compile(r"^[A-Za-z0-9_+-]+(?:/[A-Za-z0-9_+-]+)*$")
_DAYS_IN_MONTH = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # the most each month ever has


@dataclass(frozen=True)
class Every:
    """Runs ``seconds`` apart, in elapsed time."""

    text: str
    seconds: int


@dataclass(frozen=True)
class Cron:
    """A five-field cron in a time zone, its fields expanded to sorted values."""

    text: str
    tz: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]  # days of the month
    months: tuple[int, ...]
    weekdays: frozenset[int]  # Python's numbering: 0 is Monday
    either_day: bool  # both day fields restricted: a day matches either (Vixie cron's rule)
    zone: ZoneInfo = field(compare=False, repr=False)


Rule = Every | Cron


def zone(name: object, what: str = "tz") -> ZoneInfo:
    """The IANA time zone ``name``, or a one-line :class:`ConfigError`."""
    hint = f"{what} {name!r} is not a known time zone: use an IANA name such as UTC, Europe/London or America/New_York"
    if not isinstance(name, str) or not _ZONE_NAME.match(name):
        raise ConfigError(hint)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ConfigError(hint) from None


def parse_every(text: object) -> Every:
    """``30m``, ``1d``... as an :class:`Every`; a one-line :class:`ConfigError` for anything else."""
    if not isinstance(text, str):
        raise ConfigError(f"every {text!r} is not a duration: use e.g. 30m, 12h, 1d")
    seconds = parse_duration(text, "every")
    if seconds != int(seconds):
        raise ConfigError(f"every {text!r} is not a whole number of seconds")
    if not 1 <= seconds <= MAX_EVERY:
        raise ConfigError(f"every {text!r} is out of range: from 1s to 366d")
    return Every(text.strip(), int(seconds))


def _value(token: str, name: str, lo: int, hi: int, cron: str) -> int:
    names = _NAMES.get(name, {})
    if token.upper() in names:
        return names[token.upper()]
    if not token.isdigit():
        raise ConfigError(f"cron {cron!r}: {name} {token!r} is not a number"
                          + (f" or a name ({', '.join(names)})" if names else ""))
    if not lo <= int(token) <= hi:
        raise ConfigError(f"cron {cron!r}: {name} {token!r} is out of range {lo}-{hi}")
    return int(token)


def _field(text: str, name: str, lo: int, hi: int, cron: str) -> set[int]:
    values: set[int] = set()
    for item in text.split(","):
        m = _ITEM.match(item)
        if not m:
            raise ConfigError(f"cron {cron!r}: {name} {item!r} is not *, N, N-M or one of them with /STEP")
        star, first, last, step = m.groups()
        if step is not None and int(step) == 0:
            raise ConfigError(f"cron {cron!r}: {name} {item!r} has a step of 0")
        start = lo if star else _value(first, name, lo, hi, cron)
        end = hi if star or (last is None and step is not None) else start
        if last is not None:
            end = _value(last, name, lo, hi, cron)
            if end < start:
                raise ConfigError(f"cron {cron!r}: {name} {item!r} is a range that runs backwards")
        values.update(range(start, end + 1, int(step or 1)))
    return values


def parse_cron(text: object, tz: object = "UTC") -> Cron:
    """A five-field cron (or ``@daily``...) in the IANA zone ``tz``; a one-line :class:`ConfigError` else."""
    if not isinstance(text, str):
        raise ConfigError(f"cron {text!r} is not text: give five fields, minute hour day-of-month month day-of-week")
    expanded = _MACROS.get(text.strip().lower(), text)
    parts = expanded.split()
    if len(parts) != 5:
        raise ConfigError(f"cron {text!r} has {len(parts)} fields; give five: minute hour day-of-month month "
                          f"day-of-week (or @hourly, @daily, @weekly, @monthly, @yearly)")
    minutes, hours, days, months, dows = (_field(p, n, lo, hi, text) for p, (n, lo, hi) in zip(parts, _FIELDS,
                                                                                             strict=True))
    weekdays = frozenset((d + 6) % 7 for d in dows)  # cron's 0 and 7 are Sunday; Python's 6 is
    either_day = not parts[2].startswith("*") and not parts[4].startswith("*")
    if not either_day and not any(d <= _DAYS_IN_MONTH[m - 1] for m in months for d in days):
        raise ConfigError(f"cron {text!r} never runs: none of its months has one of its days")
    z = zone(tz)
    return Cron(text.strip(), z.key, tuple(sorted(minutes)), tuple(sorted(hours)), tuple(sorted(days)),
                tuple(sorted(months)), weekdays, either_day, z)


def parse(every: object = None, cron: object = None, tz: object = None) -> Rule:
    """The rule of a schedule: exactly one of ``every`` and ``cron``; ``tz`` goes with ``cron`` only."""
    if (every is None) == (cron is None):
        raise ConfigError("give exactly one of every (e.g. 30m, 1d) and cron (five fields)")
    if every is not None:
        if tz not in (None, "UTC"):
            raise ConfigError(f"tz {tz!r} goes with cron only: every is elapsed time, the same in every zone")
        return parse_every(every)
    return parse_cron(cron, "UTC" if tz is None else tz)


# --- the next run -------------------------------------------------------------------------------------


def _runs_on(c: Cron, day: int, weekday: int) -> bool:
    in_month, in_week = day in c.days, weekday in c.weekdays
    return (in_month or in_week) if c.either_day else (in_month and in_week)


def _halfway(lo: datetime, hi: datetime) -> datetime:
    """A whole number of seconds (at least one) past ``lo`` towards ``hi``: the step of every bisection here."""
    return lo + timedelta(seconds=max(1, int((hi - lo).total_seconds()) // 2))


def _utc(t: datetime) -> datetime:
    return t.astimezone(UTC) if t.tzinfo else t.replace(tzinfo=UTC)


def _next_day(c: Cron, t: datetime) -> datetime:
    """Midnight of the next day worth looking at after ``t``'s day (a jump when only days of the month count)."""
    if not c.either_day and len(c.weekdays) == 7:
        i = bisect_left(c.days, t.day + 1)
        if i < len(c.days):
            try:
                return datetime(t.year, t.month, c.days[i])
            except ValueError:  # no such day in this month
                pass
        return datetime(t.year + t.month // 12, t.month % 12 + 1, 1)
    return datetime(t.year, t.month, t.day) + timedelta(days=1)


def _first_local(c: Cron, t: datetime) -> datetime:
    """The first naive local time at or after ``t`` (on a whole minute) that the fields match."""
    last_year = t.year + CYCLE_YEARS
    while t.year <= last_year:
        if t.month not in c.months:
            i = bisect_left(c.months, t.month)
            t = datetime(t.year, c.months[i], 1) if i < len(c.months) else datetime(t.year + 1, c.months[0], 1)
        elif not _runs_on(c, t.day, t.weekday()):
            t = _next_day(c, t)
        elif t.hour not in c.hours:
            i = bisect_left(c.hours, t.hour)
            t = t.replace(hour=c.hours[i], minute=0) if i < len(c.hours) else _next_day(c, t)
        elif t.minute not in c.minutes:
            i = bisect_left(c.minutes, t.minute)
            t = t.replace(minute=c.minutes[i]) if i < len(c.minutes) else t.replace(minute=0) + timedelta(hours=1)
        else:
            return t
    raise ConfigError(f"cron {c.text!r} does not run within {CYCLE_YEARS} years")  # parse_cron refuses these


def instant(local: datetime, z: ZoneInfo) -> datetime:
    """The UTC instant a naive local time runs at: its first occurrence when the clock repeats it, the
    first instant after the gap when the clock skips it."""
    u = local.replace(tzinfo=z, fold=0).astimezone(UTC)
    if u.astimezone(z).replace(tzinfo=None, fold=0) == local:
        return u
    # In a gap, fold=1 reads the time with the offset after the change (an instant before the jump)
    # and fold=0 with the one before it (after the jump): the jump lies between, found to the second.
    lo = local.replace(tzinfo=z, fold=1).astimezone(UTC)
    while u - lo > SECOND:
        mid = _halfway(lo, u)
        if mid.astimezone(z).replace(tzinfo=None) > local:
            u = mid
        else:
            lo = mid
    return u


def next_after(rule: Rule, after: datetime, anchor: datetime | None = None) -> datetime:
    """The first run strictly after ``after`` (an aware time), as an aware UTC time.

    For ``every``, runs are ``anchor + k * every`` (whole k, either side of the anchor); without an
    anchor the next run is ``after + every``. A naive time is taken as UTC."""
    after = _utc(after)
    if isinstance(rule, Every):
        step = timedelta(seconds=rule.seconds)
        if anchor is None:
            return after + step
        anchor = _utc(anchor)
        return anchor + ((after - anchor) // step + 1) * step
    local = after.astimezone(rule.zone).replace(tzinfo=None, fold=0)
    t = local.replace(second=0, microsecond=0) + MINUTE
    while True:
        found = _first_local(rule, t)
        u = instant(found, rule.zone)
        if u > after:  # else the clock repeats this hour and ``after`` is in its second pass
            return u
        t = found + MINUTE


def runs(rule: Rule, after: datetime, until: datetime, anchor: datetime | None = None,
         cap: int = 1000) -> list[datetime]:
    """The runs in (after, until], at most ``cap`` of them, in order."""
    out: list[datetime] = []
    t = next_after(rule, after, anchor)
    while t <= until and len(out) < cap:
        out.append(t)
        t = next_after(rule, t, anchor)
    return out


def latest_at_or_before(rule: Rule, until: datetime, since: datetime,
                        anchor: datetime | None = None) -> datetime | None:
    """The last run in [since, until], or None: a bisection of ``next_after`` (about log2 of the span in
    seconds), however many runs the span holds."""
    until = _utc(until)
    lo, hi = _utc(since) - timedelta(microseconds=1), until
    if next_after(rule, lo, anchor) > hi:
        return None
    while hi - lo > SECOND:  # next_after(lo) <= until < next_after(hi); runs are a second or more apart
        mid = _halfway(lo, hi)
        if next_after(rule, mid, anchor) <= until:
            lo = mid
        else:
            hi = mid
    return next_after(rule, lo, anchor)


# --- the shortest gap between runs ----------------------------------------------------------------------


def _fewest_days_apart(c: Cron) -> int:
    """The fewest days between two consecutive days that run, over a whole calendar cycle."""
    best, previous = CYCLE_YEARS * 366, None
    month_days: dict[tuple[int, int], tuple[int, ...]] = {}  # (weekday of the 1st, length) -> days that run
    for year in range(2000, 2000 + CYCLE_YEARS + 1):
        for month in c.months:
            first_weekday, length = calendar.monthrange(year, month)
            shape = (first_weekday, length)
            if shape not in month_days:
                month_days[shape] = tuple(d for d in range(1, length + 1)
                                          if _runs_on(c, d, (first_weekday + d - 1) % 7))
            start = date(year, month, 1).toordinal() - 1
            for d in month_days[shape]:
                ordinal = start + d
                if previous is not None and ordinal - previous < best:
                    best = ordinal - previous
                    if best == 1:
                        return 1
                previous = ordinal
    return best


def _naive_gap(c: Cron) -> int:
    """The shortest gap, in seconds, between runs on a clock that never changes."""
    times = sorted(h * 60 + m for h in c.hours for m in c.minutes)
    within = min((b - a for a, b in zip(times, times[1:], strict=False)), default=None)
    across = _fewest_days_apart(c) * 1440 - times[-1] + times[0]
    return 60 * (across if within is None else min(within, across))


def _clock_changes(z: ZoneInfo, start: datetime) -> list[tuple[datetime, int]]:
    """The instants in the coming year when ``z``'s offset changes, each with the size of the change."""
    changes, step = [], timedelta(hours=6)
    t, offset = start, start.astimezone(z).utcoffset()
    while t < start + DST_HORIZON:
        nxt = t + step
        new = nxt.astimezone(z).utcoffset()
        if new != offset and new is not None and offset is not None:
            lo, hi = t, nxt
            while hi - lo > SECOND:
                mid = _halfway(lo, hi)
                lo, hi = (lo, mid) if mid.astimezone(z).utcoffset() == new else (mid, hi)
            changes.append((hi, int(abs((new - offset).total_seconds()))))
        t, offset = nxt, new
    return changes


def min_interval(rule: Rule, start: datetime | None = None) -> int:
    """The shortest time, in seconds, between two consecutive runs.

    ``every``: its length. ``cron``: the shortest gap on an unchanging clock (exact over the whole
    calendar cycle), or shorter where a clock change of the coming year (from ``start``, default now)
    brings two runs closer: 01:30 and 02:30 in New York are 30 minutes apart on the spring-forward
    Sunday. Runs near each change are computed exactly; a pair reaching outside that window is
    longer than the unchanging gap, so it cannot be the shortest."""
    if isinstance(rule, Every):
        return rule.seconds
    gap = _naive_gap(rule)
    if gap == 60:  # runs fall on whole minutes, so nothing is closer
        return gap
    best = gap
    for change, size in _clock_changes(rule.zone, _utc(start or datetime.now(UTC))):
        reach = timedelta(seconds=gap + 3 * size + 120)
        previous = None
        for t in runs(rule, change - reach, change + reach, cap=10_000):
            if previous is not None:
                best = min(best, int((t - previous).total_seconds()))
            previous = t
    return best

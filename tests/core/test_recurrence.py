"""When a schedule runs: ``every`` and five-field cron, across daylight-saving changes, and every bad input.

The properties check :func:`next_after` against an oracle that knows nothing of how it searches: it walks
UTC minute by minute, converting each to local time (which is never ambiguous in that direction), and
says whether the operator's rule meant a run at that instant.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from brainstem.core.errors import ConfigError
from brainstem.core.recurrence import (
    Cron,
    Every,
    latest_at_or_before,
    min_interval,
    next_after,
    parse,
    parse_cron,
    parse_every,
    runs,
    zone,
)

UTC = timezone.utc
MINUTE = timedelta(minutes=1)
NY, LONDON = "America/New_York", "Europe/London"


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def z(text: str) -> str:
    return text.replace("+00:00", "Z")


def upcoming(rule, after: str, n: int) -> list[str]:
    out, t = [], at(after)
    for _ in range(n):
        t = next_after(rule, t)
        out.append(z(t.isoformat()))
    return out


# --- parsing --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, minutes, hours, days, months, weekdays", [
    ("* * * * *", range(60), range(24), range(1, 32), range(1, 13), range(7)),
    ("0,15,45 9-17 1 1-3 1-5", [0, 15, 45], range(9, 18), [1], [1, 2, 3], range(5)),
    ("*/20 */6 */10 */4 */2", [0, 20, 40], [0, 6, 12, 18], [1, 11, 21, 31], [1, 5, 9], [6, 1, 3, 5]),
    ("5/15 0-12/4 2-9/3 2/5 1/3", [5, 20, 35, 50], [0, 4, 8, 12], [2, 5, 8], [2, 7, 12], [0, 3, 6]),
    ("0 0 * JAN,jun-Aug mon-FRI", [0], [0], range(1, 32), [1, 6, 7, 8], range(5)),
    ("0 0 * * 0", [0], [0], range(1, 32), range(1, 13), [6]),  # 0 is Sunday
    ("0 0 * * 7", [0], [0], range(1, 32), range(1, 13), [6]),  # and so is 7
    ("0 0 * * 5-7", [0], [0], range(1, 32), range(1, 13), [4, 5, 6]),
    ("0 0 * * SUN,SAT", [0], [0], range(1, 32), range(1, 13), [5, 6]),
    ("07 08 09 010 1", [7], [8], [9], [10], [0]),  # leading zeros
    ("  1   2  3 4   5  ", [1], [2], [3], [4], [4]),  # any blanks between fields
])
def test_cron_fields_expand_to_the_values_they_name(text, minutes, hours, days, months, weekdays):
    c = parse_cron(text)
    assert c.minutes == tuple(minutes) and c.hours == tuple(hours) and c.days == tuple(days)
    assert c.months == tuple(months) and c.weekdays == frozenset(weekdays)  # Python's numbering: 0 is Monday


@pytest.mark.parametrize("macro, text", [
    ("@yearly", "0 0 1 1 *"), ("@annually", "0 0 1 1 *"), ("@monthly", "0 0 1 * *"), ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"), ("@midnight", "0 0 * * *"), ("@hourly", "0 * * * *"), (" @DAILY ", "0 0 * * *"),
])
def test_the_usual_macros_are_their_five_fields(macro, text):
    a, b = parse_cron(macro), parse_cron(text)
    assert (a.minutes, a.hours, a.days, a.months, a.weekdays, a.either_day) == \
        (b.minutes, b.hours, b.days, b.months, b.weekdays, b.either_day)


def test_both_day_fields_restricted_means_either_day_runs():
    """Vixie cron's rule: 1st of the month OR a Monday; June 2026 starts on a Monday."""
    assert upcoming(parse_cron("0 0 1,15 * MON"), "2026-06-01T00:00:00Z", 5) == [
        "2026-06-08T00:00:00Z", "2026-06-15T00:00:00Z", "2026-06-22T00:00:00Z", "2026-06-29T00:00:00Z",
        "2026-07-01T00:00:00Z"]


def test_a_day_field_starting_with_a_star_does_not_restrict_so_both_must_hold():
    """``*/2`` starts with ``*``: odd days that are Mondays, not odd days or Mondays (as Vixie cron does)."""
    assert upcoming(parse_cron("0 0 */2 * MON"), "2026-06-01T00:00:00Z", 3) == [
        "2026-06-15T00:00:00Z", "2026-06-29T00:00:00Z", "2026-07-13T00:00:00Z"]
    assert upcoming(parse_cron("0 12 13 * *"), "2026-01-01T00:00:00Z", 2) == [
        "2026-01-13T12:00:00Z", "2026-02-13T12:00:00Z"]
    assert upcoming(parse_cron("0 12 * * FRI"), "2026-02-01T00:00:00Z", 2) == [
        "2026-02-06T12:00:00Z", "2026-02-13T12:00:00Z"]


def test_rare_days_are_found_across_years():
    assert upcoming(parse_cron("0 0 29 2 *"), "2026-01-01T00:00:00Z", 3) == [
        "2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z", "2036-02-29T00:00:00Z"]
    # February 29th that is a Monday (AND, because the weekday field is */1): 2044, then 2072
    assert upcoming(parse_cron("0 0 29 2 */1"), "2026-01-01T00:00:00Z", 1) == ["2028-02-29T00:00:00Z"]
    assert upcoming(parse_cron("0 0 29 2 1-1/1"), "2026-01-01T00:00:00Z", 1) != []  # OR: a Monday of February
    c = Cron("0 0 29 2 MON (and)", "UTC", (0,), (0,), (29,), (2,), frozenset({0}), False, ZoneInfo("UTC"))
    assert upcoming(c, "2026-01-01T00:00:00Z", 2) == ["2044-02-29T00:00:00Z", "2072-02-29T00:00:00Z"]


def bad(fn, *args) -> str:
    with pytest.raises(ConfigError) as exc:
        fn(*args)
    message = str(exc.value)
    assert "\n" not in message and len(message) < 300
    return message


@pytest.mark.parametrize("text, says", [
    ("* * * *", "has 4 fields; give five"),
    ("* * * * * *", "has 6 fields"),
    ("", "has 0 fields"),
    ("@reboot", "has 1 fields"),
    ("60 * * * *", "minute '60' is out of range 0-59"),
    ("* 24 * * *", "hour '24' is out of range 0-23"),
    ("* * 0 * *", "day-of-month '0' is out of range 1-31"),
    ("* * 32 * *", "day-of-month '32' is out of range 1-31"),
    ("* * * 13 *", "month '13' is out of range 1-12"),
    ("* * * 0 *", "month '0' is out of range"),
    ("* * * * 8", "day-of-week '8' is out of range 0-7"),
    ("*/0 * * * *", "has a step of 0"),
    ("5-2 * * * *", "runs backwards"),
    ("1,,2 * * * *", "is not *, N, N-M"),
    ("1, * * * *", "is not *, N, N-M"),
    ("-1 * * * *", "is not *, N, N-M"),
    ("*-5 * * * *", "is not *, N, N-M"),
    ("1-2-3 * * * *", "is not *, N, N-M"),
    ("*/x * * * *", "is not *, N, N-M"),
    ("*/-1 * * * *", "is not *, N, N-M"),
    ("? * * * *", "is not *, N, N-M"),
    ("L * * * *", "minute 'L' is not a number"),
    ("0 0 * FOO *", "month 'FOO' is not a number or a name (JAN, FEB"),
    ("0 0 * * MONDAY", "day-of-week 'MONDAY' is not a number or a name (SUN, MON"),
    ("0 0 * JAN *x", "is not *, N, N-M"),
    ("0 0 * * MON-JAN", "day-of-week 'JAN' is not a number or a name"),
    ("\u0661 * * * *", "is not *, N, N-M"),  # an Arabic-Indic digit is not a cron number
    ("0 0 30 2 *", "never runs"),
    ("0 0 31 4,6,9,11 *", "never runs"),
    ("0 0 30,31 FEB */1", "never runs"),
])
def test_a_bad_cron_is_one_line_naming_what_is_wrong(text, says):
    message = bad(parse_cron, text)
    assert says in message and "cron" in message


def test_a_cron_that_runs_only_in_leap_years_or_by_weekday_is_not_refused():
    parse_cron("0 0 29 2 *")
    parse_cron("0 0 30 2 MON")  # both restricted: Mondays of February


@pytest.mark.parametrize("value", [None, 5, ["* * * * *"], b"* * * * *"])
def test_a_cron_that_is_not_text_is_refused(value):
    assert "is not text" in bad(parse_cron, value)


@pytest.mark.parametrize("text, seconds", [
    ("30m", 1800), ("1d", 86400), ("12h", 43200), ("2w", 1209600), ("90", 90), ("1.5m", 90), (" 5s ", 5),
    ("366d", 366 * 86400), ("1s", 1),
])
def test_every_is_a_whole_number_of_seconds(text, seconds):
    assert parse_every(text) == Every(text.strip(), seconds)


@pytest.mark.parametrize("text, says", [
    ("soon", "is not a duration"), ("", "is not a duration"), ("-5m", "is not a duration"), ("5 parsecs", "not a"),
    ("0s", "out of range"), ("0", "out of range"), ("367d", "out of range"), ("100000w", "out of range"),
    ("1.5s", "not a whole number of seconds"), ("500ms", "not a whole number"), ("1e3s", "is not a duration"),
    (30, "is not a duration"), (None, "is not a duration"),
])
def test_a_bad_every_is_one_line(text, says):
    message = bad(parse_every, text)
    assert says in message and message.startswith("every ")


@pytest.mark.parametrize("name", ["Mars/Base", "", "utc ", "../../etc/passwd", "/etc/localtime", "Europe/",
                                  "America", "Europe/London\n", "zone.tab", 5, None, "Europe\\London"])
def test_an_unknown_time_zone_is_one_line(name):
    assert "is not a known time zone: use an IANA name" in bad(zone, name)
    assert "is not a known time zone" in bad(parse_cron, "0 9 * * *", name)


def test_a_rule_is_exactly_one_of_every_and_cron_and_tz_goes_with_cron():
    assert "exactly one of every" in bad(parse)
    assert "exactly one of every" in bad(parse, "30m", "* * * * *")
    assert isinstance(parse(every="30m"), Every) and isinstance(parse(every="30m", tz="UTC"), Every)
    assert "goes with cron only" in bad(parse, "1d", None, "Europe/London")
    c = parse(cron="0 9 * * *", tz=NY)
    assert isinstance(c, Cron) and c.tz == NY and parse(cron="0 9 * * *").tz == "UTC"


# --- every ----------------------------------------------------------------------------------------------


def test_every_is_elapsed_time_not_the_wall_clock():
    """A day of ``every`` is 24 hours across the spring-forward night; a day of cron is 23 of them."""
    every, cron = parse_every("1d"), parse_cron("0 12 * * *", NY)
    assert next_after(every, at("2026-03-07T17:00:00Z")) == at("2026-03-08T17:00:00Z")
    assert next_after(cron, at("2026-03-07T17:00:00Z")) == at("2026-03-08T16:00:00Z")


def test_every_keeps_to_the_grid_of_its_anchor():
    every, anchor = parse_every("30m"), at("2026-05-04T10:00:00Z")
    assert next_after(every, at("2026-05-04T10:00:45Z"), anchor) == at("2026-05-04T10:30:00Z")
    assert next_after(every, at("2026-05-04T10:30:00Z"), anchor) == at("2026-05-04T11:00:00Z")
    assert next_after(every, at("2026-05-04T09:10:00Z"), anchor) == at("2026-05-04T09:30:00Z")  # before it too
    assert next_after(every, at("2026-05-04T10:00:45Z")) == at("2026-05-04T10:30:45Z")  # no anchor: from after


@hyp_settings(max_examples=300, deadline=None)
@given(seconds=st.integers(1, 366 * 86400), anchor=st.datetimes(datetime(2000, 1, 1), datetime(2060, 1, 1)),
       after=st.datetimes(datetime(2000, 1, 1), datetime(2060, 1, 1)))
def test_every_runs_on_its_grid_the_first_point_strictly_after(seconds, anchor, after):
    anchor, after = anchor.replace(tzinfo=UTC, microsecond=0), after.replace(tzinfo=UTC)
    step = timedelta(seconds=seconds)
    t = next_after(Every("x", seconds), after, anchor)
    assert after < t <= after + step
    assert (t - anchor) % step == timedelta(0)
    assert next_after(Every("x", seconds), after) == after + step


# --- daylight saving: the named cases -------------------------------------------------------------------

# 2026 in New York: 02:00 EST -> 03:00 EDT on 8 March (07:00Z); 02:00 EDT -> 01:00 EST on 1 November (06:00Z).
# 2026 in London: 01:00 GMT -> 02:00 BST on 29 March (01:00Z); 02:00 BST -> 01:00 GMT on 25 October (01:00Z).


@pytest.mark.parametrize("tz, cron, after, expected", [
    # a time the clock skips runs at the first instant after the gap (03:00 EDT), once
    (NY, "30 2 * * *", "2026-03-07T12:00:00Z", ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]),
    (NY, "0 2 * * *", "2026-03-07T12:00:00Z", ["2026-03-08T07:00:00Z", "2026-03-09T06:00:00Z"]),
    # hourly: 01:00 EST, then the skipped 02:00 and the real 03:00 are one run at 03:00 EDT
    (NY, "0 * * * *", "2026-03-08T05:30:00Z",
     ["2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z"]),
    (NY, "*/15 * * * *", "2026-03-08T06:40:00Z",
     ["2026-03-08T06:45:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:15:00Z"]),
    # a time that happens twice runs once, at its first occurrence (01:30 EDT, not 01:30 EST)
    (NY, "30 1 * * *", "2026-10-31T12:00:00Z", ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]),
    (NY, "0 1 * * *", "2026-11-01T04:59:00Z", ["2026-11-01T05:00:00Z", "2026-11-02T06:00:00Z"]),
    # the repeated hour has no runs: 01:30 EDT, then 02:00 EST
    (NY, "*/30 * * * *", "2026-11-01T04:45:00Z",
     ["2026-11-01T05:00:00Z", "2026-11-01T05:30:00Z", "2026-11-01T07:00:00Z", "2026-11-01T07:30:00Z"]),
    (LONDON, "30 1 * * *", "2026-03-28T12:00:00Z", ["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]),
    (LONDON, "0 1 * * *", "2026-03-28T12:00:00Z", ["2026-03-29T01:00:00Z", "2026-03-30T00:00:00Z"]),
    (LONDON, "30 1 * * *", "2026-10-24T12:00:00Z", ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]),
    (LONDON, "*/20 1 * * *", "2026-10-24T23:59:00Z",
     ["2026-10-25T00:00:00Z", "2026-10-25T00:20:00Z", "2026-10-25T00:40:00Z", "2026-10-26T01:00:00Z"]),
    (LONDON, "0 9 * * MON", "2026-03-27T00:00:00Z", ["2026-03-30T08:00:00Z", "2026-04-06T08:00:00Z"]),
    (LONDON, "0 9 * * MON", "2026-10-20T00:00:00Z", ["2026-10-26T09:00:00Z", "2026-11-02T09:00:00Z"]),
])
def test_daylight_saving_runs_each_local_time_once_as_meant(tz, cron, after, expected):
    assert upcoming(parse_cron(cron, tz), after, len(expected)) == expected


@pytest.mark.parametrize("tz, cron, after, expected", [
    # ``after`` in the second pass of the repeated hour: its times already ran in the first pass
    (NY, "30 1 * * *", "2026-11-01T06:15:00Z", "2026-11-02T06:30:00Z"),
    (NY, "*/15 * * * *", "2026-11-01T06:15:00Z", "2026-11-01T07:00:00Z"),
    (LONDON, "*/15 * * * *", "2026-10-25T01:15:00Z", "2026-10-25T02:00:00Z"),
    # ``after`` in the first pass: the rest of the first pass still runs
    (LONDON, "*/15 * * * *", "2026-10-25T00:15:00Z", "2026-10-25T00:30:00Z"),
])
def test_a_search_from_inside_the_repeated_hour_never_runs_a_time_twice(tz, cron, after, expected):
    assert next_after(parse_cron(cron, tz), at(after)) == at(expected)


def test_a_whole_skipped_day_runs_once_when_the_clock_comes_back():
    """Samoa skipped 30 December 2011 entirely: that day's runs are one run at the first instant after it."""
    c = parse_cron("0 12 * * *", "Pacific/Apia")
    assert upcoming(c, "2011-12-28T23:00:00Z", 3) == [
        "2011-12-29T22:00:00Z", "2011-12-30T10:00:00Z", "2011-12-30T22:00:00Z"]


@pytest.mark.parametrize("tz, cron, seconds", [
    ("UTC", "* * * * *", 60),
    ("UTC", "*/5 * * * *", 300),
    ("UTC", "0 9,17 * * *", 8 * 3600),
    ("UTC", "0 9 * * MON-FRI", 86400),
    ("UTC", "0 9 * * MON", 7 * 86400),
    ("UTC", "0 0 1 * *", 28 * 86400),
    ("UTC", "0 0 1 1,7 *", 181 * 86400),
    ("UTC", "0 0 29 2 *", 1461 * 86400),  # four years; the eight across 2100 are longer
    ("UTC", "0 0 13 * FRI", 86400),  # either: Thursday the 13th, then Friday the 14th
    ("UTC", "0 0 */31 * FRI", 28 * 86400),  # both: Friday the 1st in February and March of a common year
    ("UTC", "59 23 * * *", 86400),
    ("UTC", "0,59 0,23 * * *", 60),
    (NY, "*/15 * * * *", 900),  # the clock changes run nothing closer than 15 minutes
    (NY, "30 1,2 * * *", 1800),  # 01:30 EST and the skipped 02:30 (run at 03:00 EDT): half an hour apart
    (NY, "0 1,2 * * *", 3600),
    (LONDON, "30 0,1 * * *", 1800),
    (LONDON, "0 9 * * MON", 7 * 86400 - 3600),  # the week the clocks go forward is an hour short
    (LONDON, "0 0 1 * *", 28 * 86400),
    ("Australia/Lord_Howe", "15 1,2 * * *", 2700),  # a half-hour change: 01:15 and the skipped 02:15 (02:30)
])
def test_min_interval_is_the_shortest_gap_between_runs(tz, cron, seconds):
    assert min_interval(parse_cron(cron, tz), at("2026-01-01T00:00:00Z")) == seconds


def test_min_interval_of_every_is_its_length():
    assert min_interval(parse_every("30m")) == 1800


def test_min_interval_is_quick_for_any_rule():
    start = at("2026-01-01T00:00:00Z")
    began = time.perf_counter()
    for text in ("*/5 * * * *", "0 0 1 * *", "0 0 29 2 *", "0 0 */31 2 FRI", "*/2 * * * *", "0 9 * * MON"):
        min_interval(parse_cron(text, NY), start)
    assert time.perf_counter() - began < 2.0


# --- the properties -------------------------------------------------------------------------------------

ZONES = ["UTC", NY, LONDON, "Australia/Lord_Howe", "Asia/Kolkata", "Pacific/Chatham", "America/Santiago",
         "Europe/Dublin", "America/St_Johns", "Africa/Casablanca", "Asia/Tehran"]
FIELDS = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]


def transitions(tz: str) -> list[datetime]:
    """When ``tz``'s offset changes in 2025-2028, found by walking hours (independent of the module)."""
    z_, out = ZoneInfo(tz), []
    t = at("2025-01-01T00:00:00Z")
    while t < at("2028-12-31T00:00:00Z"):
        if (t + timedelta(hours=1)).astimezone(z_).utcoffset() != t.astimezone(z_).utcoffset():
            out.append(t + timedelta(hours=1))
        t += timedelta(hours=1)
    return out


TRANSITIONS = {tz: transitions(tz) for tz in ZONES}


@st.composite
def cron_field(draw, lo: int, hi: int) -> tuple[str, set[int]]:
    if draw(st.booleans()):
        step = draw(st.sampled_from([1, 1, 2, 3, 5, 7, 15]))
        return (f"*/{step}" if step > 1 or draw(st.booleans()) else "*"), set(range(lo, hi + 1, step))
    items, values = [], set()
    for _ in range(draw(st.integers(1, 3))):
        a, b = sorted(draw(st.tuples(st.integers(lo, hi), st.integers(lo, hi))))
        kind = draw(st.sampled_from(["one", "range", "step"]))
        if kind == "one":
            items.append(str(a))
            values.add(a)
        elif kind == "range":
            items.append(f"{a}-{b}")
            values.update(range(a, b + 1))
        else:
            step = draw(st.integers(1, max(1, hi - lo)))
            items.append(f"{a}-{b}/{step}")
            values.update(range(a, b + 1, step))
    return ",".join(items), values


@st.composite
def rules(draw):
    fields = [draw(cron_field(lo, hi)) for lo, hi in FIELDS]
    tz = draw(st.sampled_from(ZONES))
    change = draw(st.sampled_from(TRANSITIONS[tz])) if TRANSITIONS[tz] and draw(st.booleans()) else None
    if change is not None:  # around a clock change: every day, and every hour or the hours around the change
        fields[2:] = [("*", set(range(lo, hi + 1))) for lo, hi in FIELDS[2:]]
        before = (change - MINUTE).astimezone(ZoneInfo(tz)).hour
        hours = sorted(set(draw(st.lists(st.sampled_from([(before + d) % 24 for d in (-1, 0, 1, 2)]),
                                         min_size=1, max_size=3))))
        fields[1] = draw(st.sampled_from([("*", set(range(24))), (",".join(map(str, hours)), set(hours))]))
    text = " ".join(f for f, _ in fields)
    minutes, hours, days, months, dows = (v for _, v in fields)
    weekdays = {(d + 6) % 7 for d in dows}
    either = not fields[2][0].startswith("*") and not fields[4][0].startswith("*")

    def matches(t: datetime) -> bool:
        day = (t.day in days or t.weekday() in weekdays) if either else (t.day in days and t.weekday() in weekdays)
        return t.minute in minutes and t.hour in hours and t.month in months and day

    longest = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
    possible = either or any(d <= longest[m - 1] for m in months for d in days)
    # `after`: anywhere in 2025-2028, or within hours of one of the zone's clock changes
    if change is not None:
        after = change + timedelta(seconds=draw(st.integers(-4 * 3600, 2 * 3600)))
    else:
        after = draw(st.datetimes(datetime(2025, 1, 1), datetime(2028, 6, 1))).replace(tzinfo=UTC)
    return text, tz, matches, possible, after


def is_run(matches, z_: ZoneInfo, m: datetime) -> bool:
    """Whether the rule means a run at the UTC minute ``m``: its local time matches (the first time the
    clock shows it), or the clock just jumped over a local time that matches."""
    local = m.astimezone(z_)
    if local.fold == 1:
        return False  # the second pass of a repeated hour: each of its times already ran in the first
    before = (m - MINUTE).astimezone(z_).replace(tzinfo=None)
    now_ = local.replace(tzinfo=None, fold=0)
    skipped = []
    t = before + MINUTE
    while t < now_:  # the clock jumped: the local minutes it skipped run here
        skipped.append(t)
        t += MINUTE
    return matches(now_) or any(matches(s) for s in skipped)


WINDOW = timedelta(days=2)


@hyp_settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules())
def test_next_after_is_the_first_run_strictly_after(rule):
    text, tz, matches, possible, after = rule
    if not possible:
        with pytest.raises(ConfigError, match="never runs"):
            parse_cron(text, tz)
        return
    c, z_ = parse_cron(text, tz), ZoneInfo(tz)
    t = next_after(c, after)
    assert t > after and t.tzinfo == UTC and t.second == 0 and t.microsecond == 0
    assert is_run(matches, z_, t), f"{t} is not a run of {text!r} in {tz}"
    m = after.replace(second=0, microsecond=0) + MINUTE
    while m < min(t, after + WINDOW):  # nothing the rule means lies between
        assert not is_run(matches, z_, m), f"{text!r} in {tz} runs at {m}, before {t}"
        m += MINUTE


@hyp_settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules())
def test_no_two_runs_are_closer_than_min_interval(rule):
    text, tz, _matches, possible, after = rule
    if not possible:
        return
    c = parse_cron(text, tz)
    shortest = min_interval(c, after - timedelta(days=3))
    seen = runs(c, after - WINDOW, after + WINDOW, cap=3000)
    assert all(b - a >= timedelta(seconds=shortest) for a, b in zip(seen, seen[1:], strict=False))
    assert shortest >= 60


REGULAR = [NY, LONDON, "Australia/Lord_Howe", "America/Santiago", "Pacific/Chatham", "Europe/Dublin",
           "America/St_Johns"]  # one clock change forward and one back, the same every year


@hyp_settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(REGULAR), st.integers(0, 7), st.lists(st.integers(0, 59), min_size=1, max_size=3),
       st.lists(st.sampled_from([-1, 0, 1, 2]), min_size=1, max_size=3))
def test_min_interval_is_exact_around_a_clock_change(tz, which, minutes, hours):
    """A daily cron at the hours around a change: the runs of the days around it, the change's day among
    them, are never closer than min_interval, and after a change forward exactly that close."""
    change = TRANSITIONS[tz][which]
    z_ = ZoneInfo(tz)
    before = (change - MINUTE).astimezone(z_).hour
    at_hours = ",".join(str((before + h) % 24) for h in sorted(set(hours)))
    text = f"{','.join(map(str, sorted(set(minutes))))} {at_hours} * * *"
    c = parse_cron(text, tz)
    shortest = min_interval(c, change - timedelta(days=1))
    seen = runs(c, change - timedelta(days=3), change + timedelta(days=3))
    closest = min(int((b - a).total_seconds()) for a, b in zip(seen, seen[1:], strict=False))
    assert closest >= shortest
    if change.astimezone(z_).utcoffset() > (change - MINUTE).astimezone(z_).utcoffset():
        assert closest == shortest, f"{text!r} in {tz}"


@hyp_settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rules(), st.integers(60, 3 * 86400))
def test_latest_at_or_before_is_the_last_run_of_the_span(rule, span):
    text, tz, _matches, possible, after = rule
    if not possible:
        return
    c = parse_cron(text, tz)
    since, until = after - timedelta(seconds=span), after
    listed = [t for t in runs(c, since - timedelta(seconds=1), until, cap=10_000) if t >= since]
    assert latest_at_or_before(c, until, since) == (listed[-1] if listed else None)


@hyp_settings(max_examples=100, deadline=None)
@given(st.integers(1, 86400), st.datetimes(datetime(2020, 1, 1), datetime(2030, 1, 1)),
       st.integers(0, 10 * 86400), st.integers(0, 3 * 86400))
def test_latest_at_or_before_for_every(seconds, anchor, since_offset, span):
    rule, anchor = Every("x", seconds), anchor.replace(tzinfo=UTC)
    since = anchor + timedelta(seconds=since_offset)
    until = since + timedelta(seconds=span)
    listed = [t for t in runs(rule, since - timedelta(seconds=1), until, anchor, cap=1_000_000) if t >= since]
    assert latest_at_or_before(rule, until, since, anchor) == (listed[-1] if listed else None)


def test_next_after_is_quick():
    c, t = parse_cron("* * * * *"), at("2026-01-01T00:00:00Z")
    began = time.perf_counter()
    assert len(runs(c, t, t + timedelta(days=30), cap=2000)) == 2000
    sparse = [next_after(parse_cron("0 0 29 2 *", NY), t), next_after(parse_cron("0 0 */31 2 FRI"), t)]
    assert sparse == [at("2028-02-29T05:00:00Z"), at("2030-02-01T00:00:00Z")]  # the next 1 February on a Friday
    assert time.perf_counter() - began < 2.0


def test_a_naive_time_is_taken_as_utc():
    assert next_after(parse_cron("0 * * * *"), datetime(2026, 1, 1, 10, 30)) == at("2026-01-01T11:00:00Z")

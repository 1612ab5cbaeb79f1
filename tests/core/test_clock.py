"""The runtime's clock: the one form timestamps are written in, and the one parser of durations."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from brainstem.core.clock import iso, now_iso, now_utc, parse_duration, parse_iso
from brainstem.core.errors import ConfigError


def test_timestamps_are_utc_with_a_z_to_the_second_or_the_millisecond():
    t = datetime(2026, 3, 4, 5, 6, 7, 891_234, tzinfo=timezone(timedelta(hours=2)))
    assert iso(t) == "2026-03-04T03:06:07Z"
    assert iso(t, ms=True) == "2026-03-04T03:06:07.891Z"
    assert now_iso().endswith("Z") and len(now_iso()) == 20 and len(now_iso(ms=True)) == 24
    assert now_utc().tzinfo is timezone.utc


@pytest.mark.parametrize("text, expected", [
    ("2026-03-04T03:06:07Z", datetime(2026, 3, 4, 3, 6, 7, tzinfo=timezone.utc)),
    ("2026-03-04T03:06:07.891+00:00", datetime(2026, 3, 4, 3, 6, 7, 891_000, tzinfo=timezone.utc)),
    ("2026-03-04T03:06:07", datetime(2026, 3, 4, 3, 6, 7, tzinfo=timezone.utc)),  # naive: taken as UTC
    (" 2026-03-04T05:06:07+02:00 ", datetime(2026, 3, 4, 3, 6, 7, tzinfo=timezone.utc)),
])
def test_parse_iso_reads_what_iso_writes_and_what_people_type(text, expected):
    assert parse_iso(text) == expected


@pytest.mark.parametrize("junk", [None, 12, "", "yesterday", "2026-13-01T00:00:00Z", ["2026-01-01"]])
def test_parse_iso_answers_none_for_anything_else(junk):
    assert parse_iso(junk) is None


def test_a_timestamp_survives_the_round_trip():
    t = now_utc().replace(microsecond=123_000)
    assert parse_iso(iso(t, ms=True)) == t


@pytest.mark.parametrize("text, seconds", [
    ("30s", 30), ("5m", 300), ("12h", 43200), ("7d", 604800), ("2w", 1209600), ("90", 90), ("250ms", 0.25),
    (" 1.5h ", 5400),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "5 minutes", "-5m", "m", "1e3s", None])
def test_a_bad_duration_is_one_line_naming_the_option(bad):
    with pytest.raises(ConfigError, match=r"^--since .* is not a duration: use e\.g\. 30s, 5m, 12h, 7d, 2w$"):
        parse_duration(bad, "--since")

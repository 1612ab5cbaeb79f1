"""Each day's spend kept past midnight, its mean over the last seven days, and the runway it gives."""

from __future__ import annotations

from datetime import date

import pytest

from brainstem.core import keys
from brainstem.state import runway
from brainstem.state.budget import DailyLedger, add_daily, daily_spent, today

DAY = date(2026, 5, 10)


def put_days(store, days: dict[str, float], since: str | None = None) -> None:
    store.put(keys.SPEND_DAYS, {"since": since or min(days), "days": days})


def test_every_settle_notes_the_days_total_and_a_correction_lowers_it(store):
    ledger = DailyLedger(store, 5.0)
    ledger.settle(None, 0.25)
    ledger.settle(None, 0.5)
    assert store.get_json(keys.SPEND_DAYS)["days"] == {today(): 0.75} == {today(): daily_spent(store)}
    runway.note_day(store, today(), 0.25)  # an older total, noted late by another process: never lowers it
    assert store.get_json(keys.SPEND_DAYS)["days"][today()] == 0.75
    add_daily(store, -0.5)  # the operator's correction of an anomaly
    assert store.get_json(keys.SPEND_DAYS)["days"][today()] == 0.25


def test_only_the_newest_days_are_kept(store):
    for d in range(1, 12):
        runway.note_day(store, f"2026-05-{d:02d}", d)
    rec = store.get_json(keys.SPEND_DAYS)
    assert sorted(rec["days"]) == [f"2026-05-{d:02d}" for d in range(4, 12)] and rec["since"] == "2026-05-01"


def test_the_mean_is_over_the_last_seven_days_the_ledger_covers(store):
    put_days(store, {"2026-05-01": 100.0, "2026-05-04": 7.0, "2026-05-10": 7.0}, since="2026-04-20")
    assert runway.mean_daily_spend(store, today=DAY) == pytest.approx(2.0)  # 14 over 7 days; the 1st is outside
    put_days(store, {"2026-05-09": 1.0, "2026-05-10": 2.0})  # an agent two days old: not averaged over seven
    assert runway.mean_daily_spend(store, today=DAY) == pytest.approx(1.5)
    # Today's spend as the ceiling's ledger has it may be ahead of the note.
    assert runway.mean_daily_spend(store, today_spent=4.0, today=DAY) == pytest.approx(2.5)


def test_nothing_spent_or_nothing_known_is_no_mean(store):
    assert runway.mean_daily_spend(store, today=DAY) is None
    put_days(store, {"2026-05-09": 0.0})
    assert runway.mean_daily_spend(store, today=DAY) is None
    store.put(keys.SPEND_DAYS, {"since": "not a day", "days": {"2026-05-10": "a lot", "junk": 3, "2026-05-09": 1e999}})
    assert runway.mean_daily_spend(store, today=DAY) is None  # hand-edited junk is no spend, never a crash


@pytest.mark.parametrize("credit, mean, days", [(10.0, 2.0, 5.0), (None, 2.0, None), (10.0, None, None),
                                                (10.0, 0.0, None), (-3.0, 2.0, 0.0)])
def test_the_runway_is_the_balance_over_the_mean_and_unknown_when_either_is(credit, mean, days):
    assert runway.runway_days(credit, mean) == days


def test_the_stretch_makes_the_balance_last_the_days_asked():
    assert runway.stretch(2.0, 7.0) == pytest.approx(3.5)
    assert runway.stretch(7.0, 7.0) is None and runway.stretch(None, 7.0) is None and runway.stretch(1.0, None) is None
    assert runway.stretch(0.0, 7.0) == float("inf")


def test_the_credit_last_seen_is_the_newer_of_the_runtimes_read_and_the_ground_truths(store):
    assert runway.last_credit(store) == (None, None)
    store.put(keys.LAST_GROUND_TRUTH, {"at": "2026-05-10T08:00:00Z", "balances": {"openrouter": 4.0}})
    store.put(keys.LLM_CREDIT, {"at": "2026-05-10T09:00:00Z", "credit": 3.0})
    assert runway.last_credit(store) == (3.0, "2026-05-10T09:00:00Z")
    store.put(keys.LAST_GROUND_TRUTH, {"at": "2026-05-10T10:00:00Z", "balances": {"openrouter": None}})
    assert runway.last_credit(store) == (None, "2026-05-10T10:00:00Z")  # the newest says unknown: unknown
    put_days(store, {today(): 2.0})
    assert runway.outlook(store, 0.0, offered=False)["llm_credit"] is None  # a generic server offers none

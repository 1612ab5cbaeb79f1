"""A bill above what was reserved for it: charged as billed and recorded; a reported cost well above the call's
worst case is an anomaly for the operator too."""

from __future__ import annotations

from brainstem.core import events
from brainstem.llm.overrun import flag_overrun
from tests.helpers import Recorder

CALL = {"model": "m", "tier": "hardcoded", "purpose": "think"}


def test_a_bill_within_its_reservation_records_nothing():
    record, anomalies = Recorder(), []
    assert flag_overrun(record, anomalies.append, cost=0.01, worst=0.01, source="provider", **CALL) is False
    assert flag_overrun(record, anomalies.append, cost=0.01 + 1e-10, worst=0.01, source="provider", **CALL) is False
    assert record.entries == [] and anomalies == []


def test_a_bill_above_its_reservation_is_an_overrun_with_what_was_billed():
    record, anomalies = Recorder(), []
    assert flag_overrun(record, anomalies.append, cost=0.0101, worst=0.01, source="provider", **CALL) is True
    assert record.of(events.SPEND_OVERRUN) == [{**CALL, "cost": 0.0101, "worst_case": 0.01, "cost_source": "provider"}]
    assert record.of(events.COST_ANOMALY) == [] and anomalies == []  # within the anomaly factor


def test_a_reported_cost_far_above_the_worst_case_is_an_anomaly_too():
    record, anomalies = Recorder(), []
    assert flag_overrun(record, anomalies.append, cost=1.0, worst=0.01, source="provider", **CALL) is True
    anomaly = {"model": "m", "tier": "hardcoded", "reported": 1.0, "worst_case": 0.01, "purpose": "think"}
    assert anomalies == [anomaly]
    [recorded] = record.of(events.COST_ANOMALY)
    assert {k: recorded[k] for k in anomaly} == anomaly and "charged as reported" in recorded["note"]
    assert len(record.of(events.SPEND_OVERRUN)) == 1


def test_only_a_providers_report_is_an_anomaly():
    record = Recorder()
    assert flag_overrun(record, None, cost=1.0, worst=0.01, source="listed", **CALL) is True
    assert record.of(events.COST_ANOMALY) == [] and len(record.of(events.SPEND_OVERRUN)) == 1


def test_an_anomaly_without_a_listener_is_still_recorded():
    record = Recorder()
    flag_overrun(record, None, cost=1.0, worst=0.01, source="provider", **CALL)
    assert len(record.of(events.COST_ANOMALY)) == 1

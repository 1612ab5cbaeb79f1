"""How a session ended: the outcome names (part of the contract), whose move each is, and the backoffs they set."""

from __future__ import annotations

import pytest

from brainstem.core import outcomes


def test_the_names_are_the_released_ones():
    assert outcomes.ALL == ("clean", "budget_exhausted", "stopped", "no_plan", "error", "crashed", "host_lost",
                            "interrupted", "llm_auth_failed", "llm_no_credit", "llm_unavailable", "llm_bad_response",
                            "store_unavailable", "handled_by_reflex", "no_reflection")


def test_the_agents_failures_and_the_operators_faults_never_overlap():
    assert set(outcomes.FAILING) <= set(outcomes.ALL) and set(outcomes.OPERATOR_FAULTS) <= set(outcomes.ALL)
    assert not set(outcomes.FAILING) & set(outcomes.OPERATOR_FAULTS)
    assert outcomes.INTERRUPTED not in outcomes.FAILING + outcomes.OPERATOR_FAULTS
    assert set(outcomes.PROVIDER_FAULTS.values()) <= set(outcomes.OPERATOR_FAULTS)


def test_each_operator_fault_says_the_operators_move_in_one_line():
    for outcome in outcomes.OPERATOR_FAULTS:
        line = outcomes.operator_action(outcome)
        assert line and "\n" not in line
    for outcome in (*outcomes.FAILING, outcomes.CLEAN, outcomes.INTERRUPTED, None, "no-such-outcome"):
        assert outcomes.operator_action(outcome) is None


def _history(*names):
    return [{"id": f"{i}-abcdef", "outcome": n} for i, n in enumerate(names)]


def test_a_fault_streak_counts_the_operator_faults_at_the_end_of_the_history():
    assert outcomes.fault_streak([]) == 0
    assert outcomes.fault_streak(_history("llm_unavailable", "clean", "llm_no_credit", "store_unavailable")) == 2
    assert outcomes.fault_streak(_history("llm_auth_failed", "error")) == 0
    # A damaged entry is passed over, not counted and not a break.
    assert outcomes.fault_streak([*_history("llm_unavailable"), "garbage", *_history("llm_unavailable")]) == 2


@pytest.mark.parametrize("streak, want", [(0, 60.0), (1, 60.0), (2, 120.0), (3, 240.0), (5, 960.0), (6, 1800.0),
                                          (10 ** 6, 1800.0)])
def test_a_fault_backoff_doubles_from_a_minute_up_to_the_default_sleep(streak, want):
    assert outcomes.fault_backoff(streak, 1800) == want


def test_a_crash_streak_counts_crashes_and_lost_hosts():
    assert outcomes.crash_streak(_history("crashed", "host_lost", "crashed")) == 3
    assert outcomes.crash_streak(_history("crashed", "clean")) == 0
    assert outcomes.crash_streak(_history("host_lost", "llm_unavailable", "crashed")) == 1


@pytest.mark.parametrize("streak, want", [(-1, 0.0), (0, 0.0), (1, 60.0), (2, 120.0), (4, 480.0), (9, 900.0),
                                          (10 ** 6, 900.0)])
def test_after_no_crash_a_dead_session_is_woken_at_once_then_later_and_later(streak, want):
    assert outcomes.crash_backoff(streak, 900) == want

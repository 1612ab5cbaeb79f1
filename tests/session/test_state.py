"""What changes while a session runs: one SessionState, its review count bounded under the operator's cap."""

from __future__ import annotations

import threading

from brainstem.core import outcomes
from brainstem.session.state import SessionState


def test_a_new_session_is_clean_until_something_says_otherwise():
    state = SessionState()
    assert state.outcome == outcomes.CLEAN and state.kind == "session" and state.reason is None
    assert state.reviews_queued == 0 and not state.inbox_ids and not state.inbox_answered


def test_review_room_counts_each_run_it_lets_through_and_refuses_past_the_cap():
    state = SessionState()
    assert [state.review_room(2) for _ in range(2)] == [None, None]
    refusal = state.review_room(2)
    assert refusal is not None and "BRAINSTEM_REVIEW_MAX_PER_SESSION" in refusal and "2 runs" in refusal
    assert state.reviews_queued == 2  # a refused run is not counted


def test_runs_side_by_side_cannot_pass_the_cap_together():
    state, cap = SessionState(), 5
    start = threading.Barrier(40)
    answers: list[str | None] = []

    def ask() -> None:
        start.wait()
        answers.append(state.review_room(cap))

    threads = [threading.Thread(target=ask) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers.count(None) == cap and state.reviews_queued == cap


def test_two_sessions_share_nothing_that_changes():
    one, two = SessionState(), SessionState()
    one.reads.update(["a"])
    one.inbox_ids.append(1)
    one.context["x"] = 1
    assert not two.reads and not two.inbox_ids and not two.context

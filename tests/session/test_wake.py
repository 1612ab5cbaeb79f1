"""Shutdown and stale locks, in-process against the cassette provider."""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest

from brainstem.core import keys
from brainstem.core.settings import load_settings
from brainstem.llm.cassette import CassetteProvider
from brainstem.session.wake import wake
from brainstem.state.seed import example_soul_path, seed
from brainstem.store import karma

PLAN = json.dumps({"steps": [{"id": "t", "type": "think", "prompt": "hi"}]})
REFLECT = json.dumps({"session_summary": "s", "note_to_future_self": "n", "next_orient_context": {"load_keys": []}})


@pytest.fixture
def agent(store, tmp_path):
    seed(store, soul_file=example_soul_path())
    cassette = tmp_path / "c.json"
    cassette.write_text(json.dumps({"answers": [{"content": PLAN}, {"content": "ok"}, {"content": REFLECT}]}))
    return store, load_settings(kv="sqlite:///unused.db"), cassette


def test_a_shutdown_before_orient_is_interrupted_not_a_budget_or_plan_failure(agent):
    store, settings, cassette = agent
    cancel = threading.Event()
    cancel.set()
    provider = CassetteProvider(cassette)
    result = wake(settings, store, force=True, providers=[provider], cancel=cancel)
    assert result.outcome == "interrupted"
    assert provider.served == 0  # not even orient was asked
    entries = karma.read(store, result.session_id)
    assert entries[-1]["event"] == "session_end" and entries[-1]["outcome"] == "interrupted"
    assert store.get(keys.SESSION_CURRENT) is None  # not left looking like a crash


def test_a_lease_left_by_this_same_process_is_reclaimed(agent):
    # No wake in this process holds that token any more (one that could not release it).
    store, settings, cassette = agent
    assert store.acquire_lease(keys.WAKE_LEASE, f"{socket.gethostname()}:{os.getpid()}:earlier", 600_000)
    result = wake(settings, store, force=True, providers=[CassetteProvider(cassette)])
    assert result.outcome == "clean"


def test_a_live_lock_of_this_same_process_is_respected(agent):
    # The daemon runs agents in threads of one process: a wake still running here keeps its lock.
    from brainstem.core.errors import LeaseHeld
    from brainstem.store.lease import _LIVE_TOKENS

    store, settings, cassette = agent
    token = f"{socket.gethostname()}:{os.getpid()}:running"
    assert store.acquire_lease(keys.WAKE_LEASE, token, 600_000)
    _LIVE_TOKENS.add(token)
    try:
        with pytest.raises(LeaseHeld):
            wake(settings, store, force=True, providers=[CassetteProvider(cassette)])
    finally:
        _LIVE_TOKENS.discard(token)
    assert store.lease_owner(keys.WAKE_LEASE) == token


def test_a_live_lock_of_another_process_is_respected(agent):
    from brainstem.core.errors import LeaseHeld

    store, settings, cassette = agent
    assert store.acquire_lease(keys.WAKE_LEASE, "another-host:1:x", 600_000)
    with pytest.raises(LeaseHeld):
        wake(settings, store, force=True, providers=[CassetteProvider(cassette)])


def test_a_deep_reflection_cut_short_by_a_shutdown_is_interrupted_and_stays_due(agent, tmp_path):
    """Cancelled while deep reflection was being answered (here: unusably): the session ends interrupted,
    not no_reflection (a failure of the agent's), and deep reflection is still due."""
    store, settings, _ = agent
    store.put(keys.SESSION_COUNTER, "19")
    cassette = tmp_path / "deep.json"
    cassette.write_text(json.dumps({"answers": [{"content": "Half a thought, and no JSON"}]}))
    cancel = threading.Event()

    class CancelledWhileAnswering(CassetteProvider):
        def complete(self, request, timeout, deadline=None):
            cancel.set()  # the daemon stopping while the answer is on its way
            return super().complete(request, timeout, deadline)

    result = wake(settings, store, force=True, providers=[CancelledWhileAnswering(cassette)], cancel=cancel)
    assert result.outcome == "interrupted", result.message
    entries = karma.read(store, result.session_id)
    assert [e.get("kind") for e in entries if e["event"] == "reflect_parse_error"] == ["deep"]
    assert entries[-1]["outcome"] == "interrupted" and entries[-1]["kind"] == "deep_reflect"
    assert store.get(keys.DEEP_REFLECT_SCHEDULE) is None

"""The replay gate fails closed: a change to the orient prompt or config that the gate could not
replay (too little of the session's time left, an error while replaying) is refused and recorded,
never applied unjudged.

Reflection runs in-process here, against a real store and the loopback LLM double, with budgets
hypothesis draws; the attack (a plan asking for a 4.5 s session) runs as a whole wake in
tests/session/test_replay.py.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st_

from brainstem.core import keys
from brainstem.core.settings import load_settings
from brainstem.session import gate
from brainstem.session.build import SessionDeps, SessionSpec, build_session, hardcoded_provider
from brainstem.session.reflect import run_deep_reflect, run_reflect
from brainstem.session.state import SessionState
from brainstem.state.budget import Budget
from brainstem.state.config import effective_models, load_defaults
from brainstem.store import karma as karma_mod
from brainstem.store.karma import Karma, Redactor
from tests.wake_helpers import API_KEY, answers, events_of, reflection

BROKEN_ORIENT = "Answer in prose."  # a past session would get no plan under it


def _session(store, llm, sid: str, *, left: float, max_cost: float = 1.0, spent: float = 0.0,
             check_change=gate.check_change):
    """A session of the agent in ``store`` at its reflection, with ``left`` seconds of its time left
    (reflection's reserve included) and ``spent`` of ``max_cost``."""
    cfg = load_settings(kv="sqlite:///unused.db", openrouter_base_url=llm.base_url, openrouter_api_key=API_KEY,
                        llm_backoff=0.01, llm_max_attempts=1)
    duration = max(left, 0.0) + 30.0
    budget = Budget(max_cost=max_cost, max_steps=12, max_duration=duration, spent=spent,
                    t0=time.monotonic() - (duration - left))
    deps = SessionDeps(id=sid, number=2, settings=cfg, store=store, karma=Karma(store, sid, Redactor({})),
                       budget=budget, defaults=load_defaults(store, []), models=effective_models(store, []),
                       soul=store.get(keys.SOUL), check_change=check_change)
    return build_session(deps, SessionState(), SessionSpec(providers=[hardcoded_provider(cfg)]))


def _reflect_with_change(store, llm, session) -> list[dict]:
    llm.responder = answers("ok", reflect=reflection("change the prompt", kv_operations=[
        {"op": "put", "key": keys.PROMPT_ORIENT, "value": BROKEN_ORIENT},
        {"op": "put", "key": "notes:x", "value": "y"}]))
    run_reflect(session, {}, None)
    return karma_mod.read(store, session.deps.id)


def _assert_refused(store, entries: list[dict], before: str, why: str) -> None:
    assert store.get(keys.PROMPT_ORIENT) == before and store.get("notes:x") is None  # the batch, whole
    (rejected,) = events_of(entries, "kv_operations_rejected")
    assert rejected["reason"].startswith("replay_gate") and why in rejected["reason"], rejected
    assert rejected["source"] == "reflect" and rejected["keys"] == [keys.PROMPT_ORIENT]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(left=st_.floats(min_value=0.5, max_value=gate.GATE_MIN_SECONDS, exclude_max=True),
       max_cost=st_.floats(min_value=0.5, max_value=50.0), spent_part=st_.floats(min_value=0.0, max_value=0.7))
def test_with_too_little_time_left_to_replay_the_change_is_refused_whatever_the_money(
        sqlite_seeded, llm, left, max_cost, spent_part):
    store = sqlite_seeded
    before = store.get(keys.PROMPT_ORIENT)
    sid = f"2-t{time.monotonic_ns()}"
    entries = _reflect_with_change(store, llm, _session(store, llm, sid, left=left, max_cost=max_cost,
                                                        spent=max_cost * spent_part))
    assert events_of(entries, "reflect"), [e["event"] for e in entries]  # the reflection was read
    _assert_refused(store, entries, before, gate.OUT_OF_TIME)
    (report,) = events_of(entries, "replay_gate")
    assert report["replayed"] == [] and gate.OUT_OF_TIME in report["refused"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(left=st_.floats(min_value=-600.0, max_value=gate.GATE_MIN_SECONDS, exclude_max=True))
def test_the_gate_alone_refuses_below_its_minimum(sqlite_seeded, left):
    """Whatever is (not) in the history, the gate judges nothing with less than its minimum left."""
    report = gate.check_change(None, sqlite_seeded, {keys.PROMPT_ORIENT: BROKEN_ORIENT}, 5, time_left=lambda: left)
    assert report["refused"].startswith(gate.OUT_OF_TIME) and report["out_of_time"] is True


@pytest.mark.parametrize("error", [RuntimeError("boom"), OSError("store gone"), KeyError("id"),
                                   ValueError("bad recording")], ids=lambda e: type(e).__name__)
def test_an_error_while_replaying_refuses_the_change(sqlite_seeded, llm, error):
    store = sqlite_seeded
    before = store.get(keys.PROMPT_ORIENT)

    def failing(*args, **kwargs):
        raise error

    session = _session(store, llm, f"2-e{type(error).__name__}", left=300.0, check_change=failing)
    entries = _reflect_with_change(store, llm, session)
    _assert_refused(store, entries, before, "the replay failed")
    assert type(error).__name__ in events_of(entries, "kv_operations_rejected")[0]["reason"]


def test_with_time_left_and_nothing_to_replay_the_change_applies(sqlite_seeded, llm):
    """The gate judges by replaying past sessions; with none recorded there is nothing it could break."""
    store = sqlite_seeded
    entries = _reflect_with_change(store, llm, _session(store, llm, "2-fine", left=300.0))
    assert not events_of(entries, "kv_operations_rejected")
    assert store.get(keys.PROMPT_ORIENT) == BROKEN_ORIENT and store.get("notes:x") == "y"


@pytest.fixture
def sqlite_seeded(tmp_path):
    from tests.wake_helpers import seeded

    store = seeded(f"sqlite:///{tmp_path / 'store.db'}")
    yield store
    store.close()


@pytest.mark.parametrize("key", [keys.CONFIG_DEFAULTS, keys.PROMPT_ORIENT])
def test_a_deep_reflection_writing_a_gated_key_two_ways_applies_neither(sqlite_seeded, llm, key):
    """kv_operations put one value of a gated key and the reflection's own field proposes another: the gate
    could replay one while the store is left with the other, so neither is applied."""
    import json

    store = sqlite_seeded
    before = {k: store.get(k) for k in (keys.CONFIG_DEFAULTS, keys.PROMPT_ORIENT)}
    current = load_defaults(store, []).model_dump()
    bad = json.loads(json.dumps(current))
    bad["orient"]["max_output_tokens"] = 16
    deep = {"reflection": "tidy", "note_to_future_self": "",
            "kv_operations": [{"op": "put", "key": key, "value": bad if key == keys.CONFIG_DEFAULTS
                               else BROKEN_ORIENT}],
            "updated_defaults": {"reflect": {"effort": "low"}},
            "orient_prompt_proposals": [{"proposed_text": before[keys.PROMPT_ORIENT] + "\nBe brief."}]}
    llm.responder = lambda req: json.dumps(deep)
    session = _session(store, llm, f"2-d{time.monotonic_ns()}", left=120)
    run_deep_reflect(session)
    assert {k: store.get(k) for k in before} == before
    (rejected,) = events_of(karma_mod.read(store, session.deps.id), "kv_operations_rejected")
    assert rejected["reason"].startswith("replay_gate") and key in rejected["reason"]

"""Honest outcomes and one session at a time, through `brainstem wake` / `brainstem run` as subprocesses,
against a real store (SQLite and a real redis-server) and the loopback LLM double.

Operator and infrastructure faults (a bad key, no credit, an endpoint down or answering garbage, the
store going away) get outcomes of their own, never count towards auto-restore, retry on a short
growing backoff and say what the operator must do; SIGTERM/SIGINT to a wake is ``interrupted``;
closing a session is idempotent; a damaged history is not silently replaced; ``status`` shows a dead
session as dead.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from datetime import datetime, timedelta, timezone

import pytest

from brainstem.core import keys
from brainstem.core.clock import parse_iso
from brainstem.store import karma, open_store
from tests.helpers import dead_pid, run_cli, wait_for
from tests.wake_helpers import (
    events_of,
    finished,
    history,
    llm_calls,
    plan,
    reflection,
    run_wake,
    start_wake,
    think,
    wake_env,
)


def _seconds_from_now(text: str) -> float:
    return (parse_iso(text) - datetime.now(timezone.utc)).total_seconds()


def _status(env: dict) -> dict:
    r = run_cli("status", "--json", env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# --- A: operator and infrastructure faults -----------------------------------------------------

FAULTS = {
    "401": ({"status": 401, "message": "No auth credentials found"}, "llm_auth_failed", "BRAINSTEM_LLM_API_KEY"),
    "403": ({"status": 403, "message": "key disabled"}, "llm_auth_failed", "BRAINSTEM_LLM_API_KEY"),
    # LiteLLM's proxy, asked with a key it cannot check (no database behind it): a 400 about the key.
    "400_key": ({"status": 400, "body": {"error": {"message": "No connected db.", "type": "no_db_connection",
                                                   "param": None, "code": "400"}}},
                "llm_auth_failed", "BRAINSTEM_LLM_API_KEY"),
    "402": ({"status": 402, "message": "Insufficient credits"}, "llm_no_credit", "credit"),
    "html_body": ({"body": "<html>502 Bad Gateway</html>"}, "llm_bad_response", "BRAINSTEM_LLM_BASE_URL"),
    "empty_body": ({"body": ""}, "llm_bad_response", "BRAINSTEM_LLM_BASE_URL"),
    "no_choices": ({"body": {"id": "x", "object": "chat.completion"}}, "llm_bad_response", "BRAINSTEM_LLM_BASE_URL"),
    # A base URL that is not the API (a web server, a wrong path): its error pages are the operator's.
    "404": ({"status": 404, "body": "<html><h1>404 Not Found</h1></html>"}, "llm_bad_response",
            "BRAINSTEM_LLM_BASE_URL"),
    "405": ({"status": 405, "body": {"detail": "Method Not Allowed"}}, "llm_bad_response", "BRAINSTEM_LLM_BASE_URL"),
}


@pytest.mark.parametrize("case", list(FAULTS))
def test_a_provider_fault_is_its_own_outcome_with_the_operators_move(st, real_store_url, llm, case):
    reply, outcome, hint = FAULTS[case]
    env = wake_env(real_store_url, llm, BRAINSTEM_LLM_MAX_ATTEMPTS=1)
    llm.responder = lambda req: reply
    r = run_wake(env, "--force")
    sid, entries = finished(r, st, outcome)
    end = entries[-1]
    assert hint in end["operator_action"] and end["reason"]
    assert f"operator: {end['operator_action']}" in r.stdout
    (fault,) = events_of(entries, "llm_fault")
    assert fault["outcome"] == outcome and fault["during"] == "orient"
    if case.isdigit():
        assert fault["status"] == int(case) and case in end["reason"]
    assert not events_of(entries, "orient_parse_error")
    h = [x for x in history(st) if x["id"] == sid][0]
    assert h["operator_action"] == end["operator_action"]
    status = _status(env)
    assert status["operator_action"] == end["operator_action"] and status["failing_in_a_row"] == 0
    text = run_cli("status", env=env).stdout
    assert re.search(r"^OPERATOR +" + re.escape(end["operator_action"]) + "$", text, re.M), text


def test_an_api_that_rejects_the_request_itself_is_the_agents_fault(st, real_store_url, llm):
    """The API's own JSON error about the request (an unknown model): no operator fault, the agent's."""
    env = wake_env(real_store_url, llm, BRAINSTEM_LLM_MAX_ATTEMPTS=1)
    llm.responder = lambda req: {"status": 400, "message": "vendor/nope is not a valid model ID"}
    sid, entries = finished(run_wake(env, "--force"), st)
    assert entries[-1]["outcome"] in ("no_plan", "error") and not entries[-1].get("operator_action")
    assert not events_of(entries, "llm_fault")


def test_a_bad_key_never_triggers_auto_restore_and_retries_on_a_growing_backoff(st, real_store_url, llm):
    env = wake_env(real_store_url, llm, BRAINSTEM_LLM_MAX_ATTEMPTS=1)
    orient_before = st.get(keys.PROMPT_ORIENT)
    # A clean session first, so auto-restore would have something to put back.
    llm.queue(plan(think("hi")), "ok", reflection())
    finished(run_wake(env, "--force"), st, "clean")
    st.put(keys.PROMPT_ORIENT, orient_before + "\n(edited by the agent)")
    llm.responder = lambda req: {"status": 401, "message": "User not found."}
    waits = []
    for _ in range(4):
        sid, entries = finished(run_wake(env, "--force"), st, "llm_auth_failed")
        assert not events_of(entries, "auto_restore")
        waits.append(_seconds_from_now(st.get_json(keys.WAKE_CONFIG)["next_wake_after"]))
    # 1, 2, 4, 8 minutes: not a whole default sleep (6 h) later.
    for got, want in zip(waits, (60, 120, 240, 480), strict=True):
        assert want - 10 <= got <= want + 1, waits
    assert st.get(keys.PROMPT_ORIENT).endswith("(edited by the agent)")  # nothing reverted
    assert [h["outcome"] for h in history(st)] == ["clean"] + ["llm_auth_failed"] * 4
    # The key is fixed: the next session is clean and the schedule is the agent's again.
    llm.responder = None
    llm.queue(plan(think("back"), next_wake={"sleep_seconds": 7200}), "ok", reflection())
    finished(run_wake(env, "--force"), st, "clean")
    assert 7100 < _seconds_from_now(st.get_json(keys.WAKE_CONFIG)["next_wake_after"]) <= 7200
    assert _status(env)["operator_action"] is None


def test_an_outage_wake_is_due_again_within_minutes_without_force(st, real_store_url, llm):
    env = wake_env(real_store_url, llm, BRAINSTEM_LLM_MAX_ATTEMPTS=1)
    llm.responder = lambda req: {"status": 503, "message": "overloaded"}
    finished(run_wake(env), st, "llm_unavailable")
    wc = st.get_json(keys.WAKE_CONFIG)
    assert wc["retry_after_fault"] == "llm_unavailable"
    assert _seconds_from_now(wc["next_wake_after"]) <= 61


# --- C: misnamed outcomes --------------------------------------------------------------------------

def test_every_call_after_orient_failing_is_not_clean(st, real_store_url, llm):
    env = wake_env(real_store_url, llm, BRAINSTEM_LLM_MAX_ATTEMPTS=1)
    llm.queue(plan(think("one", id="a"), think("two", id="b")))
    llm.responder = lambda req: {"status": 503, "message": "down after orient"}
    sid, entries = finished(run_wake(env, "--force"), st, "llm_unavailable")
    assert [e["during"] for e in events_of(entries, "llm_fault")] == ["every call after orient"]
    # The reflection's failed call is a failed call, not a parse error.
    assert not events_of(entries, "reflect_parse_error")
    (failed,) = events_of(entries, "reflect_call_failed")
    assert failed["fault"] == "llm_unavailable" and failed["status"] == 503


def test_a_provider_failure_during_reflection_is_not_a_parse_error(st, real_store_url, llm):
    env = wake_env(real_store_url, llm, BRAINSTEM_LLM_MAX_ATTEMPTS=1)
    llm.queue(plan(think("one")), "fine", {"status": 502, "message": "bad gateway"})
    sid, entries = finished(run_wake(env, "--force"), st, "clean")  # the work was done
    assert not events_of(entries, "reflect_parse_error")
    (failed,) = events_of(entries, "reflect_call_failed")
    assert failed["status"] == 502 and "bad gateway" in failed["error"]
    assert st.get_json(keys.LAST_REFLECT)["call_error"]["session_id"] == sid


def test_a_crashed_session_costs_what_its_calls_cost(st, env, llm):
    llm.default_cost = 0.0025
    llm.queue(plan(think("one", id="a"), think("two", id="b")), "first answer", {"content": "slow", "delay": 60})
    p = start_wake(env, "--force")
    try:
        assert llm.wait_for_requests(3, timeout=30), p.stderr.read() if p.poll() is not None else ""
        time.sleep(0.3)
        p.kill()  # SIGKILL: nothing is recorded
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
    dead = karma.latest_session_id(st)
    spent = sum(c["cost"] for c in llm_calls(karma.read(st, dead)))
    assert spent > 0
    llm.queue(plan(think("again")), "ok", reflection())
    finished(run_wake(env, "--force"), st, "clean")
    (entry,) = [h for h in history(st) if h["id"] == dead]
    assert entry["outcome"] == "crashed" and abs(entry["cost"] - spent) < 1e-9
    assert karma.read(st, dead)[-1]["cost"] == entry["cost"]
    r = run_cli("sessions", env=env)
    line = [x for x in r.stdout.splitlines() if x.startswith(dead)][0]
    assert f"${spent:.4f}" in line and "$0.0000" not in line


# --- B: SIGTERM / SIGINT to a wake ---------------------------------------------------------------------

@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_wake_records_interrupted_and_releases_the_lease(st, env, llm, sig, code):
    llm.queue(plan(think("slow", id="s"), think("never")), {"content": "late", "delay": 60})
    p = start_wake(env, "--force")
    try:
        assert llm.wait_for_requests(2, timeout=30)
        time.sleep(0.3)
        t0 = time.monotonic()
        p.send_signal(sig)
        out, err = p.communicate(timeout=20)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == code, (p.returncode, out, err)
    assert took < 5, took  # not the 60 s the call would have taken
    assert "interrupted" in out and signal.Signals(sig).name in out and "Traceback" not in err
    sid = karma.latest_session_id(st)
    entries = karma.read(st, sid)
    assert entries[-1]["event"] == "session_end" and entries[-1]["outcome"] == "interrupted"
    assert signal.Signals(sig).name in entries[-1]["reason"]
    assert st.get(keys.SESSION_CURRENT) is None and st.lease_owner(keys.WAKE_LEASE) is None
    assert _status(env)["running"] is None
    assert st.get_json(keys.WAKE_CONFIG)["sleep_seconds"] == 60  # due again soon, not a whole sleep later
    # The next wake: no crash, and the interruption does not count towards auto-restore.
    llm.queue(plan(think("again")), "ok", reflection())
    sid2, entries2 = finished(run_wake(env, "--force"), st, "clean")
    assert not events_of(entries2, "crash_detected") and entries2[0]["crashed_session"] is None
    assert [h["outcome"] for h in history(st)] == ["interrupted", "clean"]


# --- D: one session at a time; closing a session is idempotent ------------------------------------------

def test_a_session_killed_after_its_history_entry_is_not_also_crashed(st, env, llm):
    llm.queue(plan(think("hi")), "ok", reflection())
    sid, _ = finished(run_wake(env, "--force"), st, "clean")
    # As if killed between writing the history and clearing the breadcrumb (its process gone).
    breadcrumb = karma.begin_session(st, sid)
    st.put(keys.SESSION_CURRENT, {**breadcrumb, "pid": dead_pid(), "proc": None})
    llm.queue(plan(think("next")), "ok", reflection())
    sid2, entries2 = finished(run_wake(env, "--force"), st, "clean")
    assert [(h["id"], h["outcome"]) for h in history(st)] == [(sid, "clean"), (sid2, "clean")]
    assert not events_of(entries2, "crash_detected")
    assert [e["outcome"] for e in events_of(karma.read(st, sid), "session_end")] == ["clean"]


def test_a_dead_session_already_closed_is_not_closed_twice(st, env, llm):
    st.put(keys.SESSION_CURRENT, {"id": "5-dead01", "started_at": "2026-01-01T00:00:00.000Z"})
    st.append(keys.karma("5-dead01"), json.dumps({"event": "session_start"}))
    # An earlier wake closed it as crashed and was killed before its own session began.
    st.put(keys.SESSION_HISTORY, [{"id": "5-dead01", "outcome": "crashed", "started_at": "2026-01-01T00:00:00Z"}])
    llm.queue(plan(think("hi")), "ok", reflection())
    finished(run_wake(env, "--force"), st, "clean")
    assert [h["outcome"] for h in history(st) if h["id"] == "5-dead01"] == ["crashed"]


def test_due_is_decided_again_under_the_lease(st, real_store_url, llm, monkeypatch):
    """A wake that read wake_config, then stalled while another wake ran a whole session, must not run a second."""
    from brainstem.core.settings import load_settings
    from brainstem.session.wake import wake

    env = wake_env(real_store_url, llm)
    llm.queue(plan(think("first"), next_wake={"sleep_seconds": 3600}), "ok", reflection())
    real_acquire = st.acquire_lease
    ran = []

    def stalled_acquire(name, owner, ttl_ms):
        if not ran:
            ran.append(run_wake(env))  # the other wake: due, runs its session to the end
        return real_acquire(name, owner, ttl_ms)
    monkeypatch.setattr(st, "acquire_lease", stalled_acquire)
    result = wake(load_settings(kv=real_store_url), st, providers=[])
    assert ran and ran[0].returncode == 0, ran[0].stderr
    assert result.status == "asleep", result
    assert len(history(st)) == 1 and st.lease_owner(keys.WAKE_LEASE) is None


# --- E: a damaged session_history -----------------------------------------------------------------------

def test_a_damaged_history_is_recorded_and_what_can_be_read_is_kept(st, real_store_url, llm):
    env = wake_env(real_store_url, llm, BRAINSTEM_KARMA_RETENTION_DAYS=1)
    old = (datetime.now(timezone.utc) - timedelta(days=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    st.append(keys.karma("1-old001"), json.dumps({"event": "session_start"}))
    good = {"id": "1-old001", "outcome": "clean", "started_at": old, "ended_at": old}
    raw = json.dumps([good, {"id": "2-cut002", "outcome": "clean"}])[:-12]  # a write cut off mid-way
    st.put(keys.SESSION_HISTORY, raw)
    llm.queue(plan(think("hi")), "ok", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    (rej,) = [e for e in events_of(entries, "config_rejected") if e.get("key") == "session_history"]
    assert "not valid JSON" in rej["reason"]
    saved = st.get_json(rej["kept_raw_at"])
    assert saved["raw"] == raw
    h = history(st)
    assert [x["id"] for x in h] == ["1-old001", sid]
    assert h[0]["karma_expired"] is True and st.log_length(keys.karma("1-old001")) == 0  # expiry still works
    assert _status(env)["session_history_rejected"]["raw_kept_at"] == rej["kept_raw_at"]


def test_a_history_with_some_bad_items_keeps_the_good_ones(st, env, llm):
    st.put(keys.SESSION_HISTORY, [1, {"id": "1-a", "outcome": "clean"}, "junk", {"id": "2-b", "outcome": "no_plan"}])
    llm.queue(plan(think("hi")), "ok", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    assert [x["id"] for x in history(st)] == ["1-a", "2-b", sid]
    assert [e for e in events_of(entries, "config_rejected") if e.get("key") == "session_history"]


def test_a_damaged_history_found_while_closing_a_crash_is_recorded_too(st, env, llm):
    st.put(keys.SESSION_HISTORY, '[{"id": "1-a", "outcome": "clean"}, {"id": "2-b", "outc')
    st.put(keys.SESSION_CURRENT, {"id": "3-dead03", "started_at": "2026-01-01T00:00:00.000Z", "pid": dead_pid(),
                                  "host": socket.gethostname()})
    llm.queue(plan(think("hi")), "ok", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    rejected = [e for e in events_of(entries, "config_rejected") if "session_history" in e.get("reason", "")]
    assert rejected and "not valid JSON" in rejected[0]["reason"]
    assert [(x["id"], x["outcome"]) for x in history(st)] == [("1-a", "clean"), ("3-dead03", "crashed"),
                                                              (sid, "clean")]


# --- F: status shows a dead session as dead ---------------------------------------------------------------

def test_status_shows_a_dead_session_as_died_not_a_raw_dict(st, env, llm):
    st.put(keys.SESSION_CURRENT, {"id": "9-gone99", "started_at": "2026-01-01T00:00:00.000Z", "pid": dead_pid(),
                                  "host": socket.gethostname()})
    text = run_cli("status", env=env).stdout
    assert "{'" not in text and "running now" not in text
    line = [x for x in text.splitlines() if x.startswith("died")][0]
    assert "9-gone99" in line and "2026-01-01T00:00:00.000Z" in line
    s = _status(env)["running"]
    assert s["state"] == "died" and s["id"] == "9-gone99"
    # Held by a live process on this host (another than the command's, which runs in this one): running.
    token = f"{socket.gethostname()}:{os.getppid()}:live"
    assert st.acquire_lease(keys.WAKE_LEASE, token, 60_000)
    try:
        text = run_cli("status", env=env).stdout
        assert re.search(r"^running now +session 9-gone99 since 2026-01-01T00:00:00\.000Z", text, re.M), text
        assert "{'" not in text
    finally:
        st.release_lease(keys.WAKE_LEASE, token)


def test_a_rejected_kv_batch_in_deep_reflection_is_not_reported_applied(st, env, llm):
    st.put(keys.DEEP_REFLECT_SCHEDULE, {"last_session": 0, "after_sessions": 1, "after_days": 30})
    soul = st.get(keys.SOUL)
    llm.queue(json.dumps({"reflection": "looked back", "note_to_future_self": "n", "updated_wisdom": "W2",
                          "kv_operations": [{"op": "put", "key": "notes:a", "value": "A"},
                                            {"op": "put", "key": "soul", "value": "a new me"}]}))
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    assert events_of(entries, "kv_operations_rejected")
    (done,) = [e for e in events_of(entries, "deep_reflect") if "applied" in e]
    assert done["applied"] == ["wisdom"]
    assert st.get("notes:a") is None and st.get(keys.SOUL) == soul


# --- the store going away mid-session -------------------------------------------------------------------

@pytest.mark.redis
def _lock_the_store_mid_answer(llm, port: int, env: dict):
    """Start a wake, and while its first think call's answer is on its way, make the store refuse
    everyone without a password (every client's connection cut). Returns (the wake, the admin)."""
    import redis

    p = start_wake(env, "--force")
    assert llm.wait_for_requests(2, timeout=30)
    admin = redis.Redis(port=port)
    admin.config_set("requirepass", "now-locked")
    admin.client_kill_filter(_type="normal", skipme=True)
    return p, admin


@pytest.mark.slow
def test_a_store_lost_mid_session_is_store_unavailable_not_error_or_crash(own_redis, llm):
    from tests.wake_helpers import seeded

    url = f"redis://127.0.0.1:{own_redis}/0"
    store = seeded(url)
    env = wake_env(url, llm)
    llm.queue(plan(think("slow", id="s"), think("two")), {"content": "answer", "delay": 2}, "ok", reflection())
    p, admin = _lock_the_store_mid_answer(llm, own_redis, env)
    try:
        time.sleep(3.5)  # locked for a few seconds, then back
        admin.config_set("requirepass", "")
        out, err = p.communicate(timeout=40)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, (out, err)
    assert "store_unavailable" in out and "operator: " in out and "BRAINSTEM_KV" in out
    store = seeded(url)
    sid = karma.latest_session_id(store)
    (entry,) = [h for h in history(store) if h["id"] == sid]
    assert entry["outcome"] == "store_unavailable" and "BRAINSTEM_KV" in entry["operator_action"]
    assert store.get(keys.SESSION_CURRENT) is None and store.lease_owner(keys.WAKE_LEASE) is None
    assert _seconds_from_now(store.get_json(keys.WAKE_CONFIG)["next_wake_after"]) <= 61
    assert karma.read(store, sid)[-1]["outcome"] == "store_unavailable"
    store.close()


@pytest.mark.slow
def test_a_redis_demoted_to_a_replica_for_a_moment_is_a_store_fault_never_a_crash(own_redis, llm):
    """READONLY for three seconds (a failover's demoted primary): the session waits it out and records
    store_unavailable; nothing is lost and nothing says crashed."""
    import redis

    from tests.wake_helpers import seeded

    url = f"redis://127.0.0.1:{own_redis}/0"
    store = seeded(url)
    env = wake_env(url, llm)
    llm.queue(plan(think("slow", id="s"), think("two")), {"content": "answer", "delay": 1.5}, "ok", reflection())
    p = start_wake(env, "--force")
    admin = redis.Redis(port=own_redis)
    try:
        assert llm.wait_for_requests(2, timeout=30)
        admin.execute_command("REPLICAOF", "127.0.0.1", "9")  # a primary that is not there: read-only
        time.sleep(3.0)
        admin.execute_command("REPLICAOF", "NO", "ONE")
        out, err = p.communicate(timeout=40)
    finally:
        if p.poll() is None:
            p.kill()
        admin.execute_command("REPLICAOF", "NO", "ONE")
    assert p.returncode == 0 and "Traceback" not in err, (out, err)
    sid = karma.latest_session_id(store)
    (entry,) = [h for h in history(store) if h["id"] == sid]
    assert entry["outcome"] == "store_unavailable"
    assert store.get(keys.SESSION_CURRENT) is None and store.lease_owner(keys.WAKE_LEASE) is None
    llm.reset()
    llm.queue(plan(), reflection())
    sid2, entries2 = finished(run_wake(env, "--force"), store, "clean")
    assert not events_of(entries2, "crash_detected")
    store.close()


@pytest.mark.slow
def test_a_store_gone_for_longer_than_the_wake_waits_is_still_not_a_crash(own_redis, tmp_path, llm):
    """The wake gives up recording its end (exit 3) and leaves a note on local disk: the next wake
    records the session as store_unavailable, which never counts towards auto-restore."""
    import redis

    from tests.wake_helpers import seeded

    url = f"redis://127.0.0.1:{own_redis}/0"
    store = seeded(url)
    env = wake_env(url, llm, XDG_STATE_HOME=str(tmp_path / "state"))
    llm.queue(plan(think("slow", id="s")), {"content": "answer", "delay": 2}, "ok", reflection())
    p, _ = _lock_the_store_mid_answer(llm, own_redis, env)
    try:
        out, err = p.communicate(timeout=60)  # gives up while the store is still locked
    finally:
        if p.poll() is None:
            p.kill()
        redis.Redis(port=own_redis, password="now-locked").config_set("requirepass", "")
    assert p.returncode == 3, (out, err)
    assert list((tmp_path / "state" / "brainstem" / "unrecorded").iterdir())
    store = seeded(url)
    dead = karma.latest_session_id(store)

    llm.reset()
    llm.queue(plan(), reflection())
    sid, entries = finished(run_wake(env, "--force"), store, "clean")
    assert not events_of(entries, "crash_detected") and entries[0]["crashed_session"] is None
    (entry,) = [h for h in history(store) if h["id"] == dead]
    assert entry["outcome"] == "store_unavailable" and "BRAINSTEM_KV" in entry["operator_action"]
    assert karma.read(store, dead)[-1]["outcome"] == "store_unavailable"
    assert not list((tmp_path / "state" / "brainstem" / "unrecorded").iterdir())  # the note is gone
    store.close()


def test_a_note_about_a_session_another_host_closed_is_swept_by_the_next_wake_here(st, real_store_url, llm,
                                                                                    tmp_path, monkeypatch):
    """Host A lost the store mid-session and left a note; host B, which cannot see it, closed the session
    (host_lost). The note can never be used now: A's next wake deletes it, and only this store's."""
    from brainstem.store import unrecorded

    here, there = tmp_path / "state-a", tmp_path / "state-b"
    dead = "7-a0a0a0"
    st.put(keys.SESSION_CURRENT, {"id": dead, "host": "host-a", "pid": dead_pid(),
                                  "started_at": "2026-05-01T10:00:00Z"})
    st.append(keys.karma(dead), json.dumps({"event": "session_start", "session_id": dead}))
    monkeypatch.setenv("XDG_STATE_HOME", str(here))
    assert unrecorded.remember(st.display_url, dead, "store_unavailable", "the store went away")
    assert unrecorded.remember("sqlite:///another/agent.db", "3-other", "store_unavailable", "elsewhere")
    notes = here / "brainstem" / "unrecorded"
    assert len(list(notes.iterdir())) == 2

    llm.queue(plan(think("hi")), "ok", reflection())
    finished(run_wake(wake_env(real_store_url, llm, XDG_STATE_HOME=str(there), BRAINSTEM_HOSTNAME="host-b"),
                      "--force"), st)
    (closed,) = [h for h in history(st) if h["id"] == dead]
    assert closed["outcome"] == "host_lost"  # B could not know what A's note says
    assert unrecorded.recall(st.display_url, dead) is not None  # still on A's disk

    llm.queue(plan(think("hi")), "ok", reflection())
    finished(run_wake(wake_env(real_store_url, llm, XDG_STATE_HOME=str(here), BRAINSTEM_HOSTNAME="host-a"),
                      "--force"), st)
    assert unrecorded.recall(st.display_url, dead) is None  # swept
    assert unrecorded.recall("sqlite:///another/agent.db", "3-other") is not None  # another store's: kept
    assert [h["outcome"] for h in history(st) if h["id"] == dead] == ["host_lost"]  # recorded once, as it was


def test_a_note_about_the_session_still_to_be_closed_is_kept_for_it(st, tmp_path, monkeypatch):
    from brainstem.session.crash import sweep_notes
    from brainstem.store import unrecorded

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    st.put(keys.SESSION_CURRENT, {"id": "8-b1b1b1", "host": "host-a", "pid": dead_pid()})
    for sid in ("8-b1b1b1", "6-c2c2c2"):
        unrecorded.remember(st.display_url, sid, "store_unavailable", None)
    assert sweep_notes(st) == ["6-c2c2c2"]
    assert unrecorded.recall(st.display_url, "8-b1b1b1") is not None
    st.delete(keys.SESSION_CURRENT)  # closed, here or on another host
    assert sweep_notes(st) == ["8-b1b1b1"]


# --- the daemon: one session per agent, and every tick in wake_log ----------------------------------------------

@pytest.mark.slow
@pytest.mark.redis
def test_the_daemon_runs_an_agent_named_twice_once_and_records_skipped_ticks(redis_url, tmp_path, llm):
    from brainstem.state.seed import example_soul_path, seed
    from tests.helpers import Daemon
    from tests.wake_helpers import base_env, fires, responder, ts, wake_log

    llm.responder = responder(steps=3, delay=0.8)  # a session of ~3 s: longer than a 1 s tick
    name = f"dup{os.getpid()}{int(time.time() * 1000) % 100000}"
    store = open_store(redis_url, prefix=f"{name}:")
    seed(store, soul_file=example_soul_path())
    d = Daemon(base_env(redis_url, llm), ["--every", "1s", "--agent", name, "--agent", f"{name}:"], tmp_path)
    def still_running():
        store.delete(keys.WAKE_CONFIG)  # keep it due
        return history(store) and [e for e in fires(store, "skipped") if e.get("reason") == "still_running"]
    try:
        # Until a session has run and a tick found it still running (the doubled name never ran it twice).
        wait_for(still_running, 40, "a session and a tick skipped while it ran", d, interval=0.2)
        rc, _ = d.stop()
        assert rc == 0, d.stderr
        err = d.stderr
        assert "given more than once" in err and f"running {name}:" in err and f"{name}, {name}" not in err
        h = history(store)
        assert h, err
        spans = []
        for entry in h:
            entries = karma.read(store, entry["id"])
            spans.append((ts(events_of(entries, "session_start")[0]["t"]),
                          ts(events_of(entries, "session_end")[0]["t"]), entry["id"]))
        spans.sort()
        for (_s1, e1, id1), (s2, _e2, id2) in zip(spans, spans[1:], strict=False):
            assert s2 >= e1, f"sessions {id1} and {id2} overlap"
        still = [e for e in fires(store, "skipped") if e.get("reason") == "still_running"]
        assert still, wake_log(store)
        assert not [e for e in fires(store, "skipped") if e.get("reason") == "locked"], wake_log(store)
    finally:
        if d.alive():
            d.proc.kill()
            d.proc.wait(5)
        for k in store._r.scan_iter(match=store.prefix + "*", count=1000):
            store._r.delete(k)
        store.close()

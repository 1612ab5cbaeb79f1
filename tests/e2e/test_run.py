"""``brainstem run``: the scheduler daemon as a subprocess, against a real Redis and the LLM double.

Each test seeds one or more agents under their own key prefix (``NAME:``, as
``--agent NAME`` expects), starts ``python -m brainstem run`` with its output
in files, drives it from outside (time, signals, the store, the Redis server
itself) and reads back what it left behind: the agent's ``wake_log``, session
history and karma.

The runtime clamps a requested sleep to at least 60 s, so after its first
session an agent sleeps; a test that needs more sessions deletes
``wake_config`` to make the agent due again, as an operator could.
"""

from __future__ import annotations

import math
import signal
import subprocess
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest

from brainstem.core import keys
from brainstem.store import karma, open_store
from tests.helpers import clean_env, free_port, one_line, run_cli, wait_for
from tests.wake_helpers import (
    base_env,
    events_of,
    fires,
    history,
    is_orient,
    responder,
    ts,
    wake_log,
)

pytestmark = pytest.mark.redis

# --- helpers ---------------------------------------------------------------------

def session_in_progress(store, min_completed_steps: int = 1) -> str | None:
    """The id of the running session once it has completed this many steps."""
    if store.get(keys.SESSION_CURRENT) is None:
        return None
    sid = karma.latest_session_id(store)
    done = [e for e in karma.read(store, sid) if e.get("event") == "step_complete"]
    return sid if len(done) >= min_completed_steps else None


def start_redis_server(port: int, workdir: Path) -> subprocess.Popen:
    """A dedicated redis-server that can be stopped (after a SAVE) and restarted on the same port with its data."""
    from tests.redis_server import RedisServerError
    from tests.redis_server import start_redis_server as start

    try:
        return start(workdir, port, "--dbfilename", "dump.rdb")[0]
    except RedisServerError as exc:
        pytest.fail(str(exc))


# --- refusing bad input ------------------------------------------------------------

@pytest.mark.slow
def test_bad_schedules_and_unknown_agents_are_refused_with_one_line(redis_url, agents):
    name, store = agents()
    env = base_env(redis_url, None)
    cases = {
        "every zero": (["--every", "0", "--agent", name], "too short"),
        "every abc": (["--every", "abc", "--agent", name], "is not a duration"),
        "every under a second": (["--every", "500ms", "--agent", name], "too short"),
        "bad cron": (["--cron", "bad", "--agent", name], "crontab"),
        "cron out of range": (["--cron", "61 * * * *", "--agent", name], "crontab"),
        "neither": (["--agent", name], "exactly one of"),
        "both": (["--every", "1s", "--cron", "* * * * *", "--agent", name], "exactly one of"),
        "ghost agent": (["--every", "1s", "--agent", "ghost" + uuid.uuid4().hex[:6]], "nothing has been seeded"),
        "one ghost among real": (["--every", "1s", "--agent", name, "--agent", "ghost" + uuid.uuid4().hex[:6]],
                                 "nothing has been seeded"),
    }
    # Each must refuse on its own, quickly (a run that kept running would time out), without touching the schedule.
    for label, (args, why) in cases.items():
        r = run_cli("run", *args, env=env, timeout=30)
        assert r.returncode != 0, (label, r.stdout, r.stderr)
        line = one_line(r.stderr)
        assert line.startswith("brainstem: error:") and why in line, (label, line)
    assert store.log_length(keys.WAKE_LOG) == 0 and karma.latest_session_id(store) is None


@pytest.mark.slow
def test_a_daemon_started_while_redis_is_down_waits_for_it(daemons, tmp_path, redis_url):
    """A daemon started before its Redis (or during an outage) says so once and waits; once the store is
    there it runs; SIGTERM while it waits is an ordinary stop."""
    from brainstem.state.seed import example_soul_path, seed
    from tests.redis_server import start_redis_server, stop

    port = free_port()  # nothing listens here yet
    url = f"redis://:hunter2pw@127.0.0.1:{port}/0"
    env = clean_env({"BRAINSTEM_KV": url})
    first = daemons(env, "--every", "1h")  # (redis_url: a redis-server is at hand, or the test cannot run)
    wait_for(lambda: "store is unavailable" in first.stderr, 15, "the daemon to say the store is unavailable", first)
    assert first.alive() and first.stderr.count("store is unavailable") == 1, first.stderr
    assert "hunter2pw" not in first.stderr
    assert first.stop() == (0, pytest.approx(0, abs=5))  # a stop while waiting: exit 0, at once
    waiting = daemons(env, "--every", "1h")
    wait_for(lambda: "store is unavailable" in waiting.stderr, 15, "the second daemon to wait for the store", waiting)
    proc, _ = start_redis_server(tmp_path, port, password="hunter2pw")
    try:
        store = open_store(url)
        seed(store, soul_file=example_soul_path())
        wait_for(lambda: "the store is reachable; starting" in waiting.stderr, 45, "the daemon to start", waiting)
        assert waiting.alive(), waiting.stderr
        rc, _took = waiting.stop()
        assert rc == 0, waiting.stderr
    finally:
        stop(proc)


# --- the schedule -------------------------------------------------------------------

@pytest.mark.slow
def test_wakes_on_schedule_first_fire_runs_then_later_fires_sleep(redis_url, agents, llm, daemons):
    llm.responder = responder()
    name, store = agents()
    d = daemons(base_env(redis_url, llm), "--every", "1s", "--agent", name)
    wait_for(lambda: len(fires(store, "asleep")) >= 3, 30, "three asleep fires", d)
    rc, took = d.stop()
    assert rc == 0, d.stderr
    assert took < 10

    # On a loaded machine the first session may outlast a second: fires meanwhile are skipped as still
    # running (recorded before the session's own "ran" entry, which is written when it ends), never run.
    whole = wake_log(store)
    log = [e for e in whole if not (e["fire"] == "skipped" and e.get("reason") == "still_running")]
    assert all(e["fire"] != "skipped" or whole.index(e) < whole.index(log[0]) for e in whole), whole
    assert log[0]["fire"] == "ran" and log[0]["outcome"] == "clean", log
    assert [e["fire"] for e in log[1:]] == ["asleep"] * (len(log) - 1), log
    h = history(store)
    assert len(h) == 1 and h[0]["id"] == log[0]["session_id"] and h[0]["outcome"] == "clean"
    # The plan asked for 1 s; the runtime sleeps at least 60 s, and every later fire sees that.
    wc = store.get_json(keys.WAKE_CONFIG)
    assert wc["sleep_seconds"] == 60
    assert all(e["until"] == wc["next_wake_after"] for e in log[1:])
    # About one fire a second (generous bounds: the machine is shared, and a late fire is coalesced).
    times = [ts(e["t"]) for e in log]
    gaps = sorted((b - a).total_seconds() for a, b in zip(times[1:], times[2:], strict=False))
    assert 0.6 < gaps[len(gaps) // 2] < 1.6 and gaps[-1] < 5, gaps
    # One session's worth of LLM calls, however many fires.
    assert sum(1 for r in llm.requests if is_orient(r)) == 1
    assert f"running {name}: every 1s" in d.stderr and "stopped" in d.stderr


@pytest.mark.slow
def test_one_process_wakes_several_agents(redis_url, agents, llm, daemons):
    llm.responder = responder()
    (a, sa), (b, sb) = agents(), agents()
    d = daemons(base_env(redis_url, llm), "--every", "1s", "--agent", a, "--agent", b)
    wait_for(lambda: fires(sa, "asleep") and fires(sb, "asleep"), 30, "both agents to run and then sleep", d)
    rc, _ = d.stop()
    assert rc == 0, d.stderr
    for store in (sa, sb):
        assert fires(store, "ran")[0]["outcome"] == "clean"
        h = history(store)
        assert len(h) == 1 and h[0]["outcome"] == "clean"
    # Each agent's session is recorded under its own prefix.
    assert karma.read(sa, history(sa)[0]["id"])[-1]["event"] == "session_end"
    assert karma.read(sb, history(sb)[0]["id"])[-1]["event"] == "session_end"
    assert f"running {a}, {b}" in d.stderr


@pytest.mark.slow
def test_two_daemons_on_one_agent_never_overlap(redis_url, agents, llm, daemons):
    llm.responder = responder(steps=3, delay=0.4)  # a session takes about 1.5 s: longer than a tick
    name, store = agents()
    env = base_env(redis_url, llm)
    d1 = daemons(env, "--every", "1s", "--agent", name)
    d2 = daemons(env, "--every", "1s", "--agent", name)
    # Keep the agent due (whenever a session has set the next wake, take it away again) until both
    # daemons have had their turn: three sessions, and fires skipped because the other held the agent.
    def enough():
        store.delete(keys.WAKE_CONFIG)
        assert d1.alive() and d2.alive(), (d1.stderr[-1000:], d2.stderr[-1000:])
        return len(history(store)) >= 3 and fires(store, "skipped")
    wait_for(enough, 40, "three sessions and a skipped fire", interval=0.2)
    for d in (d1, d2):
        rc, _ = d.stop()
        assert rc == 0, d.stderr

    h = history(store)
    assert len(h) >= 3, h
    spans = []
    for entry in h:
        entries = karma.read(store, entry["id"])
        starts, ends = events_of(entries, "session_start"), events_of(entries, "session_end")
        assert len(starts) == 1 and len(ends) == 1, (entry["id"], [e["event"] for e in entries])
        spans.append((ts(starts[0]["t"]), ts(ends[0]["t"]), entry["id"]))
    spans.sort()
    for (s1, e1, id1), (s2, e2, id2) in zip(spans, spans[1:], strict=False):
        assert s2 >= e1, f"sessions {id1} ({s1}..{e1}) and {id2} ({s2}..{e2}) overlap"
    ran, skipped = fires(store, "ran"), fires(store, "skipped")
    assert sorted(e["session_id"] for e in ran) == sorted(x["id"] for x in h)
    assert skipped and all(e["reason"] in ("locked", "still_running") for e in skipped), wake_log(store)
    assert not any(x["outcome"] in ("crashed", "error") for x in h), h
    assert "skipped" in d1.stderr + d2.stderr


# --- stopping -------------------------------------------------------------------------

@pytest.mark.slow
def test_sigterm_mid_session_interrupts_it_cleanly(redis_url, agents, llm, daemons):
    llm.responder = responder(steps=8, delay=0.5)
    name, store = agents()
    env = base_env(redis_url, llm)
    d = daemons(env, "--every", "1s", "--agent", name, "--grace", "20")
    sid = wait_for(lambda: session_in_progress(store, 1), 30, "a session in its steps", d)
    rc, took = d.stop(timeout=30)
    assert rc == 0, d.stderr
    assert took < 10, took  # it stops at the next step, well within the grace period

    entries = karma.read(store, sid)
    end = entries[-1]
    assert end["event"] == "session_end" and end["outcome"] == "interrupted", [e["event"] for e in entries]
    assert not events_of(entries, "reflect")  # shutting down: no reflection
    assert len(events_of(entries, "step_complete")) < 8
    h = history(store)
    assert [x["outcome"] for x in h if x["id"] == sid] == ["interrupted"], h
    assert store.get(keys.SESSION_CURRENT) is None
    assert store.lease_owner(keys.WAKE_LEASE) is None
    assert [e for e in fires(store, "ran") if e["session_id"] == sid][0]["outcome"] == "interrupted"
    assert "SIGTERM" in d.stderr

    # The next wake sees an interrupted session, not a crash.
    llm.responder = responder()
    r = run_cli("wake", "--force", "--quiet", env={**env, "BRAINSTEM_KV_PREFIX": f"{name}:"})
    assert r.returncode == 0, r.stderr
    nxt = karma.read(store, karma.latest_session_id(store))
    assert nxt[0]["event"] == "session_start" and nxt[0].get("crashed_session") is None
    assert not events_of(nxt, "crash_detected")
    assert not any(x["outcome"] == "crashed" for x in history(store)), history(store)


@pytest.mark.slow
def test_session_that_outlives_the_grace_period_is_recorded_interrupted(redis_url, agents, llm, daemons):
    llm.responder = responder(steps=2, delay=30)  # the first think step hangs far past the grace period
    name, store = agents()
    env = base_env(redis_url, llm)
    d = daemons(env, "--every", "1s", "--agent", name, "--grace", "1")

    def thinking():
        sid = karma.latest_session_id(store)
        return sid if sid and events_of(karma.read(store, sid), "step_start") else None
    sid = wait_for(thinking, 30, "a session stuck in a step", d)
    time.sleep(0.3)
    rc, took = d.stop(timeout=20)
    assert rc == 0, d.stderr
    assert took < 8, took
    assert "grace period" in d.stderr

    end = karma.read(store, sid)[-1]
    assert end["event"] == "session_end" and end["outcome"] == "interrupted", end
    assert [x["outcome"] for x in history(store) if x["id"] == sid] == ["interrupted"]
    assert store.get(keys.SESSION_CURRENT) is None
    # What it held is let go as a timely stop would: the lease at once, and the agent due a minute on
    # (not at the pessimistic advance the session set when it began).
    assert store.lease_owner(keys.WAKE_LEASE) is None
    due = datetime.fromisoformat(store.get_json(keys.WAKE_CONFIG)["next_wake_after"].replace("Z", "+00:00"))
    assert (due - datetime.now(due.tzinfo)).total_seconds() <= 61

    llm.responder = responder()
    r = run_cli("wake", "--force", "--quiet", env={**env, "BRAINSTEM_KV_PREFIX": f"{name}:"})
    assert r.returncode == 0, r.stderr  # the dead daemon's lock is reclaimed
    nxt = karma.read(store, karma.latest_session_id(store))
    assert not events_of(nxt, "crash_detected")
    assert nxt[-1]["event"] == "session_end" and nxt[-1]["outcome"] == "clean"


# --- the store going away ---------------------------------------------------------------

@pytest.mark.slow
def test_redis_lost_mid_run_is_logged_once_and_recovered(agents, llm, daemons, tmp_path):
    import redis

    llm.responder = responder()
    port = free_port()
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server = start_redis_server(port, workdir)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        name, store = agents(url)
        d = daemons(base_env(url, llm), "--every", "1s", "--agent", name)
        wait_for(lambda: fires(store, "asleep"), 30, "a first session, then an asleep fire", d)

        # The store goes away (its data kept on disk for the restart).
        redis.Redis(port=port).save()
        server.terminate()
        server.wait(10)
        # Fires while it is down, until one has given up after the store's own 5 s of retries.
        wait_for(lambda: "store unavailable" in d.stderr, 30, "the daemon to log the outage", d)
        assert d.alive(), d.stderr
        server = start_redis_server(port, workdir)
        back_at = datetime.now().astimezone()
        wait_for(lambda: [e for e in fires(store, "asleep") if ts(e["t"]) > back_at], 30,
                 "fires after the store came back", d)
        rc, _ = d.stop()
        assert rc == 0, d.stderr
        # It went back to sleeping, not to re-running sessions: one session, fires before and after.
        assert len(history(store)) == 1
    finally:
        server.terminate()
        server.wait(10)

    err = d.stderr
    lost = [line for line in err.splitlines() if "store unavailable" in line]
    back = [line for line in err.splitlines() if "store is back" in line]
    assert len(lost) == 1, err  # once per outage, not once per tick
    assert len(back) == 1, err
    assert "Traceback" not in err


# --- missed fires -------------------------------------------------------------------------

@pytest.mark.slow
def test_a_fire_later_than_the_misfire_grace_is_recorded_missed(redis_url, agents, llm, daemons):
    llm.responder = responder()
    name, store = agents()
    every = 2.0
    d = daemons(base_env(redis_url, llm), "--every", "2s", "--misfire-grace", "1", "--agent", name)
    first_slept = wait_for(lambda: fires(store, "asleep"), 30, "an asleep fire", d)[0]
    # Fires come every 2 s in phase with this one (recorded a little after it was due). Freeze the daemon
    # across a scheduled fire at least 0.5 s away and wake it 1.5 s after that fire: later than the 1 s grace
    # (a fire recorded late only makes it later still; past the next fire too, both are missed).
    phase = ts(first_slept["t"]).timestamp()
    d.proc.send_signal(signal.SIGSTOP)
    try:
        now = time.time()
        k = math.ceil((now + 0.5 - phase) / every)
        resume_at = phase + k * every + 1.5
        time.sleep(max(0.0, resume_at - time.time()))  # the daemon is frozen: waiting out the clock is the test
    finally:
        d.proc.send_signal(signal.SIGCONT)
    missed = wait_for(lambda: fires(store, "missed"), 10, "a missed fire", d)
    rc, _ = d.stop()
    assert rc == 0, d.stderr
    assert missed[0].get("scheduled"), missed
    assert "missed a fire" in d.stderr
    # A missed fire is only recorded: it ran no session.
    assert len(history(store)) == 1

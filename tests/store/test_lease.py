"""The wake lease: renewed while a session runs, lost when another wake takes it or it runs out.

A session holds its agent's wake lease of ``BRAINSTEM_LEASE_SECONDS``
renewed by a heartbeat. These tests run on real stores (SQLite on disk, a real
redis-server) and real ``brainstem`` processes: a lease kept alive for many
periods, a lease taken over mid-session (the session stops and the store
refuses its writes to the schedule, the history and the breadcrumb), a host
SIGKILLed mid-session and taken over by a daemon on another host within two
lease periods, and a crash loop that backs off instead of spending every tick.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from brainstem.core import events, keys, outcomes
from brainstem.core.clock import parse_iso
from brainstem.state import history as session_history
from brainstem.store import karma, open_store
from brainstem.store.lease import Lease
from tests.helpers import run_cli, scrape, value, wait_for
from tests.wake_helpers import (
    base_env,
    events_of,
    fires,
    is_orient,
    is_reflect,
    plan,
    reflection,
    run_wake,
    seeded,
    start_wake,
    think,
    wake_env,
)

OWNER, OTHER = "host-a:1:aaaa", "host-b:2:bbbb"


# --- the heartbeat -------------------------------------------------------------------

@pytest.mark.slow
def test_the_heartbeat_keeps_a_lease_alive_for_many_periods(st):
    assert st.acquire_lease(keys.WAKE_LEASE, OWNER, 1000)
    lease = Lease(st, OWNER, 1.0).start()
    try:
        time.sleep(3.5)  # three and a half periods: without renewals it would have run out three times
        assert st.lease_owner(keys.WAKE_LEASE) == OWNER
        assert lease.renewals >= 6 and not lease.lost.is_set()
    finally:
        lease.stop()


def test_a_lease_taken_over_is_lost_within_a_period_and_says_by_whom(st):
    assert st.acquire_lease(keys.WAKE_LEASE, OWNER, 1000)
    told = []
    lease = Lease(st, OWNER, 1.0, on_lost=lambda lost: told.append(lost.reason)).start()
    try:
        st.release_lease(keys.WAKE_LEASE, OWNER)
        assert st.acquire_lease(keys.WAKE_LEASE, OTHER, 30_000)
        assert lease.lost.wait(1.5)
        assert OTHER in lease.reason and told == [lease.reason]
        assert st.lease_owner(keys.WAKE_LEASE) == OTHER  # the loser never touches the winner's lock
    finally:
        lease.stop()


@pytest.mark.redis
def test_a_store_gone_for_a_whole_period_loses_the_lease(own_redis):
    store = open_store(f"redis://127.0.0.1:{own_redis}/0", prefix="lease", retry_seconds=0.2)
    assert store.acquire_lease(keys.WAKE_LEASE, OWNER, 1000)
    lease = Lease(store, OWNER, 1.0).start()
    try:
        store._r.shutdown(nosave=True)
    except Exception:  # noqa: BLE001 - the connection drops as the server exits
        pass
    try:
        assert lease.lost.wait(4.0), "the lease survived a store gone for longer than its period"
        assert "could not renew" in lease.reason
    finally:
        lease.stop()
        store.close()


# --- a session whose lease is taken over ------------------------------------------------

def slow_plan(delay: float, steps: int = 3):
    """Orient answers ``steps`` think steps; each think answer takes ``delay`` seconds."""
    def respond(req):
        if is_orient(req):
            return plan(*[think(f"Think {i}", id=f"t{i}", model="haiku", max_tokens=20) for i in range(steps)],
                        next_wake={"sleep_seconds": 3600})
        if is_reflect(req):
            return reflection("done")
        return {"content": "ok", "delay": delay}
    return respond


@pytest.mark.slow
def test_a_session_whose_lease_is_taken_over_stops_and_writes_nothing_that_says_who_ran(st, llm, real_store_url):
    llm.responder = slow_plan(1.5)
    proc = start_wake(wake_env(real_store_url, llm, BRAINSTEM_LEASE_SECONDS=1))
    try:
        assert llm.wait_for_requests(2, timeout=20), "the session never reached its first step"
        holder = st.lease_owner(keys.WAKE_LEASE)
        assert holder is not None
        sid = karma.latest_session_id(st)
        pessimistic = st.get(keys.WAKE_CONFIG, "json")
        # Another host takes the agent over (as if this one had stalled past its lease).
        assert st.release_lease(keys.WAKE_LEASE, holder) and st.acquire_lease(keys.WAKE_LEASE, OTHER, 60_000)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, (proc.returncode, out, err)
    assert "lease was lost" in out and "Traceback" not in err
    entries = karma.read(st, sid)
    lost = events_of(entries, events.LEASE_LOST)
    assert len(lost) == 1 and OTHER in lost[0]["reason"]
    assert not events_of(entries, events.SESSION_END)
    assert len(events_of(entries, "step_complete")) <= 1  # stopped at the next step, not run to the end
    # Fenced: the schedule is still the dead session's advance, no history entry, the breadcrumb stands.
    assert st.get(keys.WAKE_CONFIG, "json") == pessimistic
    assert not session_history.has(st, sid)
    assert st.get(keys.SESSION_CURRENT, "json")["id"] == sid
    assert st.lease_owner(keys.WAKE_LEASE) == OTHER  # its release did not touch the new holder's lock

    # Once the other wake is gone, the next wake closes the stopped session as interrupted, not crashed.
    st.release_lease(keys.WAKE_LEASE, OTHER)
    llm.responder = slow_plan(0.0, steps=1)
    result = run_wake(wake_env(real_store_url, llm))
    assert result.returncode == 0, result.stderr
    closed = [h for h in session_history.read(st) if h["id"] == sid]
    assert closed and closed[0]["outcome"] == outcomes.INTERRUPTED and "lease" in closed[0]["reason"]


# --- a host dies ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.redis
def test_a_host_that_dies_mid_session_is_taken_over_by_another_within_two_lease_periods(
        redis_url, llm, daemons):
    period = 3.0
    name = "fleet" + str(int(time.time() * 1000))[-8:]
    url = f"{redis_url}?prefix={name}"
    st = seeded(url)
    llm.responder = slow_plan(30.0)  # host A's session blocks in its first step
    env_a = base_env(redis_url, llm, BRAINSTEM_KV_PREFIX=name, BRAINSTEM_HOSTNAME="host-a",
                     BRAINSTEM_LEASE_SECONDS=period)
    host_a = start_wake(env_a)
    try:
        wait_for(lambda: st.lease_owner(keys.WAKE_LEASE) and llm.wait_for_requests(2, timeout=0.1), 30,
                 "host A's session to start its first step")
        dead_sid = karma.latest_session_id(st)
        # Host B runs the same agent on a long interval: only the sweep can wake it again soon.
        env_b = base_env(redis_url, llm, BRAINSTEM_HOSTNAME="host-b", BRAINSTEM_LEASE_SECONDS=period)
        host_b = daemons(env_b, "--agent", name, "--every", "1h")
        wait_for(lambda: fires(st, "asleep"), 30, "host B's first fire to find the agent busy", host_b)
        llm.responder = slow_plan(0.0, steps=1)
        host_a.send_signal(signal.SIGKILL)
        host_a.wait(5)
        killed = time.time()
    finally:
        if host_a.poll() is None:
            host_a.kill()

    def picked_up():
        """(the dead session's history entry, the new session's id) once host B's session has noted the crash."""
        closed = [h for h in session_history.read(st) if h.get("id") == dead_sid]
        sid = karma.latest_session_id(st)
        if closed and sid != dead_sid and events_of(karma.read(st, sid), events.CRASH_DETECTED):
            return closed[0], sid
        return None
    closed, sid = wait_for(picked_up, 6 * period, "host B to take the agent over", host_b)
    # From host B a dead host and a cut-off one look alike: neither is the agent's doing.
    assert closed["outcome"] == outcomes.HOST_LOST and "host-a" in closed["reason"]
    entries = karma.read(st, sid)
    detected = events_of(entries, events.CRASH_DETECTED)
    assert detected and detected[0]["dead_session"] == dead_sid
    start = entries[0]
    assert start["event"] == "session_start"
    waited = parse_iso(start["t"]).timestamp() - killed
    assert waited <= 2 * period, f"host B took {waited:.1f}s to take over; the bound is {2 * period:.0f}s"
    wait_for(lambda: [f for f in fires(st, "ran") if f.get("session_id") == sid], 30,
             "the takeover in host B's wake log", host_b)
    rc, _ = host_b.stop()
    assert rc == 0


# --- a crash loop backs off -------------------------------------------------------------------

@pytest.mark.slow
def test_repeated_crashes_back_off_instead_of_waking_every_tick(st, llm, real_store_url):
    llm.responder = slow_plan(30.0)
    env = wake_env(real_store_url, llm, BRAINSTEM_LEASE_SECONDS=2)
    retries = []
    for n in range(3):
        proc = start_wake(env)
        try:
            assert llm.wait_for_requests(2 * (n + 1), timeout=30), f"session {n + 1} never started a step"
            wc = st.get(keys.WAKE_CONFIG, "json")
            retries.append(parse_iso(wc["retry_after"]) - parse_iso(karma.read(st, wc["session_id"])[0]["t"]))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(5)
        if n == 0:
            # A first crash is retried at once (same host: the dead process's lease is reclaimed).
            continue
        # Later ones wait: a plain wake now sleeps rather than run (and pay for) the crashing session again.
        asleep = run_wake(env)
        assert asleep.returncode == 0 and not llm.wait_for_requests(2 * (n + 1) + 1, timeout=0.5)
        cfg = st.get(keys.WAKE_CONFIG, "json")
        cfg["retry_after"] = "2000-01-01T00:00:00Z"  # as if the backoff had passed: due now, to see the next one
        st.put(keys.WAKE_CONFIG, cfg)
    steps = [r.total_seconds() for r in retries]
    assert steps == pytest.approx([0, 60, 120], abs=1)
    closed = [h["outcome"] for h in session_history.read(st)]
    assert closed == [outcomes.CRASHED, outcomes.CRASHED]


def test_crash_backoff_doubles_and_is_capped_by_the_default_sleep():
    assert [outcomes.crash_backoff(n, 3600) for n in range(6)] == [0, 60, 120, 240, 480, 960]
    assert outcomes.crash_backoff(10, 3600) == 3600
    history = [{"outcome": "clean"}, {"outcome": "crashed"}, "junk", {"outcome": "crashed"}]
    assert outcomes.crash_streak(history) == 2
    assert timedelta(seconds=outcomes.crash_backoff(outcomes.crash_streak(history), 21600)).seconds == 120


# --- Redis restarting under a running session (AOF on) ---------------------------------------

def aof_redis(port: int, workdir):
    """A redis-server persisting every write to its append-only file, restartable on the same port."""
    from tests.redis_server import RedisServerError, start_redis_server

    try:
        return start_redis_server(workdir, port, "--appendonly", "yes", "--appendfsync", "always")[0]
    except RedisServerError as exc:
        pytest.fail(str(exc))


def no_duplicates(entries: list[dict]) -> None:
    seen = [json.dumps(e, sort_keys=True) for e in entries]
    assert len(seen) == len(set(seen)), "a karma entry was recorded twice"


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.parametrize("outage, lease", [(1.5, 10), (7.0, 2)],
                         ids=["shorter-than-the-lease", "longer-than-the-lease"])
def test_redis_restarting_mid_session_loses_nothing_and_doubles_nothing(agents, llm, daemons, tmp_path, outage, lease):
    from tests.helpers import free_port

    port, workdir = free_port(), tmp_path / "redis"
    workdir.mkdir()
    server = aof_redis(port, workdir)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        name, st = agents(url)
        llm.responder = slow_plan(2.0, steps=2)
        metrics_port = free_port()
        d = daemons(base_env(url, llm, BRAINSTEM_LEASE_SECONDS=lease), "--every", "1h", "--agent", name,
                    "--metrics-port", str(metrics_port))
        wait_for(lambda: st.get(keys.SESSION_CURRENT) and llm.wait_for_requests(2, timeout=0.1), 30,
                 "a session in its first step", d)
        first = karma.latest_session_id(st)
        server.terminate()  # SIGTERM: Redis flushes its append-only file and exits
        server.wait(10)
        time.sleep(outage)
        server = aof_redis(port, workdir)
        llm.responder = slow_plan(0.0, steps=1)

        def settled():
            h = session_history.read(st)
            return h if h and h[-1]["outcome"] == outcomes.CLEAN and st.get(keys.SESSION_CURRENT) is None else None
        done = wait_for(settled, 60, "the agent's sessions to settle after the restart", d)
        lost_total = value(scrape(metrics_port), "brainstem_lease_lost_total", agent=name)
        lost_fires = fires(st, "lease_lost")
        listed = run_cli("wakes", env={"BRAINSTEM_KV": url, "BRAINSTEM_KV_PREFIX": name})
        rc, _ = d.stop()
        assert rc == 0, d.stderr
        karmas = {h["id"]: karma.read(st, h["id"]) for h in done}
    finally:
        server.terminate()
        server.wait(10)

    ids = [h["id"] for h in done]
    assert len(ids) == len(set(ids)), "a session is in the history twice"
    assert ids[0] == first
    if outage < lease:
        # Within the lease and the store's own retries: the session simply went on, and closed itself.
        assert [h["outcome"] for h in done] == [outcomes.CLEAN]
        assert lost_total == 0
    else:
        # Gone past the lease: the session stopped, and its end says the store went away: no crash
        # (which would count towards auto-restore), and one session after it, not two.
        assert [h["outcome"] for h in done] == [outcomes.STORE_UNAVAILABLE, outcomes.CLEAN], done
        assert lost_total == 1
        assert [f["session_id"] for f in lost_fires] == [ids[0]]
        assert "stopped: its wake lease was lost" in listed.stdout
        lost = events_of(karmas[ids[0]], events.LEASE_LOST)
        assert len(lost) == 1 and lost[0]["cause"] == "store_unavailable"
    for entries in karmas.values():
        no_duplicates(entries)
        assert len(events_of(entries, events.SESSION_END)) == 1
    assert "Traceback" not in d.stderr


@pytest.mark.slow
@pytest.mark.parametrize("real_store_url", ["sqlite"], indirect=True)
def test_a_wake_whose_clock_runs_ahead_never_takes_a_live_session_on_the_same_host(st, llm, real_store_url):
    """SQLite's lock expiry is wall-clock time: a cron wake on a clock a minute ahead sees the running
    session's lock as expired. The session's process is alive on this host, which needs no clock to see."""
    llm.responder = slow_plan(1.0, steps=3)
    proc = start_wake(wake_env(real_store_url, llm))
    try:
        assert llm.wait_for_requests(2, timeout=20), "the session never reached its first step"
        sid = karma.latest_session_id(st)
        # A wake on this host whose wall clock is two minutes ahead (a process: its clock is patched), while
        # the session runs in another: to it, the lock ran out long ago.
        ahead = ("import sys, time; real = time.time; time.time = lambda: real() + 120; "
                 "from brainstem.__main__ import main; sys.argv = ['brainstem', 'wake', '--force']; main()")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("BRAINSTEM_", "OPENROUTER_"))}
        skewed = subprocess.run([sys.executable, "-c", ahead], env={**env, **wake_env(real_store_url, llm)},
                                capture_output=True, text=True, timeout=60)
        assert skewed.returncode == 75 and "not waking twice" in skewed.stderr, skewed  # as for any held lock
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (out, err)
    (entry,) = [h for h in session_history.read(st) if h["id"] == sid]
    assert entry["outcome"] == outcomes.CLEAN  # ran to its end, never recorded as crashed
    assert [h["outcome"] for h in session_history.read(st)] == [outcomes.CLEAN]


# --- split brain: a stale session that comes back -----------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("real_store_url", ["redis"], indirect=True)
def test_a_session_frozen_past_its_lease_writes_nothing_and_spends_nothing_when_it_resumes(
        st, llm, real_store_url):
    """Host A's session is SIGSTOPped mid-call until its lease has run out. Host B takes the agent over and
    runs a clean session. Host A gets SIGCONT: it finds its lease gone, writes its lease_lost and
    nothing else, and makes no further LLM call; host B's state is untouched."""
    period = 1.5

    def host_a(req):
        if is_orient(req):
            return plan(think("A one", id="a1", model="haiku", max_tokens=20),
                        think("A two", id="a2", model="haiku", max_tokens=20), next_wake={"sleep_seconds": 3600})
        if is_reflect(req):
            return reflection("A's reflection")
        return {"content": "A's answer", "delay": 2.0}

    llm.responder = host_a
    env_a = wake_env(real_store_url, llm, BRAINSTEM_HOSTNAME="host-a", BRAINSTEM_LEASE_SECONDS=period)
    proc = start_wake(env_a, "--force")
    try:
        assert llm.wait_for_requests(2, timeout=20), "host A's session never reached its first step"
        sid_a = karma.latest_session_id(st)
        time.sleep(0.3)  # its think call is on the wire, its answer two seconds off
        proc.send_signal(signal.SIGSTOP)
        before_stop = karma.read(st, sid_a)
        # Frozen until its lease has run out (a period after its last renewal): host B may take over.
        wait_for(lambda: st.lease_owner(keys.WAKE_LEASE) is None, 10 * period, "host A's lease to run out")

        def host_b(req):
            if is_orient(req):
                return plan(think("B", id="b1", model="haiku", max_tokens=20), next_wake={"sleep_seconds": 7200})
            if is_reflect(req):
                return reflection("B's reflection")
            return "B's answer"
        llm.responder = host_b
        env_b = wake_env(real_store_url, llm, BRAINSTEM_HOSTNAME="host-b", BRAINSTEM_LEASE_SECONDS=period)
        done_b = run_wake(env_b, "--force")
        assert done_b.returncode == 0, done_b.stderr
        sid_b = karma.latest_session_id(st)
        state_b = {k: st.get(k) for k in (keys.WAKE_CONFIG, keys.LAST_REFLECT, keys.SESSION_CURRENT,
                                          keys.SESSION_LAST_COMPLETED, keys.SESSION_COUNTER)}
        history_b = session_history.read(st)
        karma_b = karma.read(st, sid_b)
        spent_b = st.daily_spend(time.strftime("%Y-%m-%d", time.gmtime()))[0]
        requests_b = len(llm.requests)
        assert [(h["id"], h["outcome"]) for h in history_b][-2:] == [(sid_a, outcomes.HOST_LOST),
                                                                     (sid_b, outcomes.CLEAN)]
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
    assert proc.returncode == 75, (proc.returncode, out, err)
    # Host A wrote the spend of the call it had in flight and its lease_lost, and nothing else, anywhere.
    after = karma.read(st, sid_a)
    closing = after[len(before_stop):]
    # (host B closed A's session in A's karma: its session_end says host_lost; then A's own entries)
    assert [e["event"] for e in closing] == [events.SESSION_END, events.SPEND_SETTLED, events.LEASE_LOST], closing
    assert closing[0]["outcome"] == outcomes.HOST_LOST
    assert {k: st.get(k) for k in state_b} == state_b
    assert session_history.read(st) == history_b and karma.read(st, sid_b) == karma_b
    assert len(llm.requests) == requests_b  # no LLM call after it resumed
    # The call it had made before it froze was paid for: its cost is booked, in today's spend and in A's
    # karma (spend_settled: its llm_call was refused with the lease), and nothing more.
    spent_after = st.daily_spend(time.strftime("%Y-%m-%d", time.gmtime()))[0]
    settled = closing[1]
    assert settled["purpose"] == "think" and settled["model"] == "anthropic/claude-haiku-4.5"
    assert 0 < settled["cost"] == pytest.approx(spent_after - spent_b, abs=1e-9)
    assert spent_after - spent_b <= 0.01

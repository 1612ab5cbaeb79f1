"""The daemon says why it cannot wake the agent: ``stats:daemon``, ``brainstem status`` and the dashboard.

The daemon's fires run in this process (``Runner.fire``, exactly what each scheduler tick calls) against
a real SQLite store on disk and the LLM double; ``status`` runs as the operator runs it (``run_cli``).
"""

from __future__ import annotations

import json
import logging

import pytest

from brainstem.core import keys
from brainstem.core.settings import load_settings
from brainstem.daemon.scheduler import Runner
from brainstem.state import daemon_health
from tests.helpers import run_cli
from tests.wake_helpers import API_KEY, plan, reflection, seeded, think


def settings_for(url: str, llm, key: str | None):
    """With no ``llm``: OpenRouter itself, which a wake refuses to call without a key (nothing is sent)."""
    endpoint = {"openrouter_base_url": llm.base_url} if llm is not None else {}
    return load_settings(kv=url, openrouter_api_key=key, llm_backoff=0.01, llm_max_attempts=1, **endpoint)


def errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "brainstem.run" and r.levelno >= logging.ERROR]


def make_due(store) -> None:
    store.delete(keys.WAKE_CONFIG)  # as an operator could: the agent is due again, whatever its backoff


@pytest.fixture
def daemon(tmp_path, llm, monkeypatch):
    for name in ("OPENROUTER_API_KEY", "BRAINSTEM_KV", "BRAINSTEM_KV_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    url = f"sqlite:///{tmp_path}/agent.db"
    store = seeded(url)
    runner = Runner(settings_for(url, None, None), [None])
    runner.check_agents()
    yield runner, runner.agents[0], store, url
    store.close()


def test_no_key_is_recorded_once_shown_by_status_and_cleared_by_a_clean_session(daemon, llm, caplog):
    runner, agent, store, url = daemon
    caplog.set_level(logging.INFO, logger="brainstem.run")
    env = {"BRAINSTEM_KV": url}
    assert "daemon" not in run_cli("status", env=env).stdout

    for _ in range(3):  # three ticks, one reason: one ERROR line and one record
        runner.fire(agent)
    assert len(errors(caplog)) == 1 and "BRAINSTEM_LLM_API_KEY is not set" in errors(caplog)[0]
    rec = daemon_health.read(store)
    assert rec is not None and rec["reason"].startswith("BRAINSTEM_LLM_API_KEY is not set")
    since = rec["since"]
    assert [json.loads(r)["fire"] for r in store.read_log(keys.WAKE_LOG)] == ["error"] * 3  # every fire still logged

    status = run_cli("status", env=env)
    assert status.returncode == 0
    (line,) = [x for x in status.stdout.splitlines() if x.startswith("daemon ")]
    assert line.split(None, 1)[1] == f"failing since {since}: {rec['reason']}"
    assert json.loads(run_cli("status", "--json", env=env).stdout)["daemon"] == rec

    # A key now, but the endpoint refuses it: the session runs and ends in llm_auth_failed. A new reason,
    # so one more line; failing began when it did.
    runner.settings = settings_for(url, llm, API_KEY)
    llm.responder = lambda req: {"status": 401, "message": "User not found."}
    runner.fire(agent)
    make_due(store)
    runner.fire(agent)
    assert len(errors(caplog)) == 2 and errors(caplog)[1].startswith("default: llm_auth_failed: ")
    rec = daemon_health.read(store)
    assert rec["since"] == since and rec["reason"].startswith("llm_auth_failed: the LLM endpoint refused the API key")

    # The key works: a clean session clears it, with one line saying so.
    llm.responder = None
    llm.queue(plan(think("back")), "ok", reflection())
    make_due(store)
    caplog.clear()
    runner.fire(agent)
    assert store.get(keys.DAEMON_FAILING) is None
    cleared = [r.getMessage() for r in caplog.records if "failing no more" in r.getMessage()]
    assert cleared == [f"default: failing no more: a session ran (clean) after failing since {since}"]
    assert errors(caplog) == []
    assert not any(x.startswith("daemon ") for x in run_cli("status", env=env).stdout.splitlines())
    assert json.loads(run_cli("status", "--json", env=env).stdout)["daemon"] is None


def test_a_fire_that_only_sleeps_does_not_clear_the_failure(daemon, llm, caplog):
    """Between backoff retries the agent sleeps: that is not a success, so the reason stays shown."""
    runner, agent, store, _ = daemon
    runner.settings = settings_for(runner.settings.kv, llm, API_KEY)
    llm.responder = lambda req: {"status": 402, "message": "Insufficient credits"}
    runner.fire(agent)  # llm_no_credit; the session layer backs the next wake off
    assert daemon_health.read(store)["reason"].startswith("llm_no_credit: ")
    llm.responder = None
    runner.fire(agent)  # asleep until the backoff passes
    assert json.loads(store.read_log(keys.WAKE_LOG)[-1])["fire"] == "asleep"
    assert daemon_health.read(store)["reason"].startswith("llm_no_credit: ")


def test_the_dashboard_overview_shows_the_failure(daemon):
    from tests.dashboard_client import app_for, client

    runner, agent, store, _ = daemon
    runner.fire(agent)
    rec = daemon_health.read(store)
    page = client(app_for(runner.settings, store)).get("/").text
    assert f"failing since {rec['since']}: BRAINSTEM_LLM_API_KEY is not set" in page


# --- whether a daemon serves the agent at all ---

def test_a_daemon_says_it_is_alive_and_that_it_stopped(tmp_path):
    from datetime import timedelta

    from brainstem.core.clock import now_utc
    from brainstem.store.lease import host_name

    url = f"sqlite:///{tmp_path / 'agent.db'}"
    store = seeded(url)
    assert daemon_health.seen(store) == {"running": False, "at": None, "host": None, "pid": None, "stopped": False}
    runner = Runner(settings_for(url, None, None), [None])
    runner.seen()  # through a store of its own: no fire has opened one yet
    seen = daemon_health.seen(store)
    assert seen["running"] and seen["host"] == host_name() and isinstance(seen["pid"], int) and seen["at"]
    later = now_utc() + timedelta(seconds=daemon_health.SEEN_STALE + 1)
    assert not daemon_health.seen(store, later)["running"]  # not heard from: not running
    runner.seen(stopped=True)
    assert daemon_health.seen(store) | {"at": None} == {"running": False, "at": None, "host": host_name(),
                                                        "pid": seen["pid"], "stopped": True}
    store.put(keys.DAEMON_SEEN, "not a record")
    assert daemon_health.seen(store)["at"] is None


def test_a_daemon_of_many_agents_says_it_less_often_and_is_judged_by_its_own_period(tmp_path):
    from datetime import timedelta

    from brainstem.core.clock import now_utc

    # Heartbeats cost at most SEEN_RATE writes a second, however many agents one daemon serves.
    for agents in (1, 10, 600, 10_000, 100_000):
        assert agents / daemon_health.seen_every(agents) <= daemon_health.SEEN_RATE
    assert daemon_health.seen_every(1) == daemon_health.SEEN_EVERY
    store = seeded(f"sqlite:///{tmp_path / 'agent.db'}")
    every = daemon_health.seen_every(10_000)
    daemon_health.note_seen(store, "h", 1, every=every)
    assert daemon_health.seen(store, now_utc() + timedelta(seconds=2 * every))["running"]  # its own period
    assert not daemon_health.seen(store, now_utc() + timedelta(seconds=3 * every + 1))["running"]
    daemon_health.note_seen(store, "h", 1, every=10**12)  # a record edited by hand claims no lasting life
    assert not daemon_health.seen(store, now_utc() + timedelta(days=4))["running"]


@pytest.mark.slow
def test_brainstem_run_says_it_is_alive_while_it_runs_and_that_it_stopped(tmp_path, daemons):
    from tests.helpers import clean_env, wait_for

    url = f"sqlite:///{tmp_path / 'agent.db'}"
    store = seeded(url)
    store.put(keys.WAKE_CONFIG, {"next_wake_after": "2999-01-01T00:00:00Z"})  # asleep: nothing but the daemon runs
    d = daemons(clean_env({"BRAINSTEM_KV": url}), "--every", "1h")
    seen = wait_for(lambda: daemon_health.seen(store)["running"] and daemon_health.seen(store), 30,
                    "the daemon to say it is alive", d)
    assert seen["pid"] == d.proc.pid and not seen["stopped"]
    rc, _ = d.stop()
    assert rc == 0, d.stderr
    after = daemon_health.seen(store)
    assert after["stopped"] and not after["running"] and after["pid"] == d.proc.pid

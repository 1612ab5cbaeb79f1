"""Scheduled actions through the whole product: ``brainstem wake`` (cron's command, as real processes) and
``brainstem run`` against real stores (Redis and SQLite), real agent tools in the sandbox, the LLM and the
Telegram Bot API as loopback doubles.

What is checked is what an operator relies on: a sleeping agent's due schedule still runs, and the agent
sleeps on; each due run happens once, however many wakes race for it; a run killed mid-run is recorded by
the next wake and not repeated; a run due while the previous one runs is skipped and recorded; the result
reaches ``brainstem inbox`` or Telegram; ``--dry-run`` runs none; a value that is not a schedule is one
line and one karma entry, never a traceback and never a full wake every tick; and the sleep path stays light.
"""

from __future__ import annotations

import json
import signal

import pytest

from brainstem.core import keys
from brainstem.core.clock import iso, now_utc, parse_iso
from brainstem.state.schedules import load
from brainstem.store import karma
from tests.doubles import TelegramDouble
from tests.helpers import ok, put_tool, run_cli, run_cli_process, wait_for
from tests.wake_helpers import base_env, iso_in, plan, reflection, start_wake, think

# Counts its runs in its own data before anything else (so a killed run is counted), then may sleep.
TOOL = """import time

def execute(args, ctx):
    ctx.kv.put("runs", str(int(ctx.kv.get("runs") or 0) + 1))
    time.sleep(args.get("seconds") or 0)
    return {"pair": "ETH", "price": 3120.5}
"""
HEAVY = {"click", "pydantic", "httpx", "tenacity", "brainstem.operator.cli", "brainstem.session.wake"}


@pytest.fixture
def agent(st):
    """The seeded agent, asleep for two hours, with the ``prices`` tool."""
    st.put(keys.WAKE_CONFIG, {"next_wake_after": iso_in(7200)})
    put_tool(st, "prices", TOOL, {"description": "prices", "kv_access": "own", "timeout_ms": 90_000})
    return st


def schedule(store, schedule_id: str = "prices", **fields) -> None:
    """The operator's schedule, written straight to the store (due now unless told)."""
    store.put(keys.schedule(schedule_id), {"tool": "prices", "input": {}, "every": "1h", "next_run": iso(now_utc()),
                                           "created_by": "operator", **fields})


def runs(store) -> int:
    return int(store.get("tooldata:prices:runs") or 0)


def ends(store) -> list[dict]:
    """Every schedule_run entry of every run, oldest run first."""
    found = []
    for info in store.list_all("karma:sched-"):
        found += [e for e in karma.read(store, info.name[len("karma:"):]) if e.get("event") == "schedule_run"]
    return found


def imported(result) -> set[str]:
    return {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "import time:" in line}


def asleep_and_untouched(store, llm, wake_config) -> None:
    assert llm.requests == [] and karma.latest_session_id(store) is None
    assert store.get_json(keys.WAKE_CONFIG) == wake_config


# --- a sleeping agent's schedules ------------------------------------------------------------------------------

def test_a_sleeping_agents_due_schedule_runs_under_wake_and_the_agent_sleeps_on(agent, env, llm, real_store_url):
    wake_config = agent.get_json(keys.WAKE_CONFIG)
    schedule(agent, notify="inbox")
    r = run_cli_process("wake", env=env)  # cron's command: the sleep path sees it due, the full path runs it
    assert r.returncode == 0 and r.stderr == "", r.stderr
    [end] = ends(agent)
    assert end["outcome"] == "ok" and runs(agent) == 1
    asleep_and_untouched(agent, llm, wake_config)
    run_id = f"sched-prices-{parse_iso(end['scheduled']).strftime('%Y%m%dT%H%M%SZ')}"
    assert "outcome=ok" in ok(run_cli("karma", run_id, env=env))
    assert "schedule prices: prices" in ok(run_cli("inbox", env=env))
    # the next tick: not due, so the light path answers it
    again = run_cli_process("wake", env={**env, "PYTHONPROFILEIMPORTTIME": "1"})
    assert again.returncode == 0 and imported(again) and not imported(again) & HEAVY
    assert runs(agent) == 1 and len(ends(agent)) == 1


@pytest.mark.parametrize("form", [[], ["--quiet"], ["--log-format", "json"]])
def test_the_sleep_path_stays_light_with_a_schedule_that_is_not_due(agent, env, llm, form):
    schedule(agent, next_run=iso_in(1800))
    schedule(agent, "paused", next_run=iso(now_utc()), enabled=False)
    light = run_cli_process("wake", *form, env={**env, "PYTHONPROFILEIMPORTTIME": "1"})
    assert light.returncode == 0
    assert imported(light) and not imported(light) & HEAVY, form
    assert runs(agent) == 0 and ends(agent) == []


def test_dry_run_runs_no_schedule(agent, env, llm):
    schedule(agent)
    due = agent.get_json(keys.schedule("prices"))["next_run"]
    llm.queue(plan(think("hello")), "hi", reflection())
    r = run_cli("wake", "--dry-run", env=env)
    assert r.returncode == 0, r.stderr
    assert runs(agent) == 0 and ends(agent) == []
    assert load(agent, "prices").next_run == due and load(agent, "prices").last_run is None


# --- exactly once, never overlapping -----------------------------------------------------------------------

def test_two_wakes_racing_for_one_due_run_run_it_once_and_record_no_skip(agent, env, llm):
    schedule(agent, input={"seconds": 1.5})
    procs = [start_wake(env) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0 and "Traceback" not in err, err
    assert [e["outcome"] for e in ends(agent)] == ["ok"]  # one run, and no skipped_overlap by the other
    assert runs(agent) == 1
    assert load(agent, "prices").last_outcome == "ok"


def test_a_run_killed_mid_run_is_recorded_by_the_next_wake_and_not_repeated(agent, env, llm):
    schedule(agent, input={"seconds": 60})
    proc = start_wake(env)
    wait_for(lambda: runs(agent) == 1 and agent.get(keys.schedule_running("prices")), 30, "the run to start")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    r = run_cli_process("wake", env=env)  # the agent is asleep: the sleep path sends it on for the dead run
    assert r.returncode == 0 and r.stderr == "", r.stderr
    [end] = ends(agent)
    assert end["outcome"] == "failed" and "died" in end["reason"]
    assert load(agent, "prices").last_outcome == "failed"
    assert agent.get(keys.schedule_running("prices")) is None
    again = run_cli_process("wake", env={**env, "PYTHONPROFILEIMPORTTIME": "1"})
    assert again.returncode == 0 and not imported(again) & HEAVY  # recorded once: light again
    assert runs(agent) == 1 and len(ends(agent)) == 1  # not repeated
    assert parse_iso(load(agent, "prices").next_run) > now_utc()


def test_a_run_due_while_the_previous_still_runs_is_skipped_and_recorded(agent, env, llm):
    schedule(agent, input={"seconds": 4})
    first = start_wake(env)
    wait_for(lambda: agent.get(keys.schedule_running("prices")), 30, "the first run to start")
    running = agent.get_json(keys.schedule("prices"))
    agent.put(keys.schedule("prices"), {**running, "next_run": iso(now_utc())})  # due again, as by hand
    second = run_cli_process("wake", env=env)
    assert second.returncode == 0 and "Traceback" not in second.stderr
    _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    outcomes = sorted(e["outcome"] for e in ends(agent))
    assert outcomes == ["ok", "skipped_overlap"] and runs(agent) == 1
    [skip] = [e for e in ends(agent) if e["outcome"] == "skipped_overlap"]
    assert "still running" in skip["reason"]
    assert load(agent, "prices").last_outcome == "ok"  # the run's own outcome, once it ended


# --- notify ---------------------------------------------------------------------------------------------------

TOKEN = "7741852963:AAH-tg_E2E-token-0123456789abcdefXYZ"


def test_notify_telegram_and_a_send_that_fails_are_recorded(agent, env, llm):
    with TelegramDouble(token=TOKEN, max_hold=0.1) as tg:
        tg_env = {**env, "BRAINSTEM_TELEGRAM_BOT_TOKEN": TOKEN, "BRAINSTEM_TELEGRAM_CHAT_ID": "424242",
                  "BRAINSTEM_TELEGRAM_API_URL": tg.base_url}
        schedule(agent, notify="telegram")
        ok(run_cli("wake", env=tg_env))
        [end] = ends(agent)
        assert tg.sent == [{"chat_id": "424242", "text": end["message"]}]
        assert end["notified"].startswith("telegram:")
        schedule(agent, next_run=iso(now_utc()), notify="telegram")
        wrong = {**tg_env, "BRAINSTEM_TELEGRAM_BOT_TOKEN": "1111111111:AAH-wrong-token-0123456789abcdefgh"}
        ok(run_cli("wake", env=wrong))
        failed = [e for e in ends(agent) if e.get("notify_error")]
        assert len(failed) == 1 and failed[0]["outcome"] == "ok"
        assert "Telegram refused the bot token" in failed[0]["notify_error"]
        assert len(tg.sent) == 1


# --- what is not a schedule --------------------------------------------------------------------------------

def test_a_malformed_schedule_is_one_line_and_one_entry_never_a_wake_every_tick(agent, env, llm):
    wake_config = agent.get_json(keys.WAKE_CONFIG)
    agent.put(keys.schedule("broken"), '{"tool": "prices", "every": "fortnightly"')  # not even JSON
    agent.put(keys.schedule("badcron"), {"tool": "prices", "cron": "0 25 * * *", "next_run": iso(now_utc())})
    first = run_cli_process("wake", env=env)
    assert first.returncode == 0 and "Traceback" not in first.stderr
    lines = first.stderr.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("schedule:") for line in lines), first.stderr
    rejected = [e for info in agent.list_all("karma:sched-") for e in karma.read(agent, info.name[6:])
                if e["event"] == "config_rejected"]
    assert sorted(e["key"] for e in rejected) == ["schedule:badcron", "schedule:broken"]
    for _ in range(2):  # the next ticks: the light path, silent, nothing recorded again
        tick = run_cli_process("wake", env={**env, "PYTHONPROFILEIMPORTTIME": "1"})
        assert tick.returncode == 0 and not imported(tick) & HEAVY
        assert "schedule:" not in tick.stderr
    assert len([i for i in agent.list_all("karma:sched-")]) == 2
    asleep_and_untouched(agent, llm, wake_config)


# --- the daemon ------------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.redis
def test_two_daemons_on_two_hosts_run_each_due_run_once(redis_url, agents, llm, daemons):
    name, store = agents()
    store.put(keys.WAKE_CONFIG, {"next_wake_after": iso_in(7200)})
    put_tool(store, "prices", TOOL, {"description": "prices", "kv_access": "own"})
    store.put(keys.schedule("prices"), {"tool": "prices", "every": "2s", "next_run": iso(now_utc()),
                                        "created_by": "operator"})
    d1 = daemons(base_env(redis_url, llm, BRAINSTEM_HOSTNAME="host-a"), "--every", "1h", "--agent", name)
    d2 = daemons(base_env(redis_url, llm, BRAINSTEM_HOSTNAME="host-b"), "--every", "1h", "--agent", name)
    wait_for(lambda: runs(store) >= 4, 60, "four runs", daemon=d1)
    for d in (d1, d2):
        rc, _ = d.stop()
        assert rc == 0, d.stderr
    done = ends(store)
    ran = [e for e in done if e["outcome"] == "ok"]
    assert len(ran) == runs(store) >= 4  # every run recorded once
    assert len({e["scheduled"] for e in done}) == len(done)  # no scheduled time ran (or was skipped) twice
    # a skip here is a run still running when the next came due on the other host, never a false one
    assert all(e["outcome"] == "skipped_overlap" and "still running" in e["reason"] for e in done if e not in ran)
    assert "Traceback" not in d1.stderr + d2.stderr


# --- the operator's commands, and a run now --------------------------------------------------------------------

def test_an_operator_adds_a_schedule_runs_it_now_and_reads_what_it_did(agent, env, llm):
    added = ok(run_cli("schedule", "add", "prices", "--every", "6h", "--notify", "inbox", env=env))
    schedule_id = added.strip().splitlines()[0].strip()
    assert load(agent, schedule_id).created_by == "operator"
    ran = run_cli("schedule", "run", schedule_id, "--json", env=env)
    assert ran.returncode == 0, (ran.stdout, ran.stderr)
    result = json.loads(ran.stdout)
    assert result["outcome"] == "ok" and result["id"] == schedule_id and result["notified"].startswith("inbox:")
    assert "outcome=ok" in ok(run_cli("karma", result["run_id"], env=env))
    assert f"schedule {schedule_id}: prices" in ok(run_cli("inbox", env=env))
    listed = [json.loads(line) for line in ok(run_cli("schedule", "list", "--json", env=env)).splitlines()]
    [row] = [s for s in listed if s["id"] == schedule_id]
    assert row["last_outcome"] == "ok" and parse_iso(row["next_run"]) > now_utc()  # its timing untouched
    assert runs(agent) == 1

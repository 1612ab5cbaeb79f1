"""``brainstem schedule``: the operator adds, lists, pauses, resumes and removes schedules; every bad input is
one line and exit 2, and nothing is written."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from brainstem.core import recurrence
from brainstem.core.clock import parse_iso
from brainstem.store import open_store
from tests.helpers import ok, one_line_error, run_cli

UTC = timezone.utc
URL_INPUT = '{"url": "https://example.org"}'


@pytest.fixture
def env(tmp_path):
    env = {"BRAINSTEM_KV": f"sqlite:///{tmp_path / 'store.db'}"}
    ok(run_cli("seed", "--example-soul", env=env))
    return env


def stored(env, schedule_id):
    with open_store(env["BRAINSTEM_KV"]) as store:
        text = store.get(f"schedule:{schedule_id}")
    return None if text is None else json.loads(text)


def put(env, key, value):
    with open_store(env["BRAINSTEM_KV"]) as store:
        store.put(key, value)


def listed(env):
    return [json.loads(line) for line in ok(run_cli("schedule", "list", "--json", env=env)).splitlines()]


def test_add_prints_the_new_id_and_stores_the_operators_schedule(env):
    before = datetime.now(UTC).replace(microsecond=0)
    r = run_cli("schedule", "add", "check_or_balance", "--every", "6h", "--notify", "inbox", env=env)
    schedule_id = ok(r).strip()
    assert r.stdout == schedule_id + "\n" and len(schedule_id) == 8  # the id alone: id=$(brainstem schedule add ...)
    assert f"schedule {schedule_id}: check_or_balance every 6h; next run " in r.stderr
    s = stored(env, schedule_id)
    assert {k: v for k, v in s.items() if k != "next_run"} == {
        "id": schedule_id, "tool": "check_or_balance", "input": {}, "every": "6h", "tz": "UTC", "notify": "inbox",
        "missed": "once", "catchup": 3600, "enabled": True, "created_by": "operator"}
    assert before + timedelta(hours=6) <= parse_iso(s["next_run"]) <= datetime.now(UTC) + timedelta(hours=6)


def test_add_with_cron_runs_at_the_wall_clock_time_of_its_zone(env):
    r = run_cli("schedule", "add", "web_fetch", "--input", URL_INPUT, "--cron", "0 9 * * MON-FRI", "--tz",
                "America/New_York", "--notify", "telegram", "--synthesize", "One line: what changed?",
                "--missed", "skip", "--catchup", "600", "--id", "morning", "--json", env=env)
    s = json.loads(ok(r))
    assert s == stored(env, "morning")
    assert (s["id"], s["input"], s["cron"], s["tz"], s["synthesize"], s["missed"], s["catchup"]) == (
        "morning", {"url": "https://example.org"}, "0 9 * * MON-FRI", "America/New_York", "One line: what changed?",
        "skip", 600)
    rule = recurrence.parse_cron("0 9 * * MON-FRI", "America/New_York")
    assert recurrence.next_after(rule, parse_iso(s["next_run"]) - timedelta(seconds=1)) == parse_iso(s["next_run"])
    assert parse_iso(s["next_run"]).astimezone(rule.zone).hour == 9
    # Telegram is not set up in this environment: said, not refused (the host that runs it may have it)
    assert "Telegram is not set up here" in run_cli("schedule", "add", "kv_read", "--input", '{"key": "wisdom"}',
                                                     "--every", "1d", "--notify", "telegram", env=env).stderr


def test_add_paused_runs_only_once_resumed(env):
    ok(run_cli("schedule", "add", "kv_read", "--input", '{"key": "wisdom"}', "--every", "1h", "--id", "p",
               "--paused", env=env))
    assert stored(env, "p")["enabled"] is False
    assert "PAUSED" in ok(run_cli("schedule", "list", env=env))


def test_list_shows_yours_the_agents_and_what_is_not_a_schedule(env):
    assert ok(run_cli("schedule", "list", env=env)) == ("no schedules (add one: brainstem schedule add TOOL "
                                                         "--every 1h)\n")
    assert ok(run_cli("schedule", "list", "--json", env=env)) == ""
    ok(run_cli("schedule", "add", "kv_read", "--input", '{"key": "wisdom"}', "--every", "1d", "--id", "mine", env=env))
    put(env, "schedule:theirs", {"tool": "web_fetch", "input": {"url": "https://example.org"}, "cron": "0 * * * *",
                                 "next_run": "2026-05-04T10:00:00Z", "last_run": "2026-05-04T09:00:00Z",
                                 "last_outcome": "failed"})
    put(env, "schedule:broken", "{not json")
    lines = ok(run_cli("schedule", "list", env=env)).splitlines()
    assert lines[0].split() == ["ID", "TOOL", "WHEN", "STATE", "NEXT", "RUN", "(UTC)", "LAST", "RUN", "BY", "NOTIFY"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert rows["mine"].split()[1:4] == ["kv_read", "every", "1d"] and "operator" in rows["mine"]
    assert "2026-05-04 10:00" in rows["theirs"] and "2026-05-04 09:00 failed" in rows["theirs"]
    assert " agent " in rows["theirs"] and "INVALID" in rows["broken"] and "not valid JSON" in rows["broken"]
    entries = {e["id"]: e for e in listed(env)}
    assert entries["theirs"]["created_by"] == "agent" and entries["theirs"]["last_outcome"] == "failed"
    assert entries["mine"]["error"] is None and entries["mine"]["every"] == "1d"
    assert entries["broken"]["key"] == "schedule:broken" and entries["broken"]["error"].startswith("not valid JSON")


def test_pause_and_resume(env):
    ok(run_cli("schedule", "add", "kv_read", "--input", '{"key": "wisdom"}', "--every", "1h", "--id", "s", env=env))
    assert ok(run_cli("schedule", "pause", "s", env=env)) == "paused schedule s\n"
    assert stored(env, "s")["enabled"] is False
    assert ok(run_cli("schedule", "pause", "s", env=env)) == "schedule s is paused already\n"
    # Paused past its next run: resuming starts from the next run after now, with nothing to catch up on.
    put(env, "schedule:s", {**stored(env, "s"), "next_run": "2020-01-01T00:00:00Z"})
    before = datetime.now(UTC).replace(microsecond=0)
    out = ok(run_cli("schedule", "resume", "s", env=env))
    s = stored(env, "s")
    assert s["enabled"] is True and parse_iso(s["next_run"]) >= before + timedelta(hours=1)
    assert out == f"resumed schedule s; next run {s['next_run']}\n"
    assert ok(run_cli("schedule", "resume", "s", env=env)) == "schedule s is running already\n"
    # A next run still ahead is kept as it was.
    ok(run_cli("schedule", "pause", "s", env=env))
    ok(run_cli("schedule", "resume", "s", env=env))
    assert stored(env, "s")["next_run"] == s["next_run"]


def test_the_operator_may_pause_and_remove_the_agents_schedule(env):
    put(env, "schedule:agents", {"tool": "kv_read", "every": "1h", "created_by": "agent"})
    ok(run_cli("schedule", "pause", "agents", env=env))
    assert stored(env, "agents")["enabled"] is False and stored(env, "agents")["created_by"] == "agent"
    assert ok(run_cli("schedule", "rm", "agents", env=env)) == "removed schedule agents\n"
    assert stored(env, "agents") is None


def test_rm_removes_even_what_is_not_a_schedule(env):
    put(env, "schedule:broken", [1, 2])
    ok(run_cli("schedule", "rm", "broken", env=env))
    assert listed(env) == []


BAD_ADD = [
    (["--every", "1h", "--cron", "0 * * * *"], "give exactly one of --every (e.g. 30m, 1d) and --cron"),
    ([], "give exactly one of --every"),
    (["--cron", "0 25 * * *"], "--cron '0 25 * * *': hour '25' is out of range 0-23"),
    (["--cron", "0 9 * *"], "--cron '0 9 * *' has 4 fields; give five"),
    (["--cron", "0 0 30 2 *"], "never runs"),
    (["--cron", "0 9 * * *", "--tz", "Mars/Base"], "--tz 'Mars/Base' is not a known time zone: use an IANA name"),
    (["--every", "1h", "--tz", "Europe/London"], "--tz 'Europe/London' goes with cron only"),
    (["--every", "soon"], "--every 'soon' is not a duration"),
    (["--every", "0s"], "--every '0s' is out of range"),
    (["--every", "1h", "--input", '{"url": '], "--input is not valid JSON"),
    (["--every", "1h", "--input", "[1]"], "--input must be a JSON object"),
    (["--every", "1h", "--input", '{"uri": "x"}'], "--input: it does not fit the tool's input schema"),
    (["--every", "1h", "--id", "a:b"], "schedule id 'a:b' is not 1-64 letters"),
    (["--every", "1h", "--synthesize", "Summarise"], "--synthesize writes the message a run sends: give --notify"),
    (["--every", "1h", "--notify", "email"], "'email' is not one of"),
    (["--every", "1h", "--missed", "all"], "'all' is not one of"),
    (["--every", "1h", "--catchup", "-5"], "--catchup"),
]


@pytest.mark.parametrize("args, says", BAD_ADD, ids=[says[:30] for _, says in BAD_ADD])
def test_a_bad_add_is_one_line_exit_2_and_writes_nothing(env, args, says):
    argv = ["schedule", "add", "web_fetch", *args]
    if "--input" not in args:
        argv += ["--input", URL_INPUT]
    one_line_error(run_cli(*argv, env=env), 2, says)
    assert listed(env) == []


def test_an_unknown_tool_or_an_id_that_is_taken_is_exit_2(env):
    one_line_error(run_cli("schedule", "add", "nope", "--every", "1h", env=env), 2,
                   "no tool named 'nope'", "brainstem tool ls")
    one_line_error(run_cli("schedule", "add", "a b", "--every", "1h", env=env), 2, "is not a tool's name")
    ok(run_cli("schedule", "add", "kv_read", "--input", '{"key": "x"}', "--every", "1h", "--id", "mine", env=env))
    put(env, "schedule:broken", "{not json")
    for taken in ("mine", "broken"):
        one_line_error(run_cli("schedule", "add", "kv_read", "--input", '{"key": "y"}', "--every", "2h", "--id",
                               taken, env=env), 2, f"schedule {taken} exists already", "brainstem schedule rm")
    assert stored(env, "mine")["input"] == {"key": "x"}


@pytest.mark.parametrize("command", ["rm", "pause", "resume", "run"])
def test_an_unknown_or_malformed_id_is_exit_2(env, command):
    one_line_error(run_cli("schedule", command, "nope", env=env), 2, "no schedule 'nope'", "brainstem schedule list")
    one_line_error(run_cli("schedule", command, "a b", env=env), 2, "schedule id 'a b' is not 1-64 letters")


@pytest.mark.parametrize("command", ["pause", "resume", "run"])
def test_a_value_that_is_not_a_schedule_is_exit_2_with_the_way_out(env, command):
    put(env, "schedule:broken", {"tool": "kv_read"})
    line = one_line_error(run_cli("schedule", command, "broken", env=env), 2, "give exactly one of every")
    assert "brainstem kv get schedule:broken" in line and "brainstem schedule rm broken" in line
    assert stored(env, "broken") == {"tool": "kv_read"}


def test_an_edit_waits_for_a_runs_claim_and_then_gives_up_in_one_line(env, monkeypatch):
    from brainstem.state import schedules

    ok(run_cli("schedule", "add", "kv_read", "--input", '{"key": "x"}', "--every", "1h", "--id", "s", env=env))
    monkeypatch.setattr(schedules, "CLAIM_WAIT", 0.2)
    with open_store(env["BRAINSTEM_KV"]) as store:
        assert store.acquire_lease("schedule_claim:s", "otherhost:1:run", 60_000)
        one_line_error(run_cli("schedule", "pause", "s", env=env), 1, "schedule s is being claimed by a run",
                       "try again")
        assert stored(env, "s")["enabled"] is True
        store.release_lease("schedule_claim:s", "otherhost:1:run")
    ok(run_cli("schedule", "pause", "s", env=env))
    with open_store(env["BRAINSTEM_KV"]) as store:
        assert store.lease_owner("schedule_claim:s") is None  # an edit leaves no claim behind


@pytest.mark.parametrize("command", ["add", "list", "rm", "pause", "resume", "run"])
def test_every_command_explains_itself_with_examples(command):
    out = ok(run_cli("schedule", command, "--help"))
    assert "Examples:" in out and f"brainstem schedule {command}" in out


def test_the_group_explains_itself():
    out = ok(run_cli("schedule", "--help"))
    assert "docs/schedules.md" in out and "BRAINSTEM_SCHEDULE_MAX" in out
    assert "brainstem schedule add" in ok(run_cli("--help"))


def test_a_run_now_that_fails_exits_1_and_says_why(env):
    # send_telegram with Telegram not set up: the run fails, naming what to set, and so does the command.
    schedule_id = ok(run_cli("schedule", "add", "send_telegram", "--input", '{"text": "hi"}', "--every", "1h",
                             env=env)).strip()
    r = run_cli("schedule", "run", schedule_id, env=env)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stdout.startswith(f"schedule {schedule_id}: failed") and "BRAINSTEM_TELEGRAM_BOT_TOKEN" in r.stdout
    r = run_cli("schedule", "run", schedule_id, "--json", env=env)
    assert r.returncode == 1 and json.loads(r.stdout)["outcome"] == "failed"

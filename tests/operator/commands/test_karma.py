"""The operator's first hour: reading what the agent did, from the command line.

``karma --follow`` that always stops, ``karma N``, ``sessions --since`` and ``--by-day``, ``changes``,
``tool ls``, ``wakes``, ``history`` of a key not changed yet, ``seed`` that checks its soul file first
and counts truthfully, the throwaway ``demo``, ``--help`` with examples, and shell completion.

Commands run as subprocesses (``python -m brainstem``) against real stores; the sessions they read
are real sessions against the loopback LLM double.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest

from brainstem.core import keys
from brainstem.core.clock import parse_duration
from brainstem.core.errors import ConfigError
from brainstem.daemon.scheduler import record_fire
from brainstem.operator.output import clip
from brainstem.state import history as history_mod
from brainstem.store import open_store, sqlite_path, sqlite_url
from brainstem.store.karma import Karma
from tests.helpers import dead_pid, ok, one_line_error, run_cli
from tests.wake_helpers import finished, history, is_orient, is_reflect, plan, reflection, run_wake, start_wake, think

SQLITE_ONLY = pytest.mark.parametrize("real_store_url", ["sqlite"], indirect=True)


def no_repr(text: str) -> None:
    """Text output never shows a Python dict, list or None."""
    assert "{'" not in text and "['" not in text and "None" not in text, text


def model(summary: str = "a quiet session", orient: str = "plan", think_delay: float = 0.0, **reflect_extra):
    """A responder for the double: a one-think plan (or prose: no plan), "ok" to thinks, a reflection."""
    def respond(req: dict):
        if is_orient(req) or "could not be used as a plan" in req["messages"][-1]["content"]:
            if orient == "garbage":
                return "I would rather not plan today."
            return plan(think("Think once", id="t0", model="haiku", max_tokens=50), next_wake={"sleep_seconds": 900})
        if is_reflect(req):
            return reflection(summary, load_keys=[], **reflect_extra)
        return {"content": "ok", "delay": think_delay} if think_delay else "ok"
    return respond


def a_session(st, env, llm, outcome: str = "clean", **responder) -> str:
    llm.responder = model(**responder)
    sid, _ = finished(run_wake(env, "--force", "--quiet"), st, outcome)
    return sid


def karma_cli(env: dict, *args: str, timeout: float = 30):
    return run_cli("karma", *args, env=env, timeout=timeout)


# --- karma: by number, unknown ids, --follow that always stops ------------------------------------------

def test_karma_by_number_and_follow_of_an_ended_session(st, env, llm):
    sid = a_session(st, env, llm)
    number = sid.split("-")[0]
    by_id = ok(karma_cli(env, sid))
    assert by_id.splitlines()[0] == f"session {sid}" and "session_end" in by_id.splitlines()[-1]
    assert ok(karma_cli(env, number)) == by_id
    assert ok(karma_cli(env, number, "--json")) == ok(karma_cli(env, sid, "--json"))
    # --follow of a session that already ended prints it all and stops at its session_end.
    t0 = time.monotonic()
    followed = ok(karma_cli(env, number, "--follow", timeout=20))
    assert followed == by_id and time.monotonic() - t0 < 15
    assert ok(karma_cli(env, "-f")) == by_id  # the latest session by default


@pytest.mark.parametrize("args", [["99"], ["99", "--follow"], ["7-nosuch"], ["7-nosuch", "-f", "--json"]])
def test_karma_of_a_session_that_does_not_exist_is_exit_2_naming_it(st, env, args):
    line = one_line_error(karma_cli(env, *args, timeout=20), 2)
    assert args[0] in line and "brainstem sessions" in line


def _fake_session(st, sid: str) -> None:
    """The karma a session leaves when it dies mid-way: a start and a step, no end."""
    k = Karma(st, sid)
    k.record("session_start", session_id=sid)
    k.record("step_start", step_id="t0", type="think")


@pytest.mark.parametrize("state", ["no_breadcrumb", "another_session", "lock_holder_gone", "lock_released"])
def test_karma_follow_stops_when_the_session_is_dead(st, env, state):
    sid = "5-dead01"
    _fake_session(st, sid)
    st.put(keys.SESSION_LAST_STARTED, sid)
    here = socket.gethostname()
    breadcrumb = {"id": sid, "started_at": "2026-01-01T00:00:00.000Z", "pid": dead_pid(), "host": here}
    token = None
    if state == "another_session":
        st.put(keys.SESSION_CURRENT, {**breadcrumb, "id": "6-other1"})
    elif state in ("lock_holder_gone", "lock_released"):
        st.put(keys.SESSION_CURRENT, breadcrumb)
    if state == "lock_holder_gone":
        token = f"{here}:{breadcrumb['pid']}:gone"
        assert st.acquire_lease(keys.WAKE_LEASE, token, 60_000)
    try:
        t0 = time.monotonic()
        r = karma_cli(env, "--follow", timeout=30)
        line = one_line_error(r, 1)
        assert time.monotonic() - t0 < 20
        assert sid in line and "died" in line and "crashed" in line, line
        assert r.stdout.splitlines()[0] == f"session {sid}" and "step_start" in r.stdout.splitlines()[-1]
        json_lines = karma_cli(env, "5", "-f", "--json", timeout=30)
        one_line_error(json_lines, 1)
        assert [json.loads(x)["event"] for x in json_lines.stdout.splitlines()] == ["session_start", "step_start"]
    finally:
        if token:
            st.release_lease(keys.WAKE_LEASE, token)


def test_karma_follow_of_a_running_session_stops_when_it_is_killed(st, env, llm):
    llm.responder = model(think_delay=30)
    waker = start_wake(env, "--force", "--quiet")
    follower = None
    try:
        deadline = time.monotonic() + 30
        while st.get(keys.SESSION_CURRENT) is None:
            assert waker.poll() is None and time.monotonic() < deadline, waker.communicate()
            time.sleep(0.05)
        sid = json.loads(st.get(keys.SESSION_CURRENT))["id"]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("BRAINSTEM_", "OPENROUTER_"))}
        full_env.update(env)
        # A process: it keeps following while this test kills the wake.
        follower = subprocess.Popen([sys.executable, "-m", "brainstem", "karma", sid.split("-")[0], "--follow"],
                                    env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # Following the live session: it has printed the session's header and its step_start (click.echo
        # flushes every line), and the session is still stuck in that step.
        followed = [follower.stdout.readline()]
        while followed[-1] and "step_start" not in followed[-1]:
            followed.append(follower.stdout.readline())
        assert follower.poll() is None and waker.poll() is None, followed
        waker.kill()
        waker.wait(10)  # reaped: its pid is gone, as after any SIGKILL
        rest, err = follower.communicate(timeout=20)
        out = "".join(followed) + rest
    finally:
        for p in (waker, follower):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(5)
    assert follower.returncode == 1, (out, err)
    assert f"session {sid} died" in err and "Traceback" not in err
    assert out.splitlines()[0] == f"session {sid}" and "step_start" in out


# --- sessions --since / --by-day -----------------------------------------------------------------------

def _shift(st, sid: str, days: float) -> dict:
    """Move a recorded session ``days`` back in time (as if it had run then)."""
    h = history(st)
    for e in h:
        if e["id"] == sid:
            for f in ("started_at", "ended_at"):
                t = datetime.strptime(e[f], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
                e[f] = (t - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")
    st.delete_log(keys.SESSION_HISTORY)  # rewritten whole, in the old one-list form, which readers still take
    st.put(keys.SESSION_HISTORY, h)
    return {e["id"]: e for e in h}


@SQLITE_ONLY
def test_sessions_since_and_by_day_with_totals(st, env, llm):
    llm.default_cost = 0.002
    old = a_session(st, env, llm)
    a_session(st, env, llm, "no_plan", orient="garbage")
    a_session(st, env, llm, summary="the latest one")
    by_id = _shift(st, old, 10)
    h = history(st)
    recent = h[1:]

    text = ok(run_cli("sessions", "--since", "7d", env=env))
    lines = text.splitlines()
    assert [line.split()[0] for line in lines[1:-1]] == [e["id"] for e in recent]
    total = sum(e["cost"] for e in recent)
    assert total > 0
    assert re.fullmatch(r"2 sessions since \S+Z, \$(\d+\.\d{4}): clean 1, no_plan 1", lines[-1]), lines[-1]
    assert f"${total:.4f}" in lines[-1]
    no_repr(text)

    everything = ok(run_cli("sessions", "--since", by_id[old]["started_at"][:10], env=env)).splitlines()
    assert [line.split()[0] for line in everything[1:-1]] == [e["id"] for e in h]
    assert everything[-1].startswith("3 sessions since ") and everything[-1].endswith(": clean 2, no_plan 1")

    limited = ok(run_cli("sessions", "--since", "30d", "-n", "1", env=env)).splitlines()
    assert [line.split()[0] for line in limited[1:-1]] == [h[-1]["id"]]
    assert limited[-1].startswith("3 sessions since ") and "(showing the last 1)" in limited[-1]

    as_json = json.loads(ok(run_cli("sessions", "--since", "7d", "--json", env=env)))
    assert as_json["sessions"] == recent
    assert as_json["totals"] == {"sessions": 2, "cost": pytest.approx(total), "simulated_cost": 0.0,
                                  "outcomes": {"clean": 1, "no_plan": 1}}
    assert datetime.fromisoformat(as_json["since"].replace("Z", "+00:00")) < datetime.now(timezone.utc)
    assert ok(run_cli("sessions", "--since", "1m", env=env)).strip() != ""
    assert ok(run_cli("sessions", "--since", "2099-01-01", env=env)).strip().startswith("no sessions since 2099-01-01")

    # Per UTC day: the shifted session's day, then today's two, then the total.
    days = ok(run_cli("sessions", "--by-day", env=env)).splitlines()
    old_day, today = by_id[old]["started_at"][:10], h[-1]["started_at"][:10]
    assert days[0].split() == ["DAY", "SESSIONS", "COST", "OUTCOMES"]
    assert days[1].split()[:2] == [old_day, "1"] and days[1].endswith("clean 1")
    assert days[2].split()[:2] == [today, "2"] and days[2].endswith("clean 1, no_plan 1")
    assert days[3].split()[:2] == ["total", "3"] and days[3].endswith("clean 2, no_plan 1")
    assert len({line.index(" clean") for line in days[1:]} | {days[0].index("OUTCOMES") - 1}) == 1  # one column
    by_day = json.loads(ok(run_cli("sessions", "--by-day", "--json", env=env)))
    assert [(d["day"], d["sessions"], d["outcomes"]) for d in by_day["days"]] == [
        (old_day, 1, {"clean": 1}), (today, 2, {"clean": 1, "no_plan": 1})]
    assert by_day["totals"]["sessions"] == 3 and by_day["since"] is None
    week = json.loads(ok(run_cli("sessions", "--by-day", "--since", "1w", "--json", env=env)))
    assert [d["day"] for d in week["days"]] == [today] and week["totals"]["sessions"] == 2

    # The plain listing is unchanged: the last 20, aligned columns, no totals.
    rows = ok(run_cli("sessions", env=env)).splitlines()[1:]
    assert [r.split()[0] for r in rows] == [e["id"] for e in h]
    for word in (" steps", "$"):
        assert len({r.index(word) for r in rows}) == 1, rows
    assert len({r.index(e["outcome"]) for r, e in zip(rows, h, strict=True)}) == 1, rows

    for bad in ("7x", "yesterday", "-3d"):
        line = one_line_error(run_cli("sessions", "--since", bad, env=env), 2)
        assert "--since" in line and "7d" in line


def test_duration_and_since_parsing():
    assert parse_duration("30m", "--since") == 1800 and parse_duration("2w") == 14 * 86400
    assert parse_duration("12h") == 43200 and parse_duration("7d") == 7 * 86400
    now = datetime(2026, 5, 10, 12, tzinfo=timezone.utc)
    assert history_mod.parse_since("7d", now) == datetime(2026, 5, 3, 12, tzinfo=timezone.utc)
    assert history_mod.parse_since("2026-05-01", now) == datetime(2026, 5, 1, tzinfo=timezone.utc)
    with pytest.raises(ConfigError, match="--since"):
        history_mod.parse_since("soon", now)
    entries = [{"id": "1-a", "started_at": "2026-05-01T23:59:00Z", "outcome": "clean", "cost": 0.5},
               {"id": "2-b", "started_at": "2026-05-02T00:01:00Z", "outcome": "crashed", "cost": None},
               {"id": "3-c", "started_at": None, "outcome": "clean", "cost": 0.25}]
    assert history_mod.totals(entries) == {"sessions": 3, "cost": 0.75, "simulated_cost": 0.0,
                                           "outcomes": {"clean": 2, "crashed": 1}}
    entries[2]["simulated_cost"] = 0.25  # answered from a cassette: counted apart too
    assert history_mod.totals(entries)["simulated_cost"] == 0.25
    assert [(d["day"], d["sessions"], d["cost"]) for d in history_mod.by_day(entries)] == [
        ("2026-05-01", 1, 0.5), ("2026-05-02", 1, 0.0), ("unknown", 1, 0.25)]
    assert [e["id"] for e in history_mod.started_since(entries, datetime(2026, 5, 2, tzinfo=timezone.utc))] == ["2-b"]


# --- status: aligned, no reprs ------------------------------------------------------------------------

@SQLITE_ONLY
def test_status_lines_up_its_values(st, env, llm):
    a_session(st, env, llm)
    st.put(keys.SESSION_CURRENT, {"id": "9-gone99", "started_at": None, "pid": dead_pid(),
                                  "host": socket.gethostname()})
    text = ok(run_cli("status", env=env))
    no_repr(text)
    lines = text.splitlines()
    assert len(lines) > 8
    for line in lines:
        assert line[17] == " " and line[18] != " " and line[:17].strip(), line
    died = [line for line in lines if line.startswith("died")][0]
    assert "9-gone99" in died and "at an unknown time" in died


# --- changes: every versioned write across keys --------------------------------------------------------

def test_changes_lists_every_versioned_write_with_who_made_it(st, env, llm):
    assert ok(run_cli("changes", env=env)).strip() == "no changes recorded yet"
    ok(run_cli("kv", "put", "prompt:orient", "# Orient\nBe brief.", env=env))
    ok(run_cli("kv", "put", "notes:x", "not versioned", env=env))
    sid = a_session(st, env, llm, kv_operations=[{"op": "put", "key": "wisdom", "value": "Keep it cheap."}])
    ok(run_cli("rollback", "prompt:orient", env=env))

    found = [json.loads(line) for line in ok(run_cli("changes", "--json", env=env)).splitlines()]
    assert [(c["key"], c["version"], c["who"], c["source"]) for c in found] == [
        ("prompt:orient", 2, "operator", "operator"),
        ("wisdom", 1, sid, "reflect"),
        ("prompt:orient", 3, "operator", "operator:rollback")]
    assert found[1]["session_id"] == sid and found[1]["bytes"] == len("Keep it cheap.")
    assert all("value" not in c for c in found)

    text = ok(run_cli("changes", env=env))
    no_repr(text)
    lines = text.splitlines()
    assert lines[0].split() == ["TIME", "KEY", "VERSION", "WHO", "PATH", "SIZE"]
    assert [line.split()[1:4] for line in lines[1:]] == [["prompt:orient", "v2", "operator"], ["wisdom", "v1", sid],
                                                          ["prompt:orient", "v3", "operator"]]
    assert lines[1].split()[0] == found[0]["at"]
    assert len({line.index(" v") for line in lines[1:]}) == 1

    assert len(ok(run_cli("changes", "--since", "1h", env=env)).splitlines()) == 4
    assert ok(run_cli("changes", "--since", "2099-01-01", env=env)).startswith("no changes recorded since 2099-01-01")
    one_line_error(run_cli("changes", "--since", "lately", env=env), 2)


# --- history of a key with no change yet -----------------------------------------------------------------

@SQLITE_ONLY
def test_history_of_a_versionable_key_not_changed_yet_says_so(st, env):
    out = ok(run_cli("history", "wisdom", env=env)).strip()
    assert out == "no versions recorded yet for wisdom; versions are kept from its first change on"
    assert ok(run_cli("history", "prompt:orient", "--json", env=env)) == ""
    line = one_line_error(run_cli("history", "notes:today", env=env), 2)
    assert "notes:today is not versioned" in line and "prompt:*" in line
    line = one_line_error(run_cli("diff", "wisdom", env=env), 1)
    assert "no versions recorded yet for wisdom" in line
    ok(run_cli("kv", "put", "wisdom", "Be brief.", env=env))
    rows = ok(run_cli("history", "wisdom", env=env)).splitlines()
    assert len(rows) == 1 and rows[0].split()[:2] == ["*", "v1"] and rows[0].endswith("Be brief.")


# --- tool ls ------------------------------------------------------------------------------------------

@SQLITE_ONLY
def test_tool_ls_lists_every_tool_and_flags_invalid_meta(st, env):
    st.put(keys.tool_code("broken"), "def execute(args, ctx):\n    return 1\n")
    st.put(keys.tool_meta("broken"), json.dumps({"timeout_ms": "fast"}))
    st.put(keys.tool_code("garbled"), "def execute(args, ctx):\n    return 1\n")
    st.put(keys.tool_meta("garbled"), "{not json")
    st.put(keys.tool_meta("orphan"), json.dumps({"description": "code went missing"}))
    st.put(keys.tool_code("plain"), "def execute(args, ctx):\n    return 1\n")

    text = ok(run_cli("tool", "ls", env=env))
    no_repr(text)
    lines = text.splitlines()
    assert lines[0].split() == ["NAME", "MODE", "KV", "TIMEOUT", "SECRETS", "DESCRIPTION"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == {"broken", "garbled", "orphan", "plain", "web_fetch", "kv_read", "kv_write",
                         "send_telegram", "check_or_balance", "check_wallet_balance", "topup_openrouter"}
    assert "INVALID" in rows["broken"] and "tool:broken:meta is invalid: timeout_ms" in rows["broken"]
    assert "INVALID" in rows["garbled"] and "not valid JSON" in rows["garbled"]
    assert "INVALID" in rows["orphan"] and "tool:orphan:code is missing" in rows["orphan"]
    assert rows["kv_read"].split()[1:4] == ["automated", "read_all", "5s"]
    assert "OPENROUTER_API_KEY" in rows["check_or_balance"] and rows["plain"].split()[1:5] == ["automated", "none",
                                                                                             "10s", "-"]
    assert rows["send_telegram"].split()[4] == "-"  # it asks the runtime to send: no secret
    assert len({line.index(" automated") for line in lines if " automated" in line}) == 1

    tools = {t["name"]: t for t in map(json.loads, ok(run_cli("tool", "ls", "--json", env=env)).splitlines())}
    assert tools["broken"]["error"] and tools["broken"]["mode"] is None
    assert tools["web_fetch"]["error"] is None and tools["web_fetch"]["timeout_ms"] > 0
    assert tools["check_or_balance"]["secrets"] == \
        json.loads(st.get(keys.tool_meta("check_or_balance")))["secrets"]


# --- wakes: the daemon's wake_log --------------------------------------------------------------------------

@pytest.mark.slow
@SQLITE_ONLY
def test_wakes_reads_the_daemons_wake_log(st, env, llm):
    assert ok(run_cli("wakes", env=env)).startswith("no fires recorded")
    llm.responder = model()
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("BRAINSTEM_", "OPENROUTER_"))}
    full_env.update(env)
    # The daemon, as a process: it runs until this test stops it with SIGTERM.
    daemon = subprocess.Popen([sys.executable, "-m", "brainstem", "run", "--every", "1h"], env=full_env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while st.log_length(keys.WAKE_LOG) == 0:
            assert daemon.poll() is None and time.monotonic() < deadline, daemon.communicate()
            time.sleep(0.1)
        daemon.send_signal(signal.SIGTERM)
        daemon.communicate(timeout=60)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(5)
    sid = history(st)[-1]["id"]
    record_fire(st, {"fire": "skipped", "reason": "locked"})
    record_fire(st, {"fire": "missed", "scheduled": "2026-05-01T10:00:00Z"})
    record_fire(st, {"fire": "error", "error": "config:defaults is invalid"})

    text = ok(run_cli("wakes", env=env))
    no_repr(text)
    lines = text.splitlines()
    assert lines[0].split() == ["TIME", "FIRE", "DETAIL"]
    assert [line.split()[1] for line in lines[1:]] == ["ran", "skipped", "missed", "error"]
    assert f"session {sid}  clean" in lines[1]
    assert "another wake held the lease" in lines[2] and "scheduled 2026-05-01T10:00:00Z" in lines[3]
    assert lines[4].endswith("config:defaults is invalid")
    fires = [json.loads(x) for x in ok(run_cli("wakes", "--json", env=env)).splitlines()]
    assert fires[0]["fire"] == "ran" and fires[0]["session_id"] == sid and fires[0]["outcome"] == "clean"
    last = [json.loads(x) for x in ok(run_cli("wakes", "-n", "1", "--json", env=env)).splitlines()]
    assert last == fires[-1:]
    assert len(ok(run_cli("wakes", "-n", "2", env=env)).splitlines()) == 3


def test_refusals_json_is_one_object_saying_whether_the_code_is_held(tmp_path):
    from brainstem.state import refusals

    env = {"BRAINSTEM_KV": sqlite_url(tmp_path / "r.db")}
    assert ok(run_cli("seed", "--example-soul", env=env))

    def shown() -> dict:
        return json.loads(ok(run_cli("refusals", "--json", env=env)))

    assert shown()["held"] is False
    with open_store(env["BRAINSTEM_KV"]) as store:
        refusals.note(store, "guesser")
    seen = shown()
    assert seen["held"] is True and seen["total"] == 1 and seen["last_tool"] == "guesser"
    ok(run_cli("refusals", "--clear", env=env))
    assert shown()["held"] is False and shown()["total"] == 1


# --- seed ----------------------------------------------------------------------------------------------

@SQLITE_ONLY
def test_seed_checks_the_soul_file_first_and_counts_truthfully(real_store_url, tmp_path):
    env = {"BRAINSTEM_KV": real_store_url}
    db = sqlite_path(real_store_url)
    line = one_line_error(run_cli("seed", "--soul", str(tmp_path / "missing.md"), env=env), 2)
    assert "missing.md" in line
    assert not os.path.exists(db)  # nothing written, not even an empty store
    (tmp_path / "empty.md").write_text("  \n")
    assert "empty" in one_line_error(run_cli("seed", "--soul", str(tmp_path / "empty.md"), env=env), 2)
    assert not os.path.exists(db)

    first = ok(run_cli("seed", "--example-soul", env=env))
    written = int(re.search(r": (\d+) written", first).group(1))
    assert written > 10 and "soul: set" in first
    assert re.search(r": 0 written, \d+ already present", ok(run_cli("seed", env=env)))
    ok(run_cli("kv", "put", "prompt:orient", "mine", env=env))
    forced = ok(run_cli("seed", "--force", env=env))
    assert f": 1 written, {written - 1} unchanged" in forced, forced
    assert f": 0 written, {written} unchanged" in ok(run_cli("seed", "--force", env=env))
    # A missing soul file is refused even when the store already has a soul.
    one_line_error(run_cli("seed", "--soul", str(tmp_path / "missing.md"), env=env), 2)


# --- demo ------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_demo_deletes_its_throwaway_store_unless_kept(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"TMPDIR": str(tmp), "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "xdg")}
    out = ok(run_cli("demo", env=env, timeout=120))
    assert "in a throwaway store, deleted when the demo ends" in out and "outcome=clean" in out
    assert "BRAINSTEM_KV=" not in out and "brainstem demo --keep" in out
    assert not [p for p in tmp.iterdir() if p.name.startswith("brainstem-demo-")]
    keep = tmp_path / "kept"
    out = ok(run_cli("demo", "--keep", str(keep), env=env, timeout=120))
    assert (keep / "demo.db").exists() and f"BRAINSTEM_KV={sqlite_url(keep / 'demo.db')} " in out
    # Its session was answered from a cassette: every sum of its cost says it moved no money.
    kept = {**env, "BRAINSTEM_KV": sqlite_url(keep / "demo.db")}
    with open_store(kept["BRAINSTEM_KV"]) as store:
        cost = history(store)[-1]["cost"]
    row, = ok(run_cli("sessions", env=kept)).splitlines()[1:]
    assert f"${cost:.4f} (simulated)" in row
    total = ok(run_cli("sessions", "--since", "1d", env=kept)).splitlines()[-1]
    assert total.startswith("1 session since ") and f", ${cost:.4f} (simulated): clean 1" in total
    by_day = ok(run_cli("sessions", "--by-day", env=kept)).splitlines()
    assert by_day[-1].split()[:4] == ["total", "1", f"${cost:.4f}", "(simulated)"]
    last = next(ln for ln in ok(run_cli("status", env=kept)).splitlines() if ln.startswith("last session"))
    assert f"${cost:.4f} (simulated)" in last


# --- help and shell completion ---------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["status"], ["sessions"], ["diff"], ["rollback"], ["demo"], ["changes"],
                                  ["wakes"], ["tool"], ["tool", "ls"], ["tool", "run"], ["karma"], ["history"],
                                  ["seed"], ["wake"], ["run"]])
def test_help_has_examples(args):
    out = ok(run_cli(*args, "--help"))
    block = out.split("Examples:", 1)
    assert len(block) == 2, out
    examples = [line for line in block[1].splitlines() if line.strip().startswith("brainstem ")]
    assert examples, out
    assert all(line.startswith("  ") for line in examples)  # kept as written (click's \b), not rewrapped


def test_run_log_format_has_a_help_text():
    out = ok(run_cli("run", "--help"))
    option = out.split("--log-format", 1)[1].split("\n  -", 1)[0]
    assert "JSON" in option and "journald" in option


def test_shell_completion_scripts_and_answers():
    for shell, needle in (("bash", "complete -o nosort -F _brainstem_completion brainstem"),
                          ("zsh", "#compdef brainstem"), ("fish", "complete --no-files --command brainstem")):
        assert needle in ok(run_cli(env={"_BRAINSTEM_COMPLETE": f"{shell}_source"})), shell
    answer = ok(run_cli(env={"_BRAINSTEM_COMPLETE": "bash_complete", "COMP_WORDS": "brainstem wak",
                             "COMP_CWORD": "1"})).splitlines()
    assert answer == ["plain,wake", "plain,wakes"]


@SQLITE_ONLY
def test_sessions_says_why_a_session_without_a_summary_ended(st, env, llm):
    a_session(st, env, llm, "no_plan", orient="garbage")
    a_session(st, env, llm, summary="a good one")
    dead = {"id": "9-dead00", "started_at": "2026-05-01T10:00:00Z", "pid": dead_pid(), "host": "here"}
    history_mod.close_dead_session(st, dead, "crashed", detected_by="wake")
    entries = history(st)
    rows = {r.split()[0]: r for r in ok(run_cli("sessions", env=env)).splitlines()[1:]}
    no_plan, clean = entries[0], entries[1]
    assert rows[clean["id"]].endswith("a good one")
    said = rows[no_plan["id"]].split("s  ")[-1].strip()  # after the duration column
    assert said and said == clip(no_plan.get("reason") or no_plan.get("operator_action")
                                  or f"ended no_plan, no summary (brainstem karma {no_plan['number']})"), rows
    assert rows["9-dead00"].endswith("its process died mid-session (brainstem karma 9)")


def test_wakes_says_asleep_as_the_metrics_do_for_old_and_new_fires(tmp_path):
    from brainstem.operator.metrics import WAKE_RESULTS

    env = {"BRAINSTEM_KV": sqlite_url(tmp_path / "s.db")}
    with open_store(env["BRAINSTEM_KV"]) as store:
        record_fire(store, {"fire": "slept", "until": "2026-05-01T10:00:00Z"})  # as daemons before it wrote
        record_fire(store, {"fire": "asleep", "until": "2026-05-01T11:00:00Z"})
    lines = ok(run_cli("wakes", env=env)).splitlines()[1:]
    assert [line.split()[1:] for line in lines] == [["asleep", "asleep", "until", "2026-05-01T10:00:00Z"],
                                                   ["asleep", "asleep", "until", "2026-05-01T11:00:00Z"]]
    fires = [json.loads(x)["fire"] for x in ok(run_cli("wakes", "--json", env=env)).splitlines()]
    assert fires == ["asleep", "asleep"] and WAKE_RESULTS["asleep"] == "asleep" and "slept" not in WAKE_RESULTS

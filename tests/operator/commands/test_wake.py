"""The operator's commands: ``status``, ``sessions``, ``karma --follow``, ``demo``, and ``wake``'s
``--llm-cassette``, ``--quiet`` and ``--log-format``, plus the live progress display.

Commands run as subprocesses (``python -m brainstem``) against real stores;
the sessions they report on are run in-process by :func:`brainstem.session.wake.wake`
against the LLM double (faster than a subprocess, and the same code).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from brainstem.core import keys
from brainstem.core.settings import load_settings
from brainstem.operator.progress import listener
from brainstem.session.wake import wake
from brainstem.state import inbox
from brainstem.state.seed import seed
from brainstem.store import karma, open_store
from tests.doubles import LLMDouble
from tests.helpers import ok, redis_unavailable, run_cli, unique_prefix
from tests.wake_helpers import (
    events_of,
    history,
    is_deep,
    is_orient,
    is_reflect,
    plan,
    reflection,
    seeded,
    set_defaults,
    start_wake,
    think,
    wake_env,
)

DEEP_ANSWER = json.dumps({"reflection": "fine", "note_to_future_self": "carry on"})


def model(orient="plan", think_delay: float = 0.0, steps: int = 1):
    """A responder. ``orient``: "plan" (``steps`` think steps) or "garbage" (no usable plan)."""
    def respond(req: dict):
        if is_orient(req) or "could not be used as a plan" in req["messages"][-1]["content"]:
            if orient == "garbage":
                return "I would rather not plan today."
            return plan(*[think(f"Think {i}", id=f"t{i}", model="haiku", max_tokens=50) for i in range(steps)],
                        next_wake={"sleep_seconds": 900})
        if is_reflect(req):
            return reflection("a quiet session", load_keys=[])
        if is_deep(req):
            return DEEP_ANSWER
        return {"content": "ok", "delay": think_delay} if think_delay else "ok"
    return respond


def session(url: str, llm: LLMDouble, **responder) -> str:
    """One forced session, in-process, against the double; returns its outcome."""
    llm.responder = model(**responder)
    settings = load_settings(kv=url, openrouter_base_url=llm.base_url, openrouter_api_key="sk-test",
                             llm_backoff=0.01)
    store = open_store(url)
    try:
        return wake(settings, store, force=True).outcome
    finally:
        store.close()


def cli_env(url: str, **extra) -> dict[str, str]:
    return {"BRAINSTEM_KV": url, **{k: str(v) for k, v in extra.items()}}


def status_json(url: str, **extra) -> dict:
    return json.loads(ok(run_cli("status", "--json", env=cli_env(url, **extra))))


def event_of(line: str) -> str:
    """The event name in a timeline line (``03:04:05.678 +   0.25s  session_start  ...``)."""
    m = re.search(r"\d\d:\d\d:\d\d\.\d{3} \+\s*[\d.]+s\s+(\S+)", line)
    assert m, line
    return m.group(1)


def field(text: str, label: str) -> str:
    """The value printed after ``label`` in ``brainstem status`` text."""
    for line in text.splitlines():
        if line.startswith(label + " "):
            return line[len(label):].strip()
    raise AssertionError(f"no {label!r} line in:\n{text}")


# --- status ----------------------------------------------------------------------

def test_status_of_a_store_with_no_agent(real_store_url):
    st = status_json(real_store_url)
    assert st["soul_present"] is False
    assert st["sessions"] == 0 and st["last_session"] is None and st["running"] is None
    assert st["next_wake_after"] is None and st["asleep"] is False
    assert st["cost_today"] == 0 and st["failing_in_a_row"] == 0
    assert st["balances_last_seen"] is None
    text = ok(run_cli("status", env=cli_env(real_store_url)))
    assert field(text, "soul").startswith("MISSING") and "brainstem seed" in field(text, "soul")
    assert field(text, "next wake") == "due now"
    assert "last session" not in text


def test_status_reports_where_the_agent_stands(real_store_url, llm):
    store = seeded(real_store_url)
    set_defaults(store, deep_reflect={"default_interval_sessions": 4})
    llm.default_cost = 0.001
    llm.credit = 7.25
    env = {"BRAINSTEM_MAX_DAILY_COST": "2.5", "BRAINSTEM_MAX_SESSION_COST": "0.4"}

    assert session(real_store_url, llm) == "clean"
    st = status_json(real_store_url, **env)
    h = history(store)
    assert st["soul_present"] is True and st["sessions"] == 1
    assert st["last_session"]["id"] == h[-1]["id"] and st["last_session"]["outcome"] == "clean"
    assert st["cost_today"] == pytest.approx(h[-1]["cost"]) and st["cost_today"] > 0
    assert st["daily_ceiling"] == 2.5 and st["session_ceiling"] == 0.4
    assert st["balances_last_seen"]["balances"] == {"openrouter": 7.25, "wallet_usdc": None}
    assert st["next_wake_after"] == store.get_json(keys.WAKE_CONFIG)["next_wake_after"] and st["asleep"] is True
    assert st["deep_reflection_due_next_wake"] is False
    assert st["failing_in_a_row"] == 0 and st["running"] is None and st["config_problems"] is None

    # Two sessions with no usable plan: failing in a row, and the fourth session is a deep reflection.
    assert session(real_store_url, llm, orient="garbage") == "no_plan"
    assert session(real_store_url, llm, orient="garbage") == "no_plan"
    st = status_json(real_store_url, **env)
    h = history(store)
    assert st["sessions"] == 3 and st["last_session"]["id"] == h[-1]["id"]
    assert st["last_session"]["outcome"] == "no_plan"
    assert st["failing_in_a_row"] == 2
    assert st["cost_today"] == pytest.approx(sum(x["cost"] for x in h))
    assert st["deep_reflection_due_next_wake"] is True

    text = ok(run_cli("status", env=cli_env(real_store_url, **env)))
    assert field(text, "soul") == "present"
    assert field(text, "sessions") == "3"
    assert field(text, "last session").split()[:2] == [h[-1]["id"], "no_plan"]
    assert field(text, "failing in a row") == "2"
    assert field(text, "spent today") == f"${st['cost_today']:.4f} of $2.50 (per session at most $0.40)"
    assert field(text, "balances").startswith("LLM credit $7.25, wallet USDC unknown (as of ")
    assert field(text, "next wake") == f"{st['next_wake_after']} (asleep)"
    assert field(text, "deep reflection").startswith("due at next wake")
    assert "running now" not in text

    # A wake holding the lock shows as running.
    assert store.acquire_lease(keys.WAKE_LEASE, "otherhost:4242:abc", 60_000)
    try:
        st = status_json(real_store_url)
        assert st["running"]["state"] == "locked"
        assert st["running"]["lease_holder"] == st["running"]["lock_holder"] == "otherhost:4242:abc"
        assert "otherhost:4242:abc" in field(ok(run_cli("status", env=cli_env(real_store_url))), "running now")
    finally:
        store.release_lease(keys.WAKE_LEASE, "otherhost:4242:abc")
    store.close()


@pytest.fixture(scope="module")
def password_redis(tmp_path_factory):
    """A redis-server that needs a password: (port, password)."""
    from tests.redis_server import RedisServerError, start_redis_server, stop

    password = "s3cret-pw-0451"
    try:
        proc, port = start_redis_server(tmp_path_factory.mktemp("pwredis"), password=password)
    except RedisServerError as exc:
        redis_unavailable(exc)
    yield port, password
    stop(proc)


@pytest.mark.redis
@pytest.mark.parametrize("real_store_url", ["sqlite"], indirect=True)
def test_a_generic_servers_credit_is_not_offered_and_never_asked_for(real_store_url, llm):
    """The same double named by BRAINSTEM_LLM_BASE_URL is a generic server: no GET of /key or /credits,
    not even by the agent's own checker, and its credit is "not offered by this server", not "unknown"."""
    store = seeded(real_store_url)
    seed(store, with_providers=True)  # the agent's own credit checker too, which would ask /key
    llm.credit = 7.25
    llm.responder = model()
    env = {"BRAINSTEM_KV": real_store_url, "BRAINSTEM_LLM_BASE_URL": llm.base_url, "BRAINSTEM_LLM_API_KEY": "sk-t",
           "BRAINSTEM_LLM_BACKOFF": "0.01", "BRAINSTEM_TOOL_SECRETS": "BRAINSTEM_LLM_API_KEY"}
    r = run_cli("wake", "--force", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert llm.get_requests == [] and llm.requests  # chat only
    assert field(ok(run_cli("status", env=env)), "balances").startswith(
        "LLM credit not offered by this server, wallet USDC unknown (as of ")
    st = json.loads(ok(run_cli("status", "--json", env=env)))
    assert st["llm_server"] == "generic" and st["balances_last_seen"]["not_offered"] == ["openrouter"]
    # Named by its older name, the same server is taken for OpenRouter: its credit is read.
    env["OPENROUTER_BASE_URL"] = env.pop("BRAINSTEM_LLM_BASE_URL")
    assert run_cli("wake", "--force", env=env).returncode == 0
    assert [p for p, _ in llm.get_requests][:1] == ["/api/v1/key"]
    assert field(ok(run_cli("status", env=env)), "balances").startswith("LLM credit $7.25")
    assert json.loads(ok(run_cli("status", "--json", env=env)))["llm_server"] == "openrouter"


def test_status_never_prints_the_store_password(password_redis):
    port, password = password_redis
    for url in (f"redis://:{password}@127.0.0.1:{port}/0", f"redis://default:{password}@127.0.0.1:{port}/0"):
        seeded(url + f"?prefix={unique_prefix()}").close()
        text = ok(run_cli("status", env=cli_env(url)))
        assert field(text, "store") == f"redis://***@127.0.0.1:{port}/0", text
        st = json.loads(ok(run_cli("status", "--json", env=cli_env(url))))
        assert st["store"] == f"redis://***@127.0.0.1:{port}/0"
        r = run_cli("status", env=cli_env(url.replace(password, "wrong-pw-9933")))
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        for out in (text, json.dumps(st), r.stdout, r.stderr):
            assert password not in out and "wrong-pw-9933" not in out


# --- sessions --------------------------------------------------------------------

def test_sessions_lists_history_newest_last(real_store_url, llm):
    empty = run_cli("sessions", env=cli_env(real_store_url))
    assert ok(empty).strip() == "no sessions yet"
    assert ok(run_cli("sessions", "--json", env=cli_env(real_store_url))) == ""

    store = seeded(real_store_url)
    llm.default_cost = 0.002
    outcomes = [session(real_store_url, llm), session(real_store_url, llm, orient="garbage"),
                session(real_store_url, llm)]
    assert outcomes == ["clean", "no_plan", "clean"]
    h = history(store)

    header, *rows = ok(run_cli("sessions", env=cli_env(real_store_url))).splitlines()
    assert header.split() == ["SESSION", "STARTED", "OUTCOME", "STEPS", "COST", "DURATION", "SUMMARY"]
    assert [r.split()[0] for r in rows] == [x["id"] for x in h]
    for row, entry in zip(rows, h, strict=True):
        assert row.split()[1:3] == [entry["started_at"], entry["outcome"]], row
        assert f"{entry['steps']} steps" in row and f"${entry['cost']:.4f}" in row
    assert "a quiet session" in rows[0] and "a quiet session" not in rows[1]  # the reflection's summary

    last_two = ok(run_cli("sessions", "-n", "2", env=cli_env(real_store_url))).splitlines()[1:]
    assert [r.split()[0] for r in last_two] == [x["id"] for x in h[-2:]]

    as_json = [json.loads(line) for line in ok(run_cli("sessions", "--json", env=cli_env(real_store_url))).splitlines()]
    assert as_json == h
    one = ok(run_cli("sessions", "--json", "--limit", "1", env=cli_env(real_store_url))).splitlines()
    assert [json.loads(line) for line in one] == h[-1:]

    bad = run_cli("sessions", "-n", "0", env=cli_env(real_store_url))
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    store.close()


# --- karma --follow ---------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.redis
def test_karma_follow_prints_a_running_session_and_exits_at_its_end(redis_url, llm):
    url = f"{redis_url}?prefix={unique_prefix()}"
    store = seeded(url)
    llm.responder = model(steps=3, think_delay=0.6)
    waker = start_wake(wake_env(url, llm), "--force", "--quiet")
    try:
        deadline = time.monotonic() + 30
        while store.get(keys.SESSION_CURRENT) is None or karma.latest_session_id(store) is None:
            assert waker.poll() is None and time.monotonic() < deadline, waker.communicate()
            time.sleep(0.05)
        sid = karma.latest_session_id(store)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("BRAINSTEM_", "OPENROUTER_"))}
        env["BRAINSTEM_KV"] = url
        # Processes: two followers at once, alongside the running wake.
        followers = [subprocess.Popen([sys.executable, "-m", "brainstem", "karma", *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for args in (["--follow"], [sid, "--json", "-f"])]
        time.sleep(0.5)
        assert waker.poll() is None  # they started while the session was running
        out, err = waker.communicate(timeout=60)
        assert waker.returncode == 0, err
        ended = time.monotonic()
        results = []
        for f in followers:
            fout, ferr = f.communicate(timeout=30)
            assert f.returncode == 0, ferr
            results.append(fout)
        assert time.monotonic() - ended < 10  # they stopped by themselves at session_end
    finally:
        if waker.poll() is None:
            waker.kill()
            waker.wait(5)

    recorded = karma.read(store, sid)
    assert recorded[-1]["event"] == "session_end" and recorded[-1]["outcome"] == "clean"
    text = results[0].splitlines()
    assert text[0] == f"session {sid}"
    assert len(text) == 1 + len(recorded)
    assert [event_of(line) for line in text[1:]] == [e["event"] for e in recorded]
    assert "session_end" in text[-1] and "outcome=clean" in text[-1]
    assert [json.loads(line) for line in results[1].splitlines()] == recorded
    store.close()


# --- demo -------------------------------------------------------------------------

class ConnectionCounter:
    """A loopback TCP listener that counts (and drops) every connection made to it."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self):
        self.sock.close()


@pytest.mark.slow
def test_demo_runs_a_whole_session_offline_without_a_key(tmp_path):
    listener_ = ConnectionCounter()
    try:
        for base in ("http://127.0.0.1:9/api/v1", f"http://127.0.0.1:{listener_.port}/api/v1"):
            keep = tmp_path / f"demo{base.rsplit(':', 1)[1].split('/')[0]}"
            r = run_cli("demo", "--keep", str(keep), env={"OPENROUTER_BASE_URL": base, "HOME": str(tmp_path),
                                                          "XDG_DATA_HOME": str(tmp_path / "xdg")})
            out = ok(r)
            assert r.stderr == ""
            assert "no network, no API key" in out
            events = [event_of(line) for line in out.splitlines() if re.match(r"^  \d\d:\d\d:\d\d\.\d{3} ", line)]
            assert events[0] == "session_start" and events[-1] == "session_end", events
            for name in ("ground_truth", "plan", "tool_complete", "step_complete", "llm_call", "reflect"):
                assert name in events, (name, events)
            calls = [line for line in out.splitlines() if " llm_call " in line]
            assert calls and all("tier=cassette" in line for line in calls)
            # The agent step: the model calls kv_read, sees the note, answers.
            agent_turns = [line for line in calls if "purpose=agent" in line]
            assert len(agent_turns) == 2 and "calls=kv_read(" in agent_turns[0]
            assert "stored_as=found result=I wrote down that I woke up" in out
            # ...answering the operator's message, which orient was shown and which is read afterwards.
            assert 'left it a message, as `brainstem tell "What did you write down?' in out
            assert "inbox_shown" in events and "inbox_read" in events
            # ...and the reply step answers it, no model call, the reply kept with the message.
            assert [line for line in out.splitlines() if " step_start " in line and "type=reply" in line]
            (replied,) = [line for line in out.splitlines() if " inbox_reply " in line]
            assert "to=1 from=operator" in replied and "text=I wrote down that I woke up" in replied
            assert ("its reply to your message, after reading its store with a tool (a reply step; brainstem inbox "
                    "shows it under your message): I wrote down") in out
            assert "your message is read" in out
            end = [line for line in out.splitlines() if " session_end " in line][0]
            assert "outcome=clean" in end
            assert "what it wrote to its memory (last_reflect): First session" in out
            # What it printed is what it stored.
            store = open_store(f"sqlite:///{keep / 'demo.db'}", prefix="")
            assert [x["outcome"] for x in history(store)] == ["clean"]
            (asked, _notice) = inbox.messages(store)
            assert [r["text"] for r in asked["replies"]] == [
                "I wrote down that I woke up for the first time; I have no wisdom of my own yet."]
            assert asked["replies"][0]["session_id"] == history(store)[0]["id"]
            # A scheduled action, run once without a session: no model call, its notice in the inbox.
            ran = re.search(r"  ok, \$0\.0000, no model call; its karma: brainstem karma (sched-hourly-look-\S+)", out)
            assert ran, out
            (run,) = [e for e in karma.read(store, ran.group(1)) if e["event"] == "schedule_run"]
            assert run["outcome"] == "ok" and run["id"] == "hourly-look" and run["cost"] == 0
            assert not [e for e in karma.read(store, ran.group(1)) if e["event"] == "llm_call"]
            assert "schedule hourly-look: kv_read" in inbox.messages(store)[-1]["text"]
            store.close()
        assert listener_.connections == 0  # an operator's OPENROUTER_BASE_URL is not contacted
    finally:
        listener_.close()
    assert not (tmp_path / "xdg").exists()  # nothing written to the operator's own store


# --- wake --llm-cassette -----------------------------------------------------------

@pytest.fixture
def cassette_store(real_store_url):
    store = seeded(real_store_url)
    yield real_store_url, store
    store.close()


def test_cassette_that_runs_out_is_a_recorded_provider_failure(cassette_store, tmp_path):
    url, store = cassette_store
    cassette = tmp_path / "short.json"
    cassette.write_text(json.dumps({"answers": [
        {"expect": "# Orient", "content": plan(think("Say hi", id="hi"), next_wake={"sleep_seconds": 900})}]}))
    r = run_cli("wake", "--force", "--quiet", "--llm-cassette", str(cassette), env={"BRAINSTEM_KV": url})
    out = ok(r)
    assert len(out.splitlines()) == 1 and out.startswith("session ")
    sid = karma.latest_session_id(store)
    entries = karma.read(store, sid)
    orient = [e for e in events_of(entries, "llm_call") if e["purpose"] == "orient"]
    assert len(orient) == 1 and orient[0]["tier"] == "cassette"
    fallbacks = events_of(entries, "provider_fallback")
    assert fallbacks and all(f["tier"] == "cassette" and "ran out of answers" in f["error"] for f in fallbacks)
    assert {f["purpose"] for f in fallbacks} >= {"think", "reflect"}
    assert events_of(entries, "step_failed")
    end = entries[-1]
    assert end["event"] == "session_end" and isinstance(end.get("outcome"), str) and end["outcome"]
    assert [x["outcome"] for x in history(store) if x["id"] == sid] == [end["outcome"]]
    assert store.get(keys.SESSION_CURRENT) is None


def test_cassette_that_is_not_json_is_refused_with_one_line(cassette_store, tmp_path):
    url, store = cassette_store
    for name, text in (("broken.json", "{not json"), ("shape.json", json.dumps({"answers": "nope"}))):
        bad = tmp_path / name
        bad.write_text(text)
        r = run_cli("wake", "--force", "--llm-cassette", str(bad), env={"BRAINSTEM_KV": url})
        assert r.returncode != 0 and r.stdout == ""
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("brainstem: error: cassette ") and name in lines[0], r.stderr
    assert karma.latest_session_id(store) is None  # no session was started
    assert store.get(keys.WAKE_CONFIG) is None


# --- wake output formats ------------------------------------------------------------

@pytest.fixture(scope="module")
def json_wake(redis_url):
    """One ``wake --log-format json`` run: (stdout lines, karma entries of its session)."""
    url = f"{redis_url}?prefix={unique_prefix()}"
    store = seeded(url)
    with LLMDouble(responder=model(steps=2)) as llm:
        r = run_cli("wake", "--force", "--log-format", "json", env=wake_env(url, llm))
    assert r.returncode == 0, r.stderr
    entries = karma.read(store, karma.latest_session_id(store))
    store.close()
    return r.stdout.splitlines(), entries


@pytest.mark.redis
def test_log_format_json_prints_each_karma_entry_as_json(json_wake):
    lines, entries = json_wake
    parsed = [json.loads(line) for line in lines[:len(entries)]]
    assert parsed == entries
    assert all(isinstance(p.get("event"), str) for p in parsed)
    assert parsed[0]["event"] == "session_start" and parsed[-1]["event"] == "session_end"


@pytest.mark.redis
def test_log_format_json_every_stdout_line_is_json(json_wake):
    lines, entries = json_wake
    for line in lines:
        assert isinstance(json.loads(line).get("event"), str), line
    assert len(lines) == len(entries) + 1  # the karma entries, then the closing summary
    summary = json.loads(lines[-1])
    assert summary["outcome"] == "clean" and summary["session_id"] == entries[0]["session_id"], summary


def test_quiet_prints_one_line_and_text_progress_otherwise(cassette_store, llm):
    url, store = cassette_store
    llm.responder = model(steps=2)
    env = wake_env(url, llm)
    quiet = run_cli("wake", "--force", "--quiet", env=env)
    out = ok(quiet)
    assert quiet.stderr == ""
    lines = out.splitlines()
    assert len(lines) == 1
    assert re.fullmatch(r"session \S+: clean, \$\d+\.\d{4}, 2 steps; next wake \S+Z", lines[0]), lines[0]
    assert lines[0].split()[1].rstrip(":") == history(store)[-1]["id"]

    loud = ok(run_cli("wake", "--force", env=env)).splitlines()
    sid = history(store)[-1]["id"]
    entries = karma.read(store, sid)
    assert len(loud) == len(entries) + 1  # each event as it happens, then the summary
    assert [event_of(line) for line in loud[:-1]] == [e["event"] for e in entries]
    assert not any(line.startswith("[step") for line in loud)  # not a terminal: plain log lines
    assert loud[-1].startswith(f"session {sid}: clean")


# --- live progress on a terminal ------------------------------------------------------

def test_tty_progress_shows_step_of_the_plan_and_spend_against_budget():
    lines: list[str] = []
    on_entry = listener("text", lines.append, tty=True)
    t = "2026-01-02T03:04:05.678Z"
    on_entry({"t": t, "elapsed_ms": 0, "event": "session_start", "session_id": "7-abc",
              "budget": {"max_cost": 0.1, "max_steps": 12, "spent": 0}})
    on_entry({"t": t, "elapsed_ms": 10, "event": "llm_call", "purpose": "orient", "cost": 0.0125})
    on_entry({"t": t, "elapsed_ms": 20, "event": "plan", "steps": 3})
    # step_start carries the step budget (12) as max_steps; the counter shows the plan's 3 steps instead.
    on_entry({"t": t, "elapsed_ms": 30, "event": "step_start", "step_id": "a", "type": "think",
              "step_number": 1, "max_steps": 12})
    on_entry({"t": t, "elapsed_ms": 40, "event": "llm_call", "purpose": "think", "cost": 0.0025})
    on_entry({"t": t, "elapsed_ms": 50, "event": "step_start", "step_id": "b", "type": "think",
              "step_number": 2, "max_steps": 12})
    on_entry({"t": t, "elapsed_ms": 60, "event": "session_end", "outcome": "clean", "cost": 0.015})
    assert lines[0].startswith("[step 0 $0.0000/$0.10] ") and "session_start" in lines[0]
    assert lines[1].startswith("[step 0 $0.0125/$0.10] ") and "llm_call" in lines[1]
    assert lines[2].startswith("[step 0/3 $0.0125/$0.10] ") and "plan" in lines[2]
    assert lines[3].startswith("[step 1/3 $0.0125/$0.10] ") and "step_id=a" in lines[3]
    assert lines[4].startswith("[step 1/3 $0.0150/$0.10] ")
    assert lines[5].startswith("[step 2/3 $0.0150/$0.10] ")
    assert lines[6].startswith("[step 2/3 $0.0150/$0.10] ") and "outcome=clean" in lines[6]
    assert not any("/12" in line for line in lines)
    # A conditional's or subplan's steps run past the plan's count: said so, never "5/3".
    on_entry({"t": t, "elapsed_ms": 70, "event": "step_start", "step_id": "c", "type": "think",
              "step_number": 5, "max_steps": 12})
    assert lines[7].startswith("[step 5, 3 planned $0.0150/$0.10] ")
    assert all("03:04:05" not in line for line in lines)  # the clock gives way to the step counter

    plain: list[str] = []
    off = listener("text", plain.append, tty=False)
    off({"t": t, "elapsed_ms": 0, "event": "session_start", "session_id": "7-abc"})
    assert plain[0].startswith("03:04:05.678") and "[step" not in plain[0]
    as_json: list[str] = []
    listener("json", as_json.append, tty=True)({"t": t, "event": "plan", "steps": 3})
    assert json.loads(as_json[0]) == {"t": t, "event": "plan", "steps": 3}

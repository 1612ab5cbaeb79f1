"""The offline loop: every command that can call a model answers from a cassette with ``--llm-cassette``,
and a cassette's answers are simulated spend (in the session's budget and karma, never in today's).

Real stores (SQLite on disk; Redis too where a wake runs against the LLM double), the CLI in-process
as an operator runs it, ``brainstem run`` as a process; no API key anywhere unless a test gives one.
"""

from __future__ import annotations

import json

import pytest

from brainstem.core import keys
from brainstem.core.settings import load_settings
from brainstem.operator.demo import CASSETTE
from brainstem.state import history as session_history
from brainstem.state.budget import today
from brainstem.store import karma, open_store
from tests.dashboard_client import app_for, client
from tests.helpers import clean_env, ok, run_cli, wait_for
from tests.wake_helpers import answers, plan, reflection, run_wake, seeded, think, wake_env


@pytest.fixture
def store(url):
    s = seeded(url)
    yield s
    s.close()


def cli(url: str, *args: str, **env: str):
    return run_cli(*args, env={"BRAINSTEM_KV": url, **env})


def llm_calls(store, sid: str) -> list[dict]:
    return [e for e in karma.read(store, sid) if e.get("event") == "llm_call"]


def last_session(store) -> dict:
    return session_history.read(store)[-1]


def spent_today(store) -> float:
    rec = store.get_json(keys.DAILY_COST, default=None)
    return float(rec["usd"]) if isinstance(rec, dict) and rec.get("date") == today() else 0.0


# --- wake, without a key ---------------------------------------------------------------------

def test_wake_force_from_a_cassette_needs_no_key_and_spends_nothing_today(url, store):
    summary = ok(cli(url, "wake", "--force", "--quiet", "--llm-cassette", str(CASSETTE)))
    h = last_session(store)
    assert h["outcome"] == "clean" and h["cost"] > 0
    assert f"clean, ${h['cost']:.4f} (simulated), " in summary, summary  # the line cron mails says so too
    calls = llm_calls(store, h["id"])
    assert calls and all(c["tier"] == "cassette" and c["simulated"] is True and c["cost"] > 0 for c in calls)
    # The session's cost is still the sum of its calls; it is all simulated, and none of it is today's.
    assert h["simulated_cost"] == pytest.approx(h["cost"]) == pytest.approx(sum(c["cost"] for c in calls))
    assert spent_today(store) == 0
    assert store.get_json(keys.DAILY_SIMULATED_COST)["usd"] == pytest.approx(h["cost"])
    end = karma.read(store, h["id"])[-1]
    assert end["event"] == "session_end" and end["simulated_cost"] == pytest.approx(h["cost"])

    status = json.loads(ok(cli(url, "status", "--json")))
    assert status["cost_today"] == 0 and status["simulated_cost_today"] == pytest.approx(h["cost"])
    line = next(x for x in ok(cli(url, "status")).splitlines() if x.startswith("spent today"))
    assert f"$0.0000 of $5.00 (+${h['cost']:.4f} simulated, from cassettes)" in line, line
    row = next(x for x in ok(cli(url, "sessions")).splitlines() if x.startswith(h["id"]))
    assert "(simulated)" in row, row


def test_dry_run_from_a_cassette_needs_no_key_and_changes_nothing_but_its_karma(url, store):
    before = store.get(keys.WAKE_CONFIG)
    out = ok(cli(url, "wake", "--dry-run", "--quiet", "--llm-cassette", str(CASSETTE)))
    sid = out.split()[2].rstrip(":")
    assert out.startswith("dry run dry-") and ": clean," in out, out
    calls = llm_calls(store, sid)
    assert calls and all(c["simulated"] is True for c in calls)
    assert store.get(keys.WAKE_CONFIG) == before and session_history.read(store) == []
    assert spent_today(store) == 0
    assert store.get_json(keys.DAILY_SIMULATED_COST)["usd"] == pytest.approx(sum(c["cost"] for c in calls))


@pytest.mark.parametrize("args", [["wake", "--force"], ["wake", "--dry-run"]])
def test_no_key_and_no_cassette_names_both_ways_out(url, store, args):
    r = cli(url, *args)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "BRAINSTEM_LLM_API_KEY" in lines[0] and "--llm-cassette FILE" in lines[0], lines[0]
    assert session_history.read(store) == []


def test_replay_live_answers_from_a_cassette_without_a_key(url, store):
    ok(cli(url, "wake", "--force", "--quiet", "--llm-cassette", str(CASSETTE)))
    orient = store.get(keys.PROMPT_ORIENT)
    store.put(keys.PROMPT_ORIENT, orient + "\nKeep every plan short.\n")
    changed = cli(url, "replay", "1")
    assert changed.returncode == 1 and "changed_request" in changed.stdout, changed.stdout
    no_key = cli(url, "replay", "1", "--live")
    assert no_key.returncode == 2 and "--llm-cassette FILE" in no_key.stderr, no_key.stderr
    r = cli(url, "replay", "1", "--live", "--llm-cassette", str(CASSETTE))
    assert r.returncode in (0, 1), r.stdout + r.stderr
    kept = r.stdout.split("karma is kept as ")[1].split()[0]
    calls = llm_calls(store, kept)
    assert calls and all(c["simulated"] is True for c in calls)
    assert spent_today(store) == 0
    wrong = cli(url, "replay", "1", "--llm-cassette", str(CASSETTE))
    assert wrong.returncode == 2 and wrong.stderr.strip().splitlines() == [
        "brainstem: error: --llm-cassette answers a replay's live calls: add --live"], wrong.stderr


# --- the demo's cassette, kept --------------------------------------------------------------

def test_demo_keep_leaves_a_cassette_that_drives_the_kept_store(tmp_path):
    keep = tmp_path / "demo"
    out = ok(run_cli("demo", "--keep", str(keep)))
    kept = keep / "cassette.json"
    assert kept.read_text() == CASSETTE.read_text()
    url = f"sqlite:///{keep.resolve() / 'demo.db'}"
    hint = f"BRAINSTEM_KV={url} brainstem wake --force --llm-cassette {kept.resolve()}"
    assert hint in out, out
    # The next session starts from the cassette's first answer again: a provider of its own.
    ok(cli(url, "wake", "--force", "--quiet", "--llm-cassette", str(kept)))
    store = open_store(url)
    try:
        h = session_history.read(store)
        assert [x["outcome"] for x in h] == ["clean", "clean"]
        assert spent_today(store) == 0
        assert store.get_json(keys.DAILY_SIMULATED_COST)["usd"] == pytest.approx(sum(x["cost"] for x in h))
    finally:
        store.close()


def test_the_demo_replays_the_same_and_its_cassette_answers_a_changed_prompt(tmp_path):
    """The README's offline loop: the demo's session (a message read, an agent step, reflection) replays
    the same on the unchanged agent; after an edit of the orient prompt, plain replay shows the diff and
    the kept cassette answers the changed calls in their places."""
    keep = tmp_path / "demo"
    ok(run_cli("demo", "--keep", str(keep)))
    url = f"sqlite:///{keep.resolve() / 'demo.db'}"
    cassette = str(keep / "cassette.json")
    r = cli(url, "replay", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "result: same behaviour" in r.stdout and "0 live, 0 changed request" in r.stdout, r.stdout
    r = cli(url, "replay", "1", "--live", "--llm-cassette", cassette)
    assert r.returncode == 0 and "result: same behaviour" in r.stdout, r.stdout + r.stderr
    store = open_store(url)
    try:
        store.put(keys.PROMPT_ORIENT, store.get(keys.PROMPT_ORIENT) + "\nKeep every plan short.\n")
    finally:
        store.close()
    r = cli(url, "replay", "1")
    assert r.returncode == 1 and "changed request: orient" in r.stdout, r.stdout
    assert "+Keep every plan short." in r.stdout and "--- recorded" in r.stdout, r.stdout
    report = json.loads(cli(url, "replay", "1", "--live", "--llm-cassette", cassette, "--json").stdout)
    assert report["plan"]["same"] and all(s["same"] for s in report["steps"]), report["differs"]
    assert report["reflection"]["same"], report["reflection"]  # the cassette's reflect answer, in its place
    assert report["answers"]["live"] >= 1 and report["answers"]["changed_request"] == 0, report["answers"]
    assert [d["purpose"] for d in report["requests"]][0] == "orient"


# --- honest spend ----------------------------------------------------------------------------

def test_cassette_sessions_are_not_held_against_todays_ceiling(url, store):
    store.settle_spend(today(), None, 0.05)  # real money spent today: the ceiling is reached
    ok(cli(url, "wake", "--force", "--quiet", "--llm-cassette", str(CASSETTE), BRAINSTEM_MAX_DAILY_COST="0.05"))
    h = last_session(store)
    assert h["outcome"] == "clean", h
    assert spent_today(store) == pytest.approx(0.05)


def test_a_cassette_session_still_obeys_its_session_budget(url, store):
    ok(cli(url, "wake", "--force", "--quiet", "--llm-cassette", str(CASSETTE),
           BRAINSTEM_MAX_SESSION_COST="0.005"))
    h = last_session(store)
    assert h["outcome"] == "budget_exhausted", h
    refused = [e for e in karma.read(store, h["id"]) if e.get("event") == "budget_exceeded"]
    assert refused and refused[0]["limit"] == "cost", refused
    assert h["cost"] <= 0.005 and spent_today(store) == 0


def test_real_calls_still_count_beside_simulated_ones(real_store_url, llm):
    store = seeded(real_store_url)
    try:
        ok(cli(real_store_url, "wake", "--force", "--quiet", "--llm-cassette", str(CASSETTE)))
        simulated = last_session(store)["cost"]
        llm.queue(plan(think("Say hi", id="hi", model="haiku", max_tokens=50)))
        llm.responder = answers(reflect=reflection())
        ok(run_wake(wake_env(real_store_url, llm), "--force", "--quiet"))
        real = last_session(store)
        assert real["outcome"] == "clean" and real["cost"] > 0 and "simulated_cost" not in real
        assert all(c.get("simulated") is None for c in llm_calls(store, real["id"]))
        assert spent_today(store) == pytest.approx(real["cost"])
        assert store.get_json(keys.DAILY_SIMULATED_COST)["usd"] == pytest.approx(simulated)
        status = json.loads(ok(cli(real_store_url, "status", "--json")))
        assert status["cost_today"] == pytest.approx(real["cost"], abs=1e-6)
        assert status["simulated_cost_today"] == pytest.approx(simulated, abs=1e-6)
    finally:
        store.close()


def test_dashboard_overview_shows_simulated_spend_apart(url, store):
    ok(cli(url, "wake", "--force", "--quiet", "--llm-cassette", str(CASSETTE)))
    cost = last_session(store)["cost"]
    page = client(app_for(load_settings(kv=url, openrouter_api_key=None), store)).get("/").text
    assert "$0.0000 of $5.00 daily ceiling" in page, page
    assert f"(+${cost:.4f} simulated, from cassettes)" in page, page


# --- the daemon --------------------------------------------------------------------------------

@pytest.mark.slow
def test_run_fires_sessions_from_a_cassette_each_from_its_first_answer(url, store, daemons, tmp_path):
    short = tmp_path / "short.json"  # orient's answer only: the next session runs out of answers
    first = json.loads(CASSETTE.read_text())["answers"][0]
    short.write_text(json.dumps({"answers": [first]}))
    env = clean_env({"BRAINSTEM_KV": url})
    d = daemons(env, "--every", "1s", "--llm-cassette", str(CASSETTE))
    wait_for(lambda: len(session_history.read(store)) >= 1, 30, "a session from the cassette", d)
    store.delete(keys.WAKE_CONFIG)  # due again: the next fire's session starts at the cassette's first answer
    wait_for(lambda: len(session_history.read(store)) >= 2, 30, "a second session from the cassette", d)
    rc, _ = d.stop()
    assert rc == 0, d.stderr
    h = session_history.read(store)
    assert [x["outcome"] for x in h[:2]] == ["clean", "clean"], h
    assert spent_today(store) == 0 and all(x["simulated_cost"] > 0 for x in h[:2])

    # A cassette that runs out mid-session: a provider error in karma, the session ends, the daemon goes on.
    store.delete(keys.WAKE_CONFIG)
    d = daemons(env, "--every", "1s", "--llm-cassette", str(short))
    wait_for(lambda: len(session_history.read(store)) >= 3, 30, "a session that runs out of answers", d)
    wait_for(lambda: d.alive() and "ran out of answers" in json.dumps(karma.read(store, last_session(store)["id"])),
             10, "the provider error in karma", d)
    rc, _ = d.stop()
    assert rc == 0, d.stderr
    fell = [e for e in karma.read(store, last_session(store)["id"]) if e.get("event") == "provider_fallback"]
    assert fell and all(e["tier"] == "cassette" for e in fell), fell
    assert "Traceback" not in d.stderr, d.stderr


def test_run_refuses_a_cassette_it_cannot_read(url, store, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    r = cli(url, "run", "--every", "1h", "--llm-cassette", str(bad))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "not valid JSON" in r.stderr


def test_cassette_path_that_names_nothing_is_exit_2(url, store, tmp_path):
    for args in (["wake", "--force"], ["run", "--every", "1h"], ["replay", "1", "--live"]):
        r = cli(url, *args, "--llm-cassette", str(tmp_path / "missing.json"))
        assert r.returncode == 2 and "does not exist" in r.stderr, (args, r.stderr)


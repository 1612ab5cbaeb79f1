"""``brainstem wake`` end to end: a subprocess against a real store (Redis and SQLite) and the LLM double.

Each test seeds a store, scripts the model's answers in request order (orient,
then one answer per think / conditional / subplan call, then reflect), runs
the command, and reads karma and keys back. :func:`finished` checks what every
session must leave behind: exit 0, ``session_end`` with an outcome, the next
wake in the future, a history entry, and a cost equal to its LLM calls.
"""

from __future__ import annotations

import json
import socket
from datetime import datetime, timedelta, timezone

import pytest

from brainstem.core import keys
from brainstem.store import karma
from tests.doubles import RPCDouble
from tests.helpers import dead_pid, free_port, one_line, run_cli, run_cli_process
from tests.wake_helpers import (
    API_KEY,
    action,
    all_text,
    answers,
    event_names,
    events_of,
    finished,
    history,
    in_future,
    is_deep,
    is_orient,
    is_reflect,
    iso_in,
    llm_calls,
    plan,
    reflection,
    run_wake,
    seeded,
    set_defaults,
    start_wake,
    think,
    user_text,
    verbose,
    wake_env,
)


def step_ids(entries, event):
    return [e.get("step_id") for e in events_of(entries, event)]


# --- lifecycle ---------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", ["Z", "+00:00"])
def test_asleep_exits_at_once_without_a_session(st, env, llm, suffix):
    until = (datetime.now(timezone.utc) + timedelta(hours=2)).replace(microsecond=0)
    stamp = until.strftime("%Y-%m-%dT%H:%M:%S") + suffix
    st.put(keys.WAKE_CONFIG, {"next_wake_after": stamp})
    for args in ([], ["--verbose"]):  # the light sleep path, then the full command
        r = run_wake(env, *args)
        assert r.returncode == 0, r.stderr
        assert r.stderr == ""
    assert "asleep until" in r.stdout
    assert llm.requests == [] and llm.get_requests == []
    assert karma.latest_session_id(st) is None and history(st) == []
    assert st.get_json(keys.WAKE_CONFIG) == {"next_wake_after": stamp}


@pytest.mark.parametrize("form", [[], ["--quiet"], ["-q"], ["--log-format", "json"], ["--log-format=json"],
                                  ["--quiet", "--log-format", "json"], ["-v"], ["--verbose", "--log-format", "json"]])
def test_every_documented_form_of_wake_sleeps_on_the_light_path_and_says_the_same(st, env, llm, form, tmp_path):
    """cron and systemd run `wake --quiet` or `--log-format json`: asleep, none of them loads the command
    line or pydantic, and each prints what the full command prints in that form."""
    until = (datetime.now(timezone.utc) + timedelta(hours=2)).replace(microsecond=0)
    st.put(keys.WAKE_CONFIG, {"next_wake_after": until.strftime("%Y-%m-%dT%H:%M:%SZ")})
    # A real process: what it imports is the point (and PYTHONPROFILEIMPORTTIME is read at interpreter start).
    light = run_cli_process("wake", *form, env={**env, "PYTHONPROFILEIMPORTTIME": "1"})
    assert light.returncode == 0
    imported = {line.rsplit("|", 1)[-1].strip() for line in light.stderr.splitlines() if "import time:" in line}
    heavy = {"click", "pydantic", "httpx", "tenacity", "brainstem.operator.cli", "brainstem.session.wake"}
    assert imported and not imported & heavy, form
    env_file = tmp_path / "empty.env"
    env_file.write_text("")
    full = run_wake({**env, "BRAINSTEM_ENV_FILE": str(env_file)}, *form)  # an env file: the full command line
    assert full.returncode == 0 and full.stderr == ""
    assert light.stdout == full.stdout
    verbose = "-v" in form or "--verbose" in form
    if not verbose:
        assert light.stdout == ""  # from cron: silent
    elif "json" in " ".join(form):
        assert json.loads(light.stdout)["status"] == "asleep"
    else:
        assert light.stdout.startswith("asleep until ")
    assert llm.requests == [] and karma.latest_session_id(st) is None


@pytest.mark.parametrize("wake_config", ["missing", "no_next_wake_after", "not_json"])
def test_due_when_the_schedule_is_unusable_and_never_every_tick(st, env, llm, wake_config):
    if wake_config == "no_next_wake_after":
        st.put(keys.WAKE_CONFIG, {"effort": "low"})
    elif wake_config == "not_json":
        st.put(keys.WAKE_CONFIG, "tomorrow-ish, maybe")
    llm.credit = 7.25
    llm.queue(plan(think("hello")), "hi", reflection())
    r = run_wake(env)  # no --force: it must be due
    sid, entries = finished(r, st, "clean")
    assert sid in r.stdout
    rejected = [e for e in events_of(entries, "config_rejected") if e.get("key") == keys.WAKE_CONFIG]
    assert len(rejected) == (1 if wake_config == "not_json" else 0)
    gt = events_of(entries, "ground_truth")[0]
    assert gt["balances"]["openrouter"] == 7.25  # the double's /key credit
    assert events_of(entries, "tripwire_fired") == []
    assert events_of(entries, "effort")[0]["effort"] == "low"
    assert in_future(st.get_json(keys.WAKE_CONFIG)["next_wake_after"], 3000)  # the plan asked for an hour
    # and the next tick sleeps
    n = len(llm.requests)
    again = run_wake(env)
    assert again.returncode == 0 and len(llm.requests) == n and karma.latest_session_id(st) == sid


def test_lease_held_by_a_live_owner(st, env, llm):
    assert st.acquire_lease(keys.WAKE_LEASE, "otherhost:1:x", 60000)
    try:
        r = run_wake(env, "--force")
        assert r.returncode == 75
        assert "otherhost:1:x" in one_line(r.stderr)
        assert llm.requests == [] and karma.latest_session_id(st) is None
        assert st.lease_owner(keys.WAKE_LEASE) == "otherhost:1:x"
    finally:
        st.release_lease(keys.WAKE_LEASE, "otherhost:1:x")


def test_lease_of_a_dead_process_on_this_host_is_reclaimed(st, env, llm):
    owner = f"{socket.gethostname()}:{dead_pid()}:x"
    assert st.acquire_lease(keys.WAKE_LEASE, owner, 60000)
    llm.queue(plan(think("hello")), "hi", reflection())
    finished(run_wake(env, "--force"), st, "clean")
    assert st.lease_owner(keys.WAKE_LEASE) is None


def test_crash_detected_and_shown_to_orient(st, env, llm):
    dead = "7-dead01"
    k = karma.Karma(st, dead)
    k.record("session_start", session_id=dead)
    k.record("step_start", step_id="boom", type="action")
    for i in range(100):  # a long dead session: what orient sees of it stays bounded
        k.record("tool_log", tool="web_fetch", message=f"filler {i} " + "x" * 5000)
    k.record("tool_start", tool="web_fetch", note="LAST-WORDS-before-the-oom-killer")
    st.put(keys.SESSION_CURRENT, {"id": dead, "started_at": iso_in(-600), "pid": dead_pid(),
                                  "host": socket.gethostname()})  # on this host, its process gone: a crash
    llm.queue(plan(think("hello")), "hi", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    orient = user_text(llm.requests[0])
    assert is_orient(llm.requests[0])
    assert "LAST-WORDS-before-the-oom-killer" in orient and dead in orient
    assert "filler 99 " in orient and "filler 0 " not in orient and len(orient) < 60_000
    assert events_of(entries, "crash_detected")[0]["dead_session"] == dead
    assert entries[0]["crashed_session"] == dead
    crashed = [h for h in history(st) if h.get("id") == dead]
    assert len(crashed) == 1 and crashed[0]["outcome"] == "crashed" and crashed[0]["detected_by"] == sid
    dead_entries = karma.read(st, dead)
    assert len(dead_entries) == 104
    assert dead_entries[-1]["event"] == "session_end" and dead_entries[-1]["outcome"] == "crashed"


def test_crash_breadcrumb_pointing_at_no_karma(st, env, llm):
    st.put(keys.SESSION_CURRENT, {"id": "8-ghost1", "started_at": iso_in(-600)})
    llm.queue(plan(think("hello")), "hi", reflection())
    finished(run_wake(env, "--force"), st, "clean")
    assert "died before recording anything" in user_text(llm.requests[0])
    assert [h["outcome"] for h in history(st) if h.get("id") == "8-ghost1"] == ["crashed"]
    assert event_names(karma.read(st, "8-ghost1")) == ["session_end"]


def test_a_sigkilled_session_is_found_at_the_next_due_wake(st, env, llm):
    llm.queue(plan(think("slow thought", id="slow")), {"content": "never delivered", "delay": 30})
    proc = start_wake(env)
    try:
        assert llm.wait_for_requests(2, timeout=20), "the session never reached its think step"
    finally:
        proc.kill()
        proc.wait(10)
    dead = karma.latest_session_id(st)
    assert st.get_json(keys.SESSION_CURRENT)["id"] == dead
    # The schedule was advanced before any work, with a retry for the case it dies: a first crash is
    # retried at once (a host that dies is no fault of the agent's); test_lease shows later ones backing off.
    advance = st.get_json(keys.WAKE_CONFIG)
    assert in_future(advance["next_wake_after"], 3600) and not in_future(advance["retry_after"], 0)
    assert advance["crash_streak"] == 0
    # The next wake, unforced, reclaims the dead process's lock and reports the crash.
    llm.reset()
    llm.queue(plan(think("hello")), "hi", reflection())
    sid, entries = finished(run_wake(env), st, "clean")
    assert events_of(entries, "crash_detected")[0]["dead_session"] == dead
    assert '"step_id": "slow"' in user_text(llm.requests[0])  # its karma (the step it died in) reaches orient
    assert karma.read(st, dead)[-1]["outcome"] == "crashed"
    assert [h["outcome"] for h in history(st)] == ["crashed", "clean"]


def test_corrupt_crash_breadcrumb(st, env, llm):
    st.put(keys.SESSION_CURRENT, "{this is not json")
    llm.queue(plan(think("hello")), "hi", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    assert events_of(entries, "crash_detected")[0]["dead_session"] is None
    assert "breadcrumb was unreadable" in user_text(llm.requests[0])
    assert [h["outcome"] for h in history(st) if h.get("id") is None] == ["crashed"]


def test_wallet_balance_from_the_rpc(st, real_store_url, llm):
    wallet = "0x" + "ab" * 20
    with RPCDouble({wallet: 12_345_678}) as rpc:
        env = wake_env(real_store_url, llm, WALLET_ADDRESS=wallet, BASE_RPC_URL=rpc.url)
        llm.queue(plan(think("hello")), "hi", reflection())
        sid, entries = finished(run_wake(env, "--force"), st, "clean")
        assert rpc.eth_calls
    assert events_of(entries, "ground_truth")[0]["balances"] == {"openrouter": 10.0, "wallet_usdc": 12.345678}
    assert "12.345678" in user_text(llm.requests[0])


@pytest.mark.parametrize("failure", ["http_500", "unreachable"])
def test_wallet_rpc_failure_is_unknown_and_the_session_runs(st, real_store_url, llm, failure):
    wallet = "0x" + "cd" * 20
    with RPCDouble({wallet: 1}) as rpc:
        rpc.fail_with = 500
        url = rpc.url if failure == "http_500" else f"http://127.0.0.1:{free_port()}/"
        env = wake_env(real_store_url, llm, WALLET_ADDRESS=wallet, BASE_RPC_URL=url,
                       BRAINSTEM_GROUND_TRUTH_TIMEOUT=5)
        llm.queue(plan(think("hello")), "hi", reflection())
        sid, entries = finished(run_wake(env, "--force"), st, "clean")
        if failure == "http_500":
            assert rpc.calls  # it did ask
    gt = events_of(entries, "ground_truth")[0]
    assert gt["balances"]["wallet_usdc"] is None and gt["balances"]["openrouter"] == 10.0
    assert len(llm_calls(entries, "think")) == 1


def test_a_wallet_without_web3_is_unknown_says_what_to_install_and_the_session_runs(st, real_store_url, llm,
                                                                                    monkeypatch):
    # web3 is the wallet extra: an install without it (an import of it refused here) reads no balance.
    import sys

    monkeypatch.setitem(sys.modules, "web3", None)
    wallet = "0x" + "ef" * 20
    env = wake_env(real_store_url, llm, WALLET_ADDRESS=wallet, BASE_RPC_URL=f"http://127.0.0.1:{free_port()}/",
                   BRAINSTEM_GROUND_TRUTH_TIMEOUT=5)
    llm.queue(plan(think("hello")), "hi", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    gt = events_of(entries, "ground_truth")[0]
    assert gt["balances"] == {"openrouter": 10.0, "wallet_usdc": None}
    assert gt["errors"]["wallet_usdc"] == ("web3 is not installed, so the wallet balance is unknown: "
                                           "pip install 'brainstem[wallet]'")
    assert len(llm_calls(entries, "think")) == 1  # the session went on
    status = run_cli("status", env=env)
    assert status.returncode == 0, status.stderr
    line = next(ln for ln in status.stdout.splitlines() if ln.startswith("balances"))
    assert "wallet USDC unknown (web3 is not installed, so the wallet balance is unknown: pip install " \
           "'brainstem[wallet]')" in line
    assert json.loads(run_cli("status", "--json", env=env).stdout)["wallet_needs"].endswith(
        "pip install 'brainstem[wallet]'")
    monkeypatch.delitem(sys.modules, "web3")  # installed after all: status says no more
    assert "brainstem[wallet]" not in run_cli("status", env=env).stdout


def test_tripwire_raises_effort(st, env, llm):
    set_defaults(st, tripwires=[{"field": "balances.openrouter", "op": "<", "value": 100, "effort": "high"}])
    llm.queue(plan(think("hello")), "hi", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    fired = events_of(entries, "tripwire_fired")
    assert len(fired) == 1 and fired[0]["field"] == "balances.openrouter" and fired[0]["effort"] == "high"
    assert events_of(entries, "effort")[0]["effort"] == "high"
    orient = llm.requests[0]
    assert "**high**" in user_text(orient)
    assert orient["reasoning"] == {"effort": "high"}  # sonnet reasons; effort reaches the request


def test_orient_context_loads_keys_capped_and_never_secrets(st, env, llm):
    set_defaults(st, memory={"max_load_key_bytes": 1000})
    st.put("notes:big", "A" * 1000 + "TAIL-PAST-THE-CAP" + "B" * 5000)
    st.put("notes:small", "small-note-value-42")
    st.put("secret:api", "hunter2-SECRET-VALUE")
    st.put(keys.LAST_REFLECT, {"session_summary": "prev", "next_orient_context": {
        "load_keys": ["notes:big", "notes:small", "secret:api"]}})
    llm.queue(plan(think("hello")), "hi", reflection())
    finished(run_wake(env, "--force"), st, "clean")
    orient = user_text(llm.requests[0])
    assert "small-note-value-42" in orient
    assert "A" * 1000 in orient and "TAIL-PAST-THE-CAP" not in orient
    assert not any("hunter2-SECRET-VALUE" in all_text(r) for r in llm.requests)


def test_kv_index_stays_bounded_with_many_keys(st, env, llm):
    llm.responder = answers()
    llm.queue(plan(think("hello")))
    finished(run_wake(env, "--force"), st, "clean")
    small = user_text(llm.requests[0])
    st.delete(keys.LAST_REFLECT)  # so both orients see the same memory
    for i in range(2000):
        st.put(f"note:{i:04d}", "v")
    llm.reset()
    llm.queue(plan(think("hello")))
    finished(run_wake(env, "--force"), st, "clean")
    big = user_text(llm.requests[0])
    assert "note:1999" not in big and "note:0000" not in big
    assert abs(len(big) - len(small)) < 1500, (len(small), len(big))


def test_orient_sees_the_schedules_and_reflection_adds_one_within_the_operators_limits(st, real_store_url, llm):
    st.put("schedule:report", {"tool": "kv_read", "input": {"key": "wisdom"}, "cron": "0 9 * * *",
                               "tz": "Europe/London", "created_by": "operator", "next_run": "2999-01-01T09:00:00Z"})
    env = wake_env(real_store_url, llm, BRAINSTEM_SCHEDULE_MAX=1, BRAINSTEM_SCHEDULE_MIN_INTERVAL=3600)
    balance = {"tool": "check_or_balance", "every": "6h", "notify": "inbox", "next_run": "2020-01-01T00:00:00Z"}
    llm.queue(plan(think("hello")), "hi", reflection(kv_operations=[
        {"op": "put", "key": "schedule:balance", "value": balance}]))
    finished(run_wake(env, "--force"), st, "clean")
    orient, reflect = user_text(llm.requests[0]), user_text(llm.requests[2])
    for prompt in (orient, reflect):
        assert '"most_you_may_have": 1, "shortest_interval_seconds": 3600' in prompt
        assert '"id": "report", "tool": "kv_read"' in prompt and "cron 0 9 * * * (Europe/London)" in prompt
    stored = st.get_json("schedule:balance")
    assert stored["created_by"] == "agent" and in_future(stored["next_run"], at_least=6 * 3600 - 120)
    # A second one is past the operator's limit: the batch is refused whole, and recorded.
    llm.reset()
    llm.queue(plan(think("hello")), "hi", reflection(kv_operations=[
        {"op": "put", "key": "notes:x", "value": "y"},
        {"op": "put", "key": "schedule:more", "value": {"tool": "kv_read", "input": {"key": "x"}, "every": "1d"}}]))
    _, entries = finished(run_wake(env, "--force"), st, "clean")
    assert '"id": "balance", "tool": "check_or_balance"' in user_text(llm.requests[0])
    (rejected,) = events_of(entries, "kv_operations_rejected")
    assert "schedule:more: the agent has 1 schedules" in rejected["reason"]
    assert "BRAINSTEM_SCHEDULE_MAX 1" in rejected["reason"]
    assert st.get("schedule:more") is None and st.get("notes:x") is None


DEEP_ANSWER = json.dumps({"reflection": "I have been too chatty.", "note_to_future_self": "be brief",
                          "updated_wisdom": "WISDOM-V2: fewer words.",
                          "next_deep_reflect": {"after_sessions": 5, "after_days": 3}})


@pytest.mark.parametrize("how", ["counter_at_interval", "interval_of_one"])
def test_deep_reflection_due_by_sessions(st, env, llm, how):
    if how == "counter_at_interval":
        st.put(keys.SESSION_COUNTER, "19")  # the default interval is 20: session 20 is due
        number = 20
    else:
        set_defaults(st, deep_reflect={"default_interval_sessions": 1})
        number = 1
    llm.queue(DEEP_ANSWER)
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    assert len(llm.requests) == 1 and is_deep(llm.requests[0])
    assert llm.requests[0]["model"] == "anthropic/claude-sonnet-4.5"
    assert entries[-1]["kind"] == "deep_reflect" and history(st)[-1]["kind"] == "deep_reflect"
    assert st.get(keys.WISDOM) == "WISDOM-V2: fewer words."
    sched = st.get_json(keys.DEEP_REFLECT_SCHEDULE)
    assert sched["last_session"] == number and sched["after_sessions"] == 5 and sched["after_days"] == 3
    assert "wisdom" in events_of(entries, "deep_reflect")[-1]["applied"]


def test_deep_reflection_due_by_days(st, env, llm):
    st.put(keys.SESSION_COUNTER, "3")
    eight_days_ago = (datetime.now(timezone.utc) - timedelta(days=8)).strftime("%Y-%m-%dT%H:%M:%SZ")
    st.put(keys.DEEP_REFLECT_SCHEDULE, {"last_session": 2, "last_at": eight_days_ago, "after_sessions": 20,
                                        "after_days": 7})
    llm.queue(DEEP_ANSWER)
    finished(run_wake(env, "--force"), st, "clean")
    assert len(llm.requests) == 1 and is_deep(llm.requests[0])
    sched = st.get_json(keys.DEEP_REFLECT_SCHEDULE)
    assert sched["last_session"] == 4 and sched["last_at"] > eight_days_ago


def test_deep_reflection_in_prose_stays_due_until_it_happens(st, env, llm):
    st.put(keys.SESSION_COUNTER, "19")
    llm.queue("I reflected deeply, but I forgot to answer in JSON.")
    sid, entries = finished(run_wake(env, "--force"), st, "no_reflection")
    assert is_deep(llm.requests[0])
    assert [e.get("kind") for e in events_of(entries, "reflect_parse_error")] == ["deep"]
    assert "last_session" not in st.get_json(keys.DEEP_REFLECT_SCHEDULE)  # the miss counted, not marked done
    llm.reset()
    llm.queue(DEEP_ANSWER)
    finished(run_wake(env, "--force"), st, "clean")
    assert is_deep(llm.requests[0])
    assert st.get_json(keys.DEEP_REFLECT_SCHEDULE)["last_session"] == 21
    llm.reset()
    llm.queue(plan(think("hello")), "hi", reflection())
    sid3, entries3 = finished(run_wake(env, "--force"), st, "clean")
    assert sid3 != sid and is_orient(llm.requests[0])
    assert not any(is_deep(r) for r in llm.requests)


# --- every step type -----------------------------------------------------------------------------

def test_think_result_is_substituted_into_a_later_prompt(st, env, llm):
    llm.queue(plan(think("Name a colour", id="t1", store_result_as="colour"),
                   think("Paint it {{colour}} please", id="t2")),
              "vermilion-7", "painted", reflection(next_wake_config={"sleep_seconds": 1e12, "effort": "high"}))
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    soul = st.get(keys.SOUL)
    assert all(r["messages"][0] == {"role": "system", "content": soul} for r in llm.requests)
    wc = st.get_json(keys.WAKE_CONFIG)  # reflection's wish wins over the plan's, clamped to 30 days
    assert wc["sleep_seconds"] == 30 * 86400 and wc["effort"] == "high"
    assert "Paint it vermilion-7 please" in user_text(llm.requests[2])
    assert [e["result"] for e in events_of(entries, "step_complete")] == ["vermilion-7", "painted"]
    assert is_reflect(llm.requests[3]) and "vermilion-7" in user_text(llm.requests[3])
    assert len(llm.requests) == 4


def test_conditional_branches_match_default_and_no_match(st, env, llm):
    llm.queue(plan(
        {"id": "c1", "type": "conditional", "prompt": "Proceed?",
         "branches": {"yes": [think("YES-1", id="y1")], "no": [think("NO-1", id="n1")]}},
        {"id": "c2", "type": "conditional", "prompt": "Again?", "default": "no",
         "branches": {"yes": [think("YES-2", id="y2")], "no": [think("NO-2", id="n2")]}},
        {"id": "c3", "type": "conditional", "prompt": "Third?",
         "branches": {"yes": [think("YES-3", id="y3")], "no": []}},
        think("after the conditionals", id="t4")),
        "Yes!\n", "y1 done", "Perhaps later", "n2 done", "maybe", "t4 done", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    assert "Answer with exactly one of: yes, no" in user_text(llm.requests[1])
    completed = step_ids(entries, "step_complete")
    assert completed == ["y1", "c1", "n2", "c2", "t4"]
    assert {"n1", "y2", "y3"}.isdisjoint(step_ids(entries, "step_start"))
    assert events_of(entries, "step_complete")[1]["result"] == "yes"
    no_match = events_of(entries, "conditional_no_match")
    assert [(e["step_id"], e["default"]) for e in no_match] == [("c2", "no"), ("c3", None)]
    failed = events_of(entries, "step_failed")
    assert [e["step_id"] for e in failed] == ["c3"] and "no default" in failed[0]["error"]
    assert events_of(entries, "retry_failed") == []  # retrying cannot change a final failure: none was made
    assert llm.requests[1]["max_tokens"] == 50
    assert len(llm.requests) == 8  # orient, c1, y1, c2, n2, c3, t4, reflect


def test_subplan_runs_its_steps_capped_and_depth_limited(st, env, llm):
    set_defaults(st, execution={"max_subplan_depth": 1})
    llm.queue(plan({"id": "sp1", "type": "subplan", "goal": "Count to three", "max_steps": 2},
                   {"id": "sp2", "type": "subplan", "goal": "Go deeper"}),
              json.dumps({"steps": [think("ONE", id="i1"), think("TWO", id="i2"), think("THREE", id="i3")]}),
              "one", "two",
              json.dumps({"steps": [{"id": "deep", "type": "subplan", "goal": "too deep"}]}),
              reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    assert "Count to three" in user_text(llm.requests[1])
    assert [user_text(r) for r in llm.requests[2:4]] == ["ONE", "TWO"]
    started = {e["step_id"]: e for e in events_of(entries, "step_start")}
    assert started["i1"]["depth"] == 1 and "i3" not in started
    assert len(llm_calls(entries, "subplan")) == 2 and len(llm_calls(entries, "think")) == 2
    sp1 = [e for e in events_of(entries, "step_complete") if e["step_id"] == "sp1"][0]
    assert sp1["result"] == {"steps_planned": 3, "steps_run": 2}
    exceeded = events_of(entries, "subplan_depth_exceeded")
    assert [(e["step_id"], e["depth"], e["max_depth"]) for e in exceeded] == [("deep", 2, 1)]
    assert step_ids(entries, "step_failed") == ["deep"]
    assert len(llm.requests) == 6 and is_reflect(llm.requests[5])


def test_reflect_step_reflects_there_and_not_again(st, env, llm):
    llm.queue(plan(think("before", id="a"), {"type": "reflect", "id": "r"}, think("after", id="b")),
              "a ok", reflection("MID-SESSION-REFLECTION"), "b ok")
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    calls = llm_calls(entries)
    assert [c["purpose"] for c in calls] == ["orient", "think", "reflect", "think"]
    assert len(llm.requests) == 4
    assert st.get_json(keys.LAST_REFLECT)["session_summary"] == "MID-SESSION-REFLECTION"
    assert history(st)[-1]["summary"] == "MID-SESSION-REFLECTION"


def test_action_steps_and_what_depends_on_a_failure(st, env, llm):
    llm.queue(plan(action("kv_write", {"key": "a", "value": "b"}, id="w"),
                   action("no_such_tool", {}, id="m", store_result_as="missing", failure={"retries": 0}),
                   think("needs m", id="d", depends_on=["m"]),
                   think("uses {{missing}}", id="v"),
                   think("independent", id="ok")),
              "still ran", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    done = {e["step_id"]: e for e in events_of(entries, "tool_complete")}
    assert [e["tool"] for e in events_of(entries, "tool_start")] == ["kv_write", "no_such_tool"]
    assert done["w"]["ok"] is True and done["w"]["result"]["stored_as"] == "tooldata:kv_write:a"
    assert st.get("tooldata:kv_write:a") == "b"
    assert done["m"]["ok"] is False and "no tool named 'no_such_tool'" in done["m"]["error"]
    failed = events_of(entries, "step_failed")
    assert [e["step_id"] for e in failed] == ["m"] and "no_such_tool" in failed[0]["error"]
    skipped = {e["step_id"]: e["reason"] for e in events_of(entries, "step_skipped")}
    assert set(skipped) == {"d", "v"}
    assert "m" in skipped["d"] and "missing" in skipped["v"]
    assert step_ids(entries, "step_complete") == ["w", "ok"]
    assert history(st)[-1]["steps_failed"] == 1
    assert len(llm.requests) == 3  # orient, the independent think, reflect


def test_retries_then_stop_session(st, env, llm):
    llm.queue(plan(think("flaky", id="t0", failure={"retries": 2}),
                   think("flaky", id="t1", model="haiku", failure={"retries": 2}),
                   think("doomed", id="t2", model="haiku", failure={"retries": 1, "on_fail": "stop_session"}),
                   think("never", id="t3")),
              # t0 on sonnet: 400, then 400 from the fallback model (haiku): attempt 2 succeeds
              {"status": 400}, {"status": 400}, "recovered",
              # t1 on haiku (no fallback): 400, an empty answer, then an answer
              {"status": 400, "message": "bad request"}, "", "third time lucky",
              {"status": 400}, {"status": 400}, reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "stopped")
    results = {e["step_id"]: e["result"] for e in events_of(entries, "step_complete")}
    assert results == {"t0": "recovered", "t1": "third time lucky"}
    assert [e["step_id"] for e in events_of(entries, "provider_fallback")] == ["t0", "t0", "t1", "t2", "t2"]
    assert [e["step_id"] for e in events_of(entries, "model_fallback")] == ["t0"]  # haiku is the fallback itself
    retry = events_of(entries, "retry_failed")
    assert [(e["step_id"], e["attempts"]) for e in retry] == [("t2", 2)]
    assert step_ids(entries, "step_failed") == ["t2"]
    assert "t3" not in step_ids(entries, "step_start")
    assert len(llm_calls(entries, "reflect")) == 1  # reflection still runs
    assert len(llm.requests) == 10


def test_mid_session_tripwire_on_a_failed_step(st, env, llm):
    llm.queue(plan(action("no_such_tool", {}, id="x", failure={"retries": 0}), think("never", id="n"),
                   tripwires=[{"condition": "step_fails"}]),
              reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "stopped")
    fired = events_of(entries, "tripwire_fired")
    assert [(e["condition"], e["step_id"]) for e in fired] == [("step_fails", "x")]
    assert "n" not in step_ids(entries, "step_start")
    assert len(llm_calls(entries, "reflect")) == 1


# --- budgets -------------------------------------------------------------------------------------

def test_step_budget_runs_exactly_max_steps(st, env, llm):
    llm.queue(plan(*[think(f"step {i}") for i in range(100)], budget={"max_steps": 8}))
    llm.responder = answers("ok")
    sid, entries = finished(run_wake(env, "--force"), st, "budget_exhausted")
    assert len(events_of(entries, "step_start")) == 8
    assert len(llm_calls(entries, "think")) == 8
    exceeded = events_of(entries, "budget_exceeded")
    assert len(exceeded) == 1 and exceeded[0]["limit"] == "steps"
    assert entries[-1]["steps"] == 8 and history(st)[-1]["steps"] == 8
    names = event_names(entries)
    assert names.index("budget_exceeded") < max(i for i, e in enumerate(entries)
                                                 if e["event"] == "llm_call" and e["purpose"] == "reflect")


def test_cost_budget_is_never_passed_and_reflection_runs_from_the_reserve(st, env, llm):
    max_cost = 0.07
    llm.queue(plan(*[think(f"write at length {i}", model="haiku", max_tokens=1500) for i in range(40)],
                   budget={"max_cost": max_cost}))
    llm.responder = answers(verbose)  # every think spends its whole max_tokens; no cost field: the price list
    sid, entries = finished(run_wake(env, "--force"), st, "budget_exhausted")
    calls = llm_calls(entries)
    assert all(c["cost_source"] == "price_list" for c in calls)
    assert entries[-1]["cost"] <= max_cost
    assert sum(c["cost"] for c in calls) <= max_cost
    thinks = llm_calls(entries, "think")
    assert 1 < len(thinks) < 40
    exceeded = [i for i, e in enumerate(entries) if e["event"] == "budget_exceeded"]
    reflect = [i for i, e in enumerate(entries) if e["event"] == "llm_call" and e["purpose"] == "reflect"]
    assert exceeded and len(reflect) == 1 and reflect[0] > exceeded[0]
    assert events_of(entries, "reflect")  # and it was parsed and stored
    assert st.get_json(keys.LAST_REFLECT)["session_id"] == sid


def test_session_cost_is_the_sum_of_its_llm_calls(st, env, llm):
    # Odd prices and provider-reported costs with many decimals: no rounding may drift.
    llm.queue(plan(think("a", model="deepseek"), think("b", model="gpt5mini"), think("c", model="deepseek")),
              {"content": "one", "cost": 0.000123456789123}, "two", {"content": "three", "cost": 3.3e-9},
              {"content": reflection(), "cost": 0.000987654321})
    sid, entries = finished(run_wake(env, "--force"), st, "clean")  # finished() checks the sums to 1e-9
    calls = llm_calls(entries)
    assert len(calls) == 5
    spent = sum(c["cost"] for c in calls)
    assert abs(entries[-1]["cost"] - spent) < 1e-9 and abs(history(st)[-1]["cost"] - spent) < 1e-9
    assert abs(calls[1]["cost"] - 0.000123456789123) < 1e-10


def test_operator_session_ceiling_clamps_the_plan(st, real_store_url, llm):
    env = wake_env(real_store_url, llm, BRAINSTEM_MAX_SESSION_COST="0.002")
    # A small orient prompt and cheap models, so the session can afford to plan at all under $0.002.
    st.put(keys.PROMPT_ORIENT, "Plan this session as JSON. Effort: {{context.effort}}.")
    set_defaults(st, orient={"model": "deepseek", "max_output_tokens": 300},
                 reflect={"model": "deepseek", "max_output_tokens": 300})
    llm.queue(plan(*[think(f"spend {i}", model="deepseek", max_tokens=400) for i in range(30)],
                   budget={"max_cost": 5.0}))
    llm.responder = answers(verbose)
    sid, entries = finished(run_wake(env, "--force"), st, "budget_exhausted")
    assert entries[0]["budget"]["max_cost"] == 0.002
    assert events_of(entries, "plan")[0]["session_budget"]["max_cost"] == 5.0
    assert entries[-1]["cost"] <= 0.002
    assert all(e.get("max_cost", 0) <= 0.002 and e.get("budget", 0) <= 0.002
               for e in events_of(entries, "budget_exceeded"))
    assert events_of(entries, "budget_exceeded")
    assert llm_calls(entries, "think")


def test_daily_ceiling_stops_a_second_session(st, real_store_url, llm):
    env = wake_env(real_store_url, llm, BRAINSTEM_MAX_DAILY_COST="0.03")
    llm.queue(plan(*[think(f"spend {i}", model="haiku", max_tokens=1500) for i in range(20)]))
    llm.responder = answers(verbose)
    sid1, entries1 = finished(run_wake(env, "--force"), st, "budget_exhausted")
    assert entries1[0]["budget"]["max_cost"] == 0.03
    daily = st.get_json(keys.DAILY_COST)["usd"]
    assert daily <= 0.03 and abs(daily - entries1[-1]["cost"]) < 1e-6
    llm.reset()
    llm.queue(plan(think("one more?")))
    # Refused before orient: a budget outcome, not a "no plan" failure (which would count towards auto-restore)
    sid2, entries2 = finished(run_wake(env, "--force"), st, "budget_exhausted")
    assert sid2 != sid1
    assert llm.requests == [] and llm_calls(entries2) == []
    assert [e["purpose"] for e in events_of(entries2, "budget_exceeded")] == ["orient"]
    assert events_of(entries2, "orient_parse_error") == []
    assert st.get_json(keys.DAILY_COST)["usd"] == daily


# --- bad input -------------------------------------------------------------------------------------

GOOD = plan(think("the plan ran", id="g"))
BAD_ORIENT = {
    # name: (orient answers, outcome, orient_parse_error count, text expected in the first error)
    "prose": (["I think I will rest today.", "Still prose, sorry."], "no_plan", 2, "no JSON object"),
    "fenced": (["Here you go:\n```json\n" + GOOD + "\n```\nBye."], "clean", 0, None),
    "array": ([json.dumps([think("x")]), "[]"], "no_plan", 2, "JSON list"),
    "truncated": ([GOOD[:40], GOOD[:25]], "no_plan", 2, "never closed"),
    "finish_length": ([{"content": GOOD, "finish_reason": "length"}] * 2, "no_plan", 2, "cut off"),
    "wrong_type": ([json.dumps({"steps": [{"type": "think", "prompt": 42}]}), json.dumps({"steps": "think"})],
                   "no_plan", 2, "prompt"),
    "repair": (["Let me think... I would rather rest.", GOOD], "clean", 1, "no JSON object"),
}


@pytest.mark.parametrize("case", list(BAD_ORIENT))
def test_bad_orient_answers(st, env, llm, case):
    replies, outcome, errors, text = BAD_ORIENT[case]
    llm.queue(*replies)
    llm.responder = answers("ran")
    sid, entries = finished(run_wake(env, "--force"), st, outcome)
    parse_errors = events_of(entries, "orient_parse_error")
    assert len(parse_errors) == errors
    if text:
        assert text in parse_errors[0]["error"]
    assert len(llm_calls(entries, "orient")) == len(replies)
    if outcome == "clean":
        assert step_ids(entries, "step_complete") == ["g"]
    else:
        assert events_of(entries, "step_start") == [] and llm_calls(entries, "reflect") == []
    if case == "repair":
        second = llm.requests[1]["messages"]
        assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
        assert "could not be used as a plan" in second[-1]["content"]


def test_unknown_step_type_is_recorded_and_the_rest_runs(st, env, llm):
    llm.queue(plan({"id": "u", "type": "dance", "moves": 3}, think("still here", id="t")), "here", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    unknown = events_of(entries, "unknown_step_type")
    assert [(e["step_id"], e["type"]) for e in unknown] == [("u", "dance")]
    assert step_ids(entries, "step_complete") == ["t"]


def test_five_hundred_steps(st, env, llm):
    # (the double does not stop at max_tokens; a real model could not write this much, so it is priced low)
    llm.queue({"content": plan(*[think(f"s{i}") for i in range(500)]), "cost": 0.001})
    llm.responder = answers("ok")
    sid, entries = finished(run_wake(env, "--force"), st, "budget_exhausted")
    assert events_of(entries, "plan")[0]["steps"] == 500
    assert len(events_of(entries, "step_start")) == 12  # config:defaults session_budget.max_steps
    assert len(llm_calls(entries, "reflect")) == 1


@pytest.mark.parametrize("broken", ["not_json", "missing", "wrong_type"])
def test_unusable_config_defaults_falls_back_to_built_in(st, env, llm, broken):
    if broken == "not_json":
        st.put(keys.CONFIG_DEFAULTS, "{'orient': oops")
    elif broken == "missing":
        st.delete(keys.CONFIG_DEFAULTS)
    else:
        st.put(keys.CONFIG_DEFAULTS, {"session_budget": {"max_steps": "lots"}})
    llm.queue(plan(think("hello"), next_wake={}), "hi", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    rejected = [e for e in events_of(entries, "config_rejected") if "config:defaults" in e.get("reason", "")]
    assert len(rejected) == 1
    assert entries[0]["budget"]["max_steps"] == 12 and entries[0]["budget"]["max_cost"] == 0.1
    assert st.get_json(keys.WAKE_CONFIG)["sleep_seconds"] == 21600


def test_partial_config_defaults_takes_built_in_values_for_the_rest(st, env, llm):
    st.put(keys.CONFIG_DEFAULTS, {"wake": {"sleep_seconds": 7200}})
    llm.queue(plan(think("hello"), next_wake={}), "hi", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    (note,) = [e for e in events_of(entries, "config_rejected") if "config:defaults" in e.get("reason", "")]
    assert "lacks" in note["reason"] and "session_budget" in note["reason"] and "wake" not in note["reason"].split(
        "lacks")[1].split(";")[0].split(", ")
    assert st.get_json(keys.WAKE_CONFIG)["sleep_seconds"] == 7200
    assert entries[0]["budget"]["max_steps"] == 12


def test_llm_failing_everywhere(st, real_store_url, llm):
    env = wake_env(real_store_url, llm, BRAINSTEM_LLM_MAX_ATTEMPTS=2)
    llm.responder = lambda req: {"status": 500, "message": "upstream on fire"}
    # The hard-coded tier failing transiently is an outage, not a broken agent: it must not count
    # towards auto-restore, so it is not "no_plan".
    sid, entries = finished(run_wake(env, "--force"), st, "llm_unavailable")
    assert [e["model"] for e in events_of(entries, "provider_fallback")] == [
        "anthropic/claude-sonnet-4.5", "anthropic/claude-haiku-4.5"]
    assert len(events_of(entries, "model_fallback")) == 1
    assert len(llm.requests) == 4  # two attempts on the model, two on the fallback, then it stops
    (fault,) = events_of(entries, "llm_fault")
    assert "upstream on fire" in fault["error"] and fault["status"] == 500 and fault["operator_action"]
    assert not events_of(entries, "orient_parse_error")


def test_orient_template_naming_a_missing_variable(st, env, llm):
    st.put(keys.PROMPT_ORIENT, st.get(keys.PROMPT_ORIENT) + "\nAlso: {{context.nonexistent}} and {{page}}.")
    llm.queue(plan(think("hello")), "hi", reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    missing = events_of(entries, "template_missing_variable")
    assert len(missing) == 1 and missing[0]["names"] == ["context.nonexistent"]
    assert "{{context.nonexistent}}" in user_text(llm.requests[0])


def test_reflect_in_prose_keeps_the_previous_memory(st, env, llm):
    st.put(keys.LAST_REFLECT, {"session_summary": "OLD-MEMORY", "note_to_future_self": "old",
                               "next_orient_context": {"load_keys": ["wisdom"]}})
    llm.queue(plan(think("hello")), "hi", "I feel good about this session.")
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    assert len(events_of(entries, "reflect_parse_error")) == 1
    last = st.get_json(keys.LAST_REFLECT)
    assert last["session_summary"] == "OLD-MEMORY"
    assert last["next_orient_context"] == {"load_keys": ["wisdom"]}
    assert last["parse_error"]["session_id"] == sid and last["parse_error"]["error"]


# --- secrets and the command line --------------------------------------------------------------------

def test_the_api_key_never_reaches_karma_or_the_store(st, env, llm):
    llm.queue(plan(think("a", id="a"), action("kv_write", {"key": "k", "value": "v"}), think("b", id="b")),
              {"status": 400, "message": f"invalid key {API_KEY}"},  # a server that echoes the key back
              "fine",
              f"the key is {API_KEY}",  # a model that somehow repeats it
              reflection())
    sid, entries = finished(run_wake(env, "--force"), st, "clean")
    assert any(API_KEY in h.get("Authorization", "") for h in llm.request_headers)  # it was really used
    dump = []
    for k in st.list_all():
        if k.is_log:
            dump.extend(st.read_log(k.name))
        else:
            dump.append(k.name + "=" + (st.get(k.name) or ""))
    assert len(dump) > 30
    assert not [d for d in dump if API_KEY in d]
    # The model's answer that repeated it was never used or recorded: withheld, and a secret_refused stop.
    assert any("[withheld: the answer held secret text]" in d for d in dump)
    assert [e for e in entries if e["event"] == "secret_refused" and e.get("source") == "llm"]


def test_wake_help():
    r = run_cli("wake", "--help")
    assert r.returncode == 0 and "Usage:" in r.stdout and "--force" in r.stdout


def test_wake_without_a_soul(real_store_url, llm):
    store = seeded(real_store_url, soul=False)
    r = run_wake(wake_env(real_store_url, llm))
    assert r.returncode == 2 and "no soul" in one_line(r.stderr)
    assert llm.requests == [] and karma.latest_session_id(store) is None


def test_wake_without_an_orient_prompt(st, env, llm):
    st.delete(keys.PROMPT_ORIENT)
    r = run_wake(env)
    assert r.returncode == 2 and "prompt:orient" in one_line(r.stderr)
    assert llm.requests == [] and karma.latest_session_id(st) is None


def test_on_a_terminal_wake_says_when_it_will_wake_unless_quiet():
    from brainstem.state.sleep import asleep_line

    until = datetime(2030, 1, 1, tzinfo=timezone.utc)
    assert asleep_line(until, tty=True) == "asleep until 2030-01-01T00:00:00Z"
    assert asleep_line(until, tty=True, quiet=True) is None
    assert asleep_line(until, tty=False) is None
    assert asleep_line(until, tty=False, quiet=True, verbose=True) == "asleep until 2030-01-01T00:00:00Z"
    assert asleep_line(until, tty=True, log_format="json") is None  # JSON lines only when asked

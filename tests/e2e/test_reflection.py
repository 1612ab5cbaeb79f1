"""Reflection, deep reflection and self-modification, end to end.

Every session here is ``brainstem wake --force`` in a subprocess against a real
store (a real redis-server under its own prefix, or an SQLite file) and the
loopback LLM double. The double tells prompts apart by the first line of the
last message ("# Orient", "# Reflect", "# Deep reflection", "# Subplan"); a
think step's prompt, and orient's repair request, are "other". Tests then read
the store and the karma back.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from brainstem.core import keys
from brainstem.core.clock import parse_iso
from brainstem.state import history as session_history
from brainstem.state.seed import example_soul_path, seed
from brainstem.state.versions import versions
from brainstem.store import karma, open_store
from tests.doubles import LLMDouble
from tests.helpers import run_cli

API_KEY = "sk-test-5d0e91c7a3f24b86"  # random-looking, as real keys are: one holding a word is found in text
PLAN = json.dumps({"steps": [{"id": "a", "type": "think", "prompt": "hi"}]})
DEFAULT_SLEEP = 21600  # the seed's wake.sleep_seconds
THIRTY_DAYS = 30 * 86400
HEADS = (("orient", "# Orient"), ("reflect", "# Reflect"), ("deep", "# Deep reflection"), ("subplan", "# Subplan"))


# --- the scripted model -------------------------------------------------------------------------------

def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return content or ""


def last_message(req: dict) -> str:
    msgs = req.get("messages") or []
    return _text(msgs[-1].get("content")) if msgs else ""


def all_text(req: dict) -> str:
    return "\n".join(_text(m.get("content")) for m in req.get("messages") or [])


def kind(req: dict) -> str:
    first = (last_message(req).lstrip().splitlines() or [""])[0]
    return next((name for name, head in HEADS if first.startswith(head)), "other")


def reflection(summary: str = "did the thing", note: str = "carry on", load_keys: list | None = None,
               **extra: Any) -> str:
    r = {"session_summary": summary, "note_to_future_self": note,
         "next_orient_context": {"load_keys": ["wisdom"] if load_keys is None else load_keys}}
    r.update(extra)
    return json.dumps(r)


def deep_answer(**fields: Any) -> str:
    return json.dumps({"reflection": "I looked back.", "note_to_future_self": "keep going", **fields})


class Model:
    """The double's responder: an answer (or a function of the request) per kind of prompt."""

    def __init__(self, llm: LLMDouble):
        self.llm = llm
        self.answers: dict[str, Any] = {"orient": PLAN, "reflect": reflection(), "other": "ok",
                                        "deep": deep_answer(), "subplan": PLAN}
        llm.responder = self

    def __call__(self, req: dict) -> Any:
        a = self.answers[kind(req)]
        return a(req) if callable(a) else a


# --- fixtures and helpers -----------------------------------------------------------------------------

class Agent:
    def __init__(self, url: str, llm: LLMDouble):
        self.url = url
        self.llm = llm
        self.model = Model(llm)
        self.store = open_store(url)
        # What `brainstem seed --example-soul` does, in-process (a subprocess per test costs half a second).
        seed(self.store, soul_file=example_soul_path())
        self.seed_orient = self.store.get(keys.PROMPT_ORIENT)
        self.env = {"BRAINSTEM_KV": url, "OPENROUTER_BASE_URL": llm.base_url, "OPENROUTER_API_KEY": API_KEY,
                    "BRAINSTEM_LLM_BACKOFF": "0.01"}

    def wake(self, outcome: str | None = "clean", **env: Any) -> tuple[str, list[dict], list[dict]]:
        """One forced wake; (session id, karma entries, the LLM requests it made)."""
        before = len(self.llm.requests)
        r = run_cli("wake", "--force", env={**self.env, **{k: str(v) for k, v in env.items()}})
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        sid = karma.latest_session_id(self.store)
        entries = karma.read(self.store, sid)
        assert entries[0]["event"] == "session_start" and entries[-1]["event"] == "session_end", names(entries)
        if outcome is not None:
            assert entries[-1]["outcome"] == outcome, [e for e in entries if e["event"] in (
                "fatal_error", "orient_parse_error", "reflect_parse_error", "budget_exceeded", "step_failed")]
        assert self.store.get(keys.SESSION_CURRENT) is None
        return sid, entries, self.llm.requests[before:]

    def cli(self, *args: str):
        return run_cli(*args, env=self.env)

    def defaults(self) -> dict:
        return self.store.get_json(keys.CONFIG_DEFAULTS)

    def set_defaults(self, **sections: dict) -> None:
        cfg = self.defaults()
        for name, fields in sections.items():
            cfg[name] = {**cfg[name], **fields}
        self.store.put(keys.CONFIG_DEFAULTS, cfg)

    def history(self) -> list[dict]:
        return session_history.read(self.store)

    def entry(self, sid: str) -> dict:
        return next(h for h in self.history() if h.get("id") == sid)


@pytest.fixture
def agent(real_store_url):
    with LLMDouble() as llm:
        a = Agent(real_store_url, llm)
        yield a
        a.store.close()


def names(entries: list[dict]) -> list[str]:
    return [e["event"] for e in entries]


def events_of(entries: list[dict], name: str) -> list[dict]:
    return [e for e in entries if e["event"] == name]


def kinds(requests: list[dict]) -> list[str]:
    return [kind(r) for r in requests]


def one(requests: list[dict], k: str) -> dict:
    found = [r for r in requests if kind(r) == k]
    assert len(found) == 1, kinds(requests)
    return found[0]


def now() -> datetime:
    return datetime.now(timezone.utc)


def ago(days: float) -> str:
    return (now() - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")


def assert_sleeps(store, seconds: float, before: datetime, after: datetime) -> None:
    """wake_config asks for the next wake ``seconds`` after the session ended."""
    wc = store.get_json(keys.WAKE_CONFIG)
    assert wc["sleep_seconds"] == seconds, wc
    t = parse_iso(wc["next_wake_after"])
    assert before + timedelta(seconds=seconds - 1) <= t <= after + timedelta(seconds=seconds + 1), (wc, before, after)


def wake_timed(agent: Agent, **kw):
    before = now()
    out = agent.wake(**kw)
    return (*out, before, now())


# --- reflect --------------------------------------------------------------------------------------------

def test_reflection_is_applied_and_feeds_the_next_session(agent):
    st = agent.store
    st.put("notes:remember", "REMEMBER-ME-42")
    st.put("notes:old", "OLD-VALUE-17")
    st.put("notes:gone", "bye")
    models_before = st.get_json(keys.CONFIG_MODELS)
    agent.model.answers["reflect"] = reflection(
        "SUMMARY-ONE", "NOTE-ONE: check the pantry", ["notes:remember", "notes:new"],
        next_wake_config={"sleep_seconds": 7200},
        kv_operations=[{"op": "put", "key": "notes:a", "value": {"x": 1}},
                       {"op": "rename", "key": "notes:old", "value": "notes:new"},
                       {"op": "delete", "key": "notes:gone"}],
        model_details_updates={"haiku": {"max_output_tokens": 12345}})
    sid, entries, reqs, before, after = wake_timed(agent)
    assert kinds(reqs) == ["orient", "other", "reflect"]
    assert "REMEMBER-ME-42" not in last_message(reqs[0])  # not asked for yet

    last = st.get_json(keys.LAST_REFLECT)
    assert last["session_summary"] == "SUMMARY-ONE" and last["note_to_future_self"] == "NOTE-ONE: check the pantry"
    assert last["next_orient_context"] == {"load_keys": ["notes:remember", "notes:new"]}
    assert last["session_id"] == sid
    assert "kv_operations" not in last and "model_details_updates" not in last
    assert events_of(entries, "reflect")[0]["summary"] == "SUMMARY-ONE"
    assert agent.entry(sid)["summary"] == "SUMMARY-ONE"

    assert_sleeps(st, 7200, before, after)

    assert st.get_json("notes:a") == {"x": 1}
    assert st.get("notes:new") == "OLD-VALUE-17" and st.get("notes:old") is None and st.get("notes:gone") is None
    writes = [(e["op"], e["key"]) for e in events_of(entries, "kv_write") if e.get("source") == "reflect"]
    assert writes == [("put", "notes:a"), ("put", "notes:new"), ("delete", "notes:old"), ("delete", "notes:gone")]

    models = st.get_json(keys.CONFIG_MODELS)
    haiku = next(m for m in models["models"] if m["alias"] == "haiku")
    assert haiku["max_output_tokens"] == 12345
    assert {**haiku, "max_output_tokens": 64000} == next(m for m in models_before["models"] if m["alias"] == "haiku")
    assert [m for m in models["models"] if m["alias"] != "haiku"] == \
        [m for m in models_before["models"] if m["alias"] != "haiku"]
    assert models["alias_map"] == models_before["alias_map"]
    assert versions(st, keys.CONFIG_MODELS)[-1]["session_id"] == sid

    notes = st.get_json(keys.NOTES)
    assert notes[-1]["note"] == "NOTE-ONE: check the pantry" and notes[-1]["session_id"] == sid
    assert before - timedelta(seconds=1) <= parse_iso(notes[-1]["written_at"]) <= after + timedelta(seconds=1)

    # The next session's orient prompt carries the keys reflection asked to load, and the memory.
    agent.model.answers["reflect"] = reflection("SUMMARY-TWO")
    sid2, entries2, reqs2 = agent.wake()
    orient = last_message(one(reqs2, "orient"))
    assert "REMEMBER-ME-42" in orient and "OLD-VALUE-17" in orient and "SUMMARY-ONE" in orient
    reads = st.get_json(keys.READS)
    assert reads["notes:remember"]["count"] == 1 and reads["notes:new"]["count"] == 1
    assert st.get_json(keys.LAST_REFLECT)["session_id"] == sid2


@pytest.mark.parametrize("case", ["prose", "truncated", "bad_operation"])
def test_unusable_reflection_keeps_memory_and_sleeps_the_default(agent, case):
    st = agent.store
    agent.set_defaults(wake={"sleep_seconds": 5000})
    old = {"session_summary": "OLD-MEMORY", "note_to_future_self": "old note",
           "next_orient_context": {"load_keys": ["wisdom"]}, "session_id": "0-old"}
    st.put(keys.LAST_REFLECT, old)
    st.put("notes:keep", "K")
    agent.model.answers["reflect"] = {
        "prose": "I feel good about this session; nothing to add.",
        "truncated": {"content": '{"session_summary": "half a tho', "finish_reason": "length"},
        "bad_operation": reflection("NEW-SUMMARY", "NEW-NOTE", kv_operations=[
            {"op": "put", "key": "notes:new", "value": 1},
            {"operation": "set", "key": "notes:keep", "value": 2}]),
    }[case]
    sid, entries, reqs, before, after = wake_timed(agent)
    assert kinds(reqs) == ["orient", "other", "reflect"]
    assert_sleeps(st, 5000, before, after)  # from defaults: neither the reflection nor the plan asked
    last = st.get_json(keys.LAST_REFLECT)
    if case == "bad_operation":
        rejected = events_of(entries, "kv_operations_rejected")
        assert len(rejected) == 1 and rejected[0]["source"] == "reflect" and "operation" in rejected[0]["reason"]
        assert not events_of(entries, "reflect_parse_error")
        assert st.get("notes:new") is None and st.get("notes:keep") == "K"  # the batch is rejected whole
        assert last["session_summary"] == "NEW-SUMMARY" and last["session_id"] == sid and "parse_error" not in last
        assert st.get_json(keys.NOTES)[-1]["note"] == "NEW-NOTE"
    else:
        errors = events_of(entries, "reflect_parse_error")
        assert len(errors) == 1 and errors[0]["error"]
        assert not events_of(entries, "reflect")
        assert {k: last[k] for k in old} == old
        assert last["parse_error"]["session_id"] == sid and last["parse_error"]["error"]
        assert st.get(keys.NOTES) is None
        assert "summary" not in agent.entry(sid)


@pytest.mark.parametrize("case", ["put_soul", "rename_onto_soul", "huge_integer"])
def test_bad_reflection_input_is_refused_and_clamped(agent, case):
    st = agent.store
    soul = st.get(keys.SOUL)
    st.put("notes:src", "SRC")
    if case == "put_soul":
        ops = [{"op": "put", "key": "notes:ok", "value": 1}, {"op": "put", "key": "soul", "value": "EVIL SOUL"}]
        sleep, expected = -5, DEFAULT_SLEEP
    else:
        ops = [{"op": "put", "key": "notes:ok", "value": 1}, {"op": "rename", "key": "notes:src", "value": "soul"}]
        sleep, expected = (10 ** 12 if case == "rename_onto_soul" else 10 ** 400), THIRTY_DAYS
    agent.model.answers["reflect"] = reflection(
        "S", "N", kv_operations=ops, next_wake_config={"sleep_seconds": sleep},
        mood="great", soul="EVIL SOUL 2", wake_config={"next_wake_after": "2000-01-01T00:00:00Z"},
        deep_reflect_schedule={"last_session": 0, "after_sessions": 1})
    sid, entries, reqs, before, after = wake_timed(agent)
    assert st.get(keys.SOUL) == soul
    rejected = events_of(entries, "kv_operations_rejected")
    assert len(rejected) == 1 and "soul" in rejected[0]["reason"]
    assert st.get("notes:ok") is None and st.get("notes:src") == "SRC"  # nothing of the batch was written
    assert not [e for e in events_of(entries, "kv_write") if e.get("source") == "reflect"]
    assert_sleeps(st, expected, before, after)
    assert st.get(keys.DEEP_REFLECT_SCHEDULE) is None
    # unknown fields are ignored (and named), the rest of the reflection applies
    assert events_of(entries, "reflect")[0]["ignored_fields"] == ["deep_reflect_schedule", "mood", "soul",
                                                                   "wake_config"]
    last = st.get_json(keys.LAST_REFLECT)
    assert last["session_summary"] == "S" and last["session_id"] == sid
    assert not {"mood", "soul", "wake_config", "deep_reflect_schedule"} & set(last)


# --- deep reflection ---------------------------------------------------------------------------------------

NEW_ORIENT = ("# Orient\n\nDEEP-REWRITTEN ORIENT for session {{context.sessionId}}.\n"
              "Balances: {{context.balances}}\nAnswer with one JSON plan object.\n")


def wrapped_after(prompt: str, prefix: str) -> str:
    """The body of the trust boundary the line starting with ``prefix`` opens (memory is shown as data)."""
    lines = prompt.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith(prefix))
    assert "[UNTRUSTED CONTENT from memory " in lines[i], lines[i]
    return "\n".join(lines[i + 1:lines.index("[END UNTRUSTED CONTENT]", i)])


def memory_stats(prompt: str) -> dict:
    return json.loads(wrapped_after(prompt, "- Memory statistics"))


@pytest.mark.slow
def test_deep_reflection_applies_every_field(agent):
    st = agent.store
    st.put(keys.SESSION_COUNTER, "18")
    st.put(keys.LAST_REFLECT, {"session_summary": "x", "next_orient_context": {"load_keys": ["notes:hot"]}})
    st.put("notes:hot", "HOT")
    st.put("notes:cold", "COLD")
    st.put("blob:big", "b" * 50_000)
    env = {"BRAINSTEM_MAX_SESSION_COST": "0.3"}

    agent.model.answers["reflect"] = reflection("S19", "NOTE-FROM-19", ["notes:hot"])
    sid19, _, reqs = agent.wake(**env)
    assert kinds(reqs) == ["orient", "other", "reflect"]  # session 19: not due yet

    defaults_before = agent.defaults()
    models_before = st.get_json(keys.CONFIG_MODELS)
    agent.model.answers["deep"] = deep_answer(
        reflection="DEEP-REFLECTION", note_to_future_self="DEEP-NOTE",
        updated_wisdom="WISDOM-V2: fewer words.",
        kv_operations=[{"op": "put", "key": "notes:deep", "value": "D"}, {"op": "delete", "key": "notes:cold"}],
        updated_defaults={"session_budget": {"max_steps": 7, "max_cost": 50}},
        updated_model_details={"sonnet": {"output_cost_per_mtok": 16.5}},
        orient_prompt_proposals=[{"proposed_text": NEW_ORIENT, "why": "shorter"},
                                 {"proposed_text": "# Orient\nSECOND PROPOSAL"}],
        next_deep_reflect={"after_sessions": 5, "after_days": 3},
        next_wake_config={"sleep_seconds": 4321})
    sid, entries, reqs, before, after = wake_timed(agent, **env)
    assert kinds(reqs) == ["deep"] and reqs[0]["model"] == "anthropic/claude-sonnet-4.5"
    assert entries[-1]["kind"] == "deep_reflect" and agent.entry(sid)["kind"] == "deep_reflect"
    done = [e for e in events_of(entries, "deep_reflect") if "applied" in e]
    assert done[0]["applied"] == ["wisdom", "kv_operations", "defaults", "model_details", "orient_prompt"]

    # what the deep prompt was shown: memory statistics and the notes of past selves
    prompt = last_message(reqs[0])
    stats = memory_stats(prompt)
    assert stats["hotKeys"][0] == {"key": "notes:hot", "reads": 1}
    assert "notes:cold" in stats["notReadRecently"] and "notes:hot" not in stats["notReadRecently"]
    assert stats["largestKeys"][0] == {"key": "blob:big", "chars": 50_000}
    assert stats["pastNotes"][-1]["note"] == "NOTE-FROM-19" and stats["pastNotes"][-1]["session_id"] == sid19
    # only keys the agent could act on: never the soul or the runtime's own keys (a kv_operations batch
    # touching one of them is rejected whole)
    listed = stats["notReadRecently"] + [k["key"] for k in stats["largestKeys"] + stats["hotKeys"]]
    assert "prompt:orient" in listed
    assert not [k for k in listed if keys.is_runtime_owned(k)], listed
    notes_line = wrapped_after(prompt, "- Notes from past selves")
    assert "{{" not in notes_line and "NOTE-FROM-19" in notes_line, notes_line
    assert "WISDOM-V2" not in prompt and "S19" in prompt  # the old wisdom, and the session history

    # every field applied
    assert st.get(keys.WISDOM) == "WISDOM-V2: fewer words."
    wv = versions(st, keys.WISDOM)
    assert wv[-1]["value"] == "WISDOM-V2: fewer words." and wv[-1]["session_id"] == sid
    assert st.get("notes:deep") == "D" and st.get("notes:cold") is None
    defaults = agent.defaults()
    assert defaults["session_budget"] == {"max_cost": 50, "max_steps": 7, "max_duration_seconds": 600}
    assert {k: v for k, v in defaults.items() if k != "session_budget"} == \
        {k: v for k, v in defaults_before.items() if k != "session_budget"}
    models = st.get_json(keys.CONFIG_MODELS)
    sonnet = next(m for m in models["models"] if m["alias"] == "sonnet")
    assert sonnet["output_cost_per_mtok"] == 16.5
    assert [m for m in models["models"] if m["alias"] != "sonnet"] == \
        [m for m in models_before["models"] if m["alias"] != "sonnet"]
    assert st.get(keys.PROMPT_ORIENT) == NEW_ORIENT
    ov = versions(st, keys.PROMPT_ORIENT)
    assert [v["value"] for v in ov] == [agent.seed_orient, NEW_ORIENT]
    assert ov[0]["source"] == "initial" and ov[1]["session_id"] == sid
    sched = st.get_json(keys.DEEP_REFLECT_SCHEDULE)
    assert sched["last_session"] == 20 and sched["after_sessions"] == 5 and sched["after_days"] == 3
    assert before - timedelta(seconds=1) <= parse_iso(sched["last_at"]) <= after
    assert_sleeps(st, 4321, before, after)
    last = st.get_json(keys.LAST_REFLECT)
    assert last["reflection"] == "DEEP-REFLECTION" and last["kind"] == "deep" and last["session_id"] == sid
    assert last["next_orient_context"] == {"load_keys": ["notes:hot"]}  # short-term memory carried over
    assert st.get_json(keys.NOTES)[-1]["note"] == "DEEP-NOTE"
    assert agent.entry(sid)["summary"] == "DEEP-REFLECTION"

    # session 21: not due (1 of 5) -> orient, with the new prompt and the new (clamped) budget
    sid21, entries21, reqs21 = agent.wake(**env)
    assert kinds(reqs21)[0] == "orient" and "deep" not in kinds(reqs21)
    assert last_message(reqs21[0]).startswith(f"# Orient\n\nDEEP-REWRITTEN ORIENT for session {sid21}.")
    budget = entries21[0]["budget"]
    assert budget["max_steps"] == 7
    assert budget["max_cost"] == pytest.approx(0.3)  # 50 is stored, the operator's ceiling applies at use
    assert agent.defaults()["session_budget"]["max_cost"] == 50


@pytest.mark.parametrize("case", ["days_elapsed", "sessions_elapsed", "not_due"])
def test_deep_reflection_due_by_schedule(agent, case):
    st = agent.store
    counter, last_at = {"days_elapsed": (3, ago(8)), "sessions_elapsed": (21, ago(1)),
                        "not_due": (3, ago(6))}[case]
    st.put(keys.SESSION_COUNTER, str(counter))
    schedule = {"last_session": 2, "last_at": last_at, "after_sessions": 20, "after_days": 7}
    st.put(keys.DEEP_REFLECT_SCHEDULE, schedule)
    agent.model.answers["deep"] = deep_answer(updated_wisdom="W-DEEP")
    sid, entries, reqs = agent.wake()
    if case == "not_due":
        assert kinds(reqs) == ["orient", "other", "reflect"]
        assert "Deep reflection due: false" in last_message(reqs[0])
        assert st.get_json(keys.DEEP_REFLECT_SCHEDULE) == schedule and st.get(keys.WISDOM) is None
        return
    assert kinds(reqs) == ["deep"]
    start = [e for e in events_of(entries, "deep_reflect") if e.get("phase") == "start"]
    assert ("days since" if case == "days_elapsed" else "sessions since") in start[0]["reason"]
    sched = st.get_json(keys.DEEP_REFLECT_SCHEDULE)
    assert sched["last_session"] == counter + 1 and parse_iso(sched["last_at"]) > now() - timedelta(minutes=1)
    assert st.get(keys.WISDOM) == "W-DEEP"


def test_invalid_updated_defaults_is_rejected_and_the_rest_applies(agent):
    st = agent.store
    st.put(keys.SESSION_COUNTER, "19")
    defaults_text = st.get(keys.CONFIG_DEFAULTS)
    models_text = st.get(keys.CONFIG_MODELS)
    agent.model.answers["deep"] = deep_answer(
        updated_wisdom="W-STILL-APPLIED",
        updated_defaults={"session_budget": {"max_steps": "lots"}},
        updated_model_details={"haiku": {"input_cost_per_mtok": -1}},
        next_deep_reflect={"after_sessions": "AS", "after_days": "AD"},
    ).replace('"AS"', "1e999").replace('"AD"', "-1e999")  # valid JSON numbers that overflow to infinity
    sid, entries, reqs = agent.wake()
    assert kinds(reqs) == ["deep"]
    rejected = {e["key"]: e for e in events_of(entries, "config_rejected") if e.get("key")}
    assert "max_steps" in rejected[keys.CONFIG_DEFAULTS]["reason"]
    assert rejected[keys.CONFIG_DEFAULTS]["update"] == {"session_budget": {"max_steps": "lots"}}
    assert "input_cost_per_mtok" in rejected[keys.CONFIG_MODELS]["reason"]
    assert st.get(keys.CONFIG_DEFAULTS) == defaults_text and st.get(keys.CONFIG_MODELS) == models_text
    assert versions(st, keys.CONFIG_DEFAULTS) == [] and versions(st, keys.CONFIG_MODELS) == []
    assert st.get(keys.WISDOM) == "W-STILL-APPLIED"
    assert [e for e in events_of(entries, "deep_reflect") if "applied" in e][0]["applied"] == ["wisdom"]
    sched = st.get_json(keys.DEEP_REFLECT_SCHEDULE)
    assert sched["last_session"] == 20  # moved forward; the unusable interval falls back to the defaults
    assert sched["after_sessions"] == 20 and sched["after_days"] == 7


@pytest.mark.slow
def test_deep_reflection_in_prose_is_no_reflection_and_stays_due(agent):
    st = agent.store
    st.put(keys.SESSION_COUNTER, "19")
    st.put(keys.WISDOM, "OLD WISDOM")
    agent.model.answers["deep"] = "I reflected deeply, but forgot to answer in JSON."
    sid, entries, reqs, before, after = wake_timed(agent, outcome="no_reflection")
    assert kinds(reqs) == ["deep"]
    assert [e.get("kind") for e in events_of(entries, "reflect_parse_error")] == ["deep"]
    sched = st.get_json(keys.DEEP_REFLECT_SCHEDULE)  # not done, so not marked done: the miss is counted
    assert "last_session" not in sched and sched["missed"] == 1 and sched["missed_session"] == 20
    assert st.get(keys.WISDOM) == "OLD WISDOM"
    assert_sleeps(st, DEFAULT_SLEEP, before, after)  # on the normal sleep: never every tick
    agent.model.answers["deep"] = deep_answer(updated_wisdom="W-AT-LAST")
    sid2, entries2, reqs2 = agent.wake(outcome="clean")
    assert kinds(reqs2) == ["deep"]  # the next wake does what the last one could not
    assert st.get_json(keys.DEEP_REFLECT_SCHEDULE)["last_session"] == 21 and st.get(keys.WISDOM) == "W-AT-LAST"


# --- versions, rollback and the operator ------------------------------------------------------------------

@pytest.mark.slow
def test_rollback_restores_the_seed_orient_prompt(agent):
    st = agent.store
    st.put(keys.SESSION_COUNTER, "19")
    agent.model.answers["deep"] = deep_answer(orient_prompt_proposals=[{"proposed_text": NEW_ORIENT}],
                                              next_deep_reflect={"after_sessions": 50})
    sid, _, reqs = agent.wake()
    assert kinds(reqs) == ["deep"] and st.get(keys.PROMPT_ORIENT) == NEW_ORIENT

    r = agent.cli("history", "prompt:orient")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].lstrip(" ").startswith("v1") and "initial" in lines[0] and "# Orient" in lines[0]
    assert lines[1].split()[:2] == ["*", "v2"] and sid in lines[1] and f"{len(NEW_ORIENT)}B" in lines[1]
    assert versions(st, keys.PROMPT_ORIENT)[1]["source"] not in ("initial", "operator")

    r = agent.cli("diff", "prompt:orient")
    assert r.returncode == 0, r.stderr
    diff = r.stdout.splitlines()
    assert "--- prompt:orient (version 1)" in diff and "+++ prompt:orient (current)" in diff
    assert "-## Where you stand" in diff and "+Answer with one JSON plan object." in diff

    r = agent.cli("rollback", "prompt:orient")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "prompt:orient: restored version 1 (now version 3)"
    assert st.get(keys.PROMPT_ORIENT) == agent.seed_orient  # byte-identical
    assert versions(st, keys.PROMPT_ORIENT)[-1]["source"] == "operator:rollback"

    sid2, _, reqs2 = agent.wake()
    orient = last_message(one(reqs2, "orient"))
    assert orient.startswith(agent.seed_orient.split("{{")[0]) and "DEEP-REWRITTEN" not in orient

    r = agent.cli("rollback", "prompt:orient", "--to", "99")
    assert r.returncode != 0 and r.stdout == ""
    err = [line for line in r.stderr.splitlines() if line.strip()]
    assert err == ["brainstem: error: 'prompt:orient' has no version 99 (kept: 1, 2, 3)"]
    assert st.get(keys.PROMPT_ORIENT) == agent.seed_orient

    seed_reflect = st.get(keys.PROMPT_REFLECT)
    r = agent.cli("kv", "put", "prompt:reflect", "# Reflect\nOPERATOR'S REFLECT PROMPT\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("version 2")
    rv = versions(st, keys.PROMPT_REFLECT)
    assert [(v["value"], v["source"], v["session_id"]) for v in rv] == [
        (seed_reflect, "initial", None), ("# Reflect\nOPERATOR'S REFLECT PROMPT\n", "operator", None)]


# --- auto-restore --------------------------------------------------------------------------------------------

BROKEN_ORIENT = "# Orient\nBROKEN-ORIENT: tell a story about your day.\n"


def prose_when_broken(answer: Any):
    """The model answers prose to anything that carries the broken orient prompt (and its repair)."""
    return lambda req: "Once upon a time, I woke up." if "BROKEN-ORIENT" in all_text(req) else answer


class RestoringSessionRanBroken(AssertionError):
    """Only this failure is the known bug below; any other failure of the test is a real one."""


@pytest.mark.slow
def test_auto_restore_after_three_failing_sessions(agent):
    st = agent.store
    agent.set_defaults(deep_reflect={"default_interval_sessions": 2})
    agent.model.answers["orient"] = prose_when_broken(PLAN)
    agent.model.answers["other"] = prose_when_broken("ok")
    clean_sid, _, _ = agent.wake()  # session 1: clean, runs with the seed prompt and config
    clean_defaults = st.get(keys.CONFIG_DEFAULTS)

    # session 2: deep reflection breaks the orient prompt (and changes a default)
    agent.model.answers["deep"] = deep_answer(orient_prompt_proposals=[{"proposed_text": BROKEN_ORIENT}],
                                              updated_defaults={"wake": {"sleep_seconds": 7777}},
                                              next_deep_reflect={"after_sessions": 100})
    _, _, reqs = agent.wake()
    assert kinds(reqs) == ["deep"] and st.get(keys.PROMPT_ORIENT) == BROKEN_ORIENT

    failed = []
    for _ in range(3):
        sid, entries, reqs = agent.wake(outcome="no_plan")
        assert len(events_of(entries, "orient_parse_error")) == 2 and not events_of(entries, "auto_restore")
        assert last_message(reqs[0]) == BROKEN_ORIENT
        failed.append(sid)
    assert st.get(keys.PROMPT_ORIENT) == BROKEN_ORIENT

    sid, entries, reqs = agent.wake(outcome=None)  # restores, then should plan again
    restore = events_of(entries, "auto_restore")
    assert len(restore) == 1 and restore[0]["failed_sessions"] == failed
    assert sorted(restore[0]["restored"]) == [keys.CONFIG_DEFAULTS, keys.PROMPT_ORIENT]
    assert names(entries).index("auto_restore") < names(entries).index("llm_call")
    assert st.get(keys.PROMPT_ORIENT) == agent.seed_orient  # what the last clean session ran with
    assert st.get(keys.CONFIG_DEFAULTS) == clean_defaults
    last = versions(st, keys.PROMPT_ORIENT)[-1]
    assert last["source"] == "runtime:auto_restore" and last["session_id"] == sid
    restoring = (entries[-1]["outcome"], last_message(reqs[0]))

    # the next wake: no second restore, and it plans with the restored prompt
    sid5, entries5, reqs5 = agent.wake()
    assert not events_of(entries5, "auto_restore")
    assert kinds(reqs5) == ["orient", "other", "reflect"] and len(events_of(entries5, "plan")) == 1
    assert last_message(reqs5[0]).startswith(agent.seed_orient.split("{{")[0])
    assert st.get(keys.PROMPT_ORIENT) == agent.seed_orient

    # The restoring session itself should already plan with what it restored.
    if restoring[0] != "clean" or "BROKEN-ORIENT" in restoring[1]:
        raise RestoringSessionRanBroken(f"the restoring session {sid} ended {restoring[0]!r} and oriented with "
                                        f"{restoring[1][:60]!r}")


@pytest.mark.slow
def test_auto_restore_happens_once_per_failing_streak(agent):
    st = agent.store
    # session 1 is clean; its reflection breaks the orient prompt through kv_operations
    agent.model.answers["reflect"] = reflection(kv_operations=[
        {"op": "put", "key": keys.PROMPT_ORIENT, "value": BROKEN_ORIENT}])
    agent.wake()
    assert st.get(keys.PROMPT_ORIENT) == BROKEN_ORIENT
    agent.model.answers["orient"] = agent.model.answers["other"] = "I only speak in prose now."
    streak = [agent.wake(outcome="no_plan")[0] for _ in range(3)]
    sid, entries, _ = agent.wake(outcome="no_plan")  # restores; the model still fails
    restore = events_of(entries, "auto_restore")
    assert len(restore) == 1 and restore[0]["failed_sessions"] == streak
    assert restore[0]["restored"] == [keys.PROMPT_ORIENT]
    assert st.get(keys.PROMPT_ORIENT) == agent.seed_orient
    # broken again within the same streak: no second restore, no loop
    st.put(keys.PROMPT_ORIENT, BROKEN_ORIENT)
    sid, entries, _ = agent.wake(outcome="no_plan")
    assert not events_of(entries, "auto_restore")
    assert st.get(keys.PROMPT_ORIENT) == BROKEN_ORIENT
    assert [h["outcome"] for h in agent.history()] == ["clean"] + ["no_plan"] * 5


# --- retention ------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_karma_older_than_the_retention_is_expired(agent):
    st = agent.store
    agent.model.answers["reflect"] = reflection("FIRST-SUMMARY")
    sid1, entries1, _ = agent.wake()
    kept = agent.entry(sid1)
    assert st.log_length(keys.karma(sid1)) == len(entries1)
    time.sleep(1.2)
    agent.model.answers["reflect"] = reflection("SECOND-SUMMARY")
    sid2, entries2, _ = agent.wake(BRAINSTEM_KARMA_RETENTION_DAYS="0.00001")
    assert st.log_length(keys.karma(sid1)) == 0 and karma.read(st, sid1) == []
    assert entries2[-1]["karma_expired"] == 1
    h1 = agent.entry(sid1)
    assert h1["karma_expired"] is True
    assert {k: v for k, v in h1.items() if k != "karma_expired"} == kept
    assert h1["summary"] == "FIRST-SUMMARY" and h1["outcome"] == "clean" and h1["steps"] == 1 and h1["cost"] > 0
    assert st.log_length(keys.karma(sid2)) == len(entries2)  # the current session keeps its karma
    assert "karma_expired" not in agent.entry(sid2)
    r = agent.cli("karma", sid1)
    assert r.returncode != 0 and "no karma" in r.stderr


def test_history_is_capped_and_dropped_sessions_take_their_karma(agent):
    st = agent.store
    # A history from before (one JSON list), full to the trimming point: HISTORY_MAX plus its slack.
    old = [{"id": f"old-{i}", "outcome": "clean", "started_at": "2020-01-01T00:00:00Z",
            "ended_at": "2020-01-01T00:01:00Z", "karma_expired": i == 101} for i in range(1100)]
    st.put(keys.SESSION_HISTORY, old)
    for i in (0, 102):
        st.append(keys.karma(f"old-{i}"), json.dumps({"event": "session_start"}))
    sid, _, _ = agent.wake()
    h = agent.history()
    assert len(h) == 1000 and h[-1]["id"] == sid and h[0]["id"] == "old-101"
    assert st.log_length(keys.karma("old-0")) == 0  # dropped from the history: karma gone
    # old-102 is still listed; it is older than the default 30-day retention, so its karma expired
    assert st.log_length(keys.karma("old-102")) == 0 and h[1]["karma_expired"] is True
    assert st.log_length(keys.karma(sid)) > 0

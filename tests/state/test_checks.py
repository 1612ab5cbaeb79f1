"""``brainstem kv put`` checks config:*, prompt:* and schedule:* values before writing them (on SQLite and real Redis).

A bad value is exit 2 with one line naming the key and the field, and the stored value is what it was;
``--force`` stores it anyway and says so; good values (the shipped ones among them) still go in.
The agent's writes (plans, reflections, tools, through the guarded view) pass the same check.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st_

from brainstem.state.checks import check_value
from tests.helpers import REPO, one_line, run_cli

SEED = REPO / "prompts_seed"

BAD = [
    ("config:defaults", '{"orient": {bad json', "config:defaults: not valid JSON"),
    ("config:defaults", '{"orient": {"max_output_tokens": 1}}',
     "config:defaults: orient.max_output_tokens: Input should be greater than or equal to 16"),
    ("config:defaults", '{"wake": {"default_effort": "huge"}}', "config:defaults: wake.default_effort:"),
    ("config:defaults", "[1, 2]", "config:defaults: (root):"),
    ("config:models", '{"models": "not a list"}', "config:models: models:"),
    ("config:models", '{"models": [{"id": "a"}, {"id": "a"}]}', "config:models: models: Value error, model ids"),
    ("config:models", '{"models": [{"alias": "x"}]}', "config:models: models.0.id: Field required"),
    ("config:resources", '["openrouter"]', "config:resources: (root): should be an object"),
    ("config:resources", '{"openrouter": {}}', "config:resources: resources: missing"),
    ("config:resources", '{"resources": {"openrouter": "credit"}}',
     "config:resources: resources.openrouter: should be an object, got str"),
    ("config:tool_registry", '{"tools": []}', "config:tool_registry: tools: should be an object"),
    ("config:tool_registry", '{"tools": {"kv_read": {"description": 3}}}',
     "config:tool_registry: tools.kv_read.description: should be text, got int"),
    ("config:tool_registry", '{"tools": {"kv_read": {"input": "x"}}}',
     "config:tool_registry: tools.kv_read.input: should be an object"),
    ("config:reflexes", '{"name": "x"}', "config:reflexes: must be a JSON list of rules"),
    ("config:reflexes", '[{"name": "x"}]', "config:reflexes[0] (x): when: Field required"),
    ("config:mine", "{not json", "config:mine: not valid JSON"),
    ("prompt:orient", "Now: {{context.now}\nplan.", "prompt:orient: line 1: '{{context.now}\\nplan.' is never closed"),
    ("prompt:orient", "a\nb {{ context.now | upper }}", "prompt:orient: line 2: '{{ context.now | upper }}' is not a "
                                                       "placeholder"),
    ("prompt:orient", "You are {{soul}}. Plan.", "prompt:orient: line 1: '{{soul}}' templates the soul"),
    ("prompt:reflect", "Who: {{ soul.name }}", "prompt:reflect: line 1: '{{ soul.name }}' templates the soul"),
    ("prompt:subplan", "  \n", "prompt:subplan: empty"),
    ("schedule:s1", '{"tool": "t"}', "schedule:s1: give exactly one of every (e.g. 30m, 1d) and cron"),
    ("schedule:s1", '{"tool": "t", "cron": "0 25 * * *"}', "schedule:s1: cron '0 25 * * *': hour '25' is out of range"),
    ("schedule:s1", '{"tool": "t", "cron": "0 9 * * *", "tz": "Mars/Base"}',
     "schedule:s1: tz 'Mars/Base' is not a known time zone"),
    ("schedule:s1", '{"tool": "t", "every": "1h", "tz": "Europe/London"}', "schedule:s1: tz 'Europe/London' goes with "
                                                                           "cron only"),
    ("schedule:s1", '{"tool": "t", every', "schedule:s1: not valid JSON"),
    ("schedule:s1", '{"id": "s2", "tool": "t", "every": "1h"}', "schedule:s1: id 's2' is not the key's id 's1'"),
    ("schedule:s1", '{"tool": "t", "every": "1h", "colour": "red"}', "schedule:s1: colour: not a field of a schedule"),
    ("schedule:s1", '{"tool": "t", "every": "1h", "notify": "email"}', "schedule:s1: notify:"),
    ("schedule:s1", '{"tool": "t", "every": "1h", "next_run": "tomorrow"}', "schedule:s1: next_run: 'tomorrow' is not"),
    ("schedule:s1", "[1]", "schedule:s1: a schedule is a JSON object, got list"),
    ("schedule:a:b", '{"tool": "t", "every": "1h"}', "schedule:a:b: schedule id 'a:b' is not 1-64 letters"),
]


@pytest.fixture
def env(real_store_url):
    env = {"BRAINSTEM_KV": real_store_url}
    r = run_cli("seed", "--example-soul", env=env)
    assert r.returncode == 0, r.stderr
    return env


def stored(key: str, env: dict) -> str | None:
    r = run_cli("kv", "get", key, env=env)
    return r.stdout.removesuffix("\n") if r.returncode == 0 else None  # kv get ends what it prints with a newline


@pytest.mark.parametrize("key,value,said", BAD, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(BAD)])
def test_the_check_names_the_key_and_the_field(key, value, said):
    assert check_value(key, value).startswith(said)


def test_a_bad_value_is_exit_2_in_one_line_and_nothing_is_written(env, tmp_path):
    for key, value, said in BAD:
        before = stored(key, env)
        for args in (("kv", "put", key, value), ("kv", "put", key, "--file", _file(tmp_path, value))):
            r = run_cli(*args, env=env)
            assert r.returncode == 2, (args, r.stdout, r.stderr)
            line = one_line(r.stderr)
            assert line.startswith(f"error: {said}") or said in line, (said, line)
            assert "nothing written" in line
            assert stored(key, env) == before, key
    r = run_cli("changes", "--json", env=env)
    assert r.returncode == 0 and r.stdout.strip() == "", r.stdout  # not one version was recorded


def test_json_path_checks_the_normalised_value(env):
    r = run_cli("kv", "put", "config:defaults", "--json", '{"orient": {"max_output_tokens": 8}}', env=env)
    assert r.returncode == 2 and "orient.max_output_tokens" in one_line(r.stderr)
    r = run_cli("kv", "put", "config:defaults", "--json", '{"orient": {bad', env=env)
    assert r.returncode != 0 and "not valid JSON" in one_line(r.stderr)
    good = {"orient": {"max_output_tokens": 3000}}
    r = run_cli("kv", "put", "config:defaults", "--json", json.dumps(good, indent=2), env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(stored("config:defaults", env)) == good


def test_force_stores_it_anyway_and_says_so(env):
    r = run_cli("kv", "put", "config:defaults", '{"orient": {bad json', "--force", env=env)
    assert r.returncode == 0, r.stderr
    assert "version" in r.stdout
    assert "stored despite its check (--force): config:defaults: not valid JSON" in r.stderr
    assert stored("config:defaults", env) == '{"orient": {bad json'
    r = run_cli("kv", "put", "prompt:orient", "{{soul}}", "--force", env=env)
    assert r.returncode == 0 and "templates the soul" in r.stderr
    assert stored("prompt:orient", env) == "{{soul}}"


def test_an_operator_schedule_goes_in_as_written_and_one_without_created_by_is_said_to_be_the_agents(env):
    mine = {"tool": "kv_read", "input": {"key": "wisdom"}, "cron": "0 9 * * MON-FRI", "tz": "Europe/London",
            "created_by": "operator", "next_run": "2026-05-04T08:00:00Z"}
    r = run_cli("kv", "put", "schedule:morning", json.dumps(mine), env=env)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert json.loads(stored("schedule:morning", env)) == mine  # moving next_run by hand is how it is done
    r = run_cli("kv", "put", "schedule:other", '{"tool": "kv_read", "every": "1h"}', env=env)
    assert r.returncode == 0
    assert "schedule:other has no created_by, so it counts as the agent's" in one_line(r.stderr)
    listed = {s["id"]: s for s in map(json.loads, run_cli("schedule", "list", "--json", env=env).stdout.splitlines())}
    assert listed["morning"]["created_by"] == "operator" and listed["other"]["created_by"] == "agent"


def test_force_stores_a_malformed_schedule_which_is_then_listed_as_invalid(env):
    r = run_cli("kv", "put", "schedule:broken", '{"tool": "t", "created_by": "operator"}', "--force", env=env)
    assert r.returncode == 0 and "stored despite its check (--force): schedule:broken: give exactly one" in r.stderr
    (entry,) = map(json.loads, run_cli("schedule", "list", "--json", env=env).stdout.splitlines())
    assert entry == {"id": "broken", "key": "schedule:broken",
                     "error": "give exactly one of every (e.g. 30m, 1d) and cron (five fields)"}


def test_force_does_not_store_reflexes_that_are_not_rules(env):
    r = run_cli("kv", "put", "config:reflexes", '[{"name": "x"}]', "--force", env=env)
    assert r.returncode == 2 and "even with --force" in one_line(r.stderr)
    assert stored("config:reflexes", env) is None


def test_good_values_are_still_accepted(env, tmp_path):
    for name in ("defaults", "models", "resources", "tool_registry"):
        r = run_cli("kv", "put", f"config:{name}", "--file", str(SEED / "config" / f"{name}.json"), env=env)
        assert r.returncode == 0, (name, r.stderr)
        assert r.stderr == ""
    for name in ("orient", "reflect", "deep", "subplan"):
        r = run_cli("kv", "put", f"prompt:{name}", "--file", str(SEED / f"{name}.md"), env=env)
        assert r.returncode == 0, (name, r.stderr)
    ok = [("config:defaults", '{"orient": {"max_output_tokens": 16}, "my_own": 1}'),
          ("config:reflexes", "[]"), ("config:mine", '"any JSON"'),
          ("config:resources", '{"resources": {}}'),
          ("prompt:orient", 'Now {{context.now}}; example: {"a": {"b": 1}}'),  # a stray }} closes JSON
          ("prompt:mine", "{{ unknown.name }} is left as it is"),
          ("wisdom", "{{soul}} {{ not checked"),  # neither config:* nor prompt:*
          ("notes:x", "{oops")]
    for key, value in ok:
        r = run_cli("kv", "put", key, value, env=env)
        assert r.returncode == 0, (key, r.stderr)
        assert stored(key, env) == value


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "value.txt"
    path.write_text(text)
    return str(path)


# --- the agent's writes pass the same check ------------------------------------------------------

CHECKED_KEYS = ["config:defaults", "config:models", "config:resources", "config:tool_registry", "config:reflexes",
                "config:mine", "prompt:orient", "prompt:reflect", "prompt:deep", "prompt:mine"]
PIECES = ["", " ", "\n", "Plan now.", "{{context.now}}", "{{soul}}", "{{ soul.name }}", "{{x | upper}}", "{{open",
          "}}", "{{", "{{}}", "{{a.b.0}}", '{"a": {"b": 1}}', "{bad", "[]", "[1, 2]", '"any"', "null",
          '{"orient": {"max_output_tokens": 16}}', '{"orient": {"max_output_tokens": 1}}',
          '{"wake": {"default_effort": "huge"}}', '{"models": [{"id": "a"}]}', '{"models": "x"}',
          '{"resources": {}}', '{"resources": {"r": 1}}', '{"tools": {"t": {"description": 3}}}',
          '{"tools": {"t": {"description": "d", "input": {}}}}', '[{"name": "x"}]', "\u200b", "<|im_start|>"]
generated_value = st_.one_of(st_.lists(st_.sampled_from(PIECES), max_size=4).map("".join),
                             st_.text(max_size=40), st_.sampled_from(BAD).map(lambda bad: bad[1]))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(key=st_.sampled_from(CHECKED_KEYS), value=generated_value)
def test_the_agent_may_write_exactly_what_kv_put_accepts(env, key, value):
    """Plans, reflections and tools write through the guarded view; it accepts a config:* or prompt:*
    value exactly when the operator's kv put (without --force) does. The one rule that is the agent's
    alone (it may not lower its replay gate) cannot bind here: the stored gate is 0."""
    from brainstem.core.errors import KVWriteRefused
    from brainstem.state.guarded import AgentKV
    from brainstem.store import open_store

    store = open_store(env["BRAINSTEM_KV"])
    try:
        store.put("config:defaults", json.dumps({"deep_reflect": {"replay_gate_sessions": 0}}))
        before = store.get(key)
        try:
            AgentKV(store).put(key, value)
            agent_took = True
        except KVWriteRefused as exc:
            agent_took = False
            assert str(exc).startswith(key), exc  # it names the key (and the field), as kv put does
        assert (store.get(key) == value) if agent_took else (store.get(key) == before)
        _restore(store, key, before)
        r = run_cli("kv", "put", key, "--", value, env=env)
        assert r.returncode in (0, 2), r.stderr
        assert agent_took == (r.returncode == 0), (key, value, r.stderr)
        _restore(store, key, before)
    finally:
        store.close()


def _restore(store, key: str, value: str | None) -> None:
    if value is None:
        store.delete(key)
    else:
        store.put(key, value)


@pytest.mark.parametrize("key,value,said", [
    ("prompt:reflect", "{{soul}}", "prompt:reflect: line 1: '{{soul}}' templates the soul"),
    ("prompt:deep", "", "prompt:deep: empty"),
    ("config:tool_registry", '{"tools": []}', "config:tool_registry: tools: should be an object"),
])
def test_a_reflection_cannot_write_what_kv_put_refuses(real_store_url, llm, key, value, said):
    from tests.wake_helpers import answers, events_of, finished, plan, reflection, run_wake, seeded, think, wake_env

    store = seeded(real_store_url)
    before = store.get(key)
    llm.queue(plan(think("hi")))
    llm.responder = answers("ok", reflect=reflection("rewrite my prompts", kv_operations=[
        {"op": "put", "key": "notes:x", "value": "y"}, {"op": "put", "key": key, "value": value}]))
    _, entries = finished(run_wake(wake_env(real_store_url, llm), "--force"), store)
    (rejected,) = events_of(entries, "kv_operations_rejected")
    assert rejected["reason"].startswith(said), rejected
    assert store.get(key) == before and store.get("notes:x") is None  # the batch, whole
    store.close()


@pytest.mark.parametrize("value", ["tok-live-0123456789\n", "tok-live-01234\r\n56789", "tök-live-0123456789", "a\tb"])
def test_a_secret_that_could_not_travel_as_it_is_is_refused_when_written(tmp_path, value):
    """Whether a request can go out must never depend on a secret's value (a line break in a header is
    refused, a non-ASCII one fails): a value that could not travel is refused when it is written."""
    assert "printable ASCII" in check_value("secret:api", value)
    assert check_value("secret:api", "tok-live-0123456789 ok") is None
    url = f"sqlite:///{tmp_path / 'store.db'}"
    r = run_cli("kv", "put", "secret:api", value, env={"BRAINSTEM_KV": url})
    assert r.returncode == 2 and "printable ASCII" in r.stderr, (r.returncode, r.stderr)

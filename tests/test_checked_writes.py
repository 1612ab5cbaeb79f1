"""``brainstem kv put`` checks config:* and prompt:* values before writing them (on SQLite and real Redis).

A bad value is exit 2 with one line naming the key and the field, and the stored value is what it was;
``--force`` stores it anyway and says so; good values (the shipped ones among them) still go in.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from brainstem.state.checks import check_value

from .conftest import run_cli

SEED = Path(__file__).resolve().parent.parent / "prompts_seed"

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


def one_line(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.mark.parametrize("key,value,said", BAD, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(BAD)])
def test_the_check_names_the_key_and_the_field(key, value, said):
    assert check_value(key, value).startswith(said)


def test_a_bad_value_is_exit_2_in_one_line_and_nothing_is_written(env, tmp_path):
    for key, value, said in BAD:
        before = stored(key, env)
        for args in (("kv", "put", key, value), ("kv", "put", key, "--file", _file(tmp_path, value))):
            r = run_cli(*args, env=env)
            assert r.returncode == 2, (args, r.stdout, r.stderr)
            line = one_line(r)
            assert line.startswith(f"error: {said}") or said in line, (said, line)
            assert "nothing written" in line
            assert stored(key, env) == before, key
    r = run_cli("changes", "--json", env=env)
    assert r.returncode == 0 and r.stdout.strip() == "", r.stdout  # not one version was recorded


def test_json_path_checks_the_normalised_value(env):
    r = run_cli("kv", "put", "config:defaults", "--json", '{"orient": {"max_output_tokens": 8}}', env=env)
    assert r.returncode == 2 and "orient.max_output_tokens" in one_line(r)
    r = run_cli("kv", "put", "config:defaults", "--json", '{"orient": {bad', env=env)
    assert r.returncode != 0 and "not valid JSON" in one_line(r)
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


def test_force_does_not_store_reflexes_that_are_not_rules(env):
    r = run_cli("kv", "put", "config:reflexes", '[{"name": "x"}]', "--force", env=env)
    assert r.returncode == 2 and "even with --force" in one_line(r)
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

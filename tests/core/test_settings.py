"""Operator settings: read in one place, and the same for every command.

The environment (and ``BRAINSTEM_ENV_FILE``) is read only by
``brainstem.core.settings`` and its light half ``brainstem.core.environment``;
these tests hold the two bugs that reading it in several places caused (the
dashboard ignoring the store URL's ``?prefix=``, and a secret set in the env
file bound but never granted), and the rule that keeps them from coming back.
"""

from __future__ import annotations

import ast
import json

import httpx
import pytest

from brainstem.core.environment import variables
from brainstem.core.errors import ConfigError
from brainstem.core.secrets import parse_bindings
from brainstem.core.settings import load_settings
from brainstem.state.guarded import AgentKV
from brainstem.store import open_store
from brainstem.tools.policy import ToolPolicy
from brainstem.tools.services import run_tool
from tests.dashboard_client import printed_token, serving
from tests.helpers import REPO

PACKAGE = REPO / "brainstem"
READERS = {"core/environment.py", "core/settings.py"}


def test_only_settings_read_the_environment():
    """No module but the two settings modules reads ``os.environ`` or ``os.getenv`` (clearing it, as the
    sandbox's worker does before running agent code, is not reading it)."""
    readers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text())
        cleared = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "clear"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and id(node) not in cleared \
                    and isinstance(node.value, ast.Name) and node.value.id == "os" and rel not in READERS:
                readers.append(f"{rel}:{node.lineno}")
    assert not readers, f"read the environment outside settings: {readers}"


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in ("BRAINSTEM_KV", "BRAINSTEM_KV_PREFIX", "BRAINSTEM_ENV_FILE", "BRAINSTEM_TOOL_SECRETS", "API_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return monkeypatch


# --- one agent, however it is named ------------------------------------------------------

def test_the_agent_comes_from_the_prefix_variable_else_the_url(clean_env, tmp_path):
    url = f"sqlite:///{tmp_path / 'a.db'}?prefix=alice"
    clean_env.setenv("BRAINSTEM_KV", url)
    assert load_settings().prefix == "alice:"
    clean_env.setenv("BRAINSTEM_KV_PREFIX", "bob")
    assert load_settings().prefix == "bob:"  # the variable wins over the URL
    clean_env.setenv("BRAINSTEM_KV_PREFIX", "")
    assert load_settings().prefix == ""  # set but empty: the default agent, whatever the URL says
    clean_env.setenv("BRAINSTEM_KV_PREFIX", "Not A Name")
    with pytest.raises(ConfigError, match="BRAINSTEM_KV_PREFIX 'Not A Name' is not a valid agent name"):
        load_settings()


def test_only_the_documented_names_configure_brainstem(clean_env, tmp_path):
    # Another program's variables with a setting's bare name (Docker sets HOSTNAME) change nothing,
    # in the environment or in BRAINSTEM_ENV_FILE; code can still pass settings by field name.
    bare = {"HOSTNAME": "someone-else", "KV_PREFIX": "mallory", "MAX_DAILY_COST": "999",
            "MAX_SESSION_COST": "50", "TOOL_SECRETS": "OPENROUTER_API_KEY@evil.example", "KV": "redis://x:1/0"}
    for name, value in bare.items():
        clean_env.setenv(name, value)
    env_file = tmp_path / "brainstem.env"
    env_file.write_text("".join(f"{k.lower()}={v}\n" for k, v in bare.items()))
    for with_file in (False, True):
        if with_file:
            clean_env.setenv("BRAINSTEM_ENV_FILE", str(env_file))
        s = load_settings()
        assert (s.hostname, s.kv_prefix, s.max_daily_cost, s.max_session_cost) == ("", None, 5.0, 0.5)
        assert not s.kv.startswith("redis://") and "evil.example" not in json.dumps(sorted(s.bindings()))
    assert load_settings(max_daily_cost=2.0, kv_prefix="bob").max_daily_cost == 2.0
    clean_env.setenv("BRAINSTEM_MAX_DAILY_COST", "3")
    assert load_settings().max_daily_cost == 3.0


def test_settings_and_the_sleep_path_open_the_same_agent(clean_env, tmp_path):
    url = f"sqlite:///{tmp_path / 'a.db'}?prefix=alice"
    clean_env.setenv("BRAINSTEM_KV", url)
    settings = load_settings()
    with open_store(settings.kv, prefix=settings.prefix) as a, open_store() as b:
        assert a.prefix == b.prefix == "alice:"


@pytest.mark.slow
def test_dashboard_shows_the_agent_the_store_url_names(tmp_path):
    """``BRAINSTEM_KV=...?prefix=alice`` alone: the dashboard shows alice, as ``status`` does."""
    db = tmp_path / "agents.db"
    with open_store(f"sqlite:///{db}", prefix="alice") as alice:
        alice.put("notes:marker", "alice-was-here")
    with open_store(f"sqlite:///{db}", prefix="") as default:
        default.put("notes:marker", "the-default-agent")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "BRAINSTEM_KV": f"sqlite:///{db}?prefix=alice"}
    # The dashboard serves until stopped: a process (with only this environment).
    with serving(env, tmp_path / "dashboard.log") as (_, address):
        base, bearer = address.split("?")[0], {"authorization": f"Bearer {printed_token(address)}"}
        page = httpx.get(f"{base}store?prefix=notes", headers=bearer, timeout=5)
        assert page.status_code == 200
        assert "alice-was-here" in page.text or "notes:marker" in page.text
        detail = httpx.get(f"{base}changes/notes:marker", headers=bearer, timeout=5)
        assert "alice-was-here" in detail.text and "the-default-agent" not in detail.text
    assert "(agent: alice)" in (tmp_path / "dashboard.log").read_text()


# --- a secret in the env file is granted as one in the environment is --------------------

TOOL = """
def execute(args, ctx):
    return {"token": ctx.secrets.get("API_TOKEN")}
"""
META = {"description": "shows a secret's placeholder", "secrets": ["API_TOKEN"]}


def test_a_secret_set_in_the_env_file_is_granted(clean_env, tmp_path):
    env_file = tmp_path / "brainstem.env"
    env_file.write_text("API_TOKEN=tok-1234567890abcdef\nBRAINSTEM_TOOL_SECRETS=API_TOKEN@127.0.0.1\n")
    clean_env.setenv("BRAINSTEM_ENV_FILE", str(env_file))
    clean_env.setenv("BRAINSTEM_KV", f"sqlite:///{tmp_path / 'a.db'}")
    settings = load_settings()
    assert variables()["API_TOKEN"] == "tok-1234567890abcdef"
    assert settings.allowed_secret_values() == {"API_TOKEN": "tok-1234567890abcdef"}
    assert settings.known_secrets()["API_TOKEN"] == "tok-1234567890abcdef"  # so karma redacts it too

    recorded: list[tuple[str, dict]] = []

    def record(event: str, **fields) -> None:
        recorded.append((event, fields))

    with open_store(settings.kv, prefix=settings.prefix) as store:
        store.put("tool:show:code", TOOL)
        store.put("tool:show:meta", json.dumps(META))
        out = run_tool("show", {}, store=store, agent_kv=AgentKV(store, record), record=record,
                       policy=ToolPolicy.from_settings(settings))
    assert out.ok, out.error
    assert [f for e, f in recorded if e == "secret_not_granted"] == []
    # a placeholder, never the value, enters the sandbox; the runtime swaps it in at the allowed host
    assert out.value["token"].startswith("brainstem-secret-API_TOKEN-")


def test_the_real_environment_overrides_the_env_file(clean_env, tmp_path):
    env_file = tmp_path / "brainstem.env"
    env_file.write_text("API_TOKEN=from-the-file-0000\nBRAINSTEM_TOOL_SECRETS=API_TOKEN@127.0.0.1\n")
    clean_env.setenv("BRAINSTEM_ENV_FILE", str(env_file))
    clean_env.setenv("API_TOKEN", "from-the-environment-1111")
    assert load_settings().allowed_secret_values() == {"API_TOKEN": "from-the-environment-1111"}
    assert parse_bindings(["API_TOKEN@127.0.0.1"], "https://openrouter.ai/api/v1")


def test_a_bound_environment_secret_that_could_not_travel_as_it_is_stops_every_command(monkeypatch):
    monkeypatch.setenv("BRAINSTEM_TOOL_SECRETS", "API_TOKEN@api.example.org")
    monkeypatch.setenv("API_TOKEN", "tok-live-0123456789\n")
    with pytest.raises(ConfigError, match="API_TOKEN, whose value holds '\\\\n'.*printable ASCII"):
        load_settings()
    monkeypatch.setenv("API_TOKEN", "tok-live-0123456789")
    assert load_settings().bindings()["API_TOKEN"].hosts == frozenset({"api.example.org"})


def test_the_operators_limits_on_the_agents_schedules(clean_env):
    s = load_settings()
    assert (s.schedule_min_interval, s.schedule_max) == (300, 20)
    clean_env.setenv("BRAINSTEM_SCHEDULE_MIN_INTERVAL", "3600")
    clean_env.setenv("BRAINSTEM_SCHEDULE_MAX", "0")  # the agent may add none
    assert (load_settings().schedule_min_interval, load_settings().schedule_max) == (3600, 0)
    for name, bad in (("BRAINSTEM_SCHEDULE_MAX", "-1"), ("BRAINSTEM_SCHEDULE_MIN_INTERVAL", "0"),
                      ("BRAINSTEM_SCHEDULE_MIN_INTERVAL", "5m")):
        clean_env.setenv(name, bad)
        with pytest.raises(ConfigError, match=f"setting {name}: ") as exc:
            load_settings()
        assert "\n" not in str(exc.value)
        clean_env.delenv(name)


# --- the LLM server, under its name and its older one ------------------------------------

@pytest.fixture
def llm_env(clean_env):
    for name in ("BRAINSTEM_LLM_BASE_URL", "BRAINSTEM_LLM_API_KEY", "OPENROUTER_BASE_URL", "OPENROUTER_API_KEY"):
        clean_env.delenv(name, raising=False)
    return clean_env


@pytest.mark.parametrize(("env", "server", "url"), [
    ({}, "openrouter", "https://openrouter.ai/api/v1"),
    ({"OPENROUTER_BASE_URL": "http://127.0.0.1:4000/v1"}, "openrouter", "http://127.0.0.1:4000/v1"),
    ({"BRAINSTEM_LLM_BASE_URL": "http://127.0.0.1:4000/v1"}, "generic", "http://127.0.0.1:4000/v1"),
    ({"BRAINSTEM_LLM_BASE_URL": "https://OpenRouter.ai/api/v1"}, "openrouter", "https://OpenRouter.ai/api/v1"),
    ({"BRAINSTEM_LLM_BASE_URL": "https://api.openai.com/v1", "OPENROUTER_BASE_URL": "https://api.openai.com/v1"},
     "generic", "https://api.openai.com/v1"),
])
def test_the_server_is_openrouter_when_named_so_or_on_its_host(llm_env, env, server, url):
    for name, value in env.items():
        llm_env.setenv(name, value)
    s = load_settings()
    assert (s.llm_server, s.llm_base_url, s.openrouter_base_url) == (server, url, url)


@pytest.mark.parametrize("name", ["BRAINSTEM_LLM_API_KEY", "OPENROUTER_API_KEY"])
def test_either_name_sets_the_one_llm_key(llm_env, name):
    llm_env.setenv(name, "sk-one-key-0123456789")
    s = load_settings()
    assert s.llm_key == "sk-one-key-0123456789" and s.openrouter_api_key.get_secret_value() == s.llm_key
    assert "sk-one-key-0123456789" in s.known_secrets().values()


@pytest.mark.parametrize(("new", "old"), [("BRAINSTEM_LLM_API_KEY", "OPENROUTER_API_KEY"),
                                          ("BRAINSTEM_LLM_BASE_URL", "OPENROUTER_BASE_URL")])
def test_both_names_with_different_values_is_one_line_of_configuration_error(llm_env, new, old):
    llm_env.setenv(new, "http://127.0.0.1:4000/v1")
    llm_env.setenv(old, "http://127.0.0.1:4001/v1")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert new in str(err.value) and old in str(err.value) and "\n" not in str(err.value)
    assert "4000" not in str(err.value)  # a key's value is never in the message
    llm_env.setenv(old, "http://127.0.0.1:4000/v1")  # the same value under both names is no conflict
    s = load_settings()
    assert "http://127.0.0.1:4000/v1" in (s.llm_base_url, s.llm_key)


def test_a_blank_llm_key_is_no_key(llm_env):
    llm_env.setenv("OPENROUTER_API_KEY", "")
    llm_env.setenv("BRAINSTEM_LLM_API_KEY", "sk-set")
    assert load_settings().llm_key == "sk-set"


@pytest.mark.parametrize(("key_var", "bound"), [("BRAINSTEM_LLM_API_KEY", "OPENROUTER_API_KEY"),
                                                ("OPENROUTER_API_KEY", "BRAINSTEM_LLM_API_KEY"),
                                                ("BRAINSTEM_LLM_API_KEY", "BRAINSTEM_LLM_API_KEY")])
def test_a_bare_binding_of_either_name_grants_the_llm_key_to_the_llm_host_only(llm_env, key_var, bound):
    llm_env.setenv("BRAINSTEM_LLM_BASE_URL", "https://llm.example.com/v1")
    llm_env.setenv(key_var, "sk-bound-key-0123456789")
    llm_env.setenv("BRAINSTEM_TOOL_SECRETS", bound)
    s = load_settings()
    b = s.bindings()
    assert set(b) == {"BRAINSTEM_LLM_API_KEY", "OPENROUTER_API_KEY"}
    assert all(x.hosts == {"llm.example.com"} for x in b.values())
    assert s.allowed_secret_values() == {"BRAINSTEM_LLM_API_KEY": "sk-bound-key-0123456789",
                                         "OPENROUTER_API_KEY": "sk-bound-key-0123456789"}


def test_the_llm_base_url_is_a_public_setting_under_both_names(llm_env):
    llm_env.setenv("BRAINSTEM_LLM_BASE_URL", "http://127.0.0.1:4000/v1")
    public = load_settings().public_settings()
    assert public["BRAINSTEM_LLM_BASE_URL"] == public["OPENROUTER_BASE_URL"] == "http://127.0.0.1:4000/v1"

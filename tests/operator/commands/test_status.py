"""``brainstem status`` says what protects the operator: secret bindings (names and hosts, never values)
and which kernel layers the sandbox runs under; and what runs on its own: each schedule, its next run and its last."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_cli

VALUE = "weather-key-value-5a4b3c2d1e"


def test_status_lists_bindings_and_sandbox_protections_but_no_value(tmp_path):
    env = {"BRAINSTEM_KV": f"sqlite:///{tmp_path / 's.db'}", "WEATHER_API_KEY": VALUE,
           "BRAINSTEM_TOOL_SECRETS": "WEATHER_API_KEY@api.weather.example,secret:vault@rpc.example.org"}
    r = run_cli("status", env=env)
    assert r.returncode == 0, r.stderr
    lines = [" ".join(ln.split()) for ln in r.stdout.splitlines()]  # columns aligned with any width
    assert "secret WEATHER_API_KEY -> api.weather.example" in lines
    assert "secret secret:vault -> rpc.example.org (NOT SET)" in lines
    sandbox = [ln for ln in lines if ln.startswith("sandbox")]
    assert len(sandbox) == 1 and "seccomp" in sandbox[0]
    r = run_cli("status", "--json", env=env)
    st = json.loads(r.stdout)
    assert st["secret_bindings"]["WEATHER_API_KEY"] == {"hosts": ["api.weather.example"], "set": True}
    assert st["sandbox"]["protections"]["seccomp"]["state"] in ("on", "off")
    assert VALUE not in r.stdout + r.stderr


def test_status_names_each_schedule_with_its_next_run_and_how_its_last_run_ended(tmp_path):
    from brainstem.store import open_store

    env = {"BRAINSTEM_KV": f"sqlite:///{tmp_path / 's.db'}"}
    assert "schedule " not in run_cli("status", env=env).stdout
    assert json.loads(run_cli("status", "--json", env=env).stdout)["schedules"] == []
    with open_store(env["BRAINSTEM_KV"]) as store:
        store.put("schedule:prices", {"tool": "fetch", "every": "1h", "next_run": "2999-01-01T00:00:00Z",
                                      "last_run": "2026-05-04T09:00:00Z", "last_outcome": "failed"})
        store.put("schedule:morning", {"tool": "report", "cron": "0 9 * * *", "tz": "Europe/London",
                                       "created_by": "operator", "notify": "telegram", "enabled": False})
        store.put("schedule:late", {"tool": "fetch", "every": "1d", "next_run": "2020-01-01T00:00:00Z"})
        store.put("schedule:broken", {"tool": "fetch"})
    r = run_cli("status", env=env)
    assert r.returncode == 0, r.stderr
    lines = [" ".join(ln.split()) for ln in r.stdout.splitlines() if ln.startswith("schedule ")]
    assert lines == [
        "schedule late: fetch every 1d; next run 2020-01-01T00:00:00Z (due now); never run; agent's",
        "schedule morning: report cron 0 9 * * * (Europe/London); PAUSED (brainstem schedule resume morning); "
        "never run; operator's, notify telegram",
        "schedule prices: fetch every 1h; next run 2999-01-01T00:00:00Z; last failed at 2026-05-04T09:00:00Z; "
        "agent's",
        "schedule broken: INVALID, never runs: give exactly one of every (e.g. 30m, 1d) and cron (five fields)"]
    report = json.loads(run_cli("status", "--json", env=env).stdout)["schedules"]
    by_id = {s["id"]: s for s in report}
    assert by_id["prices"] == {"id": "prices", "tool": "fetch", "when": "every 1h", "enabled": True,
                               "created_by": "agent", "notify": "none", "next_run": "2999-01-01T00:00:00Z",
                               "due": False, "last_run": "2026-05-04T09:00:00Z", "last_outcome": "failed"}
    assert by_id["late"]["due"] is True and by_id["morning"]["next_run"] is None
    assert by_id["broken"] == {"id": "broken", "key": "schedule:broken",
                               "error": "give exactly one of every (e.g. 30m, 1d) and cron (five fields)"}


def test_next_wake_says_due_now_and_why_when_an_urgent_message_wakes_the_agent_before_its_time(tmp_path):
    from brainstem.core import keys
    from brainstem.state import inbox
    from brainstem.store import open_store

    env = {"BRAINSTEM_KV": f"sqlite:///{tmp_path / 's.db'}"}
    later = "2999-01-01T22:57:00Z"
    with open_store(env["BRAINSTEM_KV"]) as store:
        store.put(keys.WAKE_CONFIG, {"next_wake_after": later})

    def next_wake() -> tuple[str, dict]:
        line = next(ln for ln in run_cli("status", env=env).stdout.splitlines() if ln.startswith("next wake"))
        return " ".join(line.split()[2:]), json.loads(run_cli("status", "--json", env=env).stdout)

    said, report = next_wake()
    assert said == f"{later} (asleep)" and report["next_wake_at"] == later and report["asleep"] is True
    with open_store(env["BRAINSTEM_KV"]) as store:
        inbox.post(store, "look now", sender="operator", urgent=True)
    said, report = next_wake()
    # One true thing: it is due now, and the time its schedule gave is named as that, not as its next wake.
    assert said == f"due now: an urgent message waits (its own schedule said {later})"
    assert report["asleep"] is False and report["next_wake_at"] is None and report["next_wake_after"] == later


@pytest.mark.parametrize("ceiling, says", [
    ("2.5", "$0.0057 of $2.50 (per session at most $0.50)"),
    ("0.004", "$0.0057 of $0.004 (over it) (per session at most $0.50)"),  # not "of $0.00"
    ("0.0123456", "$0.0057 of $0.012346 (per session at most $0.50)"),
    ("0", "$0.0057 of $0.00 (over it) (per session at most $0.50)"),
    ("inf", "$0.0057, no daily ceiling (per session at most $0.50)"),
    ("1234.5", "$0.0057 of $1,234.50 (per session at most $0.50)"),
])
def test_status_states_todays_spend_against_the_ceiling_as_set(tmp_path, ceiling, says):
    from brainstem.state.budget import today
    from brainstem.store import open_store

    env = {"BRAINSTEM_KV": f"sqlite:///{tmp_path / 's.db'}", "BRAINSTEM_MAX_DAILY_COST": ceiling}
    with open_store(env["BRAINSTEM_KV"]) as store:
        store.settle_spend(today(), None, 0.0057)
    r = run_cli("status", env=env)
    assert r.returncode == 0, r.stderr
    (line,) = [" ".join(ln.split()) for ln in r.stdout.splitlines() if ln.startswith("spent today")]
    assert line == f"spent today {says}"
    report = json.loads(run_cli("status", "--json", env=env).stdout)
    assert report["cost_today"] == 0.0057
    assert report["daily_ceiling"] == (None if ceiling == "inf" else float(ceiling))


def test_status_says_when_there_is_no_ceiling_per_session(tmp_path):
    env = {"BRAINSTEM_KV": f"sqlite:///{tmp_path / 's.db'}", "BRAINSTEM_MAX_SESSION_COST": "inf"}
    (line,) = [" ".join(ln.split()) for ln in run_cli("status", env=env).stdout.splitlines()
               if ln.startswith("spent today")]
    assert line == "spent today $0.0000 of $5.00 (no ceiling per session)"
    assert json.loads(run_cli("status", "--json", env=env).stdout)["session_ceiling"] is None


# --- the LLM credit and the runway it gives -------------------------------------------------------

def _days_ago(n: int) -> str:
    from datetime import datetime, timedelta, timezone

    return (datetime.now(timezone.utc) - timedelta(days=n)).strftime("%Y-%m-%d")


def _credit_env(tmp_path, **extra: str) -> dict[str, str]:
    return {"BRAINSTEM_KV": f"sqlite:///{tmp_path / 's.db'}", "OPENROUTER_BASE_URL": "http://127.0.0.1:9/api/v1",
            **extra}


def test_status_gives_the_llm_credit_and_the_runway_at_the_last_seven_days_mean(tmp_path):
    from brainstem.core import keys
    from brainstem.store import open_store

    env = _credit_env(tmp_path)
    report = json.loads(run_cli("status", "--json", env=env).stdout)
    assert report["llm_credit"] is None and report["runway_days"] is None  # nothing known yet
    with open_store(env["BRAINSTEM_KV"]) as store:
        store.put(keys.LAST_GROUND_TRUTH, {"at": "2026-05-10T09:00:00Z", "balances": {"openrouter": 12.0}})
        store.put(keys.SPEND_DAYS, {"since": _days_ago(20), "days": {_days_ago(9): 50.0, _days_ago(6): 2.0,
                                                                      _days_ago(1): 1.5}})
    report = json.loads(run_cli("status", "--json", env=env).stdout)
    assert report["llm_credit"] == 12.0
    assert report["mean_daily_spend"] == pytest.approx(0.5)  # 3.5 over seven days; nine days ago is outside
    assert report["runway_days"] == 24.0
    lines = [" ".join(ln.split()) for ln in run_cli("status", env=env).stdout.splitlines()]
    assert "runway 24 days (LLM credit $12.00 at $0.5000 a day, the last 7 days' mean)" in lines


def test_status_has_no_runway_without_a_balance_or_a_server_that_offers_one(tmp_path):
    from brainstem.core import keys
    from brainstem.store import open_store

    env = _credit_env(tmp_path)
    with open_store(env["BRAINSTEM_KV"]) as store:
        store.put(keys.LAST_GROUND_TRUTH, {"at": "2026-05-10T09:00:00Z", "balances": {"openrouter": None}})
        store.put(keys.SPEND_DAYS, {"since": _days_ago(1), "days": {_days_ago(1): 1.0}})
    report = json.loads(run_cli("status", "--json", env=env).stdout)
    assert report["llm_credit"] is None and report["runway_days"] is None and report["mean_daily_spend"] == 0.5
    generic = {**{k: v for k, v in env.items() if not k.startswith("OPENROUTER_")},
               "BRAINSTEM_LLM_BASE_URL": "http://127.0.0.1:9/v1"}
    report = json.loads(run_cli("status", "--json", env=generic).stdout)
    assert report["llm_server"] == "generic" and report["llm_credit"] is None and report["runway_days"] is None
    assert not any(ln.startswith("runway") for ln in run_cli("status", env=generic).stdout.splitlines())


def test_status_says_when_no_paid_call_may_be_made_and_how_to_clear_it(tmp_path):
    from brainstem.core import keys
    from brainstem.store import open_store

    env = _credit_env(tmp_path, BRAINSTEM_MIN_CREDIT="2")
    with open_store(env["BRAINSTEM_KV"]) as store:
        store.put(keys.LLM_CREDIT, {"at": "2026-05-10T09:00:00Z", "credit": 0.5,
                                    "floor": {"since": "2026-05-10T08:00:00Z", "credit": 0.5, "min_credit": 2.0},
                                    "told": {"at": "2026-05-10T08:00:00Z", "inbox_id": 1}})
    report = json.loads(run_cli("status", "--json", env=env).stdout)
    assert report["credit_guard"]["below_floor"]["credit"] == 0.5 and report["credit_guard"]["told"]["inbox_id"] == 1
    text = run_cli("status", env=env).stdout
    assert "below BRAINSTEM_MIN_CREDIT ($2.00) since 2026-05-10T08:00:00Z" in text
    with open_store(env["BRAINSTEM_KV"]) as store:
        store.put(keys.LLM_CREDIT, {"breaker": {"last_402_at": "2026-05-10T09:00:00Z", "trips": 1,
                                                "probe_after": "2026-05-10T09:01:00Z"}})
    text = run_cli("status", env={**env, "BRAINSTEM_MIN_CREDIT": ""}).stdout
    assert "answered 402 at 2026-05-10T09:00:00Z" in text and f"kv delete {keys.LLM_CREDIT}" in text

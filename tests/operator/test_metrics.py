"""``brainstem run --metrics-port``: Prometheus metrics scraped over real HTTP from a real daemon."""

from __future__ import annotations

import socket

import pytest
from prometheus_client import generate_latest

from brainstem.operator.metrics import Metrics
from tests.helpers import REPO, free_port, samples, scrape, value, wait_for
from tests.wake_helpers import action, answers, base_env, fires, plan, reflection, seeded


@pytest.mark.slow
def test_a_daemon_serves_what_it_did(tmp_path, llm, daemons):  # noqa: F811 - pytest fixtures
    url = f"sqlite:///{tmp_path / 'm.db'}"
    store = seeded(url)
    llm.queue(plan(action("kv_write", {"key": "k", "value": "v"}, id="w"), action("no_such_tool", id="x"),
                   next_wake={"sleep_seconds": 60}))
    llm.responder = answers("ok", reflect=reflection("wrote k"))
    port = free_port()
    d = daemons(base_env(url, llm), "--every", "1s", "--metrics-port", str(port))
    wait_for(lambda: len(fires(store, "asleep")) >= 2, 30, "a session then two asleep fires", d)
    found = scrape(port)
    rc, _ = d.stop()
    assert rc == 0, d.stderr
    assert value(found, "brainstem_wakes_total", agent="default", result="ran") == 1
    assert value(found, "brainstem_wakes_total", agent="default", result="asleep") >= 2
    assert value(found, "brainstem_wakes_total", agent="default", result="error") == 0
    assert value(found, "brainstem_sessions_total", agent="default", outcome="clean") == 1
    assert value(found, "brainstem_tool_runs_total", agent="default", result="ok") == 1
    assert value(found, "brainstem_tool_runs_total", agent="default", result="error") == 1
    calls = {k: v for k, v in found.items() if k[0] == "brainstem_llm_calls_total"}
    assert sum(calls.values()) == 2 and all(dict(k[1])["tier"] == "hardcoded" for k in calls)  # orient, reflect
    assert value(found, "brainstem_session_duration_seconds_count", agent="default") == 1
    cost = value(found, "brainstem_session_cost_usd_sum", agent="default")
    spent = value(found, "brainstem_spend_today_usd", agent="default")
    assert cost > 0 and spent == pytest.approx(cost, rel=1e-6)
    assert value(found, "brainstem_daily_ceiling_usd", agent="default") == 5.0
    assert value(found, "brainstem_lease_lost_total", agent="default") == 0
    # The balance the session's ground truth read from the double's /key, and the one day of spend it lasts at.
    assert value(found, "brainstem_llm_credit_usd", agent="default") == llm.credit
    assert value(found, "brainstem_runway_days", agent="default") == pytest.approx(llm.credit / spent, rel=1e-2)


def test_a_port_in_use_is_one_line(tmp_path):
    from tests.helpers import run_cli

    url = f"sqlite:///{tmp_path / 'm.db'}"
    seeded(url)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_cli("run", "--every", "1s", "--metrics-port", str(port), env={"BRAINSTEM_KV": url}, timeout=30)
    assert r.returncode == 2 and "--metrics-port" in r.stderr and "Traceback" not in r.stderr  # as dashboard --port


def test_the_listener_counts_karma_entries():
    m = Metrics()
    on = m.listener("a")
    for e in [{"event": "llm_call", "tier": "dynamic", "model": "x/y"}, {"event": "tool_complete", "ok": True},
              {"event": "tool_would_do", "tool": "t"},
              {"event": "session_end", "outcome": "no_plan", "duration_ms": 1500, "cost": 0.02},
              # answered from a cassette: a session, and no spend
              {"event": "session_end", "outcome": "clean", "duration_ms": 500, "cost": 0.03, "simulated_cost": 0.03}]:
        on(e)
    m.fire("a", "missed")
    m.watch_spend("a", lambda: (1.25, 5.0))
    m.watch_spend("b", lambda: (_ for _ in ()).throw(OSError("store away")))  # a broken reader: skipped
    found = samples(generate_latest(m.registry).decode())
    assert value(found, "brainstem_llm_calls_total", agent="a", tier="dynamic", model="x/y") == 1
    assert value(found, "brainstem_tool_runs_total", agent="a", result="not_run") == 1
    assert value(found, "brainstem_sessions_total", agent="a", outcome="no_plan") == 1
    assert value(found, "brainstem_session_duration_seconds_sum", agent="a") == 2.0
    assert value(found, "brainstem_session_cost_usd_sum", agent="a") == pytest.approx(0.02)
    assert value(found, "brainstem_wakes_total", agent="a", result="missed") == 1
    assert value(found, "brainstem_spend_today_usd", agent="a") == 1.25
    assert value(found, "brainstem_spend_today_usd", agent="b") is None


def test_an_unknown_credit_or_runway_is_no_sample_never_a_zero():
    m = Metrics()
    m.watch_credit("a", lambda: (7.7, 3.5))
    m.watch_credit("b", lambda: (7.7, None))  # nothing spent lately: no runway to tell
    m.watch_credit("c", lambda: (None, None))  # a generic server: no balance offered
    found = samples(generate_latest(m.registry).decode())
    assert value(found, "brainstem_llm_credit_usd", agent="a") == 7.7
    assert value(found, "brainstem_runway_days", agent="a") == 3.5
    assert value(found, "brainstem_llm_credit_usd", agent="b") == 7.7
    assert value(found, "brainstem_runway_days", agent="b") is None
    assert value(found, "brainstem_llm_credit_usd", agent="c") is None


def test_the_grafana_dashboard_uses_only_metrics_the_daemon_serves():
    import json
    import re

    m = Metrics()
    m.watch_spend("a", lambda: (0.0, 5.0))
    m.listener("a")({"event": "session_end", "outcome": "clean", "duration_ms": 1, "cost": 0.0})
    m.llm_calls.labels(agent="a", tier="t", model="m").inc()
    m.tool_runs.labels(agent="a", result="ok").inc()
    m.sessions.labels(agent="a", outcome="clean")
    served = {name for name, _ in samples(generate_latest(m.registry).decode())}
    dash = json.loads((REPO / "scripts" / "grafana-brainstem.json").read_text())
    used = {name for p in dash["panels"] for t in p["targets"] for name in re.findall(r"brainstem_\w+", t["expr"])}
    assert used and used <= served, used - served


def test_the_command_line_loads_no_web_stack_until_a_command_needs_it():
    """`brainstem wake` and the rest never pay for the dashboard's or the metrics' libraries."""
    import subprocess
    import sys

    code = ("import sys, brainstem.operator.cli, brainstem.session.wake; "
            "print([m for m in ('starlette', 'uvicorn', 'jinja2', 'prometheus_client') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr

"""``brainstem status`` says what protects the operator: secret bindings (names and hosts, never values)
and which kernel layers the sandbox runs under."""

from __future__ import annotations

import json

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

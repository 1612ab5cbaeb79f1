"""Sessions against LiteLLM's proxy itself, as a generic OpenAI-compatible server.

The proxy runs on loopback as a subprocess, once for the module, with a config file whose models answer
with ``mock_response`` (no upstream model is called) and a master key. LiteLLM's proxy pins
RestrictedPython below the version the sandbox needs, so it lives in a virtual environment of its own:
``BRAINSTEM_LITELLM`` names its ``litellm`` executable, else ``litellm`` on ``PATH``, else
``.venv-litellm/bin/litellm`` in the repository (``.ci/run`` makes that one). Without it these tests
skip with the reason, unless ``BRAINSTEM_REQUIRE_LITELLM=1`` (CI), which makes a missing or failed
proxy a failure showing its log.

Each test reads the proxy's access log for what was asked: a generic server is never asked an
OpenRouter-only endpoint (``/key``, ``/credits``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from brainstem.core import keys
from brainstem.core.settings import NOT_OFFERED
from tests.helpers import REPO, free_port, run_cli, stop
from tests.wake_helpers import events_of, finished, history, llm_calls, plan, reflection, seeded, set_defaults, think

pytestmark = pytest.mark.slow

MASTER_KEY = "sk-9f2c71d04be83a56e1"  # random-looking: a key holding ordinary words would be found in prompts
STARTUP_SECONDS = 180  # it imports a great deal: seconds on an idle machine, far more on a loaded one
OPENROUTER_ONLY = ("/key", "/credits")

# The proxy's models (mock answers) and the agent's price list naming them: the aliases the shipped
# config:defaults uses (sonnet, haiku) map to the server's own model ids.
PROXY_MODELS = {
    "bs-orient": plan(think("Name one thing worth doing", model="haiku", max_tokens=200),
                      next_wake={"sleep_seconds": 3600}),
    "bs-small": reflection("talked to a generic server"),
    "bs-limited": "litellm.RateLimitError",  # LiteLLM's mock raises a 429 for this answer
}
MODELS = {"models": [
    {"id": "bs-orient", "alias": "sonnet", "input_cost_per_mtok": 3.0, "output_cost_per_mtok": 15.0,
     "max_output_tokens": 4000, "supports_reasoning": False},
    {"id": "bs-small", "alias": "haiku", "input_cost_per_mtok": 1.0, "output_cost_per_mtok": 5.0,
     "max_output_tokens": 4000, "supports_reasoning": False},
    {"id": "bs-limited", "alias": "limited", "input_cost_per_mtok": 1.0, "output_cost_per_mtok": 5.0},
    {"id": "bs-not-on-the-proxy", "alias": "ghost", "input_cost_per_mtok": 1.0, "output_cost_per_mtok": 5.0},
], "fallback_model": "haiku"}


def _litellm() -> str | None:
    named = os.environ.get("BRAINSTEM_LITELLM")
    if named:
        return named
    found = shutil.which("litellm")
    local = REPO / ".venv-litellm" / "bin" / "litellm"
    return found or (str(local) if local.exists() else None)


def _unavailable(why: str) -> None:
    if os.environ.get("BRAINSTEM_REQUIRE_LITELLM") == "1":
        pytest.fail(f"BRAINSTEM_REQUIRE_LITELLM=1 but {why}")
    pytest.skip(why)


class Proxy:
    def __init__(self, base_url: str, log: Path):
        self.base_url = base_url
        self.log = log
        self._mark = 0

    def mark(self) -> None:
        """From here on, :meth:`paths` sees only new requests."""
        self._mark = len(self.log.read_text(errors="replace"))

    def paths(self) -> list[str]:
        """``METHOD /path`` of each request since :meth:`mark`, from the proxy's access log."""
        text = self.log.read_text(errors="replace")[self._mark:]
        out = []
        for line in text.splitlines():
            if '"' in line and " HTTP/1." in line:
                method, _, rest = line.split('"', 2)[1].partition(" ")
                out.append(f"{method} {rest.split(' HTTP/1.')[0]}")
        return out


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    exe = _litellm()
    if exe is None:
        _unavailable("LiteLLM's proxy is not installed: make .venv-litellm as .ci/run does, or name its "
                     "litellm in BRAINSTEM_LITELLM")
    work = tmp_path_factory.mktemp("litellm")
    config = {"model_list": [{"model_name": name, "litellm_params": {"model": f"openai/{name}", "api_key": "unused",
                                                                     "mock_response": answer}}
                             for name, answer in PROXY_MODELS.items()],
              "general_settings": {"master_key": MASTER_KEY},
              "router_settings": {"num_retries": 0}}  # the 429 reaches the client at once; it retries itself
    (work / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    log = work / "proxy.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BRAINSTEM_", "OPENROUTER_", "DATABASE_URL"))}
    env.update({"LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_DOCS": "True", "PYTHONUNBUFFERED": "1"})
    with log.open("w") as out:
        proc = subprocess.Popen([exe, "--config", str(work / "config.yaml"), "--host", "127.0.0.1",
                                 "--port", str(port)], cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if proc.poll() is not None:
                _unavailable(f"LiteLLM's proxy exited ({proc.returncode}) at startup:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{base}/health/liveliness", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                _unavailable(f"LiteLLM's proxy did not start in {STARTUP_SECONDS}s:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield Proxy(f"{base}/v1", log)
    finally:
        stop(proc)


@pytest.fixture
def agent(proxy, tmp_path):
    """A seeded agent whose operator pointed it at the proxy, with a price list of the proxy's model ids."""
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    store = seeded(url)
    (tmp_path / "models.json").write_text(json.dumps(MODELS))
    env = {"BRAINSTEM_KV": url, "BRAINSTEM_LLM_BASE_URL": proxy.base_url, "BRAINSTEM_LLM_API_KEY": MASTER_KEY,
           "BRAINSTEM_LLM_BACKOFF": "0.01", "BRAINSTEM_LLM_MAX_ATTEMPTS": "2"}
    put = run_cli("kv", "put", keys.CONFIG_MODELS, "--file", str(tmp_path / "models.json"), env=env)
    assert put.returncode == 0, put.stdout + put.stderr
    proxy.mark()
    yield store, env
    store.close()
    asked = proxy.paths()
    assert asked and all(p.startswith("POST /v1/chat/completions") for p in asked), asked
    assert not any(p.split(" ")[1].rstrip("/").endswith(OPENROUTER_ONLY) for p in asked), asked


def test_a_clean_session_against_the_proxy_asks_for_no_credit(agent):
    store, env = agent
    sid, entries = finished(run_cli("wake", "--force", env=env), store, "clean")
    calls = llm_calls(entries)
    assert [c["purpose"] for c in calls] == ["orient", "think", "reflect"]
    assert {c["model"] for c in calls} == {"bs-orient", "bs-small"} and all(c["tier"] == "hardcoded" for c in calls)
    (truth,) = events_of(entries, "ground_truth")
    assert truth["not_offered"] == ["openrouter"] and truth["balances"]["openrouter"] is None
    assert not truth.get("errors")  # nothing was asked, so nothing failed
    # LiteLLM's mock counts 10 prompt tokens whatever was sent: priced at the runtime's estimate instead.
    flagged = events_of(entries, "usage_implausible")
    assert {f["purpose"] for f in flagged} == {"orient", "think", "reflect"}
    assert all(f["reported_prompt_tokens"] == 10 < f["estimated_prompt_tokens"] for f in flagged)
    shown = run_cli("status", env=env)
    assert f"LLM credit {NOT_OFFERED}" in shown.stdout and "LLM credit unknown" not in shown.stdout
    report = json.loads(run_cli("status", "--json", env=env).stdout)
    assert report["llm_server"] == "generic"
    assert report["balances_last_seen"]["not_offered"] == ["openrouter"]


def test_a_wrong_key_is_llm_auth_failed_with_the_variable_to_set(agent):
    store, env = agent
    env = {**env, "BRAINSTEM_LLM_API_KEY": "sk-not-the-master-key"}
    result = run_cli("wake", "--force", env=env)
    sid, entries = finished(result, store, "llm_auth_failed")
    assert "BRAINSTEM_LLM_API_KEY" in result.stdout + result.stderr
    errors = [e["error"] for e in events_of(entries, "provider_fallback")]
    assert errors and all("HTTP 400" in e and "No connected db" in e for e in errors)
    assert "sk-not-the-master-key" not in json.dumps(entries)
    (h,) = history(store)
    assert h["outcome"] == "llm_auth_failed"
    report = json.loads(run_cli("status", "--json", env=env).stdout)
    assert report["failing_in_a_row"] == 0  # not the agent's doing: nothing towards auto-restore
    assert "BRAINSTEM_LLM_API_KEY" in report["operator_action"]
    # A short retry, not the agent's own sleep (an hour here, six hours after a failed orient).
    wake_config = store.get_json(keys.WAKE_CONFIG)
    due = time.mktime(time.strptime(wake_config["next_wake_after"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    assert due - time.time() < 5 * 60


@pytest.mark.parametrize(("model", "outcome", "said"), [
    ("limited", "llm_unavailable", "HTTP 429"),  # retried, then the endpoint's fault
    ("ghost", "no_plan", "Invalid model name"),  # a model the proxy does not know: the agent's choice
])
def test_a_429_or_an_unknown_model_from_the_proxy(agent, model, outcome, said):
    store, env = agent
    set_defaults(store, orient={"model": model}, execution={"fallback_model": model})
    sid, entries = finished(run_cli("wake", "--force", env=env), store, outcome)
    errors = [e["error"] for e in events_of(entries, "provider_fallback")]
    assert errors and all(said in e for e in errors), errors
    if outcome == "llm_unavailable":
        assert all("after 2 attempts" in e for e in errors)

"""Helpers for driving ``brainstem wake`` end to end against the LLM double and a real store.

A test seeds a store, scripts the model's answers, runs the command as a
subprocess, and reads back karma and keys::

    store = seeded(real_store_url)
    llm.queue(plan(think("Say hi", store_result_as="hi")))      # orient's answer
    llm.responder = answers()                                   # thinks say "ok", reflect answers JSON
    r = run_wake(wake_env(real_store_url, llm), "--force")
    sid, entries = finished(r, store)                           # exit 0, session_end, schedule in the future

The double answers in request order: the queue first (orient, then one answer
per think / conditional / subplan call, then reflect), then ``.responder``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from brainstem.core import keys
from brainstem.core.clock import parse_iso
from brainstem.llm.messages import text_of
from brainstem.state import history as session_history
from brainstem.state.seed import example_soul_path, seed
from brainstem.state.versions import record_write
from brainstem.store import karma, open_store
from tests.doubles import LLMDouble
from tests.helpers import clean_env, run_cli

API_KEY = "sk-test-7f3a9c2e41d8b605-do-not-leak"  # random-looking, as real keys are


# --- setting up -------------------------------------------------------------------

def seeded(url: str, soul: bool = True):
    """The store at ``url``, seeded (in-process: faster than ``brainstem seed``) with the example soul."""
    store = open_store(url)
    seed(store, soul_file=example_soul_path() if soul else None)
    return store


def wake_env(url: str, double, **extra: Any) -> dict[str, str]:
    """The environment for a wake against ``double`` with fast retries; ``extra`` adds variables."""
    env = {"BRAINSTEM_KV": url, "OPENROUTER_BASE_URL": double.base_url, "OPENROUTER_API_KEY": API_KEY,
           "BRAINSTEM_LLM_BACKOFF": "0.01"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_wake(env: dict, *args: str):
    return run_cli("wake", *args, env=env)


def start_wake(env: dict, *args: str) -> subprocess.Popen:
    """``brainstem wake`` in the background (same clean environment as :func:`run_cli`)."""
    return subprocess.Popen([sys.executable, "-m", "brainstem", "wake", *args], env=clean_env(env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def set_defaults(store, **sections: dict) -> dict:
    """Deep-merge ``sections`` into the stored ``config:defaults`` (one level: section -> fields)."""
    cfg = store.get_json(keys.CONFIG_DEFAULTS, default={})
    for name, fields in sections.items():
        if isinstance(fields, dict) and isinstance(cfg.get(name), dict):
            cfg[name] = {**cfg[name], **fields}
        else:
            cfg[name] = fields
    store.put(keys.CONFIG_DEFAULTS, cfg)
    return cfg


def price_caching(store, prices: dict[str, tuple[float, float, float, float, float]]) -> None:
    """The operator gives models their cache prices in config:models, recorded as `brainstem kv put` records it.
    ``prices``: model id -> (input, output, cache read, cache write, cache write for an hour), USD per Mtok."""
    old = store.get_text(keys.CONFIG_MODELS)
    models = json.loads(old)
    for m in models["models"]:
        if m["id"] in prices:
            _, _, read, write, write_1h = prices[m["id"]]
            m.update(cache_read_cost_per_mtok=read, cache_write_cost_per_mtok=write,
                     cache_write_1h_cost_per_mtok=write_1h)
    store.put(keys.CONFIG_MODELS, models)
    record_write(store, keys.CONFIG_MODELS, old, json.dumps(models), source="operator")


def iso_in(seconds: float) -> str:
    return (datetime.now(timezone.utc) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- scripting the model ------------------------------------------------------------

def plan(*steps: dict, budget: dict | None = None, tripwires: list | None = None,
         next_wake: dict | None = None, **extra: Any) -> str:
    """Orient's answer: a plan as JSON text."""
    p: dict[str, Any] = {"steps": list(steps)}
    if budget is not None:
        p["session_budget"] = budget
    if tripwires is not None:
        p["mid_session_tripwires"] = tripwires
    p["next_wake_config"] = next_wake if next_wake is not None else {"sleep_seconds": 3600}
    p.update(extra)
    return json.dumps(p)


def think(prompt: str, **fields: Any) -> dict:
    return {"type": "think", "prompt": prompt, **fields}


def action(tool: str, input: dict | None = None, **fields: Any) -> dict:
    return {"type": "action", "tool": tool, "input": input or {}, **fields}


def reflection(summary: str = "did the thing", load_keys: list | None = None, **extra: Any) -> str:
    """Reflect's answer as JSON text."""
    r = {"session_summary": summary, "note_to_future_self": "carry on",
         "next_orient_context": {"load_keys": list(load_keys) if load_keys is not None else ["wisdom"]}}
    r.update(extra)
    return json.dumps(r)


def user_text(request: dict) -> str:
    """The last user message of a chat request (the prompt the runtime rendered)."""
    msgs = [m for m in request.get("messages", []) if m.get("role") == "user"]
    return text_of(msgs[-1]["content"]) if msgs else ""


def all_text(request: dict) -> str:
    return "\n".join(text_of(m.get("content")) for m in request.get("messages", []))


def is_reflect(request: dict) -> bool:
    return user_text(request).lstrip().startswith("# Reflect")


def is_deep(request: dict) -> bool:
    return user_text(request).lstrip().startswith("# Deep reflection")


def is_orient(request: dict) -> bool:
    return user_text(request).lstrip().startswith("# Orient")


def answers(default: Any = "ok", reflect: Any = None) -> Callable[[dict], Any]:
    """A responder for whatever the queue does not cover: reflection JSON to reflect, ``default`` else.

    ``default`` may be a callable taking the request.
    """
    def respond(req: dict) -> Any:
        if is_reflect(req):
            return reflect if reflect is not None else reflection()
        return default(req) if callable(default) else default
    return respond


def verbose(req: dict) -> dict:
    """A model that always writes exactly ``max_tokens`` tokens (the double counts len // 4 + 1)."""
    n = int(req.get("max_tokens") or 1)
    return {"content": "w" * (4 * max(0, n - 1))}


# --- reading results ------------------------------------------------------------------

def last_session(store) -> tuple[str, list[dict]]:
    """(id, karma entries) of the most recently started session."""
    sid = karma.latest_session_id(store)
    assert sid is not None, "no session has started"
    return sid, karma.read(store, sid)


def events_of(entries: list[dict], name: str) -> list[dict]:
    return [e for e in entries if e.get("event") == name]


def event_names(entries: list[dict]) -> list[str]:
    return [e.get("event") for e in entries]


def llm_calls(entries: list[dict], purpose: str | None = None) -> list[dict]:
    return [e for e in events_of(entries, "llm_call") if purpose is None or e.get("purpose") == purpose]


def history(store) -> list[dict]:
    return session_history.read(store)


def in_future(text: str, at_least: float = 1.0) -> bool:
    t = parse_iso(text)
    return t is not None and t > datetime.now(timezone.utc) + timedelta(seconds=at_least)


def finished(result, store, outcome: str | None = None) -> tuple[str, list[dict]]:
    """Assert a wake ran a session to its end properly; return (session id, entries).

    Exit 0; the session's karma starts with ``session_start`` and ends with
    ``session_end`` carrying an outcome; the schedule is in the future; the
    history has the session; its cost is exactly the sum of its LLM calls.
    """
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    sid, entries = last_session(store)
    assert entries[0]["event"] == "session_start", entries[0]
    end = entries[-1]
    assert end["event"] == "session_end", event_names(entries)[-5:]
    assert isinstance(end.get("outcome"), str) and end["outcome"]
    if outcome is not None:
        assert end["outcome"] == outcome, (end, [e for e in entries if e["event"] in (
            "fatal_error", "orient_parse_error", "budget_exceeded", "step_failed")])
    wc = store.get_json(keys.WAKE_CONFIG)
    assert in_future(wc["next_wake_after"], 30), wc
    assert store.get(keys.SESSION_CURRENT) is None
    h = [x for x in history(store) if x.get("id") == sid]
    assert len(h) == 1 and h[0]["outcome"] == end["outcome"]
    spent = sum(c["cost"] for c in llm_calls(entries))
    assert abs(end["cost"] - spent) < 1e-9, (end["cost"], spent)
    assert abs(h[0]["cost"] - spent) < 1e-9, (h[0]["cost"], spent)
    return sid, entries


# --- `brainstem run`: a model for its sessions, its environment, its wake log ---------------------

DEEP_ANSWER = json.dumps({"reflection": "fine", "note_to_future_self": "carry on"})


def responder(steps: int = 1, delay: float = 0.0):
    """A model: orient answers a plan of ``steps`` think steps asking to sleep 1 s (clamped to 60 s);
    each think answer takes ``delay`` seconds; reflect and deep reflection answer valid JSON."""
    def respond(req: dict):
        if is_orient(req):
            return plan(*[think(f"Think {i}", id=f"t{i}", model="haiku", max_tokens=50) for i in range(steps)],
                        next_wake={"sleep_seconds": 1})
        if is_reflect(req):
            return reflection("ran on schedule", load_keys=[])
        if is_deep(req):
            return DEEP_ANSWER
        return {"content": "ok", "delay": delay} if delay else "ok"
    return respond


def base_env(url: str, llm: LLMDouble | None, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BRAINSTEM_", "OPENROUTER_"))}
    env.update(BRAINSTEM_KV=url, OPENROUTER_API_KEY="sk-test", BRAINSTEM_LLM_BACKOFF="0.01")
    if llm is not None:
        env["OPENROUTER_BASE_URL"] = llm.base_url
    env.update({k: str(v) for k, v in extra.items()})
    return env


def wake_log(store) -> list[dict]:
    return [json.loads(r) for r in store.read_log(keys.WAKE_LOG)]


def fires(store, kind: str) -> list[dict]:
    return [e for e in wake_log(store) if e.get("fire") == kind]


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))

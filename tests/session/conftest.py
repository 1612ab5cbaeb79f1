"""Fixtures for the session's tests: the settings of a run against the seeded store and the LLM double,
and the agent tools the schedules' tests run in the sandbox."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

import pytest

from brainstem.core import keys
from brainstem.core.clock import iso
from tests.helpers import put_tool
from tests.wake_helpers import API_KEY

# A tool that counts its runs in its own data (so a test sees how often it really ran) and answers.
HELLO = """
def execute(args, ctx):
    ctx.kv.put("runs", str(int(ctx.kv.get("runs") or 0) + 1))
    if args.get("seconds"):
        time.sleep(args["seconds"])
    if args.get("fail"):
        raise RuntimeError("the feed is down")
    return {"hi": args.get("who"), "price": 3120.5}
"""


@pytest.fixture
def configure(real_store_url, llm, monkeypatch):
    """``configure(**overrides)`` -> the settings of a run against ``st`` and ``llm`` (the environment's own
    BRAINSTEM_* and OPENROUTER_* variables left out)."""
    for name in list(os.environ):
        if name.startswith(("BRAINSTEM_", "OPENROUTER_")):
            monkeypatch.delenv(name)

    def make(**overrides):
        from brainstem.core.settings import load_settings

        return load_settings(**{"kv": real_store_url, "openrouter_base_url": llm.base_url,
                                "openrouter_api_key": API_KEY, "llm_backoff": 0.01, **overrides})
    return make


@pytest.fixture
def hello(st):
    """The agent's ``hello`` tool in ``st`` (``mode``: its meta's); ``runs()`` says how often it ran."""
    def put(mode: str = "automated", timeout_ms: int = 20_000) -> None:
        put_tool(st, "hello", "import time\n" + HELLO,
                 {"description": "greets", "kv_access": "own", "mode": mode, "timeout_ms": timeout_ms})
    put()
    put.runs = lambda: int(st.get("tooldata:hello:runs") or 0)  # type: ignore[attr-defined]
    return put


def ago(seconds: float) -> str:
    return iso(datetime.now(timezone.utc) - timedelta(seconds=seconds))


def put_schedule(store, schedule_id: str, **fields) -> dict:
    """A schedule written as the operator's ``kv put`` would (no checks): due a minute ago unless told."""
    body = {"tool": "hello", "input": {"who": "bob"}, "every": "1h", "next_run": ago(30),
            "created_by": "operator", **fields}
    store.put(keys.schedule(schedule_id), {k: v for k, v in body.items() if v is not None})
    return body

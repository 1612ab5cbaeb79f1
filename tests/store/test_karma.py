"""The flight recorder: order, redaction, breadcrumbs, and surviving SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from brainstem.core import events, keys
from brainstem.store import karma, open_store
from brainstem.store.karma import Karma, Redactor


def test_entries_read_back_in_order_with_required_fields(store):
    k = Karma(store, "s1")
    for i in range(30):
        k.record(events.TOOL_START, tool="t", attempt=i)
    entries = karma.read(store, "s1")
    assert [e["attempt"] for e in entries] == list(range(30))
    for e in entries:
        assert e["event"] == "tool_start" and e["t"].endswith("Z") and isinstance(e["elapsed_ms"], int)
    assert entries[-1]["elapsed_ms"] >= entries[0]["elapsed_ms"]


def test_secrets_are_redacted_before_writing(store):
    red = Redactor({"OPENROUTER_API_KEY": "sk-or-v1-abcdef123456", "TG": "bot999:XYZ"})
    k = Karma(store, "s2", red)
    k.record(events.LLM_CALL, request={"headers": {"Authorization": "Bearer whatever", "X": "ok"},
                                        "url": "https://x/?key=sk-or-v1-abcdef123456"},
             response=["token bot999:XYZ leaked in a list"], note="nothing here")
    raw = store.read_log(keys.karma("s2"))[0]
    assert "sk-or-v1-abcdef123456" not in raw and "bot999:XYZ" not in raw and "Bearer whatever" not in raw
    e = json.loads(raw)
    assert e["request"]["url"] == "https://x/?key=[REDACTED:OPENROUTER_API_KEY]"
    assert e["request"]["headers"] == {"Authorization": "[REDACTED]", "X": "ok"}
    assert e["response"] == ["token [REDACTED:TG] leaked in a list"]
    assert e["note"] == "nothing here"


def test_short_values_are_not_treated_as_secrets():
    red = Redactor({"A": "ab", "B": ""})
    assert red("ab cd") == "ab cd"


def test_huge_fields_are_capped(store):
    Karma(store, "s3").record(events.LLM_CALL, response="x" * 300_000)
    e = karma.read(store, "s3")[0]
    assert len(e["response"]) < 101_000 and "truncated" in e["response"]


def test_unreadable_entries_do_not_break_reading(store):
    store.append(keys.karma("s4"), "{not json")
    Karma(store, "s4").record(events.SESSION_END, outcome="clean")
    entries = karma.read(store, "s4")
    assert entries[0]["event"] == "unreadable" and entries[1]["outcome"] == "clean"


def test_listeners_see_entries_and_a_broken_listener_is_harmless(store):
    seen = []
    k = Karma(store, "s5", listeners=[seen.append, lambda e: 1 / 0])
    k.record(events.STEP_START, step_id="a")
    assert seen[0]["step_id"] == "a"
    assert karma.read(store, "s5")[0]["step_id"] == "a"


def test_breadcrumbs_detect_an_breadcrumb(store):
    assert karma.read_breadcrumb(store) is None
    karma.begin_session(store, "42-abc", effort="low")
    breadcrumb = karma.read_breadcrumb(store)
    assert breadcrumb["id"] == "42-abc" and breadcrumb["pid"] == os.getpid()
    assert karma.latest_session_id(store) == "42-abc"
    karma.end_session(store, "42-abc")
    assert karma.read_breadcrumb(store) is None
    assert store.get(keys.SESSION_LAST_COMPLETED) == "42-abc"


def test_a_corrupt_breadcrumb_still_means_a_crash(store):
    store.put(keys.SESSION_CURRENT, "garbage{")
    assert karma.read_breadcrumb(store) == {"id": None, "raw": "garbage{"}


def test_follow_stops_at_session_end(store):
    k = Karma(store, "s6")
    k.record(events.SESSION_START)
    k.record(events.SESSION_END, outcome="clean")
    assert [e["event"] for e in karma.follow(store, "s6", poll_seconds=0.01)] == ["session_start", "session_end"]


RECORDER = r"""
import sys
from brainstem.store import open_store
from brainstem.store.karma import Karma
k = Karma(open_store(sys.argv[1]), "killed")
i = 0
while True:
    k.record("tool_start", i=i)
    print(i, flush=True)   # printed only after record() returned
    i += 1
"""


@pytest.mark.slow
def test_sigkill_loses_nothing_that_was_recorded(real_store_url):
    proc = subprocess.Popen([sys.executable, "-c", RECORDER, real_store_url], stdout=subprocess.PIPE, text=True)
    returned = -1
    deadline = time.monotonic() + 30
    while returned < 200 and time.monotonic() < deadline:
        returned = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    # Lines printed after the last one we read may also have been recorded; all count.
    for line in proc.stdout:
        if line.strip():
            returned = int(line)
    entries = karma.read(open_store(real_store_url), "killed")
    got = [e["i"] for e in entries]
    assert got[: returned + 1] == list(range(returned + 1)), "an entry whose record() returned is missing"
    assert got == list(range(len(got)))  # nothing out of order, no gaps

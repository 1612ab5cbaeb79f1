"""The session write quota, across tool calls of one real wake (the per-call quota is in
tests/sandbox/test_fetch.py)."""

from __future__ import annotations

import json

import pytest

from brainstem.core import keys
from tests.wake_helpers import action, answers, events_of, finished, plan, run_wake, wake_env

HOG = ("def execute(args, ctx):\n"
       "    n = 0\n"
       "    try:\n"
       "        for i in range(args['count']):\n"
       "            ctx.kv.put(args['tag'] + str(i), 'x' * args['size'])\n"
       "            n += 1\n"
       "    except Exception as e:\n"
       "        return {'written': n, 'error': str(e)}\n"
       "    return {'written': n}\n")


@pytest.mark.parametrize("real_store_url", ["sqlite", "redis"], indirect=True)
def test_tools_of_one_session_share_the_session_quota(real_store_url, st, llm):
    st.put(keys.tool_code("hog"), HOG)
    st.put(keys.tool_meta("hog"), json.dumps({"kv_access": "own"}))
    llm.queue(plan(action("hog", {"tag": "a", "size": 300_000, "count": 3}, store_result_as="first"),
                   action("hog", {"tag": "b", "size": 300_000, "count": 3}, store_result_as="second")))
    llm.responder = answers()
    env = wake_env(real_store_url, llm, BRAINSTEM_SESSION_WRITE_QUOTA=1_000_000)
    _, entries = finished(run_wake(env, "--force"), st)
    results = [e["result"] for e in events_of(entries, "tool_complete")]
    assert results[0] == {"written": 3}
    assert results[1]["written"] == 0 and "BRAINSTEM_SESSION_WRITE_QUOTA" in results[1]["error"]
    (q,) = events_of(entries, "quota_exceeded")
    assert q["tool"] == "hog" and q["quota"] == 1_000_000
    assert [k.name for k in st.list_all("tooldata:hog:")] == ["tooldata:hog:a0", "tooldata:hog:a1", "tooldata:hog:a2"]


FETCHER = ("def execute(args, ctx):\n"
           "    n = 0\n"
           "    for i in range(args['count']):\n"
           "        try:\n"
           "            ctx.fetch(args['url'])\n"
           "        except Exception as e:\n"
           "            ctx.kv.put('after', str(e))\n"
           "        n += 1\n"
           "    return {'fetched': n}\n")


@pytest.mark.parametrize("real_store_url", ["sqlite"], indirect=True)
def test_fetch_records_and_log_lines_count_towards_the_session_quota(real_store_url, st, llm):
    """Every fetch's answer is kept in karma for replay: past the quota, karma stops growing and the tool ends."""
    from tests.doubles.hostile import Host

    page = Host("127.0.0.1", lambda h: h._send(200, b"y" * 20_000, {"Content-Type": "text/plain"}))
    try:
        st.put(keys.tool_code("fetcher"), FETCHER)
        st.put(keys.tool_meta("fetcher"), json.dumps({"kv_access": "own", "timeout_ms": 60_000}))
        llm.queue(plan(action("fetcher", {"url": page.base + "/p", "count": 400})))
        llm.responder = answers()
        env = wake_env(real_store_url, llm, BRAINSTEM_SESSION_WRITE_QUOTA=500_000, BRAINSTEM_FETCH_ALLOW="127.0.0.1")
        sid, entries = finished(run_wake(env, "--force"), st)
        fetches = events_of(entries, "fetch")
        done = events_of(entries, "tool_complete")[0]
        assert not done["ok"] and done["error"].startswith("stopped: quota_exceeded")
        assert 20 <= len(fetches) <= 40 and len(page.seen) == len(fetches)  # ~16 KB kept per fetch
        assert fetches[-1]["quota_exceeded"] is True and fetches[-1]["response"] is None
        assert st.get("tooldata:fetcher:after") is None  # ended at once: it could not even write
        karma_bytes = sum(len(line) for line in st.read_log(keys.karma(sid)))
        assert karma_bytes < 700_000, karma_bytes
    finally:
        page.close()


@pytest.mark.parametrize("real_store_url", ["sqlite"], indirect=True)
def test_a_result_past_the_session_quota_fails_its_step(real_store_url, st, llm):
    """Karma records a tool's result: one past the quota is not recorded, and its step fails."""
    st.put(keys.tool_code("big"), "def execute(args, ctx):\n    return 'r' * args['size']\n")
    llm.queue(plan(action("big", {"size": 600_000}, id="big")))
    llm.responder = answers()
    env = wake_env(real_store_url, llm, BRAINSTEM_SESSION_WRITE_QUOTA=500_000)
    sid, entries = finished(run_wake(env, "--force"), st)
    (done,) = events_of(entries, "tool_complete")
    assert not done["ok"] and done["error"].startswith("quota_exceeded") and done["result"] is None
    assert "BRAINSTEM_SESSION_WRITE_QUOTA" in done["error"]
    assert [e["step_id"] for e in events_of(entries, "step_failed")] == ["big"]
    assert sum(len(line) for line in st.read_log(keys.karma(sid))) < 100_000

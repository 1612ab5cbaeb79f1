"""The review inbox: runs of supervised tools wait for the operator's verdict.

Items are written with ``review.add`` (what the tool runner calls) into a real SQLite store on disk;
the operator reads and settles them through ``python -m brainstem review``, as from a shell.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st_

from brainstem.core import keys
from brainstem.core.errors import BadArgument, KVWriteRefused, NotFound
from brainstem.state import review
from brainstem.state.guarded import AgentKV
from brainstem.store import open_store
from tests.helpers import ok, one_line_error, run_cli


@pytest.fixture
def store(url):
    s = open_store(url)
    yield s
    s.close()


def cli(url: str, *args: str):
    return run_cli("review", *args, env={"BRAINSTEM_KV": url})


def add(store, tool: str = "send_telegram", ok: bool = True, **fields) -> dict:
    args = {"session_id": "7-a1b2", "step_id": "s1", "input": {"chat": "ops", "text": "deploy done"},
            "result": {"sent": True}, "error": None}
    args.update(fields)
    return review.add(store, tool=tool, ok=ok, **args)


# --- listing -----------------------------------------------------------------

def test_an_empty_inbox_says_so_and_where_items_come_from(url, store):
    out = ok(cli(url))
    assert out.splitlines()[0] == "no tool runs waiting for review"
    assert "supervised" in out
    assert ok(cli(url, "--json")) == ""


def test_the_list_shows_pending_items_as_a_table_and_as_json_lines(url, store):
    first = add(store)
    second = add(store, tool="web_fetch", ok=False, input={"url": "https://example.org"}, result=None,
                 error="HTTP 503\nfrom upstream")
    assert (first["id"], second["id"]) == ("1", "2")
    assert first["status"] == "pending" and first["created_at"].endswith("Z")

    lines = ok(cli(url)).splitlines()
    assert lines[0].split() == ["ID", "CREATED", "TOOL", "SESSION", "STATUS", "OK/ERROR", "INPUT"]
    assert lines[1].split()[0] == "1" and "send_telegram" in lines[1] and "ok" in lines[1]
    assert lines[2].split()[0] == "2" and "web_fetch" in lines[2]
    assert "error: HTTP 503 from upstream" in lines[2]  # one line per item, whatever the error holds
    assert "https://example.org" in lines[2] and "7-a1b2" in lines[2] and "pending" in lines[2]
    assert len(lines) == 3

    rows = [json.loads(line) for line in ok(cli(url, "--json")).splitlines()]
    assert [r["id"] for r in rows] == ["1", "2"]
    assert rows[0]["input"] == {"chat": "ops", "text": "deploy done"}
    assert rows[1]["ok"] is False and rows[1]["error"] == "HTTP 503\nfrom upstream"


def test_one_item_in_full(url, store):
    item = add(store, result={"message_id": 4411})
    out = ok(cli(url, "1"))
    assert "send_telegram" in out and "deploy done" in out and "4411" in out and "7-a1b2" in out
    assert "pending" in out and "brainstem review 1 --confirm" in out
    assert "None" not in out and "{'" not in out
    assert json.loads(ok(cli(url, "1", "--json"))) == item


# --- settling ----------------------------------------------------------------

def test_confirm_settles_the_item_and_takes_it_off_the_pending_list(url, store):
    add(store)
    add(store, tool="web_fetch")
    assert ok(cli(url, "1", "--confirm")).strip() == "review item 1 (send_telegram) confirmed"

    pending = [json.loads(line) for line in ok(cli(url, "--json")).splitlines()]
    assert [r["id"] for r in pending] == ["2"]
    every = {r["id"]: r for r in map(json.loads, ok(cli(url, "--all", "--json")).splitlines())}
    assert every["1"]["status"] == "confirmed" and every["1"]["settled_at"] and every["1"]["correction"] is None
    assert every["2"]["status"] == "pending"
    table = ok(cli(url, "--all"))
    assert "confirmed" in table and "pending" in table
    assert "confirmed" in ok(cli(url, "1"))


def test_correct_settles_the_item_with_the_operators_text(url, store):
    add(store)
    out = ok(cli(url, "1", "--correct", "post to #ops only, never to the family chat"))
    assert out.strip() == "review item 1 (send_telegram) corrected"
    item = review.get(store, "1")
    assert item["status"] == "corrected"
    assert item["correction"] == "post to #ops only, never to the family chat"
    assert "post to #ops only" in ok(cli(url, "1"))
    no_pending = ok(cli(url))
    assert "no tool runs waiting for review" in no_pending and "--all" in no_pending


@pytest.mark.parametrize("args", [("42",), ("42", "--confirm"), ("42", "--correct", "no")])
def test_an_unknown_id_is_one_line_naming_it(url, store, args):
    add(store)
    line = one_line_error(cli(url, *args), 2)
    assert "'42'" in line and "brainstem review" in line


@pytest.mark.parametrize("item_id", ["abc", "0", "-1", "1.5", "٣"])
def test_an_id_that_is_not_a_positive_number_is_not_found_not_a_traceback(url, store, item_id):
    add(store)
    add(store)
    add(store)
    for args in (("--", item_id), ("--confirm", "--", item_id)):
        line = one_line_error(cli(url, *args), 2)
        assert f"no review item '{item_id}'" in line
    assert [i["status"] for i in review.items(store)] == ["pending"] * 3


def test_settling_twice_names_the_verdict_already_given(url, store):
    add(store)
    add(store)
    ok(cli(url, "1", "--confirm"))
    assert "review item 1 is already confirmed" in one_line_error(cli(url, "1", "--correct", "too late"), 2)
    ok(cli(url, "2", "--correct", "not like that"))
    assert "review item 2 is already corrected" in one_line_error(cli(url, "2", "--confirm"), 2)
    assert review.get(store, "1")["status"] == "confirmed"
    assert review.get(store, "2")["correction"] == "not like that"


@pytest.mark.parametrize("args, says", [
    (("1", "--confirm", "--correct", "x"), "not both"),
    (("--confirm",), "needs the ID"),
    (("--correct", "x"), "needs the ID"),
    (("1", "--correct", "   "), "correction is empty"),
    (("1", "--correct", "x" * 4001), "limit is 4000"),
    (("1", "--all"), "takes no ID"),
])
def test_wrong_flags_are_one_line_and_settle_nothing(url, store, args, says):
    add(store)
    assert says in one_line_error(cli(url, *args), 2)
    assert review.get(store, "1")["status"] == "pending"


def test_settle_refuses_both_verdicts_or_none_in_process(store):
    add(store)
    with pytest.raises(BadArgument):
        review.settle(store, "1")
    with pytest.raises(BadArgument):
        review.settle(store, "1", confirm=True, correction="x")
    with pytest.raises(NotFound):
        review.settle(store, "2", confirm=True)
    assert review.settle(store, " 1 ", confirm=True)["status"] == "confirmed"


# --- storage -----------------------------------------------------------------

def test_long_inputs_and_results_are_cut_with_a_note_of_what_is_missing(store):
    big = {"text": "x" * 5000}
    item = add(store, input=big, result=["y" * 10], error="e" * 4500)
    text = json.dumps(big, ensure_ascii=False)
    assert item["input"] == text[:4000] + f"… [{len(text) - 4000} more chars]"
    assert item["result"] == ["y" * 10]  # short: kept as JSON
    assert item["error"].startswith("e" * 4000) and item["error"].endswith("… [500 more chars]")
    assert review.get(store, "1") == item
    odd = add(store, input={"when": object()}, result=None)  # not JSON: kept as text, never a crash
    assert isinstance(odd["input"]["when"], str)


def _ticking(monkeypatch) -> None:
    """One settle a second, so which verdict was given longest ago is never a tie."""
    start = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
    ticks = itertools.count()
    monkeypatch.setattr(review, "now_utc", lambda: start + timedelta(seconds=next(ticks)))


def test_settled_items_are_trimmed_only_to_make_room_for_settled_ones(monkeypatch, store):
    _ticking(monkeypatch)
    monkeypatch.setattr(review, "MAX_SETTLED", 2)
    for _ in range(4):
        add(store)
    review.settle(store, "3", confirm=True)
    review.settle(store, "1", correction="no")
    for _ in range(30):  # a flood of pending runs pushes out none of the verdicts
        add(store, session_id="8-flood")
    assert [i["id"] for i in review.items(store, include_settled=True)][:4] == ["1", "2", "3", "4"]
    review.settle(store, "2", confirm=True)  # three settled: the one settled longest ago (3) goes
    kept = {i["id"]: i["status"] for i in review.items(store, include_settled=True) if i["status"] != "pending"}
    assert kept == {"1": "corrected", "2": "confirmed"}
    assert len(review.items(store)) == 31  # a pending item is never dropped


def test_a_session_queues_no_more_than_its_cap_of_pending_items(store):
    first, second, third = [add(store, max_per_session=2, session_id="9-a") for _ in range(3)]
    assert first and second and third is None  # nothing written for the third
    assert review.pending_of(store, "9-a") == 2 and store.get(keys.REVIEW_COUNTER) == "2"
    assert add(store, max_per_session=2, session_id="9-b") is not None  # another session has its own
    review.settle(store, "1", confirm=True)
    assert add(store, max_per_session=2, session_id="9-a") is not None  # one settled: room again


QUEUE_OR_SETTLE = st_.lists(st_.one_of(st_.tuples(st_.just("queue"), st_.sampled_from(["1-a", "2-b", "3-c"])),
                                       st_.tuples(st_.just("settle"), st_.integers(min_value=0, max_value=50))),
                            max_size=60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=QUEUE_OR_SETTLE, cap=st_.integers(min_value=0, max_value=4),
       kept=st_.integers(min_value=1, max_value=5))
def test_no_interleaving_of_queueing_and_settling_loses_a_verdict_or_passes_the_cap(tmp_path, monkeypatch,
                                                                                   ops, cap, kept):
    _ticking(monkeypatch)
    monkeypatch.setattr(review, "MAX_SETTLED", kept)
    with open_store(f"sqlite:///{tmp_path / f'{uuid.uuid4().hex}.db'}") as s:
        verdicts: list[str] = []  # ids in the order they were settled
        for op, arg in ops:
            before = {i["id"]: i for i in review.items(s, include_settled=True) if i["status"] != "pending"}
            if op == "queue":
                add(s, session_id=arg, max_per_session=cap)
                after = {i["id"]: i for i in review.items(s, include_settled=True) if i["status"] != "pending"}
                assert after == before  # queueing never trims, nor touches, a verdict
            else:
                pending = review.items(s)
                if not pending:
                    continue
                item = pending[arg % len(pending)]
                review.settle(s, item["id"], confirm=arg % 2 == 0, correction=None if arg % 2 == 0 else "no")
                verdicts.append(item["id"])
            settled = {i["id"] for i in review.items(s, include_settled=True) if i["status"] != "pending"}
            assert settled == set(verdicts[-kept:])  # the newest verdicts, and only past the bound does one go
            for sid in ("1-a", "2-b", "3-c"):
                assert review.pending_of(s, sid) <= cap


def test_tool_records_count_each_verdict_and_keep_the_last_corrections(store, tmp_path, monkeypatch):
    _ticking(monkeypatch)
    for n in range(5):
        add(store, tool="send_telegram", input={"n": n})
    add(store, tool="web_fetch")
    add(store, tool="web_fetch")
    review.settle(store, "1", confirm=True)
    review.settle(store, "4", correction="fourth")
    review.settle(store, "2", correction="second")
    review.settle(store, "3", correction="third")
    review.settle(store, "6", confirm=True)

    records = review.tool_records(store)
    assert records == {
        "send_telegram": {"confirmed": 1, "corrected": 3, "pending": 1, "corrections": ["fourth", "second", "third"]},
        "web_fetch": {"confirmed": 1, "corrected": 0, "pending": 1, "corrections": []},
    }
    assert review.tool_records(store, max_corrections=2)["send_telegram"]["corrections"] == ["second", "third"]
    assert review.tool_records(store, max_corrections=0)["send_telegram"]["corrections"] == []
    with open_store(f"sqlite:///{tmp_path / 'empty.db'}") as empty:
        assert review.tool_records(empty) == {}


def test_a_value_under_review_that_is_not_an_item_is_skipped(url, store, tmp_path):
    add(store)
    store.put("review:2", "not json {")
    store.put("review:3", [1, 2, 3])
    store.put("review:4", {"tool": "no id"})
    store.put("review:5", {"id": "9", "tool": "another key's id"})
    store.put("review:junk", {"id": "junk"})
    store.put("review:06", {"id": "6"})
    add(store)  # id 2 from the counter: the junk at review:2 is replaced by a real item
    store.put("review:7", "{}")
    with sqlite3.connect(tmp_path / "store.db") as db:  # bytes that are not text, written around brainstem
        db.execute("INSERT INTO kv (key, value) VALUES ('review:8', CAST(X'ff80' AS BLOB))")

    assert [i["id"] for i in review.items(store, include_settled=True)] == ["1", "2"]
    assert [r["id"] for r in map(json.loads, ok(cli(url, "--json")).splitlines())] == ["1", "2"]
    assert len(ok(cli(url)).splitlines()) == 3
    assert review.get(store, "4") is None and review.get(store, "8") is None
    assert "'3'" in one_line_error(cli(url, "3", "--confirm"), 2)
    assert review.tool_records(store) == {"send_telegram": {"confirmed": 0, "corrected": 0, "pending": 2,
                                                            "corrections": []}}


def test_the_agent_cannot_write_review_items_nor_their_counter(store):
    """The agent must never settle its own runs."""
    add(store)
    agent = AgentKV(store)
    for key in ("review:1", keys.review_item("2"), keys.REVIEW_COUNTER):
        with pytest.raises(KVWriteRefused):
            agent.put(key, "x")
        with pytest.raises(KVWriteRefused):
            agent.delete(key)
    assert review.get(store, "1")["status"] == "pending"


def test_the_command_module_imports_on_its_own():
    """cli.py imports the command at its end; importing the command first must work as well."""
    import subprocess
    import sys

    code = "from brainstem.operator.commands.review import review; print(review.name)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "review", out.stderr

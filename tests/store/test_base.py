"""The store contract, run against a real Redis, fakeredis and SQLite (see the ``store`` fixture)."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from brainstem.core.errors import LeaseLost, MalformedValue
from tests.helpers import unique_prefix


def test_text_round_trip_and_missing(store):
    assert store.get("nothing") is None
    assert store.get("nothing", default="d") == "d"
    store.put("greeting", "héllo\nwörld ✓")
    assert store.get("greeting") == "héllo\nwörld ✓"


def test_non_strings_are_stored_as_json_text(store):
    store.put("cfg", {"a": [1, 2.5, None, True], "b": "x"})
    assert store.get("cfg") == '{"a":[1,2.5,null,true],"b":"x"}'
    assert store.get("cfg", type="json") == {"a": [1, 2.5, None, True], "b": "x"}
    store.put("n", 7)
    assert store.get("n", "json") == 7


def test_malformed_json_is_a_clear_error_not_a_crash(store):
    store.put("broken", "{not json")
    with pytest.raises(MalformedValue, match="'broken' is not valid JSON"):
        store.get("broken", "json")
    assert store.get("broken") == "{not json"  # the raw text is still there
    seen = []
    assert store.get_json("broken", default={"fallback": 1}, on_error=seen.append) == {"fallback": 1}
    assert len(seen) == 1 and "broken" in str(seen[0])


def test_a_number_past_the_digit_limit_is_malformed_json_not_a_crash(store):
    store.put("huge", "1" * 5000)  # JSON, but past Python's limit on an int's digits
    with pytest.raises(MalformedValue, match="'huge' is not valid JSON"):
        store.get("huge", "json")


def test_overwrite_replaces(store):
    store.put("k", "one")
    store.put("k", "two")
    assert store.get("k") == "two"


def test_metadata(store):
    store.put("m", "v", metadata={"written_by": "test", "n": 1})
    assert store.get_with_metadata("m") == ("v", {"written_by": "test", "n": 1})
    store.put("m", "v2")
    assert store.get_with_metadata("m") == ("v2", None)
    assert store.get_with_metadata("absent") == (None, None)


def test_ttl_expires(store):
    store.put("short", "x", ttl=0.3)
    store.put("long", "y", ttl=60)
    assert store.get("short") == "x"
    time.sleep(0.45)
    assert store.get("short") is None
    assert store.get("long") == "y"
    names = [k.name for k in store.list_all()]
    assert "short" not in names and "long" in names


def test_delete(store):
    store.put("d", "x", metadata={"a": 1})
    assert store.delete("d") is True
    assert store.get("d") is None
    assert store.delete("d") is False


def test_list_by_prefix_sorted_with_metadata(store):
    for k in ["tool:b:code", "tool:a:code", "tool:a:meta", "prompt:orient", "toolbox"]:
        store.put(k, "x", metadata={"k": k} if k == "tool:a:meta" else None)
    names = [k.name for k in store.list_all("tool:")]
    assert names == ["tool:a:code", "tool:a:meta", "tool:b:code"]
    meta = {k.name: k.metadata for k in store.list_all("tool:")}
    assert meta["tool:a:meta"] == {"k": "tool:a:meta"}
    assert [k.name for k in store.list_all()] == sorted(["tool:b:code", "tool:a:code", "tool:a:meta",
                                                         "prompt:orient", "toolbox"])


def test_list_pagination_visits_every_key_once(store):
    expected = {f"item:{i:03d}" for i in range(57)}
    for k in expected:
        store.put(k, "v")
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        res = store.list("item:", limit=10, cursor=cursor)
        seen.extend(k.name for k in res.keys)
        pages += 1
        assert pages < 100
        if res.complete:
            break
        cursor = res.cursor
    assert set(seen) == expected
    assert len(store.list_all("item:", limit=5)) == 5


def test_list_includes_logs_and_hides_internals(store):
    store.put("plain", "v", metadata={"x": 1})
    store.append("karma:s1", {"event": "a"})
    assert store.acquire_lease("wake", "me", 10_000)
    infos = {k.name: k for k in store.list_all()}
    assert set(infos) == {"plain", "karma:s1"}
    assert infos["karma:s1"].is_log and not infos["plain"].is_log


def test_log_append_and_read_in_order(store):
    for i in range(25):
        assert store.append("karma:x", {"i": i}) == i + 1
    assert store.log_length("karma:x") == 25
    entries = store.read_log("karma:x")
    assert [int(e.split(":")[1].rstrip("}")) for e in entries] == list(range(25))
    assert store.read_log("karma:x", 3, 5) == ['{"i":3}', '{"i":4}']
    assert store.read_log("karma:x", 23) == ['{"i":23}', '{"i":24}']
    assert store.read_log("karma:x", -2) == ['{"i":23}', '{"i":24}']
    assert store.read_log("karma:x", -3, -1) == ['{"i":22}', '{"i":23}']
    assert store.read_log("karma:x", 0, 0) == []
    assert store.read_log("karma:none") == []
    assert store.log_length("karma:none") == 0


def test_delete_log_and_value_delete_do_not_mix(store):
    store.append("karma:y", "one")
    assert store.delete("karma:y") is False  # a value delete never drops a log
    assert store.log_length("karma:y") == 1
    assert store.delete_log("karma:y") is True
    assert store.log_length("karma:y") == 0
    assert store.delete_log("karma:y") is False


def test_lease_owner_token_semantics(store):
    assert store.acquire_lease("wake", "owner-a", 5_000) is True
    assert store.acquire_lease("wake", "owner-b", 5_000) is False
    assert store.lease_owner("wake") == "owner-a"
    assert store.release_lease("wake", "owner-b") is False  # only the owner releases
    assert store.renew_lease("wake", "owner-b", 5_000) is False
    assert store.renew_lease("wake", "owner-a", 5_000) is True
    assert store.release_lease("wake", "owner-a") is True
    assert store.lease_owner("wake") is None
    assert store.acquire_lease("wake", "owner-b", 5_000) is True


def test_lease_expires(store):
    assert store.acquire_lease("wake", "dead-holder", 200)
    time.sleep(0.35)
    assert store.lease_owner("wake") is None
    assert store.acquire_lease("wake", "next", 5_000) is True


def test_a_write_with_a_fence_is_made_only_while_its_lease_is_the_owners(store):
    """Each write takes its fence explicitly: refused (and nothing changed) unless the lease names the owner."""
    fence = ("wake", "owner-a")
    writes = (lambda f: store.put("k", "v", fence=f), lambda f: store.delete("k", fence=f),
              lambda f: store.incr("n", fence=f), lambda f: store.append("lg", "e", fence=f),
              lambda f: store.trim_log("lg", 0, fence=f), lambda f: store.delete_log("lg", fence=f),
              lambda f: store.reserve_spend("2026-01-01", 0.01, 1.0, "t", 60, fence=f))
    assert store.acquire_lease("wake", "owner-b", 5_000)
    for write in writes:
        with pytest.raises(LeaseLost):
            write(fence)
    assert store.list_all() == [] and store.daily_spend("2026-01-01") == (0.0, 0.0)
    assert store.release_lease("wake", "owner-b") and store.acquire_lease("wake", "owner-a", 5_000)
    store.put("k", "v", fence=fence)
    assert store.incr("n", fence=fence) == 1 and store.append("lg", "e", fence=fence) == 1
    assert store.get("k") == "v" and store.delete("k", fence=fence) and store.get("k") is None
    store.append("lg", "e2", fence=fence)
    store.trim_log("lg", 1, fence=fence)
    assert store.read_log("lg") == ["e2"] and store.delete_log("lg", fence=fence) and store.log_length("lg") == 0
    assert store.reserve_spend("2026-01-01", 0.01, 1.0, "t", 60, fence=fence)
    for write in writes:  # no fence: made whoever holds the lease
        write(None)


def test_incr(store):
    assert store.incr("session_counter") == 1
    assert store.incr("session_counter") == 2
    assert store.get("session_counter", "json") == 2
    store.put("word", "abc")
    with pytest.raises(MalformedValue):
        store.incr("word")


def test_usage_counts_keys(store):
    before = store.usage()["keys"]
    store.put("a", "x" * 100)
    store.append("karma:z", "entry")
    after = store.usage()
    assert after["keys"] == before + 2
    if not store.display_url.startswith("redis://fake/0"):  # fakeredis has no INFO
        assert after["bytes"] > 0


def test_prefixes_isolate_agents(store):
    """Two agents sharing one backend never see each other's keys."""
    other = _sibling(store, unique_prefix())
    store.put("soul", "mine")
    other.put("soul", "theirs")
    store.append("karma:1", "m")
    assert store.get("soul") == "mine" and other.get("soul") == "theirs"
    assert other.log_length("karma:1") == 0
    assert [k.name for k in other.list_all()] == ["soul"]
    assert store.acquire_lease("wake", "a", 5_000) and other.acquire_lease("wake", "b", 5_000)


def _sibling(store, prefix):
    from brainstem.store.redis.store import RedisStore
    from brainstem.store.sqlite.store import SQLiteStore

    if isinstance(store, SQLiteStore):
        return SQLiteStore(store.path, prefix=prefix)
    return RedisStore("redis://unused/0", prefix=prefix, client=store._r)


# --- two processes on one store (real backends only) ----------------------

def _appender(url: str, n: int, tag: str) -> None:
    from brainstem.store import open_store

    s = open_store(url)
    for i in range(n):
        s.append("karma:shared", f"{tag}{i}")
        s.incr("counter")


def _try_to_lease(url: str, owner: str, results) -> None:
    from brainstem.store import open_store

    results.put((owner, open_store(url).acquire_lease("wake", owner, 10_000)))


@pytest.mark.slow
def test_two_processes_share_one_store(real_store_url):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_appender, args=(real_store_url, 150, tag)) for tag in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    from brainstem.store import open_store

    s = open_store(real_store_url)
    entries = s.read_log("karma:shared")
    assert sorted(entries) == sorted([f"a{i}" for i in range(150)] + [f"b{i}" for i in range(150)])
    # each writer's own entries stay in its order
    assert [e for e in entries if e[0] == "a"] == [f"a{i}" for i in range(150)]
    assert s.get("counter", "json") == 300

    results = ctx.Queue()
    contenders = [ctx.Process(target=_try_to_lease, args=(real_store_url, f"o{i}", results)) for i in range(4)]
    for p in contenders:
        p.start()
    for p in contenders:
        p.join(60)
    got = [results.get(timeout=5) for _ in contenders]
    assert sum(1 for _, ok in got if ok) == 1


def test_a_trimmed_log_counts_from_its_oldest_kept_entry(store):
    """Every backend numbers a trimmed log as Redis's LTRIM leaves it: index 0 is the oldest entry kept,
    and the length is how many are kept, so code that pages a log works the same on each."""
    for i in range(10):
        store.append("lg", f"e{i}")
    store.trim_log("lg", 4)
    assert store.log_length("lg") == 4
    assert store.read_log("lg") == ["e6", "e7", "e8", "e9"]
    assert store.read_log("lg", 1, 3) == ["e7", "e8"]
    assert store.read_log("lg", -2) == ["e8", "e9"]
    assert store.append("lg", "e10") == 5
    store.trim_log("lg", 2)
    assert store.read_log("lg") == ["e9", "e10"] and store.log_length("lg") == 2
    store.trim_log("lg", 5)  # keeping more than there are changes nothing
    assert store.read_log("lg") == ["e9", "e10"]


def test_an_sqlite_file_from_before_trimmed_logs_were_renumbered_opens_as_it_was(tmp_path):
    import sqlite3

    from brainstem.store.sqlite.store import SQLiteStore

    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL, metadata TEXT, expires_at REAL) WITHOUT ROWID;
        CREATE TABLE logs (key TEXT NOT NULL, seq INTEGER NOT NULL, entry TEXT NOT NULL, PRIMARY KEY (key, seq))
            WITHOUT ROWID;
        CREATE TABLE log_keys (key TEXT PRIMARY KEY, length INTEGER NOT NULL) WITHOUT ROWID;
        INSERT INTO log_keys VALUES ('karma:1-a', 3);
        INSERT INTO logs VALUES ('karma:1-a', 0, 'a'), ('karma:1-a', 1, 'b'), ('karma:1-a', 2, 'c');
    """)
    db.commit()
    db.close()
    store = SQLiteStore(path)
    assert store.read_log("karma:1-a") == ["a", "b", "c"] and store.log_length("karma:1-a") == 3
    assert store.usage()["bytes"] == 3  # the logs' sizes, counted once when the file is opened
    assert store.append("karma:1-a", "d") == 4
    store.trim_log("karma:1-a", 2)
    assert store.read_log("karma:1-a") == ["c", "d"] and store.usage()["bytes"] == 2
    store.close()


def test_a_store_url_shows_the_agent_by_its_name_however_it_was_named(tmp_path):
    from brainstem.store import open_store
    from brainstem.store.base import shown_url

    db = tmp_path / "s.db"
    for url, prefix in ((f"sqlite:///{db}?prefix=bob:", None), (f"sqlite:///{db}?prefix=bob", None),
                        (f"sqlite:///{db}", "bob"), (f"sqlite:///{db}", "bob:")):
        with open_store(url, prefix=prefix) as store:
            assert store.display_url == f"sqlite:///{db}?prefix=bob", (url, prefix)
            shown = store.display_url
        with open_store(shown) as again:  # still a URL, naming the same agent
            assert again.prefix == "bob:"
    with open_store(f"sqlite:///{db}") as store:
        assert store.display_url == f"sqlite:///{db}"  # the default agent: no prefix at all
    assert shown_url("redis://***@h:6379/0?prefix=bob:&socket_timeout=5", "bob:") == \
        "redis://***@h:6379/0?socket_timeout=5&prefix=bob"
    assert shown_url("redis://h:6379/0", "ann:") == "redis://h:6379/0?prefix=ann"
    assert shown_url("redis://h:6379/0?prefix=ann", "") == "redis://h:6379/0"

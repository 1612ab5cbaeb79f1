"""A real Redis Cluster (three ``redis-server --cluster-enabled yes`` nodes joined by ``redis-cli --cluster
create``): each agent's keys share one hash slot, so its scripts, MULTI writes and fenced writes work, and
a whole session runs on it."""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis

from brainstem.core import keys
from brainstem.core.errors import ConfigError, LeaseLost
from brainstem.state import history as session_history
from brainstem.store import karma, open_store
from brainstem.store.fenced import FencedStore
from tests.helpers import run_cli, unique_prefix
from tests.wake_helpers import finished, plan, reflection, run_wake, seeded, think, wake_env

pytestmark = pytest.mark.redis


@pytest.fixture
def cluster_url(redis_cluster):
    return redis_cluster[0]


def slots(ports: list[int], names: list[str]) -> set[int]:
    client = redis.Redis(port=ports[0], decode_responses=True)
    try:
        return {client.execute_command("CLUSTER", "KEYSLOT", n) for n in names}
    finally:
        client.close()


def physical_keys(ports: list[int], pattern: str) -> list[str]:
    found = []
    for port in ports:
        client = redis.Redis(port=port, decode_responses=True)
        found += list(client.scan_iter(match=pattern, count=1000))
        client.close()
    return sorted(found)


def test_an_agents_keys_share_one_slot_so_its_scripts_and_transactions_work(redis_cluster):
    url, ports = redis_cluster
    name = unique_prefix()[:-1]
    store = open_store(url, prefix=name)
    store.put("soul", "be useful", metadata={"v": 1})
    store.put("config:defaults", {"a": 1})
    store.append(keys.karma("1-a"), {"event": "session_start"})
    assert store.acquire_lease(keys.WAKE_LEASE, "me", 5000)
    found = physical_keys(ports, "{" + name + "}:*")
    tag = "{" + name + "}:"
    assert {tag + "soul", tag + "__meta__:soul", tag + "__lock__:wake"} <= set(found)
    assert len(slots(ports, found)) == 1, "an agent's keys are spread over slots"
    assert store.get_with_metadata("soul") == ("be useful", {"v": 1})  # MGET of a value and its metadata
    session = FencedStore(store, keys.WAKE_LEASE, "me")
    session.put(keys.WAKE_CONFIG, {"n": 1})  # a fenced write: a Lua script over three keys
    store.release_lease(keys.WAKE_LEASE, "me")
    assert store.acquire_lease(keys.WAKE_LEASE, "someone-else", 5000)
    with pytest.raises(LeaseLost):
        session.put(keys.WAKE_CONFIG, {"n": 2})
    assert store.get(keys.WAKE_CONFIG, "json") == {"n": 1}
    assert store.delete("config:defaults") and store.get("config:defaults") is None
    store.close()


def test_the_store_contract_holds_on_a_cluster(cluster_url):
    store = open_store(cluster_url, prefix=unique_prefix())
    for i in range(30):
        store.put(f"k:{i:02d}", str(i))
        store.append("lg", f"e{i}")
    page, seen, cursor = store.list("k:", limit=7), [], None
    while True:
        page = store.list("k:", limit=7, cursor=cursor)
        seen += [k.name for k in page.keys]
        if page.complete:
            break
        cursor = page.cursor
    assert sorted(set(seen)) == [f"k:{i:02d}" for i in range(30)]
    assert [k.name for k in store.list_all("lg")] == ["lg"] and store.list_all("lg")[0].is_log
    store.trim_log("lg", 5)
    assert store.read_log("lg") == [f"e{i}" for i in range(25, 30)] and store.log_length("lg") == 5
    assert store.incr("counter") == 1 and store.incr("counter", 4) == 5
    store.put("ttl", "x", ttl=0.2)
    assert store.get("ttl") == "x"
    assert store.usage()["keys"] >= 32
    store.close()


def test_the_default_agent_and_a_named_one_stay_apart_on_a_cluster(cluster_url):
    default = open_store(cluster_url, prefix="")
    name = unique_prefix()[:-1]
    named = open_store(cluster_url, prefix=name)
    named.put("soul", "named")
    default.put("note", "the default agent's")
    assert named.get("note") is None
    assert default.get(f"{name}:soul") is None  # the named agent's key is out of the default view's reach
    with pytest.raises(Exception, match="belongs to agent"):
        default.put(f"{name}:soul", "hijack")
    assert named.get("soul") == "named"
    default.close()
    named.close()


def test_a_whole_session_runs_on_a_cluster(cluster_url, llm):
    url = f"{cluster_url}?prefix={unique_prefix()[:-1]}"
    store = seeded(url)
    llm.queue(plan(think("What now?", id="t1", model="haiku", max_tokens=20), next_wake={"sleep_seconds": 3600}),
              "an answer", reflection("ran on a cluster"))
    sid, entries = finished(run_wake(wake_env(url, llm)), store, outcome="clean")
    assert [h["id"] for h in session_history.read(store)] == [sid]
    assert karma.read(store, sid)[-1]["event"] == "session_end"
    status = run_cli("status", "--json", env={"BRAINSTEM_KV": url})
    assert status.returncode == 0 and json.loads(status.stdout)["store"].startswith("redis+cluster://")
    store.close()


@pytest.mark.parametrize("url, says", [
    ("redis+cluster://", "not HOST:PORT"),
    ("redis+cluster://127.0.0.1:notaport", "not HOST:PORT"),
    ("redis+cluster://127.0.0.1:7000,,127.0.0.1:7001", "not HOST:PORT"),
    ("redis+cluster://127.0.0.1:7000/3", "only database 0"),
    ("rediss+cluster://:hunter2secret@127.0.0.1:99999/", "not HOST:PORT"),
])
def test_a_malformed_cluster_url_is_one_line_and_exit_2(url, says):
    r = run_cli("status", env={"BRAINSTEM_KV": url})
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in r.stderr
    assert "hunter2secret" not in r.stderr
    with pytest.raises(ConfigError):
        open_store(url)


def test_an_unreachable_cluster_is_one_line_naming_it_without_its_password():
    from tests.helpers import free_port

    url = f"redis+cluster://:pw-secret@127.0.0.1:{free_port()}/"
    r = run_cli("status", env={"BRAINSTEM_KV": url})
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "pw-secret" not in r.stderr and "Traceback" not in r.stderr and "127.0.0.1" in r.stderr


@pytest.mark.slow
def test_a_primary_failing_over_mid_write_loses_nothing(tmp_path):
    """Three primaries with a replica each; the primary holding the agent's slot is SIGKILLed, its replica
    takes over, and writes made across the failover are retried, not lost and not doubled."""
    from tests.helpers import redis_unavailable
    from tests.redis_server import RedisServerError, start_redis_cluster, stop

    try:
        procs, ports = start_redis_cluster(tmp_path, masters=3, replicas=1, node_timeout_ms=1000)
    except RedisServerError as exc:
        redis_unavailable(exc)
    try:
        url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports) + "/"
        store = open_store(url, prefix="failover", retry_seconds=15)
        for i in range(5):
            store.append(keys.karma("1-a"), {"n": i})
        store.put("k", "before")
        slot = slots(ports, ["{failover}:k"]).pop()
        # A replica may join its primary's shard a moment after the cluster answers: ask until it has.
        client = redis.Redis(port=ports[0], decode_responses=True)
        owner = replica = None
        deadline = time.monotonic() + 20
        while (owner is None or replica is None) and time.monotonic() < deadline:
            owner, owner_port, replica = _slot_holders(client.execute_command("CLUSTER", "SHARDS"), slot, procs, ports)
            if replica is None:
                time.sleep(0.2)
        client.close()
        assert owner is not None and replica is not None, "no primary with a replica owns the agent's slot"
        # Redis replicates asynchronously: a write the primary acknowledged but had not yet sent on is lost
        # with it (see the README). What is on the replica must survive; what comes after must not be lost.
        primary_client, replica_client = redis.Redis(port=owner_port), redis.Redis(port=replica)
        offset = primary_client.info("replication")["master_repl_offset"]
        deadline = time.monotonic() + 10
        while replica_client.info("replication").get("slave_repl_offset", 0) < offset:
            assert time.monotonic() < deadline, "the replica did not catch up"
            time.sleep(0.05)
        primary_client.close()
        replica_client.close()
        # A session and its heartbeat share one store (one client) across the failover: whatever the client
        # raises mid-failover is retried, and neither thread is left with a broken client afterwards.
        errors: list[BaseException] = []

        def heartbeat():
            try:
                for i in range(40):
                    store.put("hb", str(i))
                    time.sleep(0.05)
            except BaseException as exc:  # noqa: BLE001 - the test reports it
                errors.append(exc)
        beat = threading.Thread(target=heartbeat)
        owner.kill()
        beat.start()
        owner.wait(5)
        for i in range(5, 10):  # across the failover: retried until the replica is promoted
            store.append(keys.karma("1-a"), {"n": i})
        store.put("k", "after")
        beat.join(60)
        assert not errors, errors
        assert [json.loads(e)["n"] for e in store.read_log(keys.karma("1-a"))] == list(range(10))
        assert store.get("k") == "after" and store.get("hb") == "39"
        t0 = time.monotonic()
        store.put("healed", "yes")  # a healed cluster answers at once, not after the client recovers itself
        assert store.get("healed") == "yes" and time.monotonic() - t0 < 2
        store.close()
    finally:
        for proc in procs:
            stop(proc)


def _slot_holders(shards, slot, procs, ports):
    """(the primary's process, its port, the replica's port) of the shard serving ``slot``; None where absent."""
    owner = owner_port = replica = None
    for shard in shards:
        shard = dict(zip(shard[::2], shard[1::2], strict=True)) if isinstance(shard, list) else shard
        ranges = shard["slots"]
        if any(int(ranges[i]) <= slot <= int(ranges[i + 1]) for i in range(0, len(ranges), 2)):
            for node in shard["nodes"]:
                node = dict(zip(node[::2], node[1::2], strict=True)) if isinstance(node, list) else node
                if node["role"] == "master":
                    owner, owner_port = procs[ports.index(int(node["port"]))], int(node["port"])
                else:
                    replica = int(node["port"])
    return owner, owner_port, replica

"""The agent's guarded view: soul immutable on every path, batches all-or-nothing."""

from __future__ import annotations

import pytest

from brainstem.core import events
from brainstem.core.errors import KVWriteRefused, SoulImmutable
from brainstem.state.guarded import AgentKV, check_key
from tests.helpers import Recorder


@pytest.fixture
def agent(store):
    store.put("soul", "I am the soul.")
    rec = Recorder()
    return AgentKV(store, rec), store, rec


def test_soul_cannot_be_put(agent):
    kv, store, rec = agent
    with pytest.raises(SoulImmutable):
        kv.put("soul", "I am someone else now.")
    assert store.get("soul") == "I am the soul."
    assert rec.of(events.KV_WRITE_REFUSED)[0]["key"] == "soul"


def test_soul_cannot_be_deleted(agent):
    kv, store, _ = agent
    with pytest.raises(SoulImmutable):
        kv.delete("soul")
    assert store.get("soul") == "I am the soul."


@pytest.mark.parametrize("old,new", [("soul", "elsewhere"), ("notes", "soul")])
def test_soul_cannot_be_renamed_from_or_onto(agent, old, new):
    kv, store, _ = agent
    store.put("notes", "overwrite the soul with me")
    with pytest.raises(SoulImmutable):
        kv.rename(old, new)
    assert store.get("soul") == "I am the soul."
    assert store.get("notes") == "overwrite the soul with me"


@pytest.mark.parametrize("batch", [
    [{"op": "put", "key": "wisdom", "value": "fine"}, {"op": "put", "key": "soul", "value": "evil"}],
    [{"op": "put", "key": "wisdom", "value": "fine"}, {"op": "delete", "key": "soul"}],
    [{"op": "put", "key": "x", "value": "evil"}, {"op": "rename", "key": "x", "value": "soul"}],
    [{"op": "rename", "key": "soul", "value": "old_soul"}],
])
def test_soul_cannot_change_through_a_batch_and_nothing_else_applies(agent, batch):
    kv, store, rec = agent
    with pytest.raises(SoulImmutable):
        kv.apply_operations(batch)
    assert store.get("soul") == "I am the soul."
    assert store.get("wisdom") is None and store.get("x") is None and store.get("old_soul") is None
    assert rec.of(events.KV_OPERATIONS_REJECTED)
    assert not rec.of(events.KV_WRITE)


def test_invalid_op_rejects_the_whole_batch_and_records_why(agent):
    kv, store, rec = agent
    batch = [{"op": "put", "key": "a", "value": 1}, {"operation": "set", "key": "b", "value": 2}]
    with pytest.raises(KVWriteRefused, match="invalid kv_operations"):
        kv.apply_operations(batch)
    assert store.get("a") is None and store.get("b") is None
    (rejected,) = rec.of(events.KV_OPERATIONS_REJECTED)
    assert "operation 1" in rejected["reason"] and rejected["operations"] == batch


@pytest.mark.parametrize("batch", [
    "not a list",
    [{"op": "put", "key": "a"}],                      # no value
    [{"op": "delete", "key": "a", "extra": 1}],       # unknown field
    [{"op": "rename", "key": "nope", "value": "b"}],  # source does not exist
    [{"op": "put", "key": "bad::key", "value": 1}],
    [{"op": "put", "key": "ok", "value": 1}] * 101,   # too many
])
def test_malformed_batches_are_rejected_whole(agent, batch):
    kv, store, _ = agent
    with pytest.raises(KVWriteRefused):
        kv.apply_operations(batch)
    assert [k.name for k in store.list_all()] == ["soul"]


def test_valid_batch_applies_in_order_including_rename_of_a_key_it_created(agent):
    kv, store, _ = agent
    done = kv.apply_operations([
        {"op": "put", "key": "draft", "value": {"n": 1}},
        {"op": "rename", "key": "draft", "value": "notes:final"},
        {"op": "put", "key": "gone", "value": "x"},
        {"op": "delete", "key": "gone"},
    ])
    assert len(done) == 4
    assert store.get("notes:final", "json") == {"n": 1}
    assert store.get("draft") is None and store.get("gone") is None


def test_rename_of_a_key_deleted_earlier_in_the_batch_is_caught_before_writing(agent):
    kv, store, _ = agent
    store.put("a", "1")
    with pytest.raises(KVWriteRefused, match="does not exist"):
        kv.apply_operations([{"op": "put", "key": "b", "value": 2}, {"op": "delete", "key": "a"},
                             {"op": "rename", "key": "a", "value": "c"}])
    assert store.get("a") == "1" and store.get("b") is None


@pytest.mark.parametrize("key", ["session_counter", "session:current", "karma:1", "wake_config",
                                 "provider:llm:last_working:code", "last_reflect", "deep_reflect_schedule"])
def test_runtime_owned_keys_are_refused(agent, key):
    kv, store, _ = agent
    with pytest.raises(KVWriteRefused, match="owned by the runtime"):
        kv.put(key, "x")
    assert store.get(key) is None


@pytest.mark.parametrize("key", ["", "a::b", ":a", "a:", "tab\there", "nl\nx", "zero\u200bwidth", " padded",
                                 "__meta__:x", "__lock__:wake", "x" * 600, 42])
def test_malformed_keys_are_refused(agent, key):
    kv, _, _ = agent
    with pytest.raises(KVWriteRefused):
        kv.put(key, "x")


def test_good_keys_pass():
    for key in ["wisdom", "tool:web_fetch:code", "tooldata:x:y z", "notes/2026-11-22", "ünïcode"]:
        assert check_key(key) == key


def test_privileged_write_records_the_previous_value(agent):
    kv, store, rec = agent
    store.put("prompt:orient", "old prompt")
    versions = []
    kv2 = AgentKV(store, rec, on_privileged_write=lambda k, old, new, src: versions.append((k, old, new, src)))
    kv2.put("prompt:orient", "new prompt")
    kv2.put("notes", "plain")
    writes = rec.of(events.KV_WRITE)
    assert writes[0]["key"] == "prompt:orient" and writes[0]["old_value"] == "old prompt"
    assert "old_value" not in writes[1]  # ordinary keys are not versioned
    assert versions == [("prompt:orient", "old prompt", "new prompt", "agent")]
    kv2.delete("prompt:orient")
    assert rec.of(events.KV_WRITE)[-1]["old_value"] == "new prompt"
    assert versions[-1] == ("prompt:orient", "new prompt", None, "agent")


def test_oversized_value_refused(agent):
    kv, store, _ = agent
    with pytest.raises(KVWriteRefused, match="limit"):
        kv.put("big", "x" * (600 * 1024))
    assert store.get("big") is None

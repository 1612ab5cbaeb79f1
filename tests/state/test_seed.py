"""Seeding: complete, idempotent, and never touches an existing soul."""

from __future__ import annotations

import json

import pytest

from brainstem.core import keys
from brainstem.core.errors import ConfigError
from brainstem.state.seed import example_soul_path, seed
from brainstem.state.shipped import seed_entries


def test_seed_files_cover_the_contract_keys():
    entries = seed_entries()
    for key in ["prompt:orient", "prompt:reflect", "prompt:deep", "prompt:subplan", "config:defaults",
                "config:models", "config:resources", "config:tool_registry"]:
        assert key in entries, key
    for tool in ["web_fetch", "kv_read", "kv_write", "send_telegram", "check_or_balance",
                 "check_wallet_balance", "topup_openrouter"]:
        assert "def execute(args, ctx)" in entries[keys.tool_code(tool)]
        json.loads(entries[keys.tool_meta(tool)])
    assert "soul" not in entries and not any(k.startswith("prompt:soul") for k in entries)


def test_seed_writes_everything_then_is_idempotent(store):
    first = seed(store)
    assert len(first.written) == len(seed_entries()) and not first.kept
    assert first.soul == "absent" and store.get("soul") is None
    snapshot = {k.name: store.get(k.name) for k in store.list_all()}
    second = seed(store)
    assert not second.written and len(second.kept) == len(first.written)
    assert {k.name: store.get(k.name) for k in store.list_all()} == snapshot


def test_seed_keeps_what_the_agent_changed_unless_forced(store):
    seed(store)
    store.put("prompt:orient", "my improved orient prompt")
    seed(store)
    assert store.get("prompt:orient") == "my improved orient prompt"
    seed(store, force=True)
    assert store.get("prompt:orient") == seed_entries()["prompt:orient"]


def test_soul_is_set_when_absent_and_never_overwritten(store, tmp_path):
    soul_a, soul_b = tmp_path / "a.md", tmp_path / "b.md"
    soul_a.write_text("I am A.")
    soul_b.write_text("I am B.")
    assert seed(store, soul_file=soul_a).soul == "set"
    assert store.get("soul") == "I am A."
    assert seed(store, soul_file=soul_b, force=True).soul == "kept"
    assert store.get("soul") == "I am A."


def test_example_soul_ships():
    assert example_soul_path().read_text().strip()


@pytest.mark.parametrize("content", ["", "   \n"])
def test_empty_soul_file_is_refused(store, tmp_path, content):
    f = tmp_path / "soul.md"
    f.write_text(content)
    with pytest.raises(ConfigError, match="empty"):
        seed(store, soul_file=f)
    assert store.get("soul") is None


def test_missing_soul_file_is_a_clear_error(store, tmp_path):
    with pytest.raises(ConfigError, match="cannot read soul file"):
        seed(store, soul_file=tmp_path / "nope.md")

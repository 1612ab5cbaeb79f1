"""What orient sees of the store: the keys it asked to load, and an index of the rest.

Both are bounded, so a prompt stays the same size after 10,000 sessions as
after 10: each loaded value is capped, the number of loaded keys is capped,
secrets are never loaded, and past a cap the index is summarised by prefix.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from . import keys
from .kv.base import Store

NEVER_LOADED_PREFIXES = ("secret:", "karma:", "__")
INDEX_HIDDEN = ("stats:", "history:")


def load_keys(store: Store, names: list[Any], max_keys: int, max_bytes: int) -> tuple[dict[str, Any], list[str]]:
    """(values by key, notes). Values are text, capped at ``max_bytes`` characters."""
    out: dict[str, Any] = {}
    notes: list[str] = []
    seen = []
    for name in names:
        if isinstance(name, str) and name not in seen:
            seen.append(name)
    if len(seen) > max_keys:
        notes.append(f"asked to load {len(seen)} keys; loaded the first {max_keys}")
        seen = seen[:max_keys]
    for name in seen:
        if name.startswith(NEVER_LOADED_PREFIXES) or name == keys.SOUL:
            notes.append(f"{name}: not loadable into a prompt")
            continue
        value = store.get(name)
        if value is None:
            notes.append(f"{name}: no such key")
            continue
        if len(value) > max_bytes:
            value = value[:max_bytes] + f"... [{len(value) - max_bytes} more chars; read the key with kv_read]"
        out[name] = value
    return out, notes


def kv_index(store: Store, max_keys: int) -> dict[str, Any]:
    """Key names (no values). Past ``max_keys`` names, counts by first segment instead."""
    names = [k.name for k in store.list_all(limit=max_keys * 50) if not k.name.startswith(INDEX_HIDDEN)]
    logs = [n for n in names if n.startswith("karma:")]
    others = [n for n in names if not n.startswith("karma:")]
    index: dict[str, Any] = {"karma_logs": len(logs)}
    if len(others) <= max_keys:
        index["keys"] = others
    else:
        index["keys_by_prefix"] = dict(Counter(n.split(":", 1)[0] + (":*" if ":" in n else "") for n in others))
        index["note"] = f"{len(others)} keys; summarised by prefix. List one prefix with a tool to see names."
    return index

"""Where the agent's code came from, so an operator's mode floor follows the code and not its name.

``BRAINSTEM_TOOL_MODES=notify=manual`` must still hold after the agent renames
``tool:notify:*`` to ``notify2`` or copies its code there. Every write of code
the agent makes (``tool:NAME:code``, ``provider:NAME:code``) goes through its
guarded store view, which notes here, in the runtime-owned
``stats:tool_lineage``:

* a rename or copy: the new name's origins are the old name and its origins;
* code written identical to another tool's current code: that tool is an origin;
* code written where there was none: the agent created it (``new``).

:func:`floor` is then the name's own floor (else ``new`` for code the agent
created, else ``*``), raised to the floor of any name it came from.
"""

from __future__ import annotations

from typing import Any

from brainstem.core import keys
from brainstem.store.base import Store

MODES = ("automated", "supervised", "manual")  # least supervised first
MAX_ORIGINS = 50


def code_name(key: str) -> str | None:
    """The name a mode floor uses for code stored at ``key`` (``notify``, ``provider:llm``), or None."""
    parts = key.split(":")
    if len(parts) == 3 and parts[0] == "tool" and parts[2] == "code":
        return parts[1]
    if len(parts) == 3 and parts[0] == "provider" and parts[2] == "code":
        return f"provider:{parts[1]}"
    return None


def code_key(name: str) -> str:
    return f"{name}:code" if name.startswith("provider:") else keys.tool_code(name)


def load(store: Store) -> dict[str, Any]:
    return store.get_object(keys.TOOL_LINEAGE)


def note_write(store: Store, key: str, text: str | None, origin: str | None) -> None:
    """Before the agent writes ``text`` to ``key`` (moved or copied from ``origin``, if so)."""
    name = code_name(key)
    if name is None:
        return
    rec = load(store)
    entry = dict(rec.get(name) or {})
    origins = set(entry.get("from") or [])
    if origin is not None:
        source = code_name(origin)
        if source is None:  # code moved in from a data key: the agent wrote it
            entry["new"] = True
        else:
            origins |= {source, *(rec.get(source) or {}).get("from", [])}
            entry["new"] = bool(entry.get("new")) or bool((rec.get(source) or {}).get("new"))
    else:
        if store.get(key) is None:
            entry["new"] = True
        if text is not None:
            for other in _code_names(store):
                if other != name and store.get(code_key(other)) == text:
                    origins |= {other, *(rec.get(other) or {}).get("from", [])}
    origins.discard(name)
    entry["from"] = sorted(origins)[:MAX_ORIGINS]
    if entry != rec.get(name):
        store.put(keys.TOOL_LINEAGE, {**rec, name: entry})


def _code_names(store: Store) -> list[str]:
    out = []
    for prefix in ("tool:", "provider:"):
        for info in store.list_all(prefix, limit=2000):
            name = code_name(info.name)
            if name is not None:
                out.append(name)
    return out


def floor(store: Store, name: str, floors: dict[str, str]) -> str | None:
    """The least supervision code ``name`` gets. Its own entry, else ``new`` for code the agent created,
    else ``*``; then never less than the entry of any name the code came from (so a copy or a rename
    keeps a floor, and an entry that exempts a name from ``*`` does not follow its code elsewhere)."""
    entry = load(store).get(name) or {}
    if name in floors:
        base = floors[name]
    elif entry.get("new") and "new" in floors:
        base = floors["new"]
    else:
        base = floors.get("*")
    found = [m for m in (base, *(floors.get(o) for o in entry.get("from") or [])) if m in MODES]
    return max(found, key=MODES.index) if found else None

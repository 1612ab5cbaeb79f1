"""Code the operator approved, by its exact bytes under its name: what ``new=MODE`` floors.

Code under ``tool:NAME:code`` or ``provider:NAME:code`` is *approved* when the
sha256 of its bytes is the one recorded for that name in ``approved:{code
key}``, a runtime-owned key the agent cannot write. The operator records it by
seeding, by ``brainstem kv put`` of the code, and by ``brainstem tool
approve``; the record keeps the bytes too, so ``brainstem tool diff`` can show
what changed since. A name with no record at all (a store seeded before
approvals were recorded) has the shipped seed's bytes for that name approved.

Everything else is *pending*, however it got there (a put, a copy, a rename, a
rewrite in place) and however much it looks like approved code: the question is
asked of the bytes about to run, under the name they run as, at the moment they
run. With ``new=MODE`` in ``BRAINSTEM_TOOL_MODES`` pending code gets at least
``MODE``; a name's own entry (else ``*``) applies to approved and pending code
alike, and the stricter wins.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import unicodedata
from collections.abc import Mapping
from typing import Any

from brainstem.core import keys
from brainstem.core.clock import now_iso
from brainstem.core.errors import BrainstemError
from brainstem.state.shipped import seed_entries
from brainstem.state.versions import unified_diff, versions
from brainstem.store.base import Store

MODES = ("automated", "supervised", "manual")  # least supervised first
MAX_CODE_KEYS = 5000  # listed for `brainstem tool pending`


def digest(code: str) -> str:
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


@functools.lru_cache(maxsize=1)
def _shipped() -> dict[str, str]:
    """The shipped seed's code, by name (tools and providers)."""
    try:
        entries = seed_entries(with_providers=True)
    except BrainstemError:
        return {}  # no seed files with this install: nothing is approved by being shipped
    return {name: text for key, text in entries.items() if (name := keys.code_name(key)) is not None}


def record(store: Store, name: str) -> dict[str, Any] | None:
    """What the operator approved under ``name`` (``sha256``, ``code``, ``at``, ``by``), or None.

    A record that is not whole (not JSON, bytes that do not hash to its sha256) approves nothing, and the
    shipped seed's bytes stand in only where no record exists at all."""
    try:
        raw = store.get(keys.approved(name))
    except BrainstemError:
        return None
    if raw is None:
        shipped = _shipped().get(name)
        if shipped is None:
            return None
        return {"sha256": digest(shipped), "code": shipped, "at": None, "by": "shipped"}
    try:
        rec = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("code"), str) or rec.get("sha256") != digest(rec["code"]):
        return None
    return rec


def is_approved(store: Store, name: str, code: str) -> bool:
    rec = record(store, name)
    return rec is not None and hmac.compare_digest(rec["sha256"], digest(code))


def approve(store: Store, name: str, code: str, by: str) -> dict[str, Any]:
    """Record ``code`` as the approved bytes of ``name`` (unchanged when they already are)."""
    rec = record(store, name)
    if rec is not None and rec["by"] != "shipped" and rec["sha256"] == digest(code):
        return rec
    rec = {"sha256": digest(code), "bytes": len(code.encode("utf-8")), "at": now_iso(ms=True), "by": by,
           "code": code}
    store.put(keys.approved(name), rec)
    return rec


def floor(store: Store, name: str, code: str, floors: Mapping[str, str] | None) -> str | None:
    """The least supervision ``code`` gets when it runs as ``name``: the name's own entry (else ``*``), and
    for code not approved under ``name``, ``new`` too; the strictest of them."""
    floors = floors or {}
    found = [floors.get(name, floors.get("*"))]
    if "new" in floors and not is_approved(store, name, code):
        found.append(floors["new"])
    found = [m for m in found if m in MODES]
    return max(found, key=MODES.index) if found else None


def strictest(mode: str, mode_floor: str | None) -> str:
    """``mode`` raised to ``mode_floor`` (None: no floor)."""
    return mode_floor if mode_floor in MODES and MODES.index(mode_floor) > MODES.index(mode) else mode


def code_names(store: Store) -> list[str]:
    """Every name with code in the store (``notify``, ``provider:llm``), sorted by key."""
    out = []
    for prefix in ("tool:", "provider:"):
        for info in store.list_all(prefix, limit=MAX_CODE_KEYS):
            name = keys.code_name(info.name)
            if name is not None and not info.is_log:
                out.append(name)
    return out


def pending(store: Store) -> list[dict[str, Any]]:
    """The code in the store not approved under its name: ``name``, ``key``, ``since`` (when these bytes
    were written, when the store's history says), ``bytes`` and ``sha256``."""
    out = []
    for name in code_names(store):
        key = keys.code_key(name)
        try:
            code = store.get(key)
        except BrainstemError:
            continue  # not text: it cannot run either
        if code is None or is_approved(store, name, code):
            continue
        vs = versions(store, key)
        since = vs[-1].get("at") if vs and vs[-1].get("value") == code else None
        out.append({"name": name, "key": key, "since": since, "bytes": len(code.encode("utf-8")),
                    "sha256": digest(code)})
    return out


def diff(store: Store, name: str, code: str) -> str:
    """A unified diff from the bytes approved under ``name`` (none: empty) to ``code``, "" when they are the
    same. Every character a reader would not see (terminal escapes, zero-width and bidi controls, a carriage
    return) is spelled out, since the operator approves the bytes and not what a screen makes of them."""
    rec = record(store, name)
    key = keys.code_key(name)
    approved = rec["code"] if rec else ""
    if approved == code:
        return ""
    before = f"{key} (approved {rec['sha256'][:12]})" if rec else f"{key} (nothing approved)"
    after = f"{key} (current {digest(code)[:12]})"
    text = (unified_diff(approved, code, before, after)
            or f"--- {before}\n+++ {after}\n(the two differ only in whether the last line ends with a newline)\n")
    return visible(text)


def visible(text: str) -> str:
    """``text`` with every control, format or unassigned character but newline and tab as ``\\u{XXXX}``."""
    return "".join(f"\\u{{{ord(c):04x}}}" if hidden(c) else c for c in text)


def hidden(c: str) -> bool:
    """Whether the character ``c`` is one :func:`visible` spells out (it is not newline or tab, and is a
    control, format, surrogate, private-use, unassigned or line/paragraph separator character)."""
    return c not in "\n\t" and unicodedata.category(c) in _HIDDEN


_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})

"""The store protocol every backend implements.

It mirrors Cloudflare KV (get, get_with_metadata, put with metadata and TTL,
delete, list by prefix with a cursor) and adds what Redis gives us: append-only
logs for karma and an owner-token lock for the wake.

Values are text. Anything that is not a ``str`` is stored as JSON text, so a
value written as ``{"a": 1}`` reads back as ``'{"a": 1}'`` with ``get`` and as
``{"a": 1}`` with ``get(key, type="json")``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import MalformedValue

@dataclass
class KeyInfo:
    name: str
    metadata: dict | None = None
    expiration: float | None = None  # unix time, when the key has a TTL
    is_log: bool = False


@dataclass
class ListResult:
    keys: list[KeyInfo] = field(default_factory=list)
    cursor: str | None = None  # pass back to continue; None when complete

    @property
    def complete(self) -> bool:
        return self.cursor is None


class Store:
    """What every backend offers. Keys are plain strings; backends add their own prefix.

    Subclasses implement the primitives; the JSON helpers live here once.
    """

    display_url: str = ""  # the URL with any password removed, safe to print

    # --- primitives (each backend) ---
    def get_text(self, key: str) -> str | None: raise NotImplementedError
    def get_with_metadata(self, key: str) -> tuple[str | None, dict | None]: raise NotImplementedError
    def put(self, key: str, value: Any, metadata: dict | None = None, ttl: float | None = None) -> None: raise NotImplementedError
    def delete(self, key: str) -> bool: raise NotImplementedError
    def list(self, prefix: str = "", limit: int = 1000, cursor: str | None = None) -> ListResult: raise NotImplementedError
    def append(self, log_key: str, entry: Any) -> int: raise NotImplementedError
    def read_log(self, log_key: str, start: int = 0, stop: int | None = None) -> list[str]: raise NotImplementedError
    def log_length(self, log_key: str) -> int: raise NotImplementedError
    def delete_log(self, log_key: str) -> bool: raise NotImplementedError
    def trim_log(self, log_key: str, keep: int) -> None: raise NotImplementedError  # keep the newest ``keep``
    def acquire_lock(self, name: str, owner: str, ttl_ms: int) -> bool: raise NotImplementedError
    def release_lock(self, name: str, owner: str) -> bool: raise NotImplementedError
    def refresh_lock(self, name: str, owner: str, ttl_ms: int) -> bool: raise NotImplementedError
    def lock_owner(self, name: str) -> str | None: raise NotImplementedError
    def incr(self, key: str, amount: int = 1) -> int: raise NotImplementedError
    def usage(self) -> dict: raise NotImplementedError
    def close(self) -> None: pass

    # --- shared on top of the primitives ---
    def get(self, key: str, type: Literal["text", "json"] = "text", default: Any = None) -> Any:
        """A key as text or parsed JSON; ``default`` when absent.

        Malformed JSON raises :class:`MalformedValue` naming the key; it never
        comes back half-parsed.
        """
        text = self.get_text(key)
        if text is None:
            return default
        return decode_json(key, text) if type == "json" else text

    def get_json(self, key: str, default: Any = None, on_error=None) -> Any:
        """Parsed JSON, or ``default`` when absent or malformed (``on_error(exc)`` is told why)."""
        try:
            return self.get(key, "json", default)
        except MalformedValue as exc:
            if on_error is not None:
                on_error(exc)
            return default

    def list_all(self, prefix: str = "", page: int = 1000, limit: int | None = None) -> list[KeyInfo]:
        """Every key under ``prefix``, sorted, following cursors; at most ``limit``."""
        seen: dict[str, KeyInfo] = {}
        cursor = None
        while True:
            res = self.list(prefix, limit=page, cursor=cursor)
            for k in res.keys:
                seen.setdefault(k.name, k)
            if res.complete or (limit is not None and len(seen) >= limit):
                break
            cursor = res.cursor
        keys = sorted(seen.values(), key=lambda k: k.name)
        return keys[:limit] if limit is not None else keys

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def encode(value: Any) -> str:
    """The stored text form of a value: strings as they are, the rest as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def decode_json(key: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        preview = text[:60].replace("\n", " ")
        raise MalformedValue(f"value of {key!r} is not valid JSON ({exc.msg} at char {exc.pos}): {preview!r}") from None



"""The agent's view of the store: the single chokepoint for every agent write.

Everything the agent changes (kv_operations from reflection, tool writes,
prompt and config updates) passes through :class:`AgentKV`:

* ``soul`` never changes, by put, delete or rename, in either direction;
* keys the runtime owns (session state, karma, the wake schedule, adapter
  snapshots, version history) are refused: the agent changes them only through
  fields the runtime validates and clamps;
* a key with control characters, surrounding spaces or empty ``:`` segments is refused;
* a key of another agent sharing the store is refused (the store view says
  whose it is, :meth:`Store.check_writable`), before anything is written;
* a ``kv_operations`` batch is validated whole before anything is written:
  one bad operation rejects the batch, and the reason is recorded;
* a privileged write (``config:*``, ``prompt:*``, ``tool:*``, ``provider:*``,
  ``wisdom``) records the previous value in karma, so it can be rolled back.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .. import events, keys
from ..errors import KVWriteRefused, SoulImmutable
from .base import Store, encode

MAX_KEY_LENGTH = 512
MAX_VALUE_BYTES = 512 * 1024
MAX_BATCH = 100
INTERNAL_MARKERS = ("__meta__:", "__lock__:")

Recorder = Callable[..., Any]  # Karma.record(event, **fields)


def check_key(key: Any) -> str:
    """Return ``key`` if it is a well-formed key name, else raise :class:`KVWriteRefused`."""
    if not isinstance(key, str) or not key:
        raise KVWriteRefused(f"key must be a non-empty string, got {key!r}")
    if len(key) > MAX_KEY_LENGTH:
        raise KVWriteRefused(f"key is {len(key)} characters long; the limit is {MAX_KEY_LENGTH}")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in key):
        raise KVWriteRefused(f"key {key!r} contains control or invisible characters")
    if key != key.strip():
        raise KVWriteRefused(f"key {key!r} starts or ends with whitespace")
    if "" in key.split(":"):
        raise KVWriteRefused(f"key {key!r} has an empty segment (leading, trailing or doubled ':')")
    if key.startswith(INTERNAL_MARKERS):
        raise KVWriteRefused(f"key {key!r} uses a name reserved for the store's internals")
    return key


def check_agent_writable(key: Any) -> str:
    key = check_key(key)
    if key == keys.SOUL:
        raise SoulImmutable("soul is immutable: only the operator can set it "
                            "(brainstem seed --soul, or kv put --force-soul)")
    if keys.is_runtime_owned(key):
        raise KVWriteRefused(f"{key!r} is owned by the runtime; "
                             "the agent changes it only through plan and reflection fields")
    return key


def check_value(key: str, text: str) -> None:
    """Values the runtime validates whatever writes them: ``config:reflexes`` is rules or nothing,
    so a bad rule is refused when written rather than half-applied at the next wake."""
    if key == keys.CONFIG_REFLEXES:
        from ..reflexes import ReflexError, parse_text

        try:
            parse_text(text)
        except ReflexError as exc:
            raise KVWriteRefused(str(exc)) from None


# --- kv_operations: the canonical batch format ---

class _Op(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PutOp(_Op):
    op: Literal["put"]
    key: str
    value: Any


class DeleteOp(_Op):
    op: Literal["delete"]
    key: str


class RenameOp(_Op):
    op: Literal["rename"]
    key: str
    value: str = Field(description="the new key name")


KVOperation = Annotated[PutOp | DeleteOp | RenameOp, Field(discriminator="op")]
_BATCH = TypeAdapter(list[KVOperation])


def parse_operations(raw: Any) -> list[PutOp | DeleteOp | RenameOp]:
    """Validate a kv_operations batch; raise :class:`KVWriteRefused` with every reason."""
    if not isinstance(raw, list):
        raise KVWriteRefused(f"kv_operations must be a list of operations, got {type(raw).__name__}")
    if len(raw) > MAX_BATCH:
        raise KVWriteRefused(f"kv_operations has {len(raw)} operations; the limit is {MAX_BATCH}")
    try:
        return _BATCH.validate_python(raw)
    except ValidationError as exc:
        reasons = "; ".join(f"operation {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])
        raise KVWriteRefused(f"invalid kv_operations ({reasons}); canonical forms are "
                             '{"op":"put","key":K,"value":V}, {"op":"delete","key":K}, '
                             '{"op":"rename","key":OLD,"value":NEW}') from None


class AgentKV:
    """The guarded store an agent session writes through.

    ``record`` is the session's karma recorder. ``on_privileged_write(key, old,
    new, source)`` is called before a privileged key changes (the version history
    hooks in here; ``source`` says which path wrote: reflect, deep_reflect, tool:NAME...).
    """

    def __init__(self, store: Store, record: Recorder | None = None,
                 on_privileged_write: Callable[[str, str | None, str | None, str], None] | None = None):
        self.store = store
        self._record = record or (lambda *a, **k: None)
        self._on_privileged = on_privileged_write

    # Reads are not restricted here: scope for tools is enforced by the tool context.
    def get(self, key: str, type: Literal["text", "json"] = "text", default: Any = None) -> Any:
        return self.store.get(key, type, default)

    def _writable(self, key: Any) -> str:
        return self.store.check_writable(check_agent_writable(key))

    def _movable(self, key: Any) -> str:
        key = self._writable(key)
        if keys.is_secret(key):
            # The agent may write secrets but never read them: a rename out of secret:* would put
            # the operator's value where the agent can read it.
            raise KVWriteRefused(f"cannot rename {key!r}: secret:* keys can be written or deleted, never moved")
        return key

    def put(self, key: str, value: Any, *, source: str = "agent") -> None:
        try:
            key = self._writable(key)
            text = encode(value)
            if len(text.encode()) > MAX_VALUE_BYTES:
                raise KVWriteRefused(f"value for {key!r} is {len(text.encode())} bytes; the limit is {MAX_VALUE_BYTES}")
            check_value(key, text)
        except KVWriteRefused as exc:
            self._refused("put", key, exc, source)
            raise
        self._write(key, text, source)

    def delete(self, key: str, *, source: str = "agent") -> bool:
        try:
            key = self._writable(key)
        except KVWriteRefused as exc:
            self._refused("delete", key, exc, source)
            raise
        return self._delete(key, source)

    def rename(self, old: str, new: str, *, source: str = "agent") -> None:
        try:
            old, new = self._movable(old), self._writable(new)
            value = self.store.get(old)
            if value is None:
                raise KVWriteRefused(f"cannot rename {old!r}: it does not exist")
            check_value(new, value)
        except KVWriteRefused as exc:
            self._refused("rename", f"{old} -> {new}", exc, source)
            raise
        self._write(new, value, source)
        self._delete(old, source)

    def apply_operations(self, raw: Any, *, source: str = "agent") -> list[dict]:
        """Validate the whole batch, then apply it. Nothing is written if anything is invalid."""
        try:
            ops = parse_operations(raw)
            # Simulate the batch against what exists, so a rename that would fail
            # half-way through is caught before the first write.
            exists: dict[str, bool] = {}
            pending: dict[str, str | None] = {}  # values this batch puts (or moves) before a later rename

            def present(k: str) -> bool:
                if k not in exists:
                    exists[k] = self.store.get(k) is not None
                return exists[k]

            for op in ops:
                self._writable(op.key)
                if isinstance(op, PutOp):
                    if len(encode(op.value).encode()) > MAX_VALUE_BYTES:
                        raise KVWriteRefused(f"value for {op.key!r} exceeds {MAX_VALUE_BYTES} bytes")
                    check_value(op.key, encode(op.value))
                    exists[op.key], pending[op.key] = True, encode(op.value)
                elif isinstance(op, DeleteOp):
                    exists[op.key] = False
                else:
                    self._movable(op.key)
                    self._writable(op.value)
                    if not present(op.key):
                        raise KVWriteRefused(f"cannot rename {op.key!r}: it does not exist")
                    moved = pending[op.key] if op.key in pending else self.store.get(op.key)
                    if op.value == keys.CONFIG_REFLEXES:
                        check_value(op.value, moved or "")
                    pending[op.value] = moved
                    exists[op.key], exists[op.value] = False, True
        except KVWriteRefused as exc:
            self._record(events.KV_OPERATIONS_REJECTED, source=source, reason=str(exc),
                         operations=raw if isinstance(raw, list) else repr(raw)[:500])
            raise
        done = []
        for op in ops:
            if isinstance(op, PutOp):
                self._write(op.key, encode(op.value), source)
            elif isinstance(op, DeleteOp):
                self._delete(op.key, source)
            else:
                self.rename(op.key, op.value, source=source)
            done.append(op.model_dump())
        return done

    # --- internals ---
    def _write(self, key: str, text: str, source: str) -> None:
        old = self.store.get(key) if keys.is_privileged(key) else None
        if keys.is_privileged(key) and self._on_privileged is not None:
            self._on_privileged(key, old, text, source)
        self.store.put(key, text)
        fields: dict[str, Any] = {"op": "put", "key": key, "source": source, "bytes": len(text)}
        if keys.is_privileged(key):
            fields["old_value"] = old
        self._record(events.KV_WRITE, **fields)

    def _delete(self, key: str, source: str) -> bool:
        old = self.store.get(key) if keys.is_privileged(key) else None
        if keys.is_privileged(key) and self._on_privileged is not None and old is not None:
            self._on_privileged(key, old, None, source)
        existed = self.store.delete(key)
        fields: dict[str, Any] = {"op": "delete", "key": key, "source": source, "existed": existed}
        if keys.is_privileged(key):
            fields["old_value"] = old
        self._record(events.KV_WRITE, **fields)
        return existed

    def _refused(self, op: str, key: Any, exc: Exception, source: str) -> None:
        self._record(events.KV_WRITE_REFUSED, op=op, key=str(key)[:200], source=source, reason=str(exc))


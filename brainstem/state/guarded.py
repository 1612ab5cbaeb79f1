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
* a ``config:*`` or ``prompt:*`` value passes the check ``brainstem kv put`` makes
  (:mod:`brainstem.state.checks`), without its ``--force``;
* a ``schedule:*`` write is a schedule of the agent's own within the operator's limits
  (:func:`brainstem.state.schedules.check_agent_write`), stored with its runtime fields filled in;
  the operator's schedules are never changed or removed;
* a ``kv_operations`` batch is validated whole before anything is written:
  one bad operation rejects the batch, and the reason is recorded;
* a privileged write (``config:*``, ``prompt:*``, ``tool:*``, ``provider:*``,
  ``wisdom``) records the previous value in karma, so it can be rolled back.
"""

from __future__ import annotations

import contextlib
import json
import unicodedata
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from brainstem.core import events, keys, names
from brainstem.core.clock import now_utc
from brainstem.core.errors import KVWriteRefused, SoulImmutable
from brainstem.state import schedules, secret_marks
from brainstem.state.checks import check_value as problem_with
from brainstem.state.config import Defaults
from brainstem.store.base import Store, encode

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
    owner = names.candidate(key)
    if owner is not None and key[len(owner) + 1:].split(":")[0] in keys.DEFAULT_AGENT_SEGMENTS:
        # `bob:soul` is bob's soul the day an agent named bob is added (or adopts the keys it finds).
        raise KVWriteRefused(f"{key!r} is shaped like a key of an agent named {owner!r}; an agent writes "
                             f"only its own keys")
    return key


def check_value(store: Store, key: str, text: str | None) -> None:
    """What the runtime checks of a value the agent writes, whatever path writes it (put, rename, copy,
    a batch; a plan, a reflection, a tool): :class:`KVWriteRefused` naming the field, else None.

    A ``config:*`` or ``prompt:*`` value must pass the very check ``brainstem kv put`` makes
    (:func:`brainstem.state.checks.check_value`: one function for both writers). One rule is the
    agent's alone: ``config:defaults`` may not lower ``deep_reflect.replay_gate_sessions`` below what
    is stored, by a put or by going away (``text`` None: its defaults apply then)."""
    if text is not None:
        problem = problem_with(key, text)
        if problem is not None:
            raise KVWriteRefused(problem)
    if key == keys.CONFIG_DEFAULTS:
        _gate_not_lowered(store, text)


def _gate_not_lowered(store: Store, text: str | None) -> None:
    try:
        current = Defaults.model_validate_json(store.get(keys.CONFIG_DEFAULTS) or "{}")
    except (ValidationError, ValueError):
        current = Defaults()
    new = Defaults() if text is None else Defaults.model_validate_json(text)  # checked above
    gate, staged = current.deep_reflect.replay_gate_sessions, new.deep_reflect.replay_gate_sessions
    if staged < gate:
        raise KVWriteRefused(f"deep_reflect.replay_gate_sessions may not be lowered by the agent "
                             f"({gate} -> {staged}); the operator can: brainstem kv put config:defaults")


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


class CopyOp(_Op):
    op: Literal["copy"]
    key: str
    value: str = Field(description="the key to copy to")


KVOperation = Annotated[PutOp | DeleteOp | RenameOp | CopyOp, Field(discriminator="op")]
_BATCH = TypeAdapter(list[KVOperation])


def parse_operations(raw: Any) -> list[PutOp | DeleteOp | RenameOp | CopyOp]:
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
                             '{"op":"rename","key":OLD,"value":NEW}, {"op":"copy","key":FROM,"value":TO}') from None


class _ScheduleWrites:
    """The agent's schedules as a batch leaves them so far (read on the batch's first ``schedule:*`` key):
    each write under ``schedule:`` is checked against them, so the batch as a whole keeps to the limits."""

    def __init__(self, store: Store, limits: schedules.Limits, now: datetime):
        self._store, self._limits, self._now = store, limits, now
        self._inventory: schedules.Inventory | None = None

    def _current(self) -> schedules.Inventory:
        if self._inventory is None:
            self._inventory = schedules.load_all(self._store)
        return self._inventory

    def check(self, key: str, text: str | None) -> str | None:
        """What is stored at ``key`` for the agent's ``text`` (None: the key goes away), or KVWriteRefused."""
        schedule_id = schedules.id_of(key) or ""
        try:
            if text is None:
                schedules.check_agent_delete(self._current(), schedule_id)
                self._inventory = self._current().replaced(schedule_id, None)
                return None
            try:
                raw = json.loads(text)
            except ValueError as exc:
                raise schedules.ScheduleError(f"{key}: not valid JSON ({exc})") from None
            schedule = schedules.check_agent_write(self._current(), schedule_id, raw, self._limits, self._now)
        except schedules.ScheduleError as exc:  # not a schedule: refused like any other bad write
            raise KVWriteRefused(str(exc)) from None
        self._inventory = self._current().replaced(schedule_id, schedule)
        return encode(schedules.dump(schedule))


class AgentKV:
    """The guarded store an agent session writes through.

    ``record`` is the session's karma recorder. ``on_privileged_write(key, old,
    new, source)`` is called before a privileged key changes (the version history
    hooks in here; ``source`` says which path wrote: reflect, deep_reflect, tool:NAME...).
    ``limits`` are the operator's on the agent's schedules (``Limits.from_settings``).
    """

    def __init__(self, store: Store, record: Recorder | None = None,
                 on_privileged_write: Callable[[str, str | None, str | None, str], object] | None = None,
                 limits: schedules.Limits | None = None, clock: Callable[[], datetime] = now_utc):
        self.store = store
        self._record = record or (lambda *a, **k: None)
        self._on_privileged = on_privileged_write
        self.limits = limits or schedules.Limits()
        self._clock = clock

    # Reads are not restricted here: scope for tools is enforced by the tool context.
    def get(self, key: str, type: Literal["text", "json"] = "text", default: Any = None) -> Any:
        return self.store.get(key, type, default)

    def _writable(self, key: Any) -> str:
        return self.store.check_writable(check_agent_writable(key))

    def _readable_source(self, key: Any) -> str:
        key = self._writable(key)
        if keys.is_secret(key):
            # The agent may write secrets but never read them: moving or copying one out of secret:* would
            # put the operator's value where the agent can read it.
            raise KVWriteRefused(f"cannot move or copy {key!r}: secret:* keys can be written or deleted, "
                                 f"never moved or read")
        return key

    def _check_write(self, key: Any, text: str | None, scheduled: _ScheduleWrites) -> tuple[str, str | None]:
        """The one check of every key an operation writes (``text`` None: the key goes away): the key, and
        the text to store (a schedule's with its runtime fields filled in)."""
        key = self._writable(key)
        if text is not None and len(text.encode()) > MAX_VALUE_BYTES:
            raise KVWriteRefused(f"value for {key!r} is {len(text.encode())} bytes; the limit is {MAX_VALUE_BYTES}")
        if key.startswith(keys.SCHEDULE_PREFIX):
            return key, scheduled.check(key, text)
        check_value(self.store, key, text)
        return key, text

    def plan(self, ops: list[PutOp | DeleteOp | RenameOp | CopyOp]) -> list[tuple[str, str, str | None]]:
        """What ``ops`` write, in order, each checked as a put (or delete) of that key would be:
        ``(op, key, value or None)``. :class:`KVWriteRefused` if any is refused."""
        pending: dict[str, str | None] = {}  # what the batch has written so far
        scheduled = _ScheduleWrites(self.store, self.limits, self._clock())

        def current(k: str) -> str | None:
            return pending[k] if k in pending else self.store.get(k)

        writes: list[tuple[str, str, str | None]] = []
        for op in ops:
            done = len(writes)
            if isinstance(op, PutOp):
                writes.append(("put", *self._check_write(op.key, encode(op.value), scheduled)))
            elif isinstance(op, DeleteOp):
                writes.append(("delete", *self._check_write(op.key, None, scheduled)))
            else:
                src = self._readable_source(op.key)
                value = current(src)
                if value is None:
                    raise KVWriteRefused(f"cannot {op.op} {src!r}: it does not exist")
                writes.append(("put", *self._check_write(op.value, value, scheduled)))
                if isinstance(op, RenameOp):
                    writes.append(("delete", *self._check_write(src, None, scheduled)))
            for _, key, text in writes[done:]:
                pending[key] = text
        return writes

    def staged(self, raw: Any) -> dict[str, str | None]:
        """The value each key a valid batch writes would end with (None: deleted); {} for an invalid one."""
        try:
            return {key: text for _, key, text in self.plan(parse_operations(raw))}
        except KVWriteRefused:
            return {}

    def put(self, key: str, value: Any, *, source: str = "agent") -> None:
        self._apply_one(PutOp(op="put", key=key, value=value) if isinstance(key, str) else None, "put", key,
                        source)

    def delete(self, key: str, *, source: str = "agent") -> bool:
        return self._apply_one(DeleteOp(op="delete", key=key) if isinstance(key, str) else None, "delete", key,
                               source)

    def rename(self, old: str, new: str, *, source: str = "agent") -> None:
        ok = isinstance(old, str) and isinstance(new, str)
        self._apply_one(RenameOp(op="rename", key=old, value=new) if ok else None, "rename", f"{old} -> {new}",
                        source)

    def _apply_one(self, op, name: str, shown: Any, source: str) -> bool:
        try:
            if op is None:
                raise KVWriteRefused(f"key must be a non-empty string, got {shown!r}")
            with self._claims([op]):
                return self._perform(self.plan([op]), source)
        except KVWriteRefused as exc:
            self._record(events.KV_WRITE_REFUSED, op=name, key=str(shown)[:200], source=source, reason=str(exc))
            raise

    def apply_operations(self, raw: Any, *, source: str = "agent") -> list[dict]:
        """Validate the whole batch, then apply it. Nothing is written if anything is invalid."""
        try:
            ops = parse_operations(raw)
            with self._claims(ops):
                writes = self.plan(ops)
                self._perform(writes, source)
        except KVWriteRefused as exc:
            self._record(events.KV_OPERATIONS_REJECTED, source=source, reason=str(exc),
                         operations=raw if isinstance(raw, list) else repr(raw)[:500])
            raise
        return [op.model_dump() for op in ops]

    def _claims(self, ops: list[PutOp | DeleteOp | RenameOp | CopyOp]) -> contextlib.AbstractContextManager:
        """The claims of the schedules ``ops`` touch, held while the batch is checked and written: a run deciding
        a schedule between the check and the write would otherwise have its next run put back (run twice) or a
        schedule the batch deleted brought back."""
        touched = [k for op in ops for k in (op.key, op.value if isinstance(op, (RenameOp, CopyOp)) else None)
                   if isinstance(k, str) and k.startswith(keys.SCHEDULE_PREFIX)]
        ids = [i for i in map(schedules.id_of, touched) if i and schedules.is_id(i)]  # the rest: refused by plan
        return schedules.claimed(self.store, ids, "agent-kv") if ids else contextlib.nullcontext()

    # --- internals ---
    def _perform(self, writes: list[tuple[str, str, str | None]], source: str) -> bool:
        existed = True
        for op, key, text in writes:
            if op == "put":
                self._write(key, text, source)
            else:
                existed = self._delete(key, source)
        return existed

    def _write(self, key: str, text: str, source: str) -> None:
        old = self.store.get(key) if keys.is_privileged(key) else None
        if keys.is_privileged(key) and self._on_privileged is not None:
            self._on_privileged(key, old, text, source)
        if keys.is_secret(key):
            secret_marks.note(self.store, key, text)  # before the value: never an unmarked value of the agent's
        self.store.put(key, text)
        fields: dict[str, Any] = {"op": "put", "key": key, "source": source, "bytes": len(text)}
        if keys.is_privileged(key):
            fields["old_value"] = old
        self._record(events.KV_WRITE, **fields)

    def _delete(self, key: str, source: str) -> bool:
        if keys.is_secret(key):
            secret_marks.note(self.store, key, None)
        old = self.store.get(key) if keys.is_privileged(key) else None
        if keys.is_privileged(key) and self._on_privileged is not None and old is not None:
            self._on_privileged(key, old, None, source)
        existed = self.store.delete(key)
        fields: dict[str, Any] = {"op": "delete", "key": key, "source": source, "existed": existed}
        if keys.is_privileged(key):
            fields["old_value"] = old
        self._record(events.KV_WRITE, **fields)
        return existed


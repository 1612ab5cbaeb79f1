"""The flight recorder.

Every event of a session is one JSON entry appended to ``karma:{session_id}``.
``record()`` returns only once the store has the entry (an SQLite commit with
``synchronous=FULL``, or a Redis RPUSH acknowledged by the server), so a crash
loses nothing that was recorded. An append is O(1): the log is never rewritten.

Secret values are redacted before an entry is written; the store never holds
them in karma. The session breadcrumbs that let the next wake notice a crash
live here too.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from brainstem.core import events, keys
from brainstem.core.clock import now_iso
from brainstem.core.errors import LeaseLost
from brainstem.core.secrets import replacer, secret_forms
from brainstem.store.base import Store
from brainstem.store.fenced import unfenced
from brainstem.store.lease import host_name, process_identity

MAX_FIELD_CHARS = 100_000  # one string field of one entry; keeps a runaway answer from bloating karma
MIN_SECRET_LEN = 4  # shorter "secrets" would redact ordinary words
# Where karma holds headers the runtime sent or received (an entry's own fields, then theirs).
HEADER_PATHS = frozenset({("headers",), ("request", "headers"), ("response", "headers")})
SENSITIVE_NAMES = frozenset({
    "authorization", "proxy-authorization", "api_key", "apikey", "x-api-key", "password", "passwd",
    "secret", "token", "access_token", "refresh_token", "cookie", "set-cookie", "private_key",
})


class Redactor:
    """Replaces every known secret value, wherever it appears in an entry.

    Values are matched as substrings (a key inside a URL or an error message
    is still caught), and so are their common encodings (URL and JSON
    escaping, base64 at any alignment, hex, reversed), so a value passed
    through one of them is caught too. In the headers the runtime records, fields
    with sensitive names are blanked whatever they hold.
    """

    def __init__(self, secrets: Mapping[str, str] | None = None):
        self._secrets: dict[str, str] = {}  # form -> name
        self._replace: Callable[[str], str] | None = None
        for name, value in (secrets or {}).items():
            self.add(name, value)

    def add(self, name: str, value: str | None) -> None:
        if isinstance(value, str) and len(value) >= MIN_SECRET_LEN:
            for form in secret_forms(value):
                if len(form) >= MIN_SECRET_LEN and form not in self._secrets:
                    self._secrets[form] = name
                    self._replace = None

    def __len__(self) -> int:
        return len(set(self._secrets.values()))

    def text(self, s: str) -> str:
        if not self._secrets:
            return s
        if self._replace is None:
            self._replace = replacer({form: f"[REDACTED:{name}]" for form, name in self._secrets.items()})
        return self._replace(s)

    def __call__(self, obj: Any, _path: tuple[str, ...] = ()) -> Any:
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, Mapping):
            # Fields are blanked by name only in the headers of a request or answer the runtime records: a
            # name the agent chose (a plan's input, a tool's result) never hides what its value says.
            by_name = _path in HEADER_PATHS
            out = {}
            for k, v in obj.items():
                name = str(k)
                if by_name and name.lower() in SENSITIVE_NAMES and isinstance(v, str) and v:
                    out[self.text(name)] = "[REDACTED]"
                else:
                    out[self.text(name)] = self(v, (*_path, name)[:3])
            return out
        if isinstance(obj, (list, tuple)):
            return [self(v, _path) for v in obj]
        if isinstance(obj, (int, float)) and not isinstance(obj, bool) and self._secrets:
            # A secret of digits comes back as a JSON number as readily as as text.
            shown = str(obj)
            hidden = self.text(shown)
            return obj if hidden == shown else hidden
        return obj


def _cap(obj: Any) -> Any:
    if isinstance(obj, str) and len(obj) > MAX_FIELD_CHARS:
        return obj[:MAX_FIELD_CHARS] + f"... [truncated {len(obj) - MAX_FIELD_CHARS} chars]"
    if isinstance(obj, dict):
        return {k: _cap(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_cap(v) for v in obj]
    return obj


def encode_entry(entry: dict) -> str:
    return json.dumps(entry, ensure_ascii=False, default=str, separators=(",", ":"))


class Karma:
    """The recorder of one session (or of one operator action such as ``tool run``)."""

    def __init__(self, store: Store, session_id: str, redactor: Redactor | None = None,
                 listeners: Iterable[Callable[[dict], None]] = ()):
        self.store = store
        self.session_id = session_id
        self.key = keys.karma(session_id)
        self.redact = redactor or Redactor()
        self.listeners = list(listeners)
        self._t0 = time.monotonic()

    @property
    def elapsed_ms(self) -> int:
        return int((time.monotonic() - self._t0) * 1000)

    def as_recorded(self, value: Any) -> Any:
        """``value`` as an entry holding it would be written: long text capped, secrets redacted."""
        return self.redact(_cap(value))

    def record(self, event: str, **fields: Any) -> dict:
        """Append one entry; durable when this returns. Returns the entry as written."""
        return self._record(self.store, event, fields)

    def record_unfenced(self, event: str, **fields: Any) -> dict:
        """Append one entry through the plain store under the session's fenced one (see
        :func:`~brainstem.store.fenced.unfenced`): ``lease_lost`` and ``spend_settled``, the only entries a
        session that lost its lease still writes."""
        return self._record(unfenced(self.store), event, fields)

    def _record(self, store: Store, event: str, fields: dict[str, Any]) -> dict:
        entry = {"t": now_iso(ms=True), "elapsed_ms": self.elapsed_ms, "event": event}
        entry.update(fields)
        entry = self.redact(_cap(entry))
        try:
            store.append(self.key, encode_entry(entry))
        except LeaseLost:
            if event == events.LLM_CALL and entry.get("cost"):
                self._settled_without_lease(entry)
            raise
        for listener in self.listeners:
            try:
                listener(entry)
            except Exception:  # a broken progress display must never stop the recorder
                pass
        return entry

    def _settled_without_lease(self, call: dict) -> None:
        """A call answered after the session lost its lease: its cost is in today's spend already (money
        spent is settled unfenced), so it is recorded too, unfenced, as ``spend_settled``: the one entry
        besides ``lease_lost`` a session without its lease still writes."""
        self.record_unfenced(events.SPEND_SETTLED, **{k: call[k] for k in SETTLED_FIELDS if call.get(k) is not None},
                             reason="answered after this session's wake lease was lost")


# What a spend_settled entry keeps of the llm_call it stands for.
SETTLED_FIELDS = ("purpose", "step_id", "model", "tier", "input_tokens", "output_tokens", "cost", "cost_source",
                  "simulated", "wire_requests", "duration_ms")


def parse_entry(raw: str) -> dict:
    try:
        entry = json.loads(raw)
    except ValueError:
        return {"event": "unreadable", "raw": raw[:200]}
    return entry if isinstance(entry, dict) else {"event": "unreadable", "raw": raw[:200]}


def read(store: Store, session_id: str, start: int = 0, stop: int | None = None) -> list[dict]:
    """The entries of a session, in the order they were recorded."""
    return [parse_entry(r) for r in store.read_log(keys.karma(session_id), start, stop)]


def follow(store: Store, session_id: str, poll_seconds: float = 0.5,
           until: Callable[[], bool] | None = None) -> Iterator[dict]:
    """Yield entries as they are recorded; stops after ``session_end``, or when ``until()`` is true
    (asked only when nothing new came; what was recorded before it said so is still yielded)."""
    seen, last_look = 0, False
    while True:
        new = read(store, session_id, seen)
        for entry in new:
            yield entry
            if entry.get("event") in (events.SESSION_END,):
                return
        seen += len(new)
        if last_look:
            return
        if not new:
            if until is not None and until():
                last_look = True  # anything recorded before until() looked is read once more
                continue
            time.sleep(poll_seconds)


# --- session breadcrumbs: how the next wake knows the last one died ---

def begin_session(store: Store, session_id: str, **info: Any) -> dict:
    """Mark a session as in progress. Present at the next wake means it died."""
    breadcrumb = {"id": session_id, "started_at": now_iso(ms=True), "pid": os.getpid(), "host": host_name(),
             "proc": process_identity(os.getpid()), **info}
    store.put(keys.SESSION_CURRENT, breadcrumb)
    store.put(keys.SESSION_LAST_STARTED, session_id)
    return breadcrumb


def end_session(store: Store, session_id: str) -> None:
    """Mark a session as having ended (whatever its outcome): it did not crash."""
    store.put(keys.SESSION_LAST_COMPLETED, session_id)
    store.delete(keys.SESSION_CURRENT)


def read_breadcrumb(store: Store) -> dict | None:
    """The breadcrumb of a session that started and never ended, if any.

    A breadcrumb that is not valid JSON still means a session died; its id is
    then unknown.
    """
    raw = store.get(keys.SESSION_CURRENT)
    if raw is None:
        return None
    try:
        breadcrumb = json.loads(raw)
    except ValueError:
        breadcrumb = None
    if not isinstance(breadcrumb, dict) or not isinstance(breadcrumb.get("id"), str):
        return {"id": None, "raw": raw[:200]}
    return breadcrumb


def latest_session_id(store: Store) -> str | None:
    """The most recently *started* session, including one still running."""
    return store.get(keys.SESSION_LAST_STARTED)

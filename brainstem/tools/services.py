"""Running one KV tool: its grants enforced, its ``ctx`` served, its code in the sandbox.

Scope is enforced here, on the runtime side of the sandbox channel, where
tool code cannot reach: ``ctx.kv`` under ``own`` reads and writes only
``tooldata:{name}:``; under ``read_all`` it reads anything but ``secret:*``
and still writes only under its own prefix; every write goes through the
agent's guarded view and counts against the write quotas. ``ctx.secrets``
holds placeholders for what the meta asks for *and* the operator bound
(``BRAINSTEM_TOOL_SECRETS``); the values stay here and go on the wire only
to their bound hosts (see :mod:`brainstem.core.secrets`). An omission is noted in
karma and the tool still runs. Every ``ctx.fetch`` is a ``fetch`` entry. The Telegram
bot token is never granted: ``ctx.send_telegram`` asks this process to send (see
:mod:`brainstem.tools.operator_chat`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from brainstem.core import events, keys
from brainstem.core.mcp_config import is_mcp
from brainstem.core.scrubber import put_back
from brainstem.core.secrets import grant
from brainstem.sandbox import Limits, StopExecution, run
from brainstem.sandbox.egress import FetchError
from brainstem.sandbox.fetch import fetch
from brainstem.state import approval, refusals, secret_marks
from brainstem.state.guarded import AgentKV
from brainstem.store.base import Store
from brainstem.tools import mcp_tools
from brainstem.tools.fetch_guard import FetchGuard
from brainstem.tools.operator_chat import send
from brainstem.tools.policy import QuotaExceeded, ToolPolicy
from brainstem.tools.tool import MAX_TIMEOUT_MS, ToolError, ToolMeta, load_tool

# Each fetch's answer is kept in karma, so a replay can answer the same fetch without the world;
# bounded, so a session of large pages does not bloat the flight recorder.
FETCH_RECORD_CHARS = 16_000
FETCH_RECORD_HEADERS = 40
FETCH_RECORD_MIN_BYTES = 200  # what a karma entry costs at the least, counted against the write quotas


@dataclass
class ToolOutcome:
    ok: bool
    value: Any = None
    error: str | None = None
    duration_ms: float = 0.0
    retryable: bool = True  # False when trying again cannot help (no such tool, invalid meta)
    not_run: str | None = None  # why the tool was held back ("dry_run", "manual"); value is then a stand-in


class ToolServices:
    """The runtime side of ``ctx`` for one execution of code from the store."""

    def __init__(self, name: str, meta: ToolMeta, store: Store, agent_kv: AgentKV, record: Callable[..., Any],
                 policy: ToolPolicy, env: Mapping[str, str] | None = None,
                 on_read: Callable[[list[str]], None] | None = None,
                 on_seen: Callable[[str, str | None], Any] | None = None):
        self.name = name
        self.kv_access = meta.kv_access
        self._store = store
        self._kv = agent_kv
        self._record = record
        self._prefix = keys.tooldata_prefix(name)
        self._policy = policy
        self._on_read = on_read
        self._on_seen = on_seen  # told each key the code read and what it held (a session records it for replay)
        self._written = 0
        if policy.withdrawn or refusals.held(store):
            # Code met a secret's value: no code of this agent runs again until the operator has looked, so
            # whether it was stopped confirms one guess, once (`brainstem refusals`).
            raise ToolError(refusals.HELD_MESSAGE)
        self.grants = grant(tool=name, asked_env=meta.secrets, asked_kv=meta.kv_secrets, bindings=policy.bindings,
                            read_store_secret=lambda n: store.get(keys.secret(n)), record=record,
                            env=env if env is not None else policy.secret_values,
                            public=policy.public, withheld=policy.withheld)
        if policy.on_secrets is not None:
            # What the caller redacts from then on: a store secret the agent wrote hides nothing from the operator.
            policy.on_secrets(secret_marks.operator_values(store, self.grants.values()))
        self.secrets = self.grants.visible()  # placeholders: no secret value ever enters the sandbox
        self.scrubber = policy.scrubber(store, self.grants.values())

    # --- the one way in and out of the sandbox (see brainstem.sandbox.ctx.Services) ---
    def scrub(self, value: Any, sent: Mapping[str, str] | None = None) -> Any:
        """``value`` as the code may see it, or a stop. ``sent`` maps the exact text the runtime put into
        the request being answered to the placeholder it stood for: a server echoing that text verbatim
        hands the code its placeholder back. Any other secret text (a piece, another encoding or letter
        case, a value the request never carried) is not masked, since which parts were masked would tell
        the code which of its guesses was right: the code is stopped, whatever the request carried."""
        value = put_back(value, sent or {})
        held = self.scrubber.holds(value)
        if held:
            self.refuse_value(held, direction="in")
        return value

    def inspect(self, value: Any) -> None:
        if self._policy.withdrawn:
            # Another run of this session was stopped: code already running ends at its next ctx call, so
            # it cannot watch for the stop (and what it confirmed) and act on it before the operator looks.
            raise StopExecution(f"stopped: {refusals.HELD_MESSAGE}")
        held = self.scrubber.holds(value)
        if held:
            self.refuse_value(held, direction="out")

    def refuse_value(self, labels: list[str], **where: Any) -> None:
        """Code sent (or was about to be handed) secret text it cannot account for: record it, hold all
        of the agent's code until the operator has looked, and stop it at once, with no answer."""
        self._record(events.SECRET_REFUSED, tool=self.name, secrets=labels, **where,
                     reason="secret text the code can only have through a leak or a guess; stopped, and the "
                            "agent's code is held until the operator clears it (brainstem refusals --clear)")
        self._policy.withdrawn.setdefault("tool", self.name)
        refusals.note(self._store, self.name)
        where_found = "in what it sent" if where.get("direction") == "out" else "in what it was to be handed"
        raise StopExecution(f"stopped: secret text {where_found} (secret_refused); {refusals.HELD_MESSAGE}")

    # --- ctx.kv ---
    def _read_key(self, key: str) -> str:
        if not isinstance(key, str) or not key:
            raise ValueError("key must be a non-empty string")
        if self.kv_access == "own":
            return self._prefix + key
        if self.kv_access == "read_all":
            if keys.is_secret(key):
                raise PermissionError("secret:* keys are not readable by tools")
            return key
        raise PermissionError("this tool has no KV access")

    def _write_key(self, key: str) -> str:
        if self.kv_access not in ("own", "read_all"):
            raise PermissionError("this tool has no KV access")
        if not isinstance(key, str) or not key:
            raise ValueError("key must be a non-empty string")
        # Under read_all (reads take full keys) a full key naming our own prefix is accepted as such;
        # under own every key is relative, exactly as kv_get and kv_list treat it, so a write reads back.
        if self.kv_access == "read_all" and key.startswith(self._prefix):
            return key
        return self._prefix + key

    def kv_get(self, key: str) -> str | None:
        full = self._read_key(key)
        if self._on_read is not None:
            self._on_read([full])
        value = self._store.get(full)
        if self._on_seen is not None:
            self._on_seen(full, value)
        return value

    def kv_put(self, key: str, value: str) -> None:
        full = self._write_key(key)
        size = len(full.encode("utf-8")) + len(str(value).encode("utf-8"))
        self._charge_quota(full, size)
        self._kv.put(full, value, source=f"tool:{self.name}")

    def _charge_record(self, what: str, size: int) -> None:
        """What the runtime records for the code (fetch answers, log lines) counts against the write
        quotas too, so karma stops growing at them: past them the code ends, ``quota_exceeded``."""
        try:
            self._charge_quota(f"karma ({what})", size)
        except QuotaExceeded as exc:
            raise StopExecution(f"stopped: quota_exceeded: {exc}") from None

    def charge_result(self, value: Any) -> None:
        """Count the code's result, which karma records, against the quotas (:class:`QuotaExceeded`)."""
        self._charge_quota("karma (result)", len(json.dumps(value, ensure_ascii=False, default=str).encode("utf-8")))

    def _charge_quota(self, key: str, size: int) -> None:
        self._written = self._policy.charge(self._record, self.name, self._written, key, size)

    def kv_delete(self, key: str) -> bool:
        return self._kv.delete(self._write_key(key), source=f"tool:{self.name}")

    def kv_list(self, prefix: str = "") -> list[str]:
        if self.kv_access == "own":
            return [k.name[len(self._prefix):] for k in self._store.list_all(self._prefix + (prefix or ""), limit=1000)]
        if self.kv_access == "read_all":
            return [k.name for k in self._store.list_all(prefix or "", limit=1000)
                    if not keys.is_secret(k.name) and not k.is_log]
        raise PermissionError("this tool has no KV access")

    # --- ctx.fetch / ctx.log ---
    def fetch(self, url, method="GET", headers=None, json=None, data=None, timeout=None) -> dict:
        trace: list = []
        t0 = time.monotonic()
        self._charge_record("fetch", FETCH_RECORD_MIN_BYTES)  # no request goes out once the quota is spent
        if self._policy.fetch_replay is not None:
            return self._replayed_fetch(url, method, t0)
        try:
            result = fetch(url, method=method, headers=headers, json=json, data=data, timeout=timeout,
                           allow=self._policy.fetch_allow, guard=FetchGuard(self), trace=trace)
        except FetchError as exc:
            self._record_fetch(url, method, trace, t0, error=str(exc))
            raise
        self._record_fetch(url, method, trace, t0, result=result)
        return result

    def _replayed_fetch(self, url: Any, method: Any, t0: float) -> dict:
        """A replay's fetch: the answer the original session received, never the world's."""
        fields = {"tool": self.name, "method": str(method).upper()[:10], **_url_fields(url), "replayed": True}
        try:
            result = self._policy.fetch_replay.answer(self.name, fields["method"], str(url))
        except FetchError as exc:
            self._record(events.FETCH, **fields, error=str(exc), duration_ms=int((time.monotonic() - t0) * 1000))
            raise
        self._record(events.FETCH, **fields, status=result.get("status"), bytes=len(result.get("text") or ""),
                     duration_ms=int((time.monotonic() - t0) * 1000), response=recorded_response(result))
        return result

    def _record_fetch(self, url: Any, method: Any, trace: list, t0: float, error: str | None = None,
                      result: dict | None = None) -> None:
        fields: dict[str, Any] = {"tool": self.name, "method": str(method).upper()[:10]}
        if trace:
            last = trace[-1]
            fields.update(scheme=last.scheme, host=last.host, port=last.port, path=last.path,
                          status=last.note.get("status"))
            if len(trace) > 1:
                fields["redirects"] = [f"{h.scheme}://{h.host}:{h.port}{h.path}" for h in trace[:-1]]
            names = sorted({n for h in trace for n in h.note.get("secrets", ())})
            fields["secrets"] = names or None
            fields["bytes"] = last.note.get("bytes", 0)
            cost = sum(h.note.get("cost", 0.0) for h in trace)
            if any("cost" in h.note for h in trace):
                fields["cost"] = round(cost, 10)
        else:
            fields.update(_url_fields(url))
        fields["duration_ms"] = int((time.monotonic() - t0) * 1000)
        if error is not None:
            fields["error"] = error
        if result is not None:
            fields["response"] = recorded_response(result)
            size = len(json.dumps(fields["response"], ensure_ascii=False, default=str))
            try:
                self._charge_record("fetch", size)
            except StopExecution:
                fields["response"] = None  # the record that would pass the quota is kept short
                fields["quota_exceeded"] = True
                self._record(events.FETCH, **fields)
                raise
        self._record(events.FETCH, **fields)

    # --- ctx.send_telegram: the act, not the token ---
    def send_telegram(self, text: str, timeout: float) -> dict:
        return send(self._policy, text, timeout, tool=self.name, record=self._record, charge=self._charge_record)

    def log(self, message: str) -> None:
        message = str(message)[:2000]
        self._charge_record("log", len(message.encode("utf-8")) + FETCH_RECORD_MIN_BYTES)
        self._record(events.TOOL_LOG, tool=self.name, message=message)


def recorded_response(result: dict) -> dict:
    """What karma keeps of a fetch's answer (scrubbed of secrets already): status, headers, text, capped."""
    text = result.get("text") or ""
    headers = dict(list((result.get("headers") or {}).items())[:FETCH_RECORD_HEADERS])
    out = {"status": result.get("status"), "headers": headers, "text": text[:FETCH_RECORD_CHARS],
           "truncated": bool(result.get("truncated"))}
    if len(text) > FETCH_RECORD_CHARS:
        out["text_cut_at"] = FETCH_RECORD_CHARS  # a replay serves the cut text, and says so
    return out


def _url_fields(url: Any) -> dict[str, Any]:
    """Where a refused URL pointed, for karma: never its query string."""
    try:
        parts = urlsplit(str(url)[:2048])
        return {"scheme": parts.scheme or None, "host": parts.hostname, "port": parts.port, "path": parts.path or "/"}
    except ValueError:
        return {"host": None}


def run_tool(name: str, args: Any, *, store: Store, agent_kv: AgentKV, record: Callable[..., Any],
             policy: ToolPolicy, attempt: int = 1, step_id: str | None = None, max_timeout_ms: int | None = None,
             on_read: Callable[[list[str]], None] | None = None, dry_run: bool = False, enforce_mode: bool = False,
             on_supervised: Callable[[ToolOutcome], None] | None = None,
             review_room: Callable[[], str | None] | None = None,
             floors: Mapping[str, str] | None = None,
             on_seen: Callable[[str, str | None], Any] | None = None) -> ToolOutcome:
    """Run tool ``name`` once with ``args``; records ``tool_start`` and ``tool_complete``.

    With ``enforce_mode`` (a session's calls) the meta's mode is obeyed: ``manual`` never runs (a
    ``tool_would_do`` entry instead), ``supervised`` runs and ``on_supervised`` is told of the run,
    unless ``review_room()`` says why there is no room to review it (then ``review_dropped``, not run).
    ``floors`` (the operator's ``BRAINSTEM_TOOL_MODES``) give the least supervision it gets, whatever its
    meta says, decided on the very bytes that run (see :mod:`brainstem.state.approval`). ``dry_run``
    runs nothing at all. An operator's own ``brainstem tool run`` runs whatever the mode.
    """
    t0 = time.monotonic()
    refused = _refused_input(name, args, store, record, policy, step_id)
    if refused is not None:
        return refused
    if is_mcp(name):
        # The operator's MCP server runs it, not the sandbox: no meta, so its mode is the operator's floor for
        # its name (else *); approval is of the agent's code, so ``new`` does not apply.
        floor = (floors or {}).get(name, (floors or {}).get("*")) if enforce_mode else None
        mode, tagged = approval.strictest("automated", floor), {"source": "mcp"}
        code = meta = None
    else:
        try:
            code, meta = load_tool(store, name)
        except ToolError as exc:
            record(events.TOOL_START, tool=name, step_id=step_id, attempt=attempt, input=args)
            outcome = ToolOutcome(ok=False, error=str(exc), duration_ms=(time.monotonic() - t0) * 1000,
                                  retryable=False)
            _record_complete(record, name, step_id, attempt, outcome)
            return outcome
        floor = approval.floor(store, name, code, floors) if enforce_mode else None
        mode, tagged = approval.strictest(meta.mode, floor), {}
    floored = floor is not None and mode == floor and (meta is None or mode != meta.mode)
    not_run = "dry_run" if dry_run else ("manual" if enforce_mode and mode == "manual" else None)
    if not_run is not None:
        record(events.TOOL_WOULD_DO, tool=name, step_id=step_id, attempt=attempt, input=args, reason=not_run,
               mode_floor=floor if floored and not_run == "manual" else None, **tagged)
        return ToolOutcome(ok=True, value={"not_run": not_run, "tool": name, "input": args}, retryable=False,
                           not_run=not_run)
    why = review_room() if enforce_mode and mode == "supervised" and review_room is not None else None
    if why is not None:
        record(events.REVIEW_DROPPED, tool=name, step_id=step_id, attempt=attempt, input=args, reason=why, **tagged)
        return ToolOutcome(ok=False, error=f"not run: {why}", retryable=False, not_run="review_dropped")
    record(events.TOOL_START, tool=name, step_id=step_id, attempt=attempt, input=args, **tagged)
    if meta is None:
        outcome = _run_mcp(name, args, store, record, policy, t0, max_timeout_ms)
    else:
        outcome = _run_sandboxed(name, args, code or "", meta, store, agent_kv, record, policy, t0, max_timeout_ms,
                                 on_read, on_seen)
    _record_complete(record, name, step_id, attempt, outcome, **tagged)
    if enforce_mode and mode == "supervised" and on_supervised is not None:
        on_supervised(outcome)
    return outcome


def _run_sandboxed(name: str, args: Any, code: str, meta: ToolMeta, store: Store, agent_kv: AgentKV,
                   record: Callable[..., Any], policy: ToolPolicy, t0: float, max_timeout_ms: int | None,
                   on_read: Callable[[list[str]], None] | None,
                   on_seen: Callable[[str, str | None], Any] | None) -> ToolOutcome:
    """The agent's tool ``name``, run in the sandbox with its grants."""
    try:
        services = ToolServices(name, meta, store, agent_kv, record, policy, on_read=on_read, on_seen=on_seen)
        timeout_ms = meta.timeout_ms if max_timeout_ms is None else max(50, min(meta.timeout_ms, max_timeout_ms))
        out = run(code, "execute", [args], services=services, limits=Limits(timeout_ms=timeout_ms))
        outcome = ToolOutcome(ok=out.ok, value=out.value, error=out.error, duration_ms=out.duration_ms)
        if outcome.ok and outcome.value is not None:
            try:  # a result is recorded in karma: it counts against the write quotas like a write
                services.charge_result(outcome.value)
            except QuotaExceeded as exc:
                outcome = ToolOutcome(ok=False, error=f"quota_exceeded: {exc}", duration_ms=out.duration_ms,
                                      retryable=False)
    except ToolError as exc:
        outcome = ToolOutcome(ok=False, error=str(exc), duration_ms=(time.monotonic() - t0) * 1000,
                              retryable=False)
    return outcome


def _run_mcp(name: str, args: Any, store: Store, record: Callable[..., Any], policy: ToolPolicy, t0: float,
             max_timeout_ms: int | None) -> ToolOutcome:
    """The MCP tool ``name``, called on the operator's server, for no longer than the time it is given (and
    its server's ``timeout``). What it answers is recorded in karma, so it counts against the write quotas
    as a tool's result does."""
    if policy.withdrawn or refusals.held(store):  # as for the agent's code: held until the operator has looked
        return ToolOutcome(ok=False, error=refusals.HELD_MESSAGE, retryable=False)
    timeout = float(MAX_TIMEOUT_MS) / 1000 if max_timeout_ms is None else max(0.05, max_timeout_ms / 1000)
    out = mcp_tools.call(policy, record, name, args, timeout)
    # A server that failed may well answer a second time, but it was asked once already: retrying an act
    # with effects is the plan's choice (its retries), not the runtime's.
    outcome = ToolOutcome(ok=out.ok, value=out.value, error=out.error, duration_ms=(time.monotonic() - t0) * 1000,
                          retryable=out.retryable)
    answered = out.value if out.ok else out.error
    if answered is not None:
        try:
            policy.charge(record, name, 0, "karma (result)",
                          len(json.dumps(answered, ensure_ascii=False, default=str).encode("utf-8")))
        except QuotaExceeded as exc:
            outcome = ToolOutcome(ok=False, error=f"quota_exceeded: {exc}", duration_ms=outcome.duration_ms,
                                  retryable=False)
    return outcome


def _refused_input(name: str, args: Any, store: Store, record: Callable[..., Any], policy: ToolPolicy,
                   step_id: str | None) -> ToolOutcome | None:
    """A stop, before anything records the input, when it holds secret text: the runtime put it together
    from the agent's pieces (a plan's ``{{p0}}{{p1}}``), and karma's redaction of it, even for a tool that
    never runs (missing, manual, a dry run), would mark where a guess matched."""
    if not refuse_assembled(args, store, record, policy, tool=name, step_id=step_id, source="input",
                            what="a tool's input", done="not run"):
        return None
    return ToolOutcome(ok=False, error=f"stopped: secret text in what it was to be handed (secret_refused); "
                                       f"{refusals.HELD_MESSAGE}", retryable=False)


def refuse_assembled(value: Any, store: Store, record: Callable[..., Any], policy: ToolPolicy, *, tool: str,
                     step_id: str | None, source: str, what: str, done: str) -> bool:
    """Whether ``value`` (text the runtime put together from the agent's pieces: ``what``) holds secret text;
    when it does, a ``secret_refused`` stop is recorded (naming the secrets, never the text), the session's
    grants are withdrawn and the agent's code is held. The caller uses, records and sends none of it."""
    held = policy.scrubber(store).holds(value)
    if not held:
        return False
    record(events.SECRET_REFUSED, tool=tool, step_id=step_id, secrets=held, direction="in", source=source,
           reason=f"secret text in {what}, which can only come from a leak or a guess; {done}, and the "
                  "agent's code is held until the operator clears it (brainstem refusals --clear)")
    policy.withdrawn.setdefault("tool", tool)
    refusals.note(store, tool)
    return True


def _record_complete(record: Callable[..., Any], name: str, step_id: str | None, attempt: int,
                     outcome: ToolOutcome, **tagged: Any) -> None:
    record(events.TOOL_COMPLETE, tool=name, step_id=step_id, attempt=attempt, ok=outcome.ok,
           duration_ms=round(outcome.duration_ms, 1), result=outcome.value if outcome.ok else None,
           error=outcome.error, **tagged)

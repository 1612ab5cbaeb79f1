"""Telegram: the operator talks with the agent from their phone.

While ``brainstem run`` runs with ``BRAINSTEM_TELEGRAM_BOT_TOKEN`` and
``BRAINSTEM_TELEGRAM_CHAT_ID`` set, a background thread long-polls the Bot
API's ``getUpdates``. A text from the operator's chat enters the inbox
(:func:`brainstem.state.inbox.post`, from ``telegram``; a leading ``!`` makes it
urgent and is removed). A text from any other chat is counted and dropped: it
never reaches the store's inbox, so never a prompt. Every other update (a photo,
an edit, a sticker) is acknowledged and skipped.

Nothing is lost or repeated across a crash or a restart. The update offset is
kept in the store (``stats:telegram``) and moves past an update only after the
update was handled; a text is posted with its ``telegram_update_id``, and an
update whose id the inbox already holds is not posted again, so a crash between
posting and saving the offset repeats nothing. Updates not yet acknowledged wait
on Telegram's side (up to 24 hours).

Telegram's failures (5xx, 429 with ``retry_after``, a network error, a body that
is not the Bot API's) are recorded in ``stats:telegram`` (``last_error``) and
waited out with a growing pause: the poller never stops the daemon. The token
is in every request's URL, so nothing that could quote a URL or a server's words
leaves here unredacted: errors are fixed text by kind, and a server's own
``description`` passes the redactor first. Only one process polls an agent's bot
at a time (a store lease), so several daemons on one agent do not take each
other's updates.
"""

from __future__ import annotations

import json
import logging
import os
import secrets as _random
import threading
import time
from typing import Any

import httpx

from brainstem.core import keys
from brainstem.core.clock import now_iso
from brainstem.core.errors import BrainstemError, StoreUnavailable
from brainstem.state import inbox
from brainstem.store import open_store
from brainstem.store.base import Store
from brainstem.store.lease import holder_is_dead, host_name
from brainstem.tools.bot_api import (
    MAX_ERROR_CHARS,
    POLL_TIMEOUT,
    ClientConfig,
    PollError,
    Wire,
    get_updates,
    make_client,
)

log = logging.getLogger("brainstem.telegram")

BACKOFF_FIRST, BACKOFF_MAX = 1.0, 60.0
# The least time from one getUpdates to the next when the answer came back empty before its long poll was
# up: a Bot API (or a proxy) that answers at once instead of holding the poll is asked about once a second,
# not as fast as the loop turns. Updates end the wait: a full answer is followed by the next poll at once.
POLL_FLOOR = 1.0
LEASE_MARGIN = 60.0  # the poll lease outlives one long poll by this much
HEARTBEAT_SECONDS = 60.0  # how often a quiet poller notes in the store that it is polling
URGENT_MARK = "!"


# --------------------------------------------------------------------------- state in the store


def state(store: Store) -> dict[str, Any]:
    """``stats:telegram`` as a dict (empty when absent or not the runtime's JSON)."""
    try:
        value = store.get_json(keys.TELEGRAM_STATE, default=None)
    except BrainstemError as exc:
        if isinstance(exc, StoreUnavailable):
            raise
        value = None
    return value if isinstance(value, dict) else {}


def _number(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _save(store: Store, st: dict[str, Any]) -> None:
    store.put(keys.TELEGRAM_STATE, json.dumps(st, sort_keys=True))


def record_error(store: Store, message: str) -> None:
    """Note a failed poll in ``stats:telegram`` (``last_error``, ``last_error_at``, ``failing``)."""
    st = state(store)
    st.update(last_error=message[:MAX_ERROR_CHARS], last_error_at=now_iso(), failing=_number(st.get("failing")) + 1)
    _save(store, st)


def status(store: Store, settings: Any) -> dict[str, Any]:
    """What ``brainstem status`` shows of Telegram: whether ``brainstem run`` polls, what came from other
    chats, the last poll error. Never the token."""
    try:
        st = state(store)
    except StoreUnavailable:
        st = {}
    return {"polling": settings.telegram_polling, "why_not": status_reason(settings),
            "chat_id": settings.telegram_chat_id, "api_host": settings.telegram_host,
            "offset": st.get("offset") if isinstance(st.get("offset"), int) else None,
            "received": _number(st.get("received")), "other_chats": _number(st.get("other_chats")),
            "other_chats_last_at": st.get("other_chats_last_at"), "skipped": _number(st.get("skipped")),
            "last_poll_at": st.get("last_poll_at"), "failing": _number(st.get("failing")),
            "last_error": st.get("last_error") if isinstance(st.get("last_error"), str) else None,
            "last_error_at": st.get("last_error_at")}


def status_reason(settings: Any) -> str | None:
    """Why ``brainstem run`` does not poll Telegram (None: it does)."""
    if settings.telegram_polling:
        return None
    if settings.telegram_bot_token is not None:
        return "BRAINSTEM_TELEGRAM_CHAT_ID is not set"
    if settings.telegram_chat_id is not None:
        return "BRAINSTEM_TELEGRAM_BOT_TOKEN is not set"
    return "BRAINSTEM_TELEGRAM_BOT_TOKEN and BRAINSTEM_TELEGRAM_CHAT_ID are not set"


# --------------------------------------------------------------------------- one poll


def poll_once(store: Store, config: ClientConfig, timeout: float = POLL_TIMEOUT,
              client: httpx.Client | None = None) -> int:
    """One ``getUpdates``: the operator's texts into the inbox, the rest counted or skipped, the offset
    saved past them. Returns how many updates were handled; :class:`PollError` when Telegram did not hand
    any over (the offset is untouched), StoreUnavailable when the store is away."""
    st = state(store)
    offset = st.get("offset") if isinstance(st.get("offset"), int) and not isinstance(st.get("offset"), bool) else None
    updates = get_updates(config, offset, timeout, client)
    redact = config.redactor
    seen: set[int] | None = None  # update ids the inbox holds: read once, when an owner's text comes
    handled = 0
    for uid, update in updates:
        if offset is not None and uid < offset:
            continue  # already acknowledged: a server repeating itself is not a new message
        message = update.get("message")
        message = message if isinstance(message, dict) else {}
        text, chat = message.get("text"), message.get("chat")
        chat_id = chat.get("id") if isinstance(chat, dict) else None
        if not isinstance(text, str) or not isinstance(chat_id, (int, str)) or isinstance(chat_id, bool):
            st["skipped"] = _number(st.get("skipped")) + 1
        elif str(chat_id) != config.chat_id:
            st["other_chats"] = _number(st.get("other_chats")) + 1
            st["other_chats_last_at"] = now_iso()
        else:
            if seen is None:
                seen = _posted_update_ids(store)
            if uid not in seen:
                _post(store, redact.text(text), uid, message)
                seen.add(uid)
            st["received"] = _number(st.get("received")) + 1
        offset = uid + 1
        st["offset"] = offset
        handled += 1
    now = time.time()
    beat = st.get("last_poll_ts")
    quiet = isinstance(beat, (int, float)) and now - beat < HEARTBEAT_SECONDS
    if handled or st.get("failing") or not quiet:
        st.update(failing=0, last_poll_at=now_iso(), last_poll_ts=now)
        _save(store, st)
    return handled


def _post(store: Store, text: str, uid: int, message: dict) -> None:
    urgent = text.startswith(URGENT_MARK)
    if urgent:
        text = text[len(URGENT_MARK):]
    if not text.strip():
        return  # an empty text (or "!" alone) says nothing; acknowledged all the same
    extra: dict[str, Any] = {"telegram_update_id": uid}
    message_id = message.get("message_id")
    if isinstance(message_id, int) and not isinstance(message_id, bool):
        extra["telegram_message_id"] = message_id
    try:
        inbox.post(store, text, sender="telegram", urgent=urgent, extra=extra)
    except inbox.InboxError:
        return  # nothing to leave (an empty text): acknowledged, not retried for ever


def _posted_update_ids(store: Store) -> set[int]:
    out = set()
    for msg in inbox.messages(store):
        uid = msg.get("telegram_update_id")
        if isinstance(uid, int) and not isinstance(uid, bool):
            out.add(uid)
    return out


# --------------------------------------------------------------------------- the thread


class Poller:
    """Polls one agent's bot in a daemon thread until :meth:`stop`; never raises into its caller."""

    def __init__(self, config: ClientConfig, open_store: Any, *, timeout: float = POLL_TIMEOUT,
                 label: str = "default", backoff_first: float = BACKOFF_FIRST, backoff_max: float = BACKOFF_MAX,
                 floor: float = POLL_FLOOR):
        self.config = config
        self._open_store = open_store  # () -> Store: the poller's own connection, never a session's
        self.timeout = timeout
        self.label = label
        self.backoff_first, self.backoff_max = backoff_first, backoff_max
        self.floor = floor
        self.stopping = threading.Event()
        self._wire = Wire()
        self._thread: threading.Thread | None = None
        self._redact = config.redactor
        self._owner = f"{_host()}:{os.getpid()}:telegram-{_random.token_hex(4)}"
        self.polls = 0  # successful getUpdates, for tests and logs
        self.errors = 0

    def start(self) -> Poller:
        self._thread = threading.Thread(target=self._run, name="telegram-poller", daemon=True)
        self._thread.start()
        return self

    def stop(self, wait: float = 5.0) -> None:
        """Stop polling: the long poll in flight is cut, and the thread is waited for up to ``wait`` s."""
        self.stopping.set()
        self._wire.abort()
        if self._thread is not None:
            self._thread.join(wait)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        store = None
        client = make_client(self.timeout, self._wire)
        delay = 0.0
        said_waiting = False
        try:
            while not self.stopping.is_set():
                if delay and self.stopping.wait(delay):
                    break
                try:
                    if store is None:
                        store = self._open_store()
                    if not self._hold_lease(store):
                        if not said_waiting:
                            log.info("telegram (%s): another process polls this bot; waiting", self.label)
                            said_waiting = True
                        delay = min(30.0, max(5.0, self.timeout))
                        continue
                    said_waiting = False
                    asked = time.monotonic()
                    handled = poll_once(store, self.config, self.timeout, client)
                    if self.stopping.is_set():
                        break
                    if self.errors:
                        log.info("telegram (%s): polling again", self.label)
                    self.polls += 1
                    self.errors = 0
                    delay = 0.0 if handled else max(0.0, self.floor - (time.monotonic() - asked))
                except Exception as exc:  # noqa: BLE001 - a poller that stops would lose the operator's messages
                    if self.stopping.is_set():
                        break
                    delay = self._failed(store, exc, delay)
        finally:
            client.close()
            self._release(store)

    def _failed(self, store: Store | None, exc: Exception, delay: float) -> float:
        """Record and log one failure; the pause before the next try."""
        if isinstance(exc, PollError):
            message = str(exc)
        elif isinstance(exc, StoreUnavailable):
            message = "the store is unavailable"
        else:
            message = f"unexpected {type(exc).__name__}: {exc}"
        message = " ".join(self._redact.text(message).split())[:MAX_ERROR_CHARS]
        self.errors += 1
        if self.errors == 1 or self.errors % 20 == 0:
            log.warning("telegram (%s): %s; retrying with backoff", self.label, message)
        if store is not None and not isinstance(exc, StoreUnavailable):
            try:
                record_error(store, message)
            except Exception:  # noqa: BLE001 - the store is the trouble: the log has it
                pass
        delay = min(self.backoff_max, max(self.backoff_first, delay * 2))
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay

    def _hold_lease(self, store: Store) -> bool:
        """Hold (or renew) the agent's poll lease; False while another live process holds it."""
        ttl_ms = int((self.timeout + LEASE_MARGIN) * 1000)
        if store.renew_lease(keys.TELEGRAM_LEASE, self._owner, ttl_ms) or \
                store.acquire_lease(keys.TELEGRAM_LEASE, self._owner, ttl_ms):
            return True
        holder = store.lease_owner(keys.TELEGRAM_LEASE)
        here = f"{_host()}:{os.getpid()}:"
        if holder and not holder.startswith(here) and holder_is_dead(holder) \
                and store.release_lease(keys.TELEGRAM_LEASE, holder):
            return store.acquire_lease(keys.TELEGRAM_LEASE, self._owner, ttl_ms)
        return False

    def _release(self, store: Store | None) -> None:
        if store is None:
            return
        try:
            store.release_lease(keys.TELEGRAM_LEASE, self._owner)
        except Exception:  # noqa: BLE001 - it expires on its own
            pass
        try:
            store.close()
        except Exception:  # noqa: BLE001
            pass


def _host() -> str:
    return host_name()


def start(settings: Any, prefix: str | None, label: str = "default", timeout: float = POLL_TIMEOUT,
          agents: int = 1) -> Poller | None:
    """The poller ``brainstem run`` starts for the agent under ``prefix`` (the first it runs), or None when
    Telegram is not configured: both ``BRAINSTEM_TELEGRAM_BOT_TOKEN`` and ``BRAINSTEM_TELEGRAM_CHAT_ID``."""
    config = ClientConfig.from_settings(settings)
    if config is None:
        if settings.telegram_bot_token is not None or settings.telegram_chat_id is not None:
            log.warning("telegram: not polling: %s", status_reason(settings))
        return None
    poller = Poller(config, lambda: open_store(settings.kv, prefix=prefix, register=False), timeout=timeout,
                    label=label)
    log.info("telegram: polling the bot for messages from chat %s into %s's inbox%s", config.chat_id, label,
             f" (the first of the {agents} agents given)" if agents > 1 else "")
    return poller.start()

"""Where a prompt variable came from: text from tools, the world and memory is marked, and wrapped on render.

A value read from a tool, the store, karma or the agent's memory is wrapped in
:class:`Untrusted` at the point where it is read, naming its source::

    Untrusted(store.get(name), f"kv:{name}")      # [UNTRUSTED CONTENT from kv "tooldata:x:y" — ...]
    Untrusted(outcome.value, "tool:web_fetch")    # [UNTRUSTED CONTENT from tool "web_fetch" — ...]

The mark travels with the value inside any structure (a dict of loaded keys,
a list of karma digests), and :func:`brainstem.core.templates.render`, the one path
from variables to prompt text, turns each marked value into a sanitised,
labelled trust boundary (:func:`brainstem.core.sanitize.wrap_untrusted`):
non-strings are JSON-encoded after every string in them is sanitised, the
label names the source, and nothing inside can close the wrapper. Unmarked
values are the runtime's and operator's own (ids, times, budgets, balances,
config) and are rendered as they are, with two safety nets: a dict key that
is not a plain name (a key name a tool chose) is wrapped, and an unmarked
value that holds a chat-template token or a trust-boundary label is wrapped
whole (``unmarked``), so a value someone forgot to mark still cannot speak as
the system.

An :class:`Untrusted` is deliberately not a ``str``: ``"..." + value`` fails,
and ``str(value)`` / ``f"{value}"`` give the wrapped text, never the raw one.
The raw value is ``.value``, for code that is not building a prompt.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from brainstem.core.sanitize import has_markers, sanitize, sanitize_value, wrap_untrusted

# Names (key names, tool names, aliases) that may stand unwrapped in a prompt: no spaces, brackets or bars.
PLAIN_NAME = re.compile(r"[A-Za-z0-9_.:/@+*#=-]{1,160}")
MAX_BLOCK_CHARS = 200_000  # one wrapped value, after sanitising (NFKC can lengthen text); callers cap far lower


class Untrusted:
    """A value that came from a tool, the world or memory; ``source`` is ``"kind:name"`` (``tool:web_fetch``)."""

    __slots__ = ("value", "source")
    value: Any
    source: str

    def __init__(self, value: Any, source: str):
        while isinstance(value, Untrusted):  # one wrapper: the outer label names it
            value = value.value
        self.value = value
        self.source = str(source)

    @property
    def kind(self) -> str:
        kind, sep, _ = self.source.partition(":")
        return kind if sep else ""

    @property
    def name(self) -> str:
        kind, sep, name = self.source.partition(":")
        return name if sep else kind

    def text(self) -> str:
        """The value as prompt text: sanitised and wrapped in a trust boundary naming its source."""
        body = body_text(self.value)
        if len(body) > MAX_BLOCK_CHARS:
            body = body[:MAX_BLOCK_CHARS] + f"... [{len(body) - MAX_BLOCK_CHARS} more chars]"
        return wrap_untrusted(body, label_name(self.name), kind=label_name(self.kind) if self.kind else "")

    __str__ = text

    def __format__(self, spec: str) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"Untrusted({self.value!r}, {self.source!r})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Untrusted) and other.value == self.value and other.source == self.source

    __hash__ = None  # type: ignore[assignment]


def untrusted(value: Any, source: str) -> Any:
    """``Untrusted(value, source)``, except that nothing (None) stays nothing."""
    return None if value is None else Untrusted(value, source)


def plain(value: Any) -> Any:
    """The value with every mark removed (for data that goes to a tool, never to a prompt)."""
    if isinstance(value, Untrusted):
        return plain(value.value)
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


RECORD_MARK = "$untrusted"


def to_record(value: Any) -> Any:
    """The value as JSON with its marks kept (``{"$untrusted": source, "value": ...}``), for karma."""
    if isinstance(value, Untrusted):
        return {RECORD_MARK: value.source, "value": to_record(value.value)}
    if isinstance(value, Mapping):
        return {str(k): to_record(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_record(v) for v in value]
    return value


def from_record(value: Any) -> Any:
    """The inverse of :func:`to_record`. It only ever adds marks: text recorded as data stays data."""
    if isinstance(value, Mapping):
        if set(value) == {RECORD_MARK, "value"} and isinstance(value[RECORD_MARK], str):
            return Untrusted(from_record(value["value"]), value[RECORD_MARK])
        return {k: from_record(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_record(v) for v in value]
    return value


def has_marks(value: Any) -> bool:
    if isinstance(value, Untrusted):
        return True
    if isinstance(value, Mapping):
        return any(has_marks(v) or not _plain_key(k) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(has_marks(v) for v in value)
    return False


def body_text(value: Any) -> str:
    """Untrusted content as sanitised text: a string as it is, anything else as JSON of its sanitised strings."""
    value = plain(value)
    if isinstance(value, str):
        return sanitize(value)
    return json.dumps(sanitize_value(value), ensure_ascii=False, default=str)


def label_name(name: str) -> str:
    """A source name fit for a wrapper's label: sanitised, plain characters only, at most 80 of them
    (a key name can carry any text, and a label is the runtime's voice)."""
    label = re.sub(r"[^A-Za-z0-9_.:/@+*#=-]+", "_", sanitize(str(name)))[:80]
    return "unnamed" if not label or has_markers(label) else label


def _plain_key(key: Any) -> bool:
    return not isinstance(key, str) or PLAIN_NAME.fullmatch(key) is not None


def prompt_text(value: Any) -> str:
    """Any variable as prompt text, wrapping whatever is marked (see the module docstring)."""
    if isinstance(value, Untrusted):
        return value.text()
    if isinstance(value, str):
        return Untrusted(value, "unmarked:value").text() if has_markers(value) else value
    if not has_marks(value):
        text = json.dumps(value, ensure_ascii=False, default=str)
        return Untrusted(value, "unmarked:value").text() if has_markers(text) else text
    # A trusted structure holding marked values: JSON with each marked value (and each odd key) replaced
    # by a token only this call knows, then each token by its wrapped text.
    blocks: list[str] = []
    token = os.urandom(8).hex()

    def block(u: Untrusted) -> str:
        blocks.append(u.text())
        return f"@@{token}-{len(blocks) - 1}@@"

    def walk(v: Any, depth: int) -> Any:
        if isinstance(v, Untrusted):
            return block(v)
        if depth > 100:
            return block(Untrusted(v, "unmarked:value"))
        if isinstance(v, Mapping):
            return {(k if _plain_key(k) else block(Untrusted(k, "kv:key-name"))): walk(x, depth + 1)
                    for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [walk(x, depth + 1) for x in v]
        return v

    text = json.dumps(walk(value, 0), ensure_ascii=False, default=str)
    if has_markers(text):  # the unmarked parts themselves hold markers: all of it is data
        return Untrusted(value, "unmarked:value").text()
    return re.sub(rf'"@@{token}-(\d+)@@"', lambda m: blocks[int(m.group(1))], text)

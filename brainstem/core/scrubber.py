"""One scrubber between the runtime's secrets and code in the sandbox, in both directions.

Everything the runtime hands sandboxed code (its input, fetch results, headers,
status lines, store values, error and refusal text) and everything the code
sends back (requests, writes, log lines, its result) is looked through by
:meth:`Scrubber.holds`, which knows every secret value the runtime holds, not
only what the running code was granted.

What reaches the code may depend on a secret's value in one way only: where a
server's answer holds, verbatim, the exact text the runtime put into *that*
request, that text becomes the code's placeholder (:func:`put_back`). Any other
secret text is never handed over, cut or masked: a masked piece would tell the
code which of its guesses was right. The caller stops the code instead.

A secret is found:

* in any letter case;
* in its common encodings: base64 (standard and URL-safe, at any alignment),
  hex, URL escaping, JSON ``\\u``/``\\x``/``\\/`` escapes, HTML entities, and
  reversed; escapes, hex and base64 are decoded in views of the text, so a
  value spelled with a mix of them, or whose letter case changed before it
  was encoded, is still found;
* as any run of :data:`MIN_RUN` or more consecutive characters of it (or of
  one of its encodings), so an echo that truncates or splits the value is
  found too; a view with whitespace and punctuation squeezed out finds a value
  split into shorter pieces (when 8 or more of its characters are not
  whitespace or punctuation).

A value shorter than :data:`MIN_RUN` is found only whole and exact: its pieces
would match ordinary text. A run that lies inside a value's public prefix
(``sk-or-v1-``: the same in every key of its kind) is not secret text.

The common path costs a few C-speed regex passes over the text; views are
mapped back to the original text only when a view finds something.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import html
import json
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

MIN_RUN = 8
MAX_DEPTH = 100
# What a splitting echo may put between the pieces of a value.
_SEPARATORS = re.compile(r"[\s.,;:|_'\"`*~^()\[\]{}<>-]+")
_ESCAPES = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"  # a surrogate pair
                      r"|\\u[0-9a-fA-F]{4}|\\x[0-9a-fA-F]{2}|\\/"
                      r"|&#[0-9]{1,7};?|&#[xX][0-9a-fA-F]{1,6};?|&[A-Za-z][A-Za-z0-9]{1,31};?"
                      r"|(?:%[0-9a-fA-F]{2})+")
# Runs that may be base64 (8 bytes or more) or hex (4 bytes or more) of something: decoded and looked into,
# so a value that changed letter case before it was encoded is found too.
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{11,}={0,2}")
_HEX_RUN = re.compile(r"[0-9a-fA-F]{16,}")
# Short segments ending in a separator, as key formats begin (sk-or-v1-, sk-ant-api03-, ghp_, xoxb-).
_PUBLIC_PREFIX = re.compile(r"(?:[A-Za-z0-9]{1,5}[-_:.]){1,4}")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _fold(text: str) -> str:
    """ASCII letters lower-cased, one character for one, so positions still line up."""
    return text.translate(_ASCII_LOWER)


def public_prefix(value: str) -> str:
    """The leading part of a value that is the same in every key of its kind (``sk-or-v1-``, ``ghp_``,
    ``xoxb-``, a bot id and ``:``): known to anyone, so text that holds only it holds nothing secret."""
    m = _PUBLIC_PREFIX.match(value)
    if m is None or m.end() > 14 or len(value) - m.end() < MIN_RUN:
        return ""
    return m.group(0)


def forms(value: str) -> list[tuple[str, int, int]]:
    """``value`` and the encodings of it a plain match would miss (the escapes and hex a view decodes
    aside), each with the span of it that only spells the public prefix."""
    prefix = public_prefix(value)
    n, p = len(value), len(prefix)
    out = [(value, 0, p), (value[::-1], n - p, n)]
    for encode in (lambda t: json.dumps(t)[1:-1], lambda t: urllib.parse.quote(t, safe=""),
                   urllib.parse.quote_plus):
        out.append((encode(value), 0, len(encode(prefix))))
    data = value.encode("utf-8")
    for enc in (base64.b64encode, base64.urlsafe_b64encode):
        for lead in range(3):  # the value at each alignment inside a longer encoded blob
            text = enc(b"\0" * lead + data).decode()
            first, last = -(-lead // 3), (lead + len(data)) // 3
            out.append((text[4 * first:4 * last], 0, 0))
        out += [(enc(data).decode(), 0, 0), (enc(data).decode().rstrip("="), 0, 0)]
    return [f for f in out if f[0]]


def _grams(text: str, public: tuple[int, int]) -> set[str]:
    """Every run of :data:`MIN_RUN` characters of ``text`` but those inside its public span."""
    lo, hi = public
    return {text[i:i + MIN_RUN] for i in range(len(text) - MIN_RUN + 1) if not (lo <= i and i + MIN_RUN <= hi)}


def _decode_escape(m: re.Match) -> str:
    s = m.group(0)
    if s.startswith("\\u") and len(s) == 12:
        hi, lo = int(s[2:6], 16), int(s[8:12], 16)
        return chr(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))
    if s.startswith(("\\u", "\\x")):
        return chr(int(s[2:], 16))
    if s == "\\/":
        return "/"
    if s.startswith("&"):
        out = html.unescape(s if s.endswith(";") else s + ";")
        return s if out.startswith("&") else out
    return urllib.parse.unquote(s, errors="replace")


# --------------------------------------------------------------------------- views


class _View:
    """A text derived from the original by replacing segments, with the way back to the original."""

    def __init__(self, text: str, parent: _View | None = None, segments: list | None = None):
        self.text = text
        self.parent = parent
        self.segs = segments or []  # (new_start, new_end, old_start, old_end), in order
        self.starts = [s[0] for s in self.segs]

    @classmethod
    def derive(cls, parent: _View, pattern: re.Pattern, repl) -> _View:
        pieces, segs, last, pos = [], [], 0, 0
        for m in pattern.finditer(parent.text):
            pieces.append(parent.text[last:m.start()])
            pos += m.start() - last
            new = repl(m) if callable(repl) else repl
            pieces.append(new)
            segs.append((pos, pos + len(new), m.start(), m.end()))
            pos += len(new)
            last = m.end()
        pieces.append(parent.text[last:])
        return cls("".join(pieces), parent, segs)

    def _back(self, pos: int, end: bool) -> int:
        i = bisect.bisect_right(self.starts, pos - 1 if end else pos) - 1
        if i < 0:
            return pos
        ns, ne, os_, oe = self.segs[i]
        if pos < ne or (end and pos == ne):
            return oe if end else os_
        return oe + (pos - ne)

    def original(self, start: int, end: int) -> tuple[int, int]:
        view: _View | None = self
        while view is not None and view.parent is not None:
            start, end = view._back(start, False), view._back(end, True)
            view = view.parent
        return start, end


# --------------------------------------------------------------------------- the detector


def _trie_pattern(words: Iterable[str]) -> str:
    trie: dict = {}
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict) -> str:
        alts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return f"(?:{body})?" if "" in node else body

    return emit(trie)


class _Detector:
    """Finds runs of secret text in a view; built once per set of values (see :func:`_detector`)."""

    def __init__(self, secrets: tuple[tuple[str, str], ...]):
        self.long: dict[str, list[tuple[str, str]]] = {}  # label -> [(folded form, squeezed form)]
        short: dict[str, str] = {}
        grams, squeezed_grams = set(), set()
        for label, value in secrets:
            if len(value) < MIN_RUN:
                short[value] = label
                continue
            entry = []
            for form, lo, hi in forms(value):
                folded = _fold(form)
                squeezed = _SEPARATORS.sub("", folded)
                entry.append((folded, squeezed))
                grams |= _grams(folded, (lo, hi))
                squeezed_span = (len(_SEPARATORS.sub("", folded[:lo])), len(_SEPARATORS.sub("", folded[:hi])))
                squeezed_grams |= _grams(squeezed, squeezed_span)
            self.long[label] = entry
        byte_grams = set()
        for _label, value in secrets:
            raw = _fold(value.encode("utf-8").decode("latin-1"))
            p = len(public_prefix(value).encode("utf-8"))
            byte_grams |= _grams(raw, (0, p)) | _grams(raw[::-1], (len(raw) - p, len(raw)))
        # Matched against decoded bytes, lower-cased in C (bytes.lower folds ASCII only, one for one).
        self.bytes = re.compile(_trie_pattern(byte_grams).encode("latin-1")) if byte_grams else None
        self.grams = re.compile(_trie_pattern(grams)) if grams else None
        self.squeezed = re.compile(_trie_pattern(squeezed_grams)) if squeezed_grams else None
        self.short = (re.compile("|".join(re.escape(v) for v in sorted(short, key=len, reverse=True)))
                      if short else None)
        self.short_labels = short

    def _extend(self, folded: str, start: int, squeezed: bool) -> tuple[int, str, bool]:
        """The longest run of one form starting at ``start``: (its end, the secret's label, whole form)."""
        best = (start + MIN_RUN, "", False)
        for label, entry in self.long.items():
            for pair in entry:
                form = pair[1] if squeezed else pair[0]
                if folded[start:start + MIN_RUN] not in form:
                    continue
                end = start + MIN_RUN
                while end < len(folded) and folded[start:end + 1] in form:
                    end += 1
                whole = end - start == len(form)
                if end > best[0] or not best[1] or (end == best[0] and whole and not best[2]):
                    best = (end, label, whole)
        return best

    def runs(self, view: _View, squeezed: bool = False) -> list[tuple[int, int, str, bool]]:
        """(start, end, label, whole) of each run in ``view``, in ``view``'s positions."""
        pattern = self.squeezed if squeezed else self.grams
        out = []
        if pattern is not None:
            folded = _fold(view.text)
            pos = 0
            while True:
                m = pattern.search(folded, pos)
                if m is None:
                    break
                end, label, whole = self._extend(folded, m.start(), squeezed)
                out.append((m.start(), end, label, whole))
                pos = end
        if self.short is not None and not squeezed:
            out += [(m.start(), m.end(), self.short_labels[m.group(0)], True)
                    for m in self.short.finditer(view.text)]
        return out

    def hit(self, text: str, pattern: re.Pattern | None) -> bool:
        return pattern is not None and pattern.search(_fold(text)) is not None

    def spans(self, text: str, opaque: re.Pattern | None = None) -> list[tuple[int, int, str, bool]]:
        """Every run of secret text in ``text`` (any view), in the original text's positions. What
        ``opaque`` matches (the runtime's own placeholders) is never part of a run."""
        if opaque is not None:
            text = opaque.sub(lambda m: "\0" * len(m.group(0)), text)
        raw = _View(text)
        found = self.runs(raw) + self.decoded_runs(text)
        decoded = raw
        if any(c in text for c in "\\&%"):
            for _ in range(3):  # escapes inside escapes (%2573, &amp;#115;)
                if not _ESCAPES.search(decoded.text):
                    break
                decoded = _View.derive(decoded, _ESCAPES, _decode_escape)
            if decoded is not raw and (self.hit(decoded.text, self.grams) or self._short_hit(decoded.text)):
                found += [(*decoded.original(s, e), label, whole) for s, e, label, whole in self.runs(decoded)]
        if self.hit(_SEPARATORS.sub("", decoded.text), self.squeezed):
            squeezed = _View.derive(decoded, _SEPARATORS, "")
            found += [(*squeezed.original(s, e), label, whole)
                      for s, e, label, whole in self.runs(squeezed, squeezed=True)]
        return found

    def decoded_runs(self, text: str) -> list[tuple[int, int, str, bool]]:
        """Base64 and hex runs of ``text`` whose bytes hold a run of a value (in any letter case)."""
        if self.bytes is None:
            return []
        label = next(iter(self.long), "")
        out = []
        for m in _HEX_RUN.finditer(text):
            for lead in (0, 1):
                chunk = m.group(0)[lead:]
                chunk = chunk[:len(chunk) - len(chunk) % 2]
                hit = self.bytes.search(binascii.unhexlify(chunk).lower())
                if hit:
                    start = m.start() + lead + 2 * hit.start()
                    out.append((start, min(m.end(), start + 2 * (len(hit.group(0)) + 2)), self._owner(hit), False))
        for m in _BASE64_RUN.finditer(text):
            run = m.group(0)
            for lead in range(4):
                chunk = run[lead:].rstrip("=")
                chunk = chunk[:len(chunk) - 1] if len(chunk) % 4 == 1 else chunk
                chunk += "=" * (-len(chunk) % 4)
                for alt in (None, b"-_"):
                    try:
                        raw = base64.b64decode(chunk, altchars=alt)
                    except (binascii.Error, ValueError):
                        continue
                    hit = self.bytes.search(raw.lower())
                    if hit:  # the 4-character groups that hold the bytes found
                        start = m.start() + lead + 4 * (hit.start() // 3)
                        end = m.start() + lead + 4 * -(-hit.end() // 3)
                        out.append((start, min(m.end(), end), self._owner(hit) or label, False))
        return out

    def _owner(self, hit: re.Match) -> str:
        gram = hit.group(0).decode("latin-1")
        for label, entry in self.long.items():
            if any(gram in pair[0] or gram[::-1] in pair[0] for pair in entry):
                return label
        return next(iter(self.long), "")

    def _short_hit(self, text: str) -> bool:
        return self.short is not None and self.short.search(text) is not None


@lru_cache(maxsize=32)
def _detector(secrets: tuple[tuple[str, str], ...]) -> _Detector:
    return _Detector(secrets)


class Scrubber:
    """The runtime's secrets (``label -> value``), to find in what passes between it and the sandbox."""

    def __init__(self, secrets: Mapping[str, str], opaque: Iterable[str] = ()):
        """``opaque``: exact texts that are never secret text (the runtime's placeholders, which could
        otherwise share a run with a value such as ``my-secret-key``)."""
        values = {label: value for label, value in secrets.items() if isinstance(value, str) and value}
        self._detector = _detector(tuple(sorted(values.items()))) if values else None
        words = sorted({w for w in opaque if w}, key=len, reverse=True)
        self._opaque = re.compile("|".join(map(re.escape, words))) if words else None

    def held(self, text: str) -> list[str]:
        """The labels of the secrets ``text`` holds any run of (empty when it holds none)."""
        if self._detector is None or not isinstance(text, str) or not text:
            return []
        return sorted({label for _, _, label, _ in self._detector.spans(text, self._opaque)})

    def holds(self, obj: Any) -> list[str]:
        """:meth:`held` over every string (and dict key) of a JSON-like value."""
        found: set[str] = set()
        for text in _strings(obj):
            found.update(self.held(text))
        return sorted(found)


def put_back(obj: Any, sent: Mapping[str, str]) -> Any:
    """A copy of a JSON-like value with every exact occurrence of a key of ``sent`` (text the runtime put
    into a request) replaced by its value (the placeholder it stood for). Exact: same bytes, same case.
    Whatever else of a secret the value holds is left for :meth:`Scrubber.holds` to find."""
    if not sent:
        return obj
    pattern = re.compile("|".join(map(re.escape, sorted(sent, key=len, reverse=True))))

    def walk(value: Any, depth: int) -> Any:
        if isinstance(value, str):
            return pattern.sub(lambda m: sent[m.group(0)], value)
        if depth > MAX_DEPTH:
            return value
        if isinstance(value, dict):
            return {walk(k, depth + 1): walk(v, depth + 1) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v, depth + 1) for v in value]
        return value

    return walk(obj, 0)


# What stays as it is when a URL is quoted again: its structure, and the unreserved characters.
URL_SAFE = ":/?#[]@!$&'()*+,;=-._~"


def put_back_url(url: str, sent: Mapping[str, str]) -> str:
    """A redirect's ``Location`` with an exact echo of text of ``sent`` replaced by its placeholder, as
    :func:`put_back` does, but looked for in the percent-decoded URL: a server echoes what it was sent
    into a URL quoted however its library quotes, so whether the echo came back as its placeholder must
    not hang on which of the secret's characters needed quoting. A URL that holds no such echo is
    returned as it is."""
    if not sent:
        return url
    decoded = urllib.parse.unquote(url)
    if not any(text in decoded for text in sent):
        return url
    return urllib.parse.quote(put_back(decoded, sent), safe=URL_SAFE)


def _strings(obj: Any, _depth: int = 0):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield str(obj)  # a secret of digits, passed as a JSON number
    elif _depth <= MAX_DEPTH and isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(k, _depth + 1)
            yield from _strings(v, _depth + 1)
    elif _depth <= MAX_DEPTH and isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _strings(v, _depth + 1)

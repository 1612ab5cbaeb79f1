"""The scrubber: every generated echo of a secret is found, so none reaches code in the sandbox.

Hypothesis draws secret values, the way a bound host (or an error message)
might echo one (letter case, encodings, escapes, truncation, splitting,
reversal, several at once) and the text around it. Each check decodes the
text independently, the way an attacker would, and looks for any run of 8
characters of the value: whenever there is one, the scrubber must find it
(the code is then stopped, never handed a masked copy). The one thing put
back is the exact text the runtime put into a request.
"""

from __future__ import annotations

import base64
import binascii
import html
import json
import re
import urllib.parse

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from brainstem.core.scrubber import MIN_RUN, Scrubber, public_prefix, put_back

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Secrets as providers issue them: letters, digits and a little punctuation.
secret_values = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/+=",
                        min_size=MIN_RUN, max_size=48).filter(lambda v: len(set(v)) >= 4)
# What surrounds an echo: ordinary text that holds no escapes of its own.
surroundings = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


def _slice(draw, value: str) -> str:
    kind = draw(st.sampled_from(["whole", "prefix", "suffix", "middle"]))
    n = len(value)
    if kind == "whole" or n == MIN_RUN:
        return value
    size = draw(st.integers(MIN_RUN, n))
    if kind == "prefix":
        return value[:size]
    if kind == "suffix":
        return value[n - size:]
    start = draw(st.integers(0, n - size))
    return value[start:start + size]


def _case(draw, text: str) -> str:
    how = draw(st.sampled_from(["same", "upper", "lower", "swap", "mixed"]))
    if how == "mixed":
        flips = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
        return "".join(c.upper() if f else c.lower() for c, f in zip(text, flips, strict=True))
    return {"same": text, "upper": text.upper(), "lower": text.lower(), "swap": text.swapcase()}[how]


def _split(draw, text: str) -> str:
    sep = draw(st.sampled_from([" ", ".", "-", "\n", ", ", " | ", "\t"]))
    pieces, i = [], 0
    while i < len(text):
        k = draw(st.integers(1, 7))
        pieces.append(text[i:i + k])
        i += k
    return sep.join(pieces)


SQUEEZED = r"[\s.,;:|_'\"`*~^()\[\]{}<>-]+"  # what the scrubber's squeezed view leaves out
ENCODINGS = ["plain", "base64", "base64url", "hex", "HEX", "url", "url_all", "json_u", "json_some", "jsonp",
             "html_dec", "html_hex", "reversed", "split", "url_twice", "html_of_url"]


def _encode(draw, text: str, how: str) -> str:
    data = text.encode()
    if how == "base64":
        lead = draw(st.binary(max_size=2))
        return base64.b64encode(lead + data).decode()
    if how == "base64url":
        lead = draw(st.binary(max_size=2))
        return base64.urlsafe_b64encode(lead + data).decode().rstrip("=")
    if how in ("hex", "HEX"):
        out = binascii.hexlify(data).decode()
        return out.upper() if how == "HEX" else out
    if how == "url":
        return urllib.parse.quote(text, safe="")
    if how == "url_all":
        return "".join(f"%{b:02X}" for b in data)
    if how == "url_twice":
        return urllib.parse.quote("".join(f"%{b:02x}" for b in data), safe="")
    if how == "json_u":
        return "".join(f"\\u{ord(c):04x}" for c in text)
    if how == "json_some":
        flips = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
        return "".join(f"\\u{ord(c):04X}" if f else c for c, f in zip(text, flips, strict=True))
    if how == "jsonp":
        return json.dumps(text)[1:-1].replace("/", "\\/")
    if how == "html_dec":
        return "".join(f"&#{ord(c)};" for c in text)
    if how == "html_hex":
        return "".join(f"&#x{ord(c):x};" for c in text)
    if how == "html_of_url":
        return html.escape("".join(f"%{b:02x}" for b in data)).replace("%", "&#37;")
    if how == "reversed":
        return text[::-1]
    if how == "split" and len(re.sub(SQUEEZED, "", text)) >= MIN_RUN:
        return _split(draw, text)
    return text


@st.composite
def echoes(draw):
    value = draw(secret_values)
    piece = _case(draw, _slice(draw, value))
    how = draw(st.sampled_from(ENCODINGS))
    echoed = _encode(draw, piece, how)
    before, after = draw(surroundings), draw(surroundings)
    return value, f"{before}{echoed}{after}", how


def _grams(value: str) -> set[str]:
    """Every run of 8 characters of ``value`` but those inside its public prefix (``sk-or-v1-``)."""
    low, public = value.lower(), len(public_prefix(value))
    return {low[i:i + MIN_RUN] for i in range(len(low) - MIN_RUN + 1) if i + MIN_RUN > public}


def _decodings(text: str) -> list[str]:
    """Every way an attacker might read ``text`` back, each lower-cased."""
    out = [text, text[::-1]]
    unescaped = text
    for _ in range(4):
        unescaped = html.unescape(urllib.parse.unquote(re.sub(
            r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m.group(1), 16)), unescaped.replace("\\/", "/"))))
    out += [unescaped, unescaped[::-1], re.sub(r"[\s.,|\-]+", "", unescaped)]
    for run in re.findall(r"[0-9a-fA-F]{16,}", text):
        for lead in (0, 1):
            try:
                out.append(binascii.unhexlify(run[lead:len(run) - (len(run) - lead) % 2]).decode("utf-8", "replace"))
            except (binascii.Error, ValueError):
                pass
    for run in re.findall(r"[A-Za-z0-9+/_\-]{11,}={0,2}", text):
        for lead in range(4):
            chunk = run[lead:].rstrip("=")
            chunk = chunk[:len(chunk) - len(chunk) % 4]
            for alt in (None, b"-_"):
                try:
                    raw = base64.b64decode(chunk, altchars=alt, validate=False)
                except (binascii.Error, ValueError):
                    continue
                out.append(raw.decode("utf-8", "replace"))
    return [o.lower() for o in out]


def _leaks(value: str, cleaned: str) -> set[str]:
    grams = _grams(value)
    return {g for text in _decodings(cleaned) for g in grams if g in text}


@SETTINGS
@given(echoes(), secret_values)
def test_every_secret_the_runtime_holds_is_found_not_only_the_granted_one(case, other):
    value, text, how = case
    assume(_leaks(value, text))  # not an echo of only its public prefix ("00000.0:" of "00000.0:00000001")
    assert Scrubber({"GRANTED": other, "LLM_KEY": value}).held(text), (how, text)  # stopped, whose ever it is


@SETTINGS
@given(echoes())
def test_any_piece_of_a_value_in_any_form_is_found(case):
    value, text, how = case
    assume(_leaks(value, text))
    assert Scrubber({"K": value}).held(text) == ["K"], (how, text)


@SETTINGS
@given(secret_values, st.lists(surroundings, min_size=1, max_size=4))
def test_several_echoes_in_one_json_document(value, notes):
    doc = json.dumps({"echo": value, "notes": notes, "again": value.upper(), "escaped": value},
                     ensure_ascii=False).replace(value, "".join(f"\\u{ord(c):04x}" for c in value), 1)
    assert Scrubber({"K": value}).holds({"body": doc}) == ["K"]
    assert Scrubber({"K": value}).holds({value: ["x"]}) == ["K"]  # dict keys are looked through too


@SETTINGS
@given(surroundings, secret_values)
def test_text_without_the_secret_is_not_found(text, value):
    assume(not _leaks(value, text))
    assert Scrubber({"K": value}).held(text) == []


@SETTINGS
@given(echoes())
def test_only_the_exact_text_put_in_is_put_back(case):
    """What a request carried, echoed verbatim, becomes its placeholder; anything else is left for the
    scrubber to find: put back never turns a piece, a changed case or another encoding into something
    clean."""
    value, text, how = case
    assume(_leaks(value, text))
    ph = "brainstem-secret-K-0a1b2c"
    back = put_back(text, {value: ph})
    s = Scrubber({"K": value}, opaque=[ph])
    assert back.replace(ph, "") == text.replace(value, "")
    if _leaks(value, back.replace(ph, " ")):
        assert s.held(back) == ["K"], (how, text, back)


def test_the_whole_value_sent_comes_back_as_its_placeholder_and_nothing_else_does():
    t, o = "tok-live-5eedc0ffee0123456789", "sk-or-v1-aaaabbbbccccdddd"
    s = Scrubber({"T": t, "O": o}, opaque=["PH-T"])
    back = put_back({"h": {"x-echo": t}, "text": f"key={t};"}, {t: "PH-T"})
    assert back == {"h": {"x-echo": "PH-T"}, "text": "key=PH-T;"} and s.holds(back) == []
    # Another encoding of it, another case, a piece, or a secret the request never carried: still found.
    for text in (base64.b64encode(t.encode()).decode(), t.upper(), "<<tok-live-5eedc>>", o):
        assert s.held(put_back(text, {t: "PH-T"})), text


def test_placeholders_are_never_mistaken_for_a_piece_of_a_value():
    ph = "brainstem-secret-API-abc123"
    s = Scrubber({"API": "my-secret-password-1"}, opaque=[ph])
    assert s.held(f"auth {ph} ok") == [] and s.held(ph) == []
    assert s.held("my-secret-pass") == ["API"]


def test_a_public_prefix_alone_is_not_secret_text():
    key = "sk-or-v1-" + "9f8e7d6c5b4a3210" * 4
    s = Scrubber({"OPENROUTER_API_KEY": key})
    assert s.held("keys look like sk-or-v1-... (see the docs)") == []
    assert s.held("Bearer sk-or-v1-") == [] and s.held("or-v1-9f") == ["OPENROUTER_API_KEY"]


def test_a_short_secret_is_matched_whole_only():
    s = Scrubber({"PIN": "4711"})
    assert s.held("pin 4711") == ["PIN"] and s.held("pin 47 and 11") == []

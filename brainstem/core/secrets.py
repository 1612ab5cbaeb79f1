"""Secrets bound to hosts: what a tool may use, where, and never see.

The operator binds each secret to the hosts it may reach, in
``BRAINSTEM_TOOL_SECRETS``: ``NAME@HOST`` for an environment variable,
``secret:NAME@HOST`` for a ``secret:NAME`` key in the store, one entry per
host. A bare ``BRAINSTEM_LLM_API_KEY`` (or its older name ``OPENROUTER_API_KEY``) is
bound to the host of ``BRAINSTEM_LLM_BASE_URL``; any other bare name is a configuration
error.

A tool's meta asks (``secrets``, ``kv_secrets``); the binding decides. What
the tool then holds in ``ctx.secrets`` is an opaque placeholder, never the
value: the value stays in the runtime process. ``ctx.fetch`` puts the value in
place of the placeholder (URL, headers, body) only in a request to a host the
secret is bound to, checked again on every redirect hop; a request carrying a
placeholder anywhere else is refused before it is sent. A bound host may echo
what it is sent, so a secret goes in once per request, over https to a remote
host, and the LLM key into headers only (see :meth:`Grants.check`). A value
that comes back in a response is turned back into its placeholder before the
tool sees it.

A few operator settings that are not credentials (``BRAINSTEM_LLM_BASE_URL`` and
``OPENROUTER_BASE_URL``,
``WALLET_ADDRESS``, ``BASE_RPC_URL`` when it carries no path, query or user
part where a key could hide, and the Telegram chat and API URL) are handed over
as plain values to code that asks.

The Telegram bot token (``BRAINSTEM_TELEGRAM_BOT_TOKEN``) is never granted,
not even as a placeholder: whoever holds it can read the operator's messages
or take them away. Code asks the runtime to send to the operator's chat
(``ctx.send_telegram``) instead; a binding that would hand it over is a
configuration error, and a store secret of the same value is not granted.
"""

from __future__ import annotations

import binascii
import ipaddress
import re
import secrets as _random
import urllib.parse
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from brainstem.core import environment, events
from brainstem.core.errors import ConfigError
from brainstem.core.scrubber import forms as scrubber_forms

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
KV_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
HOST_NAME = re.compile(r"(?=.{1,253}\Z)"  # 1 to 253 characters in all
                       r"([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)"  # a first label of 1 to 63
                       r"(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*\Z")  # then more, each after a dot
LLM_KEY = "OPENROUTER_API_KEY"  # the LLM key's older name, which the shipped tools ask for
LLM_KEY_NAME = "BRAINSTEM_LLM_API_KEY"
LLM_KEYS = frozenset({LLM_KEY, LLM_KEY_NAME})  # either name is the one LLM key, bound and guarded alike
LLM_URLS = ("BRAINSTEM_LLM_BASE_URL", "OPENROUTER_BASE_URL")
PUBLIC_SETTINGS = (*LLM_URLS, "WALLET_ADDRESS", "BASE_RPC_URL", "TELEGRAM_CHAT_ID", "TELEGRAM_API_URL")
BOT_TOKEN = "BRAINSTEM_TELEGRAM_BOT_TOKEN"
# Secrets the runtime holds and never grants, by the name it knows them by: code asks for the act instead.
NEVER_GRANTED = frozenset({BOT_TOKEN})
PCHAR_SAFE = "-._~!$&'()*+,;=:@"  # what a URL path segment may hold unescaped
WITHHELD_REASON = "the Telegram bot token is never handed to code: ctx.send_telegram(text) sends to the operator"
MIN_ENCODED_LEN = 8  # encodings of shorter values would match ordinary text

# One random part per process: placeholders cannot collide with ordinary text by accident.
_NONCE = _random.token_hex(6)


class SecretRefused(Exception):
    """A request would carry a secret to a host it is not bound to; nothing was sent."""


def normalise_host(host: str) -> str:
    host = host.strip().lower().rstrip(".")
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _check_host(entry: str, host: str) -> str:
    raw = host.strip()
    if not raw:
        raise ConfigError(f"BRAINSTEM_TOOL_SECRETS entry {entry!r} has no host after '@'")
    if "/" in raw or "://" in raw or "*" in raw:
        raise ConfigError(f"BRAINSTEM_TOOL_SECRETS entry {entry!r}: the host must be a bare host name "
                          f"or IP (no scheme, path or wildcard), e.g. NAME@api.example.com")
    bracketed = raw.startswith("[") and raw.endswith("]")
    candidate = raw[1:-1] if bracketed else raw
    try:
        return str(ipaddress.ip_address(candidate))
    except ValueError:
        pass
    if bracketed or ":" in candidate:
        raise ConfigError(f"BRAINSTEM_TOOL_SECRETS entry {entry!r}: no port after the host (a binding "
                          f"covers every port of it); write IPv6 addresses in brackets, e.g. NAME@[::1]")
    name = normalise_host(candidate)
    if not HOST_NAME.match(name):
        raise ConfigError(f"BRAINSTEM_TOOL_SECRETS entry {entry!r}: {host!r} is not a host name")
    return name


@dataclass(frozen=True)
class Binding:
    label: str  # "WEATHER_API_KEY", or "secret:wallet_pk" for a store secret
    hosts: frozenset[str]

    @property
    def from_store(self) -> bool:
        return self.label.startswith("secret:")


def parse_bindings(entries: Iterable[str], llm_base_url: str) -> dict[str, Binding]:
    """The operator's bindings by label; a malformed entry is one :class:`ConfigError` showing the fix."""
    hosts: dict[str, set[str]] = {}
    for raw in entries:
        entry = raw.strip()
        if not entry:
            continue
        if "@" not in entry:
            if entry not in LLM_KEYS:
                raise ConfigError(
                    f"BRAINSTEM_TOOL_SECRETS entry {entry!r} names no host: bind it to the hosts it may "
                    f"reach, one entry each, e.g. {entry}@api.example.com")
            host = urllib.parse.urlsplit(llm_base_url).hostname
            if not host:
                raise ConfigError(f"BRAINSTEM_TOOL_SECRETS: {entry} is bound to the host of "
                                  f"BRAINSTEM_LLM_BASE_URL, which has none ({llm_base_url!r})")
            name, host = entry, host
        else:
            name, host = entry.rsplit("@", 1)
        if name.startswith("secret:"):
            if not KV_NAME.match(name[len("secret:"):]):
                raise ConfigError(f"BRAINSTEM_TOOL_SECRETS entry {entry!r}: {name!r} is not a store secret "
                                  f"name (secret:NAME with letters, digits, '_', '.', '-')")
        elif not ENV_NAME.match(name):
            raise ConfigError(f"BRAINSTEM_TOOL_SECRETS entry {entry!r}: {name!r} is not an environment "
                              f"variable name (or write secret:NAME@HOST for a key in the store)")
        # The LLM key under either name is the one key: bound once, a tool may ask for it by either.
        for label in sorted(LLM_KEYS) if name in LLM_KEYS else (name,):
            hosts.setdefault(label, set()).add(_check_host(entry, host))
    return {name: Binding(name, frozenset(h)) for name, h in hosts.items()}


def placeholder_for(label: str) -> str:
    """The opaque text a tool holds instead of the secret ``label``: URL-, header- and JSON-safe."""
    return f"brainstem-secret-{label.replace(':', '.')}-{_NONCE}"


def _public_setting(name: str, value: str) -> tuple[str | None, str]:
    """(the value to hand over, or None, and why not): a URL that could carry a credential is withheld."""
    if name in ("BASE_RPC_URL", *LLM_URLS, "TELEGRAM_API_URL"):
        parts = urllib.parse.urlsplit(value)
        # An RPC provider's key often sits in the path; an LLM endpoint's path is just its API root.
        path_may_hold_key = name == "BASE_RPC_URL" and parts.path.strip("/")
        if parts.username or parts.password or parts.query or path_may_hold_key:
            parts_named = "user, query or path" if name == "BASE_RPC_URL" else "user or query"
            return None, (f"{name} has a {parts_named} part that may hold a credential; "
                          f"bind the credential as a secret instead")
    return value, ""


def public_url(url: str) -> str:
    """``url`` without any user or password part: what code in the sandbox may be told of an endpoint."""
    parts = urllib.parse.urlsplit(url)
    if not (parts.username or parts.password):
        return url
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


# --------------------------------------------------------------------------- forms of a value


def secret_forms(value: str) -> set[str]:
    """``value`` and the common encodings of it that could carry it past a plain substring match:
    those the sandbox's scrubber knows (URL and JSON escaping, base64 at any alignment, reversed), a
    path segment's escaping, and hex."""
    forms = {value}
    if len(value) < MIN_ENCODED_LEN:
        return forms
    hexed = binascii.hexlify(value.encode("utf-8")).decode()
    forms |= {f for f, _, _ in scrubber_forms(value)}
    forms |= {urllib.parse.quote(value, safe=PCHAR_SAFE), hexed, hexed.upper()}
    return {f for f in forms if f}


def forms_pattern(forms: Iterable[str]) -> re.Pattern:
    """One pattern matching any of ``forms``, longest first (so a value containing another matches
    whole). Forms long enough to be unmistakable match in any letter case: a value upper-cased on
    its way back is still the value."""
    ordered = sorted(set(forms), key=len, reverse=True)
    return re.compile("|".join(f"(?i:{re.escape(f)})" if len(f) >= MIN_ENCODED_LEN else re.escape(f)
                               for f in ordered))


def replacer(forms: Mapping[str, str]) -> Callable[[str], str]:
    """A function putting ``forms[f]`` in place of every ``f`` (see :func:`forms_pattern`) in a text."""
    table = dict(forms)
    if not table:
        return lambda text: text
    folded = {f.lower(): r for f, r in table.items()}
    pattern = forms_pattern(table)
    return lambda text: pattern.sub(lambda m: table.get(m.group(0)) or folded[m.group(0).lower()], text)


# --------------------------------------------------------------------------- one execution's grants


@dataclass
class Grant:
    name: str  # as the tool asked for it (ctx.secrets key)
    label: str  # as the operator bound it
    value: str
    hosts: frozenset[str]
    placeholder: str


@dataclass
class Grants:
    """The secrets one execution of code holds: placeholders for the sandbox, values for the wire."""

    secrets: list[Grant] = field(default_factory=list)
    public: dict[str, str] = field(default_factory=dict)

    def visible(self) -> dict[str, str]:
        """What ``ctx.secrets`` holds: placeholders, and the plain public settings."""
        out = dict(self.public)
        out.update({g.name: g.placeholder for g in self.secrets})
        return out

    def values(self) -> dict[str, str]:
        """label -> value, for redaction of everything the runtime records."""
        return {g.label: g.value for g in self.secrets}

    def placeholders(self) -> dict[str, str]:
        """label -> placeholder: what a value of these secrets turns back into on its way to the tool."""
        return {g.label: g.placeholder for g in self.secrets}

    def present(self, *texts: str) -> list[Grant]:
        return [g for g in self.secrets if any(g.placeholder in t for t in texts if t)]

    def check(self, req: Outgoing) -> list[Grant]:
        """The grants whose placeholders ``req`` carries, once each and where a credential goes;
        :class:`SecretRefused` (nothing is sent) when it would carry one anywhere else.

        A bound host can echo what it is sent (an LLM repeats its prompt, a chat API posts a message
        to whoever the tool names), so one secret is put in, at most once per request, and never over
        plain HTTP to a remote host. The LLM key goes into headers only: a placeholder in the prompt
        (karma shown to reflection holds some) stays the placeholder, and counts for nothing. A request
        that holds a secret's *value* is stopped before this, by the scrubber (:mod:`brainstem.core.scrubber`).
        """
        texts = [req.url, *req.header_names, *req.header_values, req.body]
        found = self.present(*texts)
        host = normalise_host(req.host)
        for g in found:
            if host not in g.hosts:
                raise SecretRefused(f"refused: the request carries secret {g.name} to {host}, which it is "
                                    f"not bound to (bound to: {', '.join(sorted(g.hosts))})")
            where = req.header_values if req.header_only(g) else texts
            if sum(t.count(g.placeholder) for t in where if t) > 1:
                raise SecretRefused(f"refused: the request carries secret {g.name} more than once; a secret "
                                    f"goes in one place of a request, where the host expects the credential")
            if any(g.placeholder in n for n in req.header_names):
                raise SecretRefused(f"refused: secret {g.name} in a header name")
            if req.scheme != "https" and not req.cleartext_ok:
                raise SecretRefused(f"refused: secret {g.name} would go to {host} over plain {req.scheme}; "
                                    f"secrets go over https (plain http only to loopback or private addresses)")
        put = [g for g in found if any(g.placeholder in t for t in (req.header_values if req.header_only(g) else texts)
                                       if t)]
        if len(put) > 1:
            # An echo is told back as the placeholder of what was put in: with two secrets in one request,
            # whether the two values are the same would decide whose placeholder came back.
            raise SecretRefused(f"refused: the request carries secrets {' and '.join(g.name for g in put)}; "
                                f"a request carries one secret")
        return found

    def put_in(self, text: str, found: list[Grant], quote: Callable[[str], str] = lambda v: v) -> str:
        for g in found:
            text = text.replace(g.placeholder, quote(g.value))
        return text


@dataclass
class Outgoing:
    """One request as a tool wrote it (placeholders, not values), split where secrets may sit."""

    host: str
    scheme: str
    url: str
    header_names: list[str]
    header_values: list[str]  # with the decoded credentials of an ``Authorization: Basic`` value
    body: str
    headers_only: bool = False  # the LLM endpoint: a secret goes in a header only
    cleartext_ok: bool = False  # plain http is acceptable to this host (loopback, private, the operator's)

    def header_only(self, g: Grant) -> bool:
        """Whether ``g`` is put into headers only (its placeholder left as it is in the URL and body)."""
        return self.headers_only or g.label in LLM_KEYS


def cleartext_ok(host: str, llm_base_url: str | None = None) -> bool:
    """Whether a secret may cross plain HTTP to ``host``: a loopback or private address (the operator's
    own network), or the LLM endpoint when the operator configured it with ``http://``."""
    host = normalise_host(host)
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
        return ip.is_loopback or ip.is_private
    except ValueError:
        pass
    if llm_base_url:
        parts = urllib.parse.urlsplit(llm_base_url)
        return parts.scheme == "http" and normalise_host(parts.hostname or "") == host
    return False


def grant(*, tool: str, asked_env: Iterable[str], asked_kv: Iterable[str], bindings: Mapping[str, Binding],
          read_store_secret: Callable[[str], str | None], record: Callable[..., Any],
          env: Mapping[str, str] | None = None, public: Mapping[str, str | None] | None = None,
          withheld: Collection[str] = ()) -> Grants:
    """What ``tool`` may hold, given what its meta asks for and what the operator bound. A value in
    ``withheld`` (see :data:`NEVER_GRANTED`) is never granted from the environment, whatever name or binding it
    comes by.

    Each name asked for and not granted is a ``secret_not_granted`` karma entry; the tool still runs.
    """
    env = environment.variables() if env is None else env
    out = Grants()

    def refuse(name: str, reason: str) -> None:
        # The field is `secret_name`: karma blanks a field called `secret` whatever it holds.
        record(events.SECRET_NOT_GRANTED, tool=tool, secret_name=name, reason=reason)

    for name in dict.fromkeys(asked_env):
        if not isinstance(name, str):
            continue
        # A public setting that is not set may still be an operator's binding of the same name (a chat id
        # bound as TELEGRAM_CHAT_ID@api.telegram.org before the runtime knew the chat).
        if public is not None and name in PUBLIC_SETTINGS and (public.get(name) or name not in bindings):
            value = public.get(name)
            handed, why = _public_setting(name, value) if value else (None, "not set")
            if handed is None:
                refuse(name, why)
            else:
                out.public[name] = handed
            continue
        binding = bindings.get(name)
        if binding is None:
            refuse(name, "not bound in BRAINSTEM_TOOL_SECRETS (bind it as NAME@HOST)")
        elif not env.get(name):
            refuse(name, "not set in the environment")
        elif env[name] in withheld:
            refuse(name, WITHHELD_REASON)
        else:
            out.secrets.append(Grant(name, name, env[name], binding.hosts, placeholder_for(name)))
    for name in dict.fromkeys(asked_kv):
        if not isinstance(name, str):
            continue
        label = f"secret:{name}"
        binding = bindings.get(label)
        if binding is None:
            refuse(label, "not bound in BRAINSTEM_TOOL_SECRETS (bind it as secret:NAME@HOST)")
            continue
        value = read_store_secret(name)
        if not value:
            refuse(label, "no such key")
            continue
        # No value check here: the agent writes secret:* keys, so granting one or not by whether its value is
        # the bot token would answer a guess of the token. The operator's own bindings are checked at start.
        if any(g.name == name for g in out.secrets) or name in out.public:
            refuse(label, f"{name} is already granted from the environment")
            continue
        out.secrets.append(Grant(name, label, value, binding.hosts, placeholder_for(label)))
    return out

"""Agent names: several agents sharing one store, each confined to its own keys.

An agent is selected by a key prefix ``NAME:`` (``BRAINSTEM_KV_PREFIX``, the
``?prefix=`` of the store URL, or ``brainstem run --agent NAME``). The empty
prefix is the *default agent*, whose keys are stored as they are.

* A named agent's keys are stored under ``NAME:``, so it cannot name a key
  outside its prefix.
* Every name in use is recorded in a registry kept outside every prefix (Redis:
  the set ``__agents__``; SQLite: the ``agents`` table). A store opened with a
  prefix registers its name on first use. Registration is refused when the
  default agent already holds keys under ``NAME:`` (they would appear inside
  the new agent), unless a log is among them (only the agent's own runtime
  appends logs under its prefix: an agent from before names were registered)
  or the operator adopts them explicitly.
* The default agent's view refuses every key whose first segment is a
  registered name: writes, deletes, appends and leases raise
  :class:`~brainstem.core.errors.ForeignAgentKey`; reads answer "absent"; listings
  leave such keys out. Keys starting with ``__`` are the store's internals and
  are treated the same way in every view.

Names are ``[a-z0-9][a-z0-9_-]{0,31}`` and never one of the default agent's
own first segments (``soul``, ``config``, ``karma``...), so a key such as
``wake_config`` or ``tooldata:x:y`` needs no registry lookup: the hot paths
stay as fast as with a single agent.

This module is imported on the sleep path: nothing heavier than ``re``.

Operators list and register names with ``brainstem agents``.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

from brainstem.core import keys
from brainstem.core.errors import ConfigError

NAME_PATTERN = r"[a-z0-9][a-z0-9_-]{0,31}"
_NAME = re.compile(NAME_PATTERN + r"\Z")
# Keys starting with this are the store's internals (metadata, leases, the registry).
INTERNAL = "__"
ALLOWED_FORM = ("use NAME or NAME: where NAME is 1-32 characters of a-z, 0-9, '_' and '-', "
                "starting with a letter or a digit")


def is_reserved(name: str) -> bool:
    """True for names that would collide with the default agent's own keys."""
    return name in keys.DEFAULT_AGENT_SEGMENTS or name.startswith(INTERNAL)


def agent_prefix(value: str | None, source: str = "agent prefix") -> str:
    """The normalised prefix for ``value``: ``""`` for the default agent, else ``"NAME:"``.

    Accepts ``NAME`` or ``NAME:``; anything else (``a:b:``, ``A``, ``-x``,
    a 33-character name, a reserved name) is a one-line :class:`ConfigError`
    naming ``source`` and the bad value.
    """
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConfigError(f"{source} {value!r} is not a valid agent name: {ALLOWED_FORM}")
    text = value.strip()
    if not text:
        return ""
    name = text[:-1] if text.endswith(":") else text
    if not _NAME.match(name):
        raise ConfigError(f"{source} {value!r} is not a valid agent name: {ALLOWED_FORM}")
    if is_reserved(name):
        raise ConfigError(f"{source} {value!r} is reserved: the default agent's own keys start with {name!r}, "
                          f"so no agent may be named that; choose another name")
    return name + ":"


def selected(url: str, name: str | None) -> str:
    """The agent a store URL and a name select, as its prefix (see :func:`agent_prefix`).

    ``name`` (``BRAINSTEM_KV_PREFIX``) wins when it is set, even empty; else the URL's ``?prefix=``;
    else the default agent. The one place this is decided: the sleep path, every command and the
    dashboard see the same agent."""
    if name is not None:
        return agent_prefix(name, "BRAINSTEM_KV_PREFIX")
    query = parse_qs(urlsplit(url).query).get("prefix")
    return agent_prefix(query[0], "BRAINSTEM_KV ?prefix=") if query else ""


def candidate(key: str) -> str | None:
    """The first segment of ``key`` if it could be a registered agent's name, else None.

    No I/O: keys without ``:``, and keys whose first segment is reserved or not
    name-shaped, can never belong to another agent.
    """
    i = key.find(":")
    if i <= 0 or i > 32:
        return None
    seg = key[:i]
    if seg in keys.DEFAULT_AGENT_SEGMENTS or not _NAME.match(seg):
        return None
    return seg


def adopt_hint(name: str) -> str:
    return f"brainstem agents register {name} --adopt"

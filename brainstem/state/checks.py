"""What a write of a ``config:*``, ``prompt:*`` or ``schedule:*`` key must be, checked before it is stored: the
operator's (``brainstem kv put``) and the agent's (:mod:`brainstem.state.guarded`) call this one check.

The runtime reads these keys on every wake. A broken one does not stop the agent (``config.py``
falls back to the last valid version or the built-in defaults), but it silently changes what the
agent does, and the operator only finds out from a ``config_invalid`` note in karma. So
``brainstem kv put`` checks the value first and refuses a bad one in one line naming the key and
the field; ``--force`` stores it anyway.

* ``config:defaults`` and ``config:models``: the models in :mod:`brainstem.state.config`.
* ``config:resources``: ``{"resources": {NAME: {...}, ...}}``; ``config:tool_registry``:
  ``{"tools": {NAME: {"description": TEXT, "input": {...}}, ...}}`` (what orient is shown).
* ``config:reflexes``: a list of rules (:mod:`brainstem.state.reflexes`).
* any other ``config:*``: valid JSON.
* ``schedule:*``: a schedule (:mod:`brainstem.state.schedules`): its fields, its timing, its id the key's.
  The agent's writes are checked further there (the operator's limits, never the operator's schedules).
* ``prompt:*``: every ``{{`` opens a well-formed placeholder (``{{name}}``, ``{{a.b.0}}``): an
  unclosed one, or one with anything else inside (a filter such as ``{{x | upper}}``, which the
  renderer does not have), would reach the model verbatim. A stray ``}}`` is allowed: JSON examples
  in prompts close nested objects with it. No prompt may template the soul (``{{soul}}``): the soul
  is the system message of every call already, never part of a prompt the agent can rewrite.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ValidationError

from brainstem.core import keys
from brainstem.core.templates import PLACEHOLDER
from brainstem.state.config import Defaults, Models
from brainstem.state.reflexes import ReflexError, parse
from brainstem.state.schedules import ScheduleError, id_of, parse_text

# Anything between ``{{`` and the next ``}}`` (or the end): what the renderer would have to understand.
_OPENED = re.compile(r"\{\{(.*?)(\}\}|\Z)", re.S)


def check_value(key: str, text: str) -> str | None:
    """Why ``text`` may not be stored as ``key`` (one line: ``KEY: FIELD: PROBLEM``), or None when it may.

    Keys other than ``config:*``, ``prompt:*``, ``schedule:*`` and ``secret:*`` are not checked here."""
    if key.startswith("secret:"):
        why = secret_value_problem(text)
    elif key.startswith(keys.SCHEDULE_PREFIX):
        why = _schedule_problem(key, text)
    elif key.startswith("prompt:"):
        why = _prompt_problem(text)
    elif key.startswith("config:"):
        why = _config_problem(key, text)
    else:
        return None
    if why is None:
        return None
    return f"{key}{why}" if why.startswith("[") else f"{key}: {why}"  # config:reflexes[0] (name): ...


def secret_value_problem(text: str) -> str | None:
    """Why ``text`` cannot be a secret's value: a secret goes into a header, URL or body as it is, so a
    character that cannot (a line break, a control or non-ASCII character) would make whether a request
    goes out depend on the value. Decided when it is written, never per request."""
    bad = next((c for c in text if not 32 <= ord(c) < 127), None)
    if bad is None:
        return None
    return (f"holds {bad!r}, which a header or URL cannot carry as it is (a secret is printable ASCII; a "
            f"trailing newline from a file?)")


def _config_problem(key: str, text: str) -> str | None:
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"not valid JSON ({exc})"
    if key == keys.CONFIG_REFLEXES:
        try:
            parse(value)
        except ReflexError as exc:
            # Its messages name the key themselves ("config:reflexes[0] (name): when: ..."): said once here.
            return str(exc).removeprefix(f"{key}: ").removeprefix(key).lstrip(" ")
        return None
    if key in (keys.CONFIG_DEFAULTS, keys.CONFIG_MODELS):
        return _model_problem(Defaults if key == keys.CONFIG_DEFAULTS else Models, value)
    if key == keys.CONFIG_RESOURCES:
        return _named_objects(value, "resources", {})
    if key == keys.CONFIG_TOOL_REGISTRY:
        return _named_objects(value, "tools", {"description": str, "input": dict})
    return None


def _schedule_problem(key: str, text: str) -> str | None:
    try:
        parse_text(id_of(key) or "", text)
    except ScheduleError as exc:
        return str(exc).removeprefix(f"{key}: ")  # its messages name the key themselves: said once here
    return None


def _model_problem(model: type[BaseModel], value: Any) -> str | None:
    try:
        model.model_validate(value)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(p) for p in e["loc"]) or "(root)"
        return f"{where}: {e['msg']}"
    return None


_KIND = {str: "text", dict: "an object"}


def _named_objects(value: Any, member: str, fields: dict[str, type]) -> str | None:
    """``{member: {NAME: {...}}}``, each entry an object whose ``fields`` (when present) have their types."""
    if not isinstance(value, dict):
        return f"(root): should be an object with {member!r}, got {type(value).__name__}"
    if member not in value:
        return f"{member}: missing (the value is {{\"{member}\": {{NAME: {{...}}}}}})"
    entries = value[member]
    if not isinstance(entries, dict):
        return f"{member}: should be an object of NAME: {{...}}, got {type(entries).__name__}"
    for name, entry in entries.items():
        if not isinstance(entry, dict):
            return f"{member}.{name}: should be an object, got {type(entry).__name__}"
        for field, kind in fields.items():
            if field in entry and not isinstance(entry[field], kind):
                return f"{member}.{name}.{field}: should be {_KIND[kind]}, got {type(entry[field]).__name__}"
    return None


def _prompt_problem(text: str) -> str | None:
    if not text.strip():
        return "empty: a prompt is the text the model is asked"
    for m in _OPENED.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        shown = m.group(0) if len(m.group(0)) <= 40 else m.group(0)[:37] + "..."
        if not m.group(2):
            return f"line {line}: {shown!r} is never closed with '}}}}'"
        placeholder = PLACEHOLDER.fullmatch(m.group(0))
        if placeholder is None:
            return (f"line {line}: {shown!r} is not a placeholder; write {{{{name}}}} or {{{{a.b.c}}}} "
                    f"(there are no filters)")
        if placeholder.group(1).split(".")[0] == keys.SOUL:
            return (f"line {line}: {shown!r} templates the soul; the soul is the system message of every "
                    f"call already, so no prompt includes it")
    return None

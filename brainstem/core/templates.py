"""``{{a.b.c}}`` templates: prompts rendered from variables, plan steps from stored results.

A placeholder names a dotted path into the variables. Unknown placeholders
are left exactly as they are (a prompt may mention ``{{x}}`` on purpose);
non-string values are JSON-encoded. Substitution into plan steps happens
inside the parsed structure, never by splicing text into JSON.

:func:`render` is the one path from variables to prompt text, and it knows
where each value came from: a value marked
:class:`~brainstem.core.untrusted.Untrusted` (tool output, loaded keys, karma,
memory), or reached through one (``{{page.body}}``), is sanitised and wrapped
in a labelled trust boundary as it is substituted, also when it sits inside a
trusted structure (``{{context}}``); see :mod:`brainstem.core.untrusted`.
:func:`substitute` fills tool inputs, which are data, with the raw values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from brainstem.core.untrusted import Untrusted, plain, prompt_text

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][\w-]*(?:\.[\w-]+)*)\s*\}\}")
_MISSING = object()


def lookup(variables: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path, or ``_MISSING``. List items are reached by index (``a.0``).

    A path into an :class:`Untrusted` value gives an untrusted value (the innermost mark's source).
    """
    cur: Any = variables
    source: str | None = None
    for part in path.split("."):
        if isinstance(cur, Untrusted):
            source, cur = cur.source, cur.value
        if isinstance(cur, Mapping) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return _MISSING
    if source is not None and not isinstance(cur, Untrusted):
        return Untrusted(cur, source)
    return cur


def to_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def capped(value: Any, cap: int) -> Any:
    """``value`` as it is when its text fits in ``cap`` characters, else its text cut there, saying how much
    is left out."""
    text = to_text(value)
    return value if len(text) <= cap else text[:cap] + f"... [{len(text) - cap} more chars]"


def render(template: str, variables: Mapping[str, Any], on_missing: Callable[[str], None] | None = None,
           transform: Callable[[str, Any], str] | None = None) -> str:
    """Fill every known placeholder, wrapping untrusted values (:func:`brainstem.core.untrusted.prompt_text`).

    ``transform(name, value)`` may rewrite the text of a value that carries no mark.
    """
    def sub(m: re.Match) -> str:
        value = lookup(variables, m.group(1))
        if value is _MISSING:
            if on_missing is not None:
                on_missing(m.group(1))
            return m.group(0)
        if transform is not None and not isinstance(value, Untrusted):
            return transform(m.group(1), value)
        return prompt_text(value)
    return PLACEHOLDER.sub(sub, template)


def _fill(template: str, variables: Mapping[str, Any]) -> str:
    """Placeholders filled with raw values as text: for data (tool inputs), never for a prompt."""
    def sub(m: re.Match) -> str:
        value = lookup(variables, m.group(1))
        return m.group(0) if value is _MISSING else to_text(plain(value))
    return PLACEHOLDER.sub(sub, template)


def references(obj: Any) -> set[str]:
    """The top-level names every placeholder in ``obj`` (any JSON structure) refers to."""
    found: set[str] = set()
    if isinstance(obj, str):
        found.update(m.group(1).split(".")[0] for m in PLACEHOLDER.finditer(obj))
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            found |= references(k) | references(v)
    elif isinstance(obj, list):
        for v in obj:
            found |= references(v)
    return found


def substitute(obj: Any, variables: Mapping[str, Any], transform: Callable[[str, Any], str] | None = None) -> Any:
    """Replace placeholders throughout a parsed structure (a tool's input: data, not a prompt).

    A string that is exactly one placeholder becomes the value itself (a dict
    stays a dict); elsewhere the value is spliced in as text. Values are used
    raw (marks removed): a tool gets the page, not the page in a wrapper.
    """
    if isinstance(obj, str):
        m = PLACEHOLDER.fullmatch(obj.strip())
        if m is not None:
            value = lookup(variables, m.group(1))
            if value is not _MISSING:
                return plain(value)
        return render(obj, variables, transform=transform) if transform is not None else _fill(obj, variables)
    if isinstance(obj, Mapping):
        return {k: substitute(v, variables, transform) for k, v in obj.items()}
    if isinstance(obj, list):
        return [substitute(v, variables, transform) for v in obj]
    return obj

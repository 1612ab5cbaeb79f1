"""``{{a.b.c}}`` templates: prompts rendered from variables, plan steps from stored results.

A placeholder names a dotted path into the variables. Unknown placeholders
are left exactly as they are (a prompt may mention ``{{x}}`` on purpose);
non-string values are JSON-encoded. Substitution into plan steps happens
inside the parsed structure, never by splicing text into JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][\w-]*(?:\.[\w-]+)*)\s*\}\}")
_MISSING = object()


def lookup(variables: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path, or ``_MISSING``. List items are reached by index (``a.0``)."""
    cur: Any = variables
    for part in path.split("."):
        if isinstance(cur, Mapping) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return _MISSING
    return cur


def to_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def render(template: str, variables: Mapping[str, Any], on_missing: Callable[[str], None] | None = None,
           transform: Callable[[str, Any], str] | None = None) -> str:
    """Fill every known placeholder; ``transform(name, value)`` may rewrite a value's text."""
    def sub(m: re.Match) -> str:
        value = lookup(variables, m.group(1))
        if value is _MISSING:
            if on_missing is not None:
                on_missing(m.group(1))
            return m.group(0)
        return transform(m.group(1), value) if transform is not None else to_text(value)
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
    """Replace placeholders throughout a parsed structure.

    A string that is exactly one placeholder becomes the value itself (a dict
    stays a dict); elsewhere the value is spliced in as text.
    """
    if isinstance(obj, str):
        m = PLACEHOLDER.fullmatch(obj.strip())
        if m is not None:
            value = lookup(variables, m.group(1))
            if value is not _MISSING:
                return value
        return render(obj, variables, transform=transform)
    if isinstance(obj, Mapping):
        return {k: substitute(v, variables, transform) for k, v in obj.items()}
    if isinstance(obj, list):
        return [substitute(v, variables, transform) for v in obj]
    return obj

"""How the command line prints: labelled rows, aligned tables, JSON, and its one-line errors.

Every command prints through these, so a value reads the same everywhere (never
``None`` or a Python repr, money with its dollar sign, JSON one object a line).
"""

from __future__ import annotations

import json
import math
import re

import click

from brainstem.state.approval import hidden, visible
from brainstem.state.budget import dollars

LABEL = 17  # row labels are padded to this many characters, so the values line up


def short_time(value) -> str:
    """``2026-05-01T12:34:56Z`` as ``2026-05-01 12:34``, for a table's time column."""
    return value[:16].replace("T", " ") if isinstance(value, str) and len(value) >= 16 else as_text(value)


def labelled(label: str, value: str) -> str:
    """One ``label  value`` line, the label padded to :data:`LABEL`."""
    return f"{label:<{LABEL}} {value}"


def row(label: str, value: str) -> None:
    click.echo(labelled(label, value))


def as_text(value, none: str = "-") -> str:
    """A value for a text line: never ``None`` or a Python repr (structures are JSON)."""
    if value is None:
        return none
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def clip(text: str, width: int = 60) -> str:
    """``text`` as one line of at most ``width`` characters, cut at a word boundary and marked with "…", so a
    column never ends mid-word (a single word longer than ``width`` is cut where it must be)."""
    line = " ".join(text.split())
    if len(line) <= width:
        return line
    head = line[: width - 1]
    if line[width - 1] != " " and " " in head:
        head = head[: head.rindex(" ")]
    return head.rstrip(" ,;:.-") + "…"


def usd(value, digits: int = 4) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return f"${value:,.{digits}f}"


def spent(cost, simulated=None) -> str:
    """A cost, its part answered from cassettes named apart (it moved no money): ``$0.0246 (simulated)``
    when all of it was, ``$0.0700 ($0.0246 of it simulated)`` when some."""
    simulated = simulated if isinstance(simulated, (int, float)) and not isinstance(simulated, bool) else 0
    if not simulated:
        return usd(cost)
    if not isinstance(cost, (int, float)) or simulated >= cost:
        return f"{usd(cost)} (simulated)"
    return f"{usd(cost)} ({usd(simulated)} of it simulated)"


def ceiling(value) -> str:
    """An operator's ceiling in USD as it was set, never rounded into another number ($0.004 is not
    "$0.00"): two digits when they say it exactly, up to six when they do not; ``no ceiling`` when
    there is none (unset, or infinite)."""
    if value is None or (isinstance(value, float) and math.isinf(value)):
        return "no ceiling"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return "-"
    return dollars(value, least=2)


def table(rows: list[list[str]], right: tuple[int, ...] = (), header: list[str] | None = None) -> list[str]:
    """Rows as lines in aligned columns (the last column is not padded); ``right``: right-aligned columns."""
    every = ([header] if header else []) + rows
    if not every:
        return []
    widths = [max(len(r[i]) for r in every) for i in range(len(every[0]))]
    lines = []
    for r in every:
        cells = [(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])) if i < len(r) - 1 else cell
                 for i, cell in enumerate(r)]
        lines.append("  ".join(cells).rstrip())
    return lines


def echo_lines(items) -> None:
    """Print each of ``items`` (lines) on its own line."""
    for line in items:
        click.echo(line)


# Anything but printable ASCII, newline and tab: only then is a text looked at character by character.
_HIDDEN_RE = re.compile(r"[^\t\n\x20-\x7e]")


def json_text(value, indent: int | None = None, sort_keys: bool = False, default=None) -> str:
    """``value`` as JSON, non-ASCII text kept as it is but for control and format characters, which are
    escaped (``\\u009b``): what the agent wrote reaches a terminal as text, never as a command to it."""
    text = json.dumps(value, indent=indent, ensure_ascii=False, sort_keys=sort_keys, default=default)
    if not _HIDDEN_RE.search(text):
        return text
    return "".join(json.dumps(c)[1:-1] if hidden(c) else c for c in text)


def print_json(value, indent: int | None = None, sort_keys: bool = False) -> None:
    """One JSON document (see :func:`json_text`)."""
    click.echo(json_text(value, indent=indent, sort_keys=sort_keys))


def json_lines(items) -> None:
    """One JSON object per line: what every list command prints with --json."""
    for item in items:
        click.echo(json_text(item))


class VisibleStream:
    """A text stream that spells out every control or format character but newline and tab (``\\u{1b}``)
    before writing: the command line prints what the agent wrote (a tool's name, its result, a message) in
    many places, and none of it may move the cursor, clear the screen, retitle the window or reorder text.
    The command line writes through one for the whole command (:func:`brainstem.operator.cli.main`)."""

    def __init__(self, inner):
        self._inner = inner

    def write(self, text):
        if isinstance(text, str) and _HIDDEN_RE.search(text):
            text = visible(text)
        return self._inner.write(text)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def error(exc: BaseException) -> None:
    """An expected failure: one line on stderr (the traceback only with --debug)."""
    click.echo(f"brainstem: error: {exc}", err=True)


def usage_error(message: str, command_path: str) -> None:
    """A command line click could not parse: one line, like every other error, naming the help to read."""
    click.echo(f"brainstem: error: {message.rstrip()} (see `{command_path} --help`)", err=True)


def unexpected(exc: BaseException) -> None:
    """A failure the runtime did not expect: still one line, pointing at --debug."""
    click.echo(f"brainstem: unexpected error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
               err=True)

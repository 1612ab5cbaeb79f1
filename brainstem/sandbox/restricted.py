"""The RestrictedPython policy: tool source compiled, and the globals it runs with.

RestrictedPython restricts the *language* (it rewrites attribute access,
item access, iteration, writes and ``print`` into calls of guard functions);
``guards`` supplies those guards, ``tool_builtins`` the *environment* (the
builtins and the only modules tool code can import), and this module puts
them together: :func:`compile_tool`, :func:`make_globals` for one execution,
``print`` into an :class:`OutputSink`.  Everything here is imported by the
fork server before it forks (:func:`warm_up`), so a worker pays nothing to
set it up.
"""

from __future__ import annotations

import base64 as _base64
import builtins
import datetime as _datetime
import hashlib as _hashlib
import json as _json
import re as _re
import time as _time
from typing import Any

from RestrictedPython import compile_restricted_exec
from RestrictedPython.Guards import full_write_guard, guarded_iter_unpack_sequence, guarded_unpack_sequence

from brainstem.sandbox.guards import (
    guarded_apply,
    guarded_getattr,
    guarded_getitem,
    guarded_inplacevar,
    guarded_iter,
    restricted_metaclass,
)
from brainstem.sandbox.tool_builtins import BUILTINS

TOOL_FILENAME = "<tool>"


# --------------------------------------------------------------------------- print


class OutputSink:
    """Where ``print`` output of one execution goes; calls ``on_overflow`` past the cap."""

    __slots__ = ("parts", "size", "cap", "on_overflow")

    def __init__(self, cap: int, on_overflow=None):
        self.parts: list[str] = []
        self.size = 0
        self.cap = cap
        self.on_overflow = on_overflow

    def write(self, text: str) -> None:
        n = len(text.encode("utf-8", "surrogatepass"))
        if self.size + n > self.cap:
            if self.on_overflow is not None:
                self.on_overflow()
            raise RuntimeError(f"output limit ({self.cap} bytes) exceeded")
        self.size += n
        self.parts.append(text)

    def text(self) -> str:
        return "".join(self.parts)


def make_print_factory(sink: OutputSink):
    """``_print_``: RestrictedPython calls it once per scope that prints."""

    class PrintCollector:
        __slots__ = ("txt",)

        def __init__(self, _getattr_=None):
            self.txt: list[str] = []

        def _call_print(self, *objects, sep=" ", end="\n", file=None, flush=False):
            if sep is None:
                sep = " "
            if end is None:
                end = "\n"
            if type(sep) is not str or type(end) is not str:
                raise TypeError("sep and end must be str")
            text = sep.join(builtins.str(o) for o in objects) + end
            sink.write(text)
            self.txt.append(text)

        def __call__(self) -> str:
            return "".join(self.txt)

    return PrintCollector


class CompileError(Exception):
    """Tool source did not compile; the message is one operator-readable line."""


def compile_tool(source: str):
    """Compile tool source under RestrictedPython; raise CompileError with a one-line message."""
    if type(source) is not str:
        raise CompileError("tool code must be a str")
    result = compile_restricted_exec(source, TOOL_FILENAME)
    if result.errors:
        raise CompileError(_format_compile_error(result.errors[0], len(result.errors)))
    return result.code


_SYNTAX_RE = _re.compile(r"^Line (\d+): SyntaxError: (.*?)(?: at statement: .*)?$", _re.S)
_POLICY_RE = _re.compile(r"^Line (\d+): (.*)$", _re.S)


def _format_compile_error(first: str, count: int) -> str:
    more = f" (and {count - 1} more)" if count > 1 else ""
    m = _SYNTAX_RE.match(first)
    if m:
        return f"SyntaxError: line {m.group(1)}: {m.group(2)}{more}"
    m = _POLICY_RE.match(first)
    if m:
        return f"not allowed: line {m.group(1)}: {m.group(2)}{more}"
    return f"not allowed: {first}{more}"


def make_globals(sink: OutputSink) -> dict[str, Any]:
    """A fresh globals dict for one execution."""
    return {
        "__builtins__": BUILTINS,
        "__name__": "tool",
        "__metaclass__": restricted_metaclass,
        "_getattr_": guarded_getattr,
        "_getitem_": guarded_getitem,
        "_getiter_": guarded_iter,
        "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
        "_unpack_sequence_": guarded_unpack_sequence,
        "_write_": full_write_guard,
        "_inplacevar_": guarded_inplacevar,
        "_apply_": guarded_apply,
        "_print_": make_print_factory(sink),
    }


def warm_up() -> None:
    """Import lazily-loaded stdlib pieces now (workers cannot open files later)."""
    import encodings.ascii  # noqa: F401, PLC0415 -- warm_up's point: before the fork
    import encodings.cp1252  # noqa: F401, PLC0415 -- warm_up's point: before the fork
    import encodings.idna  # noqa: F401, PLC0415 -- warm_up's point: before the fork
    import encodings.latin_1  # noqa: F401, PLC0415 -- warm_up's point: before the fork
    import encodings.utf_16  # noqa: F401, PLC0415 -- warm_up's point: before the fork
    import encodings.utf_32  # noqa: F401, PLC0415 -- warm_up's point: before the fork
    _datetime.datetime.strptime("2024-01-02 03:04:05", "%Y-%m-%d %H:%M:%S")
    _datetime.datetime.now().astimezone()
    _time.localtime()
    _time.strftime("%c")
    _re.compile(r"(?i)warm[- ]up\d+").findall("Warm-up1")
    _json.loads(_json.dumps({"a": [1, 2.5, None, True, "x"]}))
    for name in ("md5", "sha1", "sha256", "sha512", "sha3_256", "blake2b"):
        getattr(_hashlib, name)(b"x").hexdigest()
    _base64.b64decode(_base64.b64encode(b"x"))
    "x".encode("idna")
    code = compile_tool("def execute(args, ctx):\n    print(1)\n    return [x for x in args]\n")
    glb = make_globals(OutputSink(1 << 16))
    exec(code, glb)
    glb["execute"]([1], None)
